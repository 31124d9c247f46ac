"""The command line's feature scaling, fitted on the training file and kept in the model file.

Dense data are scaled min-max to [0, 1] per feature, exactly as scikit-learn's
``MinMaxScaler`` does (``X * scale + offset``).  Sparse (svmlight) data are
divided by each feature's largest ``|value|`` (as ``MaxAbsScaler``), never
shifted, so zeros stay zeros and the matrix stays sparse; features that are
non-negative, the usual case of svmlight files, then also land in [0, 1].
Constant (or all-zero) features keep a factor of 1.  Test points are not
clipped: a value beyond the training range maps outside [0, 1].
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp

from mwumkl_dist.cli.args import PROG
from mwumkl_dist.estimator import MWUMKLClassifier
from mwumkl_dist.kernels.feature_scale import learn_feature_scale

__all__ = [
    "FeatureScaling", "ModelFile", "save_model_file", "read_model_file", "load_model_file", "SCALING_KEY",
    "ZERO_BASED_KEY",
]  # fmt: skip

#: Name of the scaling in the model file's extra arrays and metadata.
SCALING_KEY = "cli_feature_scaling"
#: The training file's svmlight index convention in the model file's metadata (True: zero-based).
ZERO_BASED_KEY = "cli_zero_based"
#: Scaling kinds and how :meth:`FeatureScaling.describe` names them.
_KINDS = {
    "min-max": "min-max to [0, 1] per feature, fitted on the training file and stored in the model",
    "max-abs": "divided by each feature's largest |value| on the training file (sparse: no shift, stays "
    "sparse), stored in the model",
}


@dataclass(frozen=True)
class FeatureScaling:
    """``X * scale + offset`` per feature (``offset`` is zero for ``"max-abs"``)."""

    kind: str
    scale: np.ndarray
    offset: np.ndarray

    def __post_init__(self):
        if self.kind not in _KINDS:
            raise ValueError(f"unknown feature scaling {self.kind!r}; expected one of {', '.join(_KINDS)}")
        scale, offset = np.asarray(self.scale, dtype=np.float64), np.asarray(self.offset, dtype=np.float64)
        finite = np.isfinite(scale).all() and np.isfinite(offset).all()
        if scale.ndim != 1 or scale.shape != offset.shape or not finite or not np.all(scale > 0):
            raise ValueError(
                "feature scaling: scale and offset must be finite 1-d arrays of one length, the scale positive; "
                f"got shapes {scale.shape} and {offset.shape}"
            )
        object.__setattr__(self, "scale", scale)
        object.__setattr__(self, "offset", offset)

    @classmethod
    def fit(cls, X) -> FeatureScaling:
        """Min-max for a dense ``X``, max-abs for a sparse one."""
        if sp.issparse(X):
            # MaxAbsScaler's factors, from the stored values alone: O(nnz) work and one array of the
            # feature count (scikit-learn's column pass costs several, with one far feature index 10^7).
            X = sp.csr_matrix(X)
            max_abs = np.zeros(X.shape[1])
            np.maximum.at(max_abs, X.indices, np.abs(X.data))
            scale = np.divide(1.0, max_abs, out=np.ones(X.shape[1]), where=max_abs > 0)  # constant 0: left as is
            return cls("max-abs", scale, np.zeros(X.shape[1]))
        return cls("min-max", *learn_feature_scale([X], X.shape[1], shift=True))  # the estimator's min-max

    @property
    def n_features(self) -> int:
        return len(self.scale)

    def transform(self, X):
        """``X`` scaled (a new array or CSR matrix; ``X`` is not changed)."""
        if X.shape[1] != self.n_features:
            raise ValueError(f"the feature scaling has {self.n_features} features, the data {X.shape[1]}")
        if sp.issparse(X) and not self.offset.any():
            X = sp.csr_matrix(X, dtype=np.float64, copy=True)
            X.data *= self.scale[X.indices]
            return X
        X = X.toarray() if sp.issparse(X) else np.array(X, dtype=np.float64)  # min-max shifts zeros
        X *= self.scale
        X += self.offset
        return X

    def describe(self) -> str:
        return _KINDS[self.kind]

    def to_arrays(self) -> tuple[dict[str, np.ndarray], dict]:
        """``(arrays, meta)`` to store in a model file; :meth:`from_arrays` reads them back."""
        return {f"{SCALING_KEY}_scale": self.scale, f"{SCALING_KEY}_offset": self.offset}, {SCALING_KEY: self.kind}

    @classmethod
    def from_arrays(cls, arrays, meta) -> FeatureScaling | None:
        """The scaling stored by :meth:`to_arrays`, or None when the model file holds none."""
        kind = (meta or {}).get(SCALING_KEY)
        if kind is None:
            return None
        return cls(kind, arrays[f"{SCALING_KEY}_scale"], arrays[f"{SCALING_KEY}_offset"])


def save_model_file(
    clf, path, scaling: FeatureScaling | None, zero_based: bool | None = None, *, overwrite: bool = False
) -> None:
    """Save ``clf`` to ``path`` with the feature scaling and the training file's svmlight index convention.

    Without either (None) the file is a plain model file, as the Python API writes.  ``overwrite``: as
    :meth:`~mwumkl_dist.MWUMKLClassifier.save`'s.
    """
    arrays, meta = scaling.to_arrays() if scaling is not None else ({}, {})
    if zero_based is not None:
        meta[ZERO_BASED_KEY] = bool(zero_based)
    if arrays or meta:
        clf.save(path, extra_arrays=arrays, extra_meta=meta, overwrite=overwrite)
    else:
        clf.save(path, overwrite=overwrite)


class ModelFile(NamedTuple):
    """A model file of ``fit``: the model, its feature scaling (or None) and its svmlight index convention."""

    model: MWUMKLClassifier
    scaling: FeatureScaling | None
    #: Whether the training file's svmlight indices were zero-based (None: not an svmlight file, or not recorded).
    zero_based: bool | None


def read_model_file(path) -> ModelFile:
    """The model, scaling and index convention of a model file.

    A scaling that is not one (missing arrays, a factor of 0, another feature count than the model's)
    or a convention that is not a boolean raises a ``ValueError`` naming the file.
    """
    model, arrays, meta = MWUMKLClassifier.load_with_extra(path)
    try:
        scaling = FeatureScaling.from_arrays(arrays, meta)
        if scaling is not None and scaling.n_features != model.n_features_in_:
            raise ValueError(f"it has {scaling.n_features} features, the model {model.n_features_in_}")
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: not a valid model file of '{PROG} fit' (its feature scaling: {exc})") from None
    zero_based = meta.get(ZERO_BASED_KEY)
    if zero_based not in (None, True, False):
        raise ValueError(f"{path}: not a valid model file of '{PROG} fit' ({ZERO_BASED_KEY} is {zero_based!r})")
    return ModelFile(model, scaling, zero_based)


def load_model_file(path):
    """``(model, scaling)`` from a model file; ``scaling`` is None for a model saved without one."""
    return read_model_file(path)[:2]
