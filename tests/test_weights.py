"""Per-point ridge (sample and class weights): the solver against a dense brute-force reference.

With per-point weights ``w_j`` the 2-norm soft margin becomes
``G_i = Y K_i Y / r_i + D`` with ``D = diag(ridge_j)``, ``ridge_j = 1 / (C w_j)``.
The reference below builds every ``G_i`` explicitly and recomputes ``V`` and
``s`` from scratch each iteration; the library (incremental ``s``, fused numba
columns, shards, every problem kind) must pick the same points and agree on
``V``, ``s``, ``alpha``, the weights and the bias.  A ridge vector with one
value everywhere must give the scalar-ridge model bit for bit.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp
from conftest import explicit_kernels, record_nested_fits

from mwumkl_dist import MWUMKLClassifier
from mwumkl_dist.core import partition, progress
from mwumkl_dist.data import weights
from mwumkl_dist.data.problems import FeatureProblem, PrecomputedProblem
from mwumkl_dist.data.shards import FeatureShard
from mwumkl_dist.engines.local import LocalEngine
from mwumkl_dist.kernels import Gaussian, KernelSet, Linear, Polynomial, RandomGaussianBank
from mwumkl_dist.solvers import mwu
from mwumkl_dist.solvers.mwu import polish

SPECS = [
    Linear(features=(0, 1)),
    Polynomial(2, features=(1, 3)),
    Gaussian(1.0, features=(0,)),
    Gaussian(math.sqrt(0.5), features=(0,)),  # a squaring chain with the previous kernel
    Gaussian(0.7, features=(2, 3, 4)),
]
EPS, RHO = 0.3, 0.5


def _data(n=60, d=5, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(size=(n, d))
    z = (X - 0.5) @ rng.normal(size=d) + 0.3 * rng.normal(size=n)
    return X, np.where(z > 0, 1.0, -1.0)


def _ridge_vector(n, seed=1, zeros=True):
    """Per-point ridges spanning two orders of magnitude, a few points hard-margin (0)."""
    rng = np.random.default_rng(seed)
    ridge = np.exp(rng.uniform(np.log(2e-3), np.log(0.2), n))
    if zeros:
        ridge[rng.choice(n, n // 10, replace=False)] = 0.0
    return ridge


# ----------------------------------------------------------------------------- reference


def brute_force(K, y, ridge, epsilon, rho, n_iter):
    """SPEC.md section 1 with ``D = diag(ridge)``: dense ``G_i``, ``V`` and ``s`` recomputed every iteration."""
    m, n, _ = K.shape
    r = np.einsum("inn->i", K)
    D = np.diag(np.broadcast_to(np.asarray(ridge, dtype=np.float64), (n,)))
    G = y[None, :, None] * K * y[None, None, :] / r[:, None, None] + D[None]
    eps_p = -math.log(1.0 - epsilon / (2.0 * rho))
    pos, neg = np.flatnonzero(y > 0), np.flatnonzero(y < 0)
    counts, g, picks = np.zeros(n), np.zeros(n), []
    for _ in range(n_iter):
        iP, iN = pos[np.argmax(g[pos])], neg[np.argmax(g[neg])]  # ties to the lowest index
        picks.append((int(iP), int(iN)))
        counts[iP] += 0.5
        counts[iN] += 0.5
        V = G @ counts  # (m, n)
        s = V @ counts
        u = np.sqrt(s)
        x = eps_p / (2.0 * rho) * u
        p12 = -np.sinh(x) if x.max() < 20.0 else -np.exp(x - x.max())
        g = (2.0 * p12 / u) @ V
    mu = np.abs(p12) / u
    mu /= mu.sum()
    h = mu @ V
    P, N = np.sum(counts[pos] * h[pos]), np.sum(counts[neg] * h[neg])
    return {"picks": picks, "counts": counts, "V": V.T, "s": s, "mu": mu, "b": (N - P) / (P + N),
            "alpha": counts / n_iter / ((P + N) / n_iter**2)}  # fmt: skip


def run_library(problem, ridge, n_iter, n_shards=1, engine=None):
    """``mwu.solve`` on a local engine (or ``engine``); returns the result, picks, ``V`` and counts."""
    engine = engine or LocalEngine(problem, n_shards=n_shards)
    inv_trace = 1.0 / engine.traces()
    engine.configure(inv_trace, ridge)
    last = {}
    res = mwu.solve(
        engine, inv_trace=inv_trace, ridge=ridge, iterations=mwu.Iterations(EPS, RHO, n_iter),
        on_state=lambda state: last.update(picks=state.picks),
    )  # fmt: skip
    out = {"res": res, "picks": [tuple(map(int, p)) for p in last["picks"]], "counts": engine.alpha_counts()}
    if hasattr(engine, "shards"):
        out["V"] = np.vstack([s.V for s in engine.shards])
    return out


def _problems(tmp_path):
    """(name, problem, dense raw kernels) for every problem kind, on the same labels."""
    X, y = _data()
    K = explicit_kernels(SPECS, X)
    bank = RandomGaussianBank(2000, subset_size=2, seed=3)  # 5 features: few subsets, many squaring chains
    small_bank = RandomGaussianBank(12, subset_size=2, seed=5)
    out = [
        ("features-dense", FeatureProblem(X, y, KernelSet(SPECS, X.shape[1])), K),
        ("features-sparse", FeatureProblem(sp.csr_matrix(X * (X > 0.3)), y, KernelSet(SPECS, X.shape[1])),
         explicit_kernels(SPECS, X * (X > 0.3))),
        ("precomputed", PrecomputedProblem(K, y), K),
        ("bank-chains", FeatureProblem(X, y, KernelSet(bank, X.shape[1])), explicit_kernels(bank.specs(X.shape[1]), X)),
        ("bank-small", FeatureProblem(X, y, KernelSet(small_bank, X.shape[1])),
         explicit_kernels(small_bank.specs(X.shape[1]), X)),
    ]  # fmt: skip
    if tmp_path is not None:
        pytest.importorskip("zarr")
        from mwumkl_dist.stores import KernelStoreProblem, write_kernel_store

        store = write_kernel_store(tmp_path / "k.zarr", y, K=K, chunk_rows=16)
        out.append(("kernel-store", KernelStoreProblem(store, y), K))
    return y, out


KINDS = ["features-dense", "features-sparse", "precomputed", "bank-chains", "bank-small", "kernel-store"]


def _problem(kind, tmp_path):
    y, problems = _problems(tmp_path if kind == "kernel-store" else None)
    [(_, problem, K)] = [p for p in problems if p[0] == kind]
    return y, problem, K


@pytest.mark.parametrize("n_shards", [1, 3])
@pytest.mark.parametrize("kind", KINDS)
def test_per_point_ridge_matches_brute_force(tmp_path, kind, n_shards):
    y, problem, K = _problem(kind, tmp_path)
    ridge = _ridge_vector(len(y))
    n_iter = 80
    ref = brute_force(K, y, ridge, EPS, RHO, n_iter)
    lib = run_library(problem, ridge, n_iter, n_shards=n_shards)
    if kind == "bank-chains":
        assert (problem.kernel_set.plan.square_of >= 0).sum() > 1000  # most kernels square another
    assert lib["picks"] == ref["picks"]
    np.testing.assert_array_equal(lib["counts"], ref["counts"])
    np.testing.assert_allclose(lib["V"], ref["V"], rtol=1e-10, atol=1e-12 * np.abs(ref["V"]).max())
    res = lib["res"]
    np.testing.assert_allclose(res.s, ref["s"], rtol=1e-10)
    np.testing.assert_allclose(res.kernel_weights, ref["mu"], rtol=1e-9)
    np.testing.assert_allclose(res.alpha, ref["alpha"], rtol=1e-9)
    assert res.bias == pytest.approx(ref["b"], rel=1e-9, abs=1e-12)


def test_the_ridge_changes_the_picks():
    """A per-point ridge is not a rescaled scalar one: the reference picks other points (the test can fail)."""
    X, y = _data()
    K = explicit_kernels(SPECS, X)
    ridge = _ridge_vector(len(y))
    a = brute_force(K, y, ridge, EPS, RHO, 80)
    b = brute_force(K, y, np.full(len(y), ridge.mean()), EPS, RHO, 80)
    assert a["picks"] != b["picks"]
    lib = run_library(PrecomputedProblem(K, y), ridge, 80)
    assert lib["picks"] == a["picks"]


@pytest.mark.parametrize("kind", KINDS)
def test_equal_ridge_vector_is_bit_identical_to_scalar(tmp_path, kind):
    y, problem, _ = _problem(kind, tmp_path)
    scalar = run_library(problem, 0.03, 70, n_shards=2)
    vector = run_library(problem, np.full(len(y), 0.03), 70, n_shards=2)
    assert vector["picks"] == scalar["picks"]
    np.testing.assert_array_equal(vector["V"], scalar["V"])
    for name in ("alpha", "kernel_weights", "s"):
        np.testing.assert_array_equal(getattr(vector["res"], name), getattr(scalar["res"], name))
    assert vector["res"].bias == scalar["res"].bias


def test_shard_takes_its_rows_ridge():
    """One superstep from alpha = 0: row P gets ``ridge_P / 2`` and row N ``ridge_N / 2`` on top of the columns."""
    X, y = _data(n=30)
    ks = KernelSet(SPECS, X.shape[1])
    K = explicit_kernels(SPECS, X)
    ridge = _ridge_vector(30, zeros=False)
    ip, iq = int(np.flatnonzero(y > 0)[2]), int(np.flatnonzero(y < 0)[4])
    inv_r = 1.0 / np.einsum("inn->i", K)
    expected = 0.5 * y[:, None] * (K[:, :, ip].T - K[:, :, iq].T) * inv_r
    expected[ip] += ridge[ip] / 2
    expected[iq] += ridge[iq] / 2
    # Two shards; each is configured with its own rows' slice (as the engines cut it).
    shards = [FeatureShard(X[a:b], y[a:b], a, ks.plan) for a, b in [(0, 13), (13, 30)]]
    for s in shards:
        s.configure(inv_r, mwu.ridge_rows(ridge, s.row_offset, s.row_offset + s.n_rows))
        s.superstep(ip, iq, X[ip], X[iq], np.zeros(len(SPECS)))
    np.testing.assert_allclose(np.vstack([s.V for s in shards]), expected, rtol=1e-12, atol=1e-15)


def test_gram_block_takes_the_ridge_of_each_picked_point():
    k_pp, k_nn, k_pn = np.array([1.0, 2.0]), np.array([3.0, 4.0]), np.array([0.5, 0.25])
    inv_r = np.array([0.5, 0.25])
    g_pp, g_nn, g_pn = mwu.gram_block(k_pp, k_nn, k_pn, inv_r, 0.1, 0.7)
    np.testing.assert_array_equal(g_pp, k_pp * inv_r + 0.1)
    np.testing.assert_array_equal(g_nn, k_nn * inv_r + 0.7)
    np.testing.assert_array_equal(g_pn, -k_pn * inv_r)  # off the diagonal: no ridge
    same = mwu.gram_block(k_pp, k_nn, k_pn, inv_r, 0.1)
    np.testing.assert_array_equal(same[1], k_nn * inv_r + 0.1)
    ridge = np.array([0.0, 0.2, 0.4])
    assert mwu.ridge_at(mwu.check_ridge(ridge, 3), 2) == 0.4
    assert mwu.ridge_at(mwu.check_ridge(0.3, 3), 2) == 0.3
    np.testing.assert_array_equal(mwu.ridge_rows(ridge, 1, 3), [0.2, 0.4])
    assert mwu.ridge_rows(0.3, 1, 3) == 0.3


@pytest.mark.parametrize(
    ("ridge", "match"),
    [
        (np.ones(5), r"shape \(6,\)"),
        (np.ones((6, 1)), r"shape \(6,\)"),
        (np.array([0.1, 0.1, np.nan, 0.1, 0.1, 0.1]), "finite and non-negative"),
        (np.array([0.1, 0.1, np.inf, 0.1, 0.1, 0.1]), "finite and non-negative"),
        (np.array([0.1, -0.1, 0.1, 0.1, 0.1, 0.1]), "finite and non-negative"),
        (-1.0, "finite and non-negative"),
        (np.nan, "finite and non-negative"),
    ],
)
def test_bad_ridge_is_refused(ridge, match):
    with pytest.raises(ValueError, match=match):
        mwu.check_ridge(ridge, 6)
    X, y = _data(n=6)
    y[:3] = 1.0
    y[3:] = -1.0
    engine = LocalEngine(FeatureProblem(X, y, KernelSet(SPECS, X.shape[1])))
    with pytest.raises(ValueError, match=match):
        engine.configure(1.0 / engine.traces(), ridge)


def test_shard_refuses_a_ridge_of_another_length():
    X, y = _data(n=10)
    shard = FeatureShard(X, y, 0, KernelSet(SPECS, X.shape[1]).plan)
    with pytest.raises(ValueError, match=r"shard's per-point ridge must have shape \(10,\)"):
        shard.configure(np.ones(len(SPECS)), np.ones(12))


# ----------------------------------------------------------------------------- Dask engine


def test_dask_engine_ships_each_block_its_ridge_rows(monkeypatch):
    """Row and kernel blocks on Dask, a lost block rebuilt mid-fit: the same model as the local engine, bit for bit."""
    distributed = pytest.importorskip("distributed")
    # Kernel tiles of 2 (this process only: the threaded client's shards live here): the 5 kernels make
    # kernel blocks (blocks hold whole tiles; the reference below is computed with the same tiles).
    monkeypatch.setattr(partition, "TILE_KERNELS", 2)
    from mwumkl_dist.engines import dask_pool
    from mwumkl_dist.engines.dask import DaskEngine

    # The dropped block's worker counts as left, and no replacement ever joins: no need to wait 10 s for one.
    monkeypatch.setattr(dask_pool, "REPLACEMENT_GRACE", 0.2)

    X, y = _data()
    problem = FeatureProblem(X, y, KernelSet(SPECS, X.shape[1]))
    ridge = _ridge_vector(len(y))
    ref = run_library(problem, ridge, 60)
    with distributed.Client(processes=False, n_workers=2, threads_per_worker=1, dashboard_address=":0") as client:
        with DaskEngine(problem, client, n_shards=3, n_kernel_shards=2) as engine:
            inv_trace = 1.0 / engine.traces()
            engine.configure(inv_trace, ridge)

            def drop_a_block(info):
                if info.iteration == 30:
                    engine.blocks[2].conn.close()  # the next message finds it lost: rebuilt, reconfigured, replayed

            with progress.reporting(drop_a_block), progress.phase("iterations", 60) as step:
                res = mwu.solve(
                    engine, inv_trace=inv_trace, ridge=ridge, iterations=mwu.Iterations(EPS, RHO, 60),
                    progress=step, callback_every=10,
                )  # fmt: skip
            assert engine.recoveries == 1
            counts = engine.alpha_counts()
    np.testing.assert_array_equal(counts, ref["counts"])
    np.testing.assert_array_equal(res.alpha, ref["res"].alpha)
    np.testing.assert_array_equal(res.kernel_weights, ref["res"].kernel_weights)
    assert res.bias == ref["res"].bias


# ----------------------------------------------------------------------------- exact polish


def _l2_svm_cvxpy(K, y, ridge):
    """The 2-norm soft-margin dual as nearest points of the class hulls: ``min lam' (Y K Y + D) lam``, each
    class's ``lam`` on a simplex; then the hard-margin SVM on ``K + D``: ``alpha = 2 lam / q`` and the bias
    that puts the two hull points at +1 and -1."""
    cp = pytest.importorskip("cvxpy")
    n = len(y)
    w, U = np.linalg.eigh(K)
    F = U * np.sqrt(np.maximum(w, 0.0))  # K = F F'
    lam = cp.Variable(n)
    objective = cp.sum_squares(F.T @ cp.multiply(y, lam)) + cp.sum(cp.multiply(ridge, cp.square(lam)))
    constraints = [lam >= 0, cp.sum(lam[y > 0]) == 1, cp.sum(lam[y < 0]) == 1]
    cp.Problem(cp.Minimize(objective), constraints).solve(solver="CLARABEL", tol_gap_abs=1e-12, tol_gap_rel=1e-12)
    lam = np.maximum(lam.value, 0.0)
    Q = K + np.diag(ridge)
    q = (y * lam) @ Q @ (y * lam)
    alpha = 2.0 * lam / q
    b = 1.0 - (alpha * y) @ Q @ np.where(y > 0, lam, 0.0)
    return alpha, b


def test_polish_with_per_point_ridge_matches_an_independent_solve():
    X, y = _data(n=50)
    K = explicit_kernels(SPECS, X)
    Kmu = np.einsum("i,ijk->jk", np.full(len(SPECS), 1.0 / len(SPECS)) / np.einsum("inn->i", K), K)
    ridge = _ridge_vector(len(y), zeros=False)
    alpha, b = polish.solve_l2_svm(Kmu, y, ridge)
    ref_alpha, ref_b = _l2_svm_cvxpy(Kmu, y, ridge)
    np.testing.assert_allclose(alpha, ref_alpha, atol=2e-3 * ref_alpha.max())
    assert b == pytest.approx(ref_b, abs=2e-3)
    # The KKT conditions of the hard margin on K + D: every point at margin >= 1, support vectors at 1.
    f = (Kmu + np.diag(ridge)) @ (alpha * y) + b
    assert np.all(y * f >= 1 - 1e-3)
    np.testing.assert_allclose(y[alpha > 1e-3 * alpha.max()] * f[alpha > 1e-3 * alpha.max()], 1.0, atol=1e-3)
    # A different ridge per point gives a different solution than the mean ridge (the test can fail).
    alpha_mean, _ = polish.solve_l2_svm(Kmu, y, float(ridge.mean()))
    assert np.abs(alpha_mean - alpha).max() > 0.05 * alpha.max()


def test_polish_refuses_a_bad_ridge_vector():
    K = np.eye(4)
    y = np.array([1.0, 1.0, -1.0, -1.0])
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        polish.solve_l2_svm(K, y, np.ones(3))
    with pytest.raises(ValueError, match="finite and non-negative"):
        polish.solve_l2_svm(K, y, np.array([1.0, -1.0, 1.0, 1.0]))


def test_integer_weights_equal_repeated_points_at_the_exact_optimum():
    """On a fixed Gram matrix, weight k (ridge / k) is k copies of the point (ridge each): the copies split the
    dual mass evenly, ``sum alpha_c^2 / C = a^2 / (k C)``.  Same decision function, same bias."""
    X, y = _data(n=40, seed=3)
    K = explicit_kernels([Gaussian(0.8)], X)[0]
    k = np.random.default_rng(0).integers(1, 4, len(y))
    ridge = 0.05
    alpha_w, b_w = polish.solve_l2_svm(K, y, ridge / k)
    rows = np.repeat(np.arange(len(y)), k)
    alpha_r, b_r = polish.solve_l2_svm(K[np.ix_(rows, rows)], y[rows], ridge)
    np.testing.assert_allclose(np.bincount(rows, alpha_r, len(y)), alpha_w, atol=1e-3 * alpha_w.max())
    assert b_r == pytest.approx(b_w, abs=1e-3)
    Xt = np.random.default_rng(1).uniform(size=(20, X.shape[1]))
    Kt = explicit_kernels([Gaussian(0.8)], Xt, X)[0]
    np.testing.assert_allclose(Kt @ (alpha_w * y) + b_w, Kt[:, rows] @ (alpha_r * y[rows]) + b_r, atol=2e-3)


# ----------------------------------------------------------------------------- weights -> ridge


def test_sample_weight_is_checked_and_copied():
    sw = [1, 2, 0, 3]
    w = weights.check_sample_weight(sw, 4)
    assert w.dtype == np.float64 and w.tolist() == [1.0, 2.0, 0.0, 3.0]
    original = np.array([1.0, 2.0, 3.0])
    weights.check_sample_weight(original, 3)[0] = 9.0
    assert original[0] == 1.0  # never the caller's array
    np.testing.assert_array_equal(weights.check_sample_weight(2.5, 3), [2.5, 2.5, 2.5])
    assert weights.check_sample_weight(None, 3) is None


@pytest.mark.parametrize(
    ("sw", "match"),
    [
        (np.ones(5), r"shape \(4,\)"),
        (np.ones((4, 1)), r"shape \(4,\)"),
        ([1.0, np.nan, 1.0, 1.0], "NaN or infinity"),
        ([1.0, np.inf, 1.0, 1.0], "NaN or infinity"),
        ([1.0, -0.5, 1.0, 1.0], "non-negative"),
        (np.zeros(4), "zero everywhere"),
        (["a", "b", "c", "d"], "array of numbers"),
    ],
)
def test_bad_sample_weight_is_refused(sw, match):
    with pytest.raises(ValueError, match=match):
        weights.check_sample_weight(sw, 4)


@pytest.mark.parametrize(
    ("cw", "match"),
    [
        ({"a": 2.0, "z": 1.0}, r"not training labels: \['z'\]"),
        ({"a": 0.0}, "positive finite"),
        ({"a": -1.0}, "positive finite"),
        ({"a": np.nan}, "positive finite"),
        ("balance", "None, 'balanced' or a dict"),
        ([1.0, 2.0], "None, 'balanced' or a dict"),
    ],
)
def test_bad_class_weight_is_refused(cw, match):
    with pytest.raises(ValueError, match=match):
        weights.check_class_weight(cw, np.array(["a", "b", "c"]))


def test_balanced_binary_weights_are_sklearns():
    from sklearn.utils.class_weight import compute_class_weight

    y = np.array([0, 0, 0, 1, 0, 1, 0, 0])
    classes = np.array([0, 1])
    w = weights.problem_weights(y, classes, 1, "balanced", None)
    np.testing.assert_allclose(w, compute_class_weight("balanced", classes=classes, y=y)[y], rtol=1e-15)
    sw = np.arange(1.0, 9.0)
    np.testing.assert_allclose(weights.problem_weights(y, classes, 1, "balanced", sw), w * sw, rtol=1e-15)


def test_one_vs_rest_class_weights_follow_sklearns_convention():
    y = np.array(["a", "b", "c", "a", "a", "c"])
    classes = np.array(["a", "b", "c"])
    # A dict: every point keeps its own label's weight in every binary problem.
    for target in classes:
        w = weights.problem_weights(y, classes, target, {"a": 3.0, "c": 0.5}, None)
        np.testing.assert_array_equal(w, [3.0, 1.0, 0.5, 3.0, 3.0, 0.5])
    # "balanced": class k against the rest, n / (2 n_k) and n / (2 (n - n_k)).
    w = weights.problem_weights(y, classes, "b", "balanced", None)
    np.testing.assert_allclose(w, np.where(y == "b", 6 / 2, 6 / 10))
    assert weights.problem_weights(y, classes, "b", None, None) is None


def test_point_ridge_is_a_float_for_equal_weights():
    assert weights.point_ridge(0.02, None) == 0.02
    assert weights.point_ridge(0.02, np.ones(5)) == 0.02
    assert isinstance(weights.point_ridge(0.02, np.full(5, 4.0)), float)
    np.testing.assert_array_equal(weights.point_ridge(0.02, np.array([1.0, 2.0])), [0.02, 0.01])
    assert weights.point_ridge(0.0, np.array([1.0, 2.0])).tolist() == [0.0, 0.0]  # the hard margin stays hard
    with pytest.raises(ValueError, match="positive weight"):
        weights.point_ridge(0.02, np.array([1.0, 0.0]))


# ----------------------------------------------------------------------------- the estimator


def _same_model(a, b, support=None):
    """Bit-identical models; ``support`` maps ``b``'s support indices to ``a``'s training rows."""
    expected_support = b.support_ if support is None else support[b.support_]
    np.testing.assert_array_equal(a.support_, expected_support)
    for name in ("dual_coef_", "intercept_", "kernel_weights_", "raw_kernel_weights_"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    np.testing.assert_array_equal(a.classes_, b.classes_)


def _three_classes(n=90, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(size=(n, 5))
    y = np.array(["a", "b", "c"])[np.digitize(X[:, 0] + 0.5 * X[:, 1] + 0.2 * rng.normal(size=n), [0.6, 1.0])]
    return X, y


@pytest.mark.parametrize(
    "params",
    [{"C": 10.0, "polish": False, "epsilon": 0.3}, {"C": 10.0}, {"C": 10.0, "scale_C": False, "max_iter": 50}],
    ids=["mwu", "polished", "paper-C"],
)
@pytest.mark.parametrize("three", [False, True], ids=["binary", "one-vs-rest"])
def test_unit_sample_weights_give_the_unweighted_model_bit_for_bit(params, three):
    X, y = _three_classes() if three else _data()
    ref = MWUMKLClassifier(kernels=SPECS[:3], **params).fit(X, y)
    clf = MWUMKLClassifier(kernels=SPECS[:3], **params).fit(X, y, sample_weight=np.ones(len(y)))
    _same_model(clf, ref)
    assert ref.polished_ == (params.get("polish", "auto") == "auto")
    # A dict of unit class weights is no weight either.
    labels = np.unique(y)
    cw = MWUMKLClassifier(kernels=SPECS[:3], class_weight=dict.fromkeys(labels, 1.0), **params).fit(X, y)
    _same_model(cw, ref)


def test_unit_sample_weights_with_C_auto_choose_the_same_C():
    X, y = _data(n=50)
    ref = MWUMKLClassifier(kernels=SPECS[:2], epsilon=0.4, polish=False).fit(X, y)
    clf = MWUMKLClassifier(kernels=SPECS[:2], epsilon=0.4, polish=False).fit(X, y, sample_weight=np.ones(50))
    assert clf.C_path_ == ref.C_path_ and clf.C_ == ref.C_
    _same_model(clf, ref)


@pytest.mark.parametrize("three", [False, True], ids=["binary", "one-vs-rest"])
def test_zero_weight_is_a_removed_row(three):
    X, y = _three_classes() if three else _data()
    sw = np.random.default_rng(2).integers(0, 3, len(y)).astype(float)
    kept = np.flatnonzero(sw > 0)
    params = {"kernels": SPECS[:3], "C": 10.0, "class_weight": "balanced"}
    clf = MWUMKLClassifier(**params).fit(X, y, sample_weight=sw)
    ref = MWUMKLClassifier(**params).fit(X[kept], y[kept], sample_weight=sw[kept])
    _same_model(clf, ref, support=kept)
    assert clf.polished_
    np.testing.assert_array_equal(clf.support_vectors_, X[clf.support_])  # support_ indexes the rows given
    Xt = np.random.default_rng(3).uniform(size=(20, X.shape[1]))
    np.testing.assert_array_equal(clf.decision_function(Xt), ref.decision_function(Xt))


def test_zero_weight_with_precomputed_kernels_keeps_all_training_columns():
    X, y = _data(n=40)
    Xt = np.random.default_rng(3).uniform(size=(15, X.shape[1]))
    K, Kt = explicit_kernels(SPECS[:3], X), explicit_kernels(SPECS[:3], Xt, X)
    sw = np.ones(40)
    sw[::4] = 0.0
    kept = np.flatnonzero(sw > 0)
    clf = MWUMKLClassifier(kernels="precomputed", C=10.0).fit(K, y, sample_weight=sw)
    ref = MWUMKLClassifier(kernels="precomputed", C=10.0).fit(K[np.ix_(range(3), kept, kept)], y[kept])
    _same_model(clf, ref, support=kept)
    assert clf.n_features_in_ == 40
    np.testing.assert_array_equal(clf.decision_function(Kt), ref.decision_function(Kt[:, :, kept]))


def test_integer_weights_equal_repeated_rows_for_one_gaussian_kernel_polished():
    """The equivalence that holds: one kernel (weight 1), a constant diagonal (traces n and C * n cancel: the
    problem is (K + diag(1 / (C k_j))) / n either way) and the exact polish."""
    X, y = _data(n=40, seed=4)
    k = np.random.default_rng(5).integers(0, 4, len(y))
    params = {"kernels": [Gaussian(0.8)], "C": 3.0, "polish": True}
    clf = MWUMKLClassifier(**params).fit(X, y, sample_weight=k)
    rep = MWUMKLClassifier(**params).fit(np.repeat(X, k, axis=0), np.repeat(y, k))
    Xt = np.random.default_rng(6).uniform(size=(30, X.shape[1]))
    np.testing.assert_allclose(clf.decision_function(Xt), rep.decision_function(Xt), atol=2e-3)
    np.testing.assert_array_equal(clf.predict(X), rep.predict(X))


def test_weights_reach_the_solver_as_per_point_ridge():
    """An unpolished weighted fit is ``mwu.solve`` with ``ridge_j = 1 / (C n w_j)``, ``w`` = sample x class weight."""
    X, y = _data()
    sw = np.random.default_rng(7).uniform(0.5, 2.0, len(y))
    cw = {1.0: 3.0}
    clf = MWUMKLClassifier(
        kernels=SPECS, C=10.0, epsilon=0.3, polish=False, class_weight=cw, n_shards=2, selectivity="paper"
    ).fit(X, y, sample_weight=sw)
    ridge = 1.0 / (10.0 * len(y)) / (sw * np.where(y > 0, 3.0, 1.0))
    lib = run_library(FeatureProblem(X, y, KernelSet(SPECS, X.shape[1])), ridge, clf.n_iter_)
    alpha = np.zeros(len(y))
    alpha[clf.support_] = clf.dual_coef_[0] * y[clf.support_]
    np.testing.assert_array_equal(alpha, lib["res"].alpha)
    np.testing.assert_array_equal(clf.kernel_weights_, lib["res"].kernel_weights)
    assert clf.intercept_[0] == lib["res"].bias


def test_one_vs_rest_problems_are_the_binary_problems_with_sklearns_convention():
    X, y = _three_classes()
    params = {"kernels": SPECS[:3], "C": 10.0, "epsilon": 0.3, "polish": False}
    for class_weight in ("balanced", {"a": 3.0, "c": 0.5}):
        ovr = MWUMKLClassifier(class_weight=class_weight, **params).fit(X, y)
        for k, target in enumerate(ovr.classes_):
            if class_weight == "balanced":  # balanced on the binary problem itself
                binary = MWUMKLClassifier(class_weight="balanced", **params).fit(X, y == target)
            else:  # every point weighs its own original label's weight
                w = np.array([class_weight.get(label, 1.0) for label in y])
                binary = MWUMKLClassifier(**params).fit(X, y == target, sample_weight=w)
            np.testing.assert_array_equal(ovr.kernel_weights_[k], binary.kernel_weights_)
            np.testing.assert_array_equal(ovr.intercept_[k], binary.intercept_[0])


def test_balanced_class_weight_lowers_the_balanced_error_on_imbalanced_data():
    rng = np.random.default_rng(8)
    n = 400
    X = rng.uniform(size=(n, 2))
    y = np.where(X[:, 0] + 0.35 * rng.normal(size=n) > 0.82, 1, 0)  # about 80 / 20
    assert 0.1 < y.mean() < 0.3
    Xt = rng.uniform(size=(2000, 2))
    yt = np.where(Xt[:, 0] + 0.35 * rng.normal(size=2000) > 0.82, 1, 0)
    from sklearn.metrics import balanced_accuracy_score

    params = {"kernels": "linear,gaussian:0.5", "C": 1.0}
    plain = MWUMKLClassifier(**params).fit(X, y)
    balanced = MWUMKLClassifier(class_weight="balanced", **params).fit(X, y)
    err_plain = 1 - balanced_accuracy_score(yt, plain.predict(Xt))
    err_balanced = 1 - balanced_accuracy_score(yt, balanced.predict(Xt))
    assert err_balanced < err_plain - 0.03
    assert balanced.predict(Xt).mean() > plain.predict(Xt).mean()  # more of the minority class


def test_C_auto_fits_its_folds_with_the_weights(monkeypatch):
    calls = record_nested_fits(monkeypatch)
    X, y = _data(n=45)
    sw = 1.0 + np.arange(45) / 100.0  # each point's weight names it
    clf = MWUMKLClassifier(kernels=SPECS[:2], epsilon=0.4, polish=False, selectivity=100.0).fit(X, y, sample_weight=sw)
    folds = [weights for _, _, weights in calls]
    assert len(folds) == 18 and all(w is not None and np.isin(w, sw).all() for w in folds)
    assert all(len(w) == 30 for w in folds)  # 3 folds: two thirds of the points each
    ref = MWUMKLClassifier(kernels=SPECS[:2], epsilon=0.4, polish=False, selectivity=100.0).fit(X, y)
    assert clf.C_path_ != ref.C_path_  # weighted fits, weighted errors


@pytest.mark.parametrize(
    ("fit_kwargs", "params", "match"),
    [
        ({"sample_weight": -np.ones(60)}, {}, "non-negative"),
        ({"sample_weight": np.full(60, np.nan)}, {}, "NaN or infinity"),
        ({"sample_weight": np.ones(59)}, {}, r"shape \(60,\)"),
        ({"sample_weight": np.zeros(60)}, {}, "zero everywhere"),
        ({}, {"class_weight": {5: 2.0}}, "not training labels"),
        ({}, {"class_weight": {1.0: -2.0}}, "positive finite"),
        ({}, {"class_weight": "unbalanced"}, "class_weight must be None, 'balanced' or a dict"),
        ({}, {"probability": "yes"}, "probability must be True or False"),
    ],
)
def test_bad_weights_are_refused(fit_kwargs, params, match):
    X, y = _data()
    with pytest.raises(ValueError, match=match):
        MWUMKLClassifier(C=10.0, **params).fit(X, y, **fit_kwargs)


def test_weights_leaving_one_class_are_refused():
    X, y = _data()
    with pytest.raises(ValueError, match=r"only one class \(1.0\) has points of non-zero sample weight"):
        MWUMKLClassifier(C=10.0).fit(X, y, sample_weight=(y > 0).astype(float))


def test_sample_weight_with_a_store_is_refused(tmp_path):
    pytest.importorskip("zarr")
    from mwumkl_dist.stores import write_data_store

    X, y = _data()
    store = write_data_store(tmp_path / "d.zarr", X, y)
    with pytest.raises(ValueError, match="sample_weight is not supported for a fit from a store"):
        MWUMKLClassifier(C=10.0).fit(store, sample_weight=np.ones(len(y)))
    # class_weight is: a store fit with class weights is the in-memory fit with them.
    params = {"kernels": SPECS[:2], "C": 10.0, "epsilon": 0.3, "class_weight": "balanced"}
    _same_model(MWUMKLClassifier(**params).fit(store), MWUMKLClassifier(**params, polish=False).fit(X, y))


def test_weighted_fit_resumes_from_its_checkpoint(tmp_path):
    """Three classes, balanced and sample weights, one point of weight 0: stopped, resumed, the same model."""
    X, y = _three_classes()
    sw = np.random.default_rng(9).uniform(0.5, 2.0, len(y))
    sw[5] = 0.0
    params = {"kernels": SPECS[:3], "C": 10.0, "epsilon": 0.3, "polish": False, "class_weight": "balanced"}
    ref = MWUMKLClassifier(**params).fit(X, y, sample_weight=sw)
    ckpt = tmp_path / "c.npz"
    with pytest.raises(mwu.FitInterrupted):
        MWUMKLClassifier(**params, checkpoint=ckpt, checkpoint_every=10, callback=lambda info: info.iteration >= 30,
                         callback_every=10).fit(X, y, sample_weight=sw)  # fmt: skip
    _same_model(MWUMKLClassifier(**params).fit(X, y, sample_weight=sw, resume=ckpt), ref)
    with pytest.raises(ValueError, match="different data"):  # other weights, other ridges: another fit
        MWUMKLClassifier(**params).fit(X, y, sample_weight=np.where(sw > 0, 1.0, 0.0), resume=ckpt)


def test_class_weight_dict_survives_save_and_load(tmp_path):
    X, y = _data()
    y = np.where(y > 0, 7, -3)  # integer labels: JSON would turn dict keys into strings
    clf = MWUMKLClassifier(kernels=SPECS[:2], C=10.0, class_weight={7: 2.5}).fit(X, y)
    clf.save(tmp_path / "m.npz")
    loaded = MWUMKLClassifier.load(tmp_path / "m.npz")
    assert loaded.get_params()["class_weight"] == {7: 2.5}
    np.testing.assert_array_equal(loaded.decision_function(X), clf.decision_function(X))
    refit = loaded.fit(X, y)  # the loaded parameters fit the same model
    np.testing.assert_array_equal(refit.dual_coef_, clf.dual_coef_)


def test_folds_of_an_unpolished_weighted_fit_run_its_iterations_per_point(monkeypatch):
    """C="auto" and probability folds of an unpolished fit with unequal weights run the final T / n, not their own:
    with fewer iterations per point a weighted MWU bias drifts (a9a, 8000 rows, balanced: C=0.1 looked best on
    folds of their own T and gave 43 % balanced error at full size)."""
    nested = record_nested_fits(monkeypatch)
    X, y = _data(n=60)
    assert (y > 0).sum() != 30  # "balanced" weighs the classes differently
    clf = MWUMKLClassifier(
        kernels=SPECS[:2], epsilon=0.4, polish=False, class_weight="balanced", probability=True, selectivity=100.0
    ).fit(X, y)
    calls = [(spec["max_iter"], n) for spec, n, _ in nested]
    assert len(calls) == 18 + 5  # the folds (the outer fit is not recorded)
    for max_iter, n_train in calls:
        assert max_iter == math.ceil(clf.n_iter_ / 60 * n_train)
    nested.clear()
    MWUMKLClassifier(kernels=SPECS[:2], epsilon=0.4, polish=False, selectivity=100.0).fit(
        X, y
    )  # no weights: each fold its own epsilon
    assert all(spec["max_iter"] is None for spec, _, _ in nested)
