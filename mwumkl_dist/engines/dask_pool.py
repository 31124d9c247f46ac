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
#: A worker left mid-fit: how long its shards' rebuild waits for a replacement worker to join (a
#: nanny restarts a killed worker in a few seconds) before using the workers left.
REPLACEMENT_GRACE = 10.0


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
        except Exception as exc:  # refused, timed out, reset, not Dask's protocol
            kind = "no answer" if isinstance(exc, TimeoutError) else f"{type(exc).__name__}: {exc}"
            raise ConnectionError(
                f"cannot reach the Dask scheduler at {address!r} within {timeout:g} s ({kind})"
            ) from None
    kind = reply.get("type") if isinstance(reply, dict) else None
    if kind != "Scheduler":
        raise ValueError(f"{address!r} is a Dask {kind or 'peer'} address, not a scheduler's")


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
    """

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
        self._listener = _channel.Listener(listen_host(worker.address), secret, ssl_context)
        self._accept_timeout = accept_timeout  # no driver by then: stop listening
        with _SHARDS_LOCK:
            _SHARDS_ON_WORKER.setdefault(self._worker_address, weakref.WeakSet()).add(self)
        self._thread = threading.Thread(target=self._serve, name="mwumkl-shard", daemon=True)
        self._thread.start()

    def address(self):
        """``(host, port, tls)`` of the shard's channel."""
        return (*self._listener.address, self._listener.tls)

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

    def _serve(self):
        try:
            chan = self._listener.accept(self._accept_timeout)  # strangers are closed; waits for the driver
        except (OSError, TimeoutError):
            self._listener.close()
            self._unregister()
            return
        try:
            with chan:
                while True:
                    method, args = chan.recv()
                    if method == "close":
                        chan.send(("ok", None))
                        return
                    chan.send_frame(self._answer(method, args))
        except (EOFError, OSError):
            return  # the driver closed the channel, or died
        finally:
            self._unregister()
            with contextlib.suppress(Exception):
                close_shard(self.shard)


class _Block:
    """Driver-side handle of one remote shard: its slot, worker, actor and channel."""

    def __init__(self, slot):
        self.slot = slot
        self.worker = None
        self.actor_future = None
        self.conn = None


class DaskPool:
    """Shards in actors on Dask workers, called over the socket channel; implements :class:`~.pool.ShardPool`.

    Parameters
    ----------
    slots, factory_for, restore
        See :mod:`mwumkl_dist.engines.pool`.
    client : distributed.Client, scheduler address, or None (a local threaded cluster, closed with the pool)
    timeout : float
        Seconds to wait for Dask workers (at the start, and for a live worker when every
        worker is gone) and for a shard's answer before declaring it lost; the
        estimator's ``worker_timeout``.  While it waits for workers it logs a warning
        ``waiting for Dask workers (N s of T s)`` after 2 s, then every 10 s.

    A lost shard is rebuilt on the live worker holding the fewest shards; when a worker
    left, the rebuild first gives a replacement (a nanny's restart, an autoscaler's new
    worker) up to :data:`REPLACEMENT_GRACE` seconds to join, so the restarted worker is used.
    A lost scheduler raises :class:`SchedulerLostError` ("lost the connection to the Dask
    scheduler at ADDR").  ``recoveries`` counts the rebuilds.
    """

    rebuilds = True

    def __init__(self, slots, factory_for, *, client=None, timeout: float = 600.0, restore=None):
        self.slots = list(slots)
        self.timeout = float(timeout)
        self._factory_for = factory_for
        self._restore = restore
        self._kept: list = []  # (method, args_for) of the calls made with keep=True, in order
        self.blocks = [_Block(slot) for slot in self.slots]
        self.recoveries = 0
        self.client, self._owns_client = connect_client(client)
        self._secret = _channel.new_secret()  # per pool: authenticates the shard channels
        self._tls_context = None
        self._scheduler_address = _scheduler_address(self.client)
        self._departed: set[str] = set()  # workers whose shards were lost: never chosen again
        try:
            self._n_workers = len(self._workers())
            for block in self.blocks:
                self._start(block, self._place(block))
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
            # unless nothing else is left.
            workers = sorted(w for w in live if w not in self._departed) or sorted(live)
            if workers:
                return workers
            if report.expired:
                raise ConnectionError(
                    f"the Dask scheduler at {self._scheduler_address} has had no workers for {self.timeout:g} s "
                    "(worker_timeout)"
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

    def _wait_for_replacement(self) -> None:
        """A worker left: give a replacement (nanny restart, autoscaler) REPLACEMENT_GRACE s to join."""
        live = [w for w in self._live_workers() if w not in self._departed]
        if len(live) >= self._n_workers:
            self._n_workers = len(live)  # workers added since: the count to keep
            return
        grace = min(REPLACEMENT_GRACE, self.timeout)
        logger.warning(
            "%d of the fit's %d Dask workers left; waiting up to %g s for a replacement before rebuilding "
            "their shards on the workers still there",
            self._n_workers - len(live),
            self._n_workers,
            grace,
        )
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            time.sleep(0.2)
            live = [w for w in self._live_workers() if w not in self._departed]
            if len(live) >= self._n_workers:
                break
        self._n_workers = len(live)  # wait once per departure, not once per lost shard

    def _start(self, block: _Block, worker: str) -> None:
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
        actor = block.actor_future.result(timeout=self.timeout)
        address = actor.address().result(timeout=self.timeout)
        block.conn = self._connect(address, worker)
        block.worker = worker

    def _connect(self, address, worker: str) -> _channel.Channel:
        """The channel to a shard: TLS with the client's context when the shard's worker uses TLS."""
        host, port, tls = address
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
        return _channel.connect((host, port), self._secret, ssl_context, timeout=self.timeout)

    def _recover(self, block: _Block) -> None:
        """Rebuild a lost shard on a live worker (the least loaded) and bring it back to the pool's state."""
        self.recoveries += 1
        logger.warning("shard %s lost; rebuilding it (recovery %d)", block.slot, self.recoveries)
        try:
            if block.conn is not None:
                block.conn.close()
        except OSError:
            pass
        if block.worker is not None:
            self._departed.add(block.worker)
        self._wait_for_replacement()
        report = _WaitReport(f"a Dask worker to rebuild shard {block.slot} on", self.timeout)
        failed: set[str] = set()
        while True:
            worker = self._place(block, avoid=failed)
            try:
                self._start(block, worker)
                break
            except SchedulerLostError:
                raise
            except Exception as exc:
                if not self._scheduler_alive():
                    raise self._scheduler_lost(f"{type(exc).__name__}: {exc}") from None
                if report.expired:
                    raise
                failed.add(worker)
                report.note = f": rebuilding on {worker} failed ({type(exc).__name__}: {exc}); trying again"
                report.tick()
                time.sleep(0.5)
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
                f"({type(exc).__name__}: {exc}); a worker that dies on every rebuild may lack the memory "
                "its shard needs (see the worker's log)"
            ) from exc

    def _scheduler_alive(self) -> bool:
        try:
            self._live_workers()
        except SchedulerLostError:
            return False
        return True

    # ------------------------------------------------------------------ messaging
    def _recv(self, block: _Block):
        try:
            status, value = block.conn.recv()
        except TimeoutError:
            raise ShardLostError(f"shard {block.slot} did not answer within {self.timeout:g} s") from None
        if status == "error":
            raise RuntimeError(f"shard {block.slot} failed:\n{value}")
        return value

    def _call(self, block: _Block, method, args: tuple):
        block.conn.send_frame(_channel.encode((method, args)))
        return self._recv(block)

    def call(self, method, args_for=None, *, shared=False, shards=None, keep=False) -> list:
        """See :meth:`~.pool.ShardPool.call`: sent to every shard first, then gathered (the shards work in parallel).

        Each group of equal arguments is pickled once and the same bytes go to each of its shards.
        A shard whose worker is gone is rebuilt (see :meth:`_recover`) and asked again.
        """
        if keep:  # this call's state replaces the one an earlier call of the method kept
            self._kept = [k for k in self._kept if k[0] != method]
        targets = range(len(self.blocks)) if shards is None else shards
        blocks = [self.blocks[i] for i in targets]
        args = call_args(self.slots, targets, args_for, shared)
        frames: dict = {}
        lost, results = [], {}
        for b, (group, a) in zip(blocks, args):
            if group not in frames:
                frames[group] = _channel.encode((method, a))
            try:
                b.conn.send_frame(frames[group])
            except (OSError, EOFError, ValueError):
                lost.append(b)
        for b in blocks:
            if b in lost:
                continue
            try:
                results[id(b)] = self._recv(b)
            except (OSError, EOFError, ShardLostError):
                lost.append(b)
        for b, (_, a) in zip(blocks, args):
            if b in lost:
                self._recover(b)
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
            b.conn = None
            if b.actor_future is not None:
                b.actor_future.release()
                b.actor_future = None
        if self._owns_client and self.client is not None:
            self.client.close()
            self.client = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
