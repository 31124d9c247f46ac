"""Each feature's scale, learned from the training rows: min-max per feature, computed once.

Dense rows become ``X * factor + offset`` with ``factor = 1 / (max - min)`` and
``offset = -min * factor``: exactly scikit-learn's ``MinMaxScaler``.  Sparse rows are only
multiplied (offset 0), so they stay sparse and zeros stay zeros; non-negative sparse features (the
usual svmlight file) then also span [0, 1].  Why shift dense rows at all, when a Gaussian kernel does
not see a shift: the default widths' ``sigma_0`` pools the variance of all the values (scikit-learn's
``gamma="scale"``), which grows with the spread of the features' means, and the linear kernel sees
the shift; unshifted, features far from 0 widen the kernels (7 % on the tests' wine-like set).

A feature that already spans [0, 1] (binary 0/1 features, data scaled to [0, 1]) keeps factor 1 and
offset 0 exactly, and a constant feature keeps factor 1 (nothing to scale by).  A positive factor on
any input feature gives the same scaled rows (up to rounding), so the same model.  The minimum and
maximum are exact, so they do not depend on how the rows are held: dense, CSR, or a store's chunks.

The estimator (``scale_features``) and the command line's scaling
(:class:`mwumkl_dist.cli.scaling.FeatureScaling`) both take their factors from :func:`feature_factors`.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import scipy.sparse as sp

__all__ = ["feature_ranges", "feature_factors", "learn_feature_scale", "apply_feature_scale"]


def feature_ranges(blocks: Iterable, n_features: int) -> tuple[np.ndarray, np.ndarray]:
    """``(minimum, maximum)`` of each feature over row ``blocks`` (arrays or sparse matrices).

    A sparse block's implicit zeros count as values.  A feature of no rows (no blocks) gets 0 and 0.
    """
    lo, hi = np.full(n_features, np.inf), np.full(n_features, -np.inf)
    for X in blocks:
        if X.shape[1] != n_features:
            raise ValueError(f"rows of {X.shape[1]} features, expected {n_features}")
        if X.shape[0] == 0:
            continue
        if sp.issparse(X):
            X = sp.csr_matrix(X)
            # O(nnz + d): a column pass would cost more with one far feature index (10^7) in a wide file.
            np.minimum.at(lo, X.indices, X.data)
            np.maximum.at(hi, X.indices, X.data)
            has_zero = np.bincount(X.indices, minlength=n_features) < X.shape[0]
            lo[has_zero] = np.minimum(lo[has_zero], 0.0)
            hi[has_zero] = np.maximum(hi[has_zero], 0.0)
        else:
            X = np.asarray(X)
            lo = np.minimum(lo, X.min(axis=0))
            hi = np.maximum(hi, X.max(axis=0))
    empty = lo > hi
    lo[empty], hi[empty] = 0.0, 0.0
    return lo, hi


def feature_factors(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """``1 / (hi - lo)`` per feature; 1 where the range is 0 or not finite (a constant feature)."""
    span = np.asarray(hi, dtype=np.float64) - np.asarray(lo, dtype=np.float64)
    ok = np.isfinite(span) & (span > 0)
    factors = np.divide(1.0, span, out=np.ones(len(span)), where=ok)
    factors[~np.isfinite(factors) | (factors <= 0)] = 1.0  # a span below 1/DBL_MAX
    # Input scaled to [0, 1] already (MinMaxScaler's max lands within an ulp of 1): exactly 1, so such
    # data are used as given, bit for bit, and not copied.
    factors[np.abs(factors - 1.0) <= 4 * np.finfo(np.float64).eps] = 1.0
    return factors


def learn_feature_scale(blocks: Iterable, n_features: int, *, shift: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(factors, offsets)`` of rows ``blocks``: min-max when ``shift`` (dense rows), else offsets of 0."""
    lo, hi = feature_ranges(blocks, n_features)
    factors = feature_factors(lo, hi)
    offsets = -lo * factors if shift else np.zeros(n_features)
    offsets[offsets == 0.0] = 0.0  # no -0.0: a 0/1 feature's offset is exactly 0
    return factors, offsets


def apply_feature_scale(X, factors: np.ndarray | None, offsets: np.ndarray | None = None):
    """``X * factors + offsets`` per feature: a new array or CSR matrix, or ``X`` itself when nothing changes
    (``factors`` None, or every factor 1 and offset 0).  ``X`` is never changed.  Sparse ``X`` stays sparse
    unless an offset is not 0 (a model fitted on dense rows, given sparse ones)."""
    if factors is None:
        return X
    shifted = offsets is not None and bool(np.any(offsets != 0.0))
    if not shifted and np.all(factors == 1.0):
        return X
    if X.shape[1] != len(factors):
        raise ValueError(f"X has {X.shape[1]} features, the feature scale {len(factors)}")
    if sp.issparse(X) and not shifted:
        X = sp.csr_matrix(X, dtype=np.float64, copy=True)
        X.data *= factors[X.indices]
        return X
    out = (X.toarray() if sp.issparse(X) else np.asarray(X, dtype=np.float64)) * factors
    if shifted:
        out += offsets
    return out
