"""The Dask engine: shards live on workers across supersteps (BSP).

Dask places the shards (one actor per shard, pinned to a worker), keeps them
alive and tells us when a worker is gone.  The supersteps themselves do not
go through Dask's task or actor machinery: each shard actor opens a direct,
authenticated socket to the driver (``multiprocessing.connection``), because
a superstep only has to wait for the shards' small answers (two candidates of
O(d + m) each), and a Dask actor round trip (~3-5 ms) would dwarf that.

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
import secrets
import threading
import time
import traceback
from multiprocessing.connection import Client as _connect
from multiprocessing.connection import Listener

import numpy as np

from .._exact import exact_to_float
from ..mwu import Candidate, check_ridge, class_totals, reduce_candidates, ridge_rows

__all__ = ["DaskEngine", "connect_client", "ShardLostError"]

logger = logging.getLogger("mwumkl_dist")


class ShardLostError(RuntimeError):
    """A shard's worker stopped answering (died, or timed out)."""


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


class ShardServer:
    """Dask actor holding one shard; answers supersteps over a direct socket."""

    def __init__(self, shard_factory, authkey: bytes):
        from distributed import get_worker

        # Problems ship a factory (e.g. a store path and a row range), not a built shard: the
        # shard is built, and its data read, on the worker.
        self.shard = shard_factory()
        self._listener = Listener((_listen_host(get_worker().address), 0), authkey=authkey)
        self._thread = threading.Thread(target=self._serve, name="mwumkl-shard", daemon=True)
        self._thread.start()

    def address(self):
        return self._listener.address

    def _serve(self):
        try:
            conn = self._listener.accept()
        except OSError:
            return
        finally:
            self._listener.close()  # one driver connection per shard
        with conn:
            while True:
                try:
                    method, args = conn.recv()
                except (EOFError, OSError):
                    return
                if method == "close":
                    conn.send(("ok", None))
                    return
                try:
                    conn.send(("ok", getattr(self, "_do_" + method)(*args)))
                except Exception:  # report to the driver instead of dying silently
                    conn.send(("error", traceback.format_exc()))

    # -- the shard's operations (run in the server thread) --------------------------------
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


class _Block:
    """Driver-side handle of one remote shard: rows [r0, r1) x kernels [k0, k1)."""

    def __init__(self, rows, kernels):
        self.rows = rows
        self.kernels = kernels
        self.actor_future = None
        self.conn = None


class DaskEngine:
    """Runs a problem's shards on Dask workers; implements :class:`mwumkl_dist.mwu.Engine`.

    Parameters
    ----------
    problem : mwumkl_dist.problems.Problem
    client : distributed.Client, scheduler address, or None (local threaded cluster)
    n_shards : int
        Row shards.
    n_kernel_shards : int
        Kernel shards (blocks of kernels over the rows of each row shard).
    timeout : float
        Seconds to wait for a shard's answer before declaring it lost.
    """

    def __init__(self, problem, client=None, n_shards: int = 2, n_kernel_shards: int = 1, timeout: float = 600.0):
        self.problem = problem
        self.n_samples = problem.n_samples
        self.n_kernels = problem.n_kernels
        self.timeout = float(timeout)
        self.client, self._owns_client = connect_client(client)
        self._authkey = secrets.token_bytes(32)
        self._picks: list[tuple[int, int]] = []
        self._points: dict[int, object] = {}
        self._replayed = 0
        self._config = None
        row_ranges = problem.row_ranges(n_shards)
        kernel_ranges = problem.kernel_ranges(n_kernel_shards)
        self.partial = len(kernel_ranges) > 1
        self.blocks = [_Block(r, k) for r in row_ranges for k in kernel_ranges]
        self.recoveries = 0
        try:
            workers = self._workers()
            for i, block in enumerate(self.blocks):
                self._start(block, workers[i % len(workers)])
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ placement
    def _workers(self) -> list[str]:
        deadline = time.monotonic() + self.timeout
        while True:
            workers = sorted(self.client.nthreads())  # scheduler_info() lists only 5 in some releases
            if workers:
                return workers
            if time.monotonic() > deadline:
                raise ConnectionError("the Dask cluster has no workers")
            time.sleep(0.1)

    def _start(self, block: _Block, worker: str) -> None:
        # The shard is built on the worker from a small factory (a store shard reads its rows there).
        factory = self.problem.shard_factory(*block.rows, kernels=block.kernels)
        [data] = self.client.scatter([factory], workers=[worker], hash=False)
        block.actor_future = self.client.submit(
            ShardServer, data, self._authkey, actor=True, workers=[worker], allow_other_workers=True, pure=False
        )
        actor = block.actor_future.result(timeout=self.timeout)
        address = actor.address().result(timeout=self.timeout)
        block.conn = _connect(address, authkey=self._authkey)
        block.worker = worker

    def _recover(self, block: _Block) -> None:
        """Rebuild a lost block on a live worker and replay the picks it had seen."""
        self.recoveries += 1
        logger.warning(
            "shard rows %s kernels %s lost; rebuilding it (recovery %d)", block.rows, block.kernels, self.recoveries
        )
        try:
            if block.conn is not None:
                block.conn.close()
        except OSError:
            pass
        deadline = time.monotonic() + self.timeout
        while True:
            workers = [w for w in self._workers() if w != getattr(block, "worker", None)] or self._workers()
            try:
                self._start(block, workers[self.recoveries % len(workers)])
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        if self._config is not None:
            inv_trace, ridge = self._config
            self._call(block, "configure", self._kernel_slice(block, inv_trace), ridge_rows(ridge, *block.rows))
            done = self._picks[: self._replayed]
            if done:
                self._call(block, "replay", np.asarray(done, dtype=np.int64), self._points)

    # ------------------------------------------------------------------ messaging
    def _send(self, block: _Block, method: str, args) -> None:
        block.conn.send((method, args))

    def _recv(self, block: _Block):
        if not block.conn.poll(self.timeout):
            raise ShardLostError(f"shard rows {block.rows} did not answer within {self.timeout:g} s")
        status, value = block.conn.recv()
        if status == "error":
            raise RuntimeError(f"shard rows {block.rows} kernels {block.kernels} failed:\n{value}")
        return value

    def _call(self, block, method, *args):
        self._send(block, method, args)
        return self._recv(block)

    def _broadcast(self, method: str, args_for=lambda b: (), blocks=None) -> list:
        """Send to every block first, then gather (the blocks work in parallel).

        A block whose worker is gone is rebuilt (see :meth:`_recover`) and asked again.
        """
        blocks = self.blocks if blocks is None else blocks
        lost, results = [], {}
        for b in blocks:
            try:
                self._send(b, method, args_for(b))
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
        answers = self._broadcast("fetch", lambda b: (index - b.rows[0],), owners)
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
        results = self._broadcast(
            method, lambda b: (pos.index, neg.index, pos.point, neg.point, self._kernel_slice(b, coef))
        )
        self._replayed = len(self._picks)
        if not self.partial:
            return reduce_candidates([p for p, _ in results]), reduce_candidates([n for _, n in results])
        g = np.zeros(self.n_samples)
        for b, part in zip(self.blocks, results):
            g[b.rows[0] : b.rows[1]] += part
        return self._select(g)

    def class_sums(self, weights: np.ndarray) -> tuple[float, float]:
        parts = self._broadcast("support_margins", lambda b: (self._kernel_slice(b, weights),))
        return class_totals(parts, self.problem.y)

    def replay(self, picks) -> None:
        """Bring freshly configured blocks to the state after ``picks`` (resume from a checkpoint)."""
        self._picks = [tuple(p) for p in picks]
        self._points = {j: self.problem.point(j) for pick in self._picks for j in pick}
        picks_arr = np.asarray(self._picks, dtype=np.int64).reshape(-1, 2)
        self._broadcast("replay", lambda b: (picks_arr, self._points))
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
