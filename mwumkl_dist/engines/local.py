"""The local engine: shards in this process (one by default; several to test sharding)."""

from __future__ import annotations

import numpy as np

from mwumkl_dist.core.exact import exact_to_float
from mwumkl_dist.core.mwu_rules import Candidate, check_ridge, class_totals, reduce_candidates, ridge_rows

__all__ = ["LocalEngine"]


class LocalEngine:
    """Runs a problem's shards in-process; implements :class:`mwumkl_dist.engines.base.Engine`."""

    def __init__(self, problem, n_shards: int = 1):
        self.problem = problem
        self.n_samples = problem.n_samples
        self.n_kernels = problem.n_kernels
        self.shards = [problem.make_shard(a, b) for a, b in problem.row_ranges(n_shards)]

    def traces(self) -> np.ndarray:
        parts = [s.trace_parts() for s in self.shards]
        return exact_to_float([sum(col) for col in zip(*parts)])

    def configure(self, inv_trace: np.ndarray, ridge) -> None:
        """``1 / r_i`` and the ridge: a float, or per point (each shard gets its rows' values)."""
        ridge = check_ridge(ridge, self.n_samples)
        for s in self.shards:
            s.configure(inv_trace, ridge_rows(ridge, s.row_offset, s.row_offset + s.n_rows))

    @staticmethod
    def _reduce(pairs) -> tuple[Candidate, Candidate]:
        pairs = list(pairs)
        return reduce_candidates([p for p, _ in pairs]), reduce_candidates([n for _, n in pairs])

    def initial_candidates(self) -> tuple[Candidate, Candidate]:
        return self._reduce(s.initial_candidates() for s in self.shards)

    def kernel_block(self, pos: Candidate, neg: Candidate):
        return self.problem.kernel_block(pos.point, neg.point)

    def superstep(self, pos: Candidate, neg: Candidate, coef: np.ndarray) -> tuple[Candidate, Candidate]:
        return self._reduce(s.superstep(pos.index, neg.index, pos.point, neg.point, coef) for s in self.shards)

    def class_sums(self, weights: np.ndarray) -> tuple[float, float]:
        return class_totals([s.support_margins(weights) for s in self.shards], self.problem.y)

    def replay(self, picks) -> None:
        points = {j: self.problem.point(j) for pick in picks for j in pick}
        for s in self.shards:
            s.replay(picks, points)

    def stats(self) -> list[dict]:
        """Each shard's counters (:meth:`shard.stats`, e.g. a kernel store's column cache)."""
        return [s.stats() for s in self.shards]

    def alpha_counts(self) -> np.ndarray:
        return np.concatenate([s.alpha_counts() for s in self.shards])

    def close(self) -> None:
        """Drop the shards (nothing else to release in this process)."""
        self.shards = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
