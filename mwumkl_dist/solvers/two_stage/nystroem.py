"""Nystroem features of a combined kernel on landmark rows, evaluated in fixed row blocks; the adaptive rank."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np

from mwumkl_dist.core.partition import row_blocks
from mwumkl_dist.devices.threads import one_blas_thread, ordered_map
from mwumkl_dist.kernels.evaluation import as_csr, combined_kernel, kernel_diagonal
from mwumkl_dist.kernels.specs import KernelSet

__all__ = [
    "WEIGHT_POINTS",
    "N_COMPONENTS",
    "N_COMPONENTS_MAX",
    "RANK_PER_SQRT_N",
    "RESIDUAL_TOL",
    "RESIDUAL_POINTS",
    "PRUNE",
    "Basis",
    "NystroemMap",
    "nystroem_map",
    "nystroem_residual",
    "landmark_order",
    "landmark_rows",
    "rank_cap",
    "rank_levels",
    "unit_weights",
    "pruned_weights",
    "PRODUCT_ROWS",
    "blocked_product",
]

logger = logging.getLogger("mwumkl_dist")


#: The kernel weights are learnt on ``min(n, WEIGHT_POINTS)`` rows: the exact polish's limit (the
#: subsample's fit and C="auto"'s folds are polished, epsilon 0.2).  Fewer rows cost accuracy: on a
#: held-out 50,000-row set 1000 rows gave 2.48 % test error, 3000 rows 1.93 %; twonorm (5550 training
#: rows, 2 splits) 2.62 % with 1000 and 2.08 % with 3000, ringnorm 1.95 % and 1.70 %.  More rows do not
#: pay: 6000 (unpolished, epsilon 0.1) gave a9a 14.81 % against 14.84 % and cod-rna 3.41 % against 3.41 %
#: (official test files, adaptive rank) for twice the weight stage's time.
WEIGHT_POINTS = 3000
#: The adaptive rank starts at this many landmarks (the fixed rank before it) ...
N_COMPONENTS = 500
#: ... and doubles (nested landmarks) while the Nystroem residual is above :data:`RESIDUAL_TOL`, up to
#: ``RANK_PER_SQRT_N * sqrt(n)`` landmarks (the ``sqrt(n)`` that suffices for the kernel SVM's rate when
#: the regularisation falls as ``1 / sqrt(n)``, Rudi et al. 2015) and never more than :data:`N_COMPONENTS_MAX`
#: (see :func:`rank_cap`).  Measured (official test files, same kernel weights, 2-core box): cod-rna
#: (59,535 rows) 500 landmarks 3.80 %, 1000 3.55 %, 1942 3.41 % (tuned RBF SVC 3.64 %); magic04 (14,265
#: rows) 500: 13.99 %, 955: 13.56 %; a9a (32,561) 500: 14.88 %, 1413: 14.84 % (SVC 14.93 %); twonorm and
#: ringnorm (5,550) the same error at 500 and 596.  The linear solve costs ``O(n_A r^2)`` (``n_A`` rows on or
#: inside the margin), so a rank growing as ``sqrt(n)`` costs ``O(n^2)``: the cap stops the growth at
#: 30,625 rows, from where the fit is linear in ``n`` again.  E7's cod-rna at 10^5 rows (one thread, the
#: same run): rank 1000 3.53 % in 9.0 s CPU, 1400 3.43 % in 11.1 s, 2000 3.43 % in 18.4 s.
N_COMPONENTS_MAX = 1400
RANK_PER_SQRT_N = 8.0
#: The relative Nystroem residual ``mean_j (k(x_j, x_j) - |phi(x_j)|^2) / mean_j k(x_j, x_j)`` at which
#: the rank stops growing, measured on :data:`RESIDUAL_POINTS` rows drawn after every landmark.  Kept
#: small: a residual of 0.1 still costs accuracy (cod-rna 0.098 at 500 landmarks, 0.050 at 1942; magic04
#: 0.116 at 500, 0.093 at 955), so the cap is what stops the growth on the sets measured; the
#: tolerance stops it where the features all but reproduce the kernel (a smooth kernel on few features).
RESIDUAL_TOL = 0.02
RESIDUAL_POINTS = 1000


#: Kernels with ``mu_i < PRUNE * max(mu)`` are left out of the combined kernel (their features cost as much
#: as the others'; on cod-rna / a9a 8 of the 12 paper kernels fall below 1e-3).
PRUNE = 1e-3


def landmark_order(n_samples: int, seed: int) -> np.ndarray:
    """All row indices in the random order landmarks are taken in: the first ``r`` are the landmarks of rank ``r``.

    So the landmark sets of the ranks are nested, and the rows at the end of
    the order (landmarks only when the rank nears ``n``) measure the residual.
    """
    return np.random.default_rng(seed).permutation(int(n_samples))


def landmark_rows(n_samples: int, n_components: int, seed: int) -> np.ndarray:
    """The first ``min(n_components, n_samples)`` rows of :func:`landmark_order`, sorted."""
    k = min(int(n_components), int(n_samples))
    return np.sort(landmark_order(n_samples, seed)[:k])


def rank_cap(n_samples: int) -> int:
    """The most landmarks the adaptive rank takes on ``n_samples`` rows.

    ``RANK_PER_SQRT_N * sqrt(n)`` (at least :data:`N_COMPONENTS`, at most
    :data:`N_COMPONENTS_MAX` and ``n``): the features cost ``O(n r)`` memory and
    the linear solve ``O(n_A r^2)`` per Hessian, so the cap keeps both within
    ``O(n^2)`` of the kernel SVM they approximate and, past ``N_COMPONENTS_MAX``, linear in ``n``.
    """
    n = int(n_samples)
    return int(min(n, N_COMPONENTS_MAX, max(N_COMPONENTS, round(RANK_PER_SQRT_N * math.sqrt(n)))))


def rank_levels(start: int, cap: int) -> list[int]:
    """The ranks the adaptive rank tries: ``start``, doubled until ``cap`` (the last level is ``cap``)."""
    levels = [int(min(start, cap))]
    while levels[-1] < cap:
        levels.append(int(min(2 * levels[-1], cap)))
    return levels


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


@dataclass(frozen=True)
class Basis:
    """Features from a shard's stored columns: ``columns[:, :width] @ projection`` (None: the columns themselves)."""

    width: int
    projection: np.ndarray | None

    @property
    def rank(self) -> int:
        return self.width if self.projection is None else self.projection.shape[1]

    def features(self, columns) -> np.ndarray:
        """The features of stored ``columns`` (rows x at least ``width``)."""
        block = columns[:, : self.width]
        return np.asarray(block, dtype=np.float64) if self.projection is None else block @ self.projection

    def lift(self, coef) -> np.ndarray:
        """The vector on the stored columns whose product with them is the features' times ``coef``."""
        coef = np.asarray(coef, dtype=np.float64)
        return coef if self.projection is None else self.projection @ coef


@dataclass
class NystroemMap:
    """Nystroem features ``phi(x) = K(x, L) M`` of the combined kernel ``K = sum_i weights[i] K_i``.

    A linear-stage shard stores the kernel columns ``K(x, L)`` (:meth:`columns`)
    and applies ``M`` (its :attr:`basis`) as it goes: the features of a
    smaller map on the first landmarks (:func:`landmark_order`) are those
    columns' first ones times that map's ``M``.
    """

    kernel_set: KernelSet
    landmarks: object  # (n_landmarks, n_features) ndarray or CSR
    weights: np.ndarray  # (n_kernels,)
    projection: np.ndarray  # (n_landmarks, rank)
    eigenvalues: np.ndarray | None = None  # (rank,): those of K(L, L) that the columns of M divide by

    @property
    def rank(self) -> int:
        return self.projection.shape[1]

    @property
    def n_columns(self) -> int:
        return self.projection.shape[0]

    @property
    def basis(self) -> Basis:
        return Basis(self.n_columns, self.projection)

    def columns(self, X) -> np.ndarray:
        """``K(X, L)`` of one block of rows, on this thread's threads (in a region of blocks: its share of them).

        Entries are independent: the same bits for any thread count.
        """
        return combined_kernel(self.kernel_set, X, self.landmarks, self.weights)

    def features(self, X) -> np.ndarray:
        """``phi(X)`` of one block of rows (the product on this thread)."""
        return self.columns(X) @ self.projection

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

    def coefficients(self, beta) -> np.ndarray:
        """The ``w`` whose :meth:`expansion` is nearest ``beta`` in the kernel's norm (``beta`` itself at full rank).

        ``M = U S^{-1/2}``, so ``w = S^{1/2} U' beta = S M' beta``: a smaller
        map's model, ``beta`` padded with zeros on the new landmarks, as a
        starting point of this map's solve.
        """
        if self.eigenvalues is None:
            raise ValueError("this Nystroem map does not keep the eigenvalues of K(L, L)")
        beta = np.asarray(beta, dtype=np.float64)
        padded = np.zeros(self.n_columns)
        padded[: len(beta)] = beta
        return self.eigenvalues * (self.projection.T @ padded)


#: Eigenvalues of ``K(L, L)`` below this fraction of the largest are dropped from a Nystroem map.  The
#: features divide by the square roots of the kept ones, and the Newton solve projects Gram matrices of the
#: kernel columns through the map: a rounding error of the columns' Gram grows by ``1 / s_min``.  At 1e-12
#: a smooth combination (a band of the widest Gaussians, cod-rna at 10^5 rows) kept eigenvalues near
#: 1e-9 and the Hessian lost its positive definiteness; what 1e-9 drops changes the kernel by at most
#: ``rank * 1e-9`` of its largest eigenvalue.
RCOND = 1e-9


def nystroem_map(kernel_set: KernelSet, landmarks, weights, rcond: float = RCOND) -> NystroemMap:
    """The Nystroem map of ``sum_i weights[i] K_i`` on ``landmarks``.

    Eigenvalues of ``K(L, L)`` below ``rcond`` times the largest are dropped (:data:`RCOND`; a
    rank-deficient or very smooth combination, e.g. a linear kernel on few features, repeated
    landmarks, wide Gaussians).
    """
    weights = np.asarray(weights, dtype=np.float64)
    K = combined_kernel(kernel_set, landmarks, landmarks, weights)
    K = 0.5 * (K + K.T)
    s, U = np.linalg.eigh(K)
    if not s.size or s[-1] <= 0:
        raise ValueError("the combined kernel is zero on the landmarks")
    keep = s > rcond * s[-1]
    projection = U[:, keep] / np.sqrt(s[keep])
    return NystroemMap(kernel_set, landmarks, weights, np.ascontiguousarray(projection[:, ::-1]),
                       np.ascontiguousarray(s[keep][::-1]))  # fmt: skip


def nystroem_residual(fmap: NystroemMap, X) -> float:
    """The relative Nystroem residual on rows ``X``: ``sum_j (K(x_j, x_j) - |phi(x_j)|^2) / sum_j K(x_j, x_j)``.

    The trace of ``K - Phi Phi'`` (positive semidefinite) over that of ``K``
    on those rows: 0 when the map reproduces the kernel there, 1 when its
    features are 0.  Clipped at 0 against rounding.
    """
    if X.shape[0] == 0:
        return 0.0
    diagonal = kernel_diagonal(as_csr(X), fmap.kernel_set.plan) @ fmap.weights
    F = blocked_product(fmap.columns(X), fmap.projection)  # the features over the threads (same bits for any count)
    total = float(np.sum(diagonal))
    return max(0.0, float(np.sum(diagonal - np.einsum("ij,ij->i", F, F))) / total) if total > 0 else 0.0


#: Rows per block of the dense products that run over threads (:func:`blocked_product`): fixed, so that
#: their bits do not depend on the thread count.
PRODUCT_ROWS = 128


def blocked_product(A, B) -> np.ndarray:
    """``A @ B`` by fixed blocks of :data:`PRODUCT_ROWS` rows of ``A`` over this thread's threads.

    Each block is one BLAS product on one thread
    (:func:`~mwumkl_dist.devices.threads.one_blas_thread`), so the result has
    the same bits for any thread count where BLAS's own threads may not.
    """
    A, B = np.asarray(A, dtype=np.float64), np.asarray(B, dtype=np.float64)
    out = np.empty((A.shape[0], *B.shape[1:]))

    def block(bounds):
        lo, hi = bounds
        out[lo:hi] = A[lo:hi] @ B

    with one_blas_thread():
        ordered_map(block, row_blocks(0, A.shape[0], PRODUCT_ROWS))
    return out
