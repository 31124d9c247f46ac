"""The Dask engine: shards live on workers across supersteps (BSP).

Dask places the shards (one actor per shard, pinned to a worker), keeps them
alive and tells us when a worker is gone.  The supersteps themselves do not
go through Dask's task or actor machinery: each shard actor listens on its
worker's host and the driver connects to it (:mod:`._channel`: TLS whenever the
cluster uses TLS, mutual HMAC authentication with a per-fit secret, framed
pickles), because a superstep only has to wait for the shards' small answers
(two candidates of O(d + m) each), and a Dask actor round trip (~3-5 ms) would
dwarf that. A superstep's message is pickled once and the same bytes go to
every shard (kernel shards: once per kernel range).

A shard runs with its worker's threads: ``nthreads // (shards on that
worker)``, at least 1, so one worker per machine with one shard uses the
whole machine.

Layouts (``SPEC.md`` section 3):

* row shards (``n_kernel_shards=1``): each shard holds some rows for all
  kernels, reduces its rows to one candidate per class, and the driver
  reduces the candidates: no O(n) data moves per superstep;
* kernel shards (``n_shards=1``) and row x kernel blocks: a block holds some
  rows for some kernels and returns its partial ``g`` for its rows; the
  driver sums the partials of each row range and takes the argmax, then
  fetches the chosen rows' ``V`` entries (a second, small round trip).

Lost shards are rebuilt from the problem and the log of picks: replaying the
picks in order gives bit-identical ``V`` blocks, so a fit that lost a worker
ends with the same model.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import logging
import threading
import time
import traceback
import warnings
import weakref

import numpy as np

from mwumkl_dist.core import partition
from mwumkl_dist.core.exact import exact_to_float
from mwumkl_dist.core.mwu_rules import Candidate, check_ridge, class_totals, reduce_candidates, ridge_rows
from mwumkl_dist.data.shards import sum_tile_partials
from mwumkl_dist.devices.threads import current_threads, dask_worker, limit_threads, worker_threads
from mwumkl_dist.engines import channel as _channel

__all__ = ["DaskEngine", "connect_client", "ShardLostError", "SchedulerLostError"]

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


def _listen_host(worker_address: str) -> str:
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
    """Dask actor holding one shard; answers supersteps over a direct socket (:mod:`._channel`).

    It listens on its worker's host, with the worker's TLS server context when the cluster uses
    TLS, and serves the first peer that proves it holds the fit's secret.
    """

    def __init__(self, shard_factory, secret: bytes, accept_timeout: float | None = None):
        worker = dask_worker()
        if worker is None:
            raise RuntimeError("a ShardServer is a Dask actor: it runs on a Dask worker")
        # Problems ship a factory (e.g. a store path and a row range), not a built shard: the
        # shard is built, and its data read, on the worker.
        self.shard = shard_factory()
        self._worker_address = worker.address
        self._nthreads = worker_threads(worker) or 1
        ssl_context = None
        if worker.address.startswith("tls://"):
            ssl_context = worker.security.get_listen_args("worker")["ssl_context"]
            if ssl_context is None:
                raise RuntimeError(f"worker {worker.address} listens on TLS but its Security has no TLS context")
        self._listener = _channel.Listener(_listen_host(worker.address), secret, ssl_context)
        self._accept_timeout = accept_timeout  # no driver by then: stop listening
        with _SHARDS_LOCK:
            _SHARDS_ON_WORKER.setdefault(self._worker_address, weakref.WeakSet()).add(self)
        self._thread = threading.Thread(target=self._serve, name="mwumkl-shard", daemon=True)
        self._thread.start()

    def address(self):
        """``(host, port, tls)`` of the shard's channel."""
        return (*self._listener.address, self._listener.tls)

    def threads(self) -> int:
        """The threads this shard's supersteps use: its share of its worker's threads (>= 1)."""
        with _SHARDS_LOCK:
            n_shards = len(_SHARDS_ON_WORKER.get(self._worker_address, ())) or 1
        return max(1, self._nthreads // n_shards)

    def _unregister(self):
        with _SHARDS_LOCK:
            _SHARDS_ON_WORKER.get(self._worker_address, weakref.WeakSet()).discard(self)

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
                    try:
                        with limit_threads(self.threads()):
                            value = getattr(self, "_do_" + method)(*args)
                        frame = _channel.encode(("ok", value))
                    except Exception:  # report to the driver instead of dying silently
                        frame = _channel.encode(("error", traceback.format_exc()))
                    chan.send_frame(frame)
        except (EOFError, OSError):
            return  # the driver closed the channel, or died
        finally:
            self._unregister()

    # -- the shard's operations (run in the server thread) --------------------------------
    def _do_threads(self):
        """The threads this shard's supersteps run with (inside its thread limit)."""
        return self.threads(), current_threads()

    def _do_trace_parts(self):
        return self.shard.trace_parts()

    def _do_configure(self, inv_trace, ridge):
        self.shard.configure(inv_trace, ridge)

    def _do_initial(self):
        return self.shard.initial_candidates()

    def _do_step(self, ip, iq, p, q, coef):
        return self.shard.superstep(ip, iq, p, q, coef)

    def _do_step_partial(self, ip, iq, p, q, coef):
        return self.shard.superstep_scores(ip, iq, p, q, coef)

    def _do_stats(self):
        return self.shard.stats()

    def _do_fetch(self, local):
        return self.shard.V[local].copy(), self.shard.point(local)

    def _do_replay(self, picks, points):
        self.shard.replay(picks, points)

    def _do_support_margins(self, weights):
        return self.shard.support_margins(weights)

    def _do_alpha(self):
        return self.shard.alpha_counts()

    def _do_call(self, method, args):
        """A method the shard lists in ``REMOTE_METHODS`` (shards of other stages, e.g. the two-stage fit's)."""
        if method not in getattr(type(self.shard), "REMOTE_METHODS", ()):
            raise AttributeError(f"{type(self.shard).__name__} has no remote method {method!r}")
        return getattr(self.shard, method)(*args)


class _Block:
    """Driver-side handle of one remote shard: rows [r0, r1) x kernels [k0, k1)."""

    def __init__(self, rows, kernels):
        self.rows = rows
        self.kernels = kernels
        self.actor_future = None
        self.conn = None


class DaskEngine:
    """Runs a problem's shards on Dask workers; implements :class:`mwumkl_dist.engines.base.Engine`.

    Parameters
    ----------
    problem : mwumkl_dist.data.problems.Problem
    client : distributed.Client, scheduler address, or None (local threaded cluster)
    n_shards : int
        Row shards.
    n_kernel_shards : int
        Kernel shards (blocks of kernels over the rows of each row shard).
    timeout : float
        Seconds to wait for Dask workers (at the start, and for a live worker when every
        worker is gone mid-fit) and for a shard's answer before declaring it lost; the
        estimator's ``worker_timeout``.  While it waits for workers it logs a warning
        ``waiting for Dask workers (N s of T s)`` after 2 s, then every 10 s.

    A lost shard is rebuilt on the live worker holding the fewest shards; when a worker
    left, the rebuild first gives a replacement (a nanny's restart, an autoscaler's new
    worker) up to :data:`REPLACEMENT_GRACE` seconds to join, so the restarted worker is used.
    A lost scheduler raises :class:`SchedulerLostError` ("lost the connection to the Dask
    scheduler at ADDR").
    """

    def __init__(self, problem, client=None, n_shards: int = 2, n_kernel_shards: int = 1, timeout: float = 600.0):
        self.problem = problem
        self.n_samples = problem.n_samples
        self.n_kernels = problem.n_kernels
        self.timeout = float(timeout)
        self.client, self._owns_client = connect_client(client)
        self._secret = _channel.new_secret()  # per fit: authenticates the shard channels
        self._tls_context = None
        self._picks: list[tuple[int, int]] = []
        self._points: dict[int, object] = {}
        self._replayed = 0
        self._config = None
        #: ``restore(rows) -> [(method, args), ...]``: what a rebuilt shard of rows ``rows`` is asked first (see
        #: :meth:`map`; the MWU state is replayed by the engine itself).
        self.restore = None
        row_ranges = problem.row_ranges(n_shards)
        kernel_ranges = problem.kernel_ranges(n_kernel_shards)
        if len(kernel_ranges) < n_kernel_shards:
            warnings.warn(
                f"n_kernel_shards={n_kernel_shards} but {problem.n_kernels} kernels make only "
                f"{len(kernel_ranges)} kernel block(s): blocks hold whole kernel tiles of about "
                f"{partition.TILE_KERNELS} kernels (so that every layout gives the same model); using "
                f"{len(kernel_ranges)}",
                UserWarning,
                stacklevel=2,
            )
        self.partial = len(kernel_ranges) > 1
        self.blocks = [_Block(r, k) for r in row_ranges for k in kernel_ranges]
        self.recoveries = 0
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
        factory = self.problem.shard_factory(*block.rows, kernels=block.kernels)
        [data] = self.client.scatter([factory], workers=[worker], hash=False)
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
        """Rebuild a lost block on a live worker (the least loaded) and replay the picks it had seen."""
        self.recoveries += 1
        logger.warning(
            "shard rows %s kernels %s lost; rebuilding it (recovery %d)", block.rows, block.kernels, self.recoveries
        )
        try:
            if block.conn is not None:
                block.conn.close()
        except OSError:
            pass
        if getattr(block, "worker", None) is not None:
            self._departed.add(block.worker)
        self._wait_for_replacement()
        report = _WaitReport(f"a Dask worker to rebuild shard rows {block.rows} on", self.timeout)
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
        if self._config is not None:
            inv_trace, ridge = self._config
            self._call(block, "configure", self._kernel_slice(block, inv_trace), ridge_rows(ridge, *block.rows))
            done = self._picks[: self._replayed]
            if done:
                self._call(block, "replay", np.asarray(done, dtype=np.int64), self._points)
        if self.restore is not None:
            try:
                for method, args in self.restore(block.rows):
                    self._call(block, "call", method, args)
            except (OSError, EOFError) as exc:
                raise ShardLostError(
                    f"shard rows {block.rows} was lost again while it was rebuilt on {block.worker} "
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
    def _send(self, block: _Block, method: str, args, frame=None) -> None:
        block.conn.send_frame(frame if frame is not None else _channel.encode((method, args)))

    def _recv(self, block: _Block):
        try:
            status, value = block.conn.recv()
        except TimeoutError:
            raise ShardLostError(f"shard rows {block.rows} did not answer within {self.timeout:g} s") from None
        if status == "error":
            raise RuntimeError(f"shard rows {block.rows} kernels {block.kernels} failed:\n{value}")
        return value

    def _call(self, block, method, *args):
        self._send(block, method, args)
        return self._recv(block)

    def _broadcast(self, method: str, args_for=None, blocks=None, key=None) -> list:
        """Send to every block first, then gather (the blocks work in parallel).

        The message is pickled once per distinct ``key(block)`` (``args_for`` must give equal
        arguments to blocks with equal keys) and the same bytes go to each of those blocks;
        without ``args_for`` every block gets ``()``, without ``key`` each block its own message.
        A block whose worker is gone is rebuilt (see :meth:`_recover`) and asked again.
        """
        blocks = self.blocks if blocks is None else blocks
        if args_for is None:
            args_for, key = (lambda b: ()), (lambda b: None)
        elif key is None:
            key = id
        frames: dict = {}
        lost, results = [], {}
        for b in blocks:
            k = key(b)
            if k not in frames:
                frames[k] = _channel.encode((method, args_for(b)))
            try:
                self._send(b, method, None, frames[k])
            except (OSError, EOFError, ValueError):
                lost.append(b)
        for b in blocks:
            if b in lost:
                continue
            try:
                results[id(b)] = self._recv(b)
            except (OSError, EOFError, ShardLostError):
                lost.append(b)
        for b in lost:
            self._recover(b)
            results[id(b)] = self._call(b, method, *args_for(b))
        return [results[id(b)] for b in blocks]

    def map(self, method: str, args_for=None, shared: bool = False) -> list:
        """``shard.method(*args_for(rows))`` on every shard (a method in its ``REMOTE_METHODS``), in row order.

        ``shared``: every shard gets the same arguments (pickled once).  A lost
        shard is rebuilt, given :attr:`restore`'s calls, and asked again.
        """
        if args_for is None:
            args_for, shared = (lambda rows: ()), True
        return self._broadcast("call", lambda b: (method, args_for(b.rows)), key=(lambda b: None) if shared else None)

    def _kernel_slice(self, b: _Block, per_kernel: np.ndarray) -> np.ndarray:
        return per_kernel[b.kernels[0] : b.kernels[1]]

    # ------------------------------------------------------------------ Engine protocol
    def traces(self) -> np.ndarray:
        totals = [0] * self.n_kernels
        for b, parts in zip(self.blocks, self._broadcast("trace_parts")):
            for k, part in enumerate(parts, start=b.kernels[0]):
                totals[k] += part
        return exact_to_float(totals)

    def configure(self, inv_trace: np.ndarray, ridge) -> None:
        """``1 / r_i`` and the ridge: a float, or per point (each block gets its rows' values)."""
        ridge = check_ridge(ridge, self.n_samples)
        self._config = (inv_trace, ridge)
        self._picks, self._points, self._replayed = [], {}, 0
        self._broadcast("configure", lambda b: (self._kernel_slice(b, inv_trace), ridge_rows(ridge, *b.rows)))

    def _fetch(self, index: int) -> tuple[np.ndarray, object]:
        """``V[index, :]`` over all kernels and the row's point, from the blocks holding the row."""
        owners = [b for b in self.blocks if b.rows[0] <= index < b.rows[1]]
        answers = self._broadcast("fetch", lambda b: (index - b.rows[0],), owners, key=lambda b: b.rows)
        v_row = np.empty(self.n_kernels)
        for b, (v, _) in zip(owners, answers):
            v_row[b.kernels[0] : b.kernels[1]] = v
        return v_row, answers[0][1]  # every owner holds the same point

    def _select(self, g: np.ndarray) -> tuple[Candidate, Candidate]:
        """Find-alpha on a full ``g`` (kernel-sharded layouts): argmax per class, lowest index on ties."""
        out = []
        for cls in (1.0, -1.0):
            idx = np.flatnonzero(self.problem.y == cls)
            j = int(idx[np.argmax(g[idx])])
            out.append(Candidate(j, float(g[j]), *self._fetch(j)))
        return out[0], out[1]

    def initial_candidates(self) -> tuple[Candidate, Candidate]:
        if self.partial:
            return self._select(np.zeros(self.n_samples))
        pairs = self._broadcast("initial")
        return reduce_candidates([p for p, _ in pairs]), reduce_candidates([n for _, n in pairs])

    def kernel_block(self, pos: Candidate, neg: Candidate):
        return self.problem.kernel_block(pos.point, neg.point)

    def superstep(self, pos: Candidate, neg: Candidate, coef: np.ndarray) -> tuple[Candidate, Candidate]:
        # The pick log lets a lost block be rebuilt bit for bit (replay before this superstep).
        self._picks.append((pos.index, neg.index))
        self._points.setdefault(pos.index, pos.point)
        self._points.setdefault(neg.index, neg.point)
        self._replayed = len(self._picks) - 1
        method = "step_partial" if self.partial else "step"
        # Pickled once per kernel range (once in all for row shards): the same bytes to every shard.
        results = self._broadcast(
            method,
            lambda b: (pos.index, neg.index, pos.point, neg.point, self._kernel_slice(b, coef)),
            key=lambda b: b.kernels,
        )
        self._replayed = len(self._picks)
        if not self.partial:
            return reduce_candidates([p for p, _ in results]), reduce_candidates([n for _, n in results])
        # Each row range's blocks' tile partials, added in kernel (tile) order: the local engine's sums.
        by_rows: dict = {}
        for b, part in zip(self.blocks, results):
            by_rows.setdefault(b.rows, []).append((b.kernels[0], part))
        g = np.empty(self.n_samples)
        for (r0, r1), parts in by_rows.items():
            g[r0:r1] = sum_tile_partials([part for _, part in sorted(parts, key=lambda kp: kp[0])])
        return self._select(g)

    def class_sums(self, weights: np.ndarray) -> tuple[float, float]:
        parts = self._broadcast("support_margins", lambda b: (self._kernel_slice(b, weights),), key=lambda b: b.kernels)
        return class_totals(parts, self.problem.y)

    def replay(self, picks) -> None:
        """Bring freshly configured blocks to the state after ``picks`` (resume from a checkpoint)."""
        self._picks = [tuple(p) for p in picks]
        self._points = {j: self.problem.point(j) for pick in self._picks for j in pick}
        picks_arr = np.asarray(self._picks, dtype=np.int64).reshape(-1, 2)
        self._broadcast("replay", lambda b: (picks_arr, self._points), key=lambda b: None)
        self._replayed = len(self._picks)

    def stats(self) -> list[dict]:
        """Each block's counters (:meth:`shard.stats`, e.g. a kernel store's column cache)."""
        return self._broadcast("stats")

    def alpha_counts(self) -> np.ndarray:
        out = np.zeros(self.n_samples)
        first = [b for b in self.blocks if b.kernels[0] == 0]
        for b, counts in zip(first, self._broadcast("alpha", blocks=first)):
            out[b.rows[0] : b.rows[1]] = counts
        return out

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
