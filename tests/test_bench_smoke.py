"""Benchmarks that cannot rot: every script in benchmarks/ has a smoke run that CI runs.

A script's smoke run is either listed in :data:`SMOKE` (run here, in a subprocess, as a user runs it: its
``--smoke`` mode on generated data, under numba's CUDA simulator where it needs CUDA) or in a test file of its
own that names the script (``tests/test_bench_e8.py`` runs ``bench_e8.py --smoke``, ...).  A new script with
neither fails :func:`test_every_benchmark_script_has_a_smoke_run`.  The runs take seconds to a minute each
(process start, numba's cached kernels, a local Dask cluster for some): they are in the slow set.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"

#: script -> (arguments of its smoke run, runs under the CUDA simulator).
SMOKE = {
    "bench_a9a.py": (["--smoke"], False),
    "bench_bank.py": (["--smoke"], False),
    "bench_capacity.py": (["--smoke"], False),
    "bench_dask.py": (["--smoke"], False),
    "bench_flood.py": (["--smoke"], False),
    "bench_million_kernels.py": (["--smoke"], False),
    "bench_out_of_core.py": (["--smoke"], False),
    "bench_raw_scale.py": (["--smoke"], False),
    # the memory part at 4,000 rows (its own --smoke takes minutes: 20,000 rows and a 60,000-row store)
    "bench_two_stage_memory.py": (["--part", "memory", "--n", "4000", "--n-test", "1000", "--synthetic"], False),
    # one configuration's fingerprints, then compared with themselves
    "reference_models.py": (["--only", "paper_algorithm", "--no-cuda-sim", "--out", "ref.json"], False),
    "bench_gpu.py": (["--smoke", "--standin"], True),
    "device_check.py": (["--smoke"], True),
}


def _scripts() -> list[str]:
    """The runnable scripts of benchmarks/ (a ``__main__`` block)."""
    return sorted(p.name for p in BENCH.glob("*.py") if re.search(r"^if __name__ == .__main__.:", p.read_text(),
                                                                  re.M))  # fmt: skip


def _tests_naming(script: str) -> list[str]:
    stem = script[:-3] if script != "__main__.py" else "python -m benchmarks"
    return sorted(p.name for p in (ROOT / "tests").glob("test_*.py")
                  if p.name != Path(__file__).name and stem in p.read_text())  # fmt: skip


def test_every_benchmark_script_has_a_smoke_run():
    scripts = _scripts()
    assert "bench_gpu.py" in scripts and "device_check.py" in scripts, scripts
    missing = [s for s in scripts if s not in SMOKE and not _tests_naming(s)]
    assert not missing, f"benchmark scripts without a smoke run in CI (add one to SMOKE here): {missing}"
    for script, (args, _) in SMOKE.items():
        assert (BENCH / script).is_file(), script
        if "--smoke" in args:
            assert "--smoke" in (BENCH / script).read_text(), script


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("script", sorted(SMOKE))
def test_smoke_run(script, tmp_path):
    args, simulated = SMOKE[script]
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
               MWUMKL_NUM_THREADS="1", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")  # fmt: skip
    if simulated:
        env["NUMBA_ENABLE_CUDASIM"] = "1"
    if script == "bench_two_stage_memory.py":
        args = [*args, "--out", str(tmp_path / "memory.json"), "--work-dir", str(tmp_path)]
    before = _results_state()
    proc = subprocess.run([sys.executable, str(BENCH / script), *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=880)  # fmt: skip
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-5000:])
    assert _results_state() == before, "a smoke run wrote into benchmarks/results"
    if script == "reference_models.py":
        again = subprocess.run([sys.executable, str(BENCH / script), "--load", "ref.json", "--compare", "ref.json"],
                               cwd=tmp_path, env=env, capture_output=True, text=True, timeout=280)  # fmt: skip
        assert again.returncode == 0 and "same" in again.stdout, (again.stdout[-2000:], again.stderr[-2000:])
    if script == "bench_gpu.py":
        row = json.loads(proc.stdout.strip().splitlines()[-1])
        assert row["case"] == "smoke" and row["identical_model"] is True, row
    if script == "device_check.py":
        lines = [json.loads(line) for line in proc.stdout.strip().splitlines()]
        assert all(line.get("ok", True) for line in lines if line.get("part") == "tests"), lines
        assert not any(line.get("timed_out") or line.get("failed") for line in lines), lines
        fits = {(line["item"], line["device"]) for line in lines if "fit_s" in line}
        assert fits == {("bank-64", "cuda"), ("bank-64", "cpu"), ("e7-400", "cuda"), ("e7-400", "cpu")}, fits
        assert "machine" in lines[-1] and lines[-1]["summary"]["tests_passed"] == "1/1", lines[-1]


def _results_state() -> dict:
    return {str(p): p.stat().st_mtime_ns for p in (BENCH / "results").rglob("*") if p.is_file()}


@pytest.mark.timeout(300)
def test_device_check_without_a_gpu_is_one_line_and_status_2():
    from mwumkl_dist.data.cuda import gpu_available

    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    if gpu_available() and os.environ.get("NUMBA_ENABLE_CUDASIM", "0") != "1":
        pytest.skip("a CUDA GPU is available here")
    proc = subprocess.run([sys.executable, str(BENCH / "device_check.py")], env=env, capture_output=True, text=True,
                          timeout=280)  # fmt: skip
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    (line,) = proc.stdout.splitlines()
    record = json.loads(line)
    assert record["device_check"] == "no usable GPU" and "device='cuda'" in record["error"], record
    bad = subprocess.run([sys.executable, str(BENCH / "device_check.py"), "--parts", "tpu"], env=env,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert bad.returncode == 2 and "--parts" in bad.stderr
