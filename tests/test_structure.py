"""The structure search of ``kernels="auto"`` (mwumkl_dist.solvers.structure): kernels on feature subsets,
screened by MWU, kept where cross-validation finds them better than the all-features family."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from sklearn.model_selection import StratifiedKFold

from mwumkl_dist import MWUMKLClassifier
from mwumkl_dist.kernels.evaluation import data_scale, scale_sample_rows
from mwumkl_dist.kernels.specs import (
    SCREEN_EXPONENTS,
    SCREEN_KERNELS,
    SCREEN_MAX_FEATURES,
    SUBSET_EXPONENTS,
    DataScale,
    Gaussian,
    KernelSet,
    screening_kernels,
    screening_subsets,
    subset_kernels,
)
from mwumkl_dist.solvers.groups import chosen_selectivity
from mwumkl_dist.solvers.structure import (
    MAX_SUBSETS,
    SCREEN_C,
    SCREEN_EPSILON,
    SCREEN_SELECTIVITY,
    SUBSET_KEEP,
    FeatureStructure,
    Screen,
    structure_rungs,
    structured_kernels,
)

N_FEATURES = 8


def _checkerboard(n, seed=0, d=N_FEATURES):
    """Labels from a checkerboard on features 0 and 1 (no single feature tells anything); the rest is noise."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(size=(n, d))
    y = np.where(np.sin(2 * np.pi * X[:, 0]) * np.sin(2 * np.pi * X[:, 1]) > 0, 1, -1)
    return X, y


def _scale(X) -> DataScale:
    return data_scale([X], X.shape[1], X[scale_sample_rows(X.shape[0])])


@pytest.fixture(scope="module")
def structured():
    """A default fit on the checkerboard, shared by the tests that only read it."""
    X, y = _checkerboard(300)
    return X, y, MWUMKLClassifier(random_state=0).fit(X, y)


# ----------------------------------------------------------------------------- the candidates


def test_screening_offers_every_feature_and_pair_at_their_own_scale():
    subsets = screening_subsets(20, seed=0)
    assert subsets == [(f,) for f in range(20)] + list(itertools.combinations(range(20), 2))
    X = np.random.default_rng(0).uniform(size=(50, 20)) * np.arange(1, 21)  # a scale per feature
    scale = _scale(X)
    kernels = screening_kernels(scale, seed=0)
    assert len(kernels) == len(subsets) <= SCREEN_KERNELS and SCREEN_EXPONENTS == (0.0,)
    # sigma_S = sqrt(|S| var / 2), var over the subset's values: scikit-learn's gamma="scale" on those features.
    pair = kernels[subsets.index((3, 7))]
    assert pair.features == (3, 7) and pair.sigma == pytest.approx(np.sqrt(2 * X[:, [3, 7]].var() / 2), rel=1e-9)
    # A structured model's subset kernels: three widths half an octave apart, one squaring chain.
    widths = subset_kernels(scale, (3, 7))
    assert [k.sigma / pair.sigma for k in widths] == pytest.approx([2.0**e for e in SUBSET_EXPONENTS], rel=1e-12)
    assert KernelSet(widths, 20).plan.square_of.tolist() == [1, 2, -1]  # the narrowest: the middle one squared


def test_screening_draws_pairs_and_triples_within_the_budget():
    subsets = screening_subsets(40, seed=3)
    assert subsets[:40] == [(f,) for f in range(40)]
    drawn = subsets[40:]
    assert len(drawn) == len(set(drawn)) and {len(s) for s in drawn} == {2, 3}
    assert all(list(s) == sorted(s) and len(set(s)) == len(s) for s in drawn)
    assert len(subsets) == SCREEN_KERNELS
    assert screening_subsets(40, seed=3) == subsets  # seeded
    assert screening_subsets(40, seed=4) != subsets
    assert len(screening_subsets(24, seed=0)) == 24 + 276  # every pair while they fit
    # Many features: the singles (and what room is left); beyond the limit no search at all.
    wide = screening_subsets(500, seed=0)
    assert wide == [(f,) for f in range(500)]
    assert screening_subsets(SCREEN_MAX_FEATURES + 1, seed=0) == []
    assert screening_subsets(1, seed=0) == []


def test_a_screen_ranks_features_by_the_weight_of_the_subsets_that_read_them():
    specs = [Gaussian(1.0, features=(0,)), Gaussian(2.0, features=(0,)), Gaussian(1.0, features=(1, 2)),
             Gaussian(1.0, features=(1, 3)), Gaussian(1.0, features=(3,))]  # fmt: skip
    screen = Screen.of(specs, [0.1, 0.1, 0.4, 0.3, 0.1], n_features=5)
    assert screen.subset_weights == pytest.approx({(0,): 0.2, (1, 2): 0.4, (1, 3): 0.3, (3,): 0.1})
    assert screen.feature_weights == pytest.approx([0.2, 0.35, 0.2, 0.25, 0.0])
    assert screen.ranking().tolist() == [1, 3, 0, 2, 4]  # ties: the lower index first
    # One-vs-rest: the problems' weights averaged; averaged screens average their weights.
    both = Screen.of(specs, [[0.2, 0.0, 0.8, 0.0, 0.0], [0.0, 0.0, 0.0, 0.5, 0.5]], n_features=5)
    assert both.subset_weights[(1, 2)] == pytest.approx(0.4)
    mean = Screen.mean([screen, both])
    assert mean.feature_weights == pytest.approx((screen.feature_weights + both.feature_weights) / 2)


def test_structured_kernels_are_a_joint_band_and_the_heaviest_subsets_inside():
    scale = _scale(np.random.default_rng(1).uniform(size=(40, 6)))
    weights = {(0, 1): 0.5, (2,): 0.3, (1, 2): 0.1, (0, 4): 0.06, (3,): 0.04}
    features = np.zeros(6)
    for s, w in weights.items():
        features[list(s)] += w / len(s)
    screen = Screen(features, weights, 20)
    kernels, kept, subsets = structured_kernels(scale, screen, top=3)
    assert kept == (0, 1, 2)  # feature weights 0.28, 0.3, 0.35: the three heaviest
    # Inside them: (0, 1) 0.5, (2,) 0.3, (1, 2) 0.1; kept from SUBSET_KEEP of the heaviest (0.25) on.
    assert SUBSET_KEEP == 0.5 and subsets == [(0, 1), (2,)]
    assert [k.features for k in kernels] == [(0, 1, 2)] * 3 + [(0, 1)] * 3 + [(2,)] * 3


def test_structured_kernels_keep_subsets_above_the_threshold_and_no_repeated_band():
    scale = _scale(np.random.default_rng(1).uniform(size=(40, 6)))
    weights = {(0, 1): 0.4, (1,): 0.3, (0,): 0.25, (1, 5): 0.05}
    features = np.array([0.45, 0.525, 0.0, 0.0, 0.0, 0.025])
    kernels, kept, subsets = structured_kernels(scale, Screen(features, weights, 12), top=2)
    assert kept == (0, 1)
    assert subsets == [(0, 1), (1,), (0,)][:MAX_SUBSETS] and all(weights[s] >= SUBSET_KEEP * 0.4 for s in subsets)
    # The joint band on (0, 1) would repeat the subset (0, 1): only the subsets' kernels.
    assert [k.features for k in kernels] == [(0, 1)] * 3 + [(1,)] * 3 + [(0,)] * 3
    assert kernels[:3] == subset_kernels(scale, (0, 1))


def test_the_ladder_keeps_1_2_4_and_more_features_below_the_feature_count():
    assert [r.top for r in structure_rungs(8)] == [1, 2, 4]
    assert [r.top for r in structure_rungs(20)] == [1, 2, 4, 8, 16]
    assert [r.top for r in structure_rungs(500)] == [2, 4, 8, 16, 32]
    assert structure_rungs(1) == []
    assert FeatureStructure(4, Screen(np.zeros(1), {}, 1)) == FeatureStructure(4)  # the screen is not compared


# ----------------------------------------------------------------------------- the search in a fit


def _cv_error_of_structure(X, y, top, C, seed):
    """Independently: per fold, the screen of its training rows, the structured kernels, the refit."""
    kernels = screening_kernels(_scale(X), seed)
    error = 0.0
    folds = list(StratifiedKFold(3, shuffle=True, random_state=seed).split(X, y))
    for a, b in folds:
        screen_fit = MWUMKLClassifier(kernels, C=SCREEN_C, selectivity=SCREEN_SELECTIVITY, epsilon=SCREEN_EPSILON,
                                      polish=False).fit(X[a], y[a])  # fmt: skip
        screen = Screen.of(kernels, screen_fit.kernel_weights_, X.shape[1])
        model = MWUMKLClassifier(structured_kernels(_scale(X), screen, top)[0], C=C, selectivity=0.0).fit(X[a], y[a])
        error += np.mean(model.predict(X[b]) != y[b]) / len(folds)
    return error


def test_the_default_finds_the_interaction_that_carries_the_signal(structured):
    X, y, clf = structured
    Xt, yt = _checkerboard(2000, seed=1)
    scaled = MWUMKLClassifier(kernels="scaled", random_state=0).fit(X, y)
    assert clf.structure_["features"] == [0, 1] and clf.structure_["subsets"] == [[0, 1]]
    assert np.mean(clf.predict(Xt) != yt) < 0.5 * np.mean(scaled.predict(Xt) != yt)
    # The model's kernels are the structure's; the weight is on the two features.
    assert all(KernelSet([name], N_FEATURES).specs[0].features == (0, 1) for name in clf.kernel_names_)
    assert clf.feature_weights_[:2].sum() == pytest.approx(1.0)
    assert clf.selectivity_ == 0.0 and clf.kernel_weights_ == pytest.approx(np.full(len(clf.kernel_names_), 1 / 3))
    # Its path entries are the cross-validated errors of screen-then-refit, each fold screening its own rows.
    rungs = {r.top for r, _ in clf.structure_path_}
    assert rungs == {1, 2, 4}
    for (rung, C), error in clf.structure_path_.items():
        if rung.top == 2:
            assert error == pytest.approx(_cv_error_of_structure(X, y, 2, C, seed=0))
    # Chosen because it beats the all-features candidates: the C path's best is far worse.
    assert min(clf.structure_path_.values()) < min(clf.C_path_.values()) - 0.1


def test_where_every_feature_matters_the_scaled_family_stays():
    rng = np.random.default_rng(2)
    X = rng.uniform(size=(240, 6))
    y = np.where(np.sum(X, axis=1) + 0.3 * rng.normal(size=240) > 3.0, 1, -1)
    clf = MWUMKLClassifier(random_state=0).fit(X, y)
    assert not hasattr(clf, "structure_") and clf.structure_path_
    assert list(clf.kernel_names_) == list(MWUMKLClassifier(kernels="scaled", random_state=0).fit(X, y).kernel_names_)


def test_a_structured_model_survives_save_and_load(structured, tmp_path):
    X, _, clf = structured
    clf.save(tmp_path / "m.npz")
    loaded = MWUMKLClassifier.load(tmp_path / "m.npz")
    assert loaded.structure_ == clf.structure_ and list(loaded.kernel_names_) == list(clf.kernel_names_)
    np.testing.assert_array_equal(loaded.decision_function(X), clf.decision_function(X))


def test_two_stage_fits_on_the_weight_stage_structure():
    X, y = _checkerboard(400)
    clf = MWUMKLClassifier(solver="two-stage", random_state=0).fit(X, y)
    assert clf.solver_ == "two-stage" and clf.structure_["features"] == [0, 1]
    assert all(KernelSet([name], N_FEATURES).specs[0].features == (0, 1) for name in clf.kernel_names_)
    Xt, yt = _checkerboard(1000, seed=1)
    assert np.mean(clf.predict(Xt) != yt) < 0.1
    # Probabilities' folds refit the same structure (from the model's attributes, no screen).
    chosen = chosen_selectivity(vars(clf))
    assert chosen == FeatureStructure(clf.structure_["top"]) and chosen.kept == ((0, 1), ((0, 1),))


def test_a_structure_from_a_data_store_is_the_structure_from_memory(structured, tmp_path):
    from mwumkl_dist.stores import write_data_store

    X, y, clf = structured
    store = write_data_store(tmp_path / "d.zarr", X, y, chunk_rows=100)
    from_store = MWUMKLClassifier(random_state=0).fit(store)
    assert from_store.structure_ == clf.structure_
    assert list(from_store.kernel_names_) == list(clf.kernel_names_)


def test_probabilities_of_a_structured_model(structured):
    X, y, _ = structured
    clf = MWUMKLClassifier(random_state=0, probability=True).fit(X, y)
    assert clf.structure_["features"] == [0, 1]
    proba = clf.predict_proba(X[:50])
    assert proba.shape == (50, 2) and np.allclose(proba.sum(axis=1), 1.0)
    assert np.mean((proba[:, 1] > 0.5) == (y[:50] == 1)) > 0.8


def test_the_summary_names_the_kept_features(structured):
    from mwumkl_dist.summary import describe_structure

    X, y, clf = structured
    assert (
        describe_structure(clf.structure_) == "a model on 2 of the features: x0, x1; kernels of their own on (x0, x1)"
    )
    lines = clf.summary(X, y).splitlines()
    assert any(line.startswith("structure") and "x0, x1" in line for line in lines)
    assert any(line.startswith("selectivity") and "uniform weights on the kept kernels" in line for line in lines)


def test_a_polished_fold_at_selectivity_0_skips_the_iterations_and_keeps_the_model():
    from dataclasses import replace

    from mwumkl_dist.data.problems import make_training_input
    from mwumkl_dist.solvers.driver import fit_model
    from mwumkl_dist.solvers.spec import FitSpec

    X, y = _checkerboard(150)
    kernels = ["linear", "poly:2", "gaussian:0.5", "gaussian:0.3@0-1"]
    spec = FitSpec.from_params(MWUMKLClassifier(kernels, C=10.0, selectivity=0.0, polish=True).get_params())
    data = make_training_input(X, y, kernels, estimator=None)
    full, none = fit_model(spec, data, seed=0), fit_model(replace(spec, max_iter=0), data, seed=0)
    assert full["n_iter_"] > 0 and none["n_iter_"] == 0
    for name in ("kernel_weights_", "kernel_traces_", "support_", "dual_coef_", "intercept_"):
        np.testing.assert_array_equal(full[name], none[name])
    with pytest.raises(ValueError, match="max_iter=0"):
        fit_model(replace(spec, max_iter=0, polish=False), data, seed=0)
