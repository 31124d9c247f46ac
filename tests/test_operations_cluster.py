"""Operations on a real process cluster (issue 21): strangers at the shard ports, killed and hung workers.

A ``dask scheduler`` and two ``dask worker`` processes (each with its nanny, which restarts a killed
worker) on 127.0.0.1, started once for the module and stopped at its end; every process also stops
by itself after :data:`LIFETIME` seconds (``timeout -s KILL``), so a killed test run leaves nothing
behind.  Each test fits through the public estimator on that cluster while something goes wrong (a
crowd of connections at every new shard port, a worker SIGKILLed while the shards are placed or
mid-fit, a worker SIGSTOPped, the driver killed during its start-up) and checks that the model is
the uninterrupted local fit's, bit for bit, or the exact message, and that no shard outlives its
fit.
"""

from __future__ import annotations

import functools
import gc
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import literal

distributed = pytest.importorskip("distributed")

from mwumkl_dist import MWUMKLClassifier  # noqa: E402
from mwumkl_dist.engines import channel as _channel  # noqa: E402
from mwumkl_dist.engines import dask_pool  # noqa: E402
from mwumkl_dist.engines.dask import DaskEngine  # noqa: E402
from mwumkl_dist.engines.dask_pool import DaskPool  # noqa: E402
from mwumkl_dist.engines.mwu_engine import MWUEngine  # noqa: E402

# A hang (a deadlock in C, where no signal handler runs) fails with every thread's stack, not a stalled run.
pytestmark = [
    pytest.mark.timeout(300, method="thread"),
    pytest.mark.skipif(
        os.name != "posix" or shutil.which("timeout") is None, reason="signals to worker processes, coreutils timeout"
    ),
]

REPO = Path(__file__).resolve().parent.parent
#: Seconds after which every process of the cluster stops by itself (a watchdog for killed test runs).
LIFETIME = 600
#: Strangers of each kind (silent, garbage) at every new shard port: more than the 64 handshakes the
#: listener used to allow at once.
CROWD = 150
PARAMS = dict(kernels="paper", **literal(epsilon=0.3))


def _data(n=160, d=4, seed=5):
    rng = np.random.default_rng(seed)
    X = rng.random((n, d))
    y = np.where(X[:, 0] + X[:, 1] + 0.3 * rng.standard_normal(n) > 1.0, 1, -1)
    return X, y


@functools.cache
def _reference(n=160):
    return MWUMKLClassifier(**PARAMS).fit(*_data(n))


def _assert_same_model(clf, ref):
    for name in ("support_", "dual_coef_", "kernel_weights_", "intercept_"):
        np.testing.assert_array_equal(getattr(clf, name), getattr(ref, name), err_msg=name)


def _env() -> dict:
    paths = [str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p))


class ProcessCluster:
    """``dask scheduler`` + ``n`` ``dask worker`` processes (with nannies) on 127.0.0.1, and a client."""

    def __init__(self, workdir: Path, n_workers: int = 2):
        self.n_workers = n_workers
        self.groups: list[subprocess.Popen] = []
        self.log = open(workdir / "cluster.log", "wb")  # noqa: SIM115 - closed in close()
        scheduler_file = workdir / "scheduler.json"
        try:
            self._spawn("scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                        "--scheduler-file", str(scheduler_file))  # fmt: skip
            deadline = time.monotonic() + 60
            while not scheduler_file.exists() or not scheduler_file.read_text().strip():
                assert time.monotonic() < deadline, "the dask scheduler did not start"
                time.sleep(0.1)
            self.address = json.loads(scheduler_file.read_text())["address"]
            for _ in range(n_workers):
                self._spawn("worker", self.address, "--nthreads", "1", "--host", "127.0.0.1", "--no-dashboard",
                            "--death-timeout", "60")  # fmt: skip
            self.client = distributed.Client(self.address, timeout=30)
            self.client.wait_for_workers(n_workers, timeout=120)
        except BaseException:
            self.close()
            raise

    def _spawn(self, *args) -> None:
        cmd = [
            "timeout",
            "-s",
            "KILL",
            str(LIFETIME),
            sys.executable,
            "-m",
            "distributed.cli.dask_" + args[0],
            *args[1:],
        ]
        self.groups.append(
            subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=_env(), start_new_session=True)
        )

    def pids(self) -> dict[str, int]:
        """``{worker address: pid}`` of the worker processes (not their nannies)."""
        return self.client.run(os.getpid)

    def ready(self, timeout: float = 120) -> None:
        """Both workers up (a nanny restarts a killed one), no shard of an earlier fit left, none stopped."""
        self.client.wait_for_workers(self.n_workers, timeout=timeout)
        deadline = time.monotonic() + 30
        while self.shard_threads() or self.shard_keys():
            assert time.monotonic() < deadline, "an earlier fit's shards are still there"
            time.sleep(0.1)

    def shard_keys(self) -> list:
        return [k for keys in self.client.has_what().values() for k in keys if "ShardServer" in str(k)]

    def shard_threads(self) -> int:
        """Shard server threads alive on the workers (listening for their driver, or serving it)."""
        counts = self.client.run(_count_shard_threads)
        return sum(counts.values())

    def close(self) -> None:
        client = getattr(self, "client", None)
        if client is not None:
            client.close()
        for proc in self.groups:
            with _suppress():
                os.killpg(proc.pid, signal.SIGCONT)  # a stopped worker must be able to stop
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.groups:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with _suppress():
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        self.log.close()


class _suppress:
    def __enter__(self):
        return self

    def __exit__(self, kind, *_):
        return kind is not None and issubclass(kind, ProcessLookupError)


def _count_shard_threads() -> int:  # runs on a worker
    return sum(t.name == "mwumkl-shard" and t.is_alive() for t in threading.enumerate())


def _slow_factory(factory, seconds, marker=None):  # on a worker: a shard slow to build (a store's read)
    time.sleep(seconds)
    shard = factory()
    if marker is not None:
        Path(marker).write_text("built")
    return shard


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # A crowd of strangers needs file descriptors in this process: raise the soft limit when allowed.
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        wanted = 8 * CROWD + 512
        if soft < wanted and (hard == resource.RLIM_INFINITY or hard >= wanted):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    except (ImportError, ValueError, OSError):
        pass
    _reference()  # the local fit first (it compiles what the workers then load from the cache)
    cluster = ProcessCluster(tmp_path_factory.mktemp("cluster"))
    try:
        yield cluster
    finally:
        cluster.close()


def _fit(cluster, n=160, **params):
    X, y = _data(n)
    return MWUMKLClassifier(**PARAMS, engine="dask", client=cluster.client, **params).fit(X, y)


def _messages(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "mwumkl_dist"]


# ----------------------------------------------------------------------------- strangers at the shard ports
@pytest.mark.timeout(120, method="thread")
def test_a_crowd_of_silent_and_garbage_strangers_at_every_shard_port_only_delays_the_fit(cluster, monkeypatch):
    cluster.ready()
    strangers: list[socket.socket] = []
    connect = _channel.connect
    crowded = set()

    def crowd_first(address, *args, **kwargs):
        # Before the driver: CROWD silent connections and CROWD that send garbage, at each new port.
        if tuple(address) not in crowded:
            crowded.add(tuple(address))
            for _ in range(CROWD):
                strangers.append(socket.create_connection(tuple(address), timeout=5))
                garbage = socket.create_connection(tuple(address), timeout=5)
                garbage.sendall(os.urandom(512))
                strangers.append(garbage)
        return connect(address, *args, **kwargs)

    monkeypatch.setattr(_channel, "connect", crowd_first)
    start = time.monotonic()
    try:
        clf = _fit(cluster, n_shards=2)
    finally:
        for s in strangers:
            s.close()
    assert len(crowded) == 2
    _assert_same_model(clf, _reference())
    assert time.monotonic() - start < 60


@pytest.mark.timeout(120, method="thread")
def test_the_driver_retries_a_failed_connection_to_a_shard(cluster, monkeypatch, caplog):
    # A stranger (or the network) makes the driver's first attempts fail: it tries again.
    cluster.ready()
    connect = _channel.connect
    failures = {"left": 3}

    def flaky(address, *args, **kwargs):
        if failures["left"] > 0:
            failures["left"] -= 1
            raise EOFError("the peer closed the channel")
        return connect(address, *args, **kwargs)

    monkeypatch.setattr(_channel, "connect", flaky)
    with caplog.at_level(logging.WARNING, logger="mwumkl_dist"):
        clf = _fit(cluster, n_shards=2)
    assert failures["left"] == 0
    _assert_same_model(clf, _reference())
    assert not [m for m in _messages(caplog) if "lost" in m]  # nothing was rebuilt for it


# ----------------------------------------------------------------------------- killed workers
@pytest.mark.timeout(180, method="thread")
@pytest.mark.parametrize("when", ["before", "during"])
def test_a_worker_killed_while_the_shards_are_placed_is_named_and_the_fit_goes_on(cluster, monkeypatch, caplog, when):
    # "before": the worker dies just before the driver sends it the shard; "during": while the
    # worker builds the shard (a store's shard reads its rows then).
    cluster.ready()
    pids = cluster.pids()
    start = DaskPool._start
    seen = []
    if when == "during":
        factory = MWUEngine._factory
        monkeypatch.setattr(MWUEngine, "_factory", lambda self, block: functools.partial(
            _slow_factory, factory(self, block), 2.0))  # fmt: skip

    def kill_on_second(self, block, worker):
        seen.append(worker)
        if len(seen) == 2:
            if when == "before":
                os.kill(pids[worker], signal.SIGKILL)
            else:
                threading.Timer(0.8, os.kill, (pids[worker], signal.SIGKILL)).start()
        return start(self, block, worker)

    monkeypatch.setattr(DaskPool, "_start", kill_on_second)
    with caplog.at_level(logging.WARNING, logger="mwumkl_dist"):
        clf = _fit(cluster, n_shards=2)
    victim = seen[1]
    assert victim in pids and len(seen) >= 3  # the second shard was placed again
    _assert_same_model(clf, _reference())
    named = [m for m in _messages(caplog) if m.startswith(f"worker {victim} left while shard")]
    assert named and "placing the shard on another worker" in named[0], _messages(caplog)


class _KillAll:
    """A fit callback that SIGKILLs every worker process at ``iteration``, once."""

    def __init__(self, cluster, iteration):
        self.pids = cluster.pids()
        self.iteration = iteration
        self.done = False

    def __call__(self, info):
        if not self.done and info.iteration >= self.iteration:
            self.done = True
            for pid in self.pids.values():
                os.kill(pid, signal.SIGKILL)


@pytest.mark.timeout(180, method="thread")
def test_both_workers_killed_mid_fit_says_both_left_and_gives_the_same_model(cluster, caplog):
    cluster.ready()
    kill = _KillAll(cluster, 20)
    with caplog.at_level(logging.WARNING, logger="mwumkl_dist"):
        clf = _fit(cluster, n_shards=2, callback=kill, callback_every=10)
    assert kill.done
    _assert_same_model(clf, _reference())
    messages = _messages(caplog)
    left = [m for m in messages if "Dask workers left" in m]
    assert len(left) == 1 and left[0].startswith("2 of the fit's 2 Dask workers left ("), messages
    assert all(w in left[0] for w in kill.pids)
    assert sum("lost; rebuilding it" in m for m in messages) == 2


# ----------------------------------------------------------------------------- a hung worker
@pytest.mark.timeout(180, method="thread")
def test_a_hung_worker_is_reported_then_replaced_after_superstep_timeout(cluster, monkeypatch, caplog):
    cluster.ready()
    monkeypatch.setattr(dask_pool, "SLOW_REPORT", 1.0)
    monkeypatch.setattr(dask_pool, "WAIT_REPORT_EVERY", 1.0)
    pids = cluster.pids()
    stopped = []

    def hang_one(info):  # SIGSTOP the worker holding the first shard, once
        if not stopped and info.iteration >= 20:
            worker = engines[-1].blocks[0].worker
            os.kill(pids[worker], signal.SIGSTOP)
            stopped.append(worker)

    engines = []
    init = DaskEngine.__init__

    def spy(self, *args, **kwargs):
        engines.append(self)
        init(self, *args, **kwargs)

    monkeypatch.setattr(DaskEngine, "__init__", spy)
    start = time.monotonic()
    try:
        with caplog.at_level(logging.WARNING, logger="mwumkl_dist"):
            clf = _fit(cluster, n_shards=2, superstep_timeout=4.0, callback=hang_one, callback_every=10)
    finally:
        for worker in stopped:
            os.kill(pids[worker], signal.SIGCONT)
    assert stopped
    _assert_same_model(clf, _reference())
    messages = _messages(caplog)
    hung = stopped[0]
    slow = [m for m in messages if m.startswith(f"worker {hung} has not answered superstep ")]
    assert slow and "waiting up to superstep_timeout = 4 s" in slow[0], messages
    assert any(
        m.startswith(f"worker {hung} has not answered superstep ") and "(superstep_timeout = 4 s); rebuilding" in m
        for m in messages
    ), messages
    assert [b.worker for b in engines[-1].blocks].count(hung) == 0  # its shard went to the other worker
    assert time.monotonic() - start < 60


# ----------------------------------------------------------------------------- no shard outlives its fit
@pytest.mark.timeout(120, method="thread")
def test_the_shards_of_a_failed_start_up_stop_at_once(cluster, monkeypatch):
    cluster.ready()
    connect = _channel.connect
    calls = []

    def fail_second(address, *args, **kwargs):
        calls.append(address)
        if len(calls) == 2:
            raise RuntimeError("a configuration error the pool does not retry")
        return connect(address, *args, **kwargs)

    monkeypatch.setattr(_channel, "connect", fail_second)
    with pytest.raises(RuntimeError, match="a configuration error"):
        _fit(cluster, n_shards=3, worker_timeout=300)
    # Both started shards (the second never got its driver) stop listening and go, long before 300 s.
    deadline = time.monotonic() + 10
    while cluster.shard_threads() or cluster.shard_keys():
        assert time.monotonic() < deadline, f"{cluster.shard_threads()} shard threads still alive"
        time.sleep(0.2)


DRIVER = """
import functools, sys, time
import numpy as np
sys.path[:0] = [{repo!r}, {tests!r}]
from test_operations_cluster import PARAMS, _data, _slow_factory
from mwumkl_dist import MWUMKLClassifier
from mwumkl_dist.engines.mwu_engine import MWUEngine
factory = MWUEngine._factory
slow = {{}}
def patched(self, block):  # the second shard takes 3 s to build: the driver is killed meanwhile
    slow[block] = (3.0, {marker!r}) if len(slow) == 1 else (0.0, None)
    return functools.partial(_slow_factory, factory(self, block), *slow[block])
MWUEngine._factory = patched
X, y = _data()
MWUMKLClassifier(**PARAMS, engine="dask", client={address!r}, n_shards=2, worker_timeout=300).fit(X, y)
"""


@pytest.mark.timeout(120, method="thread")
def test_shards_of_a_driver_killed_during_its_start_up_are_released(cluster, tmp_path):
    cluster.ready()
    marker = tmp_path / "second-shard-built"
    code = DRIVER.format(repo=str(REPO), tests=str(REPO / "tests"), address=cluster.address, marker=str(marker))
    driver = subprocess.Popen([sys.executable, "-c", code], env=_env(), stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not cluster.shard_keys():  # the first shard is up ...
            assert driver.poll() is None, driver.stderr.read().decode()
            assert time.monotonic() < deadline, "the driver never placed its shards"
            time.sleep(0.1)
        time.sleep(1.0)  # ... and connected; the second is being built
    finally:
        driver.kill()
        driver.wait(10)
    # The scheduler drops a departed client's keys; its workers then drop the shards: the second,
    # built after its driver died, stops listening at once (not after worker_timeout = 300 s).
    deadline = time.monotonic() + 30
    while not marker.exists():
        assert time.monotonic() < deadline, "the second shard was never built"
        time.sleep(0.1)
    time.sleep(1.5)  # the server of the built shard starts, then goes (the old code kept it listening)
    assert cluster.shard_threads() == 0
    assert cluster.shard_keys() == []


@pytest.mark.timeout(120, method="thread")
def test_a_fits_shard_actors_are_released_when_it_ends_without_the_garbage_collector(cluster):
    # The cause of test_recovery's "an earlier fit's shard actors were never released": the
    # driver's actor handles lived in reference cycles until a full garbage collection.
    cluster.ready()
    enabled = gc.isenabled()
    gc.disable()
    try:
        clf = _fit(cluster, n_shards=2)
        deadline = time.monotonic() + 5
        while cluster.shard_keys():
            assert time.monotonic() < deadline, f"shard actors still held after the fit: {cluster.shard_keys()}"
            time.sleep(0.1)
    finally:
        if enabled:
            gc.enable()
    _assert_same_model(clf, _reference())


# ----------------------------------------------------------------------------- without a cluster
def _pool_seeing(live: dict, blocks: dict, n_workers: int):
    """A DaskPool whose blocks sit on ``blocks`` ({worker: count}) and whose scheduler lists ``live``."""
    from mwumkl_dist.engines.dask_pool import _Block

    pool = DaskPool.__new__(DaskPool)
    pool.timeout, pool.call_timeout = 30.0, 30.0
    pool._scheduler_address = "tcp://10.0.0.1:8786"
    pool._departed, pool.recoveries, pool._n_workers = set(), 0, n_workers
    pool._live_workers = lambda: dict(live)
    pool.blocks = []
    for worker, count in blocks.items():
        for i in range(count):
            block = _Block(((i, i + 1), (0, 1)))
            block.worker = worker
            pool.blocks.append(block)
    pool._start_somewhere = lambda block, rebuild=False: None  # no cluster: placement is not under test
    pool._restore_state = lambda block: None
    return pool


def test_every_worker_whose_shards_were_lost_counts_as_left(monkeypatch, caplog):
    # Both workers killed; the scheduler still lists the second one: "2 of 2 left", not "1 of 2".
    monkeypatch.setattr(dask_pool, "REPLACEMENT_GRACE", 0.3)
    pool = _pool_seeing({"tcp://b:1": 1}, {"tcp://a:1": 1, "tcp://b:1": 1}, n_workers=2)
    with caplog.at_level(logging.WARNING, logger="mwumkl_dist"):
        pool._departures(list(pool.blocks))  # what a call that lost both shards does first
        for block in pool.blocks:
            pool._recover(block)  # then each one, without another wait or message
    left = [m for m in _messages(caplog) if "Dask workers left" in m]
    assert left == [
        "2 of the fit's 2 Dask workers left (tcp://a:1, tcp://b:1); waiting up to 0.3 s for a replacement before "
        "rebuilding their shards on the workers still there"
    ]
    assert pool.recoveries == 2
    # A hung worker is not waited for (no nanny replaces a stopped process), nor counted as left.
    caplog.clear()
    monkeypatch.setattr(dask_pool, "REPLACEMENT_GRACE", 60.0)  # a wait would take a minute
    pool = _pool_seeing({"tcp://a:1": 1, "tcp://b:1": 1}, {"tcp://a:1": 1, "tcp://b:1": 1}, n_workers=2)
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="mwumkl_dist"):
        pool._departures([pool.blocks[1]], hung={"tcp://b:1"})
        pool._recover(pool.blocks[1])
    assert time.monotonic() - start < 30
    assert not [m for m in _messages(caplog) if "Dask workers left" in m]


def test_superstep_timeout_is_checked():
    X, y = _data(40)
    for bad in (0, -1.0, "10", True):
        with pytest.raises(ValueError, match="superstep_timeout must be None or a positive number of seconds"):
            MWUMKLClassifier(**PARAMS, superstep_timeout=bad).fit(X, y)
    assert MWUMKLClassifier().get_params()["superstep_timeout"] is None


class _Keep(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_dasks_own_lines_about_what_the_pool_reports_are_dropped_while_it_runs():
    dask_logger = logging.getLogger("distributed.client")
    handler = _Keep()
    records = handler.messages
    dask_logger.addHandler(handler)
    try:
        with dask_pool.quiet_dask_recovery():
            dask_logger.error("Failed to reconnect to scheduler after 2.00 seconds, closing client")
            dask_logger.error("something else went wrong")
        dask_logger.error("Failed to reconnect to scheduler after 3.00 seconds, closing client")
    finally:
        dask_logger.removeHandler(handler)
    assert records == [
        "something else went wrong",  # not ours to hide
        "Failed to reconnect to scheduler after 3.00 seconds, closing client",  # no pool running: Dask's to say
    ]


@pytest.mark.timeout(120, method="thread")
def test_a_lost_scheduler_is_said_once_in_our_words():
    # Issue 21 item 9: Dask's "Failed to reconnect to scheduler" line printed beside our error.
    from mwumkl_dist.engines.dask import SchedulerLostError

    X, y = _data(120)
    engines = []
    init = DaskEngine.__init__

    def spy(self, *args, **kwargs):
        engines.append(self)
        init(self, *args, **kwargs)

    local = distributed.LocalCluster(
        n_workers=1, processes=False, protocol="tcp://", host="127.0.0.1", dashboard_address=":0"
    )

    def lose_the_scheduler(info):
        if info.iteration == 20:
            local.close()
            engines[-1].pool._recover(engines[-1].blocks[0])  # a shard rebuild needs the scheduler

    dask_lines = _Keep()
    logging.getLogger("distributed.client").addHandler(dask_lines)
    DaskEngine.__init__ = spy
    try:
        with pytest.raises(SchedulerLostError, match="lost the connection to the Dask scheduler"):
            MWUMKLClassifier(**PARAMS, engine="dask", client=local.scheduler_address, n_shards=1, scheduler_timeout=2.0,
                             callback=lose_the_scheduler, callback_every=10).fit(X, y)  # fmt: skip
    finally:
        DaskEngine.__init__ = init
        logging.getLogger("distributed.client").removeHandler(dask_lines)
        local.close()
    assert not [m for m in dask_lines.messages if "Failed to reconnect to scheduler" in m]
