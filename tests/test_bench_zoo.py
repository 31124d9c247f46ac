"""The structure zoo benchmark (benchmarks/bench_zoo.py): its bundled problems and a smoke run's outputs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks import bench_zoo
from benchmarks.structure_zoo import FAMILIES, make_problem


def test_every_family_draws_its_relevant_features_at_random_positions():
    for family, k in FAMILIES.items():
        X, y, relevant = make_problem(family, 200, 30, seed=1)
        assert X.shape == (200, 30) and set(np.unique(y)) == {-1.0, 1.0}
        assert len(relevant) == (30 if k is None else 13 if family == "redundant" else k)  # redundant: 3 + 10 copies
    assert make_problem("xor", 50, 30, 0)[2] != make_problem("xor", 50, 30, 1)[2]
    train, test = make_problem("xor", 50, 30, 0, part=0), make_problem("xor", 50, 30, 0, part=1)
    assert train[2] == test[2] and not np.array_equal(train[0], test[0])  # same rule, new rows


def test_rescaling_multiplies_each_feature_by_one_factor():
    Xtr, _, Xte, _, _ = bench_zoo.problem("xor", 30, 0, 100, 100, rescale=False)
    Str, _, Ste, _, _ = bench_zoo.problem("xor", 30, 0, 100, 100, rescale=True)
    factors = Str[0] / Xtr[0]
    assert np.allclose(Str / Xtr, factors) and np.allclose(Ste / Xte, factors)
    assert factors.min() >= 1e-3 and factors.max() <= 1e3 and factors.max() / factors.min() > 10


@pytest.mark.timeout(600)
def test_smoke_run_writes_consistent_outputs(tmp_path):
    bench_zoo.main(["--smoke", "--methods", "MWUMKL,LightGBM", "--out", str(tmp_path)])
    doc = json.loads((tmp_path / "ZOO.json").read_text())
    rows = doc["rows"]
    pairs = {(f, m) for f in ("xor", "dense") for m in ("MWUMKL", "LightGBM")}
    assert {(r["family"], r["method"]) for r in rows} == pairs
    mwumkl = [r for r in rows if r["method"] == "MWUMKL"]
    assert all(0.0 <= r["mass"] <= 1.0 + 1e-9 and 0.0 <= r["error"] <= 1.0 for r in mwumkl)
    summary = {(s["family"], s["method"]): s for s in doc["summary"]}
    lgbm = next(r for r in rows if r["method"] == "LightGBM" and r["family"] == "xor")
    assert summary["xor", "LightGBM"]["error"] == pytest.approx(lgbm["error"])
    table = (tmp_path / "ZOO.md").read_text()
    assert "| MWUMKL mass |" in table and "**d = 8, 200 training rows**" in table
    # The journal keeps every row; a report-only run rebuilds the same table from it.
    bench_zoo.main(["--report-only", "--out", str(tmp_path)])
    assert (tmp_path / "ZOO.md").read_text() == table


def test_tables_keep_each_training_size_apart():
    row = {"family": "xor", "d": 30, "seed": 0, "method": "LightGBM", "rescale": False, "fit_s": 1.0, "fit_cpu_s": 1.0}
    rows = [{**row, "n_train": 2000, "error": 0.10}, {**row, "n_train": 4000, "error": 0.06}]
    summary = bench_zoo.summarise(rows)
    assert sorted((s["n_train"], s["error"], s["seeds"]) for s in summary) == [(2000, 0.10, 1), (4000, 0.06, 1)]
    table = bench_zoo.markdown(summary)
    assert "**d = 30, 2000 training rows**" in table and "**d = 30, 4000 training rows**" in table
    assert "| LightGBM | 10.0 (1) |" in table and "| LightGBM | 6.0 (1) |" in table
