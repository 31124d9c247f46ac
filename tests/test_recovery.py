"""Real recoveries on the Dask engine: a worker holding shards is killed mid-fit, its shards rebuilt.

A process-based ``LocalCluster`` (one worker process per nanny): the test kills the worker process
that holds shard actors with SIGKILL from the fit's own callback, so the loss happens between two
supersteps of a running fit.  The engine must notice (the shards' sockets close), rebuild every lost
shard on a live worker, count each rebuild in ``DaskEngine.recoveries``, log it, and end with the
uninterrupted local fit's model bit for bit (the rebuilt shards replay the log of picks).

``DaskEngine.recoveries`` is read through a spy on ``DaskEngine.close`` (the estimator closes its
engine at the end of each fit): the narrowest hook that needs no private name.
"""

from __future__ import annotations

import logging
import os
import signal

import numpy as np
import pytest
from conftest import literal

distributed = pytest.importorskip("distributed")

from mwumkl_dist import MWUMKLClassifier  # noqa: E402
from mwumkl_dist.engines.dask import DaskEngine  # noqa: E402

# A hang (a deadlock in C, where no signal handler runs) fails with every thread's stack, not a stalled run.
pytestmark = [
    pytest.mark.timeout(300, method="thread"),
    pytest.mark.skipif(os.name != "posix", reason="SIGKILL of a worker process"),
]

#: The fit's callback kills the worker once this iteration is done (the fits run ~130).
KILL_AT = 20


def _data(n=300, d=5, seed=7):
    rng = np.random.default_rng(seed)
    X = rng.random((n, d))
    y = np.where(X[:, 0] + X[:, 1] + 0.3 * rng.standard_normal(n) > 1.0, "yes", "no")
    return X, y


@pytest.fixture(scope="module")
def process_client():
    # A nanny per worker restarts a killed worker, so every test starts from two live workers.
    with (
        distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster,
        distributed.Client(cluster) as client,
    ):
        yield client


@pytest.fixture
def engine_recoveries(monkeypatch):
    """The ``recoveries`` count of every Dask engine closed during the test, in order.

    ``.placements`` holds each engine's ``(workers of its blocks, live workers)`` at its close.
    """
    counts = _Counts()
    placements = counts.placements = []
    close = DaskEngine.close

    def spy(self):
        counts.append(self.recoveries)
        # Where the shards ended, and the live workers: a rebuilt shard goes to the least loaded worker.
        placements.append(([b.worker for b in self.blocks], sorted(self.client.nthreads())))
        close(self)

    monkeypatch.setattr(DaskEngine, "close", spy)
    return counts


class _Counts(list):
    placements: list


class _KillShardWorker:
    """A fit callback that SIGKILLs the worker process holding the most shard actors, once."""

    def __init__(self, client):
        self.client = client
        self.pids = client.run(os.getpid)  # {worker address: pid}: processes this test's cluster started
        self.killed_at = None
        self.victim_shards = 0

    def __call__(self, info):
        if self.killed_at is None and info.iteration >= KILL_AT:
            actors = {w: sum("ShardServer" in str(k) for k in keys) for w, keys in self.client.has_what().items()}
            victim = max(actors, key=actors.get)
            self.victim_shards = actors[victim]
            os.kill(self.pids[victim], signal.SIGKILL)
            self.killed_at = info.iteration


def _wait_until_no_shard_actors(client, timeout: float = 60.0) -> None:
    """Wait until the scheduler lists no shard actor (an earlier fit's are released after its engine closes)."""
    import time

    deadline = time.monotonic() + timeout
    while any("ShardServer" in str(k) for keys in client.has_what().values() for k in keys):
        assert time.monotonic() < deadline, "an earlier fit's shard actors were never released"
        time.sleep(0.1)


def _fit_with_a_killed_worker(client, caplog, d=5, **layout):
    X, y = _data(d=d)
    params = dict(kernels="paper-per-feature", **literal(epsilon=0.3))
    ref = MWUMKLClassifier(**params).fit(X, y)
    client.wait_for_workers(2, timeout=120)  # the nanny restarted the worker an earlier test killed
    _wait_until_no_shard_actors(client)  # the victim count below must see this fit's shards only
    kill = _KillShardWorker(client)
    with caplog.at_level(logging.WARNING, logger="mwumkl_dist"):
        clf = MWUMKLClassifier(**params, engine="dask", client=client, **layout, callback=kill, callback_every=10).fit(
            X, y
        )
    assert kill.killed_at == KILL_AT, "the worker was never killed"
    assert kill.victim_shards >= 1, "the killed worker held no shard: nothing was lost"
    assert clf.n_iter_ > KILL_AT
    # The uninterrupted local fit, to the last bit.
    np.testing.assert_array_equal(clf.support_, ref.support_)
    np.testing.assert_array_equal(clf.dual_coef_, ref.dual_coef_)
    np.testing.assert_array_equal(clf.kernel_weights_, ref.kernel_weights_)
    np.testing.assert_array_equal(clf.intercept_, ref.intercept_)
    np.testing.assert_array_equal(clf.decision_function(X), ref.decision_function(X))
    rebuilt = [r for r in caplog.records if r.name == "mwumkl_dist" and "lost" in r.getMessage()]
    return kill, rebuilt


@pytest.mark.timeout(240, method="thread")
def test_a_killed_row_shard_worker_is_rebuilt_counted_and_gives_the_same_model(
    process_client, engine_recoveries, caplog
):
    kill, rebuilt = _fit_with_a_killed_worker(process_client, caplog, n_shards=4)
    # Every shard the dead worker held was rebuilt once, and counted.
    assert engine_recoveries == [kill.victim_shards]
    assert len(rebuilt) == kill.victim_shards
    # The nanny restarted the killed worker and the rebuilt shards went there, not all onto the
    # survivor: both live workers hold two of the four shards.
    [(workers, live)] = engine_recoveries.placements
    assert len(live) == 2 and sorted(set(workers)) == live, (workers, live)
    assert [workers.count(w) for w in live] == [2, 2]


@pytest.mark.timeout(240, method="thread")
def test_a_killed_kernel_shard_worker_is_rebuilt_counted_and_gives_the_same_model(
    process_client, engine_recoveries, caplog
):
    # Row x kernel blocks: the driver sums partial scores and fetches V rows, both over rebuilt blocks.
    # 13 features: 156 paper-per-feature kernels, three kernel tiles (72, 72, 12), so three kernel blocks.
    kill, rebuilt = _fit_with_a_killed_worker(process_client, caplog, d=13, n_shards=2, n_kernel_shards=3)
    assert engine_recoveries == [kill.victim_shards]
    assert len(rebuilt) == kill.victim_shards


@pytest.mark.timeout(300, method="thread")
def test_a_worker_killed_in_the_linear_stage_leaves_the_same_two_stage_model(process_client, caplog, monkeypatch):
    """The two-stage fit's default layout (one linear-stage shard per worker, ``n_shards="auto"``): the worker of a
    shard is killed after the first Newton step; its shard is rebuilt (its problem loaded again, the kept call) and
    the fit ends with the local fit's model, bit for bit."""
    from mwumkl_dist.core import partition
    from mwumkl_dist.engines.dask_pool import DaskPool

    monkeypatch.setattr(partition, "ROW_BLOCK", 64)  # the driver cuts the shards (they get their row block)
    rng = np.random.default_rng(3)
    X = rng.random((700, 5))
    y = np.where(np.sin(3 * X[:, 0]) + X[:, 1] ** 2 + 0.3 * rng.standard_normal(700) > 0.9, "yes", "no")
    params = dict(C=10.0, solver="two-stage", kernels="poly:1,gaussian:0.5,gaussian:1,gaussian:2", polish=False)
    ref = MWUMKLClassifier(**params, n_jobs=1).fit(X, y)
    process_client.wait_for_workers(2, timeout=120)
    _wait_until_no_shard_actors(process_client)
    pids = process_client.run(os.getpid)
    killed = []

    def kill(info):
        if not killed and info.phase == "newton" and info.done >= 1:
            actors = {w: sum("ShardServer" in str(k) for k in keys) for w, keys in process_client.has_what().items()}
            victim = max(actors, key=actors.get)
            if actors[victim]:
                os.kill(pids[victim], signal.SIGKILL)
                killed.append(victim)

    rebuilt = []
    recover = DaskPool._recover
    monkeypatch.setattr(DaskPool, "_recover", lambda self, block: (rebuilt.append(block.slot), recover(self, block))[1])
    with caplog.at_level(logging.WARNING, logger="mwumkl_dist"):
        clf = MWUMKLClassifier(**params, n_jobs=1, engine="dask", client=process_client, callback=kill).fit(X, y)
    assert killed, "no worker was killed"
    assert len(rebuilt) == 1, rebuilt  # the victim held one of the two shards
    assert clf.shard_layout_.startswith("linear stage: 2 shard(s), one per Dask worker")
    for name in ("kernel_weights_", "support_", "dual_coef_", "intercept_", "C_"):
        np.testing.assert_array_equal(getattr(clf, name), getattr(ref, name), err_msg=name)
    np.testing.assert_array_equal(clf.decision_function(X), ref.decision_function(X))
