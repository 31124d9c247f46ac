"""Kernel specs, families, parsing, the random bank and the numba kernel evaluation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp
from conftest import explicit_kernel, explicit_kernels

from mwumkl_dist.data.shards import FeatureShard
from mwumkl_dist.devices import cpu as _columns
from mwumkl_dist.kernels import (
    PAPER_SIGMAS,
    Gaussian,
    KernelSet,
    Linear,
    Polynomial,
    RandomGaussianBank,
    format_number,
    paper_family,
    paper_per_feature_family,
    parse_kernels,
    parse_number,
)
from mwumkl_dist.kernels.evaluation import as_csr, plan_args

D = 6

SPECS = [
    Linear(),
    Linear(features=(1, 4)),
    Polynomial(2),
    Polynomial(3, coef0=0.25, features=(0, 2, 5)),
    Polynomial(1, coef0=0.0, features=(3,)),
    Gaussian(0.8),
    Gaussian(0.8 / math.sqrt(2)),  # squares of the previous kernel ...
    Gaussian(0.4),  # ... and of that one
    Gaussian(1.5, features=(1, 4)),
    Gaussian(0.3, features=(3,)),
] + paper_family(features=(0, 5))


def _data(seed, n=30, density=0.5):
    rng = np.random.default_rng(seed)
    X = rng.uniform(size=(n, D)) * (rng.uniform(size=(n, D)) < density)
    return X


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
def test_raw_columns_and_diagonal_match_formulas(sparse):
    X = _data(0)
    P = np.random.default_rng(1).uniform(size=(2, D))
    P[1, 2] = 0.0
    ks = KernelSet(SPECS, D)
    shard = FeatureShard(sp.csr_matrix(X) if sparse else X, np.ones(len(X)), 0, ks.plan)
    colp, colq = shard.raw_columns(P[0], P[1])
    expected = explicit_kernels(SPECS, X, P)  # (m, n, 2)
    np.testing.assert_allclose(colp, expected[:, :, 0].T, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(colq, expected[:, :, 1].T, rtol=1e-12, atol=1e-14)
    traces = np.einsum("inn->i", explicit_kernels(SPECS, X))
    np.testing.assert_allclose(shard.diagonal().sum(axis=0), traces, rtol=1e-13)


def test_columns_against_own_rows_are_the_diagonal():
    X = _data(2)
    ks = KernelSet(SPECS, D)
    shard = FeatureShard(X, np.ones(len(X)), 0, ks.plan)
    colp, colq = shard.raw_columns(X[3], X[7])
    K = explicit_kernels(SPECS, X)
    np.testing.assert_allclose(colp, K[:, :, 3].T, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(colq, K[:, :, 7].T, rtol=1e-12, atol=1e-14)
    # a Gaussian at distance 0 is exactly 1 (the distance is clamped, never negative)
    gauss = [i for i, s in enumerate(SPECS) if isinstance(s, Gaussian)]
    assert np.all(colp[3, gauss] == 1.0)


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
def test_weighted_kernel_sums(sparse):
    rng = np.random.default_rng(3)
    Xq, Xsv = _data(4, n=17), _data(5, n=9)
    ks = KernelSet(SPECS, D)
    plan = ks.plan
    m = len(SPECS)
    coef = rng.normal(size=(3, len(Xsv)))
    coef[1, 4] = 0.0
    weights = rng.uniform(size=(3, m))
    q = as_csr(sp.csr_matrix(Xq) if sparse else Xq)
    sv = as_csr(Xsv)
    sv_sq = _columns.group_sqnorms(sv.indptr, sv.indices, sv.data, plan.feat_ptr, plan.feat_groups, plan.n_groups)
    out = _columns.weighted_kernel_sums(q, D, sv, sv_sq, coef, weights, plan_args(plan))
    K = explicit_kernels(SPECS, Xq, Xsv)  # (m, n_q, n_sv)
    expected = np.einsum("itj,oj,oi->to", K, coef, weights)
    np.testing.assert_allclose(out, expected, rtol=1e-11, atol=1e-12)


def test_squaring_chain_is_exact():
    # The paper's sigmas 2^(k/2) form one chain: gaussian:1 = gaussian:sqrt2 ** 2 = ... = gaussian:16 ** 256.
    ks = KernelSet("paper", D)
    plan = ks.plan
    gauss = list(range(3, 12))
    assert [int(plan.square_of[i]) for i in gauss] == [4, 5, 6, 7, 8, 9, 10, 11, -1]
    order = list(plan.order)
    assert all(order.index(plan.square_of[i]) < order.index(i) for i in gauss[:-1])
    X = np.random.default_rng(6).uniform(size=(40, D))
    shard = FeatureShard(X, np.ones(len(X)), 0, plan)
    colp, colq = shard.raw_columns(X[0], X[1] * 2.0)
    specs = ks.specs
    for cols, point in ((colp, X[:1]), (colq, X[1:2] * 2.0)):
        expected = explicit_kernels(specs, X, point)[:, :, 0].T
        rel = np.abs(cols / expected - 1.0)
        assert rel.max() < 1e-13, rel.max(axis=0)


def test_gaussians_not_exactly_doubled_do_not_chain():
    ks = KernelSet([Gaussian(1.0), Gaussian(1.0 / math.sqrt(2) * (1 + 1e-9)), Gaussian(0.5, features=(0,))], D)
    assert list(ks.plan.square_of) == [-1, -1, -1]


def test_feature_groups_are_shared():
    ks = KernelSet(["linear", "gaussian:1", "poly:2@0-2", "gaussian:2@0+1+2", "linear@5"], D)
    assert ks.plan.n_groups == 3
    assert list(ks.plan.group) == [0, 0, 1, 1, 2]


# ----------------------------------------------------------------------------- specs and parsing

ROUND_TRIP = [
    Linear(),
    Linear(features=(1,)),
    Linear(features=(0, 1, 2, 4, 7, 8)),
    Polynomial(3),
    Polynomial(2, coef0=0.1234567891),
    Polynomial(1, coef0=0.0, features=(2, 3)),
    Polynomial(4, coef0=-1.5e-7),
    Gaussian(0.1),
    Gaussian(math.pi, features=(0, 2, 3, 4, 9)),
    Gaussian(PAPER_SIGMAS[5]),
    Gaussian(1e-3),
]


@pytest.mark.parametrize("spec", ROUND_TRIP, ids=str)
def test_spec_string_round_trip(spec):
    assert parse_kernels(str(spec), 10) == [spec]
    assert KernelSet(str(spec), 10).specs == [spec]


def test_names_round_trip_whole_sets():
    # decision_function rebuilds the kernels from kernel_names_, so names must parse back exactly.
    for kernels in ["paper", "paper-per-feature", "random:40:size=3:seed=9:widths=paper", ROUND_TRIP]:
        ks = KernelSet(kernels, 10)
        again = KernelSet(",".join(ks.names()), 10)
        assert again.specs == ks.specs
        for a in ("kind", "param_a", "param_b", "group", "square_of"):
            np.testing.assert_array_equal(getattr(again.plan, a), getattr(ks.plan, a))


def test_parse_forms():
    assert parse_kernels("linear, poly:2 ,RBF:0.5@3", 5) == [Linear(), Polynomial(2), Gaussian(0.5, features=(3,))]
    assert parse_kernels("polynomial:3:coef0=2", 5) == [Polynomial(3, coef0=2.0)]
    assert parse_kernels("gaussian:2@0-2+4", 5) == [Gaussian(2.0, features=(0, 1, 2, 4))]
    assert parse_kernels("paper@1-2", 5) == paper_family(features=(1, 2))
    assert parse_kernels("random:5:seed=3:size=1:widths=paper", 5) == [RandomGaussianBank(5, subset_size=1, seed=3)]
    # features are a set: order and repeats do not matter
    assert Gaussian(1.0, features=(3, 1, 3)).features == (1, 3)
    assert Gaussian(1.0, features=2).features == (2,)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", "empty kernel spec"),
        ("   ", "empty kernel spec"),
        ("foo", "unknown kernel 'foo'"),
        ("linear,sigmoid:1", "unknown kernel 'sigmoid'"),
        ("gaussian:abc", "bad number 'abc'"),
        ("poly:2.5", "bad number '2.5'"),
        ("random:many", "bad number 'many'"),
        ("gaussian:-1", "sigma must be a positive"),
        ("gaussian:0", "sigma must be a positive"),
        ("gaussian:nan", "sigma must be a positive"),
        ("poly:0", "degree must be a positive integer"),
        ("poly", "expected 'poly:DEGREE"),
        ("gaussian:1:2", "expected 'gaussian:SIGMA'"),
        ("linear:3", "takes no parameters"),
        ("linear@3-1", "bad feature range '3-1'"),
        ("linear@a", "cannot parse kernel spec"),
        ("linear,,gaussian:1", "cannot parse kernel spec ''"),
        ("random:0", "n_kernels must be a positive integer"),
        ("random:3:size=0", "subset_size must be a positive integer"),
        ("paper-per-feature@1", "takes no feature list"),
    ],
)
def test_bad_spec_strings(text, match):
    with pytest.raises(ValueError, match=match):
        KernelSet(text, 5)


def test_bad_kernel_sets():
    with pytest.raises(ValueError, match="uses feature 7 but the data has 5 features"):
        KernelSet("linear@7", 5)
    with pytest.raises(ValueError, match="uses feature 5 but the data has 5 features"):
        KernelSet([Gaussian(1.0, features=(0, 5))], 5)
    with pytest.raises(ValueError, match="empty"):
        KernelSet([], 5)
    with pytest.raises(ValueError, match="must not be empty"):
        Gaussian(1.0, features=())
    with pytest.raises(ValueError, match=">= 0"):
        Linear(features=(-1,))
    with pytest.raises(TypeError, match="kernels must be"):
        KernelSet(3.5, 5)
    with pytest.raises(TypeError, match="not a kernel spec"):
        KernelSet([Linear(), 3], 5)
    with pytest.raises(ValueError, match="n_features"):
        KernelSet("linear", 0)


# ----------------------------------------------------------------------------- families and the bank


def test_paper_families():
    fam = paper_family()
    assert len(fam) == 12
    assert [s.degree for s in fam[:3]] == [1, 2, 3]
    np.testing.assert_allclose([s.sigma for s in fam[3:]], 2.0 ** (np.arange(9) / 2.0), rtol=1e-15)
    assert len(KernelSet("paper", 7)) == 12
    per = paper_per_feature_family(7)
    assert len(per) == 12 * 7 == len(KernelSet("paper-per-feature", 7))
    assert [s.features for s in per[::12]] == [(f,) for f in range(7)]
    assert per[12:24] == paper_family(features=(1,))


def test_random_bank_is_a_pure_function_of_seed_and_index():
    bank = RandomGaussianBank(200, subset_size=3, seed=17)
    d = 12
    subsets, sigmas = bank.block(0, 200, d)
    assert subsets.shape == (200, 3)
    assert np.all(np.diff(subsets, axis=1) > 0) and subsets.min() >= 0 and subsets.max() < d
    assert set(sigmas) <= set(PAPER_SIGMAS) and len(set(sigmas)) > 5
    # any block boundaries give the same kernels
    for cuts in ([0, 1, 77, 200], [0, 100, 199, 200], [0, 13, 26, 150, 200]):
        parts = [bank.block(a, b, d) for a, b in zip(cuts[:-1], cuts[1:])]
        np.testing.assert_array_equal(np.vstack([p[0] for p in parts]), subsets)
        np.testing.assert_array_equal(np.concatenate([p[1] for p in parts]), sigmas)
    # a fresh object with the same parameters and the spec string give the same kernels
    same = RandomGaussianBank(200, subset_size=3, seed=17).specs(d)
    assert same == bank.specs(d) == KernelSet("random:200:size=3:seed=17:widths=paper", d).specs
    assert same[5] == Gaussian(float(sigmas[5]), features=tuple(subsets[5]))
    # a longer bank starts with the shorter one
    np.testing.assert_array_equal(RandomGaussianBank(500, 3, 17).block(0, 200, d)[0], subsets)
    # distinct seeds give different kernels
    other, other_sig = RandomGaussianBank(200, subset_size=3, seed=18).block(0, 200, d)
    assert (other != subsets).any(axis=1).mean() > 0.5
    assert not np.array_equal(other_sig, sigmas)
    # subsets cover the features roughly evenly
    counts = np.bincount(subsets.ravel(), minlength=d)
    assert counts.min() > 0.5 * counts.mean()


def test_random_bank_subset_larger_than_features():
    subsets, _ = RandomGaussianBank(5, subset_size=10, seed=0).block(0, 5, 4)
    np.testing.assert_array_equal(subsets, np.tile(np.arange(4), (5, 1)))


def test_explicit_kernel_helper_sanity():
    # The test oracle itself, on hand-computed values.
    X = np.array([[1.0, 2.0], [0.0, 1.0]])
    np.testing.assert_allclose(explicit_kernel(Linear(), X), [[5, 2], [2, 1]])
    np.testing.assert_allclose(explicit_kernel(Polynomial(2), X), [[36, 9], [9, 4]])
    np.testing.assert_allclose(explicit_kernel(Gaussian(1.0), X)[0, 1], math.exp(-1.0))
    np.testing.assert_allclose(explicit_kernel(Linear(features=(1,)), X), [[4, 2], [2, 1]])


def test_short_kernel_names_parse_back_to_identical_kernels():
    names = KernelSet("paper", 2).names()
    assert names[3:] == [f"gaussian:{s}" for s in ("1", "2^0.5", "2", "2^1.5", "4", "2^2.5", "8", "2^3.5", "16")]
    for k in range(-40, 41):  # every power of two with an exponent in quarters: short, and exact
        sigma = 2.0 ** (k / 4)
        name = str(Gaussian(sigma, features=(0,)))
        assert len(name) <= len("gaussian:2^-9.75@0"), name
        assert parse_kernels(name, 1) == [Gaussian(sigma, features=(0,))]
        assert parse_kernels(name, 1)[0].sigma == sigma  # the identical float, not merely close
    assert str(Gaussian(0.1)) == "gaussian:0.1"  # 12 digits round-trip: the short decimal
    assert str(Gaussian(1 / 3)) == "gaussian:0.3333333333333333"  # else repr, which round-trips
    assert str(Polynomial(2, coef0=1 / 3)) == "poly:2:coef0=0.3333333333333333"
    # Names written before the short form (17 digits) still parse to the same kernels.
    assert parse_kernels("gaussian:1.4142135623730951", 1) == parse_kernels("gaussian:2^0.5", 1)
    assert format_number(3.0) == "3" and parse_number(" 2^-1 ") == 0.5
    for bad in ("2^x", "^2", "2^2000", "2^^1"):
        with pytest.raises(ValueError, match="bad number"):
            parse_kernels(f"gaussian:{bad}", 1)


def test_predictions_identical_through_short_names():
    """decision_function rebuilds the kernels from kernel_names_: the short names give the same numbers."""
    from mwumkl_dist import MWUMKLClassifier

    rng = np.random.default_rng(5)
    X = rng.random((40, 3))
    y = np.where(X[:, 0] + X[:, 1] > 1.0, 1, -1)
    specs = [Gaussian(2.0 ** (k / 2)) for k in (-1, 1, 3)] + [Gaussian(0.3, features=(1, 2))]
    clf = MWUMKLClassifier(kernels=specs, C=10.0, epsilon=0.4, polish=False).fit(X, y)
    assert clf.kernel_names_[:3] == ["gaussian:2^-0.5", "gaussian:2^0.5", "gaussian:2^1.5"]
    again = MWUMKLClassifier(kernels=",".join(clf.kernel_names_), C=10.0, epsilon=0.4, polish=False).fit(X, y)
    np.testing.assert_array_equal(again.dual_coef_, clf.dual_coef_)
    np.testing.assert_array_equal(again.decision_function(X), clf.decision_function(X))
