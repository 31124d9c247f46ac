"""benchmarks/bench_dask_fit.py on a toy size: both modes run and report what they measured."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("distributed")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_dask_fit_benchmark_runs_in_memory_and_from_a_store(tmp_path, capsys, monkeypatch):
    from benchmarks import bench_dask_fit

    # As users run it: a store this small is read into memory, so its fit can take the exact solve on all rows
    # as the in-memory fit does (out of core, a 3,200-row store would get a Nystroem map instead of the exact
    # solve, a different model).
    monkeypatch.delenv("MWUMKL_STORE_IN_MEMORY_BYTES")

    assert bench_dask_fit.main(["--n", "3200", "--test-rows", "500", "--out", str(tmp_path / "a.json")]) == 0
    memory = json.loads((tmp_path / "a.json").read_text())
    assert memory["same_predictions"] is True  # the Dask model is the local model
    assert memory["cpu_ratio"] > 0 and memory["dask"]["workers_cpu_s"] > 0
    assert bench_dask_fit.main(["--n", "3200", "--test-rows", "500", "--store", str(tmp_path)]) == 0
    stored = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert stored["store_bytes"] > 0 and (tmp_path / "e7_3200.zarr").is_dir()
    assert stored["dask"]["error"] == pytest.approx(memory["dask"]["error"])  # the same rows, from the store
