"""Nystroem features of a combined kernel on landmark rows, evaluated in fixed row blocks; the adaptive rank."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import scipy.linalg

from mwumkl_dist.core.partition import row_blocks
from mwumkl_dist.devices.threads import one_blas_thread, ordered_map
from mwumkl_dist.kernels.evaluation import as_csr, combined_kernel, kernel_diagonal
from mwumkl_dist.kernels.specs import KernelSet

__all__ = [
    "WEIGHT_POINTS",
    "N_COMPONENTS",
    "COLUMN_MEMORY",
    "RANK_MAX",
    "RESIDUAL_TOL",
    "RESIDUAL_POINTS",
    "PRUNE",
    "Basis",
    "NystroemMap",
    "nystroem_map",
    "nystroem_residual",
    "landmark_order",
    "landmark_rows",
    "rank_budget",
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
#: ... and doubles (nested landmarks) while the Nystroem residual is above :data:`RESIDUAL_TOL`, within a budget
#: (:func:`rank_budget`): the kernel columns of every row on the landmarks, in single precision, within
#: ``COLUMN_MEMORY`` bytes, and at most ``RANK_MAX`` landmarks (the linear solve's ``r x r`` matrices, ``8 r^2``
#: bytes each, ``r^3 / 3`` operations per factorisation: 0.8 s at 4096 on one core of the development box).
#: The budget replaces a cap of ``8 sqrt(n)`` and 1400 landmarks, which stopped a9a at a residual of 0.20 and
#: cod-rna at 0.05.  Both are constants, not the machine's free memory: the rank, hence the model, must not
#: depend on where the fit runs (the shards keep the columns in memory, spill them or compute them again
#: within their own memory; see :class:`~mwumkl_dist.solvers.two_stage.shards.LinearShard`).
COLUMN_MEMORY = 2 * 2**30
RANK_MAX = 4096
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


def rank_budget(n_samples: int, column_bytes: int = 4) -> int:
    """The most landmarks the adaptive rank takes on ``n_samples`` rows (see :data:`COLUMN_MEMORY`).

    ``COLUMN_MEMORY / (column_bytes n)`` landmarks, at most :data:`RANK_MAX` and ``n``, and never fewer
    than :data:`N_COMPONENTS` (the start: larger data compute their columns again at each pass).
    """
    n = int(n_samples)
    return int(min(n, RANK_MAX, max(N_COMPONENTS, COLUMN_MEMORY // (int(column_bytes) * max(n, 1)))))


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

    def features(self, columns, out=None, wide=None) -> np.ndarray:
        """The features of stored ``columns`` (rows x at least ``width``).  ``out``: written there (rows x rank,
        double); ``wide``: a double array of rows x ``width`` the columns are widened in (with ``out``: no
        temporary of the rows' size)."""
        block = columns[:, : self.width]
        if out is None:
            return np.asarray(block, dtype=np.float64) if self.projection is None else block @ self.projection
        if self.projection is None:
            np.copyto(out, block)
            return out
        if wide is not None and block.dtype != np.float64:
            np.copyto(wide, block)
            block = wide
        return np.matmul(block, self.projection, out=out)

    def lift(self, coef) -> np.ndarray:
        """The vector on the stored columns whose product with them is the features' times ``coef``."""
        coef = np.asarray(coef, dtype=np.float64)
        return coef if self.projection is None else self.projection @ coef


@dataclass
class NystroemMap:
    """Nystroem features ``phi(x) = K(x, L) M`` of the combined kernel ``K = sum_i weights[i] K_i``.

    ``M`` (:attr:`projection`) and the factor ``G`` (:attr:`factor`) come from a pivoted Cholesky
    factorisation of ``K(L, L)`` (:func:`nystroem_map`): ``K(L, L) ~ G G'`` and ``M' G = I``, so the
    features of the landmarks themselves are the rows of ``G`` and ``phi(x)' phi(z)`` is the
    Nystroem approximation of ``K(x, z)`` on the pivot landmarks.  A linear-stage shard stores the
    kernel columns ``K(x, L)`` (:meth:`columns`) and applies ``M`` (its :attr:`basis`) as it goes:
    the features of a smaller map on the first landmarks (:func:`landmark_order`) are those
    columns' first ones times that map's ``M``.
    """

    kernel_set: KernelSet
    landmarks: object  # (n_landmarks, n_features) ndarray or CSR
    weights: np.ndarray  # (n_kernels,)
    projection: np.ndarray  # (n_landmarks, rank): M, zero on the landmarks that are not pivots
    factor: np.ndarray | None = None  # (n_landmarks, rank): G, the landmarks' own features

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

        ``w = M' K(L, L) beta = G' beta`` (``M' K(L, L) M = I``): a smaller
        map's model, ``beta`` padded with zeros on the new landmarks, as a
        starting point of this map's solve.
        """
        if self.factor is None:
            raise ValueError("this Nystroem map does not keep the factor of K(L, L)")
        beta = np.asarray(beta, dtype=np.float64)
        padded = np.zeros(self.n_columns)
        padded[: len(beta)] = beta
        return self.factor.T @ padded


#: The pivoted Cholesky factorisation of ``K(L, L)`` stops where the largest remaining diagonal (the
#: Nystroem error at a landmark) is below this fraction of the trace of ``K(L, L)`` (a bound of its largest
#: eigenvalue): landmarks the others already reproduce to that precision add no feature.  The features
#: divide by the pivots, and the Newton solve projects Gram matrices of the kernel columns through the map:
#: a rounding error of the columns grows by the norm of ``M``.  Relative to the largest diagonal instead, a
#: smooth combination (wide Gaussians on 4 features, 1400 landmarks) kept 201 features with ``|M| = 1.0e5``
#: and made the Newton Hessian indefinite; relative to the trace it keeps about what an eigendecomposition
#: keeps above ``1e-9`` of the largest eigenvalue (100 features, ``|M| = 880``), as the maps before did.
RCOND = 1e-9


def nystroem_map(kernel_set: KernelSet, landmarks, weights, rcond: float = RCOND) -> NystroemMap:
    """The Nystroem map of ``sum_i weights[i] K_i`` on ``landmarks`` (a pivoted Cholesky factorisation).

    ``K(L, L) P = ...``: LAPACK's ``dpstrf`` picks, step by step, the landmark the others reproduce
    worst, and stops when every remaining one is reproduced to ``rcond`` times the largest diagonal
    (:data:`RCOND`; a rank-deficient or very smooth combination, e.g. a linear kernel on few features,
    repeated landmarks, wide Gaussians, keeps fewer features than landmarks).  ``r^3 / 3`` operations,
    about a twentieth of an eigendecomposition's, so large ranks cost little here.
    """
    weights = np.asarray(weights, dtype=np.float64)
    K = combined_kernel(kernel_set, landmarks, landmarks, weights)
    K = 0.5 * (K + K.T)
    trace = float(np.sum(np.diagonal(K))) if K.size else 0.0
    if not trace > 0:
        raise ValueError("the combined kernel is zero on the landmarks")
    c, piv, rank, info = scipy.linalg.lapack.dpstrf(K, lower=1, tol=rcond * trace)
    if info < 0:  # pragma: no cover - an argument LAPACK rejects
        raise ValueError(f"pivoted Cholesky factorisation failed (dpstrf info {info})")
    pivots = piv[:rank] - 1  # LAPACK's pivots count from 1
    L11 = np.tril(c[:rank, :rank])
    factor = np.zeros((K.shape[0], rank))
    factor[piv - 1] = np.tril(c)[:, :rank]
    projection = np.zeros((K.shape[0], rank))
    projection[pivots] = scipy.linalg.solve_triangular(L11, np.eye(rank), lower=True, check_finite=False).T
    return NystroemMap(kernel_set, landmarks, weights, projection, factor)


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
