"""Bands of Gaussian widths: ``selectivity="auto"``'s candidates for one feature group of many widths
(mwumkl_dist.solvers.groups.WidthBand)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from mwumkl_dist import MWUMKLClassifier
from mwumkl_dist.kernels import Gaussian, Polynomial
from mwumkl_dist.solvers import auto
from mwumkl_dist.solvers.candidates import chosen_candidate
from mwumkl_dist.solvers.groups import AUTO_BAND_C_FACTORS, WidthBand, width_bands

SIGMAS = (0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4)


def _specs():
    return [Polynomial(1), *(Gaussian(s) for s in reversed(SIGMAS)), Polynomial(2)]  # widths out of order


def _problem(seed=0, n=120):
    rng = np.random.default_rng(seed)
    X = rng.uniform(size=(n, 3))
    y = np.where(np.sin(6.0 * X[:, 0]) + 0.3 * rng.normal(size=n) > 0, "a", "b")
    return X, y


def test_bands_are_three_neighbouring_widths_on_every_other_width():
    specs = _specs()
    assert width_bands(specs) == [WidthBand(0, 2), WidthBand(2, 4), WidthBand(4, 6)]
    # The 2nd band: widths 0.4, 0.8, 1.6 (ranks 2-4 counted from the narrowest), wherever they are in the list.
    assert [s.sigma for s, keep in zip(specs, WidthBand(2, 4).mask(specs)) if keep] == [1.6, 0.8, 0.4]
    assert WidthBand(2, 4).describe(specs) == {"first": 2, "last": 4, "sigmas": [0.4, 0.8, 1.6], "widths": 7}
    assert str(WidthBand(2, 4)) == "widths(2-4)"
    # No bands: fewer than five widths, or kernels in several feature groups.
    assert width_bands([Gaussian(s) for s in SIGMAS[:4]]) == []
    assert width_bands([*_specs(), Gaussian(1.0, features=(0,))]) == []


def _fit_with_errors(monkeypatch, band_error, X, y, *, same_rows=True, **params):
    """A default fit whose cross-validation scores every other candidate at 0.2 (wrong on the first fifth of
    the rows) and every band at ``band_error`` (the narrowest band 0.01 lower), wrong on the first rows
    (``same_rows``: those the others get wrong too) or from the tenth row on; the final fits are real."""
    scored = []

    def errors(self, candidates, what=""):
        scored.extend(candidates)
        n, out = len(self.rows), []
        for C, s in candidates:
            error = band_error - (0.01 if s.first == 0 else 0.0) if isinstance(s, WidthBand) else 0.2
            start = n // 10 if isinstance(s, WidthBand) and not same_rows else 0
            losses = np.zeros(n)
            losses[start : start + round(error * n)] = 1.0 / n
            self._losses[C, s] = losses
            out.append(float(np.sum(losses)))
        return out

    monkeypatch.setattr(auto._FoldScorer, "errors", errors)
    clf = MWUMKLClassifier(_specs(), random_state=0, **params)
    return (clf.fit(X) if y is None else clf.fit(X, y)), scored  # y None: X is a data store


def test_a_measurably_better_band_is_the_model(monkeypatch, tmp_path):
    X, y = _problem()
    clf, scored = _fit_with_errors(monkeypatch, 0.1, X, y)
    C = clf.C_path_ and min(clf.C_path_, key=clf.C_path_.get)
    # Every band at C and 10 C, after the C grid and the selectivities.
    bands = [(c, b) for (c, b) in scored if isinstance(b, WidthBand)]
    assert bands == [(C * f, b) for b in width_bands(_specs()) for f in AUTO_BAND_C_FACTORS]
    assert clf.width_band_ == {"first": 0, "last": 2, "sigmas": [0.1, 0.2, 0.4], "widths": 7}
    assert clf.C_ == C and clf.selectivity_ == 0.0
    assert set(clf.width_band_path_) == {(b, c) for c, b in bands}
    # The model: the band's kernels with uniform weights, every other kernel at 0.
    band = np.array([isinstance(k, Gaussian) and k.sigma <= 0.4 for k in _specs()])
    np.testing.assert_allclose(clf.kernel_weights_[band], 1.0 / 3.0)
    assert np.all(clf.kernel_weights_[~band] == 0.0)
    assert np.all(clf.kernel_traces_ > 0)
    # The same model as a fit on those kernels alone at that C.
    alone = MWUMKLClassifier([k for k, keep in zip(_specs(), band) if keep], C=C, selectivity=0.0,
                             random_state=0).fit(X, y)  # fmt: skip
    np.testing.assert_allclose(clf.decision_function(X), alone.decision_function(X), rtol=1e-10, atol=1e-12)
    assert chosen_candidate(vars(clf))[1] == WidthBand(0, 2)
    clf.save(tmp_path / "m.npz")
    back = MWUMKLClassifier.load(tmp_path / "m.npz")
    assert back.width_band_ == clf.width_band_
    np.testing.assert_array_equal(back.decision_function(X), clf.decision_function(X))


def test_a_band_within_the_paired_standard_error_leaves_the_whole_family(monkeypatch):
    X, y = _problem()
    # 0.183 against 0.2 on 120 rows, wrong on 10 other rows than the family and right on 12 it gets wrong:
    # the paired difference's standard error is sqrt(22) / 120 = 0.039; the family stays.
    clf, _ = _fit_with_errors(monkeypatch, 0.193, X, y, same_rows=False)
    assert not hasattr(clf, "width_band_") and len(clf.width_band_path_) == 6
    assert np.count_nonzero(clf.kernel_weights_) == len(_specs())
    # The same errors on nested rows (the band wrong only where the family is too): 2 rows of difference,
    # paired standard error 0.012 < 0.017; the band wins, though a binomial standard error (0.036) would not say so.
    clf, _ = _fit_with_errors(monkeypatch, 0.193, X, y)
    assert clf.width_band_["first"] == 0


def test_folds_fit_the_band_kernels_alone(monkeypatch):
    X, y = _problem(1)
    seen = []
    fit_fold = auto._FoldScorer._fit_fold

    def spy(self, k, C, selectivity, kernels=None):
        seen.append((selectivity, None if kernels is None else [getattr(s, "sigma", None) for s in kernels]))
        return fit_fold(self, k, C, selectivity, kernels)

    monkeypatch.setattr(auto._FoldScorer, "_fit_fold", spy)
    MWUMKLClassifier(_specs(), random_state=0).fit(X, y)
    banded = [kernels for selectivity, kernels in seen if kernels is not None]
    assert len(banded) == 3 * len(width_bands(_specs())) * len(AUTO_BAND_C_FACTORS)  # 3 folds each
    assert {tuple(sorted(k)) for k in banded} == {(0.1, 0.2, 0.4), (0.4, 0.8, 1.6), (1.6, 3.2, 6.4)}
    assert all(selectivity == 0.0 for selectivity, kernels in seen if kernels is not None)


@pytest.mark.timeout(120)
def test_probabilities_and_the_cli_summary_of_a_band(monkeypatch, fold_selectivities):
    from mwumkl_dist.summary import chosen_lines

    seen = fold_selectivities
    X, y = _problem(2)
    clf, _ = _fit_with_errors(monkeypatch, 0.1, X, y, probability=True)
    assert seen[-5:] == [WidthBand(0, 2)] * 5  # Platt's folds refit the band itself
    proba, order = clf.predict_proba(X), np.argsort(clf.decision_function(X))
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
    assert np.all(np.diff(proba[order, 1]) >= 0)  # Platt's sigmoid of the band model's decision values
    summary = "\n".join(chosen_lines(clf))
    assert "width band       Gaussians of widths 0.1, 0.2, 0.4 (ranks 0-2 of 7): better than" in summary
    assert "selectivity      0: uniform weights on the kept kernels" in summary
    assert re.search(
        r"^C {16}[\d.]+ \(size-relative, ridge 1/\(C n\)\): the C of the chosen band of widths", summary, re.M
    )


def test_a_band_from_a_data_store_is_the_band_from_memory(monkeypatch, tmp_path):
    from mwumkl_dist.stores import write_data_store

    X, y = _problem(3)
    store = write_data_store(tmp_path / "d.zarr", X, y, chunk_rows=32)
    from_store, _ = _fit_with_errors(monkeypatch, 0.1, store, None)
    from_memory, _ = _fit_with_errors(monkeypatch, 0.1, X, y, polish=False)  # a store's fit is not polished
    assert from_store.width_band_ == from_memory.width_band_ and from_store.width_band_["first"] == 0
    np.testing.assert_array_equal(from_store.dual_coef_, from_memory.dual_coef_)
    np.testing.assert_allclose(from_store.kernel_traces_, from_memory.kernel_traces_, rtol=1e-12)


@pytest.mark.timeout(120)
def test_the_two_stage_weight_stage_scores_bands_only_on_data_near_its_size(monkeypatch):
    """A band chosen on the weight sample is too smooth for far more rows (two_stage.solver.BAND_TRANSFER)."""
    from dataclasses import replace

    from mwumkl_dist.solvers import driver
    from mwumkl_dist.solvers.two_stage import solver as two_stage_solver

    X, y = _problem(4, n=1200)
    for weight_points, scored in ((200, True), (100, False)):  # 1200 rows: 6 and 12 times the sample
        solver = replace(two_stage_solver.TwoStageSolver(), weight_points=weight_points, n_components=50)
        monkeypatch.setitem(driver.SOLVERS, "two-stage", solver)
        clf = MWUMKLClassifier(_specs(), solver="two-stage", random_state=0).fit(X, y)
        assert hasattr(clf, "width_band_path_") is scored and clf.weight_points_ == weight_points


def test_auto_bands_go_beyond_the_family_where_the_optimum_is_at_its_edge(monkeypatch):
    """``kernels="auto"``: bands on a ladder of widths beyond the scaled family's (its memorising widths
    included); the narrowest band best, one band narrower is scored too, and the winner is a model on its own
    Gaussians."""
    from mwumkl_dist.kernels.evaluation import data_scale, scale_sample_rows
    from mwumkl_dist.solvers.groups import AUTO_BAND_CENTRES, AUTO_BAND_EXPONENTS, auto_band_ladder

    X, y = _problem(3)
    scored = []

    def errors(self, candidates, what=None):
        scored.extend(candidates)
        n, out = len(self.rows), []
        for C, s in candidates:
            # every band better the narrower it is (centre rank c: 0.05 + 0.01 c), everything else 0.2
            error = 0.05 + 0.01 * (s.first + 1) if isinstance(s, WidthBand) else 0.2
            losses = np.zeros(n)
            losses[: round(error * n)] = 1.0 / n
            self._losses[C, s] = losses
            out.append(float(np.sum(losses)))
        return out

    monkeypatch.setattr(auto._FoldScorer, "errors", errors)
    clf = MWUMKLClassifier(random_state=0).fit(X, y)
    X = X * clf.feature_scale_ + clf.feature_offset_  # the rows the fit saw (scale_features)
    sigma0 = data_scale([X], 3, X[scale_sample_rows(len(X))]).sigma()
    ladder = auto_band_ladder(sigma0)
    assert ladder == pytest.approx([sigma0 * 2.0**e for e in AUTO_BAND_EXPONENTS])
    centres = [(b.first + b.last) // 2 for _, b in scored if isinstance(b, WidthBand)]
    # The family's bands, then the narrowest one's neighbours (ranks 4, 6), then one step beyond (rank 3), no more.
    assert centres == [c for c in AUTO_BAND_CENTRES for _ in AUTO_BAND_C_FACTORS] + [4, 4, 6, 6] + [3, 3]
    assert clf.width_band_ == {"first": 2, "last": 4, "sigmas": list(ladder[2:5]), "widths": 19, "own_kernels": True}
    # The model is the band's own three Gaussians (2^-3.5 ... 2^-2.5 sigma_0: the family's narrowest and beyond).
    assert [spec.sigma for spec in _gaussians(clf.kernel_names_)] == pytest.approx(ladder[2:5])
    assert ladder[2:5] == pytest.approx([sigma0 * 2.0**e for e in (-3.5, -3.0, -2.5)])
    assert clf.kernel_weights_ == pytest.approx(np.full(3, 1.0 / 3.0))
    assert chosen_candidate(vars(clf))[1] == WidthBand(2, 4, tuple(ladder[2:5]))


def _gaussians(names):
    from mwumkl_dist.kernels import KernelSet

    return KernelSet(list(names), 3).specs
