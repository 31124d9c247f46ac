"""The two-stage fit's pieces: the Nystroem map of a combined kernel, the linear solve, the kernel expansion."""

import numpy as np
import pytest
import scipy.sparse as sp

from mwumkl_dist.core import partition
from mwumkl_dist.kernels import KernelSet
from mwumkl_dist.kernels.evaluation import combined_kernel
from mwumkl_dist.solvers import two_stage
from mwumkl_dist.solvers.base import FitTask
from mwumkl_dist.solvers.driver import fit_model, resolve_solver
from mwumkl_dist.solvers.spec import FitSpec


def _data(n=120, d=5, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.random((n, d))
    y = np.where(np.sin(3 * X[:, 0]) + X[:, 1] ** 2 - 0.6 + 0.1 * rng.standard_normal(n) > 0, 1.0, -1.0)
    return X, y


BANK = "random:40:size=2:seed=3:widths=paper"


@pytest.mark.parametrize("spec", ["paper", "linear,poly:2@0-1,gaussian:0.5@2-4", BANK])
@pytest.mark.parametrize("sparse", [False, True])
def test_map_on_all_rows_reproduces_the_combined_kernel(spec, sparse):
    X, _ = _data(80)
    Xin = sp.csr_matrix(X) if sparse else X
    ks = KernelSet(spec, X.shape[1])
    w = np.random.default_rng(1).random(len(ks))
    ymap = two_stage.nystroem_map(ks, Xin, w, rcond=1e-14)
    F = ymap.transform(Xin)
    K = combined_kernel(ks, Xin, Xin, w)
    np.testing.assert_allclose(F @ F.T, K, atol=1e-10 * np.abs(K).max(), rtol=0)


@pytest.mark.parametrize("spec", ["paper", "random:30:size=2:seed=1:widths=paper", "linear,poly:3@0-1,gaussian:1@2-4"])
@pytest.mark.parametrize("sparse", [False, True])
def test_combined_kernel_is_the_weighted_sum_of_the_kernel_matrices(spec, sparse):
    """The fused evaluation against numpy's, kernel by kernel (``kernel_matrices``), zero weights included."""
    from mwumkl_dist.kernels.evaluation import kernel_matrices

    X, _ = _data(50)
    Xin = sp.csr_matrix(X) if sparse else X
    ks = KernelSet(spec, X.shape[1])
    w = np.random.default_rng(2).random(len(ks))
    K = kernel_matrices(ks, Xin, Xin[:17])
    # exp and the powers may differ from numpy's in the last bit.
    np.testing.assert_allclose(combined_kernel(ks, Xin, Xin[:17], w), np.einsum("i,ijk->jk", w, K), rtol=1e-13)
    w[::2] = 0.0  # squares of dropped Gaussians still find their sources
    np.testing.assert_allclose(combined_kernel(ks, Xin, Xin[:17], w), np.einsum("i,ijk->jk", w, K), rtol=1e-13)


def test_combined_kernel_does_not_depend_on_threads(monkeypatch):
    from mwumkl_dist.devices import cpu as _columns

    monkeypatch.setattr(_columns.pool, "PARALLEL_MIN_WORK", 1)
    X, _ = _data(301)
    ks = KernelSet("paper", X.shape[1])
    w = np.random.default_rng(3).random(len(ks))
    with _columns.thread_limit(1):
        one = combined_kernel(ks, X, X[:40], w)
    with _columns.thread_limit(2):
        two = combined_kernel(ks, X, X[:40], w)
    np.testing.assert_array_equal(one, two)
    np.testing.assert_array_equal(one, combined_kernel(ks, X, X[:40], w, parallel=False))


def test_blocked_product_does_not_depend_on_threads(monkeypatch):
    from mwumkl_dist.devices import threads
    from mwumkl_dist.solvers.two_stage import nystroem

    monkeypatch.setattr(nystroem, "PRODUCT_ROWS", 7)
    monkeypatch.setattr(threads, "_pool", [lambda: 4])  # the policy's threads, whatever the machine
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((60, 45)), rng.standard_normal((45, 30))
    with threads.limit_threads(1):
        one = two_stage.blocked_product(A, B)
        vector = two_stage.blocked_product(A, B[:, 0])
        transposed = two_stage.blocked_product(B.T, A.T)  # views in Fortran order, as Newton's lift.T
    for n in (2, 3, 4):
        with threads.limit_threads(n):
            np.testing.assert_array_equal(two_stage.blocked_product(A, B), one)
            np.testing.assert_array_equal(two_stage.blocked_product(A, B[:, 0]), vector)
            np.testing.assert_array_equal(two_stage.blocked_product(B.T, A.T), transposed)
    np.testing.assert_allclose(one, A @ B, rtol=1e-13, atol=1e-13)
    assert vector.shape == (60,)


@pytest.mark.timeout(60)
def test_model_does_not_depend_on_shards_or_threads(monkeypatch):
    from mwumkl_dist import MWUMKLClassifier

    monkeypatch.setattr(partition, "ROW_BLOCK", 64)  # several row blocks: features and Newton over threads
    X, y = _data(400)
    a = MWUMKLClassifier(C=10.0, solver="two-stage", n_jobs=1).fit(X, y)
    b = MWUMKLClassifier(C=10.0, solver="two-stage", n_shards=3, n_jobs=2).fit(X, y)
    for name in ("kernel_weights_", "support_", "dual_coef_", "intercept_"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))


def test_rank_deficient_kernel_is_reproduced():
    X, _ = _data(60, d=2)
    ks = KernelSet("linear", 2)
    ymap = two_stage.nystroem_map(ks, X, np.ones(1))
    assert ymap.rank == 2
    F = ymap.transform(X)
    np.testing.assert_allclose(F @ F.T, X @ X.T, atol=1e-10)


def test_expansion_equals_linear_model_on_features():
    X, y = _data(200)
    ks = KernelSet("paper", X.shape[1])
    w = two_stage.unit_weights(np.full(len(ks), 1 / len(ks)), two_stage.all_traces(ks, X), len(y))
    rows = two_stage.landmark_rows(len(y), 50, seed=0)
    ymap = two_stage.nystroem_map(ks, X[rows], w)
    coef, b = two_stage.fit_linear(ymap.transform(X), y, C=10.0)
    beta = ymap.expansion(coef)
    Xt, _ = _data(70, seed=5)
    np.testing.assert_allclose(combined_kernel(ks, Xt, X[rows], w) @ beta + b, ymap.transform(Xt) @ coef + b,
                               atol=1e-9)  # fmt: skip


@pytest.mark.parametrize("C", [0.2, 20.0])
def test_newton_solves_liblinears_problem(C):
    from sklearn.svm import LinearSVC

    rng = np.random.default_rng(0)
    F = rng.standard_normal((2000, 30)) / np.sqrt(30)
    y = np.where(F[:, 0] + 0.3 * rng.standard_normal(2000) > 0.1, 1.0, -1.0)
    c = rng.random(2000) + 0.5
    w, b = two_stage.fit_squared_hinge(F, y, C, c)
    ref = LinearSVC(C=C / 2, loss="squared_hinge", dual=False, tol=1e-12, max_iter=100000).fit(F, y, sample_weight=c)
    np.testing.assert_allclose(w, ref.coef_[0], atol=1e-6)
    assert abs(b - ref.intercept_[0]) < 1e-6


def test_linear_solve_agrees_with_sklearn_pipeline():
    from sklearn.kernel_approximation import Nystroem
    from sklearn.svm import LinearSVC

    X, y = _data(300)
    ks = KernelSet("gaussian:0.5", X.shape[1])
    rows = two_stage.landmark_rows(len(y), 40, seed=2)
    ymap = two_stage.nystroem_map(ks, X[rows], np.ones(1))
    coef, b = two_stage.fit_squared_hinge(ymap.transform(X), y, C=2.0)
    # sklearn's Nystroem on the same landmarks (all 40, in its own order): the same features up to a
    # rotation, so the same model.
    ny = Nystroem(kernel="rbf", gamma=2.0, n_components=40, random_state=0).fit(X[rows])
    svc = LinearSVC(C=1.0, loss="squared_hinge", dual=False, tol=1e-8, max_iter=10000).fit(ny.transform(X), y)
    Xt, _ = _data(200, seed=7)
    ours = ymap.transform(Xt) @ coef + b
    np.testing.assert_allclose(ours, svc.decision_function(ny.transform(Xt)), atol=1e-6)


def _two_stage_model(X, y, **params):
    from mwumkl_dist import MWUMKLClassifier
    from mwumkl_dist.data.problems import make_training_input

    est = MWUMKLClassifier(**{"kernels": "paper", **params})
    spec = FitSpec.from_params(est.get_params())
    data = make_training_input(X, y, est.kernels, estimator=est)
    solver = two_stage.TwoStageSolver(weight_points=150, n_components=60, precision="float64")
    task = FitTask.prepare(spec, data, sample_weight=None, seed=0, fit=fit_model)
    attrs = {"classes_": task.classes, "kernel_names_": data.kernel_names, **solver.fit(spec, task).attributes}
    for name, value in attrs.items():
        setattr(est, name, value)
    return est


@pytest.mark.timeout(60)
def test_fitted_model_predicts_like_its_features():
    X, y = _data(400)
    est = _two_stage_model(X, y, C=10.0)
    assert est.solver_ == "two-stage" and est.weight_points_ == 150 and len(est.support_) == 60
    assert np.isclose(est.kernel_weights_.sum(), 1.0)
    ks = KernelSet("paper", X.shape[1])
    w = est.raw_kernel_weights_ * len(y)
    fmap = two_stage.nystroem_map(ks, X[est.support_], w)
    coef, b = two_stage.fit_squared_hinge(fmap.transform(X), y, est.C_)
    Xt, yt = _data(300, seed=3)
    np.testing.assert_allclose(est.decision_function(Xt), fmap.transform(Xt) @ coef + b, atol=1e-8)
    assert np.mean(est.predict(Xt) == yt) > 0.85


@pytest.mark.timeout(60)
def test_multiclass_and_class_weights():
    rng = np.random.default_rng(4)
    X = rng.random((450, 4))
    y = np.digitize(X[:, 0] + 0.5 * X[:, 1], [0.5, 1.0])  # three classes
    est = _two_stage_model(X, y, C=10.0, class_weight="balanced")
    assert est.dual_coef_.shape == (3, 60) and est.kernel_weights_.shape == (3, 12)
    Xt = rng.random((300, 4))
    yt = np.digitize(Xt[:, 0] + 0.5 * Xt[:, 1], [0.5, 1.0])
    assert np.mean(est.predict(Xt) == yt) > 0.8


@pytest.mark.timeout(60)
def test_estimator_solver_choice_and_persistence(tmp_path):
    from mwumkl_dist import MWUMKLClassifier

    X, y = _data(300)
    small = MWUMKLClassifier("paper", C=10.0).fit(X, y)  # "auto" below AUTO_TWO_STAGE_POINTS rows: the MWU fit
    assert small.solver_ == "mwu" and not hasattr(small, "weight_points_")
    est = MWUMKLClassifier("paper", C=10.0, solver="two-stage", probability=True).fit(X, y)
    assert est.solver_ == "two-stage" and est.weight_points_ == 300 and len(est.support_) == 300
    Xt, yt = _data(200, seed=9)
    assert np.mean(est.predict(Xt) == yt) > 0.85
    proba = est.predict_proba(Xt)  # Platt on polished folds: agrees with the decision function's sign mostly
    assert np.mean((proba[:, 1] > 0.5) == (est.decision_function(Xt) > 0)) > 0.9
    est.save(tmp_path / "m.npz")
    back = MWUMKLClassifier.load(tmp_path / "m.npz")
    assert back.solver_ == "two-stage" and back.weight_points_ == 300 and back.n_components_ == est.n_components_
    np.testing.assert_array_equal(back.decision_function(Xt), est.decision_function(Xt))


def test_solver_is_validated_and_refused_where_it_cannot_run():
    from mwumkl_dist import MWUMKLClassifier

    X, y = _data(60)
    with pytest.raises(ValueError, match="solver must be"):
        MWUMKLClassifier(solver="newton").fit(X, y)
    with pytest.raises(ValueError, match="hard margin"):
        MWUMKLClassifier(C=np.inf, solver="two-stage").fit(X, y)
    K = np.stack([X @ X.T, (X @ X.T + 1) ** 2])
    with pytest.raises(ValueError, match="precomputed"):
        MWUMKLClassifier(kernels="precomputed", solver="two-stage").fit(K, y)


def test_auto_solver_says_when_a_setting_rules_the_two_stage_fit_out(tmp_path):
    """``--checkpoint`` (or C=inf, a GPU) made ``solver="auto"`` the MWU fit on all rows without a word."""
    from types import SimpleNamespace

    from mwumkl_dist import MWUMKLClassifier
    from mwumkl_dist.solvers.driver import solver_note

    def spec(**params):
        return FitSpec.from_params(MWUMKLClassifier(**params).get_params())

    n = two_stage.AUTO_TWO_STAGE_POINTS
    data = SimpleNamespace(n_samples=n, X=None, kernel_set=object())
    note = solver_note(spec(checkpoint="c.npz"), data)
    assert note.startswith(f'solver="auto" runs the MWU solver on all {n} points, not the two-stage fit')
    assert "does not support checkpoints" in note
    assert "hard margin" in solver_note(spec(C=np.inf), data)
    assert solver_note(spec(), data) is None  # the two-stage fit runs
    assert solver_note(spec(solver="mwu", checkpoint="c.npz"), data) is None  # chosen explicitly
    assert solver_note(spec(checkpoint="c.npz"), SimpleNamespace(n_samples=n - 1, X=None, kernel_set=object())) is None
    assert solver_note(spec(), SimpleNamespace(n_samples=n, kernel_set=None)) is None  # precomputed: never two-stage
    assert solver_note(spec(), data, resume="ck.npz") is None  # a resumed MWU fit (its first run said so)

    rng = np.random.default_rng(0)
    X = rng.random((n, 3))
    y = np.where(X[:, 0] > 0.5, 1, -1)
    clf = MWUMKLClassifier("linear,gaussian:1", C=1.0, max_iter=5, checkpoint=str(tmp_path / "c.npz"))
    with pytest.warns(UserWarning, match='solver="auto" runs the MWU solver on all') as record:
        clf.fit(X, y)
    assert clf.solver_ == "mwu" and clf.fit_warnings_[0] == note
    assert sum("runs the MWU solver" in str(w.message) for w in record) == 1  # once, not for nested fits


def test_weight_points_rule():
    assert two_stage.weight_points_for(500) == 500
    assert two_stage.weight_points_for(3001) == two_stage.WEIGHT_POINTS == 3000
    assert two_stage.weight_points_for(10**7) == two_stage.WEIGHT_POINTS


def test_auto_solver_rule():
    from types import SimpleNamespace

    from mwumkl_dist import MWUMKLClassifier

    def data(n):
        return SimpleNamespace(n_samples=n, X=None, kernel_set=object())

    def spec(**params):
        return FitSpec.from_params(MWUMKLClassifier(**params).get_params())

    n = two_stage.AUTO_TWO_STAGE_POINTS
    assert resolve_solver(spec(), data(n)) == "two-stage"
    assert resolve_solver(spec(), data(n - 1)) == "mwu"
    assert resolve_solver(spec(solver="mwu"), data(n)) == "mwu"
    assert resolve_solver(spec(C=np.inf), data(n)) == "mwu"
    assert resolve_solver(spec(), data(n), resume="ck.npz") == "mwu"
    # Either engine, in memory or from a data store (both have feature rows and a kernel set).
    assert resolve_solver(spec(engine="dask"), data(n)) == "two-stage"
    assert resolve_solver(spec(device="cuda"), data(n)) == "two-stage"  # its linear stage on the GPU too
    assert resolve_solver(spec(), SimpleNamespace(n_samples=n, kernel_set=None)) == "mwu"  # precomputed
    with pytest.raises(ValueError, match="checkpoints"):
        resolve_solver(spec(solver="two-stage", checkpoint="c.npz"), data(10))
