"""The Dask shard pool: shards live in actors on workers; their calls go over a socket channel of their own.

Dask places the shards (one :class:`ShardServer` actor per shard, pinned to a worker, built there
from its factory: a store shard reads its rows on its worker), keeps them alive and tells us when
a worker is gone.  The calls themselves do not go through Dask's task or actor machinery: each
shard actor listens on its worker's host and the driver connects to it (:mod:`.channel`: TLS
whenever the cluster uses TLS, mutual HMAC authentication with a per-pool secret, framed pickles),
because the MWU superstep only has to wait for the shards' small answers, and a Dask actor round
trip (~3-5 ms) would dwarf that.  A call's message is pickled once per group of equal arguments
and the same bytes go to every shard of the group (:meth:`DaskPool.call`'s ``shared``).

A shard runs with its worker's threads: ``nthreads // (shards on that worker)``, at least 1, so
one worker per machine with one shard uses the whole machine.

A lost shard (its worker died, or it stopped answering within ``timeout``) is rebuilt on the live
worker holding the fewest shards, given the pool's kept calls and its ``restore`` calls (see
:mod:`.pool`), and asked again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
import logging
import queue
import select
import ssl
import threading
import time
import traceback
import weakref

from mwumkl_dist.devices.threads import current_threads, dask_worker, limit_threads, worker_threads
from mwumkl_dist.engines import channel as _channel
from mwumkl_dist.engines.pool import call_args, close_shard, invoke

__all__ = [
    "DaskPool",
    "listen_host",
    "ShardServer",
    "connect_client",
    "ShardLostError",
    "SchedulerLostError",
    "WAIT_FIRST_REPORT",
    "WAIT_REPORT_EVERY",
    "REPLACEMENT_GRACE",
    "HEARTBEAT_EVERY",
]

logger = logging.getLogger("mwumkl_dist")


class ShardLostError(RuntimeError):
    """A shard's worker stopped answering (died, or timed out)."""


class SchedulerLostError(ConnectionError):
    """The driver lost its connection to the Dask scheduler (it died, or the network failed)."""


#: While waiting for Dask workers, the first message is logged after this many seconds ...
WAIT_FIRST_REPORT = 2.0
#: ... and the next ones every this many seconds, until the wait's timeout.
WAIT_REPORT_EVERY = 10.0
#: The driver's connection to a shard's channel failed: first pause before the next attempt (doubling) ...
CONNECT_RETRY_FIRST = 0.05
#: ... up to this many seconds; the attempts go on until ``worker_timeout``.
CONNECT_RETRY_MAX = 1.0
#: The attempt after which the retries are logged (once).
CONNECT_RETRY_REPORT = 5
#: A shard's placement failed on a worker the scheduler still lists: look again after this many seconds
#: before taking the error for the shard's own (a dying worker's errors may come before the scheduler knows).
PLACEMENT_RECHECK = 0.5
#: A shard silent this many seconds on one call (or three times its slowest answer to such a call so
#: far, if longer) is reported, then every WAIT_REPORT_EVERY s, until ``superstep_timeout``.
SLOW_REPORT = 10.0
#: A shard busy with a call says so every this many seconds (a heartbeat frame, with the rows its call has
#: done where the shard counts them, ``rows_done``): a long call (a linear-stage shard's columns of millions of
#: rows, a Newton step's pass over them) is silent no longer than this, so ``superstep_timeout`` only takes a
#: worker that stopped answering for hung, however long its healthy calls take.
HEARTBEAT_EVERY = 2.0
#: A worker left mid-fit: how long its shards' rebuild waits for a replacement worker to join (a
#: nanny restarts a killed worker in a few seconds) before using the workers left.
REPLACEMENT_GRACE = 10.0
#: Workers lost while one shard was placed or rebuilt before the pool gives up (a worker killed over its
#: memory limit comes back, is given the shard, and is killed again: waiting on would loop until worker_timeout).
MAX_PLACEMENT_LOSSES = 5


class _WaitReport:
    """Logs ``waiting for WHAT (N s of T s)`` at WAIT_FIRST_REPORT s, then every WAIT_REPORT_EVERY s."""

    def __init__(self, what: str, timeout: float, note: str = ""):
        self.what, self.timeout, self.note = what, float(timeout), note
        self.start = time.monotonic()
        self.next = self.start + WAIT_FIRST_REPORT

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.start

    @property
    def expired(self) -> bool:
        return self.elapsed > self.timeout

    def tick(self) -> None:
        if time.monotonic() >= self.next:
            logger.warning("waiting for %s (%.0f s of %g s)%s", self.what, self.elapsed, self.timeout, self.note)
            self.next = time.monotonic() + WAIT_REPORT_EVERY


class _DaskNoise(logging.Filter):
    """Drops the lines distributed logs about a failure the pool reports itself, in its own words.

    Only while a pool is open (:func:`quiet_dask_recovery`), and only :attr:`PATTERNS`: a client
    that gives up reconnecting to its scheduler (the pool raises :class:`SchedulerLostError`
    naming the scheduler and the checkpoint to resume from).  Everything else distributed logs
    passes: a killed or hung worker's shards are named by the pool, and the client logs nothing
    of them.
    """

    PATTERNS = ("Failed to reconnect to scheduler after",)

    def filter(self, record: logging.LogRecord) -> bool:
        if _QUIET["depth"] <= 0:
            return True
        message = record.getMessage()
        return not any(p in message for p in self.PATTERNS)


_QUIET = {"depth": 0}
_QUIET_LOCK = threading.Lock()
_NOISE = _DaskNoise()
_NOISY_LOGGERS = ("distributed.client",)


@contextlib.contextmanager
def quiet_dask_recovery():
    """While inside, distributed's own lines about failures the pool reports are dropped (see :class:`_DaskNoise`)."""
    with _QUIET_LOCK:
        if _QUIET["depth"] == 0:
            for name in _NOISY_LOGGERS:
                logging.getLogger(name).addFilter(_NOISE)
        _QUIET["depth"] += 1
    try:
        yield
    finally:
        with _QUIET_LOCK:
            _QUIET["depth"] -= 1
            if _QUIET["depth"] == 0:
                for name in _NOISY_LOGGERS:
                    logging.getLogger(name).removeFilter(_NOISE)


def _is_comm_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a lost connection (Dask's CommClosedError, an OSError, a timeout)."""
    try:
        from distributed.comm.core import CommClosedError
    except ImportError:  # pragma: no cover
        CommClosedError = OSError
    return isinstance(exc, (CommClosedError, OSError, TimeoutError, asyncio.TimeoutError))


def connect_client(client=None, timeout: float = 10.0):
    """A ``distributed.Client``: the given one, one for a scheduler address, or a local threaded one.

    Returns ``(client, owned)``; ``owned`` clients are closed by the engine.
    """
    from distributed import Client

    if client is None:
        return Client(processes=False, n_workers=1, threads_per_worker=2, dashboard_address=":0"), True
    if isinstance(client, Client):
        return client, False
    if isinstance(client, str):
        # Dask's identity call first, under a hard timeout: an address nobody (or no scheduler)
        # answers on fails here, fast, without a Client whose half-started loop outlives the error.
        _probe_scheduler(client, timeout)
        try:
            return Client(client, timeout=f"{timeout}s"), True
        except ValueError as exc:
            raise ValueError(f"bad Dask scheduler address {client!r}: {exc}") from None
        except Exception as exc:  # timeouts, something else answering
            reason = f"{type(exc).__name__}: {exc}"
        # Collect the half-built Client now, outside the except block (its traceback holds the
        # Client): collected later, inside another Client's construction, its loop shutdown can
        # deadlock (distributed's LoopRunner lock).
        gc.collect()
        raise ConnectionError(f"cannot reach the Dask scheduler at {client!r} within {timeout:g} s ({reason})")
    raise TypeError(f"client must be a distributed.Client, a scheduler address or None, got {type(client).__name__}")


def _scheduler_address(client) -> str:
    """The client's scheduler address, for messages."""
    try:
        return str(client.scheduler.address)
    except Exception:  # pragma: no cover - a client without a scheduler rpc
        return "?"


def _probe_scheduler(address: str, timeout: float) -> None:
    """Ask ``address`` who it is, within ``timeout`` seconds, on a private event loop.

    ``Client(address, timeout=...)`` bounds the TCP connect but not the handshake: a peer that
    accepts and stays silent hangs it forever. ``ValueError`` for a malformed address or a
    peer that is not a scheduler, ``ConnectionError`` if nothing answers in time.
    """
    from distributed.comm import connect
    from distributed.comm.addressing import parse_address
    from distributed.security import Security

    try:
        scheme, _ = parse_address(address)
    except ValueError as exc:
        raise ValueError(f"bad Dask scheduler address {address!r}: {exc}") from None
    if scheme == "inproc":
        return  # same process: nothing to wait for

    async def identity():
        comm = await connect(address, timeout=timeout, **Security().get_connection_args("client"))
        try:
            await comm.write({"op": "identity", "reply": True})
            return await comm.read()
        finally:
            await comm.close()

    # A thread of its own, so a caller already inside an event loop (Jupyter) can probe too.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        try:
            reply = pool.submit(asyncio.run, asyncio.wait_for(identity(), timeout)).result()
        except ValueError as exc:
            raise ValueError(f"bad Dask scheduler address {address!r}: {exc}") from None
        except Exception as exc:  # refused, timed out, reset, not Dask's protocol, TLS
            raise ConnectionError(_probe_failure(address, scheme, exc, timeout)) from None
    kind = reply.get("type") if isinstance(reply, dict) else None
    if kind != "Scheduler":
        raise ValueError(f"{address!r} is a Dask {kind or 'peer'} address, not a scheduler's")


def _probe_failure(address: str, scheme: str, exc: BaseException, timeout: float) -> str:
    """The one-line message of a failed :func:`_probe_scheduler`: what went wrong, and for TLS what to check."""
    detail = f"{type(exc).__name__}: {exc}"
    text = str(exc)
    if scheme == "tls" and ("ssl_context" in text or "TLS" in text):
        return (
            f"the Dask scheduler address {address!r} uses TLS, but this client has no TLS certificates configured "
            "(set distributed.comm.tls.ca-file and .client.cert / .client.key, or pass a Client with a Security)"
        )
    if isinstance(exc, ssl.SSLError) or "SSL" in text or "certificate" in text.lower():
        return (
            f"the TLS handshake with the Dask scheduler at {address!r} failed ({detail}): check that this client's "
            "certificate, key and CA are the cluster's (distributed.comm.tls settings, or a Client with a Security)"
        )
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
        return f"cannot reach the Dask scheduler at {address!r}: no answer within {timeout:g} s"
    if isinstance(exc, MemoryError) or "Unable to allocate" in text:  # its bytes read as a Dask frame's length
        return (
            f"{address!r} answered, but not in Dask's protocol: it is no Dask scheduler (an HTTP or other server?); "
            "check the address and port (a scheduler listens on 8786 by default)"
        )
    closed = isinstance(exc, ConnectionResetError) or type(exc).__name__ == "CommClosedError"
    if scheme != "tls" and closed:  # a TLS listener drops a plaintext hello at once
        return (
            f"the Dask scheduler at {address!r} closed the connection ({detail}); if it requires TLS, give its "
            "tls:// address and this client's certificates"
        )
    return f"cannot reach the Dask scheduler at {address!r} within {timeout:g} s ({detail})"


def listen_host(worker_address: str) -> str:
    """The host a shard listens on: the worker's own (advertised) host, IPv4 only."""
    scheme, _, rest = worker_address.partition("://")
    if scheme == "inproc":
        return "127.0.0.1"
    host = rest.rsplit(":", 1)[0]
    if host.startswith("["):
        raise ValueError(f"worker address {worker_address!r} is IPv6; the shard channels need IPv4 worker addresses")
    return host


#: Live shard servers per worker address (this process): a shard's thread share is
#: ``nthreads // len(shards on its worker)``.
_SHARDS_ON_WORKER: dict[str, weakref.WeakSet] = {}
_SHARDS_LOCK = threading.Lock()


class ShardServer:
    """Dask actor holding one shard; answers its pool's calls over a direct socket (:mod:`.channel`).

    It listens on its worker's host, with the worker's TLS server context when the cluster uses
    TLS, and serves the first peer that proves it holds the pool's secret.  A message is
    ``(method, args)``: a shard method (or a function of the shard, see
    :meth:`DaskPool.call`), or one of the server's own: ``"threads"`` (its thread share and the
    threads a call runs with) and ``"close"``.

    Until its driver connects, the server's thread holds it only weakly: a server Dask releases
    (its fit's start-up failed, or its driver's client left the scheduler) is collected at once,
    which frees its shard, and its listener closes within a fraction of a second (the thread looks;
    no finalizer, see :data:`_SERVE_THREADS`); ``accept_timeout`` (the fit's ``worker_timeout``)
    only bounds a wait for a driver that is still there but never connects.
    The driver reads :attr:`endpoint` (an actor attribute: reading it creates no reference cycle
    in the driver, unlike an actor method call, whose handle would keep the actor alive until
    Python's cyclic garbage collector runs).
    """

    #: ``(host, port, tls, worker address)`` of the shard's channel (set on the worker).
    endpoint = None

    def __init__(self, shard_factory, secret: bytes, accept_timeout: float | None = None):
        worker = dask_worker()
        if worker is None:
            raise RuntimeError("a ShardServer is a Dask actor: it runs on a Dask worker")
        # A factory (e.g. a store path and a row range), not a built shard: the shard is built,
        # and its data read, on the worker.
        self.shard = shard_factory()
        self._worker_address = worker.address
        self._nthreads = worker_threads(worker) or 1
        ssl_context = None
        if worker.address.startswith("tls://"):
            ssl_context = worker.security.get_listen_args("worker")["ssl_context"]
            if ssl_context is None:
                raise RuntimeError(f"worker {worker.address} listens on TLS but its Security has no TLS context")
        listener = _channel.Listener(listen_host(worker.address), secret, ssl_context)
        self.endpoint = (*listener.address, listener.tls, worker.address)
        with _SHARDS_LOCK:
            _SHARDS_ON_WORKER.setdefault(self._worker_address, weakref.WeakSet()).add(self)
        _SERVE_THREADS.run(_serve, weakref.ref(self), listener, accept_timeout)

    def address(self):
        """``(host, port, tls)`` of the shard's channel."""
        return self.endpoint[:3]

    def threads(self) -> int:
        """The threads this shard's calls use: its share of its worker's threads (>= 1)."""
        with _SHARDS_LOCK:
            n_shards = len(_SHARDS_ON_WORKER.get(self._worker_address, ())) or 1
        return max(1, self._nthreads // n_shards)

    def _unregister(self):
        with _SHARDS_LOCK:
            _SHARDS_ON_WORKER.get(self._worker_address, weakref.WeakSet()).discard(self)

    def _answer(self, method, args) -> list:
        """The encoded answer to one call: ``("ok", value)`` or ``("error", traceback)``."""
        try:
            with limit_threads(self.threads()):
                if method == "threads":  # inside the limit: the threads a call runs with
                    value = self.threads(), current_threads()
                else:
                    value = invoke(self.shard, method, args)
            return _channel.encode(("ok", value))
        except Exception:  # report to the driver instead of dying silently
            return _channel.encode(("error", traceback.format_exc()))

    def _serve_driver(self, chan) -> None:
        lock = threading.Lock()  # the answer and the heartbeats share the channel
        try:
            with chan:
                while True:
                    method, args = chan.recv()
                    if method == "close":
                        chan.send(("ok", None))
                        return
                    busy = _HEARTBEATS.start(self, chan, lock)
                    try:
                        answer = self._answer(method, args)
                    finally:
                        _HEARTBEATS.stop(busy, lock)
                    with lock:
                        chan.send_frame(answer)
        except (EOFError, OSError):
            return  # the driver closed the channel, or died
        finally:
            self._unregister()
            with contextlib.suppress(Exception):
                close_shard(self.shard)
            self.shard = None  # its data goes now, even while Dask still holds the actor a moment


def _serve(server_ref, listener, accept_timeout) -> None:
    """A shard server's job: wait for the driver holding the server weakly, then serve it."""
    try:  # strangers are closed; waits for the driver, or until the server is collected
        chan = listener.accept(accept_timeout, alive=lambda: server_ref() is not None)
    except (OSError, EOFError, TimeoutError):  # the server was released, or no driver in time
        server = server_ref()
        if server is not None:
            server._unregister()
        return
    server = server_ref()
    if server is None:  # released just as the driver got in
        chan.close()
        return
    server._serve_driver(chan)


class _ServeThreads:
    """Daemon threads running shard servers' jobs, kept for the next job when one ends.

    A worker starts a thread only when it holds more shard servers at once than ever before, never
    per fit: starting a thread takes a CPython runtime lock that, in 3.11, a thread inside
    ``sys._current_frames`` (distributed's worker profiler) can hold while a garbage-collector
    finalizer it runs waits for the GIL, which the starting thread holds: the process hangs.  An
    idle thread is named ``mwumkl-shard-idle``, a busy one ``mwumkl-shard``.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._idle = 0
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()

    def run(self, fn, *args) -> None:
        """``fn(*args)`` on an idle thread, or on a new one when none is idle."""
        with self._lock:
            start = not self._idle
            if not start:
                self._idle -= 1
        self._jobs.put((fn, args))
        if start:
            threading.Thread(target=self._work, name="mwumkl-shard", daemon=True).start()

    def _work(self) -> None:
        me = threading.current_thread()
        while True:
            fn, args = self._jobs.get()
            me.name = "mwumkl-shard"
            try:
                fn(*args)
            except Exception:  # pragma: no cover - a job reports its own failures; the thread must live on
                logger.exception("a shard server's thread failed")
            del fn, args  # the job's references (its listener, its server) go now, not at the next job
            me.name = "mwumkl-shard-idle"
            with self._lock:
                self._idle += 1


#: The serve threads of this process's shard servers.
_SERVE_THREADS = _ServeThreads()


class _Heartbeats:
    """One daemon thread per worker process (started with its first busy shard, never again) that sends each
    shard busy with a call a heartbeat frame, ``("alive", (seconds, rows_done))``, every :data:`HEARTBEAT_EVERY`
    seconds until its answer goes out (the driver waits on; see :meth:`DaskPool._gather`).  It looks every
    :data:`_HEARTBEAT_TICK` seconds."""

    def __init__(self):
        self._lock = threading.Lock()
        self._busy: dict = {}  # token -> [server, channel, channel lock, start, last beat]
        self._started = False
        self._tokens = 0

    def start(self, server, chan, lock) -> int:
        with self._lock:
            self._tokens += 1
            token = self._tokens
            now = time.monotonic()
            self._busy[token] = [server, chan, lock, now, now]
            if not self._started:
                self._started = True
                threading.Thread(target=self._run, name="mwumkl-heartbeat", daemon=True).start()
        return token

    def stop(self, token: int, lock) -> None:
        with lock, self._lock:  # under the channel's lock: no heartbeat after the answer
            self._busy.pop(token, None)

    def _run(self) -> None:
        while True:
            time.sleep(_HEARTBEAT_TICK)
            with self._lock:
                busy = list(self._busy.items())
            for token, entry in busy:
                server, chan, lock, start, last = entry
                now = time.monotonic()
                if now - last < HEARTBEAT_EVERY:
                    continue
                with lock:
                    with self._lock:
                        if token not in self._busy:  # answered meanwhile
                            continue
                        entry[4] = now
                    done = getattr(server.shard, "rows_done", None)
                    with contextlib.suppress(OSError, EOFError, ValueError):
                        chan.send(("alive", (now - start, done)))


#: How often the heartbeat thread looks for busy shards (seconds).
_HEARTBEAT_TICK = 0.1


#: The heartbeats of this process's shard servers.
_HEARTBEATS = _Heartbeats()


#: What :meth:`DaskPool._recv_frame` returns for a heartbeat.
_ALIVE = object()


class _Block:
    """Driver-side handle of one remote shard: its slot, worker, actor and channel (and the rows its current
    call has done, from its last heartbeat)."""

    def __init__(self, slot):
        self.slot = slot
        self.worker = None
        self.actor_future = None
        self.conn = None
        self.rows_done = None


class DaskPool:
    """Shards in actors on Dask workers, called over the socket channel; implements :class:`~.pool.ShardPool`.

    Parameters
    ----------
    slots, factory_for, restore
        See :mod:`mwumkl_dist.engines.pool`.
    client : distributed.Client, scheduler address, or None (a local threaded cluster, closed with the pool)
    timeout : float
        Seconds to wait for Dask workers (at the start, and for a live worker when every
        worker is gone), for a shard's channel to accept the driver (see below), and, unless
        ``call_timeout`` says otherwise, for a shard's answer before declaring it lost; the
        estimator's ``worker_timeout``.  While it waits for workers it logs a warning
        ``waiting for Dask workers (N s of T s)`` after 2 s, then every 10 s.
    call_timeout : float or None
        Seconds a shard may take to answer a superstep (a call made with ``superstep=True``,
        from its second time on) before its worker is declared hung and its shards rebuilt on
        other workers; None: ``timeout``.  The estimator's ``superstep_timeout``.  A shard
        silent on a superstep for :data:`SLOW_REPORT` seconds (or three times its slowest
        answer to it so far, if longer) is reported at once: ``worker W has not answered
        superstep N for 10 s; ...``.  Other calls (loading, replaying) wait up to ``timeout``.

    A shard is placed on the live worker holding the fewest shards; a worker lost while its
    shard is placed (killed, or gone from the scheduler) is named in a warning and the shard
    placed on another one.  The driver's connection to a shard's channel is retried (with
    backoff) until ``timeout``: strangers crowding the shard's port can only delay it.  A lost
    shard is rebuilt the same way; when a worker left, the rebuild first gives a replacement
    (a nanny's restart, an autoscaler's new worker) up to :data:`REPLACEMENT_GRACE` seconds
    to join, so the restarted worker is used.  A lost scheduler raises
    :class:`SchedulerLostError` ("lost the connection to the Dask scheduler at ADDR").
    ``recoveries`` counts the rebuilds.
    """

    rebuilds = True
    remote = True
    #: Workers whose shards were lost because they stopped answering (still listed by the scheduler):
    #: never chosen again, not even when no other worker is left (a placement there would hang).
    _hung: frozenset = frozenset()

    def __init__(self, slots, factory_for, *, client=None, timeout: float = 600.0, call_timeout=None, restore=None):
        self.slots = list(slots)
        self.timeout = float(timeout)
        self.call_timeout = self.timeout if call_timeout is None else float(call_timeout)
        self._factory_for = factory_for
        self._restore = restore
        self._kept: list = []  # (method, args_for) of the calls made with keep=True, in order
        self.blocks = [_Block(slot) for slot in self.slots]
        self.recoveries = 0
        self._calls: dict[str, int] = {}  # calls made so far per method name (messages: "superstep 37")
        self._slowest: dict[str, float] = {}  # the longest answer so far per method name
        self.client = None
        self._owns_client = False
        self.client, self._owns_client = connect_client(client)
        self._secret = _channel.new_secret()  # per pool: authenticates the shard channels
        self._tls_context = None
        self._reader = None  # a thread reading shard endpoints (see _endpoint)
        self._scheduler_address = _scheduler_address(self.client)
        self._departed: set[str] = set()  # workers whose shards were lost: never chosen again
        self._quiet = contextlib.ExitStack()  # distributed's lines about what the pool reports: dropped
        self._quiet.enter_context(quiet_dask_recovery())
        try:
            self._n_workers = len(self._workers())
            for block in self.blocks:
                self._start_somewhere(block)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ placement
    def _scheduler_lost(self, reason: str) -> SchedulerLostError:
        return SchedulerLostError(f"lost the connection to the Dask scheduler at {self._scheduler_address} ({reason})")

    def _live_workers(self) -> dict[str, int]:
        """``{address: threads}`` of the scheduler's workers now (``SchedulerLostError`` when it is gone)."""
        client = self.client
        status = getattr(client, "status", "running")
        report = _WaitReport(f"the Dask scheduler at {self._scheduler_address} to answer again", self.timeout)
        while status == "connecting":  # the client is reconnecting: it ends "running" or "closed"
            if report.expired:
                raise self._scheduler_lost(f"no answer for {self.timeout:g} s")
            report.tick()
            time.sleep(0.1)
            status = client.status
        if status in ("closing", "closed", "failed"):
            raise self._scheduler_lost(f"the Dask client is {status}")
        try:
            # scheduler_info() lists only 5 workers in some releases: nthreads() lists them all.
            return dict(client.nthreads())
        except Exception as exc:
            if _is_comm_failure(exc) or client.status != "running":
                raise self._scheduler_lost(f"{type(exc).__name__}: {exc}") from None
            raise

    def _workers(self) -> list[str]:
        """The live workers (sorted); waits for one up to ``timeout`` seconds, saying so every few seconds."""
        report = _WaitReport(
            "Dask workers",
            self.timeout,
            f": the scheduler at {self._scheduler_address} has none (start some, e.g. 'dask worker "
            f"{self._scheduler_address}'; the wait ends after worker_timeout = {self.timeout:g} s)",
        )
        while True:
            live = self._threads = self._live_workers()
            # Not a worker whose shards were lost (the scheduler may list it a little longer),
            # unless nothing else is left; never one that stopped answering (it would hang the placement).
            workers = sorted(w for w in live if w not in self._departed)
            workers = workers or sorted(w for w in live if w not in self._hung)
            if workers:
                return workers
            hung = sorted(w for w in live if w in self._hung)
            if hung:
                report.note = f": the only workers left do not answer ({', '.join(hung)})"
            if report.expired:
                raise ConnectionError(
                    f"the Dask scheduler at {self._scheduler_address} has had no workers for {self.timeout:g} s "
                    "(worker_timeout)" + (f"; the only ones it lists do not answer ({', '.join(hung)})" if hung else "")
                )
            report.tick()
            time.sleep(0.1)

    def _place(self, block: _Block, avoid=()) -> str:
        """The live worker for ``block``: the one holding the fewest other blocks (then most threads, address).

        A restarted or added worker holds none, so a rebuilt shard goes there rather than onto a
        worker that already holds shards.
        """
        workers = self._workers()
        threads = self._threads
        candidates = [w for w in workers if w not in avoid] or workers
        load = {w: 0 for w in candidates}
        for b in self.blocks:
            w = getattr(b, "worker", None)
            if b is not block and w in load:
                load[w] += 1
        return min(candidates, key=lambda w: (load[w], -threads.get(w, 1), w))

    def _wait_for_replacement(self, gone=(), hung=()) -> None:
        """Workers left: give replacements (nanny restart, autoscaler) REPLACEMENT_GRACE s to join.

        ``gone``: the workers whose shards were just lost (named in the message); ``hung``: those
        of them still there but not answering (no nanny replaces them: nobody is awaited for them).
        """
        live = [w for w in self._live_workers() if w not in self._departed]
        want = self._n_workers - len(set(hung))
        if len(live) >= want:
            self._n_workers = len(live)  # workers added since: the count to keep
            return
        grace = min(REPLACEMENT_GRACE, self.timeout)
        names = sorted(set(gone) - set(hung))
        logger.warning(
            "%d of the fit's %d Dask workers left%s; waiting up to %g s for a replacement before rebuilding "
            "their shards on the workers still there",
            want - len(live),
            self._n_workers,
            f" ({', '.join(names)})" if names else "",
            grace,
        )
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            time.sleep(0.2)
            live = [w for w in self._live_workers() if w not in self._departed]
            if len(live) >= want:
                break
        self._n_workers = len(live)  # wait once per departure, not once per lost shard

    def _start(self, block: _Block, worker: str) -> None:
        """Build ``block``'s shard on ``worker`` and connect to it (a failure is the caller's to judge)."""
        block.worker = worker
        # The shard is built on the worker from a small factory (a store shard reads its rows there).
        [data] = self.client.scatter([self._factory_for(block.slot)], workers=[worker], hash=False)
        block.actor_future = self.client.submit(
            ShardServer,
            data,
            self._secret,
            self.timeout,
            actor=True,
            workers=[worker],
            allow_other_workers=True,
            pure=False,
        )
        del data
        host, port, tls, block.worker = self._endpoint(block.actor_future)
        block.conn = self._connect((host, port, tls), block)

    def _endpoint(self, future) -> tuple:
        """The shard server's ``endpoint``, read as an actor attribute within ``timeout``.

        Not an actor method: distributed's method-call closure refers to itself, so the actor
        handle (and its claim on the actor) would live until the cyclic garbage collector runs,
        keeping the shard alive on its worker long after the pool released it.  Read in a
        helper thread, so that a worker hanging right then delays the pool by ``timeout`` at most.
        """
        actor = future.result(timeout=self.timeout)
        try:
            if self._reader is None:
                self._reader = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="mwumkl-endpoint")
            return tuple(self._reader.submit(getattr, actor, "endpoint").result(timeout=self.timeout))
        except concurrent.futures.TimeoutError:
            self._reader.shutdown(wait=False)  # its thread is stuck on that worker: the next read gets a new one
            self._reader = None
            raise TimeoutError(f"the shard's worker did not say where it listens within {self.timeout:g} s") from None
        finally:
            del actor

    def _start_somewhere(self, block: _Block, rebuild: bool = False) -> None:
        """Place ``block`` on a live worker and start it; when that worker is lost meanwhile, on another.

        Raises what a live worker's failure to build the shard raised (its factory's error: no
        other worker would do better), :class:`SchedulerLostError`, or :class:`ShardLostError`
        when no worker could take the shard within ``timeout``.
        """
        doing = "rebuild" if rebuild else "place"
        report = _WaitReport(f"a Dask worker to {doing} shard {block.slot} on", self.timeout)
        failed: set[str] = set()
        losses = 0
        while True:
            worker = self._place(block, avoid=failed)
            try:
                self._start(block, worker)
                return
            except SchedulerLostError:
                raise
            except Exception as exc:
                reason = f"{type(exc).__name__}: {exc}"
                where = block.worker or worker
                self._discard(block)
                if not self._scheduler_alive():
                    raise self._scheduler_lost(reason) from None
                gone = where not in self._threads
                if not gone:  # a dying worker's errors may come before the scheduler knows it died
                    time.sleep(PLACEMENT_RECHECK)
                    gone = where not in self._live_workers()
                if not (gone or rebuild or _is_worker_failure(exc)):
                    raise  # the shard's own failure (its factory's error): no other worker would do better
                losses += bool(gone)
                if report.expired or losses >= MAX_PLACEMENT_LOSSES:
                    how = (
                        f"{losses} workers died while it was placed on them" if losses >= MAX_PLACEMENT_LOSSES
                        else f"within {self.timeout:g} s (worker_timeout)"
                    )  # fmt: skip
                    note = f"; {self.memory_note()}" if losses else ""
                    raise ShardLostError(
                        f"could not {doing} shard {block.slot} on any Dask worker: {how}; the last try, on {where}, "
                        f"failed: {reason}{note}"
                    ) from exc
                if gone:
                    self._departed.add(where)
                    logger.warning(
                        "worker %s left while shard %s was placed on it (%s); placing the shard on another worker",
                        where,
                        block.slot,
                        reason,
                    )
                else:
                    failed.add(where)
                    logger.warning(
                        "could not %s shard %s on worker %s (%s); trying another worker",
                        doing,
                        block.slot,
                        where,
                        reason,
                    )
                time.sleep(0.1)

    def _discard(self, block: _Block) -> None:
        """Forget ``block``'s shard: close its channel and release its actor (its server then stops)."""
        conn, future = block.conn, block.actor_future
        block.conn = block.actor_future = None
        if conn is not None:
            conn.close()
        if future is not None:
            with contextlib.suppress(Exception):
                future.release()

    def _connect(self, address, block: _Block) -> _channel.Channel:
        """The channel to a shard: TLS with the client's context when the shard's worker uses TLS.

        A failed attempt (a reset, the shard closed the connection, no answer within the
        handshake timeout: what a crowd of strangers at the shard's port, or a flaky network,
        causes) is retried with backoff until ``timeout`` seconds have passed, as long as the
        worker is still there; ``ShardLostError`` when the shard no longer listens, its worker
        is gone, or the time is up.
        """
        host, port, tls = address
        worker = block.worker
        security = getattr(self.client, "security", None)
        ssl_context = None
        if tls:
            if self._tls_context is None and security is not None:
                self._tls_context = security.get_connection_args("client")["ssl_context"]
            ssl_context = self._tls_context
            if ssl_context is None:
                raise RuntimeError(
                    f"the shard on worker {worker} uses TLS, but the client's Security has no TLS context"
                )
        elif getattr(security, "require_encryption", False) and not worker.startswith("inproc://"):
            raise RuntimeError(f"the cluster requires encryption, but the shard on worker {worker} offers plaintext")
        start = time.monotonic()
        deadline = start + self.timeout
        delay, attempts, checked = CONNECT_RETRY_FIRST, 0, start
        while True:
            attempts += 1
            left = deadline - time.monotonic()
            try:
                return _channel.connect(
                    (host, port),
                    self._secret,
                    ssl_context,
                    timeout=self.timeout,
                    handshake_timeout=max(0.1, min(_channel.HANDSHAKE_TIMEOUT, left)),
                )
            except ssl.SSLCertVerificationError:
                raise  # a configuration error (another CA), not a crowd: retrying would not help
            except ConnectionRefusedError:
                raise ShardLostError(
                    f"shard {block.slot} on worker {worker} no longer listens at {host}:{port} (connection refused)"
                ) from None
            except (OSError, EOFError) as exc:  # PermissionError and ConnectionError are OSErrors
                reason = f"{type(exc).__name__}: {exc}"
            now = time.monotonic()
            if now >= deadline:
                raise ShardLostError(
                    f"could not connect to shard {block.slot} on worker {worker} at {host}:{port} within "
                    f"{self.timeout:g} s (worker_timeout; {attempts} attempts, the last: {reason})"
                )
            if now - checked >= 1.0:  # now and then: is the worker still there?
                checked = now
                if worker not in self._live_workers():
                    raise ShardLostError(
                        f"worker {worker} left while the driver connected to shard {block.slot} ({reason})"
                    )
            if attempts == CONNECT_RETRY_REPORT:
                logger.warning(
                    "connecting to shard %s on worker %s at %s:%s failed %d times (%s); retrying until "
                    "worker_timeout = %g s (a crowd of other connections at that port delays it; see deploy/README.md)",
                    block.slot,
                    worker,
                    host,
                    port,
                    attempts,
                    reason,
                    self.timeout,
                )
            time.sleep(min(delay, max(0.0, deadline - now)))
            delay = min(2 * delay, CONNECT_RETRY_MAX)

    def _departures(self, blocks, hung=()) -> None:
        """Shards of one call were lost: note their workers gone (``hung``: still there, not answering), once.

        The workers of every lost shard count as left in the one message that names them, and a
        replacement is waited for once (none for a hung worker: no nanny restarts it).
        """
        gone = {b.worker for b in blocks if b.worker is not None}
        self._departed |= gone
        self._hung = self._hung | set(hung)
        for block in blocks:
            self._discard(block)
        self._wait_for_replacement(gone, hung)

    def _recover(self, block: _Block) -> None:
        """Rebuild a lost shard on a live worker (the least loaded) and bring it back to the pool's state."""
        self.recoveries += 1
        logger.warning("shard %s lost; rebuilding it (recovery %d)", block.slot, self.recoveries)
        if block.worker is not None and (block.worker not in self._departed or block.conn is not None):
            self._departures([block])  # a shard lost on its own (not through call)
        self._start_somewhere(block, rebuild=True)
        self._restore_state(block)

    def _restore_state(self, block: _Block) -> None:
        """A rebuilt shard's kept calls, in order, then the ``restore`` calls of its slot."""
        calls = [(method, () if args_for is None else tuple(args_for(block.slot))) for method, args_for in self._kept]
        if self._restore is not None:
            calls += [(method, tuple(args)) for method, args in self._restore(block.slot)]
        try:
            for method, args in calls:
                self._call(block, method, args)
        except (OSError, EOFError, ShardLostError) as exc:
            raise ShardLostError(
                f"shard {block.slot} was lost again while it was rebuilt on {block.worker} "
                f"({type(exc).__name__}: {exc}); {self.memory_note()}"
            ) from exc

    def memory_note(self) -> str:
        """What to do when workers keep dying: most often their memory limit (the nanny restarts them)."""
        limits = set()
        with contextlib.suppress(Exception):  # the scheduler may be gone too: then the note says less
            limits = {w.get("memory_limit") for w in self.client.scheduler_info()["workers"].values()}
        limits.discard(None)
        limits.discard(0)
        limit = ""
        if limits:
            shown = ", ".join(f"{v / 2**20:.0f} MiB" for v in sorted(limits))
            limit = f" (the workers' memory limit: {shown})"
        return (
            "workers that die while they hold a shard most often ran out of memory: a Dask nanny kills and restarts "
            f"a worker over its memory limit{limit}, and the workers' logs then say 'exceeded 95% memory budget'; "
            "give each worker more memory (dask worker --memory-limit), cut the data into more, smaller shards "
            "(--shards / n_shards), or fit from a data store (fit --store)"
        )

    def _scheduler_alive(self) -> bool:
        try:
            self._live_workers()
        except SchedulerLostError:
            return False
        return True

    # ------------------------------------------------------------------ messaging
    def _recv(self, block: _Block):
        """The shard's answer (heartbeats skipped)."""
        while True:
            value = self._recv_frame(block)
            if value is not _ALIVE:
                return value

    def _recv_frame(self, block: _Block):
        """The shard's next frame: its answer, or :data:`_ALIVE` for a heartbeat (its rows done noted)."""
        try:
            status, value = block.conn.recv()
        except TimeoutError:
            raise ShardLostError(f"shard {block.slot} did not answer within {self.timeout:g} s") from None
        if status == "error":
            raise RuntimeError(f"shard {block.slot} failed:\n{value}")
        if status == "alive":
            block.rows_done = value[1]
            return _ALIVE
        return value

    def _call(self, block: _Block, method, args: tuple):
        block.conn.send_frame(_channel.encode((method, args)))
        return self._recv(block)

    def _gather(self, blocks, name: str, number: int, superstep: bool, progress=None) -> tuple[dict, list, set]:
        """The answers of ``blocks`` (sent a call), as they come; a shard silent too long is lost.

        Silent means no frame at all: a busy shard sends a heartbeat every :data:`HEARTBEAT_EVERY` s
        (:class:`_Heartbeats`), so a long call on a healthy worker is never silent long.  A superstep's
        shard silent for :data:`SLOW_REPORT` s (or three times the slowest answer to that call so far) is
        reported, then every ``WAIT_REPORT_EVERY`` s; silent for ``call_timeout`` s, its worker is taken for
        hung (from a call's second time on: the first may compile and load caches on a fresh worker).  Other
        calls wait up to ``timeout`` of silence.  ``progress(rows)``: called with the rows the shards' calls
        have done so far (their heartbeats' counts) as they come.  Returns ``(results by id(block), lost
        blocks, hung workers)``.
        """
        results: dict = {}
        lost: list = []
        waiting = {b.conn.sock.fileno(): b for b in blocks}
        poller = select.poll()
        for fd, b in waiting.items():
            poller.register(fd, select.POLLIN | select.POLLPRI)
            b.rows_done = None
        start = time.monotonic()
        heard = dict.fromkeys(waiting, start)
        timed = superstep and name in self._slowest
        limit = self.call_timeout if timed else self.timeout
        report_after = max(SLOW_REPORT, 3.0 * self._slowest.get(name, 0.0)) if superstep else float("inf")
        report_at = start + report_after
        hung: set = set()

        def done(fd):
            waiting.pop(fd)
            poller.unregister(fd)

        while waiting:
            ready = [fd for fd, b in waiting.items() if b.conn.buffered]
            if not ready:
                deadline = min(min(heard[fd] for fd in waiting) + limit, report_at)
                ready = [fd for fd, _ in poller.poll(int(max(0.0, deadline - time.monotonic()) * 1000) + 1)]
            for fd in ready:
                b = waiting[fd]
                try:
                    value = self._recv_frame(b)
                except (OSError, EOFError, ShardLostError):
                    done(fd)
                    lost.append(b)
                    continue
                heard[fd] = time.monotonic()
                if value is _ALIVE:
                    if progress is not None:
                        progress(sum(int(x.rows_done or 0) for x in blocks))
                    continue
                done(fd)
                results[id(b)] = value
            now = time.monotonic()
            for fd in [fd for fd in waiting if now - heard[fd] >= limit]:
                b = waiting[fd]
                done(fd)
                hung.add(b.worker)
                lost.append(b)
                which = "superstep_timeout" if timed else "worker_timeout"
                logger.warning("worker %s has not answered %s %d for %.0f s (%s = %g s); rebuilding its shards on "
                               "other workers", b.worker, name, number, now - heard[fd], which, limit)  # fmt: skip
            if waiting and now >= report_at:
                silent = [b for fd, b in waiting.items() if now - heard[fd] >= report_after]
                if silent:
                    self._report_slow(silent, name, number, now - min(heard[fd] for fd in waiting), limit)
                report_at = now + WAIT_REPORT_EVERY
        took = time.monotonic() - start
        if not lost and took > self._slowest.get(name, 0.0):
            self._slowest[name] = took
        return results, lost, hung

    def _report_slow(self, blocks, name: str, number: int, waited: float, limit: float) -> None:
        by_worker: dict = {}
        for b in blocks:
            by_worker.setdefault(b.worker, []).append(str(b.slot))
        which = "superstep_timeout" if limit == self.call_timeout and name in self._slowest else "worker_timeout"
        for worker, slots in sorted(by_worker.items()):
            logger.warning(
                "worker %s has not answered %s %d for %.0f s (shard%s %s); waiting up to %s = %g s before "
                "rebuilding its shards elsewhere",
                worker,
                name,
                number,
                waited,
                "s" if len(slots) > 1 else "",
                "; ".join(slots),
                which,
                limit,
            )

    def call(self, method, args_for=None, *, shared=False, shards=None, keep=False, superstep=False,
             progress=None) -> list:  # fmt: skip
        """See :meth:`~.pool.ShardPool.call`: sent to every shard first, then gathered (the shards work in parallel).

        Each group of equal arguments is pickled once and the same bytes go to each of its shards.
        A shard whose worker is gone, or silent too long (``superstep``: ``call_timeout`` s, see
        :meth:`_gather`; other calls: ``timeout`` s), is rebuilt (see :meth:`_recover`) and asked again.
        """
        if keep:  # this call's state replaces the one an earlier call of the method kept
            self._kept = [k for k in self._kept if k[0] != method]
        name = method if isinstance(method, str) else getattr(method, "__name__", "call")
        number = self._calls[name] = self._calls.get(name, 0) + 1
        targets = range(len(self.blocks)) if shards is None else shards
        blocks = [self.blocks[i] for i in targets]
        args = call_args(self.slots, targets, args_for, shared)
        frames: dict = {}
        lost, sent = [], []
        for b, (group, a) in zip(blocks, args):
            if group not in frames:
                frames[group] = _channel.encode((method, a))
            try:
                b.conn.send_frame(frames[group])
                sent.append(b)
            except (OSError, EOFError, ValueError):
                lost.append(b)
        results, silent, hung = self._gather(sent, name, number, superstep, progress)
        lost += silent
        if lost:
            self._departures(lost, hung)
            for b in blocks:
                if b in lost:
                    self._recover(b)
            for b, (_, a) in zip(blocks, args):
                if b in lost:
                    results[id(b)] = self._call(b, method, a)
        if keep:
            self._kept.append((method, args_for))
        return [results[id(b)] for b in blocks]

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        for b in self.blocks:
            try:
                if b.conn is not None:
                    b.conn.send(("close", ()))
                    b.conn.close()
            except (OSError, EOFError):
                pass
            self._discard(b)
        if self._owns_client and self.client is not None:
            self.client.close()
            self.client = None
        if getattr(self, "_reader", None) is not None:
            self._reader.shutdown(wait=False)  # a read stuck on a hung worker ends with its connection
            self._reader = None
        quiet = getattr(self, "_quiet", None)
        if quiet is not None:
            quiet.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _is_worker_failure(exc: BaseException) -> bool:
    """Whether ``exc``, raised while a shard was placed, says its worker failed (not the shard's own code).

    A lost connection, a timeout, a shard that stopped listening, a task Dask cancelled or gave
    up on because its worker died; not a factory's error (a missing store file is an OSError,
    but no connection error).
    """
    if isinstance(exc, (ShardLostError, ConnectionError, TimeoutError, asyncio.TimeoutError, EOFError)):
        return True
    try:
        from distributed.client import FutureCancelledError
        from distributed.comm.core import CommClosedError
        from distributed.scheduler import KilledWorker
    except ImportError:  # pragma: no cover
        return False
    if isinstance(exc, (CommClosedError, FutureCancelledError, KilledWorker, concurrent.futures.CancelledError)):
        return True
    return isinstance(exc, RuntimeError) and "Worker holding Actor was lost" in str(exc)
