"""Group selection: ``selectivity="auto"`` with kernels in several feature groups (mwumkl_dist.solvers.groups)."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.model_selection import StratifiedKFold

from mwumkl_dist import MWUMKLClassifier
from mwumkl_dist.kernels import Gaussian, Polynomial
from mwumkl_dist.solvers import auto
from mwumkl_dist.solvers.groups import (
    AUTO_BAND_C_FACTORS,
    AUTO_GROUP_C_GRID,
    AUTO_GROUP_SELECTIONS,
    GroupSelection,
    group_ladder,
    kept_groups,
    n_groups,
    selected_kernels,
    selected_mask,
)

N_FEATURES = 6


def _specs(features=range(N_FEATURES)):
    return [k for f in features for k in (Polynomial(1, features=(f,)), Gaussian(0.5, features=(f,)))]


def _problem(seed=0, n=90):
    """Labels from features 0 and 1 only; features 2-5 are noise."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(size=(n, N_FEATURES))
    y = np.where(X[:, 0] + X[:, 1] + 0.15 * rng.normal(size=n) > 1.0, 1, -1)
    return X, y


def test_groups_are_the_features_a_kernel_reads():
    specs = [Polynomial(1, features=(0,)), Gaussian(1.0, features=(0,)), Gaussian(1.0, features=(1, 2)), Gaussian(2.0)]
    assert n_groups(specs) == 3  # (0,), (1, 2) and all features
    # Group totals 0.5, 0.3, 0.2: a 0.5 threshold keeps the first two (0.3 >= 0.25), not the third.
    weights = np.array([0.25, 0.25, 0.3, 0.2])
    assert kept_groups(specs, weights, keep=0.5) == {(0,), (1, 2)}
    assert selected_mask(specs, weights, keep=0.5).tolist() == [True, True, True, False]
    assert selected_kernels(specs, weights, keep=0.7) == specs[:2]
    # The top k groups instead of a threshold (ties to the first).
    assert kept_groups(specs, weights, top=1) == {(0,)} and kept_groups(specs, weights, top=2) == {(0,), (1, 2)}
    # One-vs-rest: a group kept for any problem is kept.
    both = np.array([[0.9, 0.1, 0.0, 0.0], [0.0, 0.0, 0.1, 0.9]])
    assert kept_groups(specs, both, keep=0.5) == {(0,), None}


def _cv_error_of_group_selection(specs, X, y, selection, C, seed):
    """Independently: per fold, the selection fit on its training rows, then the refit on the kept groups."""
    error = 0.0
    folds = list(StratifiedKFold(3, shuffle=True, random_state=seed).split(X, y))
    for a, b in folds:
        chooser = MWUMKLClassifier(specs, C=selection.C, selectivity=selection.selectivity).fit(X[a], y[a])
        kept = selected_kernels(specs, chooser.kernel_weights_, selection.keep, selection.top)
        model = MWUMKLClassifier(kept, C=C, selectivity=0.0).fit(X[a], y[a])
        error += np.mean(model.predict(X[b]) != y[b]) / len(folds)
    return error


@pytest.fixture(scope="module")
def selected():
    """A group-selecting fit (the informative features' groups kept), shared by the tests that only read it."""
    X, y = _problem()
    return X, y, MWUMKLClassifier(_specs(), random_state=0).fit(X, y)


def test_group_selection_keeps_the_informative_features_and_refits_on_them(selected):
    X, y, clf = selected
    specs = _specs()
    # The threshold selections at every refit C, and the ladder of the top 1, 2, 4 groups at the chosen C and 10 C.
    base_C = auto._first_best(clf.C_path_)
    ladder = {(g, base_C * f) for g in group_ladder(N_FEATURES) for f in AUTO_BAND_C_FACTORS}
    assert [g.top for g in group_ladder(N_FEATURES)] == [1, 2, 4]
    assert [g.top for g in group_ladder(90)] == [4, 8, 16, 32, 64] and [g.top for g in group_ladder(2)] == [1]
    assert set(clf.group_selection_path_) == {(g, c) for g in AUTO_GROUP_SELECTIONS for c in AUTO_GROUP_C_GRID} | ladder
    chosen = clf.group_selection_
    assert chosen is not None and (chosen["groups_kept"], chosen["groups"]) == (2, N_FEATURES)
    # Its path entries are the cross-validated errors of select-then-refit, each fold selecting its own groups.
    for (selection, C), error in list(clf.group_selection_path_.items())[:: len(AUTO_GROUP_C_GRID) - 1]:
        assert error == pytest.approx(_cv_error_of_group_selection(specs, X, y, selection, C, seed=0))
    # Only the informative features carry weight; the weights cover every kernel and sum to 1.
    assert clf.kernel_weights_.shape == (len(specs),) and clf.kernel_weights_.sum() == pytest.approx(1.0)
    assert np.all(clf.feature_weights_[2:] == 0.0) and np.all(clf.feature_weights_[:2] > 0.0)
    assert clf.selectivity_ == 0.0 and clf.C_ in {c for _, c in clf.group_selection_path_}
    # The model is the fit on the kept groups' kernels with uniform weights at the chosen C, bit for bit.
    ref = MWUMKLClassifier(_specs([0, 1]), C=clf.C_, selectivity=0.0, random_state=0).fit(X, y)
    np.testing.assert_array_equal(clf.decision_function(X), ref.decision_function(X))
    np.testing.assert_array_equal(clf.kernel_weights_[:4], ref.kernel_weights_)
    # The choice: the best group selection, within one standard error of the best candidate of all.
    errors = [*clf.selectivity_path_.values(), *clf.group_selection_path_.values()]
    assert auto._within_one_standard_error(min(clf.group_selection_path_.values()), errors, len(y))


def test_group_selection_survives_save_and_load(selected, tmp_path):
    X, y, clf = selected
    assert clf.group_selection_ is not None
    clf.save(tmp_path / "m.npz")
    back = MWUMKLClassifier.load(tmp_path / "m.npz")
    assert back.group_selection_ == clf.group_selection_
    np.testing.assert_array_equal(back.decision_function(X), clf.decision_function(X))


def test_probabilities_are_calibrated_on_the_group_selected_model(fold_selectivities):
    seen = fold_selectivities
    X, y = _problem(2)
    clf = MWUMKLClassifier(_specs(), random_state=0, probability=True).fit(X, y)
    assert clf.group_selection_ is not None
    # Platt's five folds refit the same regime: the group selection itself, not selectivity="auto"'s default.
    chosen = clf.group_selection_
    assert seen[-5:] == [GroupSelection(chosen["C"], chosen["selectivity"], chosen["keep"], chosen.get("top"))] * 5
    proba = clf.predict_proba(X)
    np.testing.assert_array_equal(np.argmax(proba, axis=1) == 1, clf.decision_function(X) > 0)


def test_one_feature_group_has_no_group_selection():
    X, y = _problem(3)
    clf = MWUMKLClassifier([Polynomial(1), Gaussian(0.5), Gaussian(2.0)], random_state=0).fit(X, y)
    assert not hasattr(clf, "group_selection_path_") and not hasattr(clf, "group_selection_")
    bank = MWUMKLClassifier("random:40:size=2:seed=0", random_state=0).fit(X, y)  # a bank: kernels one by one
    assert not hasattr(bank, "group_selection_path_")


def test_two_stage_fit_keeps_the_weight_stage_group_selection():
    X, y = _problem(4, n=400)
    clf = MWUMKLClassifier(_specs(), solver="two-stage", random_state=0).fit(X, y)
    assert clf.solver_ == "two-stage" and clf.group_selection_["groups_kept"] == 2
    assert np.all(clf.feature_weights_[2:] == 0.0)
    assert clf.score(X, y) > 0.8
