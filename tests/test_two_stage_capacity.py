"""The two-stage fit's capacity: the adaptive Nystroem rank, the incremental Newton solve, the block-tree sums."""

from __future__ import annotations

import functools
from dataclasses import replace

import numpy as np
import pytest
from _two_stage import smooth_rows, use_small_ranks

from mwumkl_dist import MWUMKLClassifier
from mwumkl_dist.core import partition
from mwumkl_dist.data.problems import make_training_input
from mwumkl_dist.engines.pool import LocalPool
from mwumkl_dist.kernels import KernelSet
from mwumkl_dist.kernels.evaluation import combined_kernel
from mwumkl_dist.solvers import driver, two_stage
from mwumkl_dist.solvers.two_stage import nystroem
from mwumkl_dist.solvers.two_stage import solver as two_stage_solver


def _data(n=600, d=3, seed=0):
    return smooth_rows(n, d, seed)


@pytest.fixture
def small_ranks(monkeypatch):
    """Ranks that start at 16 landmarks and may grow to 60: several levels on a few hundred rows."""
    use_small_ranks(monkeypatch)
    monkeypatch.setattr(nystroem, "PRODUCT_ROWS", 8)  # the driver's products in several blocks too


def test_rank_budget_and_levels():
    assert two_stage.rank_budget(300) == 300  # every row a landmark: the exact kernel
    assert two_stage.rank_budget(5000) == two_stage.RANK_MAX == 4096  # the r x r matrices' bound
    assert two_stage.rank_budget(10**9) == two_stage.N_COMPONENTS  # never below the start
    # single-precision columns within 2 GiB: 5368 landmarks at 10^5 rows, 536 at 10^6
    assert [two_stage.rank_budget(n) for n in (10**5, 10**6)] == [4096, 536]
    assert two_stage.rank_budget(10**6, column_bytes=8) == two_stage.N_COMPONENTS  # 268 in double: the start
    assert two_stage.rank_levels(500, 1952) == [500, 1000, 1952]
    assert two_stage.rank_levels(500, 500) == [500]
    assert two_stage.rank_levels(500, 300) == [300]


def test_landmarks_are_nested_and_deterministic():
    order = two_stage.landmark_order(1000, seed=4)
    np.testing.assert_array_equal(order, two_stage.landmark_order(1000, seed=4))
    assert sorted(order) == list(range(1000))
    small, large = two_stage.landmark_rows(1000, 50, 4), two_stage.landmark_rows(1000, 200, 4)
    assert set(small) <= set(large)


def test_residual_is_the_trace_of_the_nystroem_error_and_shrinks_with_nested_landmarks():
    X, _ = _data(400)
    ks = KernelSet("gaussian:0.1,poly:2", X.shape[1])
    w = np.array([0.7, 0.3])
    order = two_stage.landmark_order(len(X), seed=1)
    S = X[order[-100:]]
    K = combined_kernel(ks, S, S, w)
    previous = 1.0
    for r in (10, 20, 40, 80):
        fmap = two_stage.nystroem_map(ks, X[order[:r]], w)
        F = fmap.features(S)
        residual = two_stage.nystroem_residual(fmap, S)
        np.testing.assert_allclose(residual, np.trace(K - F @ F.T) / np.trace(K), rtol=1e-9, atol=1e-12)
        assert residual < previous
        previous = residual
    assert two_stage.nystroem_residual(two_stage.nystroem_map(ks, S, w), S) < 1e-9  # landmarks: exact


def _maps(X, y, kernels, **options):
    data = make_training_input(X, y, kernels, estimator=None)
    w = two_stage.unit_weights(np.ones(len(data.kernel_set)), two_stage.all_traces(data.kernel_set, X), len(y))
    solver = two_stage.TwoStageSolver(**options)
    return solver.choose_maps(data, two_stage.landmark_order(len(y), seed=0), [w])


def test_adaptive_rank_grows_while_the_residual_is_large_and_stops_at_the_cap(small_ranks):
    X, y = _data(900)
    cap = two_stage.rank_budget(900)
    assert cap == 60
    # A narrow Gaussian: the residual stays large, the rank doubles up to the cap.
    maps, residuals = _maps(X, y, "gaussian:0.03")
    first, chosen = maps[0]
    assert (first.n_columns, chosen.n_columns) == (16, cap) and residuals[0] > 0.1
    np.testing.assert_array_equal(first.landmarks, chosen.landmarks[:16])  # nested
    # A linear kernel on 3 features: rank 3 on any 16 landmarks, residual 0, no growth.
    maps, residuals = _maps(X, y, "linear")
    assert len(maps[0]) == 1 and maps[0][0].n_columns == 16 and maps[0][0].rank == 3 and residuals[0] < 1e-9
    # A smooth kernel: it stops at the first level whose residual is below the tolerance.
    maps, residuals = _maps(X, y, "gaussian:0.5", residual_tol=0.02)  # residual 0.06 on 16 landmarks, 0.009 on 32
    assert maps[0][-1].n_columns == 32 and residuals[0] <= 0.02
    # A fixed rank: that many landmarks, whatever the residual.
    maps, _ = _maps(X, y, "gaussian:0.03", n_components=40)
    assert maps[0][-1].n_columns == 40 and len(maps[0]) == 2  # 40 >= 2 x 16: started from 16


def _objective(v, F, y, C, c):
    h = np.maximum(0.0, 1.0 - y * (F @ v[:-1] + v[-1]))
    return 0.5 * v @ v + 0.5 * C * np.sum(c * h * h)


def _pool(columns, y, c, bases, n_shards=1):
    slots = partition.linear_row_ranges(len(y), n_shards, 64)
    pool = LocalPool(slots, lambda r: functools.partial(two_stage.LinearShard, columns[r[0] : r[1]], *r, row_block=64,
                                                        storage="memory"))  # fmt: skip
    fmap = two_stage.GivenFeatures(columns.shape[1])
    pool.call("load_problem", lambda r: (fmap, y[r[0] : r[1]], c[r[0] : r[1]], bases, None, "float64"))
    return pool


@pytest.mark.parametrize("C", [0.3, 30.0])
def test_newton_matches_an_exact_convex_solver_on_a_nystroem_basis(C):
    """The solve in the columns' space (projected Gram updates) against L-BFGS on the explicit features."""
    from scipy.optimize import minimize

    X, y = _data(500)
    ks = KernelSet("gaussian:0.2,poly:2", X.shape[1])
    w = np.array([0.8, 0.2])
    order = two_stage.landmark_order(len(y), seed=3)
    small, fmap = (two_stage.nystroem_map(ks, X[order[:r]], w) for r in (12, 40))
    columns = combined_kernel(ks, X, X[order[:40]], w)
    c = np.random.default_rng(5).uniform(0.5, 2.0, len(y))
    F = columns @ fmap.projection
    ref = minimize(
        _objective, np.zeros(fmap.rank + 1), args=(F, y, C, c), method="L-BFGS-B",
        jac=lambda v, *a: _gradient(v, *a), options={"gtol": 1e-12, "ftol": 1e-15, "maxiter": 20000},
    )  # fmt: skip
    every = np.ones(len(y), dtype=bool)
    with _pool(columns, y, c, [small.basis, fmap.basis], n_shards=3) as pool:
        cold = two_stage.newton_solve(pool, fmap.basis, C, level=1, outputs_on=every)
        warm_small = two_stage.newton_solve(pool, small.basis, C, level=0, outputs_on=every)
        start = np.append(fmap.coefficients(small.expansion(warm_small.coef)), warm_small.intercept)
        warm = two_stage.newton_solve(pool, fmap.basis, C, level=1, start=start, outputs_on=every)
        cg = two_stage.cg_newton_solve(pool, fmap.basis, C, level=1, start=start, gtol=1e-10, outputs_on=every)
    for result in (cold, warm, cg):
        v = np.append(result.coef, result.intercept)
        assert _objective(v, F, y, C, c) <= ref.fun * (1 + 1e-10)
        np.testing.assert_allclose(v, ref.x, atol=2e-5 * max(1.0, np.abs(ref.x).max()))
        np.testing.assert_allclose(result.outputs, F @ result.coef + result.intercept, rtol=1e-9, atol=1e-9)
    # The smaller map's start is its model: the same decision values on every row.
    np.testing.assert_allclose(F @ start[:-1] + start[-1], warm_small.outputs, atol=1e-8)
    assert warm.n_iter <= cold.n_iter


def _gradient(v, F, y, C, c):
    o = F @ v[:-1] + v[-1]
    a = (y * o < 1.0) * c * C * (o - y)
    return v + np.append(F.T @ a, a.sum())


def test_newton_on_some_rows_is_the_solve_on_those_rows():
    rng = np.random.default_rng(1)
    F = rng.standard_normal((400, 7))
    y = np.where(F[:, 0] + 0.5 * rng.standard_normal(400) > 0, 1.0, -1.0)
    c = np.ones(400)
    train = rng.random(400) < 0.7
    every = np.ones(400, dtype=bool)
    with _pool(F, y, c, None, n_shards=2) as pool:
        part = two_stage.newton_solve(pool, two_stage.Basis(7, None), 2.0, train=train, outputs_on=every)
        by_cg = two_stage.cg_newton_solve(
            pool, two_stage.Basis(7, None), 2.0, train=train, gtol=1e-12, outputs_on=every
        )
    alone = two_stage.fit_squared_hinge(F[train], y[train], 2.0)
    for result in (part, by_cg):
        np.testing.assert_allclose(result.coef, alone[0], atol=1e-9)
        np.testing.assert_allclose(result.outputs, F @ result.coef + result.intercept, atol=1e-9)  # held-out rows too


def test_block_tree_sums_do_not_depend_on_the_sharding():
    rng = np.random.default_rng(0)
    n_blocks = 23
    parts = [rng.standard_normal(5) * 10.0 ** rng.integers(-8, 8) for _ in range(n_blocks)]
    parts[6] = None

    def shard_nodes(lo, hi):  # what a shard of blocks [lo, hi) sends: its whole nodes' tree sums
        return {(a, b): _tree(parts, a, b) for a, b in partition.dyadic_nodes(lo, hi)}

    totals = []
    for cuts in ([0, 23], [0, 5, 23], [0, 1, 2, 11, 17, 23], list(range(24))):
        nodes = {}
        for lo, hi in zip(cuts[:-1], cuts[1:]):
            nodes.update(shard_nodes(lo, hi))
        totals.append(partition.tree_total(nodes, n_blocks))
    for total in totals[1:]:
        np.testing.assert_array_equal(total, totals[0])
    np.testing.assert_allclose(totals[0], sum(p for p in parts if p is not None), rtol=1e-12, atol=1e-3)


def _tree(parts, a, b):
    if b - a == 1:
        return parts[a]
    mid = (a + b) // 2
    left, right = _tree(parts, a, mid), _tree(parts, mid, b)
    return right if left is None else left if right is None else left + right


def test_shard_tree_sums_follow_the_tree(monkeypatch):
    """A shard's binary-counter sums over threads are the recursive tree sums of its nodes."""
    from mwumkl_dist.devices.threads import thread_limit

    rng = np.random.default_rng(2)
    X = rng.random((64 * 13 + 5, 2))
    shard = two_stage.LinearShard(X[64 * 3 :], 64 * 3, X.shape[0], row_block=64, storage="memory")
    values = [rng.standard_normal(3) for _ in shard.blocks]
    with thread_limit(2):
        nodes = shard._tree_sums(lambda i: values[i].copy())  # a new part per call, as gram_parts makes
    assert [node for node, _ in nodes] == [(3, 4), (4, 8), (8, 12), (12, 14)]
    for (a, b), total in nodes:
        np.testing.assert_array_equal(total, _tree(values, a - 3, b - 3))


# polish=False: the Nystroem stage (the exact solve would take these few hundred rows)
PARAMS = dict(C=10.0, solver="two-stage", kernels="gaussian:0.05,gaussian:0.2,poly:2", polish=False)


@pytest.fixture
def always_grow(monkeypatch, small_ranks):
    """The adaptive rank at residual tolerance 0: it grows to the cap (16, 32, ... landmarks)."""
    monkeypatch.setitem(
        driver.SOLVERS, "two-stage", replace(driver.SOLVERS["two-stage"], residual_tol=0.0, rank_by="residual")
    )


@pytest.mark.timeout(120)
def test_adaptive_model_is_the_same_for_any_sharding_and_threads_and_saved(always_grow, tmp_path):
    X, y = _data(700)
    a = MWUMKLClassifier(**PARAMS, n_jobs=1).fit(X, y)
    assert a.n_components_ == len(a.support_) == two_stage.rank_budget(700) == 60
    assert np.all(np.diff(a.support_) > 0) and 0 < a.nystroem_residual_ < 1
    b = MWUMKLClassifier(**PARAMS, n_shards=3, n_jobs=2).fit(X, y)
    for name in ("kernel_weights_", "support_", "dual_coef_", "intercept_", "nystroem_residual_"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    a.save(tmp_path / "m.npz")
    back = MWUMKLClassifier.load(tmp_path / "m.npz")
    assert back.nystroem_residual_ == a.nystroem_residual_ and back.n_components_ == a.n_components_
    np.testing.assert_array_equal(back.decision_function(X[:50]), a.decision_function(X[:50]))
    # The model is the SVM on its own features (solved again from them, landmarks in row order).
    fmap = two_stage.nystroem_map(KernelSet(PARAMS["kernels"], 3), X[a.support_], a.raw_kernel_weights_ * len(y))
    coef, b0 = two_stage.fit_squared_hinge(fmap.transform(X), y, a.C_)
    np.testing.assert_allclose(a.decision_function(X), fmap.transform(X) @ coef + b0, atol=1e-6)


@pytest.mark.timeout(120)
def test_multiclass_problems_share_the_landmarks(always_grow):
    rng = np.random.default_rng(4)
    X = rng.random((600, 3))
    y = np.digitize(X[:, 0] + 0.5 * X[:, 1], [0.5, 1.0])
    est = MWUMKLClassifier(**PARAMS, n_shards=2).fit(X, y)
    assert est.dual_coef_.shape == (3, len(est.support_)) and est.nystroem_residual_.shape == (3,)
    assert len(est.support_) == two_stage.rank_budget(600)
    assert np.mean(est.predict(X) == y) > 0.8


@pytest.mark.timeout(120)
def test_a_smooth_combination_at_a_weak_ridge_keeps_the_hessian_positive_definite(monkeypatch):
    """Wide Gaussians on 4 features (K(L, L) with eigenvalues down to 1e-12 of the largest) at C = 1000 and
    1400 landmarks: with those directions kept (an eigendecomposition's rcond 1e-12, or a pivoted Cholesky
    factorisation stopped relative to the largest diagonal: 201 features, |M| = 1e5) the projected Gram's
    rounding made the Newton Hessian indefinite (LinAlgError); the map drops them (nystroem.RCOND of the
    trace) and the fit is good."""
    monkeypatch.setitem(driver.SOLVERS, "two-stage", replace(two_stage_solver.TwoStageSolver(), n_components=1400))
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(12000, 4))
    y = np.where(X[:, 0] + 0.5 * np.sin(6 * X[:, 1]) + 0.2 * rng.normal(size=len(X)) > 0.75, 1, -1)
    params = dict(
        kernels="gaussian:1.5,gaussian:2.1,gaussian:3", C=1000.0, selectivity=0.0, solver="two-stage", polish=False
    )
    clf = MWUMKLClassifier(**params, random_state=0).fit(X, y)
    assert clf.n_components_ < 1400 and clf.score(X, y) > 0.85
    # The map keeps about the directions an eigendecomposition keeps above RCOND of the largest eigenvalue.
    L = X[nystroem.landmark_order(len(X), 0)[:1400]]
    ks = KernelSet(params["kernels"], 4)
    fmap = nystroem.nystroem_map(ks, L, np.full(3, 1.0 / 3.0))
    s = np.linalg.eigvalsh(combined_kernel(ks, L, L, np.full(3, 1.0 / 3.0)))
    assert 0.5 * np.sum(s > nystroem.RCOND * s[-1]) <= fmap.rank <= np.sum(s > nystroem.RCOND * s[-1])
    assert np.linalg.norm(fmap.projection, 2) < 10 / np.sqrt(nystroem.RCOND * s[-1])
