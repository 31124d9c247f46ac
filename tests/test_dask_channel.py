"""The Dask engine's superstep channel: TLS on TLS clusters, authentication, strangers can't hang or break a fit."""

from __future__ import annotations

import os
import socket
import ssl
import threading
import time

import numpy as np
import pytest
from conftest import literal

distributed = pytest.importorskip("distributed")

from mwumkl_dist import MWUMKLClassifier  # noqa: E402
from mwumkl_dist.data.problems import FeatureProblem  # noqa: E402
from mwumkl_dist.engines import channel as _channel  # noqa: E402
from mwumkl_dist.engines.dask import DaskEngine  # noqa: E402
from mwumkl_dist.engines.dask_pool import DaskPool  # noqa: E402
from mwumkl_dist.kernels import KernelSet  # noqa: E402

# A hang (a deadlock in C, where no signal handler runs) fails with every thread's stack, not a stalled run.
pytestmark = pytest.mark.timeout(300, method="thread")


def _data(n=120, d=4, seed=3):
    rng = np.random.default_rng(seed)
    X = rng.random((n, d))
    y = np.where(X[:, 0] + X[:, 1] + 0.3 * rng.standard_normal(n) > 1.0, 1.0, -1.0)
    return X, y


@pytest.fixture(scope="module")
def security():
    pytest.importorskip("cryptography")
    return distributed.security.Security.temporary()  # self-signed CA + cert, require_encryption=True


def _accept_in_thread(listener, timeout=20.0, alive=None):
    box = {}

    def run():
        try:
            box["chan"] = listener.accept(timeout, alive)
        except Exception as exc:  # noqa: BLE001 - reported by the test
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


def _silent(address):
    return socket.create_connection(address, timeout=5)


def _garbage(address):
    sock = socket.create_connection(address, timeout=5)
    sock.sendall(os.urandom(4096))
    return sock


def _closed_after_challenge(sock) -> bool:
    """The shard sent its challenge, then closed the connection (EOF, or a reset: unread garbage)."""
    sock.settimeout(5)
    try:
        assert sock.recv(100).startswith(b"MWUMKL")
        return sock.recv(100) == b""
    except ConnectionResetError:
        return True


# ---------------------------------------------------------------------- the channel alone
@pytest.mark.timeout(30, method="thread")
def test_round_trip_of_arrays_and_objects():
    secret = _channel.new_secret()
    listener = _channel.Listener("127.0.0.1", secret)
    thread, box = _accept_in_thread(listener)
    with _channel.connect(listener.address, secret, timeout=10) as driver:
        thread.join(10)
        shard = box["chan"]
        big = np.arange(300_000, dtype=np.float64).reshape(1000, 300)
        message = ("step", (3, 7, big, np.float32(2.5), {"k": [1, 2]}, big[:, ::2]))
        frame = _channel.encode(message)
        for _ in range(2):  # the same bytes, sent twice
            driver.send_frame(frame)
            method, (i, j, a, f, d, strided) = shard.recv()
            assert (method, i, j, f, d) == ("step", 3, 7, np.float32(2.5), {"k": [1, 2]})
            np.testing.assert_array_equal(a, big)
            np.testing.assert_array_equal(strided, big[:, ::2])
            assert a.flags.writeable
        shard.send(("ok", np.zeros(5)))
        assert driver.recv()[0] == "ok"
        shard.close()
        with pytest.raises(EOFError):
            driver.recv()
    assert not driver.tls


@pytest.mark.timeout(30, method="thread")
def test_wrong_secret_silent_and_garbage_peers_are_closed_and_the_driver_still_gets_in():
    secret = _channel.new_secret()
    listener = _channel.Listener("127.0.0.1", secret, handshake_timeout=1.0)
    thread, box = _accept_in_thread(listener)
    silent = _silent(listener.address)  # stays silent all along
    garbage = _garbage(listener.address)
    with pytest.raises((PermissionError, EOFError, OSError)):
        _channel.connect(listener.address, b"x" * 32, handshake_timeout=5)
    start = time.monotonic()
    with _channel.connect(listener.address, secret, timeout=10) as driver:
        thread.join(10)
        assert "chan" in box, box
        assert time.monotonic() - start < 3  # the silent stranger delayed nobody
        box["chan"].send("hello")
        assert driver.recv() == "hello"
    # Strangers are closed: the garbage one at once, the silent one after the handshake timeout.
    assert _closed_after_challenge(silent)
    assert _closed_after_challenge(garbage)
    assert listener.rejected >= 3
    # Once the driver is in, the shard no longer listens.
    with pytest.raises(OSError):
        socket.create_connection(listener.address, timeout=2).recv(1)
    silent.close()
    garbage.close()


@pytest.mark.timeout(30, method="thread")
def test_tls_channel_rejects_plaintext_and_foreign_certificates(security):
    secret = _channel.new_secret()
    server_ctx = security.get_listen_args("worker")["ssl_context"]
    client_ctx = security.get_connection_args("client")["ssl_context"]
    listener = _channel.Listener("127.0.0.1", secret, server_ctx, handshake_timeout=1.0)
    assert listener.tls
    thread, box = _accept_in_thread(listener)
    # Plaintext, even with the right secret, gets no channel.
    with pytest.raises((OSError, EOFError, ConnectionError)):
        _channel.connect(listener.address, secret, handshake_timeout=5)
    # A TLS client of another CA is refused by certificate.
    other = distributed.security.Security.temporary().get_connection_args("client")["ssl_context"]
    with pytest.raises(ssl.SSLError):
        _channel.connect(listener.address, secret, other, handshake_timeout=5)
    with _channel.connect(listener.address, secret, client_ctx, timeout=10) as driver:
        thread.join(10)
        assert driver.tls and isinstance(driver.sock, ssl.SSLSocket)
        assert box["chan"].tls
        driver.send(np.arange(10.0))
        np.testing.assert_array_equal(box["chan"].recv(), np.arange(10.0))


def _crowd(address, n, garbage_bytes=512) -> list:
    """``n`` silent connections and ``n`` that send garbage, to ``address``."""
    socks = []
    for _ in range(n):
        socks.append(socket.create_connection(address, timeout=5))
        g = socket.create_connection(address, timeout=5)
        g.sendall(os.urandom(garbage_bytes))
        socks.append(g)
    return socks


@pytest.mark.timeout(60, method="thread")
@pytest.mark.parametrize("tls", [False, True])
def test_a_crowd_of_strangers_never_keeps_the_driver_out(tls, request):
    # Issue 21: the listener closed every connection beyond 64 handshakes in flight, the driver's too.
    secret = _channel.new_secret()
    server_ctx = client_ctx = None
    if tls:
        security = request.getfixturevalue("security")
        server_ctx = security.get_listen_args("worker")["ssl_context"]
        client_ctx = security.get_connection_args("client")["ssl_context"]
    listener = _channel.Listener("127.0.0.1", secret, server_ctx)
    thread, box = _accept_in_thread(listener)
    strangers = _crowd(listener.address, 300)
    try:
        # Kept out, the driver's connect would fail at its timeout: getting in at all is the check.
        with _channel.connect(listener.address, secret, client_ctx, timeout=30) as driver:
            thread.join(10)
            box["chan"].send("in")
            assert driver.recv() == "in"
    finally:
        for s in strangers:
            s.close()
    assert listener.rejected >= 300  # the garbage ones at once, the silent ones when the driver got in


@pytest.mark.timeout(60, method="thread")
def test_the_oldest_waiting_stranger_makes_room_for_a_newcomer():
    secret = _channel.new_secret()
    listener = _channel.Listener("127.0.0.1", secret, max_pending=8)
    thread, box = _accept_in_thread(listener)
    silent = [_silent(listener.address) for _ in range(50)]
    try:
        with _channel.connect(listener.address, secret, timeout=10):
            thread.join(10)
            assert "chan" in box, box
        assert listener.evicted >= 42
        assert _closed_after_challenge(silent[0])  # the oldest went first
    finally:
        for s in silent:
            s.close()


@pytest.mark.timeout(30, method="thread")
def test_a_trickling_stranger_gets_the_handshake_timeout_from_its_arrival():
    # One byte every 0.2 s: each read succeeds, but the deadline counts from the arrival.
    secret = _channel.new_secret()
    listener = _channel.Listener("127.0.0.1", secret, handshake_timeout=1.0)
    _accept_in_thread(listener)
    slow = _silent(listener.address)
    assert slow.recv(100).startswith(b"MWUMKL")
    start = time.monotonic()
    closed = False
    try:
        for _ in range(40):
            slow.sendall(b"x")
            time.sleep(0.2)
    except OSError:  # reset: the shard closed it
        closed = True
    if not closed:
        slow.settimeout(2)
        closed = slow.recv(100) == b""
    assert closed and time.monotonic() - start < 3
    listener.close()
    slow.close()


@pytest.mark.timeout(30, method="thread")
def test_a_listener_runs_in_its_accepting_thread_and_stops_once_its_owner_is_gone():
    # No thread of its own (a shard server starts none); ``alive`` false ends the wait, no finalizer needed.
    before = threading.active_count()
    listener = _channel.Listener("127.0.0.1", _channel.new_secret())
    assert threading.active_count() == before
    owner = {"alive": True}
    thread, box = _accept_in_thread(listener, alive=lambda: owner["alive"])
    stranger = _silent(listener.address)
    assert stranger.recv(100).startswith(b"MWUMKL")  # the accepting thread runs the handshakes
    owner["alive"] = False
    start = time.monotonic()
    thread.join(5)
    assert not thread.is_alive() and time.monotonic() - start < 2
    assert isinstance(box.get("error"), EOFError) and listener.closed
    stranger.settimeout(5)
    assert stranger.recv(100) == b""  # the waiting peer is closed with it ...
    with pytest.raises(OSError):  # ... and nobody listens there any more
        socket.create_connection(listener.address, timeout=2).recv(1)
    with pytest.raises(EOFError):
        listener.accept(1)
    stranger.close()


#: 600 strangers at a shard in a process allowed 128 descriptors (a worker under ``ulimit -n``).
FD_LIMIT_SCRIPT = r"""
import importlib.util, resource, subprocess, sys, threading

spec = importlib.util.spec_from_file_location("channel", sys.argv[1])  # stdlib only: no package import
channel = importlib.util.module_from_spec(spec)
spec.loader.exec_module(channel)
resource.setrlimit(resource.RLIMIT_NOFILE, (128, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
assert channel.max_pending_for_fd_limit() == 32
secret = channel.new_secret()
listener = channel.Listener("127.0.0.1", secret)
threading.Thread(target=listener.accept, args=(30,), daemon=True).start()
crowd = subprocess.Popen([sys.executable, "-c", (
    "import resource, socket, time\n"
    "resource.setrlimit(resource.RLIMIT_NOFILE, (4096, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))\n"
    "socks = [socket.create_connection(('127.0.0.1', PORT)) for _ in range(600)]\n"
    "print('in', flush=True)\n"
    "time.sleep(30)\n").replace("PORT", str(listener.address[1]))], stdout=subprocess.PIPE, text=True)
assert crowd.stdout.readline().strip() == "in"
files = [open("/dev/null") for _ in range(60)]  # the rest of a worker's descriptors
with channel.connect(listener.address, secret, timeout=10):
    pass
crowd.kill()
print("evicted", listener.evicted)
"""


@pytest.mark.timeout(60, method="thread")
@pytest.mark.skipif(os.name != "posix", reason="RLIMIT_NOFILE")
def test_600_strangers_at_a_shard_allowed_128_descriptors():
    import resource
    import subprocess
    import sys

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 4096:
        pytest.skip("the crowd needs 4096 descriptors")
    script = [sys.executable, "-c", FD_LIMIT_SCRIPT, _channel.__file__]
    out = subprocess.run(script, capture_output=True, text=True, timeout=50)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.split()[-1]) >= 500  # the oldest made room: the listener never ran out


# ---------------------------------------------------------------------- on a Dask cluster
@pytest.mark.timeout(120, method="thread")
def test_tls_cluster_fit_is_tls_and_bit_identical(security):
    X, y = _data()
    params = dict(kernels="paper", **literal(epsilon=0.3))
    ref = MWUMKLClassifier(**params).fit(X, y)
    with (
        distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=False,
            protocol="tls://",
            security=security,
            dashboard_address=":0",
        ) as cluster,
        distributed.Client(cluster, security=security) as client,
    ):
        assert all(w.startswith("tls://") for w in client.nthreads())
        problem = FeatureProblem(X, y, KernelSet("paper", X.shape[1]))
        with DaskEngine(problem, client, n_shards=2, n_kernel_shards=2) as engine:
            assert all(b.conn.tls and isinstance(b.conn.sock, ssl.SSLSocket) for b in engine.blocks)
        clf = MWUMKLClassifier(**params, engine="dask", client=client, n_shards=3).fit(X, y)
    np.testing.assert_array_equal(clf.dual_coef_, ref.dual_coef_)
    np.testing.assert_array_equal(clf.support_, ref.support_)
    np.testing.assert_array_equal(clf.kernel_weights_, ref.kernel_weights_)
    np.testing.assert_array_equal(clf.intercept_, ref.intercept_)


@pytest.fixture(scope="module")
def threaded_client():
    with distributed.Client(processes=False, n_workers=2, threads_per_worker=1, dashboard_address=":0") as client:
        yield client


@pytest.mark.timeout(60, method="thread")
@pytest.mark.parametrize("intruder", [_silent, _garbage])
def test_intruder_during_setup_neither_hangs_nor_breaks_the_fit(threaded_client, monkeypatch, intruder):
    X, y = _data()
    params = dict(kernels="paper", **literal(epsilon=0.3))
    ref = MWUMKLClassifier(**params).fit(X, y)
    strangers = []
    connect = DaskPool._connect

    def first_a_stranger(self, address, worker):
        strangers.append(intruder(address[:2]))  # gets there before the driver
        return connect(self, address, worker)

    monkeypatch.setattr(DaskPool, "_connect", first_a_stranger)
    start = time.monotonic()
    clf = MWUMKLClassifier(**params, engine="dask", client=threaded_client, n_shards=2).fit(X, y)
    assert time.monotonic() - start < 30
    assert len(strangers) == 2
    np.testing.assert_array_equal(clf.dual_coef_, ref.dual_coef_)
    np.testing.assert_array_equal(clf.intercept_, ref.intercept_)
    for s in strangers:
        s.close()


@pytest.mark.timeout(120, method="thread")
def test_tls_cluster_fit_with_a_crowd_at_every_shard_port(security, monkeypatch):
    # Issue 21: 100 strangers at each new port ended a TLS fit with "[Errno 104] Connection reset by peer".
    X, y = _data()
    params = dict(kernels="paper", **literal(epsilon=0.3))
    ref = MWUMKLClassifier(**params).fit(X, y)
    strangers = []
    connect = _channel.connect

    def crowd_first(address, *args, **kwargs):
        strangers.extend(_crowd(tuple(address), 100))
        return connect(address, *args, **kwargs)

    monkeypatch.setattr(_channel, "connect", crowd_first)
    try:
        with (
            distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, protocol="tls://",
                                     security=security, dashboard_address=":0") as cluster,
            distributed.Client(cluster, security=security) as client,
        ):  # fmt: skip
            clf = MWUMKLClassifier(**params, engine="dask", client=client, n_shards=2).fit(X, y)
    finally:
        for s in strangers:
            s.close()
    assert len(strangers) == 400
    np.testing.assert_array_equal(clf.dual_coef_, ref.dual_coef_)
    np.testing.assert_array_equal(clf.kernel_weights_, ref.kernel_weights_)


def _nap(shard, seconds):  # a shard call that takes a while
    time.sleep(seconds)
    return seconds


@pytest.mark.timeout(60, method="thread")
def test_a_slow_shard_is_reported_after_a_few_seconds(threaded_client, monkeypatch, caplog):
    import logging

    import mwumkl_dist.engines.dask_pool as dask_pool

    monkeypatch.setattr(dask_pool, "SLOW_REPORT", 0.5)
    monkeypatch.setattr(dask_pool, "WAIT_REPORT_EVERY", 0.5)
    X, y = _data()
    problem = FeatureProblem(X, y, KernelSet("paper", X.shape[1]))
    with DaskEngine(problem, threaded_client, n_shards=2, timeout=30) as engine:
        with caplog.at_level(logging.WARNING, logger="mwumkl_dist"):
            assert engine.pool.call(_nap, lambda b: (1.3 if b.rows[0] == 0 else 0.0,), superstep=True) == [1.3, 0.0]
            # Quiet until three times the slowest answer so far (3.9 s): a shard that is always slow is not news.
            engine.pool.call(_nap, lambda b: (1.0 if b.rows[0] == 0 else 0.0,), superstep=True)
            # Only supersteps are watched: loading a shard may take long.
            engine.pool.call(_nap, lambda b: (0.8 if b.rows[0] == 0 else 0.0,))
        worker = engine.blocks[0].worker
        assert engine.recoveries == 0
    slow = [r.getMessage() for r in caplog.records if "has not answered" in r.getMessage()]
    assert slow and all(m.startswith(f"worker {worker} has not answered _nap 1 for ") for m in slow), slow
    assert len(slow) == 2  # at 0.5 s and 1.0 s of the first call
    assert "(shard rows (0, 60) kernels (0, 12)); waiting up to worker_timeout = 30 s before rebuilding" in slow[0]


# ---------------------------------------------------------------------- hybrid layouts
@pytest.mark.timeout(60, method="thread")
@pytest.mark.parametrize("n_shards, expected", [(1, 2), (2, 1), (3, 1)])
def test_a_shard_runs_with_its_share_of_its_workers_threads(n_shards, expected):
    X, y = _data()
    problem = FeatureProblem(X, y, KernelSet("paper", X.shape[1]))
    with (
        distributed.Client(processes=False, n_workers=1, threads_per_worker=2, dashboard_address=":0") as client,
        DaskEngine(problem, client, n_shards=n_shards) as engine,
    ):
        answers = engine.pool.call("threads")
    assert [share for share, _ in answers] == [expected] * n_shards
    from mwumkl_dist.devices import cpu as _columns

    if hasattr(_columns, "thread_limit"):  # the share is the shard's cap (numba's pool permitting)
        import numba

        assert all(used == min(expected, numba.config.NUMBA_NUM_THREADS) for _, used in answers)
