"""Superstep transport latency (benchmarks/bench_channel.py): a tiny plaintext run writes every figure."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("distributed")

from benchmarks import bench_channel  # noqa: E402

# A hang (a deadlock in C, where no signal handler runs) fails with every thread's stack, not a stalled run.
pytestmark = pytest.mark.timeout(300, method="thread")


@pytest.mark.timeout(300, method="thread")
def test_tiny_run_writes_positive_latencies(tmp_path):
    out = tmp_path / "results" / "channel_latency.json"
    args = ["--rounds", "20", "--submit-rounds", "10", "--warmup", "5", "--blocks", "2", "--security", "plain"]
    bench_channel.main([*args, "--out", str(out)])
    doc = json.loads(out.read_text())
    assert doc["settings"]["rounds"] == 20 and doc["settings"]["security"] == ["plain"]
    assert doc["machine"]["python"] and doc["machine"]["dask"] and doc["machine"]["distributed"]
    rows = doc["rows"]
    cases = {(r["transport"], r["pattern"], r["message"]) for r in rows}
    expected = {
        (t, p, m) for t in bench_channel.TRANSPORTS for p in bench_channel.PATTERNS for m in bench_channel.MESSAGES
    }
    assert cases == expected and len(rows) == len(expected)
    for r in rows:
        assert r["security"] == "plain" and r["encrypted"] is False
        assert r["n"] == (10 if r["transport"] == "submit" else 20)
        assert r["workers_addressed"] == (2 if r["pattern"] == "both" else 1)
        for key in ("median_ms", "p10_ms", "p90_ms", "mean_ms", "min_ms"):
            assert r[key] > 0, (r, key)
        assert r["min_ms"] <= r["p10_ms"] <= r["median_ms"] <= r["p90_ms"]
    big = {r["message_pickle_bytes"] for r in rows if r["message"] == "point"}
    assert min(big) > 8 * 2 * 1000  # two 1000-float points
    fav = doc["favoured"]["plain"]
    assert set(fav) == set(bench_channel.MESSAGES)
    assert all(f["transport"] in bench_channel.TRANSPORTS and f["median_ms"] > 0 for f in fav.values())
    md = out.with_suffix(".md").read_text()
    assert "| plain | `channel` |" in md and "| plain | `submit` |" in md and "Favoured" in md
