"""The structure search of ``kernels="auto"``: which features carry the signal, whatever the shape of their effect.

The scaled family on all features combined with uniform weights is a good kernel where every feature
matters and a poor one where the signal lives in a few features or in their interactions (a 3-way
parity, a checkerboard on two features among 30: chance).  The search learns which features matter and
at what scale, and offers a model on them; cross-validation decides:

1. *Relevance* (:func:`ard_relevance`): a Gaussian with one width per feature (automatic relevance
   determination) ``exp(-sum_f w_f (x_f - z_f)^2 / s_f^2)`` (``s_f``: the feature's spread) fitted on at
   most :data:`ARD_POINTS` rows by L-BFGS on its alignment with the labels (:func:`alignment`).  A joint
   kernel sees an interaction as well as an additive effect: pairs of rows close in the other relevant
   features and far apart in one of them disagree more often than the noise features' pairs, whatever
   the interaction's order.  ``w_f`` is the feature's relevance (near 0: noise).  Then the same fit on
   the leave-one-out residuals of kernel ridge regression on that kernel adds the features of what it
   leaves (a weaker additive term beside a strong interaction), and a pair whose quantile table shows a
   clear interaction (:func:`strongest_pair`) stays relevant.  Cost: two or three ``n x n x d`` matrix
   products per step, linear in ``d`` (and one ``(6 d)^2 n`` product for the pair table, up to
   :data:`PAIR_MAX_FEATURES` features).
2. *Candidates* (:func:`structure_rungs`): the *relevant* features (relevance at least
   :data:`RELEVANT_SHARE` of the largest), and for ``k`` in a ladder (1, 2, 4, ... fewer than the
   features) the ``k`` most relevant ones; each gets a joint band of Gaussians (three widths around the
   width the fit learned for them, :func:`structured_kernels`) with uniform weights (selectivity 0).  Two
   more: the relevant and the residual stage's features, with a band of their own on each stage's features
   beside the joint band (an additive model of what the first fit found and what it left), and the relevant
   features' additive model, one band per feature at its own learned width (each kernel reads one feature:
   features in different units do not drown each other, as they do in a band of one width).
3. *Choice*: :func:`mwumkl_dist.solvers.auto.choose_C` scores every rung by the same 3-fold
   cross-validation as the other candidates, each fold fitting the relevance on its own training rows
   (so the search never sees the rows it is judged on); the best rung replaces the all-features
   candidates only when it is better than the best of them by more than the standard error of their
   paired difference.  Where no feature subset stands out (every feature matters) the family stays.  The
   chosen rung is scored again with every width one octave wider (then two), kept while its error is no
   higher (:data:`MAX_WIDEN`): the alignment's optimum is narrower than the classifier's, and a
   narrow band on several features needs many Nystroem landmarks at scale (the two-stage fit's rank is capped).

Why the alignment leaves out the diagonal: with it, a kernel narrow enough to be the identity has the
centred alignment ``1 / sqrt(n)``, more than a kernel on a 3-way parity's features before it has found
them, and L-BFGS walks there (the zoo's parity3 and checker, 800 rows: a diagonal kernel, relevance on
noise features).  Off the diagonal the identity has no alignment.  Why two isotropic starts: from the wide one
alone a fold of the zoo's parity3 (800 rows) ends on two noise features.  Why a start narrow on one pair
(:func:`strongest_pair`): a fine checkerboard on two of 30 features is not seen from an isotropic start
(wide: too smooth; narrow: every pair of rows far apart in the 28 others); the fit keeps the better alignment.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mwumkl_dist.kernels.specs import SUBSET_EXPONENTS, DataScale, Gaussian, subset_kernels

__all__ = [
    "ARD_ITERATIONS",
    "ARD_POINTS",
    "ARD_STARTS",
    "RELEVANT_SHARE",
    "MAX_WIDEN",
    "STRUCTURE_C_GRID",
    "STRUCTURE_RUNGS",
    "FeatureStructure",
    "Screen",
    "alignment",
    "ard_relevance",
    "kernels_of",
    "structure_rungs",
    "structured_kernels",
]

#: The relevance fit reads at most this many rows (its cost is quadratic in them; 800 rows find every zoo
#: family's features at d = 30 and d = 200).
ARD_POINTS = 800
#: Its starts: every feature at relevance ``c / d`` (``c`` the start's total; in units of the features' spreads) ...
ARD_STARTS = (1.0, 10.0)
#: ... and one narrow on the pair of features with the strongest interaction (:func:`strongest_pair`) only: ``w`` of
#: the pair, and the total of the others.
PAIR_START = (3.0, 0.3)
#: The pair table's quantile bins per feature (a 3 x 3 checkerboard falls into 6 x 6 cells) ...
PAIR_BINS = 6
#: ... and the most features whose pairs it tables (its memory grows as ``(6 d)^2``).
PAIR_MAX_FEATURES = 300
#: A pair whose strength (:func:`strongest_pair`; about 1 without interaction, the largest of 435 noise pairs
#: about 2) is at least this is relevant whatever the alignment's optimum says.
PAIR_STRENGTH = 4.0
#: The residual stage: kernel ridge's ridge (kernel values are at most 1) ...
RESIDUAL_RIDGE = 1.0
#: ... and the alignment with the residuals from which their relevant features are relevant too (800 rows, 30
#: features: 0.012-0.025 where the first fit found every relevant feature, 0.033-0.045 on E7's radial term).
RESIDUAL_ALIGNMENT = 0.03
#: L-BFGS iterations per start.
ARD_ITERATIONS = 50
#: Bounds of ``log w_f``: a width from ``e^-2`` to ``e^6`` spreads (wider: the feature is noise).
ARD_LOG_BOUNDS = (-12.0, 4.0)
#: The *relevant* features: relevance at least this share of the largest.
RELEVANT_SHARE = 0.1
#: The ladder of kept feature counts (those below the feature count; at most :data:`MAX_RUNGS` of them, the
#: largest), after the relevant features' rung.
STRUCTURE_RUNGS = (1, 2, 4, 8, 16, 32)
MAX_RUNGS = 4
#: The rungs of the relevance search's own, by ``top``.
RUNG_LABELS = {0: "the relevant features", -1: "the relevant and residual features",
               -2: "the relevant features, one band each"}  # fmt: skip
#: The relevant features' rung chooses its ``C`` (size-relative) from these (the zoo's structures: 1 to 100).
STRUCTURE_C_GRID = (1.0, 10.0, 100.0)
#: The chosen rung is scored again with its widths up to this many octaves wider, each kept while its cross-validated
#: error is at most the narrower's (:meth:`~mwumkl_dist.solvers.candidates.FeatureStructureKind.search`).  The
#: alignment's optimum is narrower than the classifier's: E7's rows (x0-x3 at the learned widths, 2x10^5 rows,
#: rank 536, the cap at 10^6 rows) 7.30 % test error with a Nystroem residual of 0.058; one octave wider 6.45 %
#: (residual 0.0007); half an octave 6.67 %.  A smoother kernel also needs fewer landmarks at scale.
MAX_WIDEN = 2


def alignment(K: np.ndarray, Yc: np.ndarray) -> tuple[float, np.ndarray]:
    """The off-diagonal centred alignment of ``K`` (its diagonal already 0) with centred targets ``Yc``, and
    its gradient in ``K``.

    ``A = <H K H, Yc Yc'> / (||H K H|| ||Yc Yc'||)`` (``H`` centring; one-hot targets, one column for two
    classes) on the kernel without its diagonal.
    """
    Kc = K - K.mean(axis=0)[None, :] - K.mean(axis=1)[:, None] + K.mean()
    k_norm = float(np.linalg.norm(Kc))
    y_norm = float(np.linalg.norm(Yc.T @ Yc))
    if k_norm == 0.0 or y_norm == 0.0:
        return 0.0, np.zeros_like(K)
    a = float(np.sum(Yc * (K @ Yc))) / (k_norm * y_norm)
    grad = (Yc @ Yc.T) / (k_norm * y_norm) - a * Kc / k_norm**2
    return a, grad


def ard_relevance(X, y) -> tuple[np.ndarray, np.ndarray, float, np.ndarray, np.ndarray]:
    """Each feature's relevance: the widths of a Gaussian with one width per feature fitted to ``(X, y)``.

    Maximises :func:`alignment` over ``log w`` by L-BFGS from each of :data:`ARD_STARTS` (at most
    :data:`ARD_ITERATIONS` iterations each) and keeps the better.  Constant features have relevance 0.

    Returns
    -------
    relevance : ndarray of shape (n_features,)
        ``w_f``, in units of each feature's spread (comparable across features of different scales).
    gamma : ndarray of shape (n_features,)
        ``w_f / s_f^2``: the fitted kernel is ``exp(-sum_f gamma_f (x_f - z_f)^2)`` in the input's units.
    alignment : float
        The fitted kernel's alignment.
    residual : ndarray of bool, shape (n_features,)
        The features the residual stage adds (not relevant in the first fit; ``gamma`` gives them a width).
    gamma_residual : ndarray of shape (n_features,)
        The residual fit's own ``gamma`` (0 where the residual stage found nothing): the width of an additive
        term of its own on the residual's features.
    """
    X = np.asarray(X.toarray() if hasattr(X, "toarray") else X, dtype=np.float64)
    y = np.asarray(y)
    n, d = X.shape
    spread = X.std(axis=0)
    live = np.flatnonzero(spread > 0)
    relevance, gamma = np.zeros(d), np.zeros(d)
    classes = np.unique(y)
    if len(live) == 0 or len(classes) < 2 or n < 3:
        return relevance, gamma, 0.0, np.zeros(d, dtype=bool), np.zeros(d)
    Z = (X[:, live] - X[:, live].mean(axis=0)) / spread[live]
    Y = (y[:, None] == classes[None, :]).astype(np.float64)
    Yc = (Y[:, :1] if len(classes) == 2 else Y) - (Y[:, :1] if len(classes) == 2 else Y).mean(axis=0)

    starts = [np.full(len(live), np.log(total / len(live))) for total in ARD_STARTS]
    pair, strength = strongest_pair(Z, Yc)
    if pair is not None:  # a fine pattern on two features is seen from a start narrow on them only
        start = np.full(len(live), np.log(PAIR_START[1] / len(live)))
        start[list(pair)] = np.log(PAIR_START[0])
        starts.append(start)
    w, a = _fit_ard(Z, Yc, starts)
    if pair is not None and strength >= PAIR_STRENGTH:
        # The alignment can prefer a strong smooth effect alone to a joint kernel that adds an interaction
        # (the zoo's mixed: the kernel on its additive feature alone); a clear interaction stays relevant.
        w[list(pair)] = np.maximum(w[list(pair)], 2.0 * RELEVANT_SHARE * w.max())
    # What the relevant features leave: the same fit on the leave-one-out residuals of kernel ridge regression
    # on the fitted kernel (E7's radial term beside its checkerboard: a joint kernel at the checkerboard's
    # width has a better alignment without the radial term's features).
    inverse = np.linalg.inv(_ard_kernel(Z, w) + RESIDUAL_RIDGE * np.eye(n))
    residual = (inverse @ Yc) / np.diagonal(inverse)[:, None]
    w_rest, a_rest = _fit_ard(Z, residual - residual.mean(axis=0), starts[:1])
    residual_features = np.zeros(d, dtype=bool)
    gamma_rest = np.zeros(d)
    if a_rest >= RESIDUAL_ALIGNMENT:
        residual_features[live] = (w_rest >= RELEVANT_SHARE * w_rest.max()) & (w < RELEVANT_SHARE * w.max())
        gamma_rest[live] = w_rest / spread[live] ** 2
        w_joint = np.where(residual_features[live], np.maximum(w, 2.0 * RELEVANT_SHARE * w.max()), w)
    else:
        w_joint = w
    relevance[live] = w
    gamma[live] = w_joint / spread[live] ** 2  # the residual's features at a width of their own order
    return relevance, gamma, a, residual_features, gamma_rest


def _ard_kernel(Z: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The Gaussian with one width ``w_f`` per (standardised) feature on the rows of ``Z``."""
    Zw = Z * np.sqrt(w)
    sq = np.sum(Zw * Zw, axis=1)
    return np.exp(-np.maximum(sq[:, None] + sq[None, :] - 2.0 * (Zw @ Zw.T), 0.0))


def _fit_ard(Z: np.ndarray, targets: np.ndarray, starts: list) -> tuple[np.ndarray, float]:
    """The widths that maximise the off-diagonal :func:`alignment` of :func:`_ard_kernel` with ``targets``: L-BFGS
    over ``log w`` from each of ``starts``, the better kept; ``(w, alignment)``."""
    from scipy.optimize import minimize

    Z2 = Z * Z

    def loss(theta):
        w = np.exp(theta)
        K = _ard_kernel(Z, w)
        np.fill_diagonal(K, 0.0)
        a, G = alignment(K, targets)
        M = G * K  # dA/dw_f = -sum_ij M_ij (z_if - z_jf)^2 = -2 (z_f^2 . M 1 - z_f . M z_f)
        grad_w = -2.0 * (Z2.T @ M.sum(axis=1) - np.sum(Z * (M @ Z), axis=0))
        return -a, -grad_w * w

    runs = [minimize(loss, start, jac=True, method="L-BFGS-B", bounds=[ARD_LOG_BOUNDS] * Z.shape[1],
                     options={"maxiter": ARD_ITERATIONS}) for start in starts]  # fmt: skip
    best = min(runs, key=lambda res: res.fun)
    return np.exp(best.x), float(-best.fun)


def strongest_pair(Z: np.ndarray, Yc: np.ndarray) -> tuple[tuple[int, int] | None, float]:
    """The pair of features (columns of ``Z``) with the largest interaction in a table of :data:`PAIR_BINS` x
    :data:`PAIR_BINS` quantile cells, and its strength (``(None, 0.0)``: fewer than two features, or more than
    :data:`PAIR_MAX_FEATURES`).

    A pair's statistic is the label variance between its cells, ``sum_c |S_c|^2 / N_c`` (``N_c`` rows, label sum
    ``S_c``), less each feature's own between-bin variance: what the pair explains beyond its features' additive
    effects.  Its strength is that over its mean without any interaction, ``(B - 1)^2`` times the labels'
    variance.  All the pairs' tables are one product of the rows' one-hot bins: ``O(n (B d)^2)``.
    """
    n, d = Z.shape
    if d < 2 or d > PAIR_MAX_FEATURES:
        return None, 0.0
    ranks = np.argsort(np.argsort(Z, axis=0, kind="stable"), axis=0, kind="stable")
    bins = np.minimum(ranks * PAIR_BINS // n, PAIR_BINS - 1) + PAIR_BINS * np.arange(d)[None, :]
    Q = np.zeros((n, d * PAIR_BINS))
    np.put_along_axis(Q, bins, 1.0, axis=1)
    counts = Q.T @ Q
    marginal = np.zeros(d)
    between = np.zeros((d, d))
    for column in Yc.T:
        sums = Q.T @ (column[:, None] * Q)
        with np.errstate(invalid="ignore", divide="ignore"):
            cells = np.where(counts > 0, sums**2 / counts, 0.0)
        table = cells.reshape(d, PAIR_BINS, d, PAIR_BINS).sum(axis=(1, 3))
        marginal += np.diagonal(table)
        between += table
    gain = between - marginal[:, None] - marginal[None, :]
    np.fill_diagonal(gain, -np.inf)
    a, b = np.unravel_index(int(np.argmax(gain)), gain.shape)
    null = (PAIR_BINS - 1) ** 2 * float(np.sum(Yc**2)) / n
    return (int(min(a, b)), int(max(a, b))), float(gain[a, b] / null) if null > 0 else 0.0


@dataclass(frozen=True)
class Screen:
    """A relevance fit's verdict (:func:`ard_relevance`): each feature's relevance, normalised to sum 1
    (``feature_weights``), and its fitted ``gamma`` in the input's units; ``rows`` is how many rows it read."""

    feature_weights: np.ndarray
    gamma: np.ndarray
    rows: int = 0
    alignment: float = 0.0
    #: The share of fits whose residual stage added each feature (None: none).
    residual: np.ndarray | None = None
    #: The residual fit's ``gamma`` (input units; 0 or None: no residual stage).
    gamma_residual: np.ndarray | None = None

    @classmethod
    def of_rows(cls, X, y) -> Screen:
        """The screen of rows ``X`` (at most :data:`ARD_POINTS` of them, chosen by the caller) with labels ``y``."""
        relevance, gamma, a, residual, gamma_residual = ard_relevance(X, y)
        total = relevance.sum()
        weights = relevance / total if total > 0 else np.full(len(relevance), 1.0 / max(len(relevance), 1))
        return cls(weights, gamma, len(y), a, residual.astype(np.float64), gamma_residual)

    @classmethod
    def mean(cls, screens) -> Screen:
        """The average of several screens (e.g. the cross-validation folds')."""
        screens = list(screens)
        residual = [s.residual if s.residual is not None else np.zeros(len(s.gamma)) for s in screens]
        rest = [s.gamma_residual if s.gamma_residual is not None else np.zeros(len(s.gamma)) for s in screens]
        return cls(np.mean([s.feature_weights for s in screens], axis=0), np.mean([s.gamma for s in screens], axis=0),
                   int(np.mean([s.rows for s in screens])), float(np.mean([s.alignment for s in screens])),
                   np.mean(residual, axis=0), np.mean(rest, axis=0))  # fmt: skip

    def with_residual(self) -> tuple[int, ...]:
        """The relevant features and those the residual stage added (in most of the fits), ascending."""
        return tuple(sorted(set(self.first()) | set(self.residual_only())))

    def first(self) -> tuple[int, ...]:
        """The relevant features (:meth:`relevant` of them, the most relevant), ascending."""
        return tuple(sorted(int(f) for f in self.ranking()[: self.relevant()]))

    def residual_only(self) -> tuple[int, ...]:
        """The features the residual stage added in most of the fits and not relevant, ascending."""
        if self.residual is None:
            return ()
        return tuple(sorted(set(int(f) for f in np.flatnonzero(self.residual > 0.5)) - set(self.first())))

    def ranking(self) -> np.ndarray:
        """The features, most relevant first (ties: the lower index first)."""
        return np.argsort(-self.feature_weights, kind="stable")

    def relevant(self) -> int:
        """How many features have relevance at least :data:`RELEVANT_SHARE` of the largest (at least 1)."""
        w = self.feature_weights
        return max(1, int(np.sum(w >= RELEVANT_SHARE * w.max()))) if w.size else 0


@dataclass(frozen=True)
class FeatureStructure:
    """The structured candidate that keeps the ``top`` most relevant features of a screen (``top=0``: the relevant
    ones, :meth:`Screen.relevant`).

    As a fit's ``selectivity`` (with the refit's ``C`` as its ``C``) it means: screen the fit's rows
    (or use ``screen``, the cross-validation folds' averaged screen), keep the features, and fit
    :func:`structured_kernels` with selectivity 0.  ``screen`` does not take part in comparisons
    (candidates are the same whatever rows screened them).
    """

    top: int
    screen: Screen | None = field(default=None, compare=False, repr=False)
    #: ``(features, sigmas, groups)`` already chosen (a fitted model's ``structure_``): no screen needed.
    kept: tuple | None = field(default=None, compare=False, repr=False)
    #: Every width of :func:`structured_kernels` ``2^widen`` times the learned one.
    widen: int = 0

    def __str__(self) -> str:
        wider = f", widths x{2**self.widen}" if self.widen else ""
        return f"structure({self.label[4:]}{wider})"

    @property
    def label(self) -> str:
        """In words: ``"the relevant features"`` (top 0), ``"the relevant and residual features"`` (top -1: with
        those the residual stage added), ``"the relevant features, one band each"`` (top -2: an additive model)
        or ``"the top k feature(s)"``."""
        if self.top <= 0:
            return RUNG_LABELS[self.top]
        return f"the top {self.top} feature(s)"

    @classmethod
    def of_model(cls, structure: dict) -> FeatureStructure:
        """The structure a fitted model's ``structure_`` describes (its features and widths kept as they are)."""
        sigmas = structure.get("sigmas")
        widths = None if sigmas is None else tuple(float(s) for s in sigmas)
        groups = tuple((tuple(int(f) for f in g["features"]), tuple(float(s) for s in g["sigmas"]))
                       for g in structure.get("groups", ()))  # fmt: skip
        kept = (tuple(int(f) for f in structure["features"]), widths, groups)
        return cls(int(structure["top"]), kept=kept, widen=int(structure.get("widen", 0)))


def structure_rungs(n_features: int) -> list[FeatureStructure]:
    """The structured candidates scored for ``n_features`` features: the relevant features, those and the
    residual's, up to :data:`MAX_RUNGS` rungs of :data:`STRUCTURE_RUNGS` below the feature count (the largest),
    and the relevant features' additive model (none for one feature)."""
    if int(n_features) < 2:
        return []
    ladder = [FeatureStructure(k) for k in STRUCTURE_RUNGS if k < int(n_features)][-MAX_RUNGS:]
    # The additive rung last: the choice takes the first rung within a standard error of the best.
    return [FeatureStructure(0), FeatureStructure(-1)] + ladder + [FeatureStructure(-2)]


def structured_kernels(scale: DataScale, screen: Screen, top: int, widen: int = 0) -> tuple[list, tuple, tuple, tuple]:
    """The kernels of the structured candidate that keeps ``screen``'s ``top`` most relevant features (``top=0``:
    the relevant ones; ``top=-1``: those and the residual stage's), every width ``2^widen`` times the learned one.

    A joint band of Gaussians on those features, at :data:`~mwumkl_dist.kernels.specs.SUBSET_EXPONENTS`
    times the width of the fitted per-feature Gaussian's on them (:func:`_band_widths`).  With ``top=-1``
    and features the residual stage added, also a band of its own on the relevant features (at the first
    fit's width) and one on the residual's features (at the residual fit's width): what the first fit found
    and what it left are two terms of an additive model (E7's checkerboard on x0, x1 at a fine width beside
    its radial term on x2, x3 at a smooth one), which a joint band at one width cannot be.  E7's rows, 3,000
    training / 10,000 test, the best of C 1, 10, 100: the joint band 11.3 %, the two bands 10.2 %, all three
    10.4 %; the default fit at 2x10^4 rows (two-stage): the joint band 8.67 %, the two bands 8.39 %, all three
    7.91 %.  With ``top=-2``: a band of its own on each relevant feature (an additive model), at the width the
    fit learned for it: each kernel reads one feature at its own scale, so features in different units (wine's
    proline in the thousands beside ratios near 1) do not drown each other as in a joint band of one width
    (wine raw, 5 splits, this rung alone at C 1: 2.2 %; the default fit: 5.8 %, choosing it on 1 split).

    Returns
    -------
    kernels : list of Gaussian
    features : tuple of int
        The kept features, ascending (the joint band's).
    sigmas : tuple of float
        The joint band's widths (empty for ``top=-2``).
    groups : tuple of (features, sigmas)
        The bands of their own (``top=-1`` with residual features, ``top=-2``; else empty).
    """
    groups: tuple = ()
    factor = 2.0 ** int(widen)
    if int(top) == -2:
        features = screen.first()
        groups = tuple(((f,), _band_widths(scale, (f,), screen.gamma, factor)) for f in features)
    elif int(top) == -1:
        features = screen.with_residual()
        rest = screen.residual_only()
        if rest and screen.gamma_residual is not None:
            first = screen.first()
            groups = ((first, _band_widths(scale, first, screen.gamma, factor)),
                      (rest, _band_widths(scale, rest, screen.gamma_residual, factor)))  # fmt: skip
    else:
        k = screen.relevant() if int(top) == 0 else int(top)
        features = tuple(sorted(int(f) for f in screen.ranking()[:k]))
    sigmas = () if int(top) == -2 else _band_widths(scale, features, screen.gamma, factor)
    return kernels_of(scale, features, sigmas, groups), features, sigmas, groups


def _band_widths(scale: DataScale, features: tuple, gamma: np.ndarray, factor: float = 1.0) -> tuple[float, ...]:
    """A joint band's widths on ``features``: :data:`~mwumkl_dist.kernels.specs.SUBSET_EXPONENTS` times ``factor``
    times the one width whose kernel spreads pairs of rows as far apart as the per-feature Gaussian of ``gamma``
    does, ``sigma^2 = sum_f var_f / (2 sum_f gamma_f var_f)`` (their own scale, :meth:`DataScale.sigma`, where
    ``gamma`` is 0 on them)."""
    var = np.array([_variance(scale, f) for f in features])
    spread = float(np.sum(gamma[list(features)] * var))
    if spread > 0 and np.sum(var) > 0:
        sigma = float(np.sqrt(np.sum(var) / (2.0 * spread)))
        return tuple(factor * sigma * 2.0**e for e in SUBSET_EXPONENTS)
    return tuple(factor * s.sigma for s in subset_kernels(scale, features, SUBSET_EXPONENTS))


def _variance(scale: DataScale, feature: int) -> float:
    """A feature's variance over the training rows (from :class:`DataScale`'s exact sums: ``sigma_f^2 = var / 2``)."""
    return 2.0 * scale.sigma((int(feature),)) ** 2


def kernels_of(scale: DataScale, features, sigmas=None, groups=()) -> list:
    """A structured model's kernels: Gaussians on ``features`` at ``sigmas`` (None: the subset band at their own
    scale, as models saved before the widths were recorded), then on each ``(features, sigmas)`` of ``groups``."""
    features = tuple(int(f) for f in features)
    if sigmas is None:
        return subset_kernels(scale, features, SUBSET_EXPONENTS)
    out = [Gaussian(sigma=float(s), features=features) for s in sigmas]
    for group, widths in groups:
        out.extend(Gaussian(sigma=float(s), features=tuple(int(f) for f in group)) for s in widths)
    return out
