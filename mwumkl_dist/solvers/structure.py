"""The structure search of ``kernels="auto"``: which features, and which of their interactions, carry the signal.

The scaled family on all features combined with uniform weights is a good kernel where every feature
matters and a poor one where the signal lives in a few features or in their interactions (E7's synthetic
data: a checkerboard on x0, x1 plus a radial term on x2, x3 among 16 noise features; the family's best
is 25 % test error at 3000 rows where an RBF kernel on x0-x3 gives 11 %).  MWU finds such structure when
it is offered kernels on feature subsets, so the default offers them and lets cross-validation decide:

1. *Screen*: one MWU fit on the screening kernels (:func:`~mwumkl_dist.kernels.specs.screening_kernels`:
   every feature, every pair or a seeded draw of pairs and triples, each at its own scale) with a strong
   ridge and a moderate selectivity (:data:`SCREEN_C`, :data:`SCREEN_SELECTIVITY`, unpolished,
   epsilon :data:`SCREEN_EPSILON`).  Its weights rank the features: a feature's weight is the weight of
   the subsets that read it, shared equally among their features (:class:`Screen`).
2. *Candidates*: for ``k`` in a ladder (1, 2, 4, ... fewer than the features; :func:`structure_rungs`),
   the ``k`` heaviest features get a joint band of Gaussians (three widths at their own scale), and the
   heaviest screened subsets within them keep their own kernels (:func:`structured_kernels`).  The
   model on those kernels has uniform weights (selectivity 0).
3. *Choice*: :func:`mwumkl_dist.solvers.auto.choose_C` scores every rung by the same 3-fold
   cross-validation as the other candidates, each fold screening its own training rows (so the
   screen never sees the rows it is judged on); the best rung replaces the all-features candidates
   only when it is better than the best of them by more than the standard error of their paired
   difference.  Where no feature subset stands out the scaled family stays (uniform weights).

Why a moderate selectivity: at 300 the screening weights collapse onto the single heaviest subset and
rank the others by their agreement with it (madelon-like data, 2000 rows, 500 features: 8 of the 20
relevant features among the 20 heaviest); at 30 the weights stay spread over the relevant subsets
(12-15 of 20) and E7's four relevant features are still the four heaviest.  Why a strong ridge (C 0.1):
it keeps the narrow kernels that memorise from winning the margins (SPEC.md: the MKL optimum selects
only under a strong ridge).  Why the screening kernels exclude the all-features family: its narrow
Gaussians have the largest trace-normalised margins and take all the weight (0.98 on E7's data).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mwumkl_dist.kernels.specs import SUBSET_EXPONENTS, DataScale, subset_kernels

__all__ = [
    "SCREEN_C",
    "SCREEN_EPSILON",
    "SCREEN_SELECTIVITY",
    "SUBSET_KEEP",
    "STRUCTURE_RUNGS",
    "FeatureStructure",
    "Screen",
    "kernels_of",
    "structure_rungs",
    "structured_kernels",
]

#: The screening fit's size-relative ``C`` ...
SCREEN_C = 0.1
#: ... its selectivity ...
SCREEN_SELECTIVITY = 30.0
#: ... and its epsilon (401 iterations at 2000 rows; 0.3 ranks E7's x2, x3 below noise features).
SCREEN_EPSILON = 0.2
#: A screened subset inside the kept features keeps its own kernels when its weight is at least this
#: fraction of the heaviest such subset's (at most :data:`MAX_SUBSETS` of them).  At the screen's selectivity
#: a noise pair gets 0.15-0.3 of the heaviest subset's weight (E7's data), so only subsets that clearly
#: stand out keep their own kernels; the joint band covers the rest of the kept features.
SUBSET_KEEP = 0.5
MAX_SUBSETS = 3
#: The ladder of kept feature counts (those below the feature count; at most :data:`MAX_RUNGS` of them,
#: the largest).
STRUCTURE_RUNGS = (1, 2, 4, 8, 16, 32)
MAX_RUNGS = 5


@dataclass(frozen=True)
class Screen:
    """A screening fit's verdict: each feature's weight and each screened subset's, normalised to sum 1.

    ``subset_weights`` maps a subset (a sorted tuple of features) to the summed weight of its kernels;
    ``n_kernels`` is how many kernels were screened.
    """

    feature_weights: np.ndarray
    subset_weights: dict
    n_kernels: int

    @classmethod
    def of(cls, specs, weights, n_features: int) -> Screen:
        """The screen of a fit on ``specs`` (kernels on feature subsets) with ``kernel_weights_`` ``weights``
        (one-vs-rest: one row per problem, averaged)."""
        w = np.atleast_2d(np.asarray(weights, dtype=np.float64)).mean(axis=0)
        w = w / w.sum() if w.sum() > 0 else np.full(len(w), 1.0 / len(w))
        subsets: dict = {}
        for spec, value in zip(specs, w):
            subsets[spec.features] = subsets.get(spec.features, 0.0) + float(value)
        features = np.zeros(int(n_features))
        for subset, value in subsets.items():
            features[list(subset)] += value / len(subset)
        return cls(features, subsets, len(specs))

    @classmethod
    def mean(cls, screens) -> Screen:
        """The average of several screens of the same kernels (e.g. the cross-validation folds')."""
        screens = list(screens)
        subsets: dict = {}
        for screen in screens:
            for subset, value in screen.subset_weights.items():
                subsets[subset] = subsets.get(subset, 0.0) + value / len(screens)
        features = np.mean([s.feature_weights for s in screens], axis=0)
        return cls(features, subsets, screens[0].n_kernels)

    def ranking(self) -> np.ndarray:
        """The features, heaviest first (ties: the lower index first)."""
        return np.argsort(-self.feature_weights, kind="stable")


@dataclass(frozen=True)
class FeatureStructure:
    """The structured candidate that keeps the ``top`` heaviest features of a screen.

    As a fit's ``selectivity`` (with the refit's ``C`` as its ``C``) it means: screen the fit's rows
    (or use ``screen``, the cross-validation folds' averaged screen), keep the ``top`` heaviest
    features, and fit :func:`structured_kernels` with selectivity 0.  ``screen`` does not take part in
    comparisons (candidates are the same whatever rows screened them).
    """

    top: int
    screen: Screen | None = field(default=None, compare=False, repr=False)
    #: ``(features, subsets)`` already chosen (a fitted model's ``structure_``): no screen needed.
    kept: tuple | None = field(default=None, compare=False, repr=False)

    def __str__(self) -> str:
        return f"structure(top {self.top} features)"

    @classmethod
    def of_model(cls, structure: dict) -> FeatureStructure:
        """The structure a fitted model's ``structure_`` describes (its features and subsets kept as they are)."""
        subsets = tuple(tuple(int(f) for f in s) for s in structure["subsets"])
        return cls(int(structure["top"]), kept=(tuple(int(f) for f in structure["features"]), subsets))


def structure_rungs(n_features: int) -> list[FeatureStructure]:
    """The structured candidates scored for ``n_features`` features: up to :data:`MAX_RUNGS` rungs of
    :data:`STRUCTURE_RUNGS` below the feature count, the largest (none for one feature)."""
    return [FeatureStructure(k) for k in STRUCTURE_RUNGS if k < int(n_features)][-MAX_RUNGS:]


def structured_kernels(scale: DataScale, screen: Screen, top: int) -> tuple[list, tuple, list]:
    """The kernels of the structured candidate that keeps ``screen``'s ``top`` heaviest features.

    A joint band of Gaussians on those features (:data:`~mwumkl_dist.kernels.specs.SUBSET_EXPONENTS`
    times their own scale), and the kernels of the screened subsets inside them whose weight is at
    least :data:`SUBSET_KEEP` of the heaviest such subset's (at most :data:`MAX_SUBSETS`, heaviest first;
    the joint band is left out when it would repeat one of them).

    Returns
    -------
    kernels : list of Gaussian
    features : tuple of int
        The kept features, ascending.
    subsets : list of tuple
        The kept subsets, heaviest first.
    """
    features = tuple(sorted(int(f) for f in screen.ranking()[: int(top)]))
    kept = set(features)
    inside = sorted(
        ((s, w) for s, w in screen.subset_weights.items() if set(s) <= kept and w > 0),
        key=lambda item: (-item[1], item[0]),
    )
    subsets = [s for s, w in inside if w >= SUBSET_KEEP * inside[0][1]][:MAX_SUBSETS] if inside else []
    return kernels_of(scale, features, subsets), features, subsets


def kernels_of(scale: DataScale, features, subsets) -> list:
    """A structured model's kernels: the joint band on ``features`` (unless it repeats one of ``subsets``) and
    each subset's band, every band at its own features' scale."""
    features = tuple(features)
    subsets = [tuple(s) for s in subsets]
    kernels = [] if features in subsets else subset_kernels(scale, features, SUBSET_EXPONENTS)
    for subset in subsets:
        kernels.extend(subset_kernels(scale, subset, SUBSET_EXPONENTS))
    return kernels
