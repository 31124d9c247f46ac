"""E29 (benchmarks/bench_e29.py): its smoke run, and the exact check rebuilding a two-stage model's problem."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from benchmarks import bench_e29 as E29


# Seconds with numba's cache in place; a first run after a library change compiles its kernels first.
@pytest.mark.timeout(900)
def test_smoke_run_writes_rows_and_tables(tmp_path):
    out = tmp_path / "e29"
    args = ["--smoke", "--datasets", "heart", "--svc", "subgrid", "--svc-rows", "40", "--out", str(out), "--tag", "t"]
    assert E29.main(args) == 0
    doc = json.loads((out / "e29-t.json").read_text())
    rows = doc["rows"]
    assert [r["method"] for r in rows] == ["MWUMKL", "SVC-RBF(subgrid 40 + refit)"]
    mw, svc = rows
    assert 0 <= mw["error"] <= 1 and mw["fit_s"] > 0 and mw["fit_cpu_s"] > 0 and len(mw["load_before"]) == 3
    assert svc["grid_rows"] == 40 and svc["fit_s"] == pytest.approx(svc["grid_s"] + svc["refit_s"])
    assert len((out / "e29-t.partial.jsonl").read_text().splitlines()) == 2
    table = (out / "e29-t.md").read_text()
    assert "| heart | 0 | 120 / 40 |" in table and "SVC-RBF(subgrid 40 + refit)" in table


@pytest.mark.timeout(900)
def test_grid_row_refit_reproduces_its_error_and_tables_from_journals(tmp_path):
    out = tmp_path / "e29"
    assert E29.main(["--smoke", "--datasets", "svmguide1", "--svc", "grid", "--out", str(out)]) == 0
    journal = out / "e29.partial.jsonl"
    grid = [json.loads(line) for line in journal.read_text().splitlines()][1]
    assert grid["method"] == "SVC-RBF" and grid["refit_s"] > 0
    assert E29.main(["--smoke", "--refit-from", str(journal), "--out", str(out)]) == 0
    (refit,) = [json.loads(line) for line in (out / "e29-refit.partial.jsonl").read_text().splitlines()]
    assert refit["of"] == "SVC-RBF" and refit["error"] == refit["grid_error"] == grid["error"]
    (out / "e29.md").unlink()
    assert E29.main(["--tables-from", str(journal), "--out", str(out)]) == 0
    assert "| svmguide1 | 0 | 160 / 80 |" in (out / "e29.md").read_text()


@pytest.mark.timeout(900)
def test_exact_check_rebuilds_the_models_problem():
    """LIBLINEAR on the model's own features and C reproduces the two-stage model (a wrong kernel scale, C or
    landmark set would not: the decisions and the predictions would part)."""
    from mwumkl_dist import MWUMKLClassifier

    rng = np.random.default_rng(0)
    X = rng.random((400, 3))
    y = np.where(np.sin(4 * X[:, 0]) + X[:, 1] - 0.9 + 0.2 * rng.standard_normal(400) > 0, 1.0, -1.0)
    with warnings.catch_warnings():  # rank 60 leaves a residual above the target: the ResidualWarning is expected
        warnings.simplefilter("ignore")
        est = MWUMKLClassifier(C=10.0, solver="two-stage", n_components=60).fit(X[:300], y[:300])
    check = E29.exact_check(est, X[:300], y[:300], X[300:], y[300:])
    assert check["status"] == "ok" and check["landmarks"] == 60 and 0 < check["rank"] <= 60
    assert check["decision_gap"] < 1e-8
    assert check["agreement_with_model"] >= 0.97
    assert abs(check["error"] - float(np.mean(est.predict(X[300:]) != y[300:]))) <= 0.03


def test_reused_svc_matches_set_split_and_size(tmp_path):
    (tmp_path / "E8-a.csv").write_text(
        "dataset,split,method,n_train,error,fit_s,fit_cpu_s,C,gamma_factor\n"
        "banana,0,SVC-RBF,3975,0.0913,167.2,125.9,10000,0.5\n"
        "banana,0,MWUMKL,3975,0.085,5.1,4.0,1,\n"
    )
    row = E29.reused_svc(tmp_path, "banana", 0, 3975)
    assert row["error"] == 0.0913 and row["C"] == 10000 and row["source"].endswith("E8-a.csv")
    assert E29.reused_svc(tmp_path, "banana", 1, 3975) is None and E29.reused_svc(tmp_path, "banana", 0, 100) is None
