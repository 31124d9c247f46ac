"""E7, scale in n (benchmarks/bench_scale_n.py): its smoke run, the synthetic data, the slopes and targets."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest

from benchmarks import bench_scale_n as E7
from benchmarks import report


# A long smoke run: in the slow set (python -m pytest -m slow; .ci/run runs it), timeout 10x its idle time or more.
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_smoke_run_writes_consistent_outputs(tmp_path, capsys):
    out = tmp_path / "results" / "e7"
    assert E7.main(["--smoke", "--out", str(out)]) == 0  # synthetic data only: no data folder needed
    doc = json.loads((out / "E7.json").read_text())
    rows, st = doc["rows"], doc["settings"]
    assert st["smoke"] and st["datasets"] == ["synthetic"] and st["threads"] == 1
    assert st["sizes"]["synthetic"] == list(E7.SMOKE_SIZES)
    # one completed row per (method, n), each measured in its own process on one thread
    assert sorted((r["method"], r["n"]) for r in rows) == sorted((m, n) for m in E7.METHODS for n in E7.SMOKE_SIZES)
    for r in rows:
        assert r["status"] == "ok", r
        assert r["n_rows_read"] == r["n"] and r["n_test"] == E7.SMOKE_TEST
        assert r["fit_wall_s"] > 0 and r["fit_cpu_s"] > 0 and 0 <= r["error"] <= 1
        assert r["peak_rss_mib"] >= r["rss_before_fit_mib"] > 0
        assert r["blas_threads"] == 1
    mw = [r for r in rows if r["method"] == "MWUMKL"]
    assert all(r["solver"] == "two-stage" and r["mwumkl_threads"] == 1 for r in mw)  # auto above 3000 rows
    linear = {r["n"]: r["error"] for r in rows if r["method"] == "LinearSVC"}
    nystroem = {r["n"]: r["error"] for r in rows if r["method"] == "Nystroem+LinearSVC"}
    assert all(nystroem[n] < linear[n] - 0.1 for n in linear)  # the synthetic boundary is not linear
    # slopes and targets
    slopes = doc["summary"]["slopes"]["synthetic"]
    for m in E7.METHODS:
        assert math.isfinite(slopes[m]["slope"]) and slopes[m]["points"] == len(E7.SMOKE_SIZES)
    assert isinstance(slopes["slope_target_met"], bool)
    targets = doc["summary"]["targets"]
    assert [t["n"] for t in targets] == list(E7.SMOKE_SIZES)
    assert all(isinstance(t["time_met"], bool) and isinstance(t["error_met"], bool) for t in targets)
    assert doc["machine"]["cores"] >= 1 and doc["machine"]["python"] and doc["machine"]["numpy"]
    # the other outputs
    with open(out / "E7.csv", newline="") as fh:
        assert len(list(csv.DictReader(fh))) == len(rows)
    md = (out / "E7.md").read_text()
    assert "| n | MWUMKL s / error % / peak MiB |" in md and "Fitted slopes" in md
    assert all(f"| {n} |" in md for n in E7.SMOKE_SIZES)
    for name in ("e7_time.png", "e7_error.png", "e7_memory.png"):
        assert (out / name).stat().st_size > 1000
    assert (out / "cache" / ".gitignore").is_file()  # the data cache never gets committed
    assert "MWUMKL slope <= 1.2" in capsys.readouterr().out
    # the report picks the section up from e7/
    text = report.render(out.parent, tmp_path / "RESULTS.md")
    assert "## E7 — scale in n" in text and "smoke run" in text and "results/e7/e7_time.png" in text
    assert "## E7" not in report.render(tmp_path / "nothing", tmp_path / "RESULTS.md")


@pytest.mark.timeout(120)
def test_timeout_skips_the_larger_sizes(tmp_path):
    out = tmp_path / "e7"
    args = ["--smoke", "--sizes", "300,400", "--methods", "LinearSVC", "--timeout", "0.001", "--out", str(out)]
    assert E7.main(args) == 0
    doc = json.loads((out / "E7.json").read_text())
    assert [(r["n"], r["status"]) for r in doc["rows"]] == [(300, "timeout"), (400, "skipped")]
    assert doc["summary"]["slopes"]["synthetic"]["LinearSVC"]["slope"] is None
    assert "| 300 | timeout |" in (out / "E7.md").read_text()


def test_synthetic_rows_are_deterministic_and_prefix_stable():
    X, y = E7.synthetic_rows(E7.SYNTH_CHUNK + 7)
    X2, y2 = E7.synthetic_rows(50)
    np.testing.assert_array_equal(X[:50], X2)
    np.testing.assert_array_equal(y[:50], y2)
    assert X.shape == (E7.SYNTH_CHUNK + 7, E7.SYNTH_FEATURES) and X.min() >= 0 and X.max() < 1
    assert set(np.unique(y)) == {-1.0, 1.0} and 0.4 < np.mean(y > 0) < 0.6
    flipped = np.mean(y != E7.synthetic_labels(X))
    assert abs(flipped - E7.SYNTH_NOISE) < 0.005
    Xt, _ = E7.synthetic_rows(50, part=1)
    assert not np.array_equal(Xt, X2)  # the test rows are their own stream


def test_prepared_data_and_prefix_reads(tmp_path):
    meta = E7.prepare_data("synthetic", tmp_path, pool=250, n_test=40, smoke=True)
    assert meta["n_pool"] == 250 and meta["n_test"] == 40 and not meta["scale"]
    data = tmp_path / "cache" / "synthetic"
    X, y = E7.synthetic_rows(250)
    np.testing.assert_array_equal(E7.read_rows(data / "X0.npy", 100), X[:100])
    np.testing.assert_array_equal(E7.read_rows(data / "y0.npy"), y)
    assert E7.read_rows(data / "X1.npy").shape == (40, E7.SYNTH_FEATURES)
    again = E7.prepare_data("synthetic", tmp_path, pool=200, n_test=40, smoke=True)  # cached: no regeneration
    assert again["n_pool"] == 250


def test_slopes_and_targets():
    assert E7.fit_slope([(1e4, 2.0), (1e5, 2.0 * 10**1.2), (1e6, 2.0 * 10**2.4)]) == pytest.approx(1.2)
    assert E7.fit_slope([(1e4, 1.0)]) is None and E7.fit_slope([]) is None

    def row(method, n, s, e, status="ok"):
        return {"dataset": "d", "method": method, "n": n, "status": status, "fit_wall_s": s, "error": e}

    rows = [
        row("MWUMKL", 20_000, 2.0, 0.050),
        row("Nystroem+LinearSVC", 20_000, 1.0, 0.040),
        row("MWUMKL", 100_000, 8.0, 0.042),
        row("Nystroem+LinearSVC", 100_000, 9.0, 0.040),
        row("MWUMKL", 300_000, 20.0, 0.040),
        row("Nystroem+LinearSVC", 300_000, None, None, status="timeout"),
    ]
    settings = {
        "datasets": ["d"],
        "methods": ["MWUMKL", "Nystroem+LinearSVC"],
        "slope_min_n": E7.SLOPE_MIN_N,
        "target_range": list(E7.TARGET_RANGE),
        "target_min_n": E7.TARGET_MIN_N,
    }
    s = E7.summarise(rows, settings)
    mw = s["slopes"]["d"]["MWUMKL"]
    assert mw["slope"] == pytest.approx(E7.fit_slope([(2e4, 2.0), (1e5, 8.0), (3e5, 20.0)]))
    assert s["slopes"]["d"]["slope_target_met"] is (mw["slope"] <= 1.2)
    assert s["slopes"]["d"]["Nystroem+LinearSVC"]["slope"] == pytest.approx(math.log(9) / math.log(5))
    t100, t300 = s["targets"]
    assert (t100["n"], t100["time_met"], t100["error_met"]) == (100_000, True, True)  # 4.2 <= 4.0 + 0.3
    assert (t300["n"], t300["time_met"], t300["error_met"]) == (300_000, True, None)
    assert "timed out" in t300["note"]
