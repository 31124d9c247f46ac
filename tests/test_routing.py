"""The device cost model (mwumkl_dist/devices/routing.py): which MWU fits of a ``device="cuda"`` estimator run
on the GPU and which on CPU threads.  Its effect on a whole two-stage fit is checked under the simulator
(tests/test_two_stage_cuda.py, case ``routing``)."""

from __future__ import annotations

import pytest

from mwumkl_dist.devices import routing


@pytest.fixture(autouse=True)
def _cost_routing(monkeypatch):
    monkeypatch.delenv(routing.ROUTING_ENV, raising=False)


def test_cpu_stays_on_the_cpu():
    assert routing.mwu_device("cpu", 10**6, 10**6, 16) == "cpu"


def test_small_fits_go_to_cpu_threads_and_large_ones_to_the_gpu():
    # a two-stage weight stage's fold on a 16-core machine: 3000 rows x 40 kernels, launch-bound on a GPU
    assert routing.mwu_device("cuda", 3000, 40, 16) == "cpu"
    # the 10^5- and 10^6-kernel Sonar banks (166 rows): the GPU's throughput
    assert routing.mwu_device("cuda", 166, 10**5, 16) == "cuda"
    assert routing.mwu_device("cuda", 166, 10**6, 16) == "cuda"
    # E7's full MWU fit at 10^5 rows on tens of kernels
    assert routing.mwu_device("cuda", 10**5, 40, 16) == "cuda"


def test_fewer_threads_send_smaller_fits_to_the_gpu():
    # the threshold falls with the CPU threads a fit has (inside parallel folds each has a share)
    sizes = [(n, m) for n in (100, 1000, 3000, 10**4) for m in (10, 40, 200, 1000)]
    for n, m in sizes:
        if routing.mwu_device("cuda", n, m, 16) == "cuda":
            assert routing.mwu_device("cuda", n, m, 1) == "cuda", (n, m)
    assert routing.mwu_device("cuda", 3000, 40, 1) == "cuda"
    assert routing.mwu_device("cuda", 3000, 40, 0) == "cuda"  # no thread count: as one


def test_the_crossover_is_where_the_estimates_meet():
    threads = 16
    per_entry = routing.CPU_ENTRY_SECONDS / threads - routing.GPU_ENTRY_SECONDS
    crossover = routing.GPU_STEP_SECONDS / per_entry
    assert routing.mwu_device("cuda", 1, int(crossover * 0.99), threads) == "cpu"
    assert routing.mwu_device("cuda", 1, int(crossover * 1.01), threads) == "cuda"


def test_routing_off_keeps_every_fit_on_the_gpu(monkeypatch):
    monkeypatch.setenv(routing.ROUTING_ENV, "device")
    assert not routing.routing_enabled()
    assert routing.mwu_device("cuda", 10, 2, 16) == "cuda"
    assert routing.mwu_device("cpu", 10, 2, 16) == "cpu"


def test_a_routed_fit_still_needs_a_gpu(monkeypatch):
    """A fit small enough for the CPU still refuses ``device="cuda"`` without a GPU: the same error for every size."""
    import numpy as np

    from mwumkl_dist import MWUMKLClassifier
    from mwumkl_dist.data import cuda as cuda_shards

    if cuda_shards.gpu_available():
        pytest.skip("a CUDA GPU (or the simulator) is available here")
    X = np.random.default_rng(0).normal(size=(8, 2))
    assert routing.mwu_device("cuda", 8, 1, 1) == "cpu"
    with pytest.raises(RuntimeError, match="device='cuda'"):
        MWUMKLClassifier(kernels="linear", C=1.0, device="cuda").fit(X, ["a", "b"] * 4)


def test_scoring_goes_where_it_pays():
    assert routing.scoring_device("cpu", 10**6, 10**4, 10**3, 16) == "cpu"
    # a fold's test rows: 400 rows x 200 support vectors x 10 kernels, a few ms on 16 cores at most
    assert routing.scoring_device("cuda", 400, 200, 10, 16) == "cpu"
    # a million-kernel bank's support rows: the GPU
    assert routing.scoring_device("cuda", 166, 100, 10**6, 16) == "cuda"
