"""The two-stage fit within one memory budget (``memory_limit``): what each phase may take, decided at the start.

The fit's large arrays, by phase (``r`` the rank, ``n`` the rows, ``t`` the threads; 8-byte floats):

* the weight stage: the MWU fit and its cross-validation on at most 3000 rows (:data:`WEIGHT_STAGE_MEMORY`), before
  the others;
* the Nystroem maps: ``K(L, L)``, its pivoted Cholesky factor, the map and the factor kept
  (:data:`MAP_COPIES` ``r x r`` arrays at the peak);
* the linear solve: the Hessian and its factor, and the Gram parts of the rows that change sides, summed per
  block over the threads (:func:`solve_bytes`); one row block's columns per thread in double precision;
  about :data:`ROW_VECTORS` vectors of ``n`` (labels, weights, outputs, masks, the held-out decisions);
* the kernel columns of every row: what is left, shared by the shards (:attr:`MemoryPlan.columns_budget`);
  beyond it the shards spill them to disk or compute them again at each pass (the same model).

On the Dask engine ``memory_limit`` holds per process (:func:`shard_memory`): the client's arrays (the maps, the
Hessian, the ``n``-vectors it keeps; the weight stage) within the client's limit, and each shard's (its rows'
kernel columns, its blocks in flight, its ``n``-vectors) within its worker's: a given size is each worker's as it is
the client's; ``"auto"`` is :data:`WORKER_SHARE` of each worker's Dask ``memory_limit`` less the memory the worker
already holds.  The columns are distributed, so the rank cap counts a shard's rows against its worker's budget:
the cluster's memory, not the client's, buys rank.

The rank is capped where its maps and solve would not fit (:attr:`MemoryPlan.rank_cap`, the rank's stop reason
``"memory_limit"``); a fit that cannot run even at the smallest rank stops before it starts, with one line
naming ``memory_limit`` (:class:`MemoryLimitError`).  The figures are estimates of the arrays the code makes,
not of the process's resident memory (the interpreter, the libraries and the data come on top).
"""

from __future__ import annotations

from dataclasses import dataclass

from mwumkl_dist.core import partition
from mwumkl_dist.core.partition import ROW_BLOCK, linear_row_ranges
from mwumkl_dist.devices.memory import AUTO_MEMORY, WORKER_SHARE, format_bytes
from mwumkl_dist.solvers.two_stage.columns import SUB_ROWS

__all__ = ["MemoryLimitError", "MemoryPlan", "ShardMemory", "memory_plan", "shard_memory", "solve_bytes",
           "HELD_STEP", "WEIGHT_STAGE_MEMORY", "WORKER_SHARE"]  # fmt: skip

#: The weight stage's arrays (3000 rows: the MWU fit's kernel columns and margins, the polish's Gram matrix and
#: LIBSVM's cache, the cross-validation's folds one at a time): measured peak about 250 MB above the data on
#: ijcnn1-like rows (22 features, the default kernels), with a margin.
WEIGHT_STAGE_MEMORY = 320 * 2**20
#: The linear stage's own arrays besides those :func:`memory_plan` counts (the landmarks' and the residual rows'
#: features, the maps' products, scratch of the libraries).
LINEAR_STAGE_RESERVE = 64 * 2**20
#: The threads the rank cap counts the arrays in flight of, whatever the fit's (a model must not depend on
#: ``n_jobs``); more threads take more (their columns then go to disk sooner).
PLAN_THREADS = 2
#: ``r x r`` arrays at the peak of a Nystroem map's construction (``K(L, L)``, LAPACK's factor, two ``tril``
#: copies, the map, the factor).
MAP_COPIES = 6
#: Vectors of ``n`` the linear stage keeps on the driver (labels, point weights, outputs, steps, masks, held-out
#: decisions of the candidates).
ROW_VECTORS = 16
#: ... on the Dask engine, where the shards keep the solve's state on their rows and get their labels and weights
#: made as each call is sent: the client's (the data's labels, the landmark order, the held-out and training
#: masks, a shard's labels and weights in flight, with room for the stratified samples' transients).
CLIENT_ROW_VECTORS = 8
#: Vectors of its rows a Dask shard keeps (labels, weights, outputs, the direction's outputs, masks, a solve's
#: replay).
SHARD_ROW_VECTORS = 8


class MemoryLimitError(ValueError):
    """The fit cannot run within ``memory_limit`` (raised before any work)."""


def solve_bytes(rank: int, threads: int) -> int:
    """Bytes of the explicit Newton solve at ``rank``: the Hessian's Gram sums and factor (3 copies) and the Gram
    parts of the rows that change sides in flight (2 per thread and a few partial sums per row-block tree)."""
    k = int(rank) + 2
    return 8 * k * k * (3 + 2 * max(1, int(threads)) + 3)


def _driver_bytes(rank: int, n: int, threads: int, remote: bool = False) -> int:
    """The rank-dependent arrays besides the kernel columns: the kept map and the solve, or a map being built
    (``remote``: the shards are on Dask workers, their blocks and row state not here)."""
    r = int(rank)
    maps = 8 * r * r * MAP_COPIES
    solve = 8 * r * r * 2 + solve_bytes(r, threads)
    if remote:
        return max(maps, solve) + 8 * CLIENT_ROW_VECTORS * int(n)
    blocks = 8 * (min(ROW_BLOCK, n) + 2 * SUB_ROWS) * r * max(1, int(threads))  # a block's columns, a chunk in double
    return max(maps, solve) + blocks + 8 * ROW_VECTORS * int(n)


def _shard_bytes(rank: int, rows: int, threads: int) -> int:
    """A Dask shard's arrays besides its kernel columns at ``rank``: a block's columns and a chunk in double and
    the Gram parts in flight per thread, its ``n``-vectors, the reserve."""
    r, rows = int(rank), int(rows)
    blocks = 8 * (min(ROW_BLOCK, rows) + 2 * SUB_ROWS) * r * max(1, int(threads))
    return blocks + solve_bytes(r, threads) + 8 * SHARD_ROW_VECTORS * rows + LINEAR_STAGE_RESERVE


#: A worker's memory held at the fit's start is counted in steps of this many bytes (rounded up), so that the
#: budget, hence the rank cap and the model, does not move with the few MB a worker's resident size drifts by.
HELD_STEP = 256 * 2**20


@dataclass(frozen=True)
class ShardMemory:
    """The memory of a Dask fit's linear-stage shards: ``budget`` bytes of arrays each (its worker's, shared by the
    shards placed there), ``rows`` the most rows one holds, ``n_shards`` of them; ``source``: where from."""

    budget: int
    rows: int
    n_shards: int
    source: str


def shard_memory(workers: dict, n_samples: int, n_shards: int, given: int | None = None,
                 row_block: int | None = None) -> ShardMemory:  # fmt: skip
    """The :class:`ShardMemory` of ``n_shards`` shards of ``n_samples`` rows on ``workers`` (``{address: (Dask
    memory_limit, memory held, threads)}``, :func:`~mwumkl_dist.engines.layout.worker_memory`).

    ``given``: the user's ``memory_limit`` in bytes (each worker's as it is; None for ``"auto"``: :data:`WORKER_SHARE`
    of the worker's Dask ``memory_limit`` less what it holds, in :data:`HELD_STEP` steps, or
    :data:`~mwumkl_dist.devices.memory.AUTO_MEMORY` for a worker without one).  The shards are spread evenly over
    the workers: each gets the smallest worker's budget over the most shards one worker holds.
    """
    ranges = linear_row_ranges(int(n_samples), int(n_shards), partition.ROW_BLOCK if row_block is None else row_block)
    k = len(ranges)
    per_worker = []
    for limit, held, _ in workers.values() or [(0, 0, 1)]:
        if given is not None:
            per_worker.append(int(given))
        elif limit:  # what it holds rounded up: a few MB more or less must not move the rank cap (the model)
            held = -(-max(int(held), 1) // HELD_STEP) * HELD_STEP
            per_worker.append(max(0, int(WORKER_SHARE * limit) - held))
        else:
            per_worker.append(AUTO_MEMORY)
    on_one = -(-k // max(1, len(per_worker)))
    budget = min(per_worker) // on_one
    if given is not None:
        source = f"memory_limit={format_bytes(given)} per worker"
    else:
        source = f'memory_limit="auto": {WORKER_SHARE:.0%} of each Dask worker\'s memory_limit less what it holds'
    source += f", {format_bytes(budget)} per shard ({k} shard(s) on {len(per_worker)} worker(s))"
    return ShardMemory(int(budget), max(hi - lo for lo, hi in ranges), k, source)


@dataclass(frozen=True)
class MemoryPlan:
    """What the two-stage fit may take: ``limit`` bytes in all (``source``: where that figure came from), ranks up
    to ``rank_cap``, ``columns_budget`` bytes of kernel columns across the shards, and whether the exact solve's
    ``n x n`` Gram matrix fits (``exact_fits``).  On Dask (``shards``, :class:`ShardMemory`) ``limit`` is the
    client's and ``columns_budget`` each shard's own (``per_shard``)."""

    limit: int
    source: str
    rank_cap: int
    columns_budget: int
    exact_fits: bool
    shards: ShardMemory | None = None

    @property
    def per_shard(self) -> bool:
        return self.shards is not None

    def shard_columns(self, n_shards: int) -> int:
        """The bytes of kernel columns each of ``n_shards`` shards may keep in memory: its own budget on Dask, an
        equal share of :attr:`columns_budget` in this process."""
        return self.columns_budget if self.per_shard else self.columns_budget // max(1, int(n_shards))

    def describe(self) -> str:
        """One line for the summary: the budget of the columns and where it came from."""
        where = self.shards.source if self.shards is not None else self.source
        each = "each shard" if self.shards is not None else "all shards together"
        return f"columns budget {format_bytes(self.columns_budget)} for {each} ({where})"


def memory_plan(limit: int, source: str, n_samples: int, *, rank_max: int, rank_min: int, given_rank=None,
                threads: int = 1, column_bytes: int = 4, shards: ShardMemory | None = None) -> MemoryPlan:  # fmt: skip
    """The :class:`MemoryPlan` of a two-stage fit of ``n_samples`` rows within ``limit`` bytes.

    ``rank_max``: the most landmarks the rows afford (:func:`~mwumkl_dist.solvers.two_stage.nystroem.rank_budget`),
    ``rank_min``: the adaptive rank's first level, ``given_rank``: ``n_components`` when an int, ``column_bytes``:
    the columns' precision.  The weight stage and the linear stage run one after the other, each within the limit.
    The adaptive rank is capped where its arrays and every row's kernel columns together fill the limit (the
    columns stay in memory, a pass reads them at memory speed); where even the first level's columns do not fit
    (10^6 rows), where its arrays alone do, and the columns are spilled or computed again.  ``shards``: the
    fit's shards are on Dask workers (:func:`shard_memory`): ``limit`` bounds the client's arrays, and a shard's
    columns and arrays its worker's budget (the cap then counts a shard's rows, not all).  Raises
    :class:`MemoryLimitError` where the weight stage, or the first level's (the given rank's) arrays, do not fit.
    """
    n = int(n_samples)
    remote = shards is not None
    free = int(limit) - LINEAR_STAGE_RESERVE
    wanted = min(int(given_rank) if given_rank is not None else int(rank_min), n)
    need = max(_driver_bytes(wanted, n, max(threads, PLAN_THREADS), remote) + LINEAR_STAGE_RESERVE,
               WEIGHT_STAGE_MEMORY)  # fmt: skip
    what = f"n_components={given_rank}" if given_rank is not None else f"its smallest rank ({wanted} landmarks)"
    hint = " or a smaller n_components" if given_rank is not None else ""
    if need > limit:
        raise MemoryLimitError(
            f"memory_limit ({source}: {format_bytes(limit)}) is too small for the two-stage fit of {n} rows at "
            f"{what}: it needs about {format_bytes(need)}; pass a larger memory_limit{hint}"
        )
    if remote and _shard_bytes(wanted, shards.rows, PLAN_THREADS) > shards.budget:
        raise MemoryLimitError(
            f"memory_limit ({shards.source}) is too small for a linear-stage shard of {shards.rows} rows at {what}: "
            f"it needs about {format_bytes(_shard_bytes(wanted, shards.rows, PLAN_THREADS))}; pass a larger "
            f"memory_limit, more Dask workers or workers with more memory{hint}"
        )

    def fits(r: int, columns: bool) -> bool:  # counted at PLAN_THREADS: the rank, hence the model, is n_jobs's too
        if not remote:
            return _driver_bytes(r, n, PLAN_THREADS) + (n * r * int(column_bytes) if columns else 0) <= free
        held = _shard_bytes(r, shards.rows, PLAN_THREADS) + (shards.rows * r * int(column_bytes) if columns else 0)
        return _driver_bytes(r, n, PLAN_THREADS, True) <= free and held <= shards.budget

    if given_rank is not None:
        cap = wanted
    else:
        columns = fits(wanted, True)
        lo, hi = wanted, max(wanted, min(int(rank_max), n))
        while lo < hi:  # the largest rank that fits (the bytes grow with the rank)
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if fits(mid, columns) else (lo, mid - 1)
        cap = lo
    if remote:
        columns_budget = max(0, shards.budget - _shard_bytes(cap, shards.rows, PLAN_THREADS))
    else:
        columns_budget = max(0, free - _driver_bytes(cap, n, max(threads, PLAN_THREADS)))
    exact = 8 * n * n * 1.25 <= free  # the Gram matrix and LIBSVM's cache of its rows
    return MemoryPlan(int(limit), source, int(cap), int(columns_budget), bool(exact), shards)
