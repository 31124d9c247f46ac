"""The defaults (issue 20): kernel widths scaled to the data, a solver for every n, a warning when a
model is no better than the majority class."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp

from mwumkl_dist import MajorityClassWarning, MWUMKLClassifier, write_data_store
from mwumkl_dist.kernels import Gaussian, KernelSet
from mwumkl_dist.kernels.evaluation import data_scale
from mwumkl_dist.kernels.specs import BANK_EXPONENTS, PAPER_SIGMAS, SCALED_EXPONENTS, DataScale


def _checkerboard(n: int, cells: int = 4, seed: int = 0, scale: float = 1.0):
    """A 2-D checkerboard on [0, scale]^2: structure far finer than the data's spread."""
    X = np.random.default_rng(seed).uniform(0, 1, (n, 2))
    y = np.where((np.floor(X[:, 0] * cells) + np.floor(X[:, 1] * cells)) % 2 == 0, 1, -1)
    return X * scale, y


def test_scaled_widths_are_sklearn_gamma_scale_multiples():
    X = np.random.default_rng(1).normal(2.0, 3.0, (300, 5))
    ks = KernelSet("scaled", 5, scale=lambda: data_scale([X], 5))
    sigma0 = np.sqrt(1.0 / (2.0 * (1.0 / (X.shape[1] * X.var()))))  # gamma = "scale"
    assert ks.scale.sigma() == pytest.approx(sigma0, rel=1e-12)
    sigmas = [s.sigma for s in ks.specs if isinstance(s, Gaussian)]
    np.testing.assert_allclose(sigmas, [sigma0 * 2.0**e for e in SCALED_EXPONENTS], rtol=1e-12)
    # A tuned SVC searches gamma in 2^-4 .. 2^4 times gamma="scale": all those widths lie inside the grid.
    gammas = (1.0 / (X.shape[1] * X.var())) * 2.0 ** np.arange(-4, 5)
    widths = np.sqrt(1.0 / (2.0 * gammas))
    assert min(sigmas) <= widths.min() and widths.max() <= max(sigmas)
    per = KernelSet("scaled-per-feature", 5, scale=lambda: data_scale([X], 5))
    assert len(per) == 5 * len(ks) and per.specs[3].sigma == pytest.approx(np.sqrt(X[:, 0].var() / 2) * 2.0**-2.5)


def test_random_banks_take_their_widths_from_the_data(tmp_path):
    X = np.random.default_rng(2).normal(0.0, 3.0, (200, 8))
    y = np.where(X[:, 0] * X[:, 1] > 0, 1, -1)
    ks = KernelSet("random:50:size=2:seed=1", 8, scale=lambda: data_scale([X], 8))
    sigma_2 = np.sqrt(2 * X.var() / 2)  # gamma="scale"'s width on 2 features
    np.testing.assert_allclose(ks.bank.sigmas, [sigma_2 * 2.0**e for e in BANK_EXPONENTS], rtol=1e-12)
    assert ks.scale is not None and {s.sigma for s in ks.specs} <= set(ks.bank.sigmas)
    with pytest.raises(ValueError, match="widths from the training data"):
        KernelSet("random:50:size=2", 8)
    paper = KernelSet("random:50:size=2:widths=paper", 8)
    assert paper.bank.sigmas == PAPER_SIGMAS and paper.scale is None
    # Scaled to the data: the same model (to rounding) whatever the data's units.
    clf = MWUMKLClassifier(kernels="random:60:size=2:seed=3", C=10.0, polish=False)
    small, large = clf.fit(X, y), MWUMKLClassifier(**clf.get_params()).fit(1000.0 * X, y)
    assert large.kernel_scale_ == pytest.approx(1000.0 * small.kernel_scale_, rel=1e-12)
    np.testing.assert_allclose(large.decision_function(1000.0 * X), small.decision_function(X), atol=1e-6)
    assert small.score(X, y) > 0.8
    path = tmp_path / "bank.npz"
    small.save(path)
    loaded = MWUMKLClassifier.load(path)
    assert loaded.kernel_scale_ == small.kernel_scale_ and loaded.get_params()["kernels"] == "random:60:size=2:seed=3"
    np.testing.assert_array_equal(loaded.decision_function(X), small.decision_function(X))


def test_the_scale_is_the_same_for_dense_sparse_blocks_and_stores(tmp_path):
    X, y = _checkerboard(500, scale=7.0)
    X[::7, 1] = 0.0  # explicit zeros in the sparse form
    dense = data_scale([X], 2)
    assert data_scale([sp.csr_matrix(X)], 2) == dense
    assert data_scale([X[:123], X[123:400], sp.csr_matrix(X[400:])], 2) == dense
    store = write_data_store(tmp_path / "d.zarr", X, y, chunk_rows=64)
    a = MWUMKLClassifier(C=1.0, epsilon=0.3, polish=False).fit(X, y)
    b = MWUMKLClassifier(C=1.0, epsilon=0.3, polish=False).fit(store)
    assert a.kernel_names_ == b.kernel_names_ and a.kernel_scale_ == b.kernel_scale_
    np.testing.assert_array_equal(a.dual_coef_, b.dual_coef_)


def test_a_constant_feature_has_unit_scale():
    assert DataScale(3, (0, 0), (0, 0)).sigma() == 1.0
    X = np.column_stack([np.full(10, 4.0), np.arange(10.0)])
    assert data_scale([X], 2).sigma((0,)) == 1.0


@pytest.mark.timeout(120)
def test_default_kernels_fit_structure_finer_than_the_paper_widths(tmp_path):
    """The paper's absolute widths (sigma >= 1) cannot resolve a checkerboard of cell 1/4; the default can."""
    X, y = _checkerboard(300, seed=0)  # 300 rows: errors 0.08 and 0.47 (600: 0.06 and 0.36), a quarter of the time
    Xt, yt = _checkerboard(2000, seed=1)
    default = MWUMKLClassifier().fit(X, y)
    paper = MWUMKLClassifier(kernels="paper").fit(X, y)
    default_error = np.mean(default.predict(Xt) != yt)
    paper_error = np.mean(paper.predict(Xt) != yt)
    assert default_error < 0.12 and paper_error > 0.3, (default_error, paper_error)
    Xs = X * default.feature_scale_ + default.feature_offset_  # the features scaled min-max (scale_features)
    assert default.kernel_scale_ == pytest.approx(np.sqrt(X.shape[1] * Xs.var() / 2))
    assert not hasattr(paper, "kernel_scale_")
    default.save(tmp_path / "m.npz")
    loaded = MWUMKLClassifier.load(tmp_path / "m.npz")
    assert loaded.kernel_scale_ == default.kernel_scale_
    np.testing.assert_array_equal(loaded.decision_function(Xt), default.decision_function(Xt))


@pytest.mark.timeout(120)
def test_a_model_no_better_than_the_majority_class_warns():
    rng = np.random.default_rng(3)
    X = rng.uniform(0, 1, (150, 4))
    y = np.where(rng.uniform(size=150) < 0.6, 1, -1)  # labels unrelated to X
    with pytest.warns(MajorityClassWarning, match="no better than predicting the majority class"):
        clf = MWUMKLClassifier(kernels="linear,gaussian:0.5").fit(X, y)
    assert any("majority class" in w for w in clf.fit_warnings_)
    with pytest.warns(MajorityClassWarning, match="training error"):  # a given C: no cross-validation
        MWUMKLClassifier(kernels="linear", C=1e-3, epsilon=0.3, polish=False).fit(X, y)
    ys = np.where(X[:, 0] > 0.5, 1, -1)  # a clean problem: no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error", MajorityClassWarning)
        MWUMKLClassifier(kernels="linear,gaussian:0.5").fit(X, ys)


def test_the_majority_check_reuses_the_bias_checks_scores(monkeypatch):
    """An unpolished fit's bias and majority checks share one set of training scores, read off V (no predictor)."""
    from mwumkl_dist.devices import cpu

    calls = []
    sums = cpu.weighted_kernel_sums
    monkeypatch.setattr(cpu, "weighted_kernel_sums", lambda *args: calls.append(args[0].shape[0]) or sums(*args))
    rng = np.random.default_rng(3)
    X = rng.uniform(0, 1, (150, 4))
    y = np.where(rng.uniform(size=150) < 0.6, 1, -1)  # labels unrelated to X: the check warns
    with pytest.warns(MajorityClassWarning, match="training error"):
        clf = MWUMKLClassifier(kernels="linear,gaussian:0.5", C=1e-3, epsilon=0.3, polish=False).fit(X, y)
    assert calls == []  # the scores come from the solve (V), the majority check reuses them
    errors = np.mean(clf.predict(X) != y)
    assert any(f"({100 * errors:.1f} %)" in w for w in clf.fit_warnings_)  # the final model's training error


def test_widths_that_memorise_the_training_rows_are_left_out():
    from mwumkl_dist.kernels.evaluation import neighbour_distance
    from mwumkl_dist.kernels.specs import MEMORISING_WIDTH

    rng = np.random.default_rng(4)
    wide = rng.uniform(0, 1, (300, 40))  # 40 dimensions, 300 rows: neighbours are far apart
    d2 = ((wide[:, None, :] - wide[None, :, :]) ** 2).sum(-1)
    np.fill_diagonal(d2, np.inf)
    assert neighbour_distance(wide) == pytest.approx(np.sqrt(np.median(d2.min(1))), rel=1e-9)
    assert neighbour_distance(sp.csr_matrix(wide)) == pytest.approx(neighbour_distance(wide), rel=1e-9)
    ks = KernelSet("scaled", 40, scale=lambda: data_scale([wide], 40, wide))
    sigmas = [s.sigma for s in ks.specs if isinstance(s, Gaussian)]
    floor = MEMORISING_WIDTH * neighbour_distance(wide)
    assert min(sigmas) >= floor and len(sigmas) < len(SCALED_EXPONENTS)  # the narrow ones are gone
    dense, _ = _checkerboard(600)  # 2-D, many rows: every width stays
    ks = KernelSet("scaled", 2, scale=lambda: data_scale([dense], 2, dense))
    assert sum(isinstance(s, Gaussian) for s in ks.specs) == len(SCALED_EXPONENTS)
