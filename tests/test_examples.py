"""The scripts in examples/ run as they are and print what they promise."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def run_example(name, *args, tmp_path, timeout=120):
    env = {k: v for k, v in os.environ.items() if k != "DASK_SCHEDULER_ADDRESS"}
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        cwd=tmp_path,  # the examples must not need (or litter) the working directory
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, f"{name} failed:\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert "Traceback" not in result.stderr
    assert "still alive" not in result.stderr  # Dask's nanny killing a worker that was slow to exit
    return result.stdout


def test_quickstart(tmp_path):
    out = run_example("quickstart.py", tmp_path=tmp_path)
    error = float(re.search(r"^test error\s+([\d.]+)%", out, re.M).group(1))
    assert error < 10
    weights = [float(w) for w in re.findall(r"^  \S+\s+([\d.]+)$", out, re.M)]
    assert len(weights) == 12 and sum(weights) == pytest.approx(1, abs=1e-5)
    assert "saved and loaded back: same predictions" in out
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_distributed_quickstart_both_parts(tmp_path):
    out = run_example("distributed_quickstart.py", tmp_path=tmp_path)
    assert "== part 1: LocalCluster, 2 worker processes" in out
    assert "no scheduler address given" in out
    address = re.search(r"part 2 uses the local cluster's scheduler, (tcp://\S+)", out).group(1)
    assert f"== part 2: scheduler at {address}" in out
    # Both distributed fits give the local engine's model.
    assert out.count("max |weight difference| 0, same support: True") == 2, out
    errors = [float(e) for e in re.findall(r"^test error\s+([\d.]+)%", out, re.M)]
    assert len(errors) == 2 and max(errors) < 10


@pytest.mark.parametrize("engine_args", [[], ["--dask"]], ids=["local", "dask"])
def test_checkpoint_resume(tmp_path, engine_args):
    out = run_example("checkpoint_resume.py", *engine_args, tmp_path=tmp_path)
    assert "simulated crash at iteration 650" in out and "holds iteration 600" in out
    assert out.count("identical to the uninterrupted fit") == 5 and "DIFFERENT" not in out
    engine = "dask" if engine_args else "local"
    assert f"uninterrupted fit ({engine} engine)" in out
