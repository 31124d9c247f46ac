"""How rows and kernels are cut into shards, blocks and tiles.

Row shards are contiguous ranges (:func:`split_rows`), on a store's chunk
boundaries when the data come from one (:func:`aligned_ranges`); kernels are
cut into tiles of about :data:`TILE_KERNELS` (:func:`kernel_tiles`), and
kernel blocks fall on tile boundaries that split no Gaussian squaring chain
(:func:`chain_safe_ranges`), so every layout evaluates each kernel with the
same operations and sums the scores in the same order.

Sums over row blocks whose parts are too large to send one per block (the
two-stage solver's Hessians) follow one binary tree over the global block
indices (:func:`dyadic_nodes`, :func:`tree_total`): a shard adds its blocks
within the tree's nodes it holds whole, the driver adds the nodes, and the
total has the same bits for any sharding.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "split_rows",
    "aligned_ranges",
    "chain_safe_ranges",
    "chain_roots",
    "kernel_tiles",
    "TILE_KERNELS",
    "ROW_BLOCK",
    "row_blocks",
    "linear_row_ranges",
    "dyadic_nodes",
    "tree_total",
]

#: Kernels per tile (a tile runs on, by less than as many again, to a boundary that cuts no Gaussian
#: squaring chain when there is one).  Scores are summed per tile and then over tiles in tile order, so
#: this constant is part of the numbers: a model with at most this many kernels is summed exactly as
#: before tiles.  Read at call time (tests set it lower to get many tiles from few kernels).
TILE_KERNELS = 64

#: Rows per block of the two-stage solver's kernel evaluations (``block x n_landmarks`` values per kernel
#: at a time). Its shards start on block boundaries and every sum runs over blocks in row order.
ROW_BLOCK = 8192


def split_rows(n: int, n_shards: int) -> list[tuple[int, int]]:
    """Contiguous, near-equal row ranges ``[(start, stop), ...]``."""
    if int(n_shards) != n_shards or n_shards < 1:
        raise ValueError(f"n_shards must be a positive integer, got {n_shards!r}")
    n_shards = min(int(n_shards), n)
    bounds = np.linspace(0, n, n_shards + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


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


def chain_safe_ranges(square_of, n_blocks: int) -> list[tuple[int, int]]:
    """Near-equal kernel ranges on kernel-tile boundaries that split no Gaussian squaring chain.

    ``square_of`` is the plan's array, or the kernel count for kernels without
    chains (precomputed kernels, kernel stores).  The boundaries are those of
    :func:`kernel_tiles` (tiles of about :data:`TILE_KERNELS` kernels) where
    no chain is cut: a block's own plan then has every chain of its kernels,
    evaluates every kernel exactly as the whole set does (same chains, same
    rounding) and returns whole tiles' score partials, which the driver adds
    in tile order, so kernel-sharded fits are bit-identical to the local
    engine, ties included.  Fewer blocks than asked come back when there are
    fewer such boundaries (at most 64 kernels, or squaring chains across the
    whole set as in a random bank on few features: one block).
    """
    if int(n_blocks) != n_blocks or n_blocks < 1:
        raise ValueError(f"n_blocks must be a positive integer, got {n_blocks!r}")
    tiles = kernel_tiles(square_of)
    tiles = tiles[np.isin(tiles, _chain_safe_boundaries(_as_square_of(square_of)))]
    m, n_tiles = int(tiles[-1]), len(tiles) - 1
    n_blocks = min(int(n_blocks), n_tiles)
    cut = [0]  # indices into tiles
    for k in range(1, n_blocks):
        # the boundary nearest the even split that leaves one for each block still to come
        options = np.arange(cut[-1] + 1, n_tiles - (n_blocks - k) + 1)
        cut.append(int(options[np.argmin(np.abs(tiles[options] - k * m / n_blocks))]))
    cut.append(n_tiles)
    bounds = [int(tiles[c]) for c in cut]
    return list(zip(bounds[:-1], bounds[1:]))


def chain_roots(square_of) -> tuple[np.ndarray, np.ndarray]:
    """Each kernel's chain root and depth (``K_i = K_root ** (2 ** depth)``) from a plan's ``square_of``.

    All kernels step to their sources together, once per chain level (a few), not kernel by kernel.
    """
    square_of = np.asarray(square_of, dtype=np.int64)
    root = np.arange(len(square_of), dtype=np.int64)
    depth = np.zeros(len(square_of), np.int64)
    active = np.flatnonzero(square_of >= 0)
    while len(active):
        root[active] = square_of[root[active]]
        depth[active] += 1
        active = active[square_of[root[active]] >= 0]
    return root, depth


def _as_square_of(square_of) -> np.ndarray:
    """A plan's ``square_of``, or ``m`` chain-free kernels' (all ``-1``)."""
    return np.full(int(square_of), -1) if np.ndim(square_of) == 0 else np.asarray(square_of)


def _chain_safe_boundaries(square_of) -> np.ndarray:
    """Kernel boundaries ``b`` (between kernels ``b-1`` and ``b``, ``0..m``) that split no squaring chain."""
    square_of = np.asarray(square_of)
    m = len(square_of)
    if m == 0 or not np.any(square_of >= 0):
        return np.arange(m + 1)
    root, _ = chain_roots(square_of)
    lo = np.full(m, m)
    hi = np.full(m, -1)
    np.minimum.at(lo, root, np.arange(m))
    np.maximum.at(hi, root, np.arange(m))
    # Boundary b is inside a chain's span when lo < b <= hi.
    inside = np.zeros(m + 2, np.int64)
    chains = hi >= 0
    np.add.at(inside, lo[chains] + 1, 1)
    np.add.at(inside, hi[chains] + 1, -1)
    return np.flatnonzero(np.cumsum(inside)[: m + 1] == 0)


def kernel_tiles(square_of) -> np.ndarray:
    """Tile boundaries ``[0, b1, ..., m]`` of a kernel plan (``square_of``, or ``m`` without chains).

    Tiles hold :data:`TILE_KERNELS` kernels each (the last fewer); a tile
    runs on to the next boundary where no Gaussian squaring chain is cut when
    that comes before ``2 * TILE_KERNELS`` kernels, so kernel sets with short
    chains (per-feature families) have tiles that keep their chains and can
    be cut into kernel blocks there.  Chains that a tile boundary still cuts
    (a random bank's, whose members lie anywhere) cost nothing: the
    superstep evaluates the values that several tiles need in a pre-pass
    (:func:`mwumkl_dist.devices.cpu.value_plan`).  A function of the plan
    only: every shard, block, thread count and engine cuts the kernels the
    same way, and a kernel block that starts on a tile boundary tiles its
    kernels exactly as the whole set does.
    """
    valid = _chain_safe_boundaries(_as_square_of(square_of))
    m = int(valid[-1])
    bounds = [0]
    while bounds[-1] < m:
        target = bounds[-1] + TILE_KERNELS
        if target >= m:
            bounds.append(m)
            continue
        safe = int(valid[np.searchsorted(valid, target)])
        bounds.append(safe if safe < target + TILE_KERNELS else target)
    return np.asarray(bounds, np.int64)


def row_blocks(start: int, stop: int, row_block: int = ROW_BLOCK) -> list[tuple[int, int]]:
    """The fixed row blocks of rows ``[start, stop)``: ``row_block`` rows each, from ``start`` (a multiple of it)."""
    return [(lo, min(lo + row_block, stop)) for lo in range(start, stop, row_block)]


def linear_row_ranges(n_samples: int, n_shards: int, row_block: int = ROW_BLOCK) -> list[tuple[int, int]]:
    """Row ranges of the two-stage solver's shards: on row-block boundaries (at most one shard per block)."""
    return aligned_ranges(n_samples, row_block, min(int(n_shards), -(-n_samples // row_block)))


def dyadic_nodes(start: int, stop: int) -> list[tuple[int, int]]:
    """The largest aligned dyadic intervals ``[k 2^j, (k + 1) 2^j)`` that cover ``[start, stop)``, left to right.

    Of ``[0, n)``: the roots of the block tree (one per bit of ``n``); of a
    shard's blocks ``[a, b)``: the tree nodes it holds whole (at most about
    ``2 log2(b - a)``).  Every aligned interval inside ``[0, n)`` is a node of
    the tree rooted at ``dyadic_nodes(0, n)``.
    """
    out, pos = [], int(start)
    while pos < stop:
        size = (pos & -pos) or (1 << max(int(stop - pos).bit_length() - 1, 0))
        while pos + size > stop:
            size >>= 1
        out.append((pos, pos + size))
        pos += size
    return out


def tree_total(nodes: dict, n_blocks: int, add=None):
    """The sum of all ``n_blocks`` block parts from node sums ``{(lo, hi): value}`` (None: nothing there).

    ``nodes`` holds, for every block, the sum of one tree node containing it
    (each shard's :func:`dyadic_nodes` of its blocks, summed by the shard with
    the same rule): a node missing from it is the sum of its two halves, the
    roots are added left to right.  ``add(a, b)`` adds two values (default ``a + b``).
    """
    add = (lambda a, b: a + b) if add is None else add

    def plus(a, b):
        return b if a is None else a if b is None else add(a, b)

    total = None
    for lo, hi in dyadic_nodes(0, n_blocks):
        total = plus(total, _node_total(nodes, lo, hi, plus))
    return total


def _node_total(nodes: dict, lo: int, hi: int, plus):
    """Node ``[lo, hi)``'s sum (:func:`tree_total`).  A module function, not a closure of ``tree_total``: a recursive
    closure refers to itself, a reference cycle that kept ``nodes`` (a Newton step's ``(r + 2) x (r + 1)`` parts,
    39 MB each at rank 2200) alive until the cyclic collector ran, which the arrays' bytes do not prompt (1.9 GB
    held at 20,000 rows)."""
    if (lo, hi) in nodes:
        return nodes[(lo, hi)]
    if hi - lo == 1:
        raise ValueError(f"no sum for row block {lo}")
    mid = lo + (hi - lo) // 2
    return plus(_node_total(nodes, lo, mid, plus), _node_total(nodes, mid, hi, plus))
