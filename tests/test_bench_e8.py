"""E8, against a tuned RBF SVM (benchmarks/bench_e8.py): its smoke run, the splits, the paired statistics."""

from __future__ import annotations

import argparse
import csv
import json

import numpy as np
import pytest

from benchmarks import bench_e8 as E8
from benchmarks import bench_selection as E6
from benchmarks import report
from benchmarks.datasets import Dataset


# About 15 s with numba's cache in place; the first run after a change to the library compiles its kernels
# (about 50 s more on 2 cores), hence the margin.
# A long smoke run: in the slow set (python -m pytest -m slow; .ci/run runs it), timeout 10x its idle time or more.
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_smoke_run_writes_consistent_outputs(tmp_path, capsys):
    out = tmp_path / "results" / "e8"
    args = ["--smoke", "--max-train", "svmguide1=100", "--datasets-dir", str(tmp_path / "absent"), "--out", str(out)]
    assert E8.main(args) == 0  # generated data only: no data folder needed
    doc = json.loads((out / "E8.json").read_text())
    rows, st, summary = doc["rows"], doc["settings"], doc["summary"]
    assert st["smoke"] and st["datasets"] == list(E8.SMOKE_DATASETS) and st["methods"] == list(E8.METHODS)
    assert st["splits"] == E8.SMOKE_SPLITS and st["threads"] == 1 and st["max_train"] == {"svmguide1": 100}
    # heart: 75/25 random splits; svmguide1: the official split, repeated on 2 training subsamples of 100 rows
    heart, guide = st["data"]["heart"], st["data"]["svmguide1"]
    assert heart["protocol"] == "75/25" and heart["splits"] == 2 and heart["source"] == "synthetic"
    assert guide["protocol"] == "official" and guide["splits"] == 2 and guide["n_train"] == [100]
    assert guide["n_test"] == [guide["test_file_rows"]]
    assert len(rows) == 2 * E8.SMOKE_SPLITS * len(E8.METHODS)
    for r in rows:
        assert r["status"] == "ok", r
        assert 0.0 <= r["error"] <= 1.0 and r["fit_s"] > 0 and r["predict_s"] >= 0
        assert r["n_test"] > 0 and r["n_train"] == (100 if r["dataset"] == "svmguide1" else 120)
    mw = [r for r in rows if r["method"] == "MWUMKL"]
    assert all(r["n_kernels"] == len(r["kernel_names"]) > 0 and r["C"] > 0 and r["solver"] for r in mw)
    assert all(isinstance(r["fit_warnings"], list) for r in mw)
    svc = [r for r in rows if r["method"] == "SVC-RBF"]
    assert all(r["C"] in E8.SVC_C_GRID and r["gamma_factor"] in E8.SVC_GAMMA_FACTORS for r in svc)
    easy = [r for r in rows if r["method"] == "EasyMKL"]
    kernels_of = {(r["dataset"], r["split"]): r["n_kernels"] for r in mw}  # the MWUMKL fit of the same split
    assert all(
        r["kernels_from"] == "MWUMKL fit" and r["n_kernels"] == kernels_of[r["dataset"], r["split"]] for r in easy
    )
    # the summary: one line per (set, method); W/T/L add up to the splits
    assert [(s["dataset"], s["method"]) for s in summary] == [(d, m) for d in st["datasets"] for m in E8.METHODS]
    for s in summary:
        assert s["splits"] == E8.SMOKE_SPLITS
        assert 0.0 <= s["mean_error"] <= 1.0 and 0.0 <= s["median_error"] <= 1.0
        if s["method"] == E8.REFERENCE:
            assert "wins" not in s
            continue
        assert s["wins"] + s["ties"] + s["losses"] == s["paired_splits"] == s["splits"]
        errors = {r["split"]: r["error"] for r in rows if r["dataset"] == s["dataset"] and r["method"] == s["method"]}
        ref = {r["split"]: r["error"] for r in svc if r["dataset"] == s["dataset"]}
        assert s["mean_diff"] == pytest.approx(np.mean([errors[k] - ref[k] for k in ref]))
        assert s["se_diff"] is not None and s["se_diff"] >= 0
    # the other outputs
    with open(out / "E8.csv", newline="") as fh:
        assert len(list(csv.DictReader(fh))) == len(rows)
    with open(out / "E8_summary.csv", newline="") as fh:
        assert len(list(csv.DictReader(fh))) == len(summary)
    md = (out / "E8.md").read_text()
    assert "Smoke run" in md and "| heart | 2 | 120 / " in md and "| W/T/L vs SVC |" in md
    assert (out / "e8_error.png").stat().st_size > 1000 and doc["figures"] == ["e8_error.png"]
    assert doc["machine"]["git_commit"] is None or len(doc["machine"]["git_commit"]) >= 40
    assert not (out / "E8.partial.jsonl").exists()  # the journal is removed once the outputs are written
    assert "wrote E8.json" in capsys.readouterr().out
    # the report picks the section up from e8/
    text = report.render(out.parent, tmp_path / "RESULTS.md")
    assert "## E8 — against a tuned RBF SVM" in text and "smoke run" in text and "results/e8/e8_error.png" in text
    assert "| heart (synthetic stand-in) | synthetic | 75/25 | 2 | 120 |" in text
    assert "## E8" not in report.render(tmp_path / "nothing", tmp_path / "RESULTS.md")


def test_paired_statistics_and_ties():
    ref = {0: 0.10, 1: 0.20, 2: 0.30, 3: 0.40}
    errors = {0: 0.08, 1: 0.204, 2: 0.305, 3: 0.50, 9: 0.0}  # split 9 has no reference: not paired
    s = E8.paired(errors, ref)
    assert (s["wins"], s["ties"], s["losses"], s["paired_splits"]) == (1, 2, 1, 4)  # 0.5 points is a tie
    d = np.array([-0.02, 0.004, 0.005, 0.10])
    assert s["mean_diff"] == pytest.approx(d.mean())
    assert s["se_diff"] == pytest.approx(d.std(ddof=1) / 2)
    one = E8.paired({0: 0.1}, {0: 0.2})
    assert one["se_diff"] is None and (one["wins"], one["ties"], one["losses"]) == (1, 0, 0)


def test_splits_are_stratified_and_capped():
    rng = np.random.default_rng(0)
    y = np.where(rng.random(400) < 0.3, 1.0, -1.0)
    ds = Dataset("x", rng.random((400, 3)), y, source="synthetic")
    sp = E8.make_splits(ds, 3, seed=0)
    assert len(sp) == 3 and all(len(s["train"]) == 300 and len(s["test"]) == 100 for s in sp)
    assert all(not set(s["train"]) & set(s["test"]) for s in sp)
    capped = E8.make_splits(ds, 3, seed=0, max_train=100)
    for s, c in zip(sp, capped):
        assert len(c["train"]) == 100 and set(c["train"]) <= set(s["train"])
        np.testing.assert_array_equal(c["test"], s["test"])
        assert abs(np.mean(y[c["train"]] > 0) - np.mean(y > 0)) < 0.02
    official = Dataset("o", ds.X[:300], y[:300], ds.X[300:], y[300:], source="synthetic")
    assert len(E8.make_splits(official, 3, seed=0)) == 1  # the official split, once
    reps = E8.make_splits(official, 3, seed=0, max_train=50)
    assert len(reps) == 3 and all(s["test_file"] and len(s["test"]) == 100 for s in reps)
    assert len({tuple(s["train"]) for s in reps}) == 3  # a subsample per repetition
    Xtr, ytr, Xte, yte = E8.split_data(official, reps[0])
    assert Xtr.min() >= 0 and Xtr.max() <= 1 and Xte.min() >= 0 and Xte.max() <= 1 and len(yte) == 100


def test_easymkl_in_blocks_predicts_as_e6(monkeypatch):
    rng = np.random.default_rng(1)
    X = rng.random((90, 3))
    y = np.where(X[:, 0] + X[:, 1] + 0.2 * rng.standard_normal(90) > 1, 1.0, -1.0)
    Xtr, ytr, Xte = X[:60], y[:60], X[60:]
    kernels = E8.default_kernels(Xtr)
    expected, eta = E6._easymkl(kernels, Xtr, ytr, Xte, 0)
    monkeypatch.setattr(E8, "EASYMKL_BLOCK_VALUES", len(kernels) * 60 * 7)  # blocks of 7 test rows
    model = E8.easymkl_fit(kernels, Xtr, ytr, 0)
    np.testing.assert_allclose(model["eta"], eta)
    np.testing.assert_array_equal(E8.easymkl_predict(model, Xte), expected)


def test_cap_options():
    assert E8._caps("2000") == 2000
    assert E8._caps("banana=1000,a9a=3e3") == {"banana": 1000, "a9a": 3000}
    assert E8._caps("banana=1000,5000") == {"banana": 1000, "*": 5000}
    assert E8._per_set({"banana": 1000, "*": 5000}, "a9a") == 5000 and E8._per_set(None, "a9a") is None
    with pytest.raises(argparse.ArgumentTypeError):
        E8._caps("nosuchset=10")
