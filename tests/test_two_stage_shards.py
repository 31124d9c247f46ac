"""The two-stage fit's linear stage on shards: local, Dask, data stores, spilled features -- one model."""

from __future__ import annotations

import functools
import time

import numpy as np
import pytest
import scipy.sparse as sp

from mwumkl_dist import MWUMKLClassifier
from mwumkl_dist.core import partition
from mwumkl_dist.devices import memory
from mwumkl_dist.engines.pool import LocalPool
from mwumkl_dist.solvers import two_stage
from mwumkl_dist.stores import write_data_store

# A hang (a deadlock in C, where no signal handler runs) fails with every thread's stack, not a stalled run.
pytestmark = pytest.mark.timeout(300, method="thread")

ATTRS = ("kernel_weights_", "kernel_traces_", "support_", "support_vectors_", "dual_coef_", "intercept_", "C_")


def _data(n=700, d=5, seed=0, classes=("no", "yes")):
    rng = np.random.default_rng(seed)
    X = rng.random((n, d))
    score = np.sin(3 * X[:, 0]) + X[:, 1] ** 2 + 0.3 * rng.standard_normal(n)
    y = np.asarray(classes)[np.digitize(score, np.quantile(score, np.linspace(0, 1, len(classes) + 1)[1:-1]))]
    return X, y


def _assert_identical(a, b):
    for name in ATTRS:
        va, vb = getattr(a, name), getattr(b, name)
        va, vb = (v.toarray() if sp.issparse(v) else v for v in (va, vb))
        np.testing.assert_array_equal(va, vb, err_msg=name)


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(partition, "ROW_BLOCK", 64)  # 11 row blocks of 64 rows: shards cut between them


# polish=False: the Nystroem stage on shards (in memory the exact solve would take these few hundred rows)
PARAMS = dict(C=10.0, solver="two-stage", kernels="poly:1,gaussian:0.5,gaussian:1,gaussian:2", n_jobs=1, polish=False)


def test_linear_row_ranges_follow_row_blocks():
    assert partition.linear_row_ranges(700, 3, 64) == [(0, 256), (256, 448), (448, 700)]
    assert partition.linear_row_ranges(100, 8, 64) == [(0, 64), (64, 100)]  # at most one shard per block
    with pytest.raises(ValueError, match="row block"):
        two_stage.LinearShard(np.zeros((10, 2)), 5, 15, row_block=64)


@pytest.mark.timeout(120, method="thread")
def test_local_shards_store_and_spill_give_the_same_bits(small_blocks, tmp_path, monkeypatch):
    X, y = _data()
    ref = MWUMKLClassifier(**PARAMS).fit(X, y)
    assert ref.features_spilled_ is False
    sharded = MWUMKLClassifier(**PARAMS, n_shards=4).fit(X, y)
    _assert_identical(ref, sharded)
    store = write_data_store(tmp_path / "d.zarr", X, y, chunk_rows=50)  # chunks unlike the row blocks
    from_store = MWUMKLClassifier(**PARAMS, n_shards=3).fit(store)
    _assert_identical(ref, from_store)
    monkeypatch.setenv("MWUMKL_FEATURE_MEMORY", "1000")  # every shard's features go to disk
    monkeypatch.setenv("MWUMKL_SCRATCH", str(tmp_path))
    spilled = MWUMKLClassifier(**PARAMS, n_shards=2).fit(store)
    assert spilled.features_spilled_ is True
    _assert_identical(ref, spilled)
    assert not list(tmp_path.glob("mwumkl-features-*"))  # unlinked: nothing left behind


@pytest.mark.timeout(120, method="thread")
def test_sparse_rows_and_multiclass(small_blocks):
    X, y = _data(n=500, classes=("a", "b", "c"))
    Xs = sp.csr_matrix(np.where(X > 0.3, X, 0.0))
    ref = MWUMKLClassifier(**PARAMS).fit(Xs, y)
    assert ref.dual_coef_.shape == (3, 500) and ref.n_components_.shape == (3,)
    _assert_identical(ref, MWUMKLClassifier(**{**PARAMS, "n_jobs": 2}, n_shards=3).fit(Xs, y))
    dense = MWUMKLClassifier(**PARAMS).fit(Xs.toarray(), y)  # the same math; BLAS sees other operands
    np.testing.assert_array_equal(dense.kernel_weights_, ref.kernel_weights_)
    np.testing.assert_allclose(dense.decision_function(X), ref.decision_function(X), rtol=1e-9, atol=1e-9)
    assert np.mean(ref.predict(Xs) == y) > 0.6


def test_feature_blocks_round_trip_on_disk(tmp_path):
    rng = np.random.default_rng(1)
    blocks = [rng.standard_normal((n, 7)) for n in (5, 3, 9)]
    store = two_stage.FeatureBlocks([5, 3, 9], 7, str(tmp_path))
    assert store.spilled and store.nbytes == 17 * 7 * 8
    for i in (2, 0, 1):  # any order: fixed offsets
        store.put(i, blocks[i])
    for i, b in enumerate(blocks):
        np.testing.assert_array_equal(store.get(i), b)
    store.close()
    assert not list(tmp_path.iterdir())


def test_newton_over_shards_equals_one_array(small_blocks):
    rng = np.random.default_rng(3)
    F = rng.standard_normal((300, 6))
    y = np.where(F[:, 0] + 0.5 * rng.standard_normal(300) > 0, 1.0, -1.0)
    c = rng.uniform(0.5, 2.0, 300)
    one = two_stage.fit_squared_hinge(F, y, 3.0, c)
    slots = partition.linear_row_ranges(300, 3, 64)
    with LocalPool(
        slots, lambda r: functools.partial(two_stage.LinearShard, F[r[0] : r[1]], *r, row_block=64, storage="memory")
    ) as pool:
        pool.call("load_problem", lambda r: (two_stage.GivenFeatures(6), y[r[0] : r[1]], c[r[0] : r[1]], None, None,
                                             "float64"))  # fmt: skip
        three = two_stage.solve_squared_hinge(pool, 6, 3.0)
    np.testing.assert_array_equal(one[0], three[0])
    assert one[1] == three[1]


@pytest.fixture(scope="module")
def client(two_worker_client):
    return two_worker_client


@pytest.mark.timeout(180, method="thread")
def test_dask_engine_gives_the_local_model(small_blocks, client, tmp_path):
    X, y = _data()
    ref = MWUMKLClassifier(**PARAMS).fit(X, y)
    on_dask = MWUMKLClassifier(**PARAMS, engine="dask", client=client, n_shards=3).fit(X, y)
    assert on_dask.solver_ == "two-stage"
    _assert_identical(ref, on_dask)
    store = write_data_store(tmp_path / "d.zarr", X, y, chunk_rows=100)
    _assert_identical(ref, MWUMKLClassifier(**PARAMS, engine="dask", client=client, n_shards=2).fit(store))


@pytest.mark.timeout(180, method="thread")
def test_dask_engine_gives_the_local_model_of_an_adaptive_rank(small_blocks, client, monkeypatch):
    """Several rank levels (the smallest map's solve starts the full one): the same bits on Dask."""
    from dataclasses import replace

    from mwumkl_dist.solvers import driver
    from mwumkl_dist.solvers.two_stage import nystroem
    from mwumkl_dist.solvers.two_stage import solver as two_stage_solver

    for module in (nystroem, two_stage_solver):
        monkeypatch.setattr(module, "N_COMPONENTS", 16)
    monkeypatch.setattr(nystroem, "RANK_MAX", 53)
    monkeypatch.setitem(
        driver.SOLVERS, "two-stage", replace(driver.SOLVERS["two-stage"], residual_tol=0.0, rank_by="residual")
    )
    X, y = _data()
    ref = MWUMKLClassifier(**PARAMS).fit(X, y)
    assert len(ref.support_) == two_stage.rank_budget(700) == 53
    _assert_identical(ref, MWUMKLClassifier(**PARAMS, engine="dask", client=client, n_shards=3).fit(X, y))


@pytest.mark.timeout(180, method="thread")
def test_dask_rebuilds_a_lost_linear_shard(small_blocks, client, monkeypatch):
    """A shard that stops answering mid-solve is rebuilt (its problem loaded again): the same model."""
    from mwumkl_dist.engines import dask_pool as dask_engine
    from mwumkl_dist.engines.dask_pool import DaskPool

    monkeypatch.setattr(dask_engine, "REPLACEMENT_GRACE", 0.2)  # no worker left: do not wait for one

    X, y = _data()
    ref = MWUMKLClassifier(**PARAMS).fit(X, y)
    calls = {"n": 0}
    original = DaskPool.call

    def flaky(self, method, args_for=None, **options):
        if method == "solve_direction":
            calls["n"] += 1
        if method == "solve_direction" and calls["n"] == 2:  # drop one shard's channel before the second Newton step
            self.blocks[1].conn.close()
        return original(self, method, args_for, **options)

    rebuilt = []
    original_recover = DaskPool._recover
    DaskPool.call = flaky
    DaskPool._recover = lambda self, block: (rebuilt.append(block.slot), original_recover(self, block))[1]
    try:
        est = MWUMKLClassifier(**PARAMS, engine="dask", client=client, n_shards=3).fit(X, y)
    finally:
        DaskPool.call, DaskPool._recover = original, original_recover
    assert rebuilt == [(256, 448)]
    _assert_identical(ref, est)


def test_a_shard_built_on_a_worker_sees_its_memory_limit(client):
    def probe():
        shard = two_stage.LinearShard(np.zeros((10, 2)), 0, 10, columns_budget=2**50)  # the worker's limit caps it
        return shard._budget, shard._scratch

    budget, scratch = client.submit(probe, pure=False).result(timeout=60)
    limits = {w["memory_limit"] for w in client.scheduler_info()["workers"].values()}
    assert budget in {int(memory.WORKER_SHARE * limit) for limit in limits}
    assert "dask-scratch" in scratch  # the worker's local directory, not the temp directory


class _SlowShard:
    """A shard whose ``work`` call takes ``seconds`` and counts its rows as it goes (``rows_done``)."""

    def __init__(self, rows):
        self.rows_done = 0

    def work(self, seconds):
        self.rows_done = 0
        for _ in range(10):
            time.sleep(seconds / 10)
            self.rows_done += 5
        return seconds


@pytest.mark.timeout(120, method="thread")
def test_a_long_call_on_a_healthy_worker_is_no_hang(client, monkeypatch):
    """A shard busy longer than superstep_timeout sends heartbeats: it is not rebuilt, and its rows reach the
    driver as it goes.  Without heartbeats the same call is taken for a hung worker (the issue's 2M-row fit)."""
    from mwumkl_dist.engines import dask_pool
    from mwumkl_dist.engines.dask_pool import DaskPool

    monkeypatch.setattr(dask_pool, "HEARTBEAT_EVERY", 0.1)
    monkeypatch.setattr(dask_pool, "REPLACEMENT_GRACE", 0.2)
    slots = [(0, 50), (50, 100)]
    seen = []
    with DaskPool(slots, lambda rows: functools.partial(_SlowShard, rows), client=client, timeout=60,
                  call_timeout=0.5) as pool:  # fmt: skip
        assert pool.call("work", lambda rows: (0.05,), superstep=True) == [0.05, 0.05]  # its first time: untimed
        assert pool.call("work", lambda rows: (2.0,), superstep=True, progress=seen.append) == [2.0, 2.0]
        assert pool.recoveries == 0
        assert seen and max(seen) <= 100 and seen == sorted(seen)
        monkeypatch.setattr(dask_pool._HEARTBEATS, "start", lambda *args: 0)
        monkeypatch.setattr(dask_pool._HEARTBEATS, "stop", lambda *args: None)
        pool.timeout = 2.0  # the wait for a worker that answers
        with pytest.raises(ConnectionError, match="the only ones it lists do not answer"):
            pool.call("work", lambda rows: (2.0,), superstep=True)  # both healthy workers taken for hung


def test_extending_a_shards_columns_frees_the_old_level_as_it_copies():
    """A load of more landmarks copies the kept columns block by block and frees each as it goes: the shard never
    holds both levels' columns whole (a 10^6-row worker went past its memory limit by the old level's)."""
    import tracemalloc

    rows, wide = 64 * 64, 256
    X = np.random.default_rng(0).random((rows, wide))
    shard = two_stage.LinearShard(X, 0, rows, row_block=64, storage="memory")
    y, cw = np.ones(rows), np.ones(rows)
    narrow = two_stage.nystroem.Basis(wide // 2, None)
    tracemalloc.start()  # before the first level: its columns' frees are counted
    try:
        shard.load_problem(two_stage.GivenFeatures(wide // 2), y, cw, bases=[narrow])
        tracemalloc.reset_peak()
        shard.load_problem(two_stage.GivenFeatures(wide), y, cw, bases=[narrow, two_stage.nystroem.Basis(wide, None)],
                           extend=True)  # fmt: skip
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    old, new = rows * wide // 2 * 4, rows * wide * 4
    assert peak < new + old // 2  # both whole: new + old
    np.testing.assert_array_equal(shard.columns(3), X[3 * 64 : 4 * 64].astype(np.float32))
