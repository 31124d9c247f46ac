"""Per-superstep overhead (benchmarks/bench_superstep.py): a tiny run writes every figure and the same model."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("distributed")

from benchmarks import bench_superstep  # noqa: E402

# A hang (a deadlock in C, where no signal handler runs) fails with every thread's stack, not a stalled run.
pytestmark = pytest.mark.timeout(180, method="thread")


def test_tiny_run_writes_cpu_per_step_and_the_same_model(tmp_path):
    assert (
        bench_superstep.main(["--problems", "empty", "--layouts", "1x1", "--iters", "20", "--out", str(tmp_path)]) == 0
    )
    doc = json.loads((tmp_path / "superstep_overhead.json").read_text())
    [row] = doc["rows"]
    assert (row["code"], row["problem"], row["layout"], row["iters"], row["same"]) == ("this", "empty", "1x1", 20, True)
    assert row["package"] == [str(bench_superstep.HERE.parent / "mwumkl_dist")]  # this checkout's package ran
    for key in ("local_cpu_ms", "driver_cpu_ms", "wall_ms", "step_p50_ms"):
        assert row[key] > 0, key
    assert row["overhead_cpu_ms"] == pytest.approx(row["driver_cpu_ms"] + row["workers_cpu_ms"] - row["local_cpu_ms"])
    assert "| this | empty | 1x1 | 20 |" in (tmp_path / "superstep_overhead.md").read_text()
