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

The rank is capped where its maps and solve would not fit (:attr:`MemoryPlan.rank_cap`, the rank's stop reason
``"memory_limit"``); a fit that cannot run even at the smallest rank stops before it starts, with one line
naming ``memory_limit`` (:class:`MemoryLimitError`).  The figures are estimates of the arrays the code makes,
not of the process's resident memory (the interpreter, the libraries and the data come on top).
"""

from __future__ import annotations

from dataclasses import dataclass

from mwumkl_dist.core.partition import ROW_BLOCK
from mwumkl_dist.devices.memory import format_bytes
from mwumkl_dist.solvers.two_stage.columns import SUB_ROWS

__all__ = ["MemoryLimitError", "MemoryPlan", "memory_plan", "solve_bytes", "WEIGHT_STAGE_MEMORY"]

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


class MemoryLimitError(ValueError):
    """The fit cannot run within ``memory_limit`` (raised before any work)."""


def solve_bytes(rank: int, threads: int) -> int:
    """Bytes of the explicit Newton solve at ``rank``: the Hessian's Gram sums and factor (3 copies) and the Gram
    parts of the rows that change sides in flight (2 per thread and a few partial sums per row-block tree)."""
    k = int(rank) + 2
    return 8 * k * k * (3 + 2 * max(1, int(threads)) + 3)


def _driver_bytes(rank: int, n: int, threads: int) -> int:
    """The rank-dependent arrays besides the kernel columns: the kept map and the solve, or a map being built."""
    r = int(rank)
    maps = 8 * r * r * MAP_COPIES
    solve = 8 * r * r * 2 + solve_bytes(r, threads)
    blocks = 8 * (min(ROW_BLOCK, n) + 2 * SUB_ROWS) * r * max(1, int(threads))  # a block's columns, a chunk in double
    return max(maps, solve) + blocks + 8 * ROW_VECTORS * int(n)


@dataclass(frozen=True)
class MemoryPlan:
    """What the two-stage fit may take: ``limit`` bytes in all (``source``: where that figure came from), ranks up
    to ``rank_cap``, ``columns_budget`` bytes of kernel columns across the shards, and whether the exact solve's
    ``n x n`` Gram matrix fits (``exact_fits``)."""

    limit: int
    source: str
    rank_cap: int
    columns_budget: int
    exact_fits: bool


def memory_plan(limit: int, source: str, n_samples: int, *, rank_max: int, rank_min: int, given_rank=None,
                threads: int = 1, column_bytes: int = 4) -> MemoryPlan:  # fmt: skip
    """The :class:`MemoryPlan` of a two-stage fit of ``n_samples`` rows within ``limit`` bytes.

    ``rank_max``: the most landmarks the rows afford (:func:`~mwumkl_dist.solvers.two_stage.nystroem.rank_budget`),
    ``rank_min``: the adaptive rank's first level, ``given_rank``: ``n_components`` when an int, ``column_bytes``:
    the columns' precision.  The weight stage and the linear stage run one after the other, each within the limit.
    The adaptive rank is capped where its arrays and every row's kernel columns together fill the limit (the
    columns stay in memory, a pass reads them at memory speed); where even the first level's columns do not fit
    (10^6 rows), where its arrays alone do, and the columns are spilled or computed again.  Raises
    :class:`MemoryLimitError` where the weight stage, or the first level's (the given rank's) arrays, do not fit.
    """
    n = int(n_samples)
    free = int(limit) - LINEAR_STAGE_RESERVE
    wanted = min(int(given_rank) if given_rank is not None else int(rank_min), n)
    need = max(_driver_bytes(wanted, n, max(threads, PLAN_THREADS)) + LINEAR_STAGE_RESERVE, WEIGHT_STAGE_MEMORY)
    if need > limit:
        what = f"n_components={given_rank}" if given_rank is not None else f"its smallest rank ({wanted} landmarks)"
        raise MemoryLimitError(
            f"memory_limit ({source}: {format_bytes(limit)}) is too small for the two-stage fit of {n} rows at "
            f"{what}: it needs about {format_bytes(need)}; pass a larger memory_limit"
            + (" or a smaller n_components" if given_rank is not None else "")
        )

    def fits(r: int, columns: bool) -> bool:  # counted at PLAN_THREADS: the rank, hence the model, is n_jobs's too
        return _driver_bytes(r, n, PLAN_THREADS) + (n * r * int(column_bytes) if columns else 0) <= free

    if given_rank is not None:
        cap = wanted
    else:
        columns = fits(wanted, True)
        lo, hi = wanted, max(wanted, min(int(rank_max), n))
        while lo < hi:  # the largest rank that fits (the bytes grow with the rank)
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if fits(mid, columns) else (lo, mid - 1)
        cap = lo
    columns_budget = max(0, free - _driver_bytes(cap, n, max(threads, PLAN_THREADS)))
    exact = 8 * n * n * 1.25 <= free  # the Gram matrix and LIBSVM's cache of its rows
    return MemoryPlan(int(limit), source, int(cap), int(columns_budget), bool(exact))
