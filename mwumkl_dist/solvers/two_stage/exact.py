"""The exact 2-norm SVM on all rows with the learned kernel, where its Gram matrix is affordable.

The two-stage fit's linear stage approximates the learned kernel by Nystroem features; where their
residual stays above its target the approximation costs accuracy (an 8,291-row held-out set: the
two-stage fit 4.88 % test error, the same kernel solved exactly 2.93 %).  Where the ``n x n`` Gram
matrix fits :data:`EXACT_MEMORY` the fit solves the SVM exactly instead, as the MWU fit's polish does
(LIBSVM on ``K + D``): :func:`exact_gram` computes the combined kernel in fixed blocks of rows (one
``n x n`` array, no second copy), :func:`solve_exact` solves on it, optionally leaving rows out (the
held-out rows of the final-size check of ``C``) by giving them a ridge so large that their dual
variables vanish, and restoring the diagonal after (the same matrix serves every candidate).
"""

from __future__ import annotations

import numpy as np

from mwumkl_dist.core.partition import row_blocks
from mwumkl_dist.devices.threads import ordered_map
from mwumkl_dist.kernels.evaluation import as_csr, combined_kernel

__all__ = ["EXACT_MEMORY", "EXACT_POINTS", "exact_affordable", "exact_gram", "solve_exact"]

#: The exact solve's budget: its Gram matrix, ``8 n^2`` bytes, within this many (16,384 rows) ...
EXACT_MEMORY = 2 * 2**30
#: ... and at most this many rows (LIBSVM's time grows as ``n^2`` to ``n^3``; see :func:`exact_affordable`).
EXACT_POINTS = 16384
#: Rows per block of the Gram matrix's computation (fixed: its bits do not depend on the thread count).
GRAM_ROWS = 512
#: The ridge of a row left out of a solve, relative to the kernel's unit mean diagonal: its dual variable
#: falls below ``1 / LEFT_OUT_RIDGE`` of a regular one's.
LEFT_OUT_RIDGE = 1e9


def exact_affordable(n_samples: int) -> bool:
    """Whether the exact solve's Gram matrix of ``n_samples`` rows fits :data:`EXACT_MEMORY` (:data:`EXACT_POINTS`)."""
    n = int(n_samples)
    return n <= EXACT_POINTS and 8 * n * n <= EXACT_MEMORY


def exact_gram(kernel_set, X, weights, step=None) -> np.ndarray:
    """``sum_i weights[i] K_i(X, X)``, ``(n, n)``, computed in fixed blocks of :data:`GRAM_ROWS` rows over the threads.

    Entries are independent of the blocking: the same bits for any thread count.  ``step``: a progress
    phase advanced by each block's rows.
    """
    X = as_csr(X)
    n = X.shape[0]
    out = np.empty((n, n))

    def block(bounds):
        lo, hi = bounds
        out[lo:hi] = combined_kernel(kernel_set, X[lo:hi], X, weights)
        if step is not None:
            step.advance(hi - lo)

    ordered_map(block, row_blocks(0, n, GRAM_ROWS))
    return out


def solve_exact(K, y_pm, ridge, left_out=None) -> tuple[np.ndarray, float]:
    """The 2-norm soft-margin SVM on Gram matrix ``K`` (unit mean diagonal): ``(alpha, b)`` as
    :func:`~mwumkl_dist.solvers.mwu.polish.solve_l2_svm` returns them.

    LIBSVM's hard-margin SVM on ``K + D``, ``D = diag(ridge)`` (``1 / (C c_j)``), with ``K``'s
    diagonal changed in place and restored after (no copy of ``K``).  ``left_out``: a boolean mask of
    rows the solve leaves out (their ridge :data:`LEFT_OUT_RIDGE`: their ``alpha`` is about zero and their
    constraints are inactive; their decision values are ``K[left_out] @ (alpha y) + b``).
    """
    from sklearn.svm import SVC

    n = K.shape[0]
    y_pm = np.asarray(y_pm, dtype=np.float64)
    ridge = np.broadcast_to(np.asarray(ridge, dtype=np.float64), (n,)).copy()
    if left_out is not None:
        ridge[np.asarray(left_out, dtype=bool)] = LEFT_OUT_RIDGE
    diagonal = np.diagonal(K).copy()
    K[np.diag_indices(n)] += ridge
    try:
        # C far above any dual value: the hard margin on K + D, i.e. the 2-norm soft margin on K.
        svc = SVC(kernel="precomputed", C=1e12, tol=1e-4, cache_size=200).fit(K, y_pm)
    finally:
        K[np.diag_indices(n)] = diagonal
    alpha = np.zeros(n)
    alpha[svc.support_] = np.abs(svc.dual_coef_[0])
    if left_out is not None:
        alpha[np.asarray(left_out, dtype=bool)] = 0.0
    return alpha, float(svc.intercept_[0])
