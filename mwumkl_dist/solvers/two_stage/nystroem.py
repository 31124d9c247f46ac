"""Nystroem features of a combined kernel on landmark rows, evaluated in fixed row blocks."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from mwumkl_dist.core.partition import row_blocks
from mwumkl_dist.devices.threads import ordered_map
from mwumkl_dist.kernels.evaluation import combined_kernel
from mwumkl_dist.kernels.specs import KernelSet

__all__ = [
    "WEIGHT_POINTS",
    "N_COMPONENTS",
    "PRUNE",
    "NystroemMap",
    "nystroem_map",
    "landmark_rows",
    "unit_weights",
    "pruned_weights",
    "one_blas_thread",
]

logger = logging.getLogger("mwumkl_dist")


#: The kernel weights are learnt on ``min(n, WEIGHT_POINTS)`` rows: the exact polish's limit (the
#: subsample's fit and C="auto"'s folds are polished, epsilon 0.2).  Fewer rows cost accuracy: on a
#: held-out 50,000-row set 1000 rows gave 2.48 % test error, 3000 rows 1.93 %; twonorm (5550 training
#: rows, 2 splits) 2.62 % with 1000 and 2.08 % with 3000, ringnorm 1.95 % and 1.70 %.
WEIGHT_POINTS = 3000
#: Landmarks of the Nystroem map.
N_COMPONENTS = 500


#: Kernels with ``mu_i < PRUNE * max(mu)`` are left out of the combined kernel (their features cost as much
#: as the others'; on cod-rna / a9a 8 of the 12 paper kernels fall below 1e-3).
PRUNE = 1e-3


def landmark_rows(n_samples: int, n_components: int, seed: int) -> np.ndarray:
    """``min(n_components, n_samples)`` distinct row indices drawn with ``seed``, sorted."""
    k = min(int(n_components), int(n_samples))
    return np.sort(np.random.default_rng(seed).choice(n_samples, size=k, replace=False))


def pruned_weights(kernel_weights, prune: float = PRUNE) -> np.ndarray:
    """The kernel weights with those below ``prune * max(mu)`` set to 0, the rest renormalised to sum 1."""
    mu = np.asarray(kernel_weights, dtype=np.float64)
    mu = np.where(mu >= prune * mu.max(), mu, 0.0)
    return mu / mu.sum()


def unit_weights(kernel_weights, traces, n_samples: int, prune: float = PRUNE) -> np.ndarray:
    """Raw weights ``mu_i / r_i`` of :func:`pruned_weights`, times ``n_samples``.

    The combined kernel ``sum_i w_i K_i`` of the result has unit mean diagonal on the training rows.
    """
    return pruned_weights(kernel_weights, prune) / np.asarray(traces, dtype=np.float64) * float(n_samples)


@dataclass
class NystroemMap:
    """Nystroem features ``phi(x) = K(x, L) M`` of the combined kernel ``K = sum_i weights[i] K_i``."""

    kernel_set: KernelSet
    landmarks: object  # (n_landmarks, n_features) ndarray or CSR
    weights: np.ndarray  # (n_kernels,)
    projection: np.ndarray  # (n_landmarks, rank)

    @property
    def rank(self) -> int:
        return self.projection.shape[1]

    def features(self, X) -> np.ndarray:
        """``phi(X)`` of one block of rows, on this thread."""
        return combined_kernel(self.kernel_set, X, self.landmarks, self.weights, parallel=False) @ self.projection

    def transform(self, X) -> np.ndarray:
        """The features ``phi(X)``, ``(n, rank)``, in fixed row blocks (over threads when there are several)."""
        out = np.empty((X.shape[0], self.rank))

        def block(bounds):
            lo, hi = bounds
            out[lo:hi] = self.features(X[lo:hi])

        ordered_map(block, row_blocks(0, X.shape[0]))
        return out

    def expansion(self, coef) -> np.ndarray:
        """Kernel-expansion coefficients on the landmarks: ``w' phi(x) = (M w)' K(L, x)``."""
        return self.projection @ np.asarray(coef, dtype=np.float64)


def nystroem_map(kernel_set: KernelSet, landmarks, weights, rcond: float = 1e-12) -> NystroemMap:
    """The Nystroem map of ``sum_i weights[i] K_i`` on ``landmarks``.

    Eigenvalues of ``K(L, L)`` below ``rcond`` times the largest are dropped (a
    rank-deficient combination, e.g. a linear kernel on few features, or repeated landmarks).
    """
    weights = np.asarray(weights, dtype=np.float64)
    K = combined_kernel(kernel_set, landmarks, landmarks, weights)
    K = 0.5 * (K + K.T)
    s, U = np.linalg.eigh(K)
    if not s.size or s[-1] <= 0:
        raise ValueError("the combined kernel is zero on the landmarks")
    keep = s > rcond * s[-1]
    projection = U[:, keep] / np.sqrt(s[keep])
    return NystroemMap(kernel_set, landmarks, weights, np.ascontiguousarray(projection[:, ::-1]))


def one_blas_thread():
    """BLAS on one thread: products and solves whose bits would change with its thread count."""
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1, user_api="blas")
