"""benchmarks/bench_scaling.py: its quick mode runs and reports the same model in every row."""

from __future__ import annotations

import argparse
import json

import pytest

from benchmarks import bench_scaling
from mwumkl_dist.threads import available_cpus


def _run(tmp_path, *extra):
    out = tmp_path / "out"
    rc = bench_scaling.main(["--quick", "--out", str(out), *extra])
    doc = json.loads((out / "scaling_quick.json").read_text())
    return rc, doc


# A long smoke run: in the slow set (python -m pytest -m slow; .ci/run runs it), timeout 10x its idle time or more.
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_quick_local_rows(tmp_path, capsys):
    rc, doc = _run(tmp_path, "--layouts", "none", "--threads", "1,2")
    assert rc == 0
    rows = doc["rows"]
    assert {r["problem"] for r in rows} == set(bench_scaling.QUICK_PROBLEMS)
    expected = {1, 2} if available_cpus() >= 2 else {1}
    for problem in bench_scaling.QUICK_PROBLEMS:
        mine = [r for r in rows if r["problem"] == problem]
        assert {r["threads"] for r in mine} == expected
        assert all(r["same_model"] and r["fit_s"] > 0 and r["n_iter"] > 0 for r in mine)
        assert [r["speedup"] for r in mine if r["threads"] == 1] == [1.0]
        assert all(r["load_1min"] >= 0 for r in mine)
    defaults = [r for r in rows if r["problem"] == "quick-defaults"]  # two-stage: its stages 2-3 are timed
    assert all(0 < r["solve_s"] < r["fit_s"] for r in defaults)
    assert doc["summary"]["same_model_every_row"] is True
    assert doc["machine"]["available_cpus"] >= 1
    assert "same model" in capsys.readouterr().out


@pytest.mark.timeout(300)
def test_quick_dask_layout(tmp_path):
    # Threaded workers: the Dask rows' code path in seconds (worker processes take ~10 s each to start).
    args = ["--problems", "quick-kernels", "--threads", "1", "--layouts", "2x1", "--oversubscribe"]
    rc, doc = _run(tmp_path, *args, "--threaded-cluster")
    assert rc == 0
    layouts = [r["layout"] for r in doc["rows"]]
    assert layouts == ["local 1", "local default", "dask 2x1"]
    assert all(r["same_model"] for r in doc["rows"])
    assert doc["settings"]["dask_processes"] is False


@pytest.mark.timeout(300)
def test_quick_busy_rows(tmp_path):
    rc, doc = _run(tmp_path, "--problems", "quick-kernels", "--threads", "1", "--layouts", "none", "--busy", "1")
    assert rc == 0 and doc["settings"]["busy_processes"] == 1
    assert [(r["layout"], r["busy"]) for r in doc["rows"]] == [
        ("local 1", 0),
        ("local default", 0),
        ("local 1, busy 1", 1),
        ("local default, busy 1", 1),
    ]
    assert all(r["same_model"] and r["solve_s"] > 0 for r in doc["rows"])


def test_arguments():
    assert bench_scaling._layouts("1x16, 2x8,none") == [(1, 16), (2, 8)]
    assert bench_scaling._ints("1,2,4") == [1, 2, 4]
    for bad in ("2y8", "0x4"):
        with pytest.raises(argparse.ArgumentTypeError):
            bench_scaling._layouts(bad)
    with pytest.raises(SystemExit):
        bench_scaling.main(["--quick", "--problems", "a9a"])  # a full-size problem is not a quick one
    assert set(bench_scaling.PROBLEMS) == {
        "a9a",
        "cod-rna",
        "mushrooms",
        "sonar-bank",
        "sonar-bank-20k",
        "a9a-defaults",
    }
    assert bench_scaling.PROBLEMS["a9a-defaults"].defaults  # issue 22 item 2: MWUMKLClassifier() on a9a
    assert bench_scaling.count_kernels(bench_scaling.PROBLEMS["sonar-bank"], 60) == 100_000
    assert bench_scaling.count_kernels(bench_scaling.PROBLEMS["sonar-bank-20k"], 60) == 20_000
    assert bench_scaling.count_kernels(bench_scaling.PROBLEMS["mushrooms"], 112) == 1344


# A long smoke run: in the slow set (python -m pytest -m slow; .ci/run runs it), timeout 10x its idle time or more.
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_serial_profile_of_the_quick_defaults(tmp_path):
    """benchmarks/bench_serial.py: the phases of a two-stage fit, their serial and parallel CPU, the same model."""
    from benchmarks import bench_serial

    assert bench_serial.main(["--problem", "quick-defaults", "--threads", "1,2", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "serial.json").read_text())
    phases = [name for name, _, _ in bench_serial.PHASES] + ["other", "fit"]
    assert [r["phase"] for r in doc["rows"]] == phases * 2
    fits = [r for r in doc["rows"] if r["phase"] == "fit"]
    assert all(r["serial_cpu_s"] + r["parallel_cpu_s"] > 0 and r["wall_s"] > 0 for r in fits)
    assert doc["summary"]["same_model"] is True and doc["summary"]["two_core_speedup_n_jobs_1"] == 1.0
