"""A binary training problem: the data (features or precomputed kernels) and +1/-1 labels.

A problem knows how to cut itself into shards and how to evaluate the kernel
values between two chosen points; engines decide where the shards live.
"""

from __future__ import annotations

import numpy as np

from .kernels import KernelSet
from .shard import FeatureShard, PrecomputedShard, as_csr, point_kernel_block, split_rows

__all__ = ["FeatureProblem", "PrecomputedProblem", "chain_safe_ranges"]


def chain_safe_ranges(square_of: np.ndarray, n_blocks: int) -> list[tuple[int, int]]:
    """Near-equal kernel ranges whose boundaries never split a Gaussian squaring chain.

    A block then evaluates every kernel exactly as the whole set does (same
    chains, same rounding), so kernel-sharded fits match the local engine.
    """
    m = len(square_of)
    root = np.arange(m)
    for i in range(m):
        while square_of[root[i]] >= 0:
            root[i] = square_of[root[i]]
    lo = np.full(m, m)
    hi = np.full(m, -1)
    np.minimum.at(lo, root, np.arange(m))
    np.maximum.at(hi, root, np.arange(m))
    # Boundary b (between kernels b-1 and b) is inside a chain's span when lo < b <= hi.
    inside = np.zeros(m + 2, np.int64)
    chains = hi >= 0
    np.add.at(inside, lo[chains] + 1, 1)
    np.add.at(inside, hi[chains] + 1, -1)
    valid = np.flatnonzero(np.cumsum(inside)[: m + 1] == 0)
    bounds = [0]
    for target in np.linspace(0, m, min(int(n_blocks), m) + 1)[1:-1]:
        b = int(valid[np.argmin(np.abs(valid - target))])
        if b > bounds[-1] and b < m:
            bounds.append(b)
    bounds.append(m)
    return list(zip(bounds[:-1], bounds[1:]))


class FeatureProblem:
    """Feature rows ``X`` (dense or CSR) with a :class:`KernelSet` computed on the fly."""

    def __init__(self, X, y, kernel_set: KernelSet):
        self.X = as_csr(X)
        self.y = np.asarray(y, dtype=np.float64)
        self.kernel_set = kernel_set
        self.n_samples = self.X.shape[0]
        self.n_kernels = len(kernel_set)

    def make_shard(self, start: int, stop: int, kernels: tuple[int, int] | None = None) -> FeatureShard:
        """Rows ``[start, stop)`` for all kernels, or for the kernel block ``kernels = (k0, k1)``."""
        plan = self.kernel_set.plan
        if kernels is not None and tuple(kernels) != (0, self.n_kernels):
            plan = KernelSet(self.kernel_set.specs[kernels[0] : kernels[1]], self.kernel_set.n_features).plan
        return FeatureShard(self.X[start:stop], self.y[start:stop], start, plan)

    def kernel_ranges(self, n_blocks: int) -> list[tuple[int, int]]:
        return chain_safe_ranges(self.kernel_set.plan.square_of, n_blocks)

    def kernel_block(self, p, q):
        return point_kernel_block(self.kernel_set.plan, p, q)

    def point(self, j: int) -> np.ndarray:
        """Row ``j`` as a dense feature vector (what a superstep sends for a picked row)."""
        return np.asarray(self.X[j].toarray()).ravel()


class PrecomputedProblem:
    """Precomputed kernel matrices ``K`` of shape ``(m, n, n)``."""

    def __init__(self, K, y):
        self.K = K
        self.y = np.asarray(y, dtype=np.float64)
        self.n_kernels, self.n_samples = K.shape[0], K.shape[1]

    def make_shard(self, start: int, stop: int, kernels: tuple[int, int] | None = None) -> PrecomputedShard:
        k0, k1 = (0, self.n_kernels) if kernels is None else kernels
        return PrecomputedShard(self.K[k0:k1, start:stop, :], self.y[start:stop], start)

    def kernel_ranges(self, n_blocks: int) -> list[tuple[int, int]]:
        return split_rows(self.n_kernels, n_blocks)

    def kernel_block(self, p, q):
        p, q = int(p), int(q)
        K = self.K
        return np.asarray(K[:, p, p]), np.asarray(K[:, q, q]), np.asarray(K[:, p, q])

    def point(self, j: int) -> int:
        return int(j)
