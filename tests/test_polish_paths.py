"""The exact polish on the paths the other tests leave out: after a random-bank fit, and on CSR input.

The reference is an independent solve: the combined Gram matrix from the textbook kernel formulas
(``conftest.explicit_kernel``, plain numpy) with the learned raw weights, the 2-norm soft margin as
the hard margin on ``K + ridge I`` (``ridge = 1 / (C n)`` with ``scale_C``), solved by LIBSVM to a
much tighter tolerance than the package uses.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from conftest import explicit_kernel
from sklearn.svm import SVC

from mwumkl_dist import MWUMKLClassifier
from mwumkl_dist.kernels import KernelSet, RandomGaussianBank

C = 10.0
BANK = RandomGaussianBank(n_kernels=24, subset_size=2, seed=3)


def _data(n=120, d=6, seed=0, density=1.0):
    """Labels from a noisy linear rule; with ``density < 1`` most entries are exactly zero (sparse data)."""
    rng = np.random.default_rng(seed)
    X = rng.random((n, d)) * (rng.random((n, d)) < density)
    y = np.where((X - X.mean(axis=0)) @ rng.normal(size=d) + 0.1 * rng.normal(size=n) > 0, "pos", "neg")
    return X, y


MIXED = "linear,poly:2,gaussian:0.5,gaussian:1,gaussian:2@0-2"


def _independent_polish(X, y, specs, raw_weights, positive):
    """``decision(Z)`` of the exact 2-norm soft-margin SVM on ``sum_i w_i K_i``, solved from scratch."""
    n = len(y)
    X = X.toarray() if sp.issparse(X) else X
    K = sum(w * explicit_kernel(s, X) for s, w in zip(specs, raw_weights))
    y_pm = np.where(y == positive, 1.0, -1.0)
    ridge = 1.0 / (C * n)
    # C far above any dual value: the hard margin on K + ridge I, i.e. the 2-norm soft margin on K.
    svc = SVC(kernel="precomputed", C=1e12, tol=1e-10).fit(K + ridge * np.eye(n), y_pm)

    def decision(Z):
        Z = Z.toarray() if sp.issparse(Z) else Z
        Kz = sum(w * explicit_kernel(s, Z, X[svc.support_]) for s, w in zip(specs, raw_weights))
        return Kz @ svc.dual_coef_[0] + svc.intercept_[0]

    return decision


def _assert_same_model(a, b):
    """Bit for bit: support set, coefficients, bias, weights and the support vectors' values."""
    np.testing.assert_array_equal(a.support_, b.support_)
    np.testing.assert_array_equal(a.dual_coef_, b.dual_coef_)
    np.testing.assert_array_equal(a.intercept_, b.intercept_)
    np.testing.assert_array_equal(a.kernel_weights_, b.kernel_weights_)
    dense = [sv.toarray() if sp.issparse(sv) else np.asarray(sv) for sv in (a.support_vectors_, b.support_vectors_)]
    np.testing.assert_array_equal(*dense)


@pytest.mark.parametrize(
    ("kernels", "specs", "density"),
    [
        pytest.param(BANK, BANK.specs, 1.0, id="bank-dense"),
        pytest.param(str(BANK), BANK.specs, 0.3, id="bank-string-csr"),
        pytest.param(MIXED, lambda d: KernelSet(MIXED, d).specs, 0.3, id="mixed-csr"),
    ],
)
def test_polish_equals_an_independent_exact_solve(kernels, specs, density):
    X, y = _data(density=density)
    X_test, _ = _data(n=60, seed=1, density=density)
    fit_X, fit_test = (sp.csr_matrix(X), sp.csr_matrix(X_test)) if density < 1 else (X, X_test)
    clf = MWUMKLClassifier(kernels=kernels, C=C, epsilon=0.3, polish=True).fit(fit_X, y)
    assert clf.polished_
    unpolished = MWUMKLClassifier(kernels=kernels, C=C, epsilon=0.3, polish=False).fit(fit_X, y)
    # The polish keeps the learned weights and re-solves the SVM only.
    np.testing.assert_array_equal(clf.kernel_weights_, unpolished.kernel_weights_)

    specs = specs(X.shape[1])
    assert len(specs) == len(clf.raw_kernel_weights_)
    reference = _independent_polish(X, y, specs, clf.raw_kernel_weights_, clf.classes_[1])
    for Z, fit_Z in [(X, fit_X), (X_test, fit_test)]:
        expected, got = reference(Z), clf.decision_function(fit_Z)
        # LIBSVM's stopping tolerance (1e-4 in the package, on a unit-diagonal Gram) bounds the
        # agreement: about 1e-5 of the largest score here.
        atol = 2e-4 * np.abs(expected).max()
        np.testing.assert_allclose(got, expected, rtol=0, atol=atol)
        clear = np.abs(expected) > atol
        np.testing.assert_array_equal(np.sign(got[clear]), np.sign(expected[clear]))
    # The MWU solution alone is a different (approximate) model: the comparison above can fail.
    assert (
        np.abs(unpolished.decision_function(fit_test) - reference(X_test)).max()
        > 1e-2 * np.abs(reference(X_test)).max()
    )


@pytest.mark.parametrize(
    "kernels", [str(BANK), "paper", "linear,poly:2,gaussian:1@1-3"], ids=["bank", "paper", "mixed"]
)
def test_csr_input_gives_the_dense_model_after_the_polish(kernels):
    X, y = _data(density=0.3, seed=2)
    X_test, _ = _data(n=40, seed=3, density=0.3)
    dense = MWUMKLClassifier(kernels=kernels, C=C, epsilon=0.3, polish=True).fit(X, y)
    csr = MWUMKLClassifier(kernels=kernels, C=C, epsilon=0.3, polish=True).fit(sp.csr_matrix(X), y)
    assert dense.polished_ and csr.polished_
    assert sp.issparse(csr.support_vectors_)
    _assert_same_model(csr, dense)
    np.testing.assert_array_equal(csr.decision_function(sp.csr_matrix(X_test)), dense.decision_function(X_test))
    np.testing.assert_array_equal(csr.decision_function(X_test), dense.decision_function(X_test))


def test_polish_after_a_multiclass_bank_fit():
    """One-vs-rest: each binary problem is polished with its own weights, against the same reference."""
    X, _ = _data(n=150, seed=4)
    y = np.digitize(X[:, 0] + X[:, 1], [0.8, 1.2])
    clf = MWUMKLClassifier(kernels=BANK, C=C, epsilon=0.3, polish=True).fit(X, y)
    assert clf.polished_ and clf.decision_function(X).shape == (150, 3)
    specs = BANK.specs(X.shape[1])
    scores = clf.decision_function(X)
    for k, cls in enumerate(clf.classes_):
        expected = _independent_polish(X, y, specs, clf.raw_kernel_weights_[k], cls)(X)
        np.testing.assert_allclose(scores[:, k], expected, rtol=0, atol=2e-4 * np.abs(expected).max())


def test_kernel_matrices_are_each_kernel_and_sum_to_the_combined_kernel():
    from conftest import explicit_kernels

    from mwumkl_dist.kernels import KernelSet
    from mwumkl_dist.kernels.evaluation import combined_kernel, kernel_matrices

    rng = np.random.default_rng(5)
    X, Z = rng.random((70, 4)), rng.random((9, 4))
    ks = KernelSet("paper@0-1,linear@2,gaussian:0.5@3,poly:2", 4)  # groups, squaring chains, all features
    K = kernel_matrices(ks, X, Z)
    np.testing.assert_allclose(K, explicit_kernels(ks.specs, X, Z), rtol=1e-12, atol=1e-12)
    w = rng.random(len(ks))
    np.testing.assert_allclose(np.einsum("i,ijk->jk", w, K), combined_kernel(ks, X, Z, w), rtol=1e-12)
    Ks = kernel_matrices(ks, sp.csr_matrix(X), Z)  # sparse rows give the same values
    np.testing.assert_allclose(Ks, K, rtol=1e-13, atol=1e-13)
