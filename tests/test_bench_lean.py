"""``benchmarks/bench_lean.py`` (E35): the stand-ins, and a smoke run of every path (each fit its own process)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks import bench_lean


def test_the_standins_have_the_shapes_and_balance_they_claim():
    X, y, Xt, yt = bench_lean.standin("ijcnn1", 2000, 500)
    assert X.shape == (2000, 22) and Xt.shape == (500, 22) and 0.07 < np.mean(y > 0) < 0.13
    X, y, _, _ = bench_lean.standin("w8a", 2000, 0)
    assert X.shape == (2000, 300) and X.format == "csr" and 5 < X.nnz / 2000 < 20 and 0.02 < np.mean(y > 0) < 0.05
    np.testing.assert_array_equal(bench_lean.standin("w8a", 100, 0)[1], bench_lean.standin("w8a", 100, 0)[1])


def test_a_failed_fit_is_a_row_of_the_table():
    rows = [{"set": "ijcnn1", "rows": 10, "method": "mwumkl", "failed": "exit -9: []"}]
    assert "failed: exit -9" in "\n".join(bench_lean.table(rows))


@pytest.mark.timeout(900)
def test_the_smoke_run_measures_every_method_and_two_fits_together(tmp_path):
    assert bench_lean.main(["--smoke", "--sets", "ijcnn1", "--concurrent", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "lean.json").read_text())
    rows = doc["rows"]
    assert [r["method"] for r in rows] == ["mwumkl", "svc", "lgbm", "mwumkl", "mwumkl"]
    # ru_maxrss and psutil's RSS count a little differently (a fraction of a MB): the peak is at least about it
    assert all(r["peak_rss_mb"] >= 0.98 * r["rss_before_mb"] > 0 and r["fit_s"] > 0 for r in rows)
    assert all(0 <= r["error"] < 0.5 for r in rows)
    assert "rank_stop_reason" in rows[0] or rows[0]["polished"]  # the MWUMKL rows carry the fit's choices
    assert "one of two together" in (tmp_path / "lean.md").read_text()
