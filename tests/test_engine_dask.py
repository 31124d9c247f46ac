"""The Dask engine: same model as the local engine for every layout, checkpoints, recovery."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

import numpy as np
import pytest
from conftest import closed_port, literal

distributed = pytest.importorskip("distributed")

from mwumkl_dist import MWUMKLClassifier  # noqa: E402
from mwumkl_dist.core import partition  # noqa: E402
from mwumkl_dist.core.mwu_rules import FewIterationsWarning  # noqa: E402
from mwumkl_dist.data.problems import FeatureProblem, chain_safe_ranges  # noqa: E402
from mwumkl_dist.engines.dask import DaskEngine, connect_client  # noqa: E402
from mwumkl_dist.kernels import KernelSet  # noqa: E402

# A hang (a deadlock in C, where no signal handler runs) fails with every thread's stack, not a stalled run.
pytestmark = pytest.mark.timeout(300, method="thread")


def _data(n=160, d=4, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.random((n, d))
    y = np.where(X[:, 0] + X[:, 1] + 0.3 * rng.standard_normal(n) > 1.0, "yes", "no")
    return X, y


def _assert_same_model(a: MWUMKLClassifier, b: MWUMKLClassifier, X):
    np.testing.assert_array_equal(a.support_, b.support_)
    np.testing.assert_allclose(a.dual_coef_, b.dual_coef_, rtol=1e-12, atol=0)
    np.testing.assert_allclose(a.kernel_weights_, b.kernel_weights_, rtol=1e-12, atol=0)
    np.testing.assert_allclose(a.intercept_, b.intercept_, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(a.decision_function(X), b.decision_function(X), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(a.predict(X), b.predict(X))


@pytest.fixture(scope="module")
def threaded_client():
    with distributed.Client(processes=False, n_workers=2, threads_per_worker=1, dashboard_address=":0") as client:
        yield client


@pytest.fixture(scope="module")
def reference():
    X, y = _data(d=16)  # 192 kernels: three kernel tiles (72, 72, 48), so kernel shards make up to three blocks
    params = dict(kernels="paper-per-feature", **literal(epsilon=0.3))
    return X, y, params, MWUMKLClassifier(**params).fit(X, y)


@pytest.mark.parametrize(
    "n_shards, n_kernel_shards",
    [(1, 1), (2, 1), (3, 1), (5, 1), (8, 1), (1, 2), (1, 3), (1, 8), (2, 2), (3, 4), (4, 2)],
)
def test_every_layout_matches_local_engine(threaded_client, reference, n_shards, n_kernel_shards):
    X, y, params, ref = reference
    clf = MWUMKLClassifier(
        **params, engine="dask", client=threaded_client, n_shards=n_shards, n_kernel_shards=n_kernel_shards
    ).fit(X, y)
    _assert_same_model(clf, ref, X)
    # Row shards and aligned kernel blocks reproduce the local engine to the last bit.
    np.testing.assert_array_equal(clf.dual_coef_, ref.dual_coef_)
    np.testing.assert_array_equal(clf.intercept_, ref.intercept_)


@pytest.mark.parametrize("selectivity", [0.0, 100.0, "exact"])
def test_relative_exponents_are_the_same_in_every_layout(threaded_client, selectivity):
    """The selectivity acts on the driver's m-vector s only: every layout gives the local model to the bit."""
    X, y = _data(d=8)  # 96 kernels: two kernel tiles (72, 24), so kernel shards make two blocks
    params = dict(kernels="paper-per-feature", **literal(epsilon=0.3, selectivity=selectivity))
    ref = MWUMKLClassifier(**params).fit(X, y)
    assert 1.0 / np.sum(ref.kernel_weights_**2) < 40 or selectivity == 0.0  # it does select (48 kernels)
    local = MWUMKLClassifier(**params, n_shards=3).fit(X, y)
    np.testing.assert_array_equal(local.dual_coef_, ref.dual_coef_)
    np.testing.assert_array_equal(local.kernel_weights_, ref.kernel_weights_)
    for n_shards, n_kernel_shards in [(2, 1), (1, 3), (2, 2)]:
        clf = MWUMKLClassifier(
            **params, engine="dask", client=threaded_client, n_shards=n_shards, n_kernel_shards=n_kernel_shards
        ).fit(X, y)
        _assert_same_model(clf, ref, X)
        np.testing.assert_array_equal(clf.dual_coef_, ref.dual_coef_)
        np.testing.assert_array_equal(clf.kernel_weights_, ref.kernel_weights_)


def test_precomputed_kernels_on_dask(threaded_client, monkeypatch):
    # Tiles of one kernel (this process only: the threaded client's shards live here) let the 3 kernels
    # make 3 kernel blocks; without squaring chains they add the scores exactly as one tile does.
    monkeypatch.setattr(partition, "TILE_KERNELS", 1)
    X, y = _data(n=90)
    ks = KernelSet("linear,gaussian:1,gaussian:2", X.shape[1])
    from mwumkl_dist.data.shards import FeatureShard

    shard = FeatureShard(X, np.ones(len(X)), 0, ks.plan)
    K = np.stack([shard.raw_columns(x, x)[0].T for x in X], axis=2)  # (m, n, n): K[i, :, j] = column j
    ref = MWUMKLClassifier(kernels="precomputed", **literal(epsilon=0.3)).fit(K, y)
    for layout in [(3, 1), (1, 3), (2, 2)]:
        clf = MWUMKLClassifier(
            kernels="precomputed",
            **literal(epsilon=0.3),
            engine="dask",
            client=threaded_client,
            n_shards=layout[0],
            n_kernel_shards=layout[1],
        ).fit(K, y)
        np.testing.assert_array_equal(clf.dual_coef_, ref.dual_coef_)
        np.testing.assert_array_equal(clf.kernel_weights_, ref.kernel_weights_)


@pytest.mark.parametrize("n_shards, n_kernel_shards", [(2, 1), (1, 3), (2, 2), (3, 3)])
def test_training_scores_read_off_V_are_the_same_bits_in_every_layout(threaded_client, n_shards, n_kernel_shards):
    """Row shards round their exact margins, kernel blocks send exact integers added on the driver: the same bits."""
    from mwumkl_dist.data.problems import make_training_input
    from mwumkl_dist.engines.local import LocalEngine
    from mwumkl_dist.solvers.base import score_rows
    from mwumkl_dist.solvers.mwu.iterate import Iterations, solve
    from mwumkl_dist.solvers.mwu.model import model_attributes

    X, y = _data(d=16)  # 192 kernels: three kernel tiles
    data = make_training_input(X, y, "paper-per-feature", estimator=None)
    ridge = np.random.default_rng(4).uniform(0.001, 0.02, len(y))  # per point: support rows' ridge terms differ

    def solved(engine):
        with engine:
            traces = engine.traces()
            engine.configure(1.0 / traces, ridge)
            result = solve(engine, inv_trace=1.0 / traces, ridge=ridge, iterations=Iterations(0.3, 0.5, 40),
                           rows_to_score=lambda counts: np.arange(1, len(counts), 2))  # fmt: skip
            return result, traces

    problem = data.binary(np.where(data.y == "yes", 1.0, -1.0))
    (ref, traces), (got, _) = (
        solved(LocalEngine(problem)),
        solved(DaskEngine(problem, threaded_client, n_shards=n_shards, n_kernel_shards=n_kernel_shards)),
    )
    np.testing.assert_array_equal(got.scored_rows, ref.scored_rows)
    np.testing.assert_array_equal(got.scores, ref.scores)
    model = model_attributes([ref], data, ["yes"], traces)
    rows = ref.scored_rows
    assert np.isin(rows, model["support_"]).any() and not np.isin(rows, model["support_"]).all()
    want = score_rows("paper-per-feature", data.kernel_names, 16, X[rows], model["support_"],
                      model["support_vectors_"], model["dual_coef_"], model["raw_kernel_weights_"])[:, 0]  # fmt: skip
    assert np.abs(ref.scores - want).max() < 1e-12 * np.abs(want).max()


def test_the_bias_check_gives_the_local_model_in_every_layout(threaded_client):
    rng = np.random.default_rng(0)
    X = rng.random((300, 8))  # 96 kernels: two kernel tiles
    y = np.where(np.sin(4 * X[:, 0]) + X[:, 1] + 0.8 * rng.standard_normal(300) > 1.3, "rare", "common")
    params = dict(kernels="paper-per-feature", epsilon=0.5, C=1000.0, polish=False, selectivity="paper", solver="mwu")
    with pytest.warns(FewIterationsWarning, match="re-chosen"):  # too few iterations: the bias is replaced
        ref = MWUMKLClassifier(**params).fit(X, y)
    for n_shards, n_kernel_shards in [(2, 1), (1, 2), (2, 2)]:
        with pytest.warns(FewIterationsWarning, match="re-chosen"):
            clf = MWUMKLClassifier(
                **params, engine="dask", client=threaded_client, n_shards=n_shards, n_kernel_shards=n_kernel_shards
            ).fit(X, y)
        np.testing.assert_array_equal(clf.intercept_, ref.intercept_)
        np.testing.assert_array_equal(clf.dual_coef_, ref.dual_coef_)
        assert clf.fit_warnings_ == ref.fit_warnings_


def test_local_threaded_mode_without_client():
    X, y = _data(n=80)
    ref = MWUMKLClassifier(**literal(epsilon=0.4)).fit(X, y)
    clf = MWUMKLClassifier(**literal(epsilon=0.4), engine="dask", n_shards=2).fit(X, y)
    _assert_same_model(clf, ref, X)


def test_multiclass_on_dask(threaded_client):
    X, _ = _data(n=120)
    y = np.digitize(X[:, 0] + X[:, 2], [0.7, 1.3])
    ref = MWUMKLClassifier(**literal(epsilon=0.4)).fit(X, y)
    clf = MWUMKLClassifier(**literal(epsilon=0.4), engine="dask", client=threaded_client, n_shards=3).fit(X, y)
    _assert_same_model(clf, ref, X)


def test_chain_safe_ranges_never_split_a_chain():
    plan = KernelSet("paper-per-feature", 5).plan
    for n_blocks in range(1, 10):
        ranges = chain_safe_ranges(plan.square_of, n_blocks)
        assert ranges[0][0] == 0 and ranges[-1][1] == plan.n_kernels
        assert all(a < b for a, b in ranges)
        assert all(r1[1] == r2[0] for r1, r2 in zip(ranges, ranges[1:]))
        block_of = np.empty(plan.n_kernels, int)
        for k, (a, b) in enumerate(ranges):
            block_of[a:b] = k
        linked = plan.square_of >= 0
        assert np.all(block_of[linked] == block_of[plan.square_of[linked]])


@pytest.mark.parametrize("engine", ["local", "dask"])
def test_checkpoint_resume_gives_the_same_model(tmp_path, threaded_client, engine):
    X, y = _data(n=150, seed=3)
    y[:25] = "maybe"  # three classes: the checkpoint also carries finished one-vs-rest problems
    extra = dict(engine="dask", client=threaded_client, n_shards=3) if engine == "dask" else {}
    params = literal(epsilon=0.3, **extra)
    ref = MWUMKLClassifier(**params).fit(X, y)
    ckpt = tmp_path / "fit.ckpt.npz"

    class Crash(Exception):
        pass

    calls = {"n": 0}

    def crash(info):
        calls["n"] += 1
        if calls["n"] == 5:  # mid-way through the second one-vs-rest problem
            raise Crash

    with pytest.raises(Crash):
        MWUMKLClassifier(**params, checkpoint=ckpt, checkpoint_every=7, callback=crash, callback_every=30).fit(X, y)
    assert ckpt.exists()
    resumed = MWUMKLClassifier(**params, checkpoint=ckpt, checkpoint_every=7).fit(X, y, resume=ckpt)
    np.testing.assert_array_equal(resumed.dual_coef_, ref.dual_coef_)
    np.testing.assert_array_equal(resumed.kernel_weights_, ref.kernel_weights_)
    np.testing.assert_array_equal(resumed.intercept_, ref.intercept_)


def test_resume_refuses_a_checkpoint_of_another_fit(tmp_path):
    X, y = _data(n=100)
    ckpt = tmp_path / "c.npz"
    MWUMKLClassifier(**literal(epsilon=0.4), checkpoint=ckpt, checkpoint_every=5).fit(X, y)
    with pytest.raises(ValueError, match="different data"):
        MWUMKLClassifier(**literal(epsilon=0.4)).fit(X[::-1], y[::-1], resume=ckpt)
    with pytest.raises(ValueError, match="different data"):
        MWUMKLClassifier(**literal(epsilon=0.3)).fit(X, y, resume=ckpt)
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="not a readable"):
        MWUMKLClassifier(**literal(epsilon=0.4)).fit(X, y, resume=bad)
    with pytest.raises(FileNotFoundError):
        MWUMKLClassifier(**literal(epsilon=0.4)).fit(X, y, resume=tmp_path / "missing.npz")


@pytest.mark.timeout(300)
def test_unreachable_scheduler_fails_fast_with_a_clear_error():
    nobody = f"tcp://127.0.0.1:{closed_port()}"
    with pytest.raises(ConnectionError, match="cannot reach the Dask scheduler"):
        connect_client(nobody, timeout=1.0)
    with pytest.raises(ValueError, match="address"):
        connect_client("no-port-here", timeout=1.0)
    X, y = _data(n=40)
    with pytest.raises(ConnectionError):
        MWUMKLClassifier(**literal(), engine="dask", client=nobody, scheduler_timeout=1.0).fit(X, y)
    # With C="auto" the cluster is reached before the cross-validation runs: no phase of the fit starts.
    X, y = _data(n=600)
    phases = []
    with pytest.raises(ConnectionError):
        MWUMKLClassifier(engine="dask", client=nobody, scheduler_timeout=1.0,
                         callback=lambda info: phases.append(info.phase)).fit(X, y)  # fmt: skip
    assert phases == []
    with pytest.raises(TypeError, match="client"):
        connect_client(42)


def test_silent_listener_is_not_a_scheduler():
    # Something accepts the connection but never speaks Dask's protocol: a timeout, not a hang.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        address = f"tcp://127.0.0.1:{listener.getsockname()[1]}"
        start = time.monotonic()
        with pytest.raises(ConnectionError, match="cannot reach the Dask scheduler"):
            connect_client(address, timeout=1.0)
        assert time.monotonic() - start < 30
    # A worker's address is refused by name; the scheduler's works (nothing left deadlocked).
    with distributed.LocalCluster(
        processes=False, protocol="tcp://", n_workers=1, threads_per_worker=1, dashboard_address=":0"
    ) as cluster:
        worker = next(iter(cluster.workers.values())).address
        with pytest.raises(ValueError, match="Worker address, not a scheduler"):
            connect_client(worker, timeout=5.0)
        client, owned = connect_client(cluster.scheduler_address, timeout=5.0)
        with client:
            assert owned and client.submit(sum, [1, 2]).result(timeout=30) == 3


def test_killed_worker_is_recovered_with_the_same_model():
    X, y = _data(n=300, d=5, seed=7)
    ref = MWUMKLClassifier(**literal(epsilon=0.3)).fit(X, y)
    with (
        distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster,
        distributed.Client(cluster) as client,
    ):
        victim = min(client.run(os.getpid).values())
        killed = []

        def kill_once(info):
            if not killed and info.iteration >= 60:
                os.kill(victim, signal.SIGKILL)
                killed.append(info.iteration)

        clf = MWUMKLClassifier(
            **literal(epsilon=0.3), engine="dask", client=client, n_shards=4, callback=kill_once, callback_every=20
        ).fit(X, y)
    assert killed, "the worker was never killed"
    np.testing.assert_array_equal(clf.dual_coef_, ref.dual_coef_)
    np.testing.assert_array_equal(clf.kernel_weights_, ref.kernel_weights_)
    np.testing.assert_array_equal(clf.intercept_, ref.intercept_)


def test_engine_counts_recoveries_and_closes(threaded_client):
    X, y = _data(n=60)
    yy = np.where(y == "yes", 1.0, -1.0)
    problem = FeatureProblem(X, yy, KernelSet("paper", X.shape[1]))
    with DaskEngine(problem, threaded_client, n_shards=2) as engine:
        assert engine.recoveries == 0
        assert len(engine.blocks) == 2
    assert all(b.conn is None for b in engine.blocks)


def _pickles_objects_of(obj, kinds) -> bool:
    """Whether ``obj`` (a message as the channel encodes it) holds an instance of ``kinds`` anywhere inside."""
    if isinstance(obj, kinds):
        return True
    if isinstance(obj, (tuple, list)):
        return any(_pickles_objects_of(o, kinds) for o in obj)
    return False


@pytest.mark.parametrize("layout", [(2, 1), (1, 2), (2, 2)])
def test_a_superstep_pickles_no_candidate_or_point_and_takes_at_most_two_calls(threaded_client, monkeypatch, layout):
    # The threaded client's shards live in this process: the spy sees the driver's and the shards' frames.
    from mwumkl_dist.core.mwu_rules import Candidate
    from mwumkl_dist.engines import channel
    from mwumkl_dist.kernels.evaluation import SparsePoint
    from mwumkl_dist.solvers.mwu.iterate import Iterations, solve

    X, y = _data(d=8)  # 96 kernels: two kernel tiles, so (1, 2) makes two kernel blocks
    problem = FeatureProblem(X, np.where(y == "yes", 1.0, -1.0), KernelSet("paper-per-feature", X.shape[1]))
    with DaskEngine(problem, threaded_client, n_shards=layout[0], n_kernel_shards=layout[1]) as engine:
        inv_trace = 1.0 / engine.traces()
        engine.configure(inv_trace, 0.01)
        encoded, calls = [], []
        encode, call = channel.encode, engine.pool.call

        def spy_call(method, *args, **kwargs):  # records what the supersteps' frames hold (not the first candidates)
            calls.append(getattr(method, "__name__", method))
            if method != "initial_candidates":
                monkeypatch.setattr(channel, "encode", lambda obj: encoded.append(obj) or encode(obj))
            try:
                return call(method, *args, **kwargs)
            finally:
                monkeypatch.setattr(channel, "encode", encode)

        monkeypatch.setattr(engine.pool, "call", spy_call)
        solve(engine, inv_trace=inv_trace, ridge=0.01, iterations=Iterations(0.3, 0.5, 20))
    # One call per superstep for row shards; kernel blocks add one fetch of both picked rows.
    assert calls.count("superstep" if layout[1] == 1 else "superstep_scores") == 20
    assert calls.count("fetch_rows") == (0 if layout[1] == 1 else 21)  # + solve's initial_candidates
    assert len(encoded) >= 40 and not [m for m in encoded if _pickles_objects_of(m, (Candidate, SparsePoint))]


def _serve_threads(state: str) -> int:
    return sum(t.name == f"mwumkl-shard{state}" and t.is_alive() for t in threading.enumerate())


def test_a_later_fit_reuses_the_shard_threads_and_starts_none(threaded_client, monkeypatch):
    # Starting a thread can hang a worker whose profiler is in sys._current_frames during a GC finalizer
    # (CPython 3.11): a worker starts serve threads only while it holds more shards than ever before.
    X, y = _data(n=80)
    fit = MWUMKLClassifier(**literal(epsilon=0.4), engine="dask", client=threaded_client, n_shards=3).fit
    fit(X, y)
    deadline = time.monotonic() + 10
    while _serve_threads("") or _serve_threads("-idle") < 3:  # the first fit's serve threads go idle
        assert time.monotonic() < deadline, (_serve_threads(""), _serve_threads("-idle"))
        time.sleep(0.05)
    started = []
    start = threading.Thread.start
    monkeypatch.setattr(threading.Thread, "start", lambda self: started.append(self.name) or start(self))
    fit(X, y)
    assert not [name for name in started if name.startswith(("mwumkl-shard", "mwumkl-channel"))], started


def test_a_structured_default_model_is_the_local_one_on_dask(threaded_client):
    """kernels="auto": the structure search runs on the driver (in memory), the final fit on its own kernels on the
    shards; the same model as the local engine's."""
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(240, 6))
    y = np.where(np.sin(2 * np.pi * X[:, 0]) * np.sin(2 * np.pi * X[:, 1]) > 0, 1, -1)
    local = MWUMKLClassifier(random_state=0).fit(X, y)
    on_dask = MWUMKLClassifier(random_state=0, engine="dask", client=threaded_client, n_shards=2).fit(X, y)
    assert local.structure_["features"] == [0, 1] and on_dask.structure_ == local.structure_
    assert list(on_dask.kernel_names_) == list(local.kernel_names_)
    _assert_same_model(on_dask, local, X)
