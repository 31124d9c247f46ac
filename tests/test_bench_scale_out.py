"""benchmarks/bench_scale_out.py in its smoke mode: each layout runs in its own process and reports its figures."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("distributed")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_scale_out_benchmark_smoke_mode(tmp_path):
    from benchmarks import bench_scale_out

    out = tmp_path / "scale.jsonl"
    assert bench_scale_out.main(["--smoke", "--store-dir", str(tmp_path / "stores"), "--out", str(out)]) == 0
    local, one = (json.loads(line) for line in out.read_text().splitlines())
    assert (local["layout"], one["layout"]) == ("local", "1x1") and local["n"] == one["n"] == 4000
    assert one["same_predictions_as_first"] is True  # the Dask model predicts as the local one
    assert one["workers_cpu_s"] > 0 and len(one["workers_peak_rss"]) == 1 and one["client_peak_rss"] > 0
    assert one["shard_layout"].startswith("linear stage: 1 shard(s), one per Dask worker")
    assert 0 < local["longest_silence_share"] <= 1 and 0 <= one["error"] < 0.5


def test_kill_in_waits_for_its_phase_and_moment():
    """``--kill-in newton`` after the first Newton step; ``columns`` with half the rows done, not at the end."""
    from benchmarks.bench_scale_out import _due
    from mwumkl_dist.core.progress import ProgressInfo

    def due(phase, done, total, kill_in):
        return _due(ProgressInfo(phase, done, total, 0.0), kill_in)

    assert not due("newton", 0, None, "newton") and due("newton", 1, None, "newton")
    assert not due("columns", 1, None, "newton") and not due("newton", 3, None, "columns")
    assert not due("columns", 499, 1000, "columns") and due("columns", 500, 1000, "columns")
    assert not due("columns", 1000, 1000, "columns")  # the phase's end: the columns are all there


@pytest.mark.timeout(300)
def test_the_scale_out_benchmark_kills_a_worker_in_the_linear_stage(tmp_path):
    """``--kill-in newton`` on 2 workers: a linear-stage shard's worker is SIGKILLed after the first Newton step
    (from the fit's callback), restarted by its nanny, and the fit ends with the local fit's predictions.  A small
    linear stage (``--params``) keeps it to seconds."""
    from benchmarks import bench_scale_out

    out = tmp_path / "kill.jsonl"
    params = json.dumps({"C": 10, "polish": False, "n_components": 300})
    argv = ["--smoke", "--layouts", "local,2x1", "--kill-in", "newton", "--params", params, "--test-rows", "1000",
            "--store-dir", str(tmp_path / "stores"), "--out", str(out)]  # fmt: skip
    assert bench_scale_out.main(argv) == 0
    local, two = (json.loads(line) for line in out.read_text().splitlines())
    assert "kill_in" not in local and "killed" not in local and local["linear_method"] is not None
    assert two["kill_in"] == "newton" and two["killed"]["phase"] == "newton" and two["killed"]["done"] >= 1
    assert two["killed"]["shards_on_worker"] >= 1 and two["workers_restarted"] == 1
    assert two["same_predictions_as_first"] is True and two["error"] == local["error"]
