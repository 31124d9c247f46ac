"""The automatic choices (mwumkl_dist.solvers.auto): the few-iterations warning, random_state, the iteration plan."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from mwumkl_dist import FewIterationsWarning, MWUMKLClassifier
from mwumkl_dist.solvers import mwu
from mwumkl_dist.solvers.auto import AUTO_C_GRID, FEW_T_FRACTION, auto_epsilon, plan_iterations, random_seed

KERNELS = "linear,gaussian:1"


def _noisy(n=120, d=4, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(size=(n, d))
    y = np.where((X - 0.5) @ rng.normal(size=d) + 0.4 * rng.normal(size=n) > 0, 1, -1)
    return X, y


# ----------------------------------------------------------------------------- too few iterations


def test_a_given_epsilon_with_far_too_few_iterations_warns_and_is_recorded(tmp_path):
    X, y = _noisy(n=400)
    # T = ceil(8 * 0.25 / 0.81 * ln 400) = 15 iterations, fewer than 400 / 10: the unpolished MWU dual is poor.
    clf = MWUMKLClassifier(KERNELS, C=1.0, epsilon=0.9, polish=False)
    with pytest.warns(FewIterationsWarning, match=r"epsilon=0\.9 gives 15 iterations for 400 training points") as rec:
        clf.fit(X, y)
    planned = [str(w.message) for w in rec if "iterations for 400" in str(w.message)]
    assert len(planned) == 1
    suggested = auto_epsilon(400, 0.5, polished=False)
    assert f"epsilon={suggested:.3g}" in planned[0]  # names the value that would work
    assert mwu.iteration_count(suggested, 0.5, 400) >= 0.2 * 400
    # First the plan's warning; then, if the bias check replaced the bias, its own (see test_bias_guard.py).
    assert clf.fit_warnings_ == [str(w.message) for w in rec if issubclass(w.category, FewIterationsWarning)]
    assert clf.fit_warnings_[0] == planned[0]
    # the warning is part of the saved model
    clf.save(tmp_path / "m.npz")
    assert MWUMKLClassifier.load(tmp_path / "m.npz").fit_warnings_ == clf.fit_warnings_


def test_max_iter_with_far_too_few_iterations_warns():
    X, y = _noisy(n=60)
    with pytest.warns(FewIterationsWarning, match=r"max_iter=2 gives 2 iterations for 60 .*leave max_iter unset"):
        clf = MWUMKLClassifier(KERNELS, C=1.0, max_iter=2, polish=False).fit(X, y)
    assert len(clf.fit_warnings_) == 1 and clf.n_iter_ == 2


@pytest.mark.parametrize(
    "params",
    [
        {"C": 1.0, "polish": False},  # epsilon="auto" without the polish: T >= n / 5 by construction
        {"C": 1.0},  # polished
        {"C": 1.0, "epsilon": 0.9},  # a rough epsilon is fine when the exact polish re-solves the SVM
        {"C": 1.0, "epsilon": 0.2, "polish": False},  # T = 0.2 * 150 ... far above n / 10
        {},  # C="auto": its fold fits do not warn either
    ],
)
def test_no_warning_when_the_iterations_suffice(params):
    X, y = _noisy(n=150)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FewIterationsWarning)
        clf = MWUMKLClassifier(KERNELS, **params).fit(X, y)
    assert clf.fit_warnings_ == []


def test_C_auto_warns_once_for_the_final_fit_only():
    X, y = _noisy(n=90)
    with pytest.warns(FewIterationsWarning) as rec:
        clf = MWUMKLClassifier(KERNELS, max_iter=3, polish=False).fit(X, y)  # 18 fold fits of 3 iterations
    assert len([w for w in rec if w.category is FewIterationsWarning]) == 1
    assert len(clf.fit_warnings_) == 1 and clf.C_ in AUTO_C_GRID


def test_plan_iterations_matches_the_fit():
    for n, eps, max_iter, polish in [(400, 0.9, None, False), (60, "auto", None, False), (60, 0.3, 7, True)]:
        plan = plan_iterations(epsilon=eps, max_iter=max_iter, rho=0.5, polish=polish, C=1.0, n_samples=n, n_kernels=2)
        X, y = _noisy(n=n)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FewIterationsWarning)
            clf = MWUMKLClassifier(KERNELS, C=1.0, epsilon=eps, max_iter=max_iter, polish=polish).fit(X, y)
        assert (plan.epsilon, plan.n_iter, plan.polished) == (clf.epsilon_, clf.n_iter_, clf.polished_)
        assert (plan.warning is not None) == bool(clf.fit_warnings_)
        assert (plan.warning is not None) == (not plan.polished and plan.n_iter < FEW_T_FRACTION * n)


def test_plan_iterations_from_a_store_is_never_polished():
    plan = plan_iterations(
        epsilon="auto", max_iter=None, rho=0.5, polish="auto", C="auto", n_samples=100, n_kernels=3, in_memory=False
    )
    assert not plan.polished and plan.epsilon == 0.1


# ----------------------------------------------------------------------------- random_state


def test_random_state_changes_the_C_folds_and_a_seed_repeats_them():
    X, y = _noisy()
    params = {"kernels": KERNELS, "epsilon": 0.4, "polish": False}
    paths = {rs: MWUMKLClassifier(**params, random_state=rs).fit(X, y).C_path_ for rs in (0, 1)}
    assert paths[0] != paths[1]  # other folds, other cross-validated errors
    a = MWUMKLClassifier(**params, random_state=1).fit(X, y)
    b = MWUMKLClassifier(**params, random_state=1).fit(X, y)
    assert a.C_path_ == b.C_path_ == paths[1]
    np.testing.assert_array_equal(a.dual_coef_, b.dual_coef_)
    np.testing.assert_array_equal(a.decision_function(X), b.decision_function(X))
    # a RandomState draws one seed per fit: the same state, the same model
    c = MWUMKLClassifier(**params, random_state=np.random.RandomState(5)).fit(X, y)
    d = MWUMKLClassifier(**params, random_state=np.random.RandomState(5)).fit(X, y)
    assert c.C_path_ == d.C_path_
    assert MWUMKLClassifier(**params, random_state=None).fit(X, y).C_ in AUTO_C_GRID


def test_the_default_random_state_is_seed_0():
    X, y = _noisy()
    params = {"kernels": KERNELS, "epsilon": 0.4, "polish": False}
    assert MWUMKLClassifier(**params).fit(X, y).C_path_ == MWUMKLClassifier(**params, random_state=0).fit(X, y).C_path_


def test_random_state_of_a_data_store_sample(tmp_path):
    pytest.importorskip("zarr")
    from mwumkl_dist.stores import write_data_store

    X = np.arange(400.0).reshape(200, 2)
    store = write_data_store(tmp_path / "d.zarr", X, np.where(np.arange(200) % 3 == 0, 1, -1), chunk_rows=10)
    first = {tuple(store.sample_rows(20, seed=s)[0][::10, 0]) for s in range(4)}
    assert len(first) > 1  # the seed picks the chunks
    np.testing.assert_array_equal(store.sample_rows(20, seed=3)[0], store.sample_rows(20, seed=3)[0])


@pytest.mark.parametrize("bad", [-1, 2**32, 1.5, "0", True, np.random.default_rng(0)])
def test_bad_random_state_is_refused_before_fitting(bad):
    X, y = _noisy(n=40)
    with pytest.raises(ValueError, match="random_state must be"):
        MWUMKLClassifier(KERNELS, C=1.0, random_state=bad).fit(X, y)


def test_random_seed():
    assert random_seed(7) == 7 and random_seed(np.int64(3)) == 3
    rs = np.random.RandomState(0)
    assert random_seed(np.random.RandomState(0)) == random_seed(rs)
    assert random_seed(rs) != random_seed(np.random.RandomState(0))  # rs has advanced: the next draw differs
    assert 0 <= random_seed(None) < 2**31
