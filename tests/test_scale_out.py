"""Scale-out (issue 39): ``n_shards="auto"``, the linear stage on every Dask worker, the cost models that place the
MWU supersteps and choose the linear solve's method per cluster."""

from __future__ import annotations

import numpy as np
import pytest

from mwumkl_dist import MWUMKLClassifier
from mwumkl_dist.core import partition
from mwumkl_dist.engines import layout
from mwumkl_dist.solvers.spec import FitSpec
from mwumkl_dist.solvers.two_stage.newton import linear_costs, linear_method

pytestmark = pytest.mark.timeout(300, method="thread")

# polish=False: the Nystroem stage on shards (in memory the exact solve would take these few hundred rows)
PARAMS = dict(C=10.0, solver="two-stage", kernels="poly:1,gaussian:0.5,gaussian:1,gaussian:2", n_jobs=1, polish=False)
ATTRS = ("kernel_weights_", "support_", "dual_coef_", "intercept_", "C_")


def _data(n=700, d=5, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.random((n, d))
    y = np.where(np.sin(3 * X[:, 0]) + X[:, 1] ** 2 + 0.3 * rng.standard_normal(n) > 0.9, "yes", "no")
    return X, y


def _assert_identical(a, b):
    for name in ATTRS:
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


class _Cluster:
    """A stand-in client: ``nthreads()`` as a scheduler answers it."""

    def __init__(self, threads):
        self.threads = threads

    def nthreads(self):
        return dict(self.threads)


def test_n_shards_auto_is_the_default_everywhere():
    from mwumkl_dist.cli import build_parser

    assert MWUMKLClassifier().get_params()["n_shards"] == "auto"
    assert FitSpec().execution.n_shards == "auto"
    assert FitSpec.from_params(MWUMKLClassifier().get_params()).execution.n_shards == "auto"
    assert FitSpec.from_params(MWUMKLClassifier(n_shards=3).get_params()).execution.n_shards == 3
    for bad in (0, -1, 1.5, "all", True):
        with pytest.raises(ValueError, match="n_shards must be"):
            FitSpec.from_params(MWUMKLClassifier(n_shards=bad).get_params())
    assert build_parser().parse_args(["fit", "--data", "x", "--model", "m"]).shards == "auto"
    assert build_parser().parse_args(["fit", "--data", "x", "--model", "m", "--shards", "4"]).shards == 4


def test_the_linear_stage_takes_one_shard_per_worker():
    assert layout.linear_shard_count("local", 10**6).n_shards == layout.LOCAL_LINEAR_SHARDS == 1
    three = _Cluster({"tcp://a:1": 2, "tcp://b:1": 2, "tcp://c:1": 1})
    assert layout.linear_shard_count("dask", 10**6, three).n_shards == 3
    # a shard holds whole row blocks: never more shards than blocks
    assert layout.linear_shard_count("dask", partition.ROW_BLOCK + 1, three).n_shards == 2
    assert layout.linear_shard_count("dask", 10, _Cluster({})).n_shards == 1


def test_the_superstep_cost_model_keeps_cheap_supersteps_off_the_workers():
    # 0.2 ms supersteps: a 0.3 ms round trip costs more than the workers save
    cheap = layout.decide(2, 2e-4, 3e-4, local_threads=1, worker_threads=2)
    assert cheap.engine == "local" and "round trip" in cheap.reason
    # 20 ms supersteps on 8 worker threads against 2 here: the workers
    dear = layout.decide(8, 2e-2, 3e-4, local_threads=2, worker_threads=8)
    assert dear.engine == "dask" and dear.n_shards == 8


def test_the_mwu_layout_starts_the_workers_pool_only_where_it_can_win(monkeypatch):
    from mwumkl_dist.data.problems import FeatureProblem
    from mwumkl_dist.kernels.specs import KernelSet

    X, y = _data(n=400)
    problem = FeatureProblem(X, np.where(y == "yes", 1.0, -1.0), KernelSet("gaussian:1", X.shape[1]))
    started = []

    class _Pool:
        def call(self, method):
            return [(1, 1)] * started[-1]

    class _Engine:
        pool = _Pool()

        def close(self):
            started.append("closed")

    def on_dask(k):
        started.append(k)
        return _Engine()

    def local():
        return "local engine"

    two = _Cluster({"tcp://a:1": 1, "tcp://b:1": 1})
    monkeypatch.setattr(layout, "superstep_seconds", lambda problem: 1e-3)  # 1 ms on one thread
    # no worker yet: the pool (which waits for one) with one shard
    engine, chosen = layout.mwu_layout(problem, _Cluster({}), 2, local, on_dask, memory_bytes=2**34)
    assert chosen.engine == "dask" and started == [1]
    # as many threads here as on the workers: here, and no pool is started
    started.clear()
    engine, chosen = layout.mwu_layout(problem, two, 2, local, on_dask, memory_bytes=2**34)
    assert engine == "local engine" and chosen.engine == "local" and started == []
    # fewer threads here: the pool is started and its round trip measured; a slow one sends the supersteps back
    monkeypatch.setattr(layout, "round_trip_seconds", lambda pool: 2e-3)
    engine, chosen = layout.mwu_layout(problem, two, 1, local, on_dask, memory_bytes=2**34)
    assert engine == "local engine" and started == [2, "closed"]
    started.clear()
    monkeypatch.setattr(layout, "round_trip_seconds", lambda pool: 1e-4)
    engine, chosen = layout.mwu_layout(problem, two, 1, local, on_dask, memory_bytes=2**34)
    assert isinstance(engine, _Engine) and chosen.n_shards == 2 and started == [2]
    # a GPU problem stays on the workers
    started.clear()
    engine, chosen = layout.mwu_layout(problem, two, 8, local, on_dask, memory_bytes=2**34, on_host=False)
    assert chosen.engine == "dask" and started == [2]


def test_a_measured_superstep_scales_with_the_rows():
    from mwumkl_dist.data.problems import FeatureProblem
    from mwumkl_dist.kernels.specs import KernelSet

    X, y = _data(n=600)
    y_pm = np.where(y == "yes", 1.0, -1.0)
    problem = FeatureProblem(X, y_pm, KernelSet("gaussian:0.5,gaussian:1,poly:2", X.shape[1]))
    t = layout.superstep_seconds(problem, rows=200)
    assert 0 < t < 1.0  # three kernels on 600 rows: far below a second (it is scaled from 200 rows)


def test_the_linear_method_follows_the_cluster():
    # one process (no cluster settings): the model is the one-core model it always was
    for n, w, r, warm in [(10**7, 500, 500, False), (10**5, 4096, 4096, True), (10**6, 2000, 2000, False)]:
        assert linear_method(n, w, r, warm) == linear_method(n, w, r, warm, lanes=1, round_trip=0.0)
    # more lanes divide the shards' work, not the driver's factorisations: the conjugate gradients gain
    one, many = linear_costs(10**5, 8192, 8192, True), linear_costs(10**5, 8192, 8192, True, lanes=64)
    assert many["cg"] / many["explicit"] < one["cg"] / one["explicit"]
    # ... round trips (one per product) and columns computed again per pass favour the explicit Hessian
    for more in ({"round_trip": 0.05}, {"entry_seconds": 5e-8}):
        other = linear_costs(10**5, 8192, 8192, True, lanes=64, **more)
        assert other["cg"] / other["explicit"] > many["cg"] / many["explicit"]
    # the flip itself: 50,000 rows at rank 8192 on one core favour CG; on 16 lanes the explicit Hessian
    assert linear_method(5 * 10**4, 8192, 8192) == "cg" and linear_method(5 * 10**4, 8192, 8192, lanes=16) == "explicit"


@pytest.mark.timeout(120, method="thread")
def test_the_local_fit_records_its_layout_and_method():
    X, y = _data()
    clf = MWUMKLClassifier(**PARAMS).fit(X, y)
    assert clf.linear_method_ in ("explicit", "cg")
    assert clf.shard_layout_.startswith("linear stage: 1 shard in this process")
    assert "cost model: explicit" in clf.shard_layout_
    assert any(line.startswith("shards") for line in clf.summary().splitlines())


@pytest.fixture(scope="module")
def client(two_worker_client):
    return two_worker_client


@pytest.mark.timeout(240, method="thread")
def test_the_default_dask_fit_puts_a_linear_shard_on_every_worker(client, tmp_path, monkeypatch):
    from mwumkl_dist.engines import dask_pool
    from mwumkl_dist.stores import write_data_store

    monkeypatch.setattr(partition, "ROW_BLOCK", 64)
    X, y = _data()
    ref = MWUMKLClassifier(**PARAMS).fit(X, y)
    placed = []
    start = dask_pool.DaskPool._start

    def spy(self, block, worker):
        placed.append((block.slot, worker))
        return start(self, block, worker)

    monkeypatch.setattr(dask_pool.DaskPool, "_start", spy)
    store = write_data_store(tmp_path / "d.zarr", X, y, chunk_rows=100)
    on_dask = MWUMKLClassifier(**PARAMS, engine="dask", client=client).fit(store)
    assert len(placed) == 2 and len({w for _, w in placed}) == 2, placed  # one shard on each worker
    assert on_dask.shard_layout_.startswith("linear stage: 2 shard(s), one per Dask worker")
    if on_dask.linear_method_ == ref.linear_method_:  # the same method: the same bits
        _assert_identical(ref, on_dask)
    np.testing.assert_array_equal(on_dask.predict(X), ref.predict(X))


@pytest.mark.timeout(240, method="thread")
@pytest.mark.parametrize("n_jobs", [1, 2])
def test_mwu_on_dask_runs_where_the_cost_model_says_with_the_same_model(client, n_jobs):
    from conftest import literal

    X, y = _data(n=300)
    params = dict(kernels="paper", solver="mwu", **literal(epsilon=0.3))
    ref = MWUMKLClassifier(**params).fit(X, y)
    clf = MWUMKLClassifier(**params, engine="dask", client=client, n_jobs=n_jobs).fit(X, y)
    assert clf.shard_layout_.startswith("MWU iterations: ")
    if n_jobs == 2:  # as many threads here as on both workers: never worth a round trip
        assert "supersteps in this process on 2 threads" in clf.shard_layout_
    else:  # measured: one way or the other, with the numbers
        assert "round trip" in clf.shard_layout_
    np.testing.assert_array_equal(clf.dual_coef_, ref.dual_coef_)
    np.testing.assert_array_equal(clf.kernel_weights_, ref.kernel_weights_)
