"""Kernel tiles: every thread count, row shard, kernel shard and block gives the same bits, ties included."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from conftest import literal

from mwumkl_dist import MWUMKLClassifier
from mwumkl_dist.core import partition
from mwumkl_dist.core.partition import chain_safe_ranges, kernel_tiles
from mwumkl_dist.data.shards import FeatureShard, PrecomputedShard, sum_tile_partials
from mwumkl_dist.devices import cpu as _columns
from mwumkl_dist.kernels import Gaussian, KernelSet, Linear, Polynomial
from mwumkl_dist.kernels.evaluation import plan_args


def test_tiles_are_fixed_chain_safe_and_kernel_ranges_follow_them(monkeypatch):
    plan = KernelSet("paper-per-feature", 11).plan  # 132 kernels with squaring chains
    tiles = kernel_tiles(plan.square_of)
    assert tiles[0] == 0 and tiles[-1] == plan.n_kernels and np.all(np.diff(tiles) >= partition.TILE_KERNELS - 11)
    tile_of = np.searchsorted(tiles, np.arange(plan.n_kernels), "right")
    linked = plan.square_of >= 0
    assert np.all(tile_of[linked] == tile_of[plan.square_of[linked]])
    assert kernel_tiles(12).tolist() == [0, 12] and kernel_tiles(130).tolist() == [0, 64, 128, 130]
    for n_blocks in range(1, 6):
        ranges = chain_safe_ranges(plan.square_of, n_blocks)
        assert ranges[0][0] == 0 and ranges[-1][1] == plan.n_kernels
        assert all(a in tiles for a, _ in ranges) and len(ranges) == min(n_blocks, len(tiles) - 1)
    assert chain_safe_ranges(12, 3) == [(0, 12)]  # one tile: one block
    monkeypatch.setattr(partition, "TILE_KERNELS", 4)
    assert chain_safe_ranges(12, 3) == [(0, 4), (4, 8), (8, 12)]


def _many_groups(n_kernels=150, d=10, seed=0):
    """Kernels on random feature subsets: ~one group per kernel, several tiles, chains inside tiles."""
    rng = np.random.default_rng(seed)
    specs = []
    while len(specs) < n_kernels:
        f = tuple(int(v) for v in np.sort(rng.choice(d, 3, replace=False)))
        kind = len(specs) % 5
        if kind == 0:
            specs.append(Linear(features=f))
        elif kind == 1:
            specs.append(Polynomial(degree=2, coef0=1.0, features=f))
        else:  # sigma, sigma / sqrt(2): a squaring chain
            specs += [Gaussian(sigma=1.0, features=f), Gaussian(sigma=2**-0.5, features=f)]
    return KernelSet(specs[:n_kernels], d)


def _run_shard(X, y, plan, layouts, monkeypatch, steps=12, path="dense"):
    rng = np.random.default_rng(5)
    pos, neg = np.flatnonzero(y > 0), np.flatnonzero(y < 0)
    picks = [(int(rng.choice(pos)), int(rng.choice(neg))) for _ in range(steps)]
    coef = -rng.random(plan.n_kernels)
    out = []
    for layout in layouts:
        monkeypatch.setattr(_columns.superstep, "_layout", lambda n, t, m, layout=layout: layout)
        shard = FeatureShard(X, y, 0, plan)
        if path != "dense":  # force the column pass (CSC copy) or the row pass (CSR only)
            C = X.tocsc()
            C.sort_indices()
            shard._dense_t, shard._csc = None, ((C.indptr, C.indices, C.data) if path == "csc" else None)
        shard.configure(1.0 / shard.diagonal().sum(axis=0), 1e-3)
        got = []
        for ip, iq in picks:
            a, b = shard.superstep(ip, iq, shard.point(ip), shard.point(iq), coef)
            got.append((a.index, a.g, b.index, b.g))
        out.append((got, shard.V.copy(), shard._workspace.partial.copy()))
    for got, V, partial in out[1:]:
        assert got == out[0][0]
        np.testing.assert_array_equal(V, out[0][1])
        np.testing.assert_array_equal(partial, out[0][2])
    return out[0]


reference: dict = {}

# (chunks, row blocks): serial, and parallel runs with several tasks per chunk and more chunks than threads.
LAYOUTS = [(1, 1), (2, 1), (2, 3), (3, 5), (5, 2)]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("path", ["dense", "csc", "rows"])
def test_thread_layouts_are_bit_identical_with_many_groups(monkeypatch, path):
    rng = np.random.default_rng(1)
    X = rng.random((301, 10)) * (rng.random((301, 10)) < 0.6)
    y = np.where(X[:, 0] + X[:, 1] > 0.6, 1.0, -1.0)
    ks = _many_groups()
    assert ks.plan.n_groups > 40 and len(kernel_tiles(ks.plan.square_of)) > 2
    got, V, partial = _run_shard(sp.csr_matrix(X), y, ks.plan, LAYOUTS, monkeypatch, path=path)
    reference[path] = (got, V)
    if len(reference) == 3:  # the three dot paths agree too
        for other in ("csc", "rows"):
            assert reference[other][0] == reference["dense"][0]
            np.testing.assert_array_equal(reference[other][1], reference["dense"][1])
    # g is the tile partials added in tile order; the picked rows are its per-class argmax
    g = sum_tile_partials([partial])
    for cls, (idx, score) in ((1.0, got[-1][:2]), (-1.0, got[-1][2:])):
        rows = np.flatnonzero(y == cls)
        assert idx == rows[np.argmax(g[rows])] and score == g[idx]


@pytest.mark.timeout(300)
def test_thread_layouts_are_bit_identical_with_one_group_and_several_tiles(monkeypatch):
    rng = np.random.default_rng(2)
    X = sp.random(400, 30, density=0.1, random_state=3, format="csr")
    y = np.where(rng.random(400) < 0.4, 1.0, -1.0)
    sigmas = 2.0 ** (np.arange(-40, 100) / 4)  # 140 Gaussians on all features, squaring chains among them
    ks = KernelSet([Gaussian(sigma=float(s)) for s in sigmas] + [Linear()], 30)
    assert ks.plan.n_groups == 1
    by_columns = _run_shard(X, y, ks.plan, LAYOUTS, monkeypatch, path="csc")
    by_rows = _run_shard(X, y, ks.plan, LAYOUTS, monkeypatch, path="rows")
    assert by_columns[0] == by_rows[0]
    np.testing.assert_array_equal(by_columns[1], by_rows[1])


def _tied_data(n_distinct=30, copies=4, d=7, seed=0):
    """Every distinct row several times, with both labels: exact ties in g within each class."""
    rng = np.random.default_rng(seed)
    base = np.round(rng.random((n_distinct, d)), 1)
    X = np.repeat(base, copies, axis=0)
    y = np.where(base[:, 0] + base[:, 1] > 1.0, 1, -1).repeat(copies)
    y[::copies] *= -1  # one copy of each row with the other label
    perm = rng.permutation(len(X))
    return X[perm], y[perm]


def _a9a_like(n_distinct=40, copies=4, d=30, seed=1):
    rng = np.random.default_rng(seed)
    base = (rng.random((n_distinct, d)) < 0.15).astype(float)
    X = np.repeat(base, copies, axis=0)
    y = np.where(base[:, :5].sum(axis=1) >= 1, 1, -1).repeat(copies)
    y[1::copies] *= -1
    perm = rng.permutation(len(X))
    return sp.csr_matrix(X[perm]), y[perm]


def _same(a, b):
    for name in ("dual_coef_", "support_", "intercept_", "kernel_weights_"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name


@pytest.fixture(scope="module")
def threaded_client():
    distributed = pytest.importorskip("distributed")
    with distributed.Client(processes=False, n_workers=2, threads_per_worker=1, dashboard_address=":0") as client:
        yield client


@pytest.mark.timeout(600)
@pytest.mark.filterwarnings("error:n_kernel_shards")  # fewer kernel blocks than asked would make this vacuous
@pytest.mark.parametrize("case", ["duplicated", "a9a-like"])
def test_every_layout_is_bit_identical_on_tied_data(monkeypatch, threaded_client, case):
    if case == "duplicated":
        X, y = _tied_data()
        kernels = "paper-per-feature"  # 84 kernels: two tiles (72, 12)
        layouts = [(1, 2), (3, 2)]
    else:
        X, y = _a9a_like()
        # 12 kernels without squaring chains on sparse binary data; tiles of 4 (this process only,
        # where the threaded client's shards live): three tiles
        kernels = "linear,poly:2,poly:3,gaussian:0.7,gaussian:1.3,gaussian:2.9,gaussian:6,linear@0-9,poly:2@5-20,"
        kernels += "gaussian:1@0-14,gaussian:3@10-29,linear@20-29"
        monkeypatch.setattr(partition, "TILE_KERNELS", 4)
        layouts = [(1, 2), (1, 3), (3, 3)]
    params = dict(kernels=kernels, **literal(epsilon=0.4))
    ref = MWUMKLClassifier(**params).fit(X, y)
    if case == "a9a-like":  # threads (several tasks per thread) on tied data; the layouts are tested above
        monkeypatch.setattr(_columns.pool, "PARALLEL_MIN_WORK", 256)
        with _columns.thread_limit(2):
            _same(ref, MWUMKLClassifier(**params).fit(X, y))
    for n_shards in (2, 3, 4):
        _same(ref, MWUMKLClassifier(**params, n_shards=n_shards).fit(X, y))
    for n_shards, n_kernel_shards in layouts:
        clf = MWUMKLClassifier(
            **params, engine="dask", client=threaded_client, n_shards=n_shards, n_kernel_shards=n_kernel_shards
        ).fit(X, y)
        _same(ref, clf)


@pytest.mark.timeout(300)
def test_precomputed_shards_sum_tiles_like_feature_shards(monkeypatch):
    monkeypatch.setattr(partition, "TILE_KERNELS", 3)
    rng = np.random.default_rng(4)
    n, m = 40, 8
    A = rng.random((m, n, 5))
    K = np.einsum("mif,mjf->mij", A, A)
    y = np.where(rng.random(n) < 0.5, 1.0, -1.0)
    whole = PrecomputedShard(K, y, 0)
    blocks = [PrecomputedShard(K[a:b], y, 0) for a, b in chain_safe_ranges(m, 3)]
    assert len(blocks) == 3
    coef = -rng.random(m)
    inv = 1.0 / np.einsum("mii->m", K)
    whole.configure(inv, 1e-2)
    start = 0
    for blk in blocks:
        blk.configure(inv[start : start + blk.n_kernels], 1e-2)
        start += blk.n_kernels
    for _ in range(10):
        ip, iq = int(rng.choice(np.flatnonzero(y > 0))), int(rng.choice(np.flatnonzero(y < 0)))
        full = whole.superstep_scores(ip, iq, ip, iq, coef)
        parts, start = [], 0
        for blk in blocks:
            parts.append(blk.superstep_scores(ip, iq, ip, iq, coef[start : start + blk.n_kernels]))
            start += blk.n_kernels
        assert full.shape == (3, n)
        np.testing.assert_array_equal(sum_tile_partials(parts), sum_tile_partials([full]))


@pytest.mark.timeout(300)
def test_kernel_blocks_scores_add_up_to_the_whole_shards_bits(monkeypatch):
    """Every row's g (not only the argmax): blocks' tile partials, added in order, equal one shard's bits."""
    from mwumkl_dist.data.problems import FeatureProblem

    monkeypatch.setattr(partition, "TILE_KERNELS", 8)
    rng = np.random.default_rng(6)
    X = rng.random((90, 10))
    y = np.where(rng.random(90) < 0.5, 1.0, -1.0)
    problem = FeatureProblem(X, y, _many_groups(n_kernels=40))
    ranges = problem.kernel_ranges(3)
    assert len(ranges) == 3
    whole = problem.make_shard(0, 90)
    blocks = [[problem.make_shard(r0, r1, k) for k in ranges] for r0, r1 in [(0, 50), (50, 90)]]
    inv = 1.0 / whole.diagonal().sum(axis=0)
    coef = -rng.random(problem.n_kernels)
    whole.configure(inv, 1e-2)
    for row in blocks:
        for (k0, k1), blk in zip(ranges, row):
            blk.configure(inv[k0:k1], 1e-2)
    for _ in range(8):
        ip, iq = int(rng.choice(np.flatnonzero(y > 0))), int(rng.choice(np.flatnonzero(y < 0)))
        p, q = problem.point(ip), problem.point(iq)
        g = sum_tile_partials([whole.superstep_scores(ip, iq, p, q, coef)])
        parts = [
            sum_tile_partials([blk.superstep_scores(ip, iq, p, q, coef[k0:k1]) for (k0, k1), blk in zip(ranges, row)])
            for row in blocks
        ]
        np.testing.assert_array_equal(np.concatenate(parts), g)
    # a plain sum over all kernels (no tiles) rounds differently on these rows: the test can tell
    assert not np.array_equal(whole.V @ coef, g)


def _bank_across_tiles():
    """A random bank on 6 features: 15 subsets x 9 widths, so squaring chains and repeated kernels lie in many tiles."""
    from mwumkl_dist.kernels import RandomGaussianBank

    return KernelSet(RandomGaussianBank(300, 2, 4), 6)


def test_bank_tiles_are_short_and_values_are_evaluated_once(monkeypatch):
    from mwumkl_dist.kernels import RandomGaussianBank

    # 7 squaring chains among 20000 kernels once made one tile of 19280 kernels (its scratch and its thread).
    tiles = kernel_tiles(KernelSet(RandomGaussianBank(20000, 5, 0), 60).plan.square_of)
    assert np.diff(tiles).max() < 2 * partition.TILE_KERNELS and len(tiles) - 1 > 20000 // (2 * partition.TILE_KERNELS)
    monkeypatch.setattr(partition, "TILE_KERNELS", 16)
    plan = _bank_across_tiles().plan
    tiles = kernel_tiles(plan.square_of)
    tile_of = np.searchsorted(tiles, np.arange(plan.n_kernels), "right")
    linked = plan.square_of >= 0
    assert np.any(tile_of[linked] != tile_of[plan.square_of[linked]])  # chains cross tiles
    (vtile_ptr, vkind, vpa, vpb, kslot), maps = _columns.value_plan(tiles, *plan_args(plan))
    distinct = {(int(g), float(a)) for g, a in zip(plan.group, plan.param_a)}
    assert vtile_ptr[-1] == len(distinct) < plan.n_kernels  # one evaluation per distinct (subset, width)
    pre_pass = len(tiles) - 1  # value tile n_tiles: the values several tiles need
    assert vtile_ptr[pre_pass + 1] > vtile_ptr[pre_pass]
    tg_ptr, tg_group, lgrp = maps[2], maps[3], maps[4]
    for i, u in enumerate(kslot):  # each kernel reads a value of its own width and feature group
        t, v = (tile_of[i] - 1, vtile_ptr[tile_of[i] - 1] + u) if u >= 0 else (pre_pass, vtile_ptr[pre_pass] - 1 - u)
        assert vpa[v] == plan.param_a[i] and tg_group[tg_ptr[t] + lgrp[v]] == plan.group[i]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("path", ["dense", "csc", "rows"])
def test_chains_across_tiles_give_the_one_tile_values(monkeypatch, path):
    """V does not depend on the tiles: many tiles (chains and repeats across them) equal one tile, bit for bit."""
    from conftest import explicit_kernels

    rng = np.random.default_rng(7)
    X = rng.random((70, 6)) * (rng.random((70, 6)) < 0.7)
    y = np.where(X[:, 0] + X[:, 1] > 0.7, 1.0, -1.0)
    ks = _bank_across_tiles()
    monkeypatch.setattr(partition, "TILE_KERNELS", 10**6)
    _, V_one, _ = _run_shard(sp.csr_matrix(X), y, ks.plan, [(1, 1)], monkeypatch, path=path)
    monkeypatch.setattr(partition, "TILE_KERNELS", 16)
    got, V, partial = _run_shard(sp.csr_matrix(X), y, ks.plan, LAYOUTS, monkeypatch, path=path)
    assert partial.shape[0] == -(-ks.plan.n_kernels // 16)
    np.testing.assert_array_equal(V, V_one)
    # against the textbook formula: V = sum over picks of (G[:, ip] + G[:, iq]) / 2 (ridge 1e-3, traces n)
    K = explicit_kernels(list(ks.specs), X)
    rng = np.random.default_rng(5)
    pos, neg = np.flatnonzero(y > 0), np.flatnonzero(y < 0)
    want = np.zeros_like(V)
    for ip, iq in [(int(rng.choice(pos)), int(rng.choice(neg))) for _ in range(12)]:
        for j, yj in ((ip, 1.0), (iq, -1.0)):
            want += 0.5 * (y[:, None] * yj * K[:, :, j].T / len(y))
            want[j] += 0.5e-3
    np.testing.assert_allclose(V, want, rtol=1e-11, atol=1e-15)


def test_predictor_with_chains_across_tiles(monkeypatch):
    from conftest import explicit_kernels

    from mwumkl_dist.kernels.evaluation import support_vector_sums

    rng = np.random.default_rng(8)
    X, S = rng.random((30, 6)), rng.random((11, 6))
    ks = _bank_across_tiles()
    coef, w = rng.standard_normal((2, 11)), rng.random((2, ks.plan.n_kernels))
    w[:, ::7] = 0.0  # kernels left out of the prediction (their squares keep their sources)
    monkeypatch.setattr(partition, "TILE_KERNELS", 10**6)
    one = support_vector_sums(ks.plan, X, S, coef, w)
    monkeypatch.setattr(partition, "TILE_KERNELS", 16)
    many = support_vector_sums(ks.plan, X, S, coef, w)
    np.testing.assert_array_equal(many, one)
    K = explicit_kernels(list(ks.specs), X, S)
    np.testing.assert_allclose(many, np.einsum("ki,itj,kj->tk", w, K, coef), rtol=1e-11)


def test_threads_split_rows_or_tiles_in_balanced_runs(monkeypatch):
    monkeypatch.setattr(_columns.superstep, "threads_for", lambda work: 2)
    assert _columns.superstep._layout(6500, 4, 240) == (2, 2)  # many rows: a row block per thread
    assert _columns.superstep._layout(166, 4, 240) == (2, 1)  # few rows: the tiles are split
    assert _columns.superstep._layout(166, 1, 12) == (2, 2)  # one tile: the rows are split anyway
    plan = KernelSet("paper-per-feature", 20).plan
    ws = _columns.superstep_workspace(166, *plan_args(plan))
    assert np.diff(ws.tile_ptr).tolist() == [72, 72, 72, 24]
    for n_chunks, n_rb in [(2, 1), (3, 1), (2, 2), (5, 2), (7, 3)]:
        bounds = ws.chunks(n_chunks, n_rb)
        assert bounds[0] == 0 and bounds[-1] == n_rb * ws.n_tiles and np.all(np.diff(bounds) >= 0)
        rows = np.diff(np.arange(n_rb + 1) * 166 // n_rb)
        work = np.outer(rows, np.diff(ws.tile_ptr)).ravel()  # rows x kernels of each task, row-block major
        done = np.concatenate([[0], np.cumsum(work)])[bounds]
        assert np.all(np.abs(done - done[-1] * np.arange(n_chunks + 1) / n_chunks) <= work.max() / 2)
