"""How rows and kernels are cut into shards and blocks.

Row shards are contiguous ranges (:func:`mwumkl_dist.shard.split_rows`), on
a store's chunk boundaries when the data come from one (:func:`aligned_ranges`);
kernel blocks never split a Gaussian squaring chain (:func:`chain_safe_ranges`),
so every layout evaluates each kernel with the same operations.
"""

from __future__ import annotations

import math

import numpy as np

from .shard import split_rows

__all__ = ["split_rows", "aligned_ranges", "chain_safe_ranges"]


def aligned_ranges(n: int, chunk: int, n_shards: int) -> list[tuple[int, int]]:
    """``n_shards`` contiguous ranges whose boundaries fall on multiples of ``chunk`` when possible."""
    n_chunks = math.ceil(n / chunk)
    n_shards = len(split_rows(n, n_shards))  # validates; at most n
    if n_shards > n_chunks:
        return split_rows(n, n_shards)
    bounds = [0]
    for i in range(1, n_shards):
        c = round(i * n / n_shards / chunk)  # the chunk boundary nearest the even split
        c = min(max(c, bounds[-1] + 1), n_chunks - (n_shards - i))  # at least one chunk per shard
        bounds.append(c)
    edges = [b * chunk for b in bounds] + [n]
    return list(zip(edges[:-1], edges[1:]))


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
