"""Platt scaling (:mod:`mwumkl_dist.solvers.calibration`) against brute-force fits of the same likelihood."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from conftest import record_nested_fits
from scipy.optimize import minimize
from sklearn.exceptions import NotFittedError

from mwumkl_dist import MWUMKLClassifier
from mwumkl_dist.solvers.calibration import (
    CalibrationWarning,
    fit_platt,
    fit_sigmoid,
    platt_probabilities,
    sigmoid_probability,
)


def _scores(n=300, seed=0, scale=1.5, shift=0.3):
    """Decision values of a noisy classifier: ``P(y = 1 | f)`` is a true sigmoid of ``f``."""
    rng = np.random.default_rng(seed)
    f = rng.normal(size=n) * 2.0
    y = rng.uniform(size=n) < 1.0 / (1.0 + np.exp(-(scale * f + shift)))
    return f, y


def _smoothed_targets(y, w):
    n_pos, n_neg = w[y].sum(), w[~y].sum()
    return np.where(y, (n_pos + 1) / (n_pos + 2), 1 / (n_neg + 2))


def _brute_force(f, y, w):
    """The same likelihood, written directly and minimised by BFGS from a different start."""
    t = _smoothed_targets(y, w)

    def loss(ab):
        p = 1.0 / (1.0 + np.exp(ab[0] * f + ab[1]))
        return -np.sum(w * (t * np.log(p) + (1 - t) * np.log(1 - p)))

    return minimize(loss, np.array([-0.5, 0.5]), method="BFGS", options={"gtol": 1e-10}).x


def _libsvm_sigmoid_train(dec, labels):
    """LIBSVM's ``sigmoid_train`` (svm.cpp), transcribed loop by loop."""
    prior1 = sum(1 for v in labels if v > 0)
    prior0 = len(labels) - prior1
    hi, lo = (prior1 + 1.0) / (prior1 + 2.0), 1 / (prior0 + 2.0)
    t = [hi if v > 0 else lo for v in labels]
    A, B = 0.0, math.log((prior0 + 1.0) / (prior1 + 1.0))

    def value(A, B):
        out = 0.0
        for d, ti in zip(dec, t):
            z = d * A + B
            out += ti * z + math.log1p(math.exp(-z)) if z >= 0 else (ti - 1) * z + math.log1p(math.exp(z))
        return out

    fval = value(A, B)
    for _ in range(100):
        h11 = h22 = 1e-12
        h21 = g1 = g2 = 0.0
        for d, ti in zip(dec, t):
            z = d * A + B
            if z >= 0:
                p, q = math.exp(-z) / (1.0 + math.exp(-z)), 1.0 / (1.0 + math.exp(-z))
            else:
                p, q = 1.0 / (1.0 + math.exp(z)), math.exp(z) / (1.0 + math.exp(z))
            h11 += d * d * p * q
            h22 += p * q
            h21 += d * p * q
            g1 += d * (ti - p)
            g2 += ti - p
        if abs(g1) < 1e-5 and abs(g2) < 1e-5:
            break
        det = h11 * h22 - h21 * h21
        dA, dB = -(h22 * g1 - h21 * g2) / det, -(-h21 * g1 + h11 * g2) / det
        gd, step = g1 * dA + g2 * dB, 1.0
        while step >= 1e-10:
            nf = value(A + step * dA, B + step * dB)
            if nf < fval + 1e-4 * step * gd:
                A, B, fval = A + step * dA, B + step * dB, nf
                break
            step /= 2.0
    return A, B


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fit_sigmoid_is_the_maximum_likelihood_sigmoid(seed):
    f, y = _scores(seed=seed)
    A, B = fit_sigmoid(f, y)
    ref = _brute_force(f, y, np.ones(len(f)))
    assert A == pytest.approx(ref[0], rel=1e-5) and B == pytest.approx(ref[1], rel=1e-5, abs=1e-6)
    assert A < 0  # larger decision values: the positive class
    # The generating sigmoid is recovered roughly (300 points).
    assert -A == pytest.approx(1.5, rel=0.35)


def test_fit_sigmoid_follows_libsvm_step_by_step():
    f, y = _scores(n=120, seed=5)
    A, B = fit_sigmoid(f, np.where(y, 1, -1))
    refA, refB = _libsvm_sigmoid_train(f.tolist(), np.where(y, 1, -1).tolist())
    assert A == pytest.approx(refA, rel=1e-9) and B == pytest.approx(refB, rel=1e-9, abs=1e-12)


def test_weighted_fit_maximises_the_weighted_likelihood():
    f, y = _scores(seed=3)
    w = np.random.default_rng(4).uniform(0.2, 3.0, len(f))
    A, B = fit_sigmoid(f, y, sample_weight=w)
    ref = _brute_force(f, y, w)
    assert A == pytest.approx(ref[0], rel=1e-5) and B == pytest.approx(ref[1], rel=1e-5, abs=1e-6)
    # Integer weights are repeated points.
    k = np.random.default_rng(5).integers(1, 4, len(f))
    assert fit_sigmoid(f, y, sample_weight=k) == pytest.approx(fit_sigmoid(np.repeat(f, k), np.repeat(y, k)), rel=1e-6)
    assert fit_sigmoid(f, y, sample_weight=np.ones(len(f))) == fit_sigmoid(f, y)


def test_separable_scores_keep_a_finite_sigmoid():
    """Platt's smoothed targets: perfectly separated scores still give probabilities strictly inside (0, 1)."""
    f = np.concatenate([np.linspace(-3, -1, 20), np.linspace(1, 3, 30)])
    y = f > 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        A, B = fit_sigmoid(f, y)
    assert np.isfinite(A) and np.isfinite(B) and A < 0
    p = sigmoid_probability(f, A, B)
    assert np.all((p > 0) & (p < 1))
    assert np.all(p[y] > 0.5) and np.all(p[~y] < 0.5)
    assert p.max() < 1 - 1e-3 and p.min() > 1e-3  # smoothed targets: no certainty from 50 points


def test_sigmoid_probability_never_overflows():
    f = np.array([-1e308, -1e6, -50.0, 0.0, 50.0, 1e6, 1e308])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p = sigmoid_probability(f, -2.0, 0.5)
    assert np.all(np.isfinite(p))
    np.testing.assert_array_equal(p[[0, 1]], 0.0)
    np.testing.assert_array_equal(p[[-2, -1]], 1.0)
    assert p[3] == pytest.approx(1 / (1 + math.exp(0.5)))
    assert np.all(np.diff(p) >= 0)


def test_binary_probabilities_sum_to_one_and_keep_small_ones():
    f = np.array([-40.0, -2.0, 0.0, 3.0, 40.0])
    P = platt_probabilities(f, -1.0, 0.0)
    assert P.shape == (5, 2)
    np.testing.assert_allclose(P.sum(axis=1), 1.0, rtol=0, atol=2e-16)
    assert P[-1, 0] == pytest.approx(math.exp(-40.0), rel=1e-12)  # not 1 - (1 - 4e-18) = 0
    assert P[0, 1] == pytest.approx(math.exp(-40.0), rel=1e-12)


def test_one_vs_rest_sigmoids_are_normalised():
    rng = np.random.default_rng(0)
    classes = np.array(["a", "b", "c"])
    y = classes[rng.integers(0, 3, 240)]
    F = rng.normal(size=(240, 3)) + 2.0 * (y[:, None] == classes[None, :])
    A, B = fit_platt(F, y, classes)
    for k, c in enumerate(classes):
        assert (A[k], B[k]) == fit_sigmoid(F[:, k], y == c)
    P = platt_probabilities(F, A, B)
    np.testing.assert_allclose(P.sum(axis=1), 1.0, rtol=1e-14)
    raw = sigmoid_probability(F, A[None, :], B[None, :])
    np.testing.assert_allclose(P, raw / raw.sum(axis=1, keepdims=True), rtol=1e-14)
    assert np.mean(classes[P.argmax(axis=1)] == y) > 0.7
    # Every sigmoid underflowing: a uniform row, not NaN.
    P = platt_probabilities(np.full((1, 3), 1e308), np.full(3, 1.0), np.zeros(3))
    np.testing.assert_array_equal(P, [[1 / 3, 1 / 3, 1 / 3]])


def test_binary_fit_platt_uses_the_second_class_as_positive():
    f, y = _scores(seed=1)
    labels = np.where(y, "spam", "ham")
    A, B = fit_platt(f, labels, np.array(["ham", "spam"]))
    assert A.shape == (1,) and (A[0], B[0]) == fit_sigmoid(f, y)
    A2, _ = fit_platt(f[:, None], labels, np.array(["ham", "spam"]))  # (n, 1) is accepted too
    assert A2[0] == A[0]


def test_too_few_iterations_warn():
    f, y = _scores()
    with pytest.warns(CalibrationWarning, match="no convergence in 1 Newton"):
        fit_sigmoid(f, y, max_iter=1)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: fit_sigmoid([0.0, np.nan], [1, 0]), "NaN or infinity"),
        (lambda: fit_sigmoid([0.0, 1.0], [1, 0, 1]), "shape"),
        (lambda: fit_sigmoid([[0.0, 1.0]], [[1, 0]]), "1-d"),
        (lambda: fit_sigmoid([0.0, 1.0], [1, 0], sample_weight=[1.0, -1.0]), "non-negative"),
        (lambda: fit_sigmoid([0.0, 1.0], [1, 0], sample_weight=[1.0]), "sample_weight must have shape"),
        (lambda: fit_platt(np.zeros(4), ["a", "b", "c", "a"], ["a", "b"]), r"not among the classes: \['c'\]"),
        (lambda: fit_platt(np.zeros(3), ["a", "a", "a"], ["a"]), "at least two classes"),
        (lambda: fit_platt(np.zeros((4, 2)), ["a", "b", "a", "b"], ["a", "b"]), "one decision value per point"),
        (lambda: fit_platt(np.zeros((4, 2)), ["a", "b", "c", "b"], ["a", "b", "c"]), r"shape \(n, 3\)"),
        (lambda: platt_probabilities(np.zeros((4, 2)), [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]), r"shape \(n, 3\)"),
    ],
)
def test_bad_input_is_refused(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ----------------------------------------------------------------------------- the estimator's predict_proba


def _blobs(n=300, n_classes=2, seed=0, noise=0.35):
    rng = np.random.default_rng(seed)
    centers = rng.uniform(size=(n_classes, 4))
    labels = rng.integers(0, n_classes, n)
    X = centers[labels] + noise * rng.normal(size=(n, 4))
    return X, np.array(["ant", "bee", "cat", "dog"])[labels]


@pytest.fixture(scope="module")
def fitted():
    """(train, test, binary model, three-class model), all with probability=True."""
    X, y = _blobs(n=500, n_classes=2)
    X3, y3 = _blobs(n=450, n_classes=3, seed=1)
    params = {"kernels": "linear,gaussian:0.5,gaussian:1", "C": 1.0, "probability": True}
    binary = MWUMKLClassifier(**params).fit(X[:300], y[:300])
    three = MWUMKLClassifier(**params).fit(X3[:300], y3[:300])
    return (X[300:], y[300:], binary), (X3[300:], y3[300:], three)


@pytest.mark.parametrize("which", [0, 1], ids=["binary", "three-classes"])
def test_predict_proba_is_calibrated_on_held_out_points(fitted, which):
    Xt, yt, clf = fitted[which]
    P = clf.predict_proba(Xt)
    assert P.shape == (len(yt), len(clf.classes_))
    assert np.all((P >= 0) & (P <= 1))
    np.testing.assert_allclose(P.sum(axis=1), 1.0, rtol=1e-12)
    assert clf.probA_.shape == clf.probB_.shape == (1 if which == 0 else 3,)
    assert np.all(clf.probA_ < 0)  # larger decision values: more likely the problem's positive class
    # argmax agrees with predict almost everywhere (Platt's B moves the boundary a little).
    assert np.mean(clf.classes_[P.argmax(axis=1)] == clf.predict(Xt)) > 0.9
    # Better than the constant prior, in Brier score (multi-class: summed over classes).
    onehot = (yt[:, None] == clf.classes_[None, :]).astype(float)
    brier = np.mean(np.sum((P - onehot) ** 2, axis=1))
    prior = onehot.mean(axis=0)
    brier_prior = np.mean(np.sum((prior[None, :] - onehot) ** 2, axis=1))
    assert brier < 0.6 * brier_prior
    np.testing.assert_allclose(clf.predict_log_proba(Xt), np.log(P))


def test_probabilities_need_probability_true(fitted):
    X, y = _blobs(n=80)
    clf = MWUMKLClassifier(C=1.0).fit(X, y)
    assert not hasattr(clf, "predict_proba") and not hasattr(clf, "predict_log_proba")
    with pytest.raises(AttributeError, match="no attribute 'predict_proba'") as err:
        clf.predict_proba(X)
    assert "refit with probability=True" in str(err.value) and "decision_function" in str(err.value)
    assert not hasattr(clf, "probA_")
    clf.set_params(probability=True)  # switched on after a fit without: refit first
    with pytest.raises(NotFittedError, match="probability=True"):
        clf.predict_proba(X)
    assert hasattr(MWUMKLClassifier(probability=True), "predict_proba")


def test_probabilities_are_reproducible_and_survive_save_and_load(fitted, tmp_path):
    Xt, _, clf = fitted[1]
    path = tmp_path / "model.npz"
    clf.save(path)
    loaded = MWUMKLClassifier.load(path)
    np.testing.assert_array_equal(loaded.probA_, clf.probA_)
    np.testing.assert_array_equal(loaded.probB_, clf.probB_)
    np.testing.assert_array_equal(loaded.predict_proba(Xt), clf.predict_proba(Xt))
    assert loaded.probability is True


def test_calibration_folds_are_five_fits_with_the_final_C_and_weights(monkeypatch):
    calls = record_nested_fits(monkeypatch)
    X, y = _blobs(n=100)
    sw = np.random.default_rng(0).uniform(0.5, 2, 100)
    clf = MWUMKLClassifier(C=5.0, scale_C=False, probability=True, class_weight="balanced").fit(X, y, sample_weight=sw)
    folds = calls
    assert len(folds) == 5
    for params, n, weights in folds:
        assert params["probability"] is False and params["class_weight"] == "balanced"
        assert params["C"] == 5.0 / 100 and params["scale_C"] is True  # the final C_eff, relative to the size
        assert n == 80 and np.isin(weights, sw).all()
    monkeypatch.undo()
    assert clf.probA_.shape == (1,)
    # The same seed, the same sigmoid; another seed, other folds.
    again = MWUMKLClassifier(C=5.0, scale_C=False, probability=True, class_weight="balanced").fit(
        X, y, sample_weight=sw
    )
    assert again.probA_[0] == clf.probA_[0]
    other = MWUMKLClassifier(C=5.0, scale_C=False, probability=True, class_weight="balanced", random_state=3).fit(
        X, y, sample_weight=sw
    )
    assert other.probA_[0] != clf.probA_[0]


def test_probability_with_a_kernel_store_is_refused_before_fitting(tmp_path):
    pytest.importorskip("zarr")
    from mwumkl_dist.stores import write_kernel_store

    X, y = _blobs(n=40)
    store = write_kernel_store(tmp_path / "k.zarr", y, X=X, kernels="linear,gaussian:1", chunk_rows=16)
    with pytest.raises(ValueError, match="probability=True needs held-out decision values"):
        MWUMKLClassifier(kernels="precomputed", C=1.0, probability=True).fit(store)


def test_probability_with_too_few_points_of_a_class_is_refused():
    X, y = _blobs(n=30)
    y[:] = "ant"
    y[0] = "bee"
    with pytest.raises(ValueError, match="at least 2 training points of every class"):
        MWUMKLClassifier(C=1.0, probability=True).fit(X, y)
