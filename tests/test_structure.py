"""The structure search of ``kernels="auto"`` (mwumkl_dist.solvers.structure): a Gaussian with one width per
feature says which features are relevant; a model on them is kept where cross-validation finds it better than
the all-features family."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from sklearn.model_selection import StratifiedKFold

from mwumkl_dist import MWUMKLClassifier
from mwumkl_dist.kernels.evaluation import data_scale, scale_sample_rows
from mwumkl_dist.kernels.specs import SUBSET_EXPONENTS, DataScale, KernelSet, subset_kernels
from mwumkl_dist.solvers.auto import stratified_rows
from mwumkl_dist.solvers.candidates import chosen_candidate
from mwumkl_dist.solvers.structure import (
    ARD_POINTS,
    PAIR_STRENGTH,
    RELEVANT_SHARE,
    FeatureStructure,
    Screen,
    alignment,
    ard_relevance,
    kernels_of,
    strongest_pair,
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


def test_the_alignment_gradient_is_the_derivative_of_the_alignment():
    rng = np.random.default_rng(0)
    A = rng.random((12, 12))
    K = A + A.T
    np.fill_diagonal(K, 0.0)
    Yc = rng.choice([-1.0, 1.0], size=(12, 1))
    Yc -= Yc.mean()
    a, G = alignment(K, Yc)
    E = rng.random((12, 12))
    E = E + E.T
    np.fill_diagonal(E, 0.0)
    h = 1e-6
    numeric = (alignment(K + h * E, Yc)[0] - alignment(K - h * E, Yc)[0]) / (2 * h)
    assert np.sum(G * E) == pytest.approx(numeric, rel=1e-5)
    # The identity has no alignment off the diagonal (the trap of the centred alignment with it: 1 / sqrt(n)).
    assert alignment(np.zeros((12, 12)), Yc)[0] == 0.0


@pytest.mark.parametrize("rule", ["xor", "parity3", "additive"])
def test_relevance_finds_the_features_of_an_interaction_of_any_order(rule):
    # No relevant feature has a marginal effect in xor and parity3 (parity3: no pairwise one either).
    rng = np.random.default_rng(1)
    X = rng.uniform(size=(500, 10))
    c = X[:, [2, 5, 7]] - 0.5
    score = {"xor": c[:, 0] * c[:, 1], "parity3": c[:, 0] * c[:, 1] * c[:, 2],
             "additive": np.sin(2 * np.pi * X[:, 2]) + np.sin(2 * np.pi * X[:, 5]) + c[:, 2]}[rule]  # fmt: skip
    y = np.where(score > 0, 1, -1)
    relevance, gamma, a, residual, _ = ard_relevance(X, y)
    relevant = [2, 5] if rule == "xor" else [2, 5, 7]
    assert sorted(np.argsort(-relevance)[: len(relevant)]) == relevant
    noise = np.delete(relevance, relevant)
    # Interactions stand far out; a weak linear term of the additive rule only above the noise.
    share = 1.0 if rule == "additive" else RELEVANT_SHARE
    assert noise.max() < share * relevance[relevant].min() and a > 0
    own = ~residual  # the residual stage's features get a width of their own
    assert gamma[own] == pytest.approx(relevance[own] / X.std(axis=0)[own] ** 2)


def test_the_pair_table_finds_an_interaction_and_says_how_strong_it_is():
    rng = np.random.default_rng(4)
    X = rng.uniform(size=(600, 12))
    checker = np.cos(3 * np.pi * X[:, 3]) * np.cos(3 * np.pi * X[:, 9])
    Z = (X - X.mean(axis=0)) / X.std(axis=0)
    centred = lambda y: (y - y.mean())[:, None]  # noqa: E731
    pair, strength = strongest_pair(Z, centred(np.where(checker > 0, 1.0, -1.0)))
    assert pair == (3, 9) and strength > PAIR_STRENGTH
    # Labels of no pair's interaction: one feature's effect, or noise, is at the null's strength (about 1).
    for y in (np.where(X[:, 3] > 0.5, 1.0, -1.0), rng.choice([-1.0, 1.0], size=600)):
        assert strongest_pair(Z, centred(y))[1] < PAIR_STRENGTH
    assert strongest_pair(Z[:, :1], centred(y)) == (None, 0.0)


def test_a_clear_interaction_stays_relevant_beside_a_strong_smooth_effect():
    # The zoo's mixed: the alignment's optimum is a kernel on the smooth effect's feature (5) alone.
    rng = np.random.default_rng(5)
    X = rng.uniform(size=(600, 10))
    score = 2 * (X[:, 1] - 0.5) * np.cos(2 * np.pi * X[:, 7]) + 6 * ((X[:, 5] - 0.5) ** 2 - 1 / 12)
    screen = Screen.of_rows(X, np.where(score > 0, 1, -1))
    assert sorted(screen.ranking()[: screen.relevant()]) == [1, 5, 7]


def test_relevance_does_not_depend_on_the_features_units():
    rng = np.random.default_rng(2)
    X = rng.uniform(size=(300, 5))
    y = np.where((X[:, 0] - 0.5) * (X[:, 3] - 0.5) > 0, 1, -1)
    factors = np.array([1e3, 1.0, 1e-3, 1e-2, 10.0])
    relevance, gamma, _, _, _ = ard_relevance(X, y)
    scaled, scaled_gamma, _, _, _ = ard_relevance(X * factors, y)
    assert scaled == pytest.approx(relevance, rel=1e-6, abs=1e-9)
    assert scaled_gamma == pytest.approx(gamma / factors**2, rel=1e-6, abs=1e-9)
    # A constant feature is not relevant; one class: nothing to fit.
    X[:, 1] = 3.0
    assert ard_relevance(X, y)[0][1] == 0.0
    assert ard_relevance(X, np.ones(300))[0].tolist() == [0.0] * 5


def test_a_screen_ranks_features_by_relevance_and_averages():
    screen = Screen(np.array([0.2, 0.35, 0.2, 0.25, 0.0]), np.ones(5), 10)
    assert screen.ranking().tolist() == [1, 3, 0, 2, 4]  # ties: the lower index first
    assert screen.relevant() == 4  # relevance >= RELEVANT_SHARE of the largest
    other = Screen(np.array([0.0, 0.5, 0.0, 0.5, 0.0]), np.full(5, 3.0), 20)
    mean = Screen.mean([screen, other])
    assert mean.feature_weights == pytest.approx((screen.feature_weights + other.feature_weights) / 2)
    assert mean.gamma == pytest.approx(np.full(5, 2.0)) and mean.rows == 15


def test_structured_kernels_are_a_joint_band_at_the_learned_width():
    X = np.random.default_rng(1).uniform(size=(400, 6)) * np.array([1.0, 2.0, 1.0, 1.0, 1.0, 1.0])
    scale = _scale(X)
    screen = Screen(np.array([0.3, 0.28, 0.35, 0.02, 0.0, 0.03]), np.array([8.0, 2.0, 8.0, 0.1, 0.0, 0.2]), 400)
    kernels, kept, sigmas, groups = structured_kernels(scale, screen, top=3)
    assert groups == ()  # bands of their own: top=-1 only
    assert kept == (0, 1, 2)
    # The one width that spreads pairs as far apart as the fitted Gaussian: sum var / (2 sum gamma var).
    var = X[:, [0, 1, 2]].var(axis=0)
    sigma = np.sqrt(var.sum() / (2 * np.sum(np.array([8.0, 2.0, 8.0]) * var)))
    assert sigmas == pytest.approx([sigma * 2.0**e for e in SUBSET_EXPONENTS], rel=1e-3)
    assert [k.features for k in kernels] == [(0, 1, 2)] * 3 and [k.sigma for k in kernels] == list(sigmas)
    assert KernelSet(kernels, 6).plan.square_of.tolist() == [1, 2, -1]  # one exponential, two squarings
    # top=0: the relevant features (three here); no learned width: the subset's own scale.
    assert structured_kernels(scale, screen, top=0)[1] == (0, 1, 2)
    flat = Screen(screen.feature_weights, np.zeros(6), 400)
    assert structured_kernels(scale, flat, top=2)[0] == subset_kernels(scale, (0, 2))


def test_a_wider_structure_scales_every_width_of_its_bands():
    X = np.random.default_rng(1).uniform(size=(400, 6))
    scale = _scale(X)
    gamma = np.array([8.0, 8.0, 0.0, 0.0, 0.0, 0.0])
    screen = Screen(np.array([0.45, 0.45, 0.04, 0.03, 0.02, 0.01]), gamma, 400, residual=np.array([0, 0, 1.0, 1, 0, 0]),
                    gamma_residual=np.array([0.0, 0.0, 3.0, 3.0, 0.0, 0.0]))  # fmt: skip
    for top in (0, -1, -2, 3):
        kernels, kept, sigmas, groups = structured_kernels(scale, screen, top)
        wider = structured_kernels(scale, screen, top, widen=2)
        assert wider[1] == kept and wider[2] == pytest.approx([4 * s for s in sigmas])
        assert [k.features for k in wider[0]] == [k.features for k in kernels]
        assert [k.sigma for k in wider[0]] == pytest.approx([4 * k.sigma for k in kernels])
    assert len(structured_kernels(scale, screen, -1)[3]) == 2  # both stages' bands widened too (checked above)


class _Scorer:
    """Cross-validated errors from a table, by ``(widen, C)``; every paired standard error ``se``."""

    def __init__(self, table, se):
        self.table, self.se, self.asked = table, se, []

    def errors(self, candidates, what=""):
        self.asked += [(rung.widen, C) for C, rung in candidates]
        return [self.table[rung.widen, C] for C, rung in candidates]

    def paired_standard_error(self, a, b):
        return self.se


@pytest.mark.parametrize(
    ("wider_errors", "kept"),
    [
        ({(1, 10.0): 0.105, (1, 100.0): 0.098, (2, 100.0): 0.14, (2, 1000.0): 0.099}, 1),  # x2 better, x4 worse
        ({(1, 10.0): 0.10, (1, 100.0): 0.105, (2, 10.0): 0.11, (2, 100.0): 0.10}, 2),  # each octave as good
        ({(1, 10.0): 0.101, (1, 100.0): 0.104}, 0),  # one octave wider is worse (within the standard error)
    ],
)
def test_the_chosen_rung_is_widened_while_the_wider_is_no_worse(wider_errors, kept):
    from mwumkl_dist.solvers.auto import Search
    from mwumkl_dist.solvers.candidates import FeatureStructureKind

    rung = FeatureStructure(-1)
    path = {(rung, 1.0): 0.11, (rung, 10.0): 0.10, (rung, 100.0): 0.12}
    scorer = _Scorer(wider_errors, se=0.01)  # no slack: a width merely as good on the subsample is too smooth at n
    state = Search(scorer, None, 0.0, {}, 10.0, 10.0, 0.0)
    chosen = FeatureStructureKind._widened(state, path, rung)
    assert chosen == replace(rung, widen=kept) and chosen.top == -1
    # Each wider band at its narrower's best C and the next larger one (a smoother kernel wants a weaker ridge).
    assert scorer.asked[:2] == [(1, 10.0), (1, 100.0)]
    assert all(path[replace(rung, widen=w), c] == e for (w, c), e in wider_errors.items() if (w, c) in scorer.asked)


def test_the_ladder_keeps_the_relevant_features_then_1_2_4_and_more_below_the_feature_count():
    assert [r.top for r in structure_rungs(8)] == [0, -1, 1, 2, 4, -2]
    assert [r.top for r in structure_rungs(20)] == [0, -1, 2, 4, 8, 16, -2]
    assert [r.top for r in structure_rungs(500)] == [0, -1, 4, 8, 16, 32, -2]
    assert structure_rungs(1) == []
    assert FeatureStructure(4, Screen(np.zeros(1), np.zeros(1))) == FeatureStructure(4)  # the screen is not compared
    assert str(FeatureStructure(0)) == "structure(relevant features)"
    assert str(FeatureStructure(-1)) == "structure(relevant and residual features)"
    assert str(FeatureStructure(-2)) == "structure(relevant features, one band each)"
    # The residual stage's features (in most of the fits) join the relevant ones in rung -1 only.
    screen = Screen(np.array([0.5, 0.4, 0.02, 0.02]), np.ones(4), 10, 0.1, np.array([0.0, 0.0, 1.0, 0.4]))
    assert screen.with_residual() == (0, 1, 2)
    assert structured_kernels(_scale(np.random.default_rng(0).random((30, 4))), screen, top=0)[1] == (0, 1)


def test_the_residual_rung_adds_a_band_on_each_stage_s_features_at_its_own_width():
    X = np.random.default_rng(3).uniform(size=(300, 5))
    scale = _scale(X)
    # The first fit found x0, x1 (fine); the residual fit x3 (smooth): an additive model of two terms.
    screen = Screen(np.array([0.5, 0.48, 0.01, 0.01, 0.0]), np.array([40.0, 40.0, 0.1, 8.0, 0.0]), 300, 0.2,
                    np.array([0.0, 0.0, 0.0, 1.0, 0.0]), np.array([0.0, 0.0, 0.0, 2.0, 0.0]))  # fmt: skip
    kernels, features, sigmas, groups = structured_kernels(scale, screen, top=-1)
    assert features == (0, 1, 3) and [g for g, _ in groups] == [(0, 1), (3,)]
    var = X.var(axis=0)
    first = np.sqrt(var[[0, 1]].sum() / (2 * 40.0 * var[[0, 1]].sum()))
    assert groups[0][1] == pytest.approx([first * 2.0**e for e in SUBSET_EXPONENTS], rel=1e-3)
    assert groups[1][1] == pytest.approx([np.sqrt(1 / 4.0) * 2.0**e for e in SUBSET_EXPONENTS], rel=1e-3)
    assert [k.features for k in kernels] == [(0, 1, 3)] * 3 + [(0, 1)] * 3 + [(3,)] * 3
    # A fitted model's record of it gives the same kernels back (probabilities' folds, a loaded model).
    record = {"top": -1, "features": list(features), "sigmas": list(sigmas),
              "groups": [{"features": list(g), "sigmas": list(w)} for g, w in groups]}  # fmt: skip
    assert kernels_of(scale, *FeatureStructure.of_model(record).kept) == kernels
    # Without residual features, or in the other rungs: the joint band alone.
    assert structured_kernels(scale, replace(screen, residual=np.zeros(5)), top=-1)[3] == ()
    assert structured_kernels(scale, screen, top=0)[3] == ()


def test_the_additive_rung_gives_the_same_model_whatever_the_features_units():
    # Wine's trouble: features in different units (here 10^-3 .. 10^3).  One band per relevant feature at the width
    # learned for it reads each feature at its own scale: the same kernel values, the same predictions.
    rng = np.random.default_rng(4)
    X = rng.uniform(size=(300, 6))
    y = np.where(np.sin(2 * np.pi * X[:, 1]) + 2 * (X[:, 4] - 0.5) > 0, 1, -1)
    factors = 10.0 ** rng.uniform(-3, 3, size=6)
    kernels, features, sigmas, groups = structured_kernels(_scale(X), Screen.of_rows(X, y), top=-2)
    scaled = structured_kernels(_scale(X * factors), Screen.of_rows(X * factors, y), top=-2)
    assert features == scaled[1] and {1, 4} <= set(features) and sigmas == ()
    assert [g for g, _ in groups] == [(f,) for f in features]
    for (f,), widths in groups:
        assert dict(scaled[3])[f,] == pytest.approx([w * factors[f] for w in widths], rel=1e-6)
    Xt = rng.uniform(size=(200, 6))
    model = MWUMKLClassifier(kernels, C=10.0, selectivity=0.0).fit(X, y)
    other = MWUMKLClassifier(scaled[0], C=10.0, selectivity=0.0).fit(X * factors, y)
    np.testing.assert_array_equal(other.predict(Xt * factors), model.predict(Xt))


# ----------------------------------------------------------------------------- the search in a fit


def _cv_error_of_structure(X, y, top, C, seed, widen=0):
    """Independently: per fold, the relevance fit on (a sample of) its training rows, the kernels, the refit."""
    error = 0.0
    folds = list(StratifiedKFold(3, shuffle=True, random_state=seed).split(X, y))
    for k, (a, b) in enumerate(folds):
        sample = a[stratified_rows(y[a], ARD_POINTS, seed + k)]
        screen = Screen.of_rows(X[sample], y[sample])
        kernels = structured_kernels(_scale(X), screen, top, widen)[0]
        model = MWUMKLClassifier(kernels, C=C, selectivity=0.0).fit(X[a], y[a])
        error += np.mean(model.predict(X[b]) != y[b]) / len(folds)
    return error


def test_the_default_finds_the_interaction_that_carries_the_signal(structured):
    X, y, clf = structured
    Xt, yt = _checkerboard(2000, seed=1)
    scaled = MWUMKLClassifier(kernels="scaled", random_state=0).fit(X, y)
    assert clf.structure_["features"] == [0, 1] and len(clf.structure_["sigmas"]) == 3
    assert np.mean(clf.predict(Xt) != yt) < 0.5 * np.mean(scaled.predict(Xt) != yt)
    # The model's kernels are the structure's; the weight is on the two features.
    assert all(KernelSet([name], N_FEATURES).specs[0].features == (0, 1) for name in clf.kernel_names_)
    assert clf.feature_weights_[:2].sum() == pytest.approx(1.0)
    assert clf.selectivity_ == 0.0 and clf.kernel_weights_ == pytest.approx(np.full(len(clf.kernel_names_), 1 / 3))
    # Its path entries are the cross-validated errors of screen-then-refit, each fold screening its own rows.
    rungs = {r.top for r, _ in clf.structure_path_}
    assert rungs == {0, -1, 1, 2, 4, -2}
    for (rung, C), error in clf.structure_path_.items():
        if rung.top == 2:
            assert error == pytest.approx(_cv_error_of_structure(X, y, 2, C, seed=0, widen=rung.widen))
    # Chosen because it beats the all-features candidates: the C path's best is far worse.
    assert min(clf.structure_path_.values()) < min(clf.C_path_.values()) - 0.1


def test_where_every_feature_matters_the_scaled_family_stays():
    rng = np.random.default_rng(2)
    X = rng.uniform(size=(240, 6))
    y = np.where(np.sum(X, axis=1) + 0.3 * rng.normal(size=240) > 3.0, 1, -1)
    clf = MWUMKLClassifier(random_state=0).fit(X, y)
    assert not hasattr(clf, "structure_") and clf.structure_path_
    family = MWUMKLClassifier(kernels="scaled", scale_features=True, random_state=0).fit(X, y)  # as "auto" scales
    assert list(clf.kernel_names_) == list(family.kernel_names_)


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
    chosen = chosen_candidate(vars(clf))[1]
    assert chosen == FeatureStructure(clf.structure_["top"], widen=clf.structure_.get("widen", 0))
    assert chosen.kept == ((0, 1), tuple(clf.structure_["sigmas"]), ())


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
    assert describe_structure(clf.structure_) == "a model on 2 of the features: x0, x1"
    lines = clf.summary(X, y).splitlines()
    assert any(line.startswith("structure") and "x0, x1" in line for line in lines)
    assert any(line.startswith("selectivity") and "uniform weights on the kept kernels" in line for line in lines)


def test_a_polished_fold_at_selectivity_0_skips_the_iterations_and_keeps_the_model():

    from mwumkl_dist.data.problems import make_training_input
    from mwumkl_dist.solvers.driver import fit_model
    from mwumkl_dist.solvers.spec import FitSpec

    X, y = _checkerboard(150)
    kernels = ["linear", "poly:2", "gaussian:0.5", "gaussian:0.3@0-1"]
    spec = FitSpec.from_params(MWUMKLClassifier(kernels, C=10.0, selectivity=0.0, polish=True).get_params())
    data = make_training_input(X, y, kernels, estimator=None)
    full, none = fit_model(spec, data, seed=0), fit_model(spec.with_model(max_iter=0), data, seed=0)
    assert full["n_iter_"] > 0 and none["n_iter_"] == 0
    for name in ("kernel_weights_", "kernel_traces_", "support_", "dual_coef_", "intercept_"):
        np.testing.assert_array_equal(full[name], none[name])
    with pytest.raises(ValueError, match="max_iter=0"):
        fit_model(spec.with_model(max_iter=0, polish=False), data, seed=0)
