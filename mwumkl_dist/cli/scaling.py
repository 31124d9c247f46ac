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

import numpy as np
import scipy.sparse as sp

from mwumkl_dist.estimator import MWUMKLClassifier

__all__ = ["FeatureScaling", "save_model_file", "load_model_file", "SCALING_KEY"]

#: Name of the scaling in the model file's extra arrays and metadata.
SCALING_KEY = "cli_feature_scaling"
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
        if scale.ndim != 1 or scale.shape != offset.shape or not finite:
            raise ValueError(
                "feature scaling: scale and offset must be finite 1-d arrays of one length, "
                f"got shapes {scale.shape} and {offset.shape}"
            )
        object.__setattr__(self, "scale", scale)
        object.__setattr__(self, "offset", offset)

    @classmethod
    def fit(cls, X) -> FeatureScaling:
        """Min-max for a dense ``X``, max-abs for a sparse one."""
        if sp.issparse(X):
            from sklearn.preprocessing import MaxAbsScaler

            return cls("max-abs", 1.0 / MaxAbsScaler().fit(X).scale_, np.zeros(X.shape[1]))
        from sklearn.preprocessing import MinMaxScaler

        scaler = MinMaxScaler().fit(X)
        return cls("min-max", scaler.scale_, scaler.min_)

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


def save_model_file(clf, path, scaling: FeatureScaling | None) -> None:
    """Save ``clf`` to ``path`` with the feature scaling (None: a plain model file, as the Python API writes)."""
    if scaling is None:
        clf.save(path)
    else:
        arrays, meta = scaling.to_arrays()
        clf.save(path, extra_arrays=arrays, extra_meta=meta)


def load_model_file(path):
    """``(model, scaling)`` from a model file; ``scaling`` is None for a model saved without one."""
    model, arrays, meta = MWUMKLClassifier.load_with_extra(path)
    return model, FeatureScaling.from_arrays(arrays, meta)
