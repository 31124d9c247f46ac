"""Random Gaussian banks: a kernel plan built from the bank's tables, run by the one superstep path.

A bank fit must be bit-identical to a fit with the bank's kernels written out as
``Gaussian(sigma, features=subset)`` specs (same plan, same shards, same predictor).
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import scipy.sparse as sp
from conftest import explicit_kernel, explicit_kernels, literal

from mwumkl_dist import MWUMKLClassifier
from mwumkl_dist.core.exact import SHIFT
from mwumkl_dist.data.problems import FeatureInput, FeatureProblem, make_training_input
from mwumkl_dist.data.shards import FeatureShard
from mwumkl_dist.devices.cpu import kernel_diagonal
from mwumkl_dist.kernels import BankKernelNames, Gaussian, KernelSet, RandomGaussianBank, bank_of, bank_plan
from mwumkl_dist.kernels.evaluation import plan_args, point_kernel_block
from mwumkl_dist.kernels.specs import PAPER_SIGMAS

SPEC = "random:2000:size=2:seed=5:widths=paper"
#: No sigma is sqrt(2) times another: no squaring chains, so the kernels can be cut into blocks anywhere.
NO_CHAINS = RandomGaussianBank(600, 2, 5, sigmas=(0.5, 0.8, 1.3, 2.1))
PLAN_ARRAYS = ("kind", "param_a", "param_b", "group", "square_of", "order", "feat_ptr", "feat_groups")


def _data(n=90, d=6, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.random((n, d))
    y = np.where(X[:, 0] + X[:, 1] + 0.3 * rng.standard_normal(n) > 1.0, "a", "b")
    return X, y


def _specs(spec=SPEC, d=6):
    return bank_of(spec).specs(d)


def assert_same_plan(a, b):
    for name in PLAN_ARRAYS:
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and np.array_equal(x, y), name
    assert (a.n_groups, a.n_features) == (b.n_groups, b.n_features)


def assert_same_model(a, b, X):
    for name in ("support_", "dual_coef_", "intercept_", "kernel_weights_", "raw_kernel_weights_", "kernel_traces_"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    np.testing.assert_array_equal(a.decision_function(X), b.decision_function(X))


@pytest.fixture(scope="module")
def reference():
    X, y = _data()
    return X, y, MWUMKLClassifier(kernels=SPEC, **literal(epsilon=0.3)).fit(X, y)


@pytest.fixture(scope="module")
def expanded(reference):
    X, y, _ = reference
    return MWUMKLClassifier(kernels=_specs(), **literal(epsilon=0.3)).fit(X, y)


def test_bank_of():
    assert bank_of("random:10:size=3:seed=2:widths=paper") == RandomGaussianBank(10, 3, 2)
    assert str(RandomGaussianBank(10, 3, 2)) == "random:10:size=3:seed=2:widths=paper"
    bank = RandomGaussianBank(5)
    assert bank_of(bank) is bank and bank_of([bank]) is bank
    assert bank_of("paper") is None and bank_of("random:10,linear") is None and bank_of([bank, bank]) is None


@pytest.mark.parametrize(
    "bank, d",
    [
        (RandomGaussianBank(3000, 2, 9), 6),  # 15 subsets: long squaring chains
        (RandomGaussianBank(3000, 5, 1), 60),  # nearly every subset distinct
        (RandomGaussianBank(400, 3, 4, sigmas=(1.0, 2**-0.5, 0.5, 2**0.5, 0.25, 1.0)), 5),  # repeated sigma
        (RandomGaussianBank(300, 9, 2), 4),  # subset_size > n_features: one group of all features
        (RandomGaussianBank(500, 1, 3, sigmas=(0.3, 0.7)), 3),  # no chains
    ],
)
def test_bank_plan_equals_the_compiled_gaussian_specs(bank, d):
    specs = bank.specs(d)
    plan = KernelSet(bank, d).plan
    assert_same_plan(plan, KernelSet(specs, d).plan)
    assert_same_plan(KernelSet([bank], d).plan, plan)  # a bank in a list expands to specs: the same plan
    if bank.sigmas == PAPER_SIGMAS:  # the spec string keeps the paper's sigmas only
        assert_same_plan(KernelSet(str(bank), d).plan, plan)
    for k0, k1 in [(100, 270), (0, 1), (5, bank.n_kernels)]:
        assert_same_plan(bank_plan(bank, d, k0, k1), KernelSet(specs[k0:k1], d).plan)
        assert_same_plan(KernelSet(bank, d).block_plan(k0, k1), KernelSet(specs[k0:k1], d).plan)


@pytest.mark.parametrize("size, d", [(5, 60), (2, 6), (3, 3), (9, 4), (1, 1)])
def test_bank_subsets_are_the_features_of_smallest_hash(size, d):
    """A kernel's subset is, by definition, its ``size`` features of smallest hash (a full stable sort of the row)."""
    from mwumkl_dist.kernels.specs import _splitmix64

    bank = RandomGaussianBank(3000, size, 11)
    subsets, _ = bank.block(1000, 3000, d)
    key = _splitmix64(np.uint64(11) * np.uint64(0x100000001B3) + np.arange(1000, 3000, dtype=np.uint64))
    h = _splitmix64(key[:, None] ^ _splitmix64(np.arange(d, dtype=np.uint64) + np.uint64(0xABCDEF))[None, :])
    assert np.array_equal(subsets, np.sort(np.argsort(h, axis=1, kind="stable")[:, : min(size, d)], axis=1))


def test_a_bank_kernel_set_builds_no_spec_objects():
    bank = RandomGaussianBank(100_000, 5, 1)
    ks = KernelSet(bank, 60)
    assert len(ks) == 100_000 and not isinstance(ks.specs, list)
    assert isinstance(ks.names(), BankKernelNames) and ks.names() == BankKernelNames(bank, 60)
    subsets, sigmas = bank.block(17, 18, 60)
    assert ks.specs[17] == Gaussian(sigmas[0], features=subsets[0])
    assert ks.specs[-1:] == [ks.specs[99_999]] and ks.specs[3:5] == [ks.specs[3], ks.specs[4]]
    with pytest.raises(ValueError, match="outside the bank"):
        bank_plan(bank, 60, 5, 100_001)


def test_a_bank_plan_pickles_as_the_bank():
    bank = RandomGaussianBank(10_000, 5, 2)
    plan = bank_plan(bank, 60, 1000, 9000)
    data = pickle.dumps(plan)
    assert len(data) < 1000  # the bank and the block, not the arrays
    assert_same_plan(pickle.loads(data), KernelSet(bank.specs(60)[1000:9000], 60).plan)
    other = KernelSet("paper", 3).plan  # other plans pickle their arrays
    assert_same_plan(pickle.loads(pickle.dumps(other)), other)


def test_gaussian_diagonal_is_exactly_one():
    """``K(x, x) = 1`` exactly through the plan (so a bank's traces are ``n`` without a pass)."""
    X, _ = _data(n=30)
    bank = RandomGaussianBank(500, subset_size=2, seed=1)
    plan = KernelSet(bank, X.shape[1]).plan
    K = explicit_kernels(bank.specs(X.shape[1]), X)
    pp, qq, pq = point_kernel_block(plan, X[3], X[7])
    np.testing.assert_array_equal(pp, 1.0)
    np.testing.assert_array_equal(qq, 1.0)
    np.testing.assert_allclose(pq, K[:, 3, 7], rtol=1e-13)
    Xc = sp.csr_matrix(X)
    np.testing.assert_array_equal(kernel_diagonal(Xc, plan_args(plan)), 1.0)
    shard = FeatureShard(X, np.ones(30), 0, plan)
    assert shard.trace_parts() == [30 << SHIFT] * 500
    data = make_training_input(X, np.arange(30) % 2, bank, estimator=MWUMKLClassifier(bank))
    assert isinstance(data, FeatureInput)
    np.testing.assert_array_equal(data.traces, 30.0)


def test_bank_fit_is_bit_identical_to_expanded_gaussian_specs(reference, expanded):
    X, y, ref = reference
    assert isinstance(ref.kernel_names_, BankKernelNames) and isinstance(expanded.kernel_names_, list)
    assert list(ref.kernel_names_) == expanded.kernel_names_
    assert_same_model(ref, expanded, X)
    Xt = _data(n=25, seed=7)[0]
    np.testing.assert_array_equal(ref.decision_function(Xt), expanded.decision_function(Xt))
    np.testing.assert_array_equal(ref.kernel_traces_, len(X))


@pytest.mark.timeout(120)
def test_dask_row_and_kernel_shards_equal_the_expanded_specs(reference, expanded):
    distributed = pytest.importorskip("distributed")
    X, y, _ = reference
    no_chains = MWUMKLClassifier(kernels=NO_CHAINS.specs(6), **literal(epsilon=0.3)).fit(X, y)
    assert len(FeatureProblem(X, np.ones(len(X)), KernelSet(NO_CHAINS, 6)).kernel_ranges(3)) == 3
    with distributed.Client(processes=False, n_workers=2, threads_per_worker=1, dashboard_address=":0") as client:
        for kernels, n_shards, n_kernel_shards, want in [
            (SPEC, 2, 1, expanded),
            (NO_CHAINS, 1, 3, no_chains),
            (NO_CHAINS, 2, 2, no_chains),
        ]:
            clf = MWUMKLClassifier(
                kernels=kernels, **literal(epsilon=0.3), engine="dask", client=client,
                n_shards=n_shards, n_kernel_shards=n_kernel_shards,
            ).fit(X, y)  # fmt: skip
            assert_same_model(clf, want, X)


def test_bank_threads_give_the_same_model(reference, monkeypatch):
    """Tiles split between threads, each with the pre-pass of the values its tiles share (every value here)."""
    from mwumkl_dist.devices import cpu

    X, y, ref = reference
    monkeypatch.setattr(cpu.pool, "PARALLEL_MIN_WORK", 64)  # the parallel path on 90 rows
    with cpu.thread_limit(2):
        assert cpu.superstep._layout(90, 32, 2000) == (2, 1)
    assert_same_model(MWUMKLClassifier(kernels=SPEC, **literal(epsilon=0.3), n_jobs=2).fit(X, y), ref, X)


def test_local_row_shards_equal_one_shard(reference):
    X, y, ref = reference
    clf = MWUMKLClassifier(kernels=SPEC, **literal(epsilon=0.3), n_shards=4).fit(X, y)
    assert_same_model(clf, ref, X)


def test_kernel_blocks_of_a_bank_problem_are_the_specs_blocks():
    X, _ = _data(n=20)
    y = np.where(np.arange(20) % 3 == 0, 1.0, -1.0)
    problem = FeatureProblem(X, y, KernelSet(NO_CHAINS, X.shape[1]))
    expanded = FeatureProblem(X, y, KernelSet(NO_CHAINS.specs(X.shape[1]), X.shape[1]))
    ranges = problem.kernel_ranges(3)
    assert ranges == expanded.kernel_ranges(3) and len(ranges) > 1
    for k0, k1 in ranges:
        assert_same_plan(problem.make_shard(0, 20, (k0, k1)).plan, expanded.make_shard(0, 20, (k0, k1)).plan)


def test_bank_decision_function_matches_explicit_sum(reference):
    X, y, ref = reference
    Xt = _data(n=25, seed=7)[0]
    specs = _specs()
    sv = ref.support_vectors_
    f = sum(w * explicit_kernel(s, Xt, sv) for s, w in zip(specs, ref.raw_kernel_weights_)) @ ref.dual_coef_[0]
    np.testing.assert_allclose(ref.decision_function(Xt), f + ref.intercept_[0], rtol=1e-10, atol=1e-12)


def test_bank_on_sparse_data_equals_dense(reference):
    X, y, _ = reference
    Xs = X * (X > 0.4)
    dense = MWUMKLClassifier(kernels=SPEC, **literal(epsilon=0.3)).fit(Xs, y)
    sparse = MWUMKLClassifier(kernels=SPEC, **literal(epsilon=0.3)).fit(sp.csr_matrix(Xs), y)
    assert_same_model(sparse, dense, sp.csr_matrix(Xs))
    np.testing.assert_array_equal(sparse.decision_function(Xs), dense.decision_function(Xs))


def test_bank_model_names_and_save_load(reference, tmp_path):
    X, y, ref = reference
    names = ref.kernel_names_
    assert isinstance(names, BankKernelNames) and len(names) == 2000 and str(names) == SPEC
    assert names[17] == str(_specs()[17]) and names[-2:] == [str(s) for s in _specs()[-2:]]
    ref.save(tmp_path / "m.npz")
    again = MWUMKLClassifier.load(tmp_path / "m.npz")
    assert again.kernel_names_ == names
    np.testing.assert_array_equal(again.decision_function(X), ref.decision_function(X))


def test_bank_from_data_store_equals_in_memory(reference, tmp_path):
    from mwumkl_dist.stores import write_data_store

    X, y, ref = reference
    store = write_data_store(tmp_path / "d.zarr", X, y, chunk_rows=32)
    clf = MWUMKLClassifier(kernels=SPEC, **literal(epsilon=0.3), n_shards=2).fit(store)
    assert isinstance(clf.kernel_names_, BankKernelNames)
    assert_same_model(clf, ref, X)
