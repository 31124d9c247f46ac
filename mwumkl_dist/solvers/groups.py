"""Group selection: the kernels' feature groups chosen by a strongly regularised fit, then a model on them.

A kernel set whose kernels read different features (per-feature kernels, one family per data source,
``"gaussian:2@0-4,gaussian:2@5-9"``) falls into *feature groups*: the kernels that read the same
features.  Selecting kernels one by one and fitting with the same weights couples two things that
want different settings: the MKL optimum is sparse (it drops uninformative features) only under a
strong ridge ``I / C`` and a high selectivity, where its classifier underfits; at the ``C`` that
classifies best its weights are nearly uniform and keep the noise features.  Group selection
decouples them, as the relaxed lasso does for the lasso (Meinshausen 2007): a *selection fit* at a
small ``C`` and a high selectivity weighs the kernels; the groups that carry at least
:data:`GROUP_KEEP` of the heaviest group's weight are kept; the model is refitted on all the kernels of
the kept groups with uniform weights (selectivity 0) at its own ``C``.  Dropped kernels get weight 0.

Measured on E6 (``benchmarks/bench_selection.py``, per-feature kernels, medians over 3 splits, test error %
/ weight on the relevant kernels, against the one-standard-error selectivity rule alone): ``make_classification``
k=4 of d=30 18.0 / 1.00 (22.0 / 0.43), k=5 of 50 14.0 / 1.00 (18.0 / 0.10), ionosphere + 30 noise features
9.1 / 1.00 (12.5 / 0.52), sonar + 30 noise 23.1 / 1.00 (26.9 / 0.67), breast cancer + 30 noise 4.1 / 1.00
(4.7 / 0.23); k=2 of 10 keeps uniform weights (7.5 / 0.20; its Oracle 8.5).  :func:`mwumkl_dist.solvers.auto.choose_C`
scores these candidates beside the others and prefers a group selection within one standard error of the
best (fewer inputs, the simpler model).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mwumkl_dist.kernels.specs import GAUSSIAN

__all__ = [
    "AUTO_BAND_C_FACTORS",
    "AUTO_GROUP_C_GRID",
    "AUTO_GROUP_SELECTIONS",
    "GROUP_KEEP",
    "GroupSelection",
    "WidthBand",
    "width_bands",
    "chosen_selectivity",
    "feature_groups",
    "kept_groups",
    "n_groups",
    "selected_kernels",
    "selected_mask",
]

#: A group is kept when its summed weight is at least this fraction of the heaviest group's.
GROUP_KEEP = 0.2


@dataclass(frozen=True)
class GroupSelection:
    """A selection fit's settings: size-relative ``C``, selectivity, and the :data:`GROUP_KEEP` threshold.

    As a fit's ``selectivity`` (with the refit's ``C`` as its ``C``) it means: fit with these
    settings, keep the feature groups that carry at least ``keep`` of the heaviest group's weight,
    and fit again on the kernels of those groups with selectivity 0.
    """

    C: float
    selectivity: float
    keep: float = GROUP_KEEP

    def __str__(self) -> str:
        return f"groups(C={self.C:g}, selectivity={self.selectivity:g})"

    def describe(self, n_kept: int, n_groups: int) -> dict:
        """What the fitted attribute ``group_selection_`` records."""
        return {
            "C": float(self.C),
            "selectivity": float(self.selectivity),
            "keep": float(self.keep),
            "groups_kept": int(n_kept),
            "groups": int(n_groups),
        }


#: ``selectivity="auto"`` scores group selections from these selection fits: the sparse ends of the
#: MKL problem (a large ridge with the exact optimum's selectivity, and ``C = 1``, where the exact
#: optimum selects features, with a selectivity of 100) ...
AUTO_GROUP_SELECTIONS = (GroupSelection(0.1, 300.0), GroupSelection(1.0, 100.0))
#: ... each refitted at these size-relative ``C``.
AUTO_GROUP_C_GRID = (1.0, 10.0, 100.0, 1000.0)


def feature_groups(specs) -> list:
    """Each kernel's feature group: the features it reads (``None``: all of them), in ``specs``' order."""
    return [getattr(spec, "features", None) for spec in specs]


def kept_groups(specs, weights, keep: float = GROUP_KEEP) -> set:
    """The feature groups whose summed kernel weight is at least ``keep`` times the heaviest group's.

    ``weights``: one row per binary problem (one-vs-rest) or one vector; a group is kept when it is
    kept for any problem (the refit's kernels are shared by all of them).
    """
    groups = feature_groups(specs)
    names = list(dict.fromkeys(groups))  # first-appearance order
    index = {g: i for i, g in enumerate(names)}
    member = np.array([index[g] for g in groups])
    kept: set = set()
    for row in np.atleast_2d(np.asarray(weights, dtype=np.float64)):
        totals = np.bincount(member, weights=row, minlength=len(names))
        top = totals.max()
        if top > 0:
            kept.update(names[i] for i in np.flatnonzero(totals >= keep * top))
    return kept


def selected_mask(specs, weights, keep: float = GROUP_KEEP) -> np.ndarray:
    """Which kernels of ``specs`` are in the groups :func:`kept_groups` keeps."""
    kept = kept_groups(specs, weights, keep)
    return np.array([group in kept for group in feature_groups(specs)], dtype=bool)


def selected_kernels(specs, weights, keep: float = GROUP_KEEP) -> list:
    """The kernels of ``specs`` in the groups :func:`kept_groups` keeps, in their order."""
    return [spec for spec, kept in zip(specs, selected_mask(specs, weights, keep)) if kept]


def n_groups(specs) -> int:
    """How many feature groups ``specs`` fall into."""
    return len(set(feature_groups(specs)))


def chosen_selectivity(attributes: dict):
    """The selectivity a fitted model's ``attributes`` used: its :class:`GroupSelection` when it selected groups,
    its :class:`WidthBand` when it kept a band of widths."""
    band = attributes.get("width_band_")
    if band is not None:
        return WidthBand(band["first"], band["last"])
    chosen = attributes.get("group_selection_")
    if chosen is None:
        return attributes.get("selectivity_")
    return GroupSelection(chosen["C"], chosen["selectivity"], chosen["keep"])


# ----------------------------------------------------------------------------- bands of widths
#
# A family of Gaussian widths on one feature group (the default ``scaled`` family: up to 11 widths
# 2^-2.5 ... 2^2.5 sigma_0, and polynomials of degree 1-3) combined with uniform weights is a kernel of many
# scales; where the data want one scale, that mixture loses to a few neighbouring widths, and the selective combinations
# do not find them (the trace-normalised margin rewards the narrowest Gaussian).  ``selectivity="auto"``
# therefore also scores bands of three neighbouring widths with uniform weights, each at the chosen C and
# ten times it; a band wins when it beats the best other candidate by more than the standard error of their
# paired difference (the two mostly agree, so a binomial standard error of either error would hide a real
# gain).  E8 (benchmarks/bench_e8.py, test error %, before / with bands): at 2000 training rows, 3 splits,
# magic04 14.97 / 14.13, cod-rna 4.43 / 3.94, banana 10.19 / 10.09, a9a 15.77 / 15.74, svmguide1
# 3.16 / 3.23, twonorm, ringnorm and mushrooms unchanged; the six small sets, 10 splits, unchanged but
# german.numer 23.20 / 23.16 and banana (1000 rows) 10.02 / 9.99; full size, one split, magic04
# 13.56 / 12.81 (the tuned RBF SVC: 12.47), cod-rna 3.38 / 3.39, banana 8.53 / 9.36.


@dataclass(frozen=True)
class WidthBand:
    """The Gaussians of width rank ``first`` to ``last`` (0: the narrowest), with uniform weights.

    As a fit's ``selectivity`` it means: fit on those kernels only (the others get weight 0) with
    selectivity 0.  Ranks count the distinct widths of the kernel set's Gaussians (one feature group).
    """

    first: int
    last: int

    def __str__(self) -> str:
        return f"widths({self.first}-{self.last})"

    def mask(self, specs) -> np.ndarray:
        """Which kernels of ``specs`` are in the band."""
        ladder = _width_ladder(specs)
        band = set(ladder[self.first : self.last + 1])
        return np.array([_sigma(spec) in band for spec in specs], dtype=bool)

    def describe(self, specs) -> dict:
        """What the fitted attribute ``width_band_`` records: the ranks, the widths, how many there were."""
        ladder = _width_ladder(specs)
        return {
            "first": int(self.first),
            "last": int(self.last),
            "sigmas": [float(s) for s in ladder[self.first : self.last + 1]],
            "widths": len(ladder),
        }


#: ``selectivity="auto"`` scores each band at these multiples of the chosen size-relative ``C`` (a band
#: of narrow widths wants a weaker ridge than the whole family: magic04 and cod-rna chose 10 C).
AUTO_BAND_C_FACTORS = (1.0, 10.0)
#: Bands are scored for kernel sets with at least this many distinct Gaussian widths.
MIN_BAND_WIDTHS = 5


def _sigma(spec):
    return getattr(spec, "sigma", None) if getattr(spec, "kind", None) == GAUSSIAN else None


def _width_ladder(specs) -> list:
    """The distinct Gaussian widths of ``specs``, narrowest first."""
    return sorted({s for s in map(_sigma, specs) if s is not None})


def width_bands(specs) -> list:
    """The bands ``selectivity="auto"`` scores: three neighbouring widths centred on every other width
    (11 widths: 0-2, 2-4, 4-6, 6-8, 8-10), or none (several feature groups, fewer than
    :data:`MIN_BAND_WIDTHS` widths)."""
    if n_groups(specs) != 1:
        return []
    n = len(_width_ladder(specs))
    if n < MIN_BAND_WIDTHS:
        return []
    return [WidthBand(c - 1, c + 1) for c in range(1, n - 1, 2)]
