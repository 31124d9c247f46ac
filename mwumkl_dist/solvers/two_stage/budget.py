"""The two-stage fit within one memory budget (``memory_limit``): what each phase may take, decided at the start.

The fit's large arrays, by phase (``r`` the rank, ``n`` the rows, ``t`` the threads; 8-byte floats):

* the weight stage: the MWU fit and its cross-validation on at most 3000 rows (:data:`WEIGHT_STAGE_MEMORY`);
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

import math
from dataclasses import dataclass

from mwumkl_dist.core.memory import format_bytes
from mwumkl_dist.core.partition import ROW_BLOCK

__all__ = ["MemoryLimitError", "MemoryPlan", "memory_plan", "solve_bytes", "WEIGHT_STAGE_MEMORY"]

#: The weight stage's arrays (3000 rows: the MWU fit's kernel columns and margins, the polish's Gram matrix and
#: LIBSVM's cache, the cross-validation's folds one at a time): measured peak about 250 MB above the data on
#: ijcnn1-like rows (22 features, the default kernels), with a margin.
WEIGHT_STAGE_MEMORY = 320 * 2**20
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
    blocks = 2 * 8 * min(ROW_BLOCK, n) * r * max(1, int(threads))  # a row block's columns in double, per thread
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

    def shard_budget(self, n_shards: int) -> int:
        """The kernel columns one of ``n_shards`` shards may keep in memory."""
        return int(self.columns_budget // max(1, int(n_shards)))


def memory_plan(limit: int, source: str, n_samples: int, *, rank_max: int, rank_min: int, given_rank=None,
                threads: int = 1) -> MemoryPlan:  # fmt: skip
    """The :class:`MemoryPlan` of a two-stage fit of ``n_samples`` rows within ``limit`` bytes.

    ``rank_max``: the most landmarks the rows afford (:func:`~mwumkl_dist.solvers.two_stage.nystroem.rank_budget`),
    ``rank_min``: the adaptive rank's first level, ``given_rank``: ``n_components`` when an int.  Raises
    :class:`MemoryLimitError` where even ``rank_min`` (or the given rank) does not fit.
    """
    n = int(n_samples)
    free = int(limit) - WEIGHT_STAGE_MEMORY
    wanted = int(given_rank) if given_rank is not None else min(int(rank_min), n)
    need = _driver_bytes(min(wanted, n), n, threads)
    if need > free:
        what = f"n_components={given_rank}" if given_rank is not None else f"its smallest rank ({wanted} landmarks)"
        raise MemoryLimitError(
            f"memory_limit ({source}: {format_bytes(limit)}) is too small for the two-stage fit of {n} rows at "
            f"{what}: it needs about {format_bytes(need + WEIGHT_STAGE_MEMORY)}; pass a larger memory_limit"
            + (" or a smaller n_components" if given_rank is not None else "")
        )
    if given_rank is not None:
        cap = min(int(given_rank), n)
    else:  # the largest rank whose arrays fit (a root of the quadratic, then checked)
        cap = min(int(rank_max), n)
        while cap > wanted and _driver_bytes(cap, n, threads) > free:
            cap = max(wanted, int(cap * math.sqrt(free / _driver_bytes(cap, n, threads))) - 1)
    columns = max(0, free - _driver_bytes(cap, n, threads))
    exact = 8 * n * n * 1.25 <= free  # the Gram matrix and LIBSVM's cache of its rows
    return MemoryPlan(int(limit), source, int(cap), int(columns), bool(exact))
