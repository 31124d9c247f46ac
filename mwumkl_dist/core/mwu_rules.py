"""The MWUMKL update rules and the final model, written once for every engine.

Notation follows the paper (Moeller et al., AISTATS 2014, section 3): ``G_i = Y K_i Y / r_i + I / C`` (with
sample or class weights ``I / C`` becomes ``diag(1 / C_j)``), the
accumulated dual ``alpha`` (counts: +1/2 per pick), ``V_i = G_i alpha``,
``s_i = alpha' G_i alpha`` and the score vector ``g``.  Everything here acts on
arrays of length ``m`` (kernels) or on the engines' small messages
(:class:`Candidate`); engines own the ``O(m n)`` state and only move data.

One iteration, as :func:`mwumkl_dist.solvers.mwu.iterate.solve` runs it::

    (iP, iN) = argmax of g per class           # Find-alpha: reduce_candidates
    s += V[iP] + V[iN] + (G[iP,iP] + G[iN,iN] + 2 G[iP,iN]) / 4   # update_s
    V += (G[:, iP] + G[:, iN]) / 2             # engine.superstep (with the next g)
    p12, coef = exponentiate(s)                # Exponentiate-M; g = V @ coef

The rules on ``m``-vectors are written once, elementwise (:func:`gram_block`,
:func:`update_s`, :func:`margins`, :func:`exponent_weights`, and on scalars
:func:`exponents`), with the operations named in :data:`ELEMENTWISE`.  Here
those are numpy's and the rules act on whole arrays (:class:`HostRules`);
:mod:`mwumkl_dist.data.cuda.kernels` compiles the same functions for a GPU,
with device functions of those names, one kernel per thread, so that the rules
run where ``V`` lives (``mwumkl_dist.data.cuda.DeviceRules``).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from mwumkl_dist.core.exact import exact_to_float
from mwumkl_dist.core.progress import ProgressInfo  # the callback's message, re-exported here

__all__ = [
    "QUASH_THRESHOLD",
    "FitInterrupted",
    "ConvergenceWarning",
    "FewIterationsWarning",
    "MajorityClassWarning",
    "Candidate",
    "eps_prime",
    "iteration_count",
    "gram_block",
    "check_ridge",
    "ridge_at",
    "ridge_rows",
    "update_s",
    "margins",
    "Exponentiated",
    "exact_selectivity",
    "exponents",
    "exponent_scale",
    "exponent_weights",
    "exponentiate",
    "non_finite_scores",
    "HostRules",
    "kernel_weights",
    "best_of",
    "reduce_candidates",
    "bias_and_scale",
    "training_scores",
    "training_errors",
    "guarded_bias",
    "class_totals",
    "ProgressInfo",
    "MWUResult",
    "SolverState",
]

#: Above this largest exponent the paper switches to the quashed form.
QUASH_THRESHOLD = 20.0

# The elementwise operations of the m-vector rules: numpy's, so that the rules act on whole arrays here.
# The GPU's forms of the rules bind device functions of these names instead (ELEMENTWISE lists them).
#: ``a * b``.  The rules write with it every product that feeds a sum: the GPU's ``product`` is a multiply
#: that is never fused with the sum (FMA), so both forms round every operation as numpy does.
product = np.multiply
sqrt = np.sqrt
maximum = np.maximum  # a NaN wins, as in np.max
exp = np.exp
sinh = np.sinh
where = np.where
#: The names the rules' device forms rebind (see the module docstring).
ELEMENTWISE = ("product", "sqrt", "maximum", "exp", "sinh", "where")


class FitInterrupted(RuntimeError):
    """A one-vs-rest fit stopped (Ctrl-C or callback) before every class was fitted."""


class ConvergenceWarning(UserWarning):
    """The solver ended in a degenerate state (e.g. overlapping hulls with C = inf)."""


class FewIterationsWarning(UserWarning):
    """The given ``epsilon`` or ``max_iter`` gives far too few iterations for an unpolished fit."""


class MajorityClassWarning(UserWarning):
    """The fitted model's cross-validated (or training) error is no better than predicting the majority class."""


@dataclass
class Candidate:
    """A shard's best row of one class: what the driver needs to pick and use it.

    ``index`` is the global row index (``-1``: the shard has no row of the
    class), ``g`` its score, ``v_row`` its ``V[index, :]`` (one value per
    kernel) and ``point`` what the next superstep needs to compute the row's
    kernel column (its feature vector, or its index for precomputed kernels).
    """

    index: int
    g: float
    v_row: np.ndarray | None = None
    point: object = None


def eps_prime(epsilon: float, rho: float) -> float:
    """``eps' = -ln(1 - eps / (2 rho))``; needs ``0 < eps < 2 rho``."""
    if not (0.0 < epsilon < 2.0 * rho):
        raise ValueError(f"epsilon must lie in (0, 2*rho) = (0, {2.0 * rho:g}), got {epsilon!r}")
    return -math.log1p(-epsilon / (2.0 * rho))


def iteration_count(epsilon: float, rho: float, n: int) -> int:
    """``T = ceil(8 rho^2 / eps^2 * ln n)`` (at least 1)."""
    return max(1, math.ceil(8.0 * rho * rho / (epsilon * epsilon) * math.log(n)))


def gram_block(k_pp, k_nn, k_pn, inv_trace, ridge, ridge_neg=None):
    """``G_i[P,P]``, ``G_i[N,N]``, ``G_i[P,N]`` from raw kernel values (labels +1 and -1).

    ``ridge`` is the diagonal term at ``P`` and ``ridge_neg`` the one at ``N``
    (the same as at ``P`` when None: one ridge for every point).
    """
    ridge_neg = ridge if ridge_neg is None else ridge_neg
    return product(k_pp, inv_trace) + ridge, product(k_nn, inv_trace) + ridge_neg, -k_pn * inv_trace


def check_ridge(ridge, n_samples: int):
    """``ridge`` as the solver takes it: a float (every point), or an ``(n_samples,)`` float64 array.

    The per-point ridge ``D = diag(ridge_j)`` of ``G_i = Y K_i Y / r_i + D``
    is ``1 / C_j`` with a per-point ``C_j`` (sample and class weights); every
    entry must be finite and non-negative.
    """
    if np.ndim(ridge) == 0:
        value = float(ridge)
        if not (np.isfinite(value) and value >= 0.0):
            raise ValueError(f"ridge must be finite and non-negative, got {ridge!r}")
        return value
    arr = np.ascontiguousarray(ridge, dtype=np.float64)
    if arr.shape != (n_samples,):
        raise ValueError(f"a per-point ridge must have shape ({n_samples},), got {arr.shape}")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0.0):
        raise ValueError("a per-point ridge must be finite and non-negative everywhere")
    return arr


def ridge_at(ridge, index: int) -> float:
    """The ridge of global row ``index`` (``ridge`` from :func:`check_ridge`)."""
    return ridge if isinstance(ridge, float) else float(ridge[index])


def ridge_rows(ridge, start: int, stop: int):
    """The ridge of rows ``[start, stop)``, as a shard's ``configure`` takes it (a float stays a float)."""
    return ridge if np.ndim(ridge) == 0 else np.ascontiguousarray(ridge[start:stop], dtype=np.float64)


def update_s(s, v_pos, v_neg, g_pp, g_nn, g_pn):
    """Step 2: ``s_i += V_i[P] + V_i[N] + (G_i[P,P] + G_i[N,N] + 2 G_i[P,N]) / 4`` (V before step 3)."""
    return s + (v_pos + v_neg) + product(g_pp + g_nn + product(2.0, g_pn), 0.25)  # x * 0.25 rounds as x / 4


def margins(s):
    """``u_i = sqrt(s_i)``, a ``s_i`` below 0 (rounding) taken as 0."""
    return sqrt(maximum(s, 0.0))


@dataclass
class Exponentiated:
    """Exponentiate-M output: ``p12`` per kernel, ``u = sqrt(s)`` and ``coef`` with ``g = V @ coef``."""

    p12: np.ndarray
    u: np.ndarray
    coef: np.ndarray
    quashed: bool
    scale: float = 0.0  # c in x_i = c u_i


def exact_selectivity(epsilon: float, n_kernels: int) -> float:
    """The selectivity that solves the MKL problem itself to relative precision ``epsilon``.

    A soft maximum ``(1/beta) log sum_i exp(beta r_i)`` of the relative margins ``r_i = u_i / max u``
    is within ``ln(m) / beta`` of the maximum; ``beta = 10 ln(m) / epsilon`` puts that far inside
    ``epsilon``, so the weights approach the optimum's (the problem's dual) and not a smoothed version
    of it: on small problems (n = 120, m = 30, tests/test_exact_mkl.py) the objective is within 1 %
    of the exact optimum at epsilon = 0.1, and the weights within 0.06 in L1 at 0.05.
    """
    return 10.0 * math.log(max(int(n_kernels), 2)) / float(epsilon)


def exponent_scale(u: np.ndarray, eps_p: float, rho: float, selectivity: float | None) -> float:
    """``c`` in the exponents ``x_i = c u_i`` of Exponentiate-M.

    ``selectivity=None`` is the paper's ``c = eps' / (2 rho)``: an absolute scale, while after trace
    normalisation ``u_i / t = sqrt(alpha' G_i alpha)`` is ``O(1 / sqrt(n))``, so the ``x_i`` stay
    ``O(ln n / sqrt(n))`` apart and the weights stay uniform.  Otherwise
    ``c = selectivity / max_i u_i``: the exponents are the margins relative to the largest one,
    ``x_i = beta u_i / max u`` in ``[0, beta]``, whatever the data's scale (the running maximum is the
    solver's own estimate of the optimum).  ``beta = 0`` gives uniform weights; large ``beta`` the
    sparse weights of the exact MKL optimum (see :func:`exact_selectivity`).
    """
    return exponents(_largest(u), eps_p, rho, selectivity)[0]


def _largest(u: np.ndarray) -> float:
    return float(u.max()) if u.size else 0.0  # a NaN wins


def exponents(top, eps_p, rho, selectivity):
    """``(c, q, quashed)`` from the largest margin ``top = max_i u_i``.

    ``c`` as :func:`exponent_scale` says; ``q = c top`` is the largest exponent ``max_i c u_i``, as
    rounding is monotone and ``c >= 0`` (an infinite ``c``, from a selectivity near the largest
    double, gives a non-finite ``coef`` either way); ``quashed``: ``q >= 20``.
    """
    if selectivity is None:
        c = eps_p / (2.0 * rho)
    else:
        c = float(selectivity) / top if top > 0.0 else 0.0
    q = product(c, top)
    return c, q, q >= QUASH_THRESHOLD


def exponent_weights(u, c, q, quashed):
    """``(p12_i, coef_i)`` from the margin ``u_i`` and :func:`exponents`' ``(c, q, quashed)``.

    ``p12_i = -sinh(c u_i)``, or ``-exp(c u_i - q)`` when quashed; ``coef_i = 2 p12_i / u_i``, and 0
    where ``u_i = 0``: such a kernel has ``V_i = G_i alpha = 0`` (``G_i`` is PSD) and adds nothing to ``g``.
    """
    if c == 0.0:  # selectivity 0: sinh(c u) / c -> u, the uniform weights' direction (sinh(0) = 0 would stall)
        p12 = -u
    elif quashed:
        p12 = -exp(product(c, u) - q)
    else:
        p12 = -sinh(product(c, u))
    positive = u > 0.0
    return p12, where(positive, 2.0 * p12 / where(positive, u, 1.0), 0.0)


def exponentiate(s, eps_p: float, rho: float, selectivity: float | None = None) -> Exponentiated:
    """Exponentiate-M (paper, Algorithm 2) without the normaliser ``S``.

    ``x_i = c sqrt(s_i)`` with ``c`` from :func:`exponent_scale`; ``p12_i = -sinh(x_i)``, or
    ``-exp(x_i - max x)`` once ``max x >= 20`` (quashing): :func:`exponent_weights`.  ``S`` scales
    ``g`` and the weights uniformly, so argmax and ratios do not need it.
    """
    u = margins(np.asarray(s, dtype=np.float64))
    c, q, quashed = exponents(_largest(u), eps_p, rho, selectivity)
    p12, coef = exponent_weights(u, c, q, quashed)
    return Exponentiated(p12, u, coef, bool(quashed), c)


def non_finite_scores(iteration: int, s) -> FloatingPointError:
    """The error of an iteration whose ``coef`` is not finite (``s`` the values that gave it)."""
    return FloatingPointError(f"non-finite scores at iteration {iteration}: the kernels overflow (s = {s})")


class HostRules:
    """The rules' ``m``-vectors in host memory (numpy): ``s``, and one iteration's ``s`` update and ``coef``.

    What :func:`mwumkl_dist.solvers.mwu.iterate.solve` drives, through :meth:`Engine.rules
    <mwumkl_dist.engines.base.Engine.rules>`; ``mwumkl_dist.data.cuda.DeviceRules`` is the same
    on a GPU.

    Parameters
    ----------
    s : ndarray of shape (m,)
        ``alpha' G_i alpha`` (in counts) so far.
    kernel_block : callable
        ``kernel_block(pos, neg) -> (K(p, p), K(q, q), K(p, q))``, raw, one value per kernel (the engine's).
    inv_trace : ndarray of shape (m,)
        ``1 / r_i``.
    ridge : float or ndarray of shape (n,)
        ``1 / C``, or one per point (:func:`check_ridge`).
    eps_p, rho : float
        ``eps'`` (:func:`eps_prime`) and the width.
    selectivity : float or None
        The exponents' scale (:func:`exponent_scale`); None: the paper's.
    """

    def __init__(self, s, kernel_block, *, inv_trace, ridge, eps_p: float, rho: float, selectivity=None):
        self.s = np.array(s, dtype=np.float64)
        self._kernel_block = kernel_block
        self.inv_trace, self.ridge = inv_trace, ridge
        self.eps_p, self.rho, self.selectivity = eps_p, rho, selectivity
        self._next = self.s

    def step(self, pos: Candidate, neg: Candidate, iteration: int) -> np.ndarray:
        """``coef`` of the iteration that picks ``pos`` and ``neg`` (``s`` updated by :meth:`commit`).

        Raises :func:`non_finite_scores` when ``coef`` is not finite.
        """
        k_pp, k_nn, k_pn = self._kernel_block(pos, neg)
        block = gram_block(k_pp, k_nn, k_pn, self.inv_trace, ridge_at(self.ridge, pos.index),
                           ridge_at(self.ridge, neg.index))  # fmt: skip
        self._next = update_s(self.s, pos.v_row, neg.v_row, *block)
        coef = exponentiate(self._next, self.eps_p, self.rho, self.selectivity).coef
        if not np.all(np.isfinite(coef)):
            raise non_finite_scores(iteration, self._next)
        return coef

    def commit(self, iteration: int) -> None:
        """After the iteration's superstep: its ``s`` becomes the current one."""
        self.s = self._next

    def host_s(self) -> np.ndarray:
        """``s`` as a host array."""
        return self.s


def kernel_weights(ex: Exponentiated) -> np.ndarray:
    """``mu_i`` proportional to ``|p12_i| / u_i``, normalised to sum to 1.

    For ``u_i = 0`` the limit ``sinh(c u) / u -> c`` is used (``c = ex.scale``; 1 for ``c = 0``,
    where ``p12 = -u``); in the quashed regime such a kernel underflows to weight 0.
    """
    c = ex.scale if ex.scale > 0.0 else 1.0
    w = np.empty_like(ex.u)
    pos = ex.u > 0.0
    w[pos] = np.abs(ex.p12[pos]) / ex.u[pos]
    w[~pos] = 0.0 if ex.quashed else c
    total = w.sum()
    if not (np.isfinite(total) and total > 0.0):
        # Nothing distinguishes the kernels (e.g. no iteration ran): uniform.
        return np.full_like(w, 1.0 / len(w))
    return w / total


def best_of(candidates: Sequence[Candidate]) -> int:
    """The position of the global argmax of ``g`` among shard candidates: highest ``g``, ties to the lowest index.

    Candidates of index ``-1`` (a shard without a row of the class) are skipped; ``ValueError``
    when all are.
    """
    best = None
    for k, c in enumerate(candidates):
        if c.index < 0:
            continue
        if best is None or c.g > candidates[best].g or (c.g == candidates[best].g and c.index < candidates[best].index):
            best = k
    if best is None:
        raise ValueError("no shard holds a training point of one of the classes")
    return best


def reduce_candidates(candidates: Sequence[Candidate]) -> Candidate:
    """The global argmax of ``g`` over shard candidates (see :func:`best_of`)."""
    return candidates[best_of(candidates)]


def bias_and_scale(pos_sum: float, neg_sum: float) -> tuple[float, float]:
    """The authors' bias: ``b = (N - P) / (P + N)``, and the factor ``1 / (P + N)`` for alpha.

    ``P = sum_{y_j > 0} alpha_j h_j`` and ``N`` likewise, with ``h = sum_i mu_i V_i``:
    the hyperplane scaled to give +1 / -1 at the two closest hull points.
    Any common positive scale of ``P`` and ``N`` gives the same ``b``.
    """
    total = pos_sum + neg_sum
    if not (np.isfinite(total) and total > 1e-300):
        warnings.warn(
            "the class hulls are not separated in the learned kernel (P + N <= 0); "
            "the bias is set to 0: use a finite C (soft margin)",
            ConvergenceWarning,
            stacklevel=3,
        )
        return 0.0, 1.0
    return (neg_sum - pos_sum) / total, 1.0 / total


def training_scores(h, counts, ridge, y_pm, factor: float) -> np.ndarray:
    """The final model's decision values without bias at training rows, from their margins in ``V``.

    With the alpha counts ``a`` (``V_i = G_i a``, ``G_i = Y K_i Y / r_i + diag(ridge)``) and
    ``sum_i mu_i = 1``, a row's margin is ``h_j = sum_i mu_i V_i[j] = y_j sum_l a_l y_l sum_i (mu_i / r_i)
    K_i(x_j, x_l) + ridge_j a_j``.  The model's dual coefficients are ``a_l y_l factor`` (``factor = scale / T``,
    :func:`bias_and_scale`), so its decision value without bias is ``factor y_j (h_j - ridge_j a_j)``: the
    predictor's sum over the support vectors, read off ``V`` (equal to rounding; ``V`` is summed in another order).

    Parameters
    ----------
    h : ndarray of shape (n_rows,)
        The rows' margins ``sum_i mu_i V_i[j]`` (in counts, as ``V`` holds them).
    counts : ndarray of shape (n_rows,)
        The rows' alpha counts ``a_j``.
    ridge : float or ndarray of shape (n_rows,)
        The rows' ridges (the diagonal of ``G_i``).
    y_pm : ndarray of shape (n_rows,)
        The rows' labels, +1 or -1.
    factor : float
        ``scale / T``: the final dual coefficients are ``a_j y_j factor``.

    Returns
    -------
    ndarray of shape (n_rows,)
    """
    h = np.asarray(h, dtype=np.float64)
    return factor * np.asarray(y_pm, dtype=np.float64) * (h - ridge * np.asarray(counts, dtype=np.float64))


def training_errors(scores, y_pm, weights=None) -> tuple[np.ndarray, np.ndarray]:
    """``(b, err)``: the weighted training error ``err[k]`` of ``sign(scores + b[k])`` for every distinct split.

    The candidate biases put the threshold between each pair of adjacent
    distinct scores, below all of them (every point positive) and above all
    (every point negative); ``err`` is the weighted fraction misclassified.
    """
    scores = np.asarray(scores, dtype=np.float64)
    y_pm = np.asarray(y_pm, dtype=np.float64)
    w = np.ones(len(scores)) if weights is None else np.asarray(weights, dtype=np.float64)
    order = np.argsort(scores, kind="stable")
    s, pos, neg = scores[order], np.where(y_pm[order] > 0, w[order], 0.0), np.where(y_pm[order] > 0, 0.0, w[order])
    last = np.flatnonzero(np.r_[s[1:] != s[:-1], True])  # the last point of each run of equal scores
    # Threshold after run k: points up to it negative, the rest positive.
    pos_below = np.r_[0.0, np.cumsum(pos)[last]]
    neg_above = neg.sum() - np.r_[0.0, np.cumsum(neg)[last]]
    edges = s[last]
    cuts = np.r_[edges[0] - 1.0, 0.5 * (edges[:-1] + edges[1:]), edges[-1] + 1.0] if len(s) else np.zeros(1)
    return -cuts, (pos_below + neg_above) / max(w.sum(), 1e-300)


def guarded_bias(
    scores, y_pm, bias: float, weights=None, *, against_best: bool = True, slack: float = 0.01
) -> tuple[float, float, float, float]:
    """The MWU bias, or the training-error-minimising one where the MWU bias is clearly worse.

    ``scores`` are the decision values without bias on training points.  The
    bias is replaced when its weighted error exceeds the majority class's (the
    all-positive or all-negative classifier), or (``against_best``) the best
    bias's by more than ``slack`` and two standard errors of its error on
    these points (the best bias is chosen on them, so a small gap is noise):
    few iterations (a large ``epsilon``) leave the authors' bias far off on
    noisy data.  Returns ``(bias, its error, the MWU bias's error, the
    majority class's error)``.
    """
    b, err = training_errors(scores, y_pm, weights)
    scores = np.asarray(scores, dtype=np.float64)
    w = np.ones(len(scores)) if weights is None else np.asarray(weights, dtype=np.float64)
    wrong = (scores + bias > 0) != (np.asarray(y_pm) > 0)  # a zero score predicts the negative class
    own = float(w[wrong].sum() / max(w.sum(), 1e-300))
    majority = float(min(err[0], err[-1]))
    best = int(np.argmin(err))
    margin = max(slack, 2.0 * math.sqrt(own * (1.0 - own) / max(len(scores), 1)))
    if own > majority or (against_best and own > err[best] + margin):
        ties = np.flatnonzero(err == err[best])
        pick = ties[np.argmin(np.abs(b[ties] - bias))]  # among equally good biases, the nearest to the MWU's
        return float(b[pick]), float(err[pick]), own, majority
    return float(bias), own, own, majority


def class_totals(parts, y: np.ndarray) -> tuple[float, float]:
    """``(P, N)`` from the blocks' :meth:`support_margins`: the sums of ``alpha_j h_j`` per class.

    ``h_j = V_j . mu`` arrives as exact integer parts per kernel block; they are
    added exactly, rounded once, and summed in global row order, so the bias
    does not depend on the sharding.
    """
    exact: dict[int, int] = {}
    alpha: dict[int, float] = {}
    for idx, counts, h_parts in parts:
        for j, a, h in zip(idx.tolist(), counts.tolist(), h_parts):
            exact[j] = exact.get(j, 0) + h
            alpha[j] = a
    margins = np.zeros(len(y))
    if exact:
        rows = np.fromiter(exact, dtype=np.int64, count=len(exact))
        margins[rows] = np.fromiter((alpha[j] for j in exact), float, len(exact)) * exact_to_float(exact.values())
    return float(margins[y > 0].sum()), float(margins[y < 0].sum())


@dataclass
class MWUResult:
    """A solved binary problem.

    ``alpha`` is the final dual (``alpha / T`` scaled by ``1 / (P + N)``),
    ``kernel_weights`` the ``mu_i`` on the trace-normalised kernels (sum 1),
    ``bias`` the intercept, ``s`` the final ``alpha' G_i alpha`` in counts.
    ``scores`` are the model's decision values without bias at the training rows ``scored_rows``
    (:func:`training_scores`), where the solve was asked for them (else None).
    """

    alpha: np.ndarray
    kernel_weights: np.ndarray
    bias: float
    n_iter: int
    s: np.ndarray
    interrupted: bool = False
    scored_rows: np.ndarray | None = field(default=None, repr=False)
    scores: np.ndarray | None = field(default=None, repr=False)


@dataclass
class SolverState:
    """Everything the driver needs to continue a fit (the engine can rebuild V from alpha).

    ``s`` and the candidates' ``v_row`` are where the rules keep them (:meth:`Engine.rules
    <mwumkl_dist.engines.base.Engine.rules>`): host arrays, or with the rules on a GPU that GPU's
    arrays, which ``np.asarray`` copies to the host and which later iterations overwrite.
    """

    iteration: int
    s: np.ndarray
    pos: Candidate
    neg: Candidate
    picks: list = field(default_factory=list)  # (iP, iN) of every iteration so far, in order
