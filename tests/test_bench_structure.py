"""E10's pieces (benchmarks/bench_structure.py): the problems' known relevant features, a smoke run's outputs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks import bench_structure as E10


def test_madelon_relevant_columns_are_the_generators_informative_and_redundant_ones():
    Xtr, ytr, Xte, yte, relevant = E10.madelon(3, n_train=150, n_test=50, n_features=40)
    assert Xtr.shape == (150, 40) and Xte.shape == (50, 40) and len(relevant) == 20
    assert Xtr.min() >= 0 and Xtr.max() <= 1 and set(np.unique(ytr)) == {-1.0, 1.0}
    # The 15 redundant columns are linear combinations of the 5 informative ones: the relevant block (centred; the
    # scaling is affine per column) has rank 5, the 20 noise columns full rank.
    centred = Xtr - Xtr.mean(axis=0)
    assert np.linalg.matrix_rank(centred[:, relevant], tol=1e-8) == 5
    noise = np.setdiff1d(np.arange(40), relevant)
    assert np.linalg.matrix_rank(centred[:, noise], tol=1e-8) == 20


@pytest.mark.timeout(900)
def test_smoke_run_writes_consistent_outputs(tmp_path):
    E10.main(["--smoke", "--problems", "madelon", "--methods", "MWUMKL,SVC-oracle", "--out", str(tmp_path)])
    doc = json.loads((tmp_path / "E10.json").read_text())
    rows = doc["rows"]
    assert {r["method"] for r in rows} == {"MWUMKL", "SVC-oracle"} and all(r["status"] == "ok" for r in rows)
    mwumkl = next(r for r in rows if r["method"] == "MWUMKL")
    assert 0.0 <= mwumkl["relevant_mass"] <= 1.0 + 1e-9 and 0.0 <= mwumkl["error"] <= 1.0
    summary = {(s["problem"], s["method"]): s for s in doc["summary"]}
    assert summary["madelon", "MWUMKL"]["error"] == pytest.approx(mwumkl["error"])
    table = (tmp_path / "E10.md").read_text()
    assert "| madelon | 300 | MWUMKL | 1 |" in table and "What MWUMKL kept" in table
    assert (tmp_path / "e10_error.png").stat().st_size > 1000
