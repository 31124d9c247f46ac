"""The MWUMKL algorithm against a dense brute-force reading of SPEC.md section 1.

The reference solver below is written straight from the spec with full kernel
matrices and no incremental tricks: ``V = G alpha`` and ``s = alpha' G alpha``
are recomputed from scratch every iteration.  The library (incremental ``s``,
fused numba column updates, shards) must agree with it to 1e-9.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from conftest import explicit_kernels

from mwumkl_dist import MWUMKLClassifier
from mwumkl_dist.core.mwu_rules import Candidate, ConvergenceWarning
from mwumkl_dist.data.problems import FeatureProblem
from mwumkl_dist.engines.local import LocalEngine
from mwumkl_dist.kernels import Gaussian, KernelSet, Linear, Polynomial, paper_family
from mwumkl_dist.solvers import mwu

# ----------------------------------------------------------------------------- reference


def brute_force_mwumkl(K, y, ridge, epsilon, rho, n_iter=None, selectivity=None):
    """SPEC.md section 1 literally, on dense raw kernels ``K`` of shape ``(m, n, n)``.

    ``selectivity=beta`` replaces the exponents ``eps' / (2 rho) u_i`` by the relative ``beta u_i / max u``.

    Returns a dict with the final ``alpha`` (scaled as the spec says), kernel
    weights ``mu``, bias ``b``, the iteration count ``T``, whether the
    quashed form of Exponentiate-M was ever used and the largest exponent seen.
    """
    m, n, _ = K.shape
    r = np.einsum("inn->i", K)
    G = y[None, :, None] * K * y[None, None, :] / r[:, None, None] + ridge * np.eye(n)[None]
    eps_p = -math.log(1.0 - epsilon / (2.0 * rho))
    T = n_iter if n_iter is not None else math.ceil(8.0 * rho**2 / epsilon**2 * math.log(n))
    pos, neg = np.flatnonzero(y > 0), np.flatnonzero(y < 0)
    alpha = np.zeros(n)
    g = np.zeros(n)
    quashed, max_x = False, 0.0
    for _ in range(T):
        # np.argmax returns the first maximum; pos/neg are ascending, so ties go to the lowest index.
        iP, iN = pos[np.argmax(g[pos])], neg[np.argmax(g[neg])]
        alpha[iP] += 0.5
        alpha[iN] += 0.5
        V = G @ alpha  # (m, n): V_i = G_i alpha
        s = V @ alpha  # s_i = alpha' G_i alpha
        assert np.all(s > 0)
        u = np.sqrt(s)
        x = eps_p / (2.0 * rho) * u if selectivity is None else selectivity * u / u.max()
        if selectivity == 0.0:
            p12 = -u  # the limit of sinh(c u) / c as c -> 0: uniform weights
        elif x.max() < 20.0:
            p12 = -np.sinh(x)
        else:
            p12 = -np.exp(x - x.max())
            quashed = True
        max_x = max(max_x, x.max())
        g = (2.0 * p12 / u) @ V
    mu = np.abs(p12) / u
    mu /= mu.sum()
    alpha = alpha / T
    h = mu @ V / T
    P = np.sum(alpha[pos] * h[pos])
    N = np.sum(alpha[neg] * h[neg])
    return {"alpha": alpha / (P + N), "mu": mu, "b": (N - P) / (P + N), "T": T, "quashed": quashed, "max_x": max_x}


def random_problem(seed, n, d, *, separable=False):
    """Uniform features in [0, 1] without duplicates; labels from a noisy (or clean-margin) linear rule."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(size=(4 * n, d))
    w = rng.normal(size=d)
    z = (X - 0.5) @ w
    if separable:
        keep = np.abs(z) > 0.1 * np.abs(w).sum()
        X, z = X[keep], z[keep]
    else:
        z = z + 0.3 * rng.normal(size=len(z))
    X, z = X[:n], z[:n]
    y = np.where(z > 0, 1.0, -1.0)
    assert len(y) == n and 0 < (y > 0).sum() < n
    return X, y


def library_alpha(clf, y):
    """The library's final alpha (one per training row) from ``support_`` / ``dual_coef_``."""
    alpha = np.zeros(len(y))
    alpha[clf.support_] = clf.dual_coef_[0] * y[clf.support_]
    return alpha


MIXED = [
    Linear(features=(0, 1)),
    Polynomial(2, features=(1, 3)),
    Polynomial(3, coef0=0.5),
    Gaussian(1.0, features=(0,)),
    Gaussian(math.sqrt(0.5), features=(0,)),  # a squaring chain with the previous kernel
    Gaussian(0.7, features=(2, 3, 4)),
]

# (kernels, n, d, C, epsilon, rho, max_iter, separable, expect quashing)
CASES = {
    "linear-hard": ([Linear()], 20, 3, np.inf, 0.3, 0.5, None, True, False),
    "three-hard": ([Polynomial(1), Gaussian(2.0), Gaussian(4.0)], 60, 4, np.inf, 0.2, 0.5, None, False, False),
    "paper12-soft-rho1.5": (paper_family(), 40, 3, 400.0, 0.5, 1.5, None, False, False),
    "mixed-subsets-soft": (MIXED, 120, 5, 120.0, 0.25, 0.5, None, False, False),
    "two-soft-eps0.1": ([Polynomial(2), Gaussian(0.5)], 50, 2, 5000.0, 0.1, 0.5, None, False, False),
    "gaussian-soft-rho1.5": ([Gaussian(1.0, features=(1, 2))], 30, 3, 30.0, 0.4, 1.5, None, False, False),
    "quash-soft": ([Linear(), Gaussian(1.0), Gaussian(0.3, features=(0,))], 30, 2, 1.0, 0.5, 0.5, 300, False, True),
    "quash-hard-long": (MIXED[:4], 25, 5, np.inf, 0.5, 0.5, 1500, False, True),
    # exponents beyond 710, where sinh overflows: only the quashed form keeps the numbers finite
    "quash-overflow": ([Polynomial(2), Gaussian(0.5)], 30, 3, 0.1, 0.9, 0.5, 800, False, True),
}


@pytest.mark.parametrize("selectivity", ["paper", 0.0, 5.0, 60.0])
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_library_matches_brute_force(case, selectivity):
    specs, n, d, C, eps, rho, max_iter, separable, expect_quash = CASES[case]
    X, y = random_problem(list(CASES).index(case), n, d, separable=separable)
    beta = None if selectivity == "paper" else selectivity
    ridge = 0.0 if np.isinf(C) else 1.0 / C
    ref = brute_force_mwumkl(explicit_kernels(specs, X), y, ridge, eps, rho, max_iter, selectivity=beta)
    if beta is None:
        assert ref["quashed"] == expect_quash
        if case == "quash-overflow":
            assert ref["max_x"] > 710.0
    else:  # the relative exponents lie in [0, beta]: quashed exactly when beta >= 20
        assert ref["quashed"] == (beta >= 20.0) and ref["max_x"] <= beta * (1 + 1e-15)
        if beta == 0.0:
            np.testing.assert_allclose(ref["mu"], 1.0 / len(specs), rtol=1e-12)

    clf = MWUMKLClassifier(
        kernels=specs, epsilon=eps, C=C, rho=rho, max_iter=max_iter, scale_C=False, polish=False,
        selectivity=selectivity,
    ).fit(X, y)  # fmt: skip
    assert clf.n_iter_ == ref["T"]
    if max_iter is None:
        assert ref["T"] == math.ceil(8 * rho**2 / eps**2 * math.log(n))
    alpha = library_alpha(clf, y)
    np.testing.assert_allclose(alpha, ref["alpha"], rtol=1e-9, atol=1e-9 * np.abs(ref["alpha"]).max())
    np.testing.assert_allclose(clf.kernel_weights_, ref["mu"], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(clf.intercept_[0], ref["b"], rtol=0, atol=1e-9)
    assert np.array_equal(clf.support_, np.flatnonzero(ref["alpha"] > 0))


def test_iterations_are_counted_from_n_not_features():
    # T depends on the training size only: 8 rho^2 / eps^2 ln n.
    X, y = random_problem(1, 37, 2)
    clf = MWUMKLClassifier(kernels="linear", epsilon=0.3, C=100.0, rho=0.5, polish=False, selectivity=0.0).fit(X, y)
    assert clf.n_iter_ == math.ceil(8 * 0.25 / 0.09 * math.log(37))


# ----------------------------------------------------------------------------- rules


def test_eps_prime():
    assert mwu.eps_prime(0.2, 0.5) == pytest.approx(-math.log(1 - 0.2), rel=1e-15)
    assert mwu.eps_prime(0.05, 1.5) == pytest.approx(-math.log(1 - 0.05 / 3), rel=1e-15)
    for eps, rho in [(1.0, 0.5), (1.2, 0.5), (0.0, 0.5), (-0.1, 0.5)]:
        with pytest.raises(ValueError, match="epsilon"):
            mwu.eps_prime(eps, rho)


@pytest.mark.parametrize(
    ("eps", "rho", "n", "T"),
    [(0.05, 0.5, 32561, 8313), (0.2, 0.5, 100, 231), (0.2, 1.5, 100, 2073), (0.5, 0.5, 2, 6), (0.3, 0.5, 1, 1)],
)
def test_iteration_count(eps, rho, n, T):
    assert mwu.iteration_count(eps, rho, n) == T
    if n > 1:
        assert T == math.ceil(8 * rho**2 / eps**2 * math.log(n))


def test_gram_block_and_update_s():
    k_pp, k_nn, k_pn = np.array([2.0, 3.0]), np.array([4.0, 5.0]), np.array([1.0, -1.0])
    inv_r, ridge = np.array([0.5, 0.25]), 0.1
    g_pp, g_nn, g_pn = mwu.gram_block(k_pp, k_nn, k_pn, inv_r, ridge)
    # labels +1 and -1: G[P,N] = y_P y_N K[P,N] / r = -K[P,N] / r, ridge on the diagonal only
    np.testing.assert_array_equal(g_pp, [1.1, 0.85])
    np.testing.assert_array_equal(g_nn, [2.1, 1.35])
    np.testing.assert_array_equal(g_pn, [-0.5, 0.25])
    s = mwu.update_s(np.array([1.0, 2.0]), np.array([0.5, 0.0]), np.array([0.25, 1.0]), g_pp, g_nn, g_pn)
    np.testing.assert_allclose(s, [1.0 + 0.75 + (1.1 + 2.1 - 1.0) / 4, 2.0 + 1.0 + (0.85 + 1.35 + 0.5) / 4])


def test_update_s_equals_quadratic_form():
    # s' = (a + (e_P + e_N)/2)' G (a + (e_P + e_N)/2) from s = a' G a and V = G a.
    rng = np.random.default_rng(0)
    B = rng.normal(size=(6, 6))
    G = B @ B.T
    a = rng.uniform(size=6)
    p, q = 1, 4
    s = mwu.update_s(a @ G @ a, (G @ a)[p], (G @ a)[q], G[p, p], G[q, q], G[p, q])
    b = a.copy()
    b[[p, q]] += 0.5
    assert s == pytest.approx(b @ G @ b, rel=1e-13)


def test_exponentiate_sinh_branch_and_switch():
    rho, eps_p = 0.5, mwu.eps_prime(0.2, 0.5)
    c = eps_p / (2 * rho)
    below = (19.999 / c) ** 2
    ex = mwu.exponentiate(np.array([below, below / 4, 0.0]), eps_p, rho)
    assert not ex.quashed
    np.testing.assert_allclose(ex.u, [19.999 / c, 19.999 / c / 2, 0.0], rtol=1e-15)
    np.testing.assert_allclose(ex.p12, -np.sinh(c * ex.u), rtol=1e-15)
    np.testing.assert_allclose(ex.coef[:2], 2 * ex.p12[:2] / ex.u[:2], rtol=1e-15)
    assert ex.coef[2] == 0.0  # s = 0 means V = 0: no contribution to g

    at = (20.0 / c) ** 2 * (1 + 1e-12)
    ex = mwu.exponentiate(np.array([at, at / 4]), eps_p, rho)
    assert ex.quashed
    x = c * ex.u
    np.testing.assert_allclose(ex.p12, -np.exp(x - x.max()), rtol=1e-15)
    assert ex.p12[0] == -1.0
    # the dropped common factor exp(max x) leaves the argmax and ratios unchanged
    ratio_quashed = ex.coef[1] / ex.coef[0]
    assert ratio_quashed == pytest.approx((np.sinh(x[1]) / ex.u[1]) / (np.sinh(x[0]) / ex.u[0]), rel=1e-12)


def test_kernel_weights():
    rho, eps_p = 0.5, mwu.eps_prime(0.3, 0.5)
    s = np.array([4.0, 1.0, 9.0])
    ex = mwu.exponentiate(s, eps_p, rho)
    w = mwu.kernel_weights(ex)
    expected = np.sinh(eps_p * np.sqrt(s)) / np.sqrt(s)
    np.testing.assert_allclose(w, expected / expected.sum(), rtol=1e-14)
    # u = 0 takes the limit sinh(c u)/u -> c
    ex0 = mwu.exponentiate(np.array([0.0, 1.0]), eps_p, rho)
    w0 = mwu.kernel_weights(ex0)
    lim = np.array([eps_p, np.sinh(eps_p)])
    np.testing.assert_allclose(w0, lim / lim.sum(), rtol=1e-14)


def test_reduce_candidates_ties_to_lowest_index():
    cands = [Candidate(7, 1.0), Candidate(3, 1.0), Candidate(-1, np.inf), Candidate(5, 0.5)]
    assert mwu.reduce_candidates(cands).index == 3
    assert mwu.reduce_candidates(cands[::-1]).index == 3
    assert mwu.reduce_candidates([Candidate(9, 2.0), Candidate(1, 1.0)]).index == 9
    with pytest.raises(ValueError, match="no shard holds"):
        mwu.reduce_candidates([Candidate(-1, -np.inf)])


def test_bias_and_scale():
    b, scale = mwu.bias_and_scale(3.0, 1.0)
    assert b == pytest.approx((1.0 - 3.0) / 4.0) and scale == 0.25
    b2, _ = mwu.bias_and_scale(3e-6, 1e-6)  # scale-free
    assert b2 == pytest.approx(b, rel=1e-14)
    with pytest.warns(ConvergenceWarning, match="not separated"):
        assert mwu.bias_and_scale(1.0, -1.0) == (0.0, 1.0)


# ----------------------------------------------------------------------------- identities


def _solve_direct(specs, X, y, ridge, eps, rho, n_shards=1, n_iter=None):
    ks = KernelSet(specs, X.shape[1])
    engine = LocalEngine(FeatureProblem(X, y, ks), n_shards=n_shards)
    traces = engine.traces()
    engine.configure(1.0 / traces, ridge)
    T = n_iter or mwu.iteration_count(eps, rho, len(y))
    res = mwu.solve(engine, inv_trace=1.0 / traces, ridge=ridge, iterations=mwu.Iterations(eps, rho, T))
    return engine, traces, res


@pytest.mark.parametrize(("C", "n_shards"), [(np.inf, 1), (50.0, 3)])
def test_identities_after_fit(C, n_shards):
    specs = MIXED
    X, y = random_problem(7, 70, 5)
    ridge = 0.0 if np.isinf(C) else 1.0 / C
    engine, traces, res = _solve_direct(specs, X, y, ridge, 0.3, 0.5, n_shards=n_shards)
    K = explicit_kernels(specs, X)
    r = np.einsum("inn->i", K)
    np.testing.assert_allclose(traces, r, rtol=1e-13)
    G = y[None, :, None] * K * y[None, None, :] / r[:, None, None] + ridge * np.eye(len(y))[None]

    counts = np.concatenate([s.alpha for s in engine.shards])
    V = np.vstack([s.V for s in engine.shards])
    assert counts.sum() == res.n_iter  # 1/2 + 1/2 per iteration
    assert counts[y > 0].sum() == counts[y < 0].sum()
    np.testing.assert_allclose(V, (G @ counts).T, rtol=1e-10, atol=1e-12 * np.abs(V).max())
    np.testing.assert_allclose(res.s, np.einsum("j,ijk,k->i", counts, G, counts), rtol=1e-10)
    assert res.kernel_weights.sum() == pytest.approx(1.0, abs=1e-15)
    assert np.all(res.kernel_weights > 0)

    # The bias convention: +1 and -1 at the two closest hull points c+ and c-.
    a, b, mu = res.alpha, res.bias, res.kernel_weights
    np.testing.assert_allclose(a / a.sum(), counts / counts.sum(), rtol=1e-14)  # alpha = counts / T / (P + N)
    Gmu = np.einsum("i,ijk->jk", mu, G)  # sum_i mu_i G_i = Y K_mu Y + ridge I (mu sums to 1)
    for cls, target in [(1.0, 1.0), (-1.0, -1.0)]:
        lam = np.where(y == cls, a, 0.0)
        lam /= lam.sum()  # the hull point c = sum lam_k phi~(x_k), a convex combination
        # f(c) = sum_j a_j y_j <phi~(x_j), c> + b, with phi~ the ridge-augmented feature map.
        f = (a * y) @ (y[:, None] * Gmu * y[None, :]) @ lam + b
        assert f == pytest.approx(target, abs=1e-9)

    # The estimator's decision function (numba kernel sums over support vectors) equals the dense one.
    clf = MWUMKLClassifier(
        specs, epsilon=0.3, C=C, rho=0.5, scale_C=False, polish=False, n_shards=n_shards, selectivity="paper"
    ).fit(X, y)
    np.testing.assert_allclose(library_alpha(clf, y), a, rtol=1e-12, atol=0)
    Kmu = np.einsum("i,ijk->jk", mu / r, K)
    Xt = np.random.default_rng(3).uniform(size=(15, 5))
    Kt = explicit_kernels(specs, Xt, X)
    np.testing.assert_allclose(clf.decision_function(X), Kmu @ (a * y) + b, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(
        clf.decision_function(Xt), np.einsum("i,ijk->jk", mu / r, Kt) @ (a * y) + b, rtol=1e-10, atol=1e-10
    )


def test_hard_margin_overlap_warns_not_crashes():
    # Identical points with opposite labels: the hulls intersect, hard margin degenerates.
    X = np.array([[0.0, 0.0], [0.0, 0.0], [1.0, 1.0], [1.0, 1.0]])
    y = np.array([1, -1, 1, -1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf = MWUMKLClassifier("linear", C=np.inf, epsilon=0.2, polish=False, max_iter=20).fit(X, y)
    assert np.all(np.isfinite(clf.decision_function(X)))


# ----------------------------------------------------------------------------- invariances

INV_SPECS = [Polynomial(2), Gaussian(1.0), Gaussian(0.5, features=(1, 2))]


def _fit(X, y, **kw):
    params = dict(kernels=INV_SPECS, epsilon=0.3, C=10.0, rho=0.5, polish=False)
    params.update(kw)
    return MWUMKLClassifier(**params).fit(X, y)


def test_permuting_rows_permutes_alpha_only():
    X, y = random_problem(11, 60, 4)
    Xt = np.random.default_rng(5).uniform(size=(40, 4))
    base = _fit(X, y)
    # The first iteration's all-zero g picks the lowest-index point of each class, so the
    # permutation keeps those two rows first; everything after is order-free.
    first = [int(np.flatnonzero(y > 0)[0]), int(np.flatnonzero(y < 0)[0])]
    rest = np.setdiff1d(np.arange(len(y)), first)
    perm = np.concatenate([first, np.random.default_rng(2).permutation(rest)])
    other = _fit(X[perm], y[perm])
    np.testing.assert_allclose(library_alpha(other, y[perm]), library_alpha(base, y)[perm], rtol=1e-12, atol=0)
    np.testing.assert_allclose(other.kernel_weights_, base.kernel_weights_, rtol=1e-12)
    np.testing.assert_allclose(other.intercept_, base.intercept_, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(other.decision_function(Xt), base.decision_function(Xt), rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(other.predict(Xt), base.predict(Xt))


@pytest.mark.parametrize(
    "mapping",
    [
        {-1: 0, 1: 1},
        {-1: 1, 1: 2},
        {-1: "no", 1: "yes"},
        {-1: "zebra", 1: "apple"},  # reversed: the positive class becomes classes_[0]
        {-1: True, 1: False},
    ],
    ids=["01", "12", "strings", "strings-reversed", "bools-reversed"],
)
def test_relabelling_gives_same_predictions(mapping):
    X, y = random_problem(4, 50, 3)
    Xt = np.random.default_rng(6).uniform(size=(30, 3))
    base = _fit(X, y)
    labels = np.array([mapping[v] for v in y.astype(int)])
    other = _fit(X, labels)
    expected = np.array([mapping[v] for v in base.predict(Xt).astype(int)])
    np.testing.assert_array_equal(other.predict(Xt), expected)
    reversed_order = other.classes_[1] == mapping[-1]
    sign = -1.0 if reversed_order else 1.0
    # Swapping the classes leaves Y K Y and so alpha and mu unchanged, and flips f.
    np.testing.assert_allclose(other.decision_function(Xt), sign * base.decision_function(Xt), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(other.kernel_weights_, base.kernel_weights_, rtol=1e-12)


def test_sparse_and_dense_inputs_give_same_model():
    rng = np.random.default_rng(8)
    X, y = random_problem(8, 80, 6)
    X[rng.uniform(size=X.shape) < 0.6] = 0.0  # mostly zeros, like a9a
    Xt = rng.uniform(size=(25, 6)) * (rng.uniform(size=(25, 6)) < 0.5)
    dense = _fit(X, y, kernels="paper")
    sparse = _fit(sp.csr_matrix(X), y, kernels="paper")
    assert sp.issparse(sparse.support_vectors_)
    np.testing.assert_array_equal(sparse.support_, dense.support_)
    np.testing.assert_allclose(sparse.dual_coef_, dense.dual_coef_, rtol=1e-12)
    np.testing.assert_allclose(sparse.kernel_weights_, dense.kernel_weights_, rtol=1e-12)
    np.testing.assert_allclose(sparse.intercept_, dense.intercept_, rtol=1e-12, atol=1e-12)
    for q in (Xt, sp.csr_matrix(Xt)):
        np.testing.assert_allclose(sparse.decision_function(q), dense.decision_function(Xt), rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("C", [np.inf, 20.0])
def test_precomputed_kernels_give_same_model(C):
    X, y = random_problem(9, 45, 4)
    Xt = np.random.default_rng(10).uniform(size=(20, 4))
    specs = INV_SPECS + [Linear(features=(0, 3))]
    feat = _fit(X, y, kernels=specs, C=C)
    pre = _fit(explicit_kernels(specs, X), y, kernels="precomputed", C=C)
    np.testing.assert_array_equal(pre.support_, feat.support_)
    np.testing.assert_allclose(pre.dual_coef_, feat.dual_coef_, rtol=1e-10)
    np.testing.assert_allclose(pre.kernel_weights_, feat.kernel_weights_, rtol=1e-10)
    np.testing.assert_allclose(pre.intercept_, feat.intercept_, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(pre.kernel_traces_, feat.kernel_traces_, rtol=1e-13)
    np.testing.assert_allclose(
        pre.decision_function(explicit_kernels(specs, Xt, X)), feat.decision_function(Xt), rtol=1e-9, atol=1e-10
    )
