"""MWUMKLClassifier: the scikit-learn contract, persistence, errors and progress callbacks."""

from __future__ import annotations

import json
import math
import pickle

import numpy as np
import pytest
import scipy.sparse as sp
from conftest import explicit_kernels
from sklearn.datasets import load_breast_cancer, load_iris
from sklearn.exceptions import NotFittedError
from sklearn.model_selection import GridSearchCV, cross_val_score, train_test_split
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import MinMaxScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

from mwumkl_dist import MWUMKLClassifier, ProgressInfo
from mwumkl_dist.kernels import Gaussian, Linear, Polynomial


@parametrize_with_checks([MWUMKLClassifier()])
def test_sklearn_compatible(estimator, check):
    check(estimator)


@pytest.fixture(scope="module")
def cancer():
    X, y = load_breast_cancer(return_X_y=True)
    X, _, y, _ = train_test_split(X, y, train_size=240, random_state=0, stratify=y)
    return X, y


def _toy(seed=0, n=60, d=4):
    rng = np.random.default_rng(seed)
    X = rng.uniform(size=(n, d))
    y = np.where((X - 0.5) @ rng.normal(size=d) + 0.2 * rng.normal(size=n) > 0, 1, -1)
    return X, y


# ----------------------------------------------------------------------------- sklearn tools


def test_pipeline_grid_search_and_cross_val(cancer):
    X, y = cancer
    pipe = Pipeline([("scale", MinMaxScaler()), ("mkl", MWUMKLClassifier(epsilon=0.3))])
    scores = cross_val_score(pipe, X, y, cv=3)
    assert scores.shape == (3,) and scores.mean() > 0.85
    grid = GridSearchCV(pipe, {"mkl__C": [1.0, 100.0], "mkl__epsilon": [0.3, 0.5]}, cv=3).fit(X, y)
    assert set(grid.best_params_) == {"mkl__C", "mkl__epsilon"}
    assert grid.best_score_ > 0.85
    assert grid.predict(X).shape == (len(y),)
    assert grid.score(X, y) > 0.85


def test_multiclass_one_vs_rest():
    X, y = load_iris(return_X_y=True)
    X = MinMaxScaler().fit_transform(X)
    Xa, Xb, ya, yb = train_test_split(X, y, random_state=0, stratify=y)
    labels = np.array(["setosa", "versicolor", "virginica"])
    clf = MWUMKLClassifier(epsilon=0.3).fit(Xa, labels[ya])
    T = math.ceil(8 * 0.25 / 0.09 * math.log(len(ya)))
    np.testing.assert_array_equal(clf.classes_, labels)
    assert clf.kernel_weights_.shape == clf.raw_kernel_weights_.shape == (3, 12)
    np.testing.assert_allclose(clf.kernel_weights_.sum(axis=1), 1.0, rtol=1e-14)
    assert clf.dual_coef_.shape == (3, len(clf.support_))
    assert clf.intercept_.shape == (3,)
    np.testing.assert_array_equal(clf.n_iter_, [T, T, T])
    scores = clf.decision_function(Xb)
    assert scores.shape == (len(yb), 3)
    np.testing.assert_array_equal(clf.predict(Xb), labels[np.argmax(scores, axis=1)])
    assert clf.score(Xb, labels[yb]) > 0.9
    # each row k is the binary problem "class k against the rest"
    one = MWUMKLClassifier(epsilon=0.3).fit(Xa, ya == 1)
    np.testing.assert_allclose(one.decision_function(Xb), scores[:, 1], rtol=1e-12, atol=1e-12)


def test_pandas_input():
    pd = pytest.importorskip("pandas")
    X, y = _toy()
    df = pd.DataFrame(X, columns=["a", "b", "c", "d"])
    clf = MWUMKLClassifier(epsilon=0.3).fit(df, pd.Series(y))
    np.testing.assert_array_equal(clf.feature_names_in_, ["a", "b", "c", "d"])
    ref = MWUMKLClassifier(epsilon=0.3).fit(X, y)
    np.testing.assert_array_equal(clf.decision_function(df), ref.decision_function(X))
    with pytest.raises(ValueError, match="feature names"):
        clf.predict(df[["b", "a", "c", "d"]])


def test_scale_C_is_C_times_n():
    X, y = _toy(n=50)
    a = MWUMKLClassifier("paper", C=3.0, epsilon=0.3).fit(X, y)
    b = MWUMKLClassifier("paper", C=150.0, epsilon=0.3, scale_C=False).fit(X, y)
    np.testing.assert_allclose(a.dual_coef_, b.dual_coef_, rtol=1e-12)
    np.testing.assert_allclose(a.intercept_, b.intercept_, rtol=1e-12)


def test_fitted_attributes():
    X, y = _toy()
    specs = [Linear(), Polynomial(2, features=(0, 1)), Gaussian(0.5)]
    clf = MWUMKLClassifier(specs, epsilon=0.3).fit(X, y)
    assert clf.kernel_names_ == ["linear", "poly:2@0-1", "gaussian:0.5"]
    np.testing.assert_allclose(clf.raw_kernel_weights_, clf.kernel_weights_ / clf.kernel_traces_)
    np.testing.assert_allclose(clf.kernel_traces_, np.einsum("inn->i", explicit_kernels(specs, X)), rtol=1e-13)
    np.testing.assert_array_equal(clf.support_vectors_, X[clf.support_])
    assert np.all(clf.dual_coef_[0] * np.where(y[clf.support_] == 1, 1, -1) > 0)
    assert clf.n_features_in_ == 4 and not clf.interrupted_
    assert isinstance(clf.n_iter_, int)


# ----------------------------------------------------------------------------- persistence


def _models():
    X, y = _toy(1)
    Xs = X * (np.random.default_rng(2).uniform(size=X.shape) < 0.5)
    K = explicit_kernels([Polynomial(2), Gaussian(0.5)], X)
    iris_X, iris_y = load_iris(return_X_y=True)
    return {
        "dense": (MWUMKLClassifier(epsilon=0.3), X, y, X),
        "sparse-sv": (MWUMKLClassifier("linear,gaussian:1@0-2", epsilon=0.3), sp.csr_matrix(Xs), y, sp.csr_matrix(Xs)),
        "strings-hard": (MWUMKLClassifier("paper", C=np.inf, epsilon=0.3), X, np.where(y > 0, "yes", "no"), X),
        "objects": (MWUMKLClassifier([Polynomial(2, coef0=0.3), Gaussian(0.7, features=(1, 3))]), X, y, X),
        "precomputed": (MWUMKLClassifier("precomputed", epsilon=0.3), K, y, K[:, :10, :]),
        "multiclass": (MWUMKLClassifier("paper", epsilon=0.4, scale_C=False, C=50.0), iris_X, iris_y, iris_X),
    }


@pytest.mark.parametrize("name", list(_models()))
def test_pickle_and_save_load_round_trip(name, tmp_path):
    clf, X, y, Xq = _models()[name]
    clf.fit(X, y)
    expected = clf.decision_function(Xq)
    again = pickle.loads(pickle.dumps(clf))
    np.testing.assert_array_equal(again.decision_function(Xq), expected)

    path = tmp_path / "model.npz"
    clf.save(path)
    loaded = MWUMKLClassifier.load(path)
    np.testing.assert_array_equal(loaded.decision_function(Xq), expected)
    np.testing.assert_array_equal(loaded.predict(Xq), clf.predict(Xq))
    np.testing.assert_array_equal(loaded.classes_, clf.classes_)
    assert loaded.classes_.dtype.kind == clf.classes_.dtype.kind
    for attr in ("support_", "dual_coef_", "intercept_", "kernel_weights_", "kernel_traces_"):
        np.testing.assert_array_equal(getattr(loaded, attr), getattr(clf, attr))
    np.testing.assert_array_equal(loaded.n_iter_, clf.n_iter_)
    assert loaded.kernel_names_ == clf.kernel_names_
    if name == "sparse-sv":
        assert sp.issparse(loaded.support_vectors_)
    if name == "strings-hard":
        assert loaded.C == np.inf
    # the loaded model can be refitted with the same parameters to the same model
    if name in ("dense", "strings-hard"):
        refit = MWUMKLClassifier(**loaded.get_params()).fit(X, y)
        np.testing.assert_array_equal(refit.decision_function(Xq), expected)


def test_save_load_keeps_feature_names(tmp_path):
    pd = pytest.importorskip("pandas")
    X, y = _toy()
    df = pd.DataFrame(X, columns=["w", "x", "y", "z"])
    clf = MWUMKLClassifier(epsilon=0.3).fit(df, y)
    clf.save(tmp_path / "m.npz")
    loaded = MWUMKLClassifier.load(tmp_path / "m.npz")
    np.testing.assert_array_equal(loaded.feature_names_in_, clf.feature_names_in_)
    np.testing.assert_array_equal(loaded.decision_function(df), clf.decision_function(df))


def test_load_rejects_other_files(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("not a model\n")
    with pytest.raises(ValueError, match="not a mwumkl_dist model file"):
        MWUMKLClassifier.load(text)
    other = tmp_path / "arrays.npz"
    np.savez(other, a=np.arange(3))
    with pytest.raises(ValueError, match="not a mwumkl_dist model file"):
        MWUMKLClassifier.load(other)
    wrong = tmp_path / "wrong.npz"
    np.savez(wrong, __meta__=np.array(json.dumps({"format": "something-else"})))
    with pytest.raises(ValueError, match="not a mwumkl_dist model file"):
        MWUMKLClassifier.load(wrong)
    future = tmp_path / "future.npz"
    np.savez(future, __meta__=np.array(json.dumps({"format": "mwumkl_dist-model", "format_version": 99})))
    with pytest.raises(ValueError, match="newer"):
        MWUMKLClassifier.load(future)
    with pytest.raises(FileNotFoundError, match="not found"):
        MWUMKLClassifier.load(tmp_path / "missing.npz")


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("params", "exc", "match"),
    [
        ({"epsilon": 1.0}, ValueError, r"epsilon must lie in \(0, 2\*rho\)"),
        ({"epsilon": 2.0, "rho": 0.9}, ValueError, "epsilon must lie in"),
        ({"epsilon": 0.0}, ValueError, "epsilon must lie in"),
        ({"C": 0.0}, ValueError, "C must be positive"),
        ({"C": -1.0}, ValueError, "C must be positive"),
        ({"C": np.nan}, ValueError, "C must be positive"),
        ({"rho": 0.0}, ValueError, "rho must be positive"),
        ({"rho": -0.5}, ValueError, "rho must be positive"),
        ({"max_iter": 0}, ValueError, "max_iter must be None or a positive integer"),
        ({"max_iter": 2.5}, ValueError, "max_iter must be"),
        ({"n_shards": 0}, ValueError, "n_shards must be a positive integer"),
        ({"callback_every": 0}, ValueError, "callback_every must be a positive integer"),
        ({"kernels": "foo"}, ValueError, "unknown kernel 'foo'"),
        ({"kernels": "gaussian:x"}, ValueError, "bad number 'x'"),
        ({"kernels": "linear@9"}, ValueError, "uses feature 9 but the data has 4 features"),
        ({"kernels": 17}, TypeError, "kernels must be"),
        ({"epsilon": "0.2"}, TypeError, "epsilon must be a real number"),
        ({"C": None}, TypeError, "C must be a real number"),
        ({"callback": 3}, TypeError, "callback must be callable"),
    ],
)
def test_bad_parameters(params, exc, match):
    X, y = _toy()
    with pytest.raises(exc, match=match):
        MWUMKLClassifier(**params).fit(X, y)


def test_bad_data():
    X, y = _toy()
    clf = MWUMKLClassifier(epsilon=0.3)
    Xn = X.copy()
    Xn[3, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        clf.fit(Xn, y)
    Xi = X.copy()
    Xi[0, 0] = np.inf
    with pytest.raises(ValueError, match="infinity"):
        clf.fit(Xi, y)
    with pytest.raises(ValueError, match="infinity"):
        clf.fit(sp.csr_matrix(Xi), y)
    with pytest.raises(ValueError, match="one class"):
        clf.fit(X, np.ones(len(y)))
    with pytest.raises(ValueError, match="inconsistent numbers of samples"):
        clf.fit(X, y[:-1])
    with pytest.raises(ValueError, match="Unknown label type"):
        clf.fit(X, np.linspace(0, 1, len(y)))
    with pytest.raises(ValueError, match="zero or non-finite trace"):
        MWUMKLClassifier("linear@0").fit(np.column_stack([np.zeros(len(y)), X]), y)
    with pytest.raises(NotFittedError):
        clf.predict(X)
    clf.fit(X, y)
    with pytest.raises(ValueError, match="expecting 4 features"):
        clf.predict(X[:, :3])
    with pytest.raises(ValueError, match="NaN"):
        clf.decision_function(Xn)


def test_bad_precomputed_input():
    X, y = _toy(n=20)
    K = explicit_kernels([Linear(), Gaussian(1.0)], X)
    clf = MWUMKLClassifier("precomputed", epsilon=0.3)
    with pytest.raises(ValueError, match="3-d array"):
        clf.fit(K[0], y)
    with pytest.raises(ValueError, match=r"\(m, n, n\)"):
        clf.fit(K[:, :, :10], y)
    with pytest.raises(ValueError, match="20 labels"):
        clf.fit(K, y[:-1])
    bad = K.copy()
    bad[1, 2, 3] = np.nan
    with pytest.raises(ValueError, match="NaN or infinity"):
        clf.fit(bad, y)
    with pytest.raises(TypeError, match="dense"):
        clf.fit(sp.csr_matrix(K[0]), y)
    clf.fit(K, y)
    with pytest.raises(ValueError, match="n_train=20"):
        clf.predict(K[:, :, :5])
    with pytest.raises(ValueError, match=r"m=2"):
        clf.predict(K[:1])


# ----------------------------------------------------------------------------- iterations and callbacks


def test_max_iter_is_honoured():
    X, y = _toy()
    assert MWUMKLClassifier(epsilon=0.3, max_iter=7).fit(X, y).n_iter_ == 7
    assert MWUMKLClassifier(epsilon=0.3, max_iter=1).fit(X, y).n_iter_ == 1


def test_callback_progress_and_early_stop():
    X, y = _toy()
    T = math.ceil(8 * 0.25 / 0.09 * math.log(len(y)))
    seen = []
    clf = MWUMKLClassifier(epsilon=0.3, callback=seen.append, callback_every=25).fit(X, y)
    assert all(isinstance(info, ProgressInfo) for info in seen)
    assert [info.iteration for info in seen] == [*range(25, T, 25), T]
    assert all(info.n_iter == T and info.elapsed >= 0 and info.s.shape == (12,) for info in seen)
    assert not clf.interrupted_ and clf.n_iter_ == T

    calls = []

    def stop_at_40(info):
        calls.append(info.iteration)
        return info.iteration >= 40

    stopped = MWUMKLClassifier(epsilon=0.3, callback=stop_at_40, callback_every=10).fit(X, y)
    assert calls == [10, 20, 30, 40]
    assert stopped.interrupted_ and stopped.n_iter_ == 40 < T
    # the partial model is the model of 40 iterations
    ref = MWUMKLClassifier(epsilon=0.3, max_iter=40).fit(X, y)
    np.testing.assert_array_equal(stopped.decision_function(X), ref.decision_function(X))
    np.testing.assert_allclose(stopped.kernel_weights_.sum(), 1.0)

    # a truthy value other than True does not stop the fit
    assert MWUMKLClassifier(epsilon=0.3, callback=lambda info: 1, callback_every=10).fit(X, y).n_iter_ == T


def test_verbose_logs_progress(caplog):
    X, y = _toy()
    with caplog.at_level("INFO", logger="mwumkl_dist"):
        MWUMKLClassifier(epsilon=0.3, verbose=1, callback_every=50).fit(X, y)
    assert any("iteration 50/" in rec.getMessage() for rec in caplog.records)
