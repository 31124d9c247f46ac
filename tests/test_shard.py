"""Shards and the local engine: the superstep against dense formulas, and sharding invariance."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from conftest import explicit_kernels

from mwumkl_dist import MWUMKLClassifier
from mwumkl_dist.core.partition import split_rows
from mwumkl_dist.data.problems import FeatureProblem, PrecomputedProblem
from mwumkl_dist.data.shards import FeatureShard, PrecomputedShard
from mwumkl_dist.engines.local import LocalEngine
from mwumkl_dist.kernels import Gaussian, KernelSet, Linear, Polynomial
from mwumkl_dist.solvers import mwu

SPECS = [
    Linear(features=(0, 1)),
    Polynomial(2),
    Gaussian(0.7),
    Gaussian(0.7 / np.sqrt(2)),
    Gaussian(1.0, features=(2,)),
]


def _problem(seed=0, n=40, d=3):
    rng = np.random.default_rng(seed)
    X = rng.uniform(size=(n, d))
    y = np.where((X - 0.5) @ rng.normal(size=d) + 0.3 * rng.normal(size=n) > 0, 1.0, -1.0)
    assert 3 < (y > 0).sum() < n - 3
    return X, y


def test_split_rows():
    for n, k in [(10, 1), (10, 3), (10, 10), (7, 4), (100, 6)]:
        parts = split_rows(n, k)
        assert len(parts) == k
        assert parts[0][0] == 0 and parts[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(parts[:-1], parts[1:]))
        sizes = [b - a for a, b in parts]
        assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1
    assert split_rows(3, 8) == [(0, 1), (1, 2), (2, 3)]  # never an empty shard
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match="n_shards"):
            split_rows(10, bad)


def test_superstep_against_dense_columns():
    X, y = _problem(1)
    n = len(y)
    K = explicit_kernels(SPECS, X)
    r = np.einsum("inn->i", K)
    ridge = 0.05
    G = y[None, :, None] * K * y[None, None, :] / r[:, None, None] + ridge * np.eye(n)[None]
    shard = FeatureShard(X[10:30], y[10:30], 10, KernelSet(SPECS, 3).plan)
    shard.configure(1.0 / r, ridge)
    ip, iq = int(np.flatnonzero(y > 0)[3]), int(np.flatnonzero(y < 0)[5])  # global rows, maybe outside the shard
    coef = np.array([-0.5, -1.0, -0.2, -0.7, -0.1])
    V = np.zeros((n, len(SPECS)))
    alpha = np.zeros(n)
    for _ in range(3):
        pos, neg = shard.superstep(ip, iq, X[ip], X[iq], coef)
        alpha[[ip, iq]] += 0.5
        V = (G @ alpha).T
        np.testing.assert_allclose(shard.V, V[10:30], rtol=1e-12, atol=1e-15)
        np.testing.assert_array_equal(shard.alpha, alpha[10:30])
        g = V[10:30] @ coef
        yy = y[10:30]
        for cand, cls in ((pos, 1.0), (neg, -1.0)):
            rows = np.flatnonzero(yy == cls)
            best = rows[np.argmax(g[rows])]
            assert cand.index == 10 + best
            assert cand.g == pytest.approx(g[best], rel=1e-12)
            np.testing.assert_array_equal(cand.v_row, shard.V[best])
            np.testing.assert_array_equal(cand.point, X[10 + best])
        ip, iq = pos.index, neg.index


def test_precomputed_shard_matches_feature_shard():
    X, y = _problem(2)
    K = explicit_kernels(SPECS, X)
    r = np.einsum("inn->i", K)
    feat = FeatureShard(X[5:25], y[5:25], 5, KernelSet(SPECS, 3).plan)
    pre = PrecomputedShard(K[:, 5:25, :], y[5:25], 5)
    np.testing.assert_allclose(pre.diagonal().sum(axis=0), feat.diagonal().sum(axis=0), rtol=1e-13)
    for s in (feat, pre):
        s.configure(1.0 / r, 0.01)
    ip, iq = int(np.flatnonzero(y > 0)[0]), int(np.flatnonzero(y < 0)[0])
    coef = -np.ones(len(SPECS))
    for _ in range(4):
        pf, nf = feat.superstep(ip, iq, X[ip], X[iq], coef)
        pp, npc = pre.superstep(ip, iq, ip, iq, coef)
        np.testing.assert_allclose(pre.V, feat.V, rtol=1e-12, atol=1e-15)
        assert (pf.index, nf.index) == (pp.index, npc.index)
        assert pp.point == pp.index  # precomputed points travel as global indices
        ip, iq = pf.index, nf.index


def test_initial_candidates_and_missing_class():
    X, y = _problem(3)
    plan = KernelSet(SPECS, 3).plan
    y_all_pos = np.ones(6)
    shard = FeatureShard(X[:6], y_all_pos, 100, plan)
    pos, neg = shard.initial_candidates()
    assert (pos.index, pos.g) == (100, 0.0)
    assert neg.index == -1  # no row of that class on this shard
    shard.configure(np.ones(len(SPECS)), 0.0)
    p, n = shard.superstep(0, 1, X[0], X[1], -np.ones(len(SPECS)))
    assert n.index == -1 and p.index >= 100


def test_shard_errors_and_reset():
    X, y = _problem(4)
    plan = KernelSet(SPECS, 3).plan
    shard = FeatureShard(X, y, 0, plan)
    with pytest.raises(RuntimeError, match="not configured"):
        shard.superstep(0, 1, X[0], X[1], np.zeros(len(SPECS)))
    shard.configure(np.ones(len(SPECS)), 0.0)
    shard.superstep(0, 1, X[0], X[1], -np.ones(len(SPECS)))
    assert shard.alpha.sum() == 1.0 and np.abs(shard.V).sum() > 0
    shard.configure(np.ones(len(SPECS)), 0.0)  # configure resets the state
    assert shard.alpha.sum() == 0.0 and np.abs(shard.V).sum() == 0.0
    with pytest.raises(ValueError, match=r"\+1 or -1"):
        FeatureShard(X, np.where(y > 0, 1.0, 0.0), 0, plan)
    with pytest.raises(ValueError, match="rows but"):
        FeatureShard(X, y[:-1], 0, plan)
    with pytest.raises(ValueError, match="features"):
        FeatureShard(X[:, :2], y, 0, plan)
    with pytest.raises(ValueError, match="precomputed shard block"):
        PrecomputedShard(np.zeros((2, 3, 3)), np.ones(4), 0)


# ----------------------------------------------------------------------------- sharding invariance


def _same(a, b, tol=1e-12):
    np.testing.assert_array_equal(a.support_, b.support_)
    np.testing.assert_allclose(a.dual_coef_, b.dual_coef_, rtol=tol, atol=0)
    np.testing.assert_allclose(a.kernel_weights_, b.kernel_weights_, rtol=tol, atol=0)
    np.testing.assert_allclose(a.intercept_, b.intercept_, rtol=tol, atol=tol)
    assert np.array_equal(a.n_iter_, b.n_iter_)


@pytest.mark.parametrize("kind", ["dense", "csr", "precomputed", "hard-margin", "multiclass"])
def test_n_shards_does_not_change_the_model(kind):
    X, y = _problem(5, n=53, d=3)
    Xt = np.random.default_rng(9).uniform(size=(10, 3))
    params = dict(kernels=SPECS, epsilon=0.3, C=10.0, polish=False)
    if kind == "csr":
        X[X < 0.4] = 0.0
        X = sp.csr_matrix(X)
    elif kind == "precomputed":
        X, Xt = explicit_kernels(SPECS, X), explicit_kernels(SPECS, Xt, X)
        params["kernels"] = "precomputed"
    elif kind == "hard-margin":
        params["C"] = np.inf
    elif kind == "multiclass":
        y = np.digitize(X[:, 0] + X[:, 1], [0.8, 1.2])
    base = MWUMKLClassifier(n_shards=1, **params).fit(X, y)
    for k in (2, 3, 4, 5):
        other = MWUMKLClassifier(n_shards=k, **params).fit(X, y)
        _same(other, base)
        np.testing.assert_allclose(other.decision_function(Xt), base.decision_function(Xt), rtol=1e-12, atol=1e-12)


def test_engine_solve_is_independent_of_shards():
    X, y = _problem(6, n=31)
    ks = KernelSet(SPECS, 3)
    results = []
    for k in (1, 2, 5, 31):
        for problem in (FeatureProblem(X, y, ks), PrecomputedProblem(explicit_kernels(SPECS, X), y)):
            engine = LocalEngine(problem, n_shards=k)
            assert len(engine.shards) == k
            traces = engine.traces()
            engine.configure(1.0 / traces, 1e-3)
            res = mwu.solve(engine, inv_trace=1.0 / traces, ridge=1e-3, iterations=mwu.Iterations(0.25, 0.5, 120))
            results.append(res)
    for res in results[1:]:
        np.testing.assert_allclose(res.alpha, results[0].alpha, rtol=1e-10, atol=0)
        np.testing.assert_allclose(res.kernel_weights, results[0].kernel_weights, rtol=1e-10)
        assert res.bias == pytest.approx(results[0].bias, rel=1e-10, abs=1e-12)
