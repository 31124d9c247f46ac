"""A binary training problem: the data (features or precomputed kernels) and +1/-1 labels.

A problem knows how to cut itself into shards and how to evaluate the kernel
values between two chosen points; engines decide where the shards live.
"""

from __future__ import annotations

import numpy as np

from .kernels import KernelSet
from .shard import FeatureShard, PrecomputedShard, as_csr, point_kernel_block

__all__ = ["FeatureProblem", "PrecomputedProblem"]


class FeatureProblem:
    """Feature rows ``X`` (dense or CSR) with a :class:`KernelSet` computed on the fly."""

    def __init__(self, X, y, kernel_set: KernelSet):
        self.X = as_csr(X)
        self.y = np.asarray(y, dtype=np.float64)
        self.kernel_set = kernel_set
        self.n_samples = self.X.shape[0]
        self.n_kernels = len(kernel_set)

    def make_shard(self, start: int, stop: int) -> FeatureShard:
        return FeatureShard(self.X[start:stop], self.y[start:stop], start, self.kernel_set.plan)

    def kernel_block(self, p, q):
        return point_kernel_block(self.kernel_set.plan, p, q)


class PrecomputedProblem:
    """Precomputed kernel matrices ``K`` of shape ``(m, n, n)``."""

    def __init__(self, K, y):
        self.K = K
        self.y = np.asarray(y, dtype=np.float64)
        self.n_kernels, self.n_samples = K.shape[0], K.shape[1]

    def make_shard(self, start: int, stop: int) -> PrecomputedShard:
        return PrecomputedShard(self.K[:, start:stop, :], self.y[start:stop], start)

    def kernel_block(self, p, q):
        p, q = int(p), int(q)
        K = self.K
        return np.asarray(K[:, p, p]), np.asarray(K[:, q, q]), np.asarray(K[:, p, q])
