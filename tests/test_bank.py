"""Random Gaussian banks at scale: flat tables, the bank shard, kernel sharding, exact sums, prediction."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import explicit_kernel, explicit_kernels, literal

from mwumkl_dist import MWUMKLClassifier
from mwumkl_dist import _bank as bankmod
from mwumkl_dist._bank import (
    BankKernelNames,
    BankProblem,
    BankShard,
    BankTables,
    bank_kernel_block,
    bank_of,
    exact_weighted_row_sums,
)
from mwumkl_dist._exact import SHIFT, exact_column_sums
from mwumkl_dist.kernels import RandomGaussianBank

SPEC = "random:2000:size=2:seed=5"


def _data(n=90, d=6, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.random((n, d))
    y = np.where(X[:, 0] + X[:, 1] + 0.3 * rng.standard_normal(n) > 1.0, "a", "b")
    return X, y


@pytest.fixture(scope="module")
def reference():
    X, y = _data()
    return X, y, MWUMKLClassifier(kernels=SPEC, **literal(epsilon=0.3)).fit(X, y)


def test_bank_of():
    assert bank_of("random:10:size=3:seed=2") == RandomGaussianBank(10, 3, 2)
    bank = RandomGaussianBank(5)
    assert bank_of(bank) is bank and bank_of([bank]) is bank
    assert bank_of("paper") is None and bank_of("random:10,linear") is None and bank_of([bank, bank]) is None


def test_tables_match_the_bank_without_spec_objects():
    bank = RandomGaussianBank(700, subset_size=3, seed=4)
    t = BankTables(bank, 100, 700, 9)
    subsets, sigmas = bank.block(100, 700, 9)
    np.testing.assert_array_equal(t.subsets, subsets)
    specs = bank.specs(9)[100:]
    np.testing.assert_array_equal(t.gamma, [s.gamma for s in specs])  # bit-identical to the Gaussian specs
    pair_of, pair_subset, pair_gamma, unique_subsets = t.pairs
    np.testing.assert_array_equal(unique_subsets[pair_subset[pair_of]], t.subsets)
    np.testing.assert_array_equal(pair_gamma[pair_of], t.gamma)
    assert len(np.unique(unique_subsets, axis=0)) == len(unique_subsets)


def test_kernel_values_match_the_gaussian_formula():
    X, _ = _data(n=30)
    bank = RandomGaussianBank(50, subset_size=2, seed=1)
    K = explicit_kernels(bank.specs(X.shape[1]), X)
    ones_p, ones_q, kpq = bank_kernel_block(bank, X.shape[1], X[3], X[7])
    np.testing.assert_array_equal(ones_p, 1.0)
    np.testing.assert_allclose(kpq, K[:, 3, 7], rtol=1e-14)
    # One superstep from alpha = 0 adds (y_j y_P K(j, P) - y_j y_N K(j, N)) / (2 r) + ridge / 2 on P, N.
    y = np.where(np.arange(30) % 3 == 0, 1.0, -1.0)
    shard = BankShard(X, y, 0, bank)
    shard.configure(np.full(50, 1 / 30), 0.01)
    shard.superstep(3, 7, X[3], X[7], np.zeros(50))
    expected = (0.5 * y[:, None] * (K[:, :, 3].T - K[:, :, 7].T)) / 30
    expected[[3, 7]] += 0.005
    np.testing.assert_allclose(shard.V, expected, rtol=1e-13, atol=1e-17)
    assert shard.trace_parts() == [30 << SHIFT] * 50  # exp(0) = 1 on the diagonal, exactly


def test_shared_and_direct_evaluation_are_bit_identical(monkeypatch):
    X, y = _data(n=40)
    y = np.where(y == "a", 1.0, -1.0)
    bank = RandomGaussianBank(3000, subset_size=2, seed=9)  # 6 features: at most 15 * 9 distinct kernels
    shared = BankShard(X, y, 0, bank)
    monkeypatch.setattr(bankmod, "_MEMO_FRACTION", -1.0)
    direct = BankShard(X, y, 0, bank)
    assert shared.shared and not direct.shared
    rng = np.random.default_rng(0)
    for s in (shared, direct):
        s.configure(np.full(3000, 1 / 40), 1e-3)
    for ip, iq in [(0, 1), (5, 2), (0, 9)]:
        coef = rng.standard_normal(3000)
        a = shared.superstep_scores(ip, iq, X[ip], X[iq], coef)
        b = direct.superstep_scores(ip, iq, X[ip], X[iq], coef)
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(shared.V, direct.V)


def test_exact_weighted_row_sums_equal_exact_column_sums():
    rng = np.random.default_rng(1)
    VT = rng.standard_normal((500, 6)) * np.exp(rng.uniform(-30, 30, (500, 6)))
    VT[::7] = 0.0
    VT[3, 2] = 5e-320  # subnormal
    VT[4, 2] = -1e300
    w = rng.random(500)
    cols = np.array([0, 2, 5, 2])
    assert exact_weighted_row_sums(VT, cols, w) == exact_column_sums((VT[:, cols].T * w).T)
    w[7] = np.inf
    with pytest.raises(ValueError, match="non-finite"):
        exact_weighted_row_sums(VT, np.array([1]), w)


def test_bank_fit_close_to_expanded_gaussian_specs(reference):
    X, y, ref = reference
    specs = RandomGaussianBank(2000, 2, 5).specs(X.shape[1])
    expanded = MWUMKLClassifier(kernels=specs, **literal(epsilon=0.3)).fit(X, y)
    # Same algorithm; only the rounding of |x - z|^2 differs (sum of squares vs expanded norms).
    np.testing.assert_array_equal(ref.support_, expanded.support_)
    np.testing.assert_allclose(ref.dual_coef_, expanded.dual_coef_, rtol=1e-8)
    np.testing.assert_allclose(ref.kernel_weights_, expanded.kernel_weights_, rtol=1e-8)
    np.testing.assert_allclose(ref.decision_function(X), expanded.decision_function(X), rtol=1e-8, atol=1e-10)
    np.testing.assert_array_equal(ref.kernel_traces_, len(X))


def test_kernel_sharded_dask_equals_local_engine(reference):
    distributed = pytest.importorskip("distributed")
    X, y, ref = reference
    with distributed.Client(processes=False, n_workers=2, threads_per_worker=1, dashboard_address=":0") as client:
        for n_shards, n_kernel_shards in [(1, 2), (1, 3), (2, 2)]:
            clf = MWUMKLClassifier(
                kernels=SPEC, **literal(epsilon=0.3), engine="dask", client=client,
                n_shards=n_shards, n_kernel_shards=n_kernel_shards,
            ).fit(X, y)  # fmt: skip
            np.testing.assert_array_equal(clf.dual_coef_, ref.dual_coef_)
            np.testing.assert_array_equal(clf.kernel_weights_, ref.kernel_weights_)
            np.testing.assert_array_equal(clf.intercept_, ref.intercept_)


def test_local_row_shards_equal_one_shard(reference):
    X, y, ref = reference
    clf = MWUMKLClassifier(kernels=SPEC, **literal(epsilon=0.3), n_shards=4).fit(X, y)
    np.testing.assert_array_equal(clf.dual_coef_, ref.dual_coef_)
    np.testing.assert_array_equal(clf.intercept_, ref.intercept_)


def test_bank_decision_function_matches_explicit_sum(reference):
    X, y, ref = reference
    Xt = _data(n=25, seed=7)[0]
    specs = RandomGaussianBank(2000, 2, 5).specs(X.shape[1])
    sv = ref.support_vectors_
    f = sum(w * explicit_kernel(s, Xt, sv) for s, w in zip(specs, ref.raw_kernel_weights_)) @ ref.dual_coef_[0]
    np.testing.assert_allclose(ref.decision_function(Xt), f + ref.intercept_[0], rtol=1e-10, atol=1e-12)


def test_bank_model_names_and_save_load(reference, tmp_path):
    X, y, ref = reference
    names = ref.kernel_names_
    assert isinstance(names, BankKernelNames) and len(names) == 2000 and str(names) == SPEC
    assert names[17] == str(RandomGaussianBank(2000, 2, 5).specs(X.shape[1])[17])
    ref.save(tmp_path / "m.npz")
    again = MWUMKLClassifier.load(tmp_path / "m.npz")
    assert again.kernel_names_ == names
    np.testing.assert_array_equal(again.decision_function(X), ref.decision_function(X))


def test_bank_from_data_store_equals_in_memory(reference, tmp_path):
    from mwumkl_dist.stores import write_data_store

    X, y, ref = reference
    store = write_data_store(tmp_path / "d.zarr", X, y, chunk_rows=32)
    clf = MWUMKLClassifier(kernels=SPEC, **literal(epsilon=0.3), n_shards=2).fit(store)
    np.testing.assert_array_equal(clf.dual_coef_, ref.dual_coef_)
    np.testing.assert_array_equal(clf.intercept_, ref.intercept_)


def test_bank_problem_checks_its_input():
    X, _ = _data(n=10)
    with pytest.raises(ValueError, match="10 rows but 9 labels"):
        BankProblem(X, np.ones(9), RandomGaussianBank(5))
    with pytest.raises(ValueError, match="outside the bank"):
        BankShard(X, np.ones(10), 0, RandomGaussianBank(5), (2, 9))
