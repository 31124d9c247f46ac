"""Each feature's scale learned in the fit (issue 38: features on different scales, ``scale_features``)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.preprocessing import MinMaxScaler

from mwumkl_dist import MWUMKLClassifier, write_data_store
from mwumkl_dist.kernels.feature_scale import apply_feature_scale, feature_factors, feature_ranges, learn_feature_scale
from mwumkl_dist.stores import DataStore

#: Per-feature factors across six orders of magnitude (the zoo's --rescale draws from 10^-3..10^3).
FACTORS = np.array([1e-3, 7.0, 2e3, 0.05, 1.0, 300.0])


def _mixed_units(n: int = 120, seed: int = 0):
    """Six features in [0, 1]; the label from features 0 and 3 (a ring), the other four noise."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(0.0, 1.0, (n, 6))
    y = np.where((X[:, 0] - 0.5) ** 2 + (X[:, 3] - 0.5) ** 2 < 0.12, 1, -1)
    return X, y


def _wine_like(n: int = 160, seed: int = 1):
    """Like wine's raw features: the informative ones small, a noise feature in the thousands."""
    X, y = _mixed_units(n, seed)
    return X * np.array([1.0, 1.0, 1.0, 1.0, 1.0, 1000.0]) + np.array([0, 0, 0, 0, 0, 300.0]), y


def test_ranges_count_implicit_zeros_and_do_not_depend_on_the_layout():
    X = np.array([[0.0, 2.0, 5.0, 1.0], [0.0, -1.0, 5.0, 0.0], [0.0, 4.0, 5.0, 1.0]])
    lo, hi = feature_ranges([X], 4)
    np.testing.assert_array_equal(lo, [0, -1, 5, 0])
    np.testing.assert_array_equal(hi, [0, 4, 5, 1])
    for blocks in ([sp.csr_matrix(X)], [sp.csr_matrix(X[:1]), X[1:]], [X[:2], sp.csr_matrix(X[2:])]):
        got = feature_ranges(blocks, 4)
        np.testing.assert_array_equal(got[0], lo)
        np.testing.assert_array_equal(got[1], hi)
    sparse_positive = sp.csr_matrix(np.array([[3.0, 0.0], [0.0, 2.0]]))
    np.testing.assert_array_equal(feature_ranges([sparse_positive], 2)[0], [0.0, 0.0])  # the zeros count
    # constant features (a 0 column, a 5 column) keep 1; a 0/1 feature keeps exactly 1: binary data are unchanged
    factors = feature_factors(lo, hi)
    np.testing.assert_array_equal(factors, [1.0, 0.2, 1.0, 1.0])
    binary = np.array([[0.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
    for shift in (True, False):
        assert apply_feature_scale(binary, *learn_feature_scale([binary], 2, shift=shift)) is binary
    # input scaled min-max already is used as given (the E8 sets, the command line's scaled files)
    wide = np.random.default_rng(0).normal(size=(200, 12)) * np.logspace(-3, 3, 12)
    prescaled = MinMaxScaler().fit_transform(wide)
    assert apply_feature_scale(prescaled, *learn_feature_scale([prescaled], 12, shift=True)) is prescaled
    # dense rows: exactly MinMaxScaler's factors and offsets
    scaler = MinMaxScaler().fit(X)
    got = learn_feature_scale([X], 4, shift=True)
    np.testing.assert_array_equal(got[0], scaler.scale_)
    np.testing.assert_allclose(got[1], scaler.min_, rtol=0, atol=0)


def test_scaled_sparse_rows_stay_sparse_and_unshifted():
    X = sp.random(30, 5, density=0.3, random_state=0, format="csr") * 100.0
    factors, offsets = learn_feature_scale([X], 5, shift=False)
    assert not offsets.any()
    Z = apply_feature_scale(X, factors, offsets)
    assert sp.issparse(Z) and Z.nnz == X.nnz
    np.testing.assert_allclose(Z.toarray(), X.toarray() * factors)
    assert np.all(np.abs(Z.toarray()).max(axis=0)[np.diff(X.tocsc().indptr) > 0] <= 1.0 + 1e-12)


@pytest.mark.parametrize("sparse", [False, True])
def test_a_positive_factor_per_feature_gives_the_same_model(sparse):
    X, y = _mixed_units()
    if sparse:
        X[X < 0.2] = 0.0  # stored zeros: the factors must keep them implicit
    raw = sp.csr_matrix(X) if sparse else X
    scaled = sp.csr_matrix(X * FACTORS) if sparse else X * FACTORS
    params = dict(kernels="scaled", scale_features=True, C=1.0, n_jobs=1)
    a, b = MWUMKLClassifier(**params).fit(raw, y), MWUMKLClassifier(**params).fit(scaled, y)
    np.testing.assert_allclose(b.feature_scale_ * FACTORS, a.feature_scale_, rtol=1e-12)
    np.testing.assert_allclose(b.feature_offset_, a.feature_offset_, rtol=1e-12, atol=1e-15)
    assert not np.any(b.feature_offset_) if sparse else np.any(b.feature_offset_)
    np.testing.assert_allclose(b.decision_function(scaled), a.decision_function(raw), rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(b.kernel_weights_, a.kernel_weights_, rtol=1e-7, atol=1e-12)
    assert sp.issparse(b.support_vectors_) == sparse
    assert a.score(raw, y) > 0.85
    # The off switch: the widths then come from the data's overall spread, dominated by the 2e3 feature.
    off = MWUMKLClassifier(**{**params, "scale_features": False}).fit(scaled, y)
    assert not hasattr(off, "feature_scale_")
    assert off.score(scaled, y) < a.score(raw, y) - 0.05


def test_default_fit_on_raw_features_matches_min_max_scaled():
    X, y = _wine_like()
    lo, hi = X[:120].min(axis=0), X[:120].max(axis=0)
    minmax = (X - lo) / (hi - lo)
    raw = MWUMKLClassifier(n_jobs=1).fit(X[:120], y[:120])
    ref = MWUMKLClassifier(n_jobs=1).fit(minmax[:120], y[:120])
    # Dense rows are scaled min-max: the same model as on min-max input, to rounding.
    np.testing.assert_allclose(raw.decision_function(X[120:]), ref.decision_function(minmax[120:]), atol=1e-6)
    assert raw.kernel_scale_ == pytest.approx(ref.kernel_scale_, rel=1e-9)
    assert raw.score(X[120:], y[120:]) == ref.score(minmax[120:], y[120:]) and raw.score(X, y) > 0.85
    assert raw.feature_scale_[5] == pytest.approx(1.0 / (hi[5] - lo[5]), rel=1e-12)


def test_explicit_kernels_keep_their_units_unless_asked():
    X, y = _mixed_units(60)
    assert not hasattr(MWUMKLClassifier(kernels="gaussian:0.5", C=1.0).fit(X * FACTORS, y), "feature_scale_")
    assert hasattr(MWUMKLClassifier(kernels="gaussian:0.5", C=1.0, scale_features=True).fit(X, y), "feature_scale_")


@pytest.mark.parametrize("bad", ["yes", None, 1.5, "True"])
def test_scale_features_is_validated(bad):
    X, y = _mixed_units(40)
    with pytest.raises(ValueError, match="scale_features must be 'auto', True or False"):
        MWUMKLClassifier(scale_features=bad, C=1.0).fit(X, y)


def test_precomputed_kernels_are_not_scaled():
    X, y = _mixed_units(40)
    K = np.stack([X @ X.T, np.exp(-((X[:, None, :] - X[None, :, :]) ** 2).sum(-1))])
    clf = MWUMKLClassifier(kernels="precomputed", C=1.0).fit(K, y)
    assert not hasattr(clf, "feature_scale_")
    with pytest.raises(ValueError, match="scale_features=True needs feature rows"):
        MWUMKLClassifier(kernels="precomputed", C=1.0, scale_features=True).fit(K, y)


def test_save_and_load_keep_the_scale(tmp_path):
    X, y = _mixed_units(80)
    X = X * FACTORS
    clf = MWUMKLClassifier(kernels="scaled", scale_features=True, C=1.0, n_jobs=1).fit(X, y)
    assert "feature scale" in clf.summary()
    clf.save(tmp_path / "m.npz")
    back = MWUMKLClassifier.load(tmp_path / "m.npz")
    np.testing.assert_array_equal(back.feature_scale_, clf.feature_scale_)
    np.testing.assert_array_equal(back.feature_offset_, clf.feature_offset_)
    np.testing.assert_array_equal(back.decision_function(X), clf.decision_function(X))
    assert back.summary(X, y) == clf.summary(X, y)


def test_a_store_out_of_core_gives_the_in_memory_model(tmp_path, monkeypatch):
    X, y = _mixed_units(90)
    X = X * FACTORS
    path = tmp_path / "train.zarr"
    write_data_store(path, X, y, chunk_rows=32)
    params = dict(kernels="scaled", scale_features=True, C=1.0, polish=False, n_jobs=1)
    memory = MWUMKLClassifier(**params).fit(X, y)
    monkeypatch.setenv("MWUMKL_STORE_IN_MEMORY_BYTES", "0")  # shards read their own (scaled) rows
    store = MWUMKLClassifier(**params).fit(DataStore(path))
    np.testing.assert_array_equal(store.feature_scale_, memory.feature_scale_)
    np.testing.assert_array_equal(store.feature_offset_, memory.feature_offset_)
    np.testing.assert_allclose(store.decision_function(X), memory.decision_function(X), rtol=1e-9, atol=1e-12)


@pytest.mark.timeout(300)
def test_a_sparse_store_on_dask_gives_the_in_memory_model(tmp_path, monkeypatch, two_worker_client):
    X, y = _mixed_units(90, seed=2)
    X[X < 0.3] = 0.0
    Xs = sp.csr_matrix(X * FACTORS)
    path = tmp_path / "sparse.zarr"
    write_data_store(path, Xs, y, chunk_rows=32)
    params = dict(kernels="scaled", scale_features=True, C=1.0, polish=False, n_jobs=1)
    memory = MWUMKLClassifier(**params).fit(Xs, y)
    monkeypatch.setenv("MWUMKL_STORE_IN_MEMORY_BYTES", "0")
    dask = MWUMKLClassifier(**params, engine="dask", client=two_worker_client, n_shards=2).fit(DataStore(path))
    np.testing.assert_array_equal(dask.feature_scale_, memory.feature_scale_)
    assert not dask.feature_offset_.any() and sp.issparse(dask.support_vectors_)
    np.testing.assert_allclose(dask.decision_function(Xs), memory.decision_function(Xs), rtol=1e-9, atol=1e-12)


def test_rows_of_weight_zero_do_not_set_the_scale():
    X, y = _wine_like(100)
    w = np.ones(100)
    w[:10] = 0.0
    X[:10, 5] = 1e6  # far outliers, but removed rows
    clf = MWUMKLClassifier(kernels="scaled", scale_features=True, C=1.0).fit(X, y, sample_weight=w)
    ref = MWUMKLClassifier(kernels="scaled", scale_features=True, C=1.0).fit(X[10:], y[10:])
    np.testing.assert_array_equal(clf.feature_scale_, ref.feature_scale_)  # (sigma_0 is of all the rows given)
    np.testing.assert_array_equal(clf.feature_offset_, ref.feature_offset_)
