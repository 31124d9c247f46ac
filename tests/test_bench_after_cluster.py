"""The default thread count after a LocalCluster (benchmarks/bench_after_cluster.py): a quick run, in a subprocess
(the cluster's nannies leave OMP_NUM_THREADS=1 in the process that started it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("distributed")

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_after_cluster.py"


# A long smoke run: in the slow set (python -m pytest -m slow; .ci/run runs it), timeout 10x its idle time or more.
@pytest.mark.slow
@pytest.mark.timeout(600, method="thread")
def test_quick_run_reports_both_thread_counts(tmp_path):
    out = tmp_path / "after.json"
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MWUMKL_NUM_THREADS")}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--repeat", "1",
                           "--out", str(out)], capture_output=True, text=True, timeout=170, env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["omp_num_threads_after_cluster"] == "1"  # what the nannies leave behind
    assert doc["n_jobs=1"]["threads"] == 1
    assert doc["default"]["threads"] >= 1 and doc["speedup"] > 0
    assert "the default's speed-up over n_jobs=1" in proc.stdout
