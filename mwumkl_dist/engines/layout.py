"""How many shards a fit uses, and where: ``n_shards="auto"`` resolved against the engine and the cluster.

* The two-stage fit's linear stage (:func:`linear_shard_count`): on Dask one shard per worker (each reads its own
  rows where the input is a data store, and runs with all its worker's threads), so every worker computes and
  keeps its share of the kernel columns; on the local engine one shard (a shard's row blocks already run on every
  thread; see :data:`LOCAL_LINEAR_SHARDS`).
* The MWU iterations on Dask (:func:`mwu_layout`): a superstep is cheap next to a round trip on small problems, so
  the supersteps run where they are cheapest by a cost model: a measured superstep (:func:`superstep_seconds`, on
  a sample of the rows, scaled) against a measured round trip to the workers' shards.  In this process on its
  threads where that is faster than one shard per worker (and the problem is in memory), else on the workers.

The model never depends on the layout (every sharding gives the same bits), so these choices only move time.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np

from mwumkl_dist.core import partition
from mwumkl_dist.data.problems import FeatureProblem, PrecomputedProblem
from mwumkl_dist.devices.threads import limit_threads

__all__ = [
    "LOCAL_LINEAR_SHARDS",
    "PROBE_ROWS",
    "Layout",
    "cluster_threads",
    "worker_memory",
    "linear_shard_count",
    "decide",
    "mwu_layout",
    "pool_lanes",
    "round_trip_seconds",
    "superstep_seconds",
]

logger = logging.getLogger("mwumkl_dist")

#: Linear-stage shards on the local engine.  One: a shard's row blocks already run on all the threads (its passes
#: are :func:`~mwumkl_dist.devices.threads.ordered_map` over fixed blocks) and the local pool calls its shards one
#: after the other, so a second shard only adds a call per pass.  Measured on the 2-core box (E7's synthetic rows,
#: 60,000 rows, rank 500, ``n_jobs=2``, ``benchmarks/bench_scale_out.py --local-shards``): see benchmarks/RESULTS.md.
LOCAL_LINEAR_SHARDS = 1
#: Rows of the sample a superstep is timed on (:func:`superstep_seconds`); the time scales with the rows.
PROBE_ROWS = 4096
#: Supersteps timed after a warm-up one (the fastest counts: a busy machine only slows some of them).
PROBE_STEPS = 5
#: Round trips timed to the shards (the fastest counts, as above).
ROUND_TRIPS = 5
#: The in-process MWU engine holds ``V`` (rows x kernels, float64) of the whole problem: only up to this share of
#: the memory available is taken for it.
LOCAL_MEMORY_SHARE = 0.25


@dataclass(frozen=True)
class Layout:
    """Where a fit's shards run: ``engine`` (``"local"``, ``"dask"``), ``n_shards``, and why (``reason``)."""

    engine: str
    n_shards: int
    reason: str


def cluster_threads(client) -> dict:
    """``{worker address: threads}`` of the client's cluster now (``nthreads()`` lists every worker)."""
    return {w: int(t) for w, t in dict(client.nthreads()).items()}


def worker_memory(client) -> dict:
    """``{worker address: (memory_limit, memory held, threads)}`` of the client's cluster now, in bytes (Dask's
    ``memory_limit``, 0 where a worker has none; the process memory its last heartbeat reported)."""
    workers = client.scheduler_info(n_workers=-1)["workers"]
    return {w: (int(info.get("memory_limit") or 0), int(info.get("metrics", {}).get("memory") or 0),
                int(info.get("nthreads") or 1)) for w, info in workers.items()}  # fmt: skip


def linear_shard_count(engine: str, n_samples: int, client=None, row_block: int | None = None) -> Layout:
    """The linear stage's shards for ``n_shards="auto"``: one per Dask worker, :data:`LOCAL_LINEAR_SHARDS` locally.

    At most one per row block (a shard holds whole blocks).  On Dask each worker then holds one shard, which runs
    on all the worker's threads; its kernel columns past the worker's memory budget are spilled or computed again
    per pass (:class:`~mwumkl_dist.solvers.two_stage.shards.LinearShard`'s ``storage="auto"``): more shards on one
    worker would share the same memory, so they would not hold more.
    """
    blocks = max(1, -(-int(n_samples) // (partition.ROW_BLOCK if row_block is None else int(row_block))))
    if engine != "dask":
        k = min(LOCAL_LINEAR_SHARDS, blocks)
        return Layout("local", k, f"{k} shard in this process (its row blocks run on every thread)")
    workers = cluster_threads(client) if client is not None else {}
    k = max(1, min(len(workers), blocks))
    threads = sum(workers.values())
    return Layout("dask", k, f"{k} shard(s), one per Dask worker ({len(workers)} workers, {threads} threads)")


def superstep_seconds(problem, rows: int = PROBE_ROWS) -> float:
    """Seconds of one MWU superstep over all of ``problem``'s rows on one thread, measured on its first rows.

    A shard of ``min(rows, n)`` rows is built here (a store problem reads those rows only), given both classes'
    first rows as the pick, and timed over :data:`PROBE_STEPS` supersteps after a warm-up; the fastest, scaled to
    all rows (a superstep's work is one pass over the rows' kernel columns).
    """
    n = int(problem.n_samples)
    s = max(1, min(int(rows), n))
    shard = problem.make_shard(0, s)
    try:
        shard.configure(np.ones(problem.n_kernels), 1.0)
        pos, neg = shard.initial_candidates()
        ip = pos.index if pos.index >= 0 else neg.index
        iq = neg.index if neg.index >= 0 else pos.index
        p, q = problem.point(ip), problem.point(iq)
        coef = np.zeros(problem.n_kernels)
        best = np.inf
        with limit_threads(1):
            for i in range(PROBE_STEPS + 1):
                t0 = time.perf_counter()
                shard.superstep(ip, iq, p, q, coef)
                if i:  # the first compiles or warms the caches
                    best = min(best, time.perf_counter() - t0)
    finally:
        close = getattr(shard, "close", None)
        if close is not None:
            close()
    return best * n / s


def round_trip_seconds(pool) -> float:
    """The fastest of :data:`ROUND_TRIPS` empty calls to every shard of a Dask pool (the shards' thread counts)."""
    best = np.inf
    for _ in range(ROUND_TRIPS):
        t0 = time.perf_counter()
        pool.call("threads")
        best = min(best, time.perf_counter() - t0)
    return best


def pool_lanes(pool) -> dict:
    """Where a pool's shards run, for :func:`~mwumkl_dist.solvers.two_stage.newton.linear_costs`: ``{}`` in this
    process (the local cost model); for a remote pool ``lanes`` (the threads its shards have together) and
    ``round_trip`` (:func:`round_trip_seconds`)."""
    if not getattr(pool, "remote", False):
        return {}
    best, lanes = np.inf, 1
    for _ in range(ROUND_TRIPS):
        t0 = time.perf_counter()
        shares = pool.call("threads")
        best = min(best, time.perf_counter() - t0)
        lanes = sum(int(share) for share, _ in shares)
    return {"lanes": max(1, lanes), "round_trip": best}


def _in_memory(problem) -> bool:
    return isinstance(problem, (FeatureProblem, PrecomputedProblem))


def _fits_here(problem, memory_bytes: float) -> bool:
    return 8.0 * problem.n_samples * problem.n_kernels <= LOCAL_MEMORY_SHARE * memory_bytes


def mwu_layout(
    problem,
    client,
    local_threads: int,
    make_local,
    make_dask,
    memory_bytes: float,
    on_host: bool = True,
    min_rows: int = 16,
):
    """The MWU engine for ``engine="dask"``, ``n_shards="auto"``: ``(engine, Layout)``.

    Candidates: this process on ``local_threads`` threads (``make_local()``; a superstep takes ``t /
    local_threads``, no round trip; only for a problem in memory whose ``V`` fits :data:`LOCAL_MEMORY_SHARE` of
    the memory, on the CPU), or one shard per worker (``make_dask(k)``; ``round trip + t / worker threads``),
    ``t`` the measured one-thread superstep (:func:`superstep_seconds`).  Where this process has at least as
    many threads as the workers together, it wins whatever the round trip, and no pool is started.  Otherwise
    the workers' engine is started and its round trip measured (:func:`round_trip_seconds`); it is closed again
    when the local run is faster.  ``memory_bytes``: this process's memory budget; ``on_host``: whether the
    shards' ``V`` is in host memory (not a GPU's).
    ``min_rows``: the rows a shard needs at least (fewer shards on tiny problems).
    """
    workers = cluster_threads(client)
    k = max(1, min(len(workers), problem.n_samples // max(1, min_rows)))
    worker_threads = sum(sorted(workers.values(), reverse=True)[:k]) or 1
    if not workers:  # the pool waits for workers (and reports the wait) up to worker_timeout
        return make_dask(1), Layout("dask", 1, "1 shard: the cluster had no worker when the fit started")
    if not (on_host and _in_memory(problem) and _fits_here(problem, memory_bytes)):
        return make_dask(k), Layout("dask", k, f"{k} shard(s), one per Dask worker (the problem stays there)")
    t = superstep_seconds(problem)
    local = t / max(1, local_threads)
    if local_threads >= worker_threads:
        reason = (
            f"supersteps in this process on {local_threads} threads, {1e3 * local:.3g} ms each (the "
            f"{worker_threads} worker threads: at least {1e3 * t / worker_threads:.3g} ms and a round trip)"
        )
        return make_local(), Layout("local", 1, reason)  # fmt: skip
    engine = make_dask(k)
    try:
        rt = round_trip_seconds(engine.pool)
    except BaseException:
        engine.close()
        raise
    layout = decide(k, t, rt, local_threads, worker_threads)
    if layout.engine == "local":
        engine.close()
        return make_local(), layout
    return engine, layout


def decide(k: int, t: float, rt: float, local_threads: int, worker_threads: int) -> Layout:
    """The faster of this process and ``k`` worker shards for a one-thread superstep ``t`` and round trip ``rt``."""
    local, remote = t / max(1, local_threads), rt + t / max(1, worker_threads)
    numbers = (f"a superstep {1e3 * local:.3g} ms on {local_threads} local threads, {1e3 * remote:.3g} ms on "
               f"{k} worker shard(s) ({1e3 * rt:.3g} ms of it the round trip)")  # fmt: skip
    if local <= remote:
        return Layout("local", 1, f"supersteps in this process: {numbers}")
    return Layout("dask", k, f"{k} shard(s), one per Dask worker: {numbers}")
