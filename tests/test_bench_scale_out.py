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
