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

from mwumkl_dist.kernels.specs import GAUSSIAN, Gaussian

__all__ = [
    "AUTO_BAND_C_FACTORS",
    "AUTO_GROUP_C_GRID",
    "AUTO_GROUP_SELECTIONS",
    "GROUP_KEEP",
    "GroupSelection",
    "AUTO_GROUP_LADDER_FIT",
    "group_ladder",
    "WidthBand",
    "width_bands",
    "AUTO_BAND_EXPONENTS",
    "AUTO_BAND_CENTRES",
    "auto_band_ladder",
    "auto_width_bands",
    "more_bands",
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
    """A selection fit's settings: size-relative ``C``, selectivity, and which groups it keeps.

    As a fit's ``selectivity`` (with the refit's ``C`` as its ``C``) it means: fit with these
    settings, keep the feature groups that carry at least ``keep`` of the heaviest group's weight
    (or, with ``top``, the ``top`` heaviest groups), and fit again on the kernels of those groups
    with selectivity 0.
    """

    C: float
    selectivity: float
    keep: float = GROUP_KEEP
    top: int | None = None

    def __str__(self) -> str:
        kept = "" if self.top is None else f", top {self.top}"
        return f"groups(C={self.C:g}, selectivity={self.selectivity:g}{kept})"

    def describe(self, n_kept: int, n_groups: int) -> dict:
        """What the fitted attribute ``group_selection_`` records."""
        out = {
            "C": float(self.C),
            "selectivity": float(self.selectivity),
            "keep": float(self.keep),
            "groups_kept": int(n_kept),
            "groups": int(n_groups),
        }
        if self.top is not None:
            out["top"] = int(self.top)
        return out


#: ``selectivity="auto"`` scores group selections from these selection fits: the sparse ends of the
#: MKL problem (a large ridge with the exact optimum's selectivity, and ``C = 1``, where the exact
#: optimum selects features, with a selectivity of 100) ...
AUTO_GROUP_SELECTIONS = (GroupSelection(0.1, 300.0), GroupSelection(1.0, 100.0))
#: ... each refitted at these size-relative ``C``.
AUTO_GROUP_C_GRID = (1.0, 10.0, 100.0, 1000.0)
#: ... and a ladder of the ``top`` heaviest groups of one selection fit at a moderate selectivity, whose weights
#: rank the groups rather than collapse onto a few (see :mod:`mwumkl_dist.solvers.structure`; E6's
#: make_classification k=5 of d=50 keeps 3 of the 5 informative features at a threshold of 0.2, ionosphere
#: with 30 noise features 7 of its 34): the top 1, 2, 4, ... groups (:func:`group_ladder`), each refitted at the
#: chosen ``C`` and ten times it.
AUTO_GROUP_LADDER_FIT = (0.1, 30.0)


def group_ladder(n: int, rungs: int = 5) -> list[GroupSelection]:
    """The ladder's group selections for ``n`` feature groups: ``top`` = the ``rungs`` largest powers of two
    below ``n`` (``n`` groups of per-feature kernels: 1, 2, 4, ... features)."""
    C, selectivity = AUTO_GROUP_LADDER_FIT
    tops = [2**k for k in range(max(int(n) - 1, 1).bit_length()) if 2**k < n][-int(rungs) :]
    return [GroupSelection(C, selectivity, top=k) for k in tops]


def feature_groups(specs) -> list:
    """Each kernel's feature group: the features it reads (``None``: all of them), in ``specs``' order."""
    return [getattr(spec, "features", None) for spec in specs]


def kept_groups(specs, weights, keep: float = GROUP_KEEP, top: int | None = None) -> set:
    """The feature groups whose summed kernel weight is at least ``keep`` times the heaviest group's
    (with ``top``: the ``top`` heaviest groups, ties to the first).

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
        if top is not None:
            kept.update(names[i] for i in np.argsort(-totals, kind="stable")[: int(top)])
        elif totals.max() > 0:
            kept.update(names[i] for i in np.flatnonzero(totals >= keep * totals.max()))
    return kept


def selected_mask(specs, weights, keep: float = GROUP_KEEP, top: int | None = None) -> np.ndarray:
    """Which kernels of ``specs`` are in the groups :func:`kept_groups` keeps."""
    kept = kept_groups(specs, weights, keep, top)
    return np.array([group in kept for group in feature_groups(specs)], dtype=bool)


def selected_kernels(specs, weights, keep: float = GROUP_KEEP, top: int | None = None) -> list:
    """The kernels of ``specs`` in the groups :func:`kept_groups` keeps, in their order."""
    return [spec for spec, kept in zip(specs, selected_mask(specs, weights, keep, top)) if kept]


def n_groups(specs) -> int:
    """How many feature groups ``specs`` fall into."""
    return len(set(feature_groups(specs)))


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
    With ``sigmas`` (``kernels="auto"``, see :func:`auto_width_bands`) the band is those Gaussians on all
    features, whatever the kernel set holds, and the ranks count :func:`auto_band_ladder`'s widths.
    """

    first: int
    last: int
    sigmas: tuple = ()

    def __str__(self) -> str:
        return f"widths({self.first}-{self.last})"

    def mask(self, specs) -> np.ndarray:
        """Which kernels of ``specs`` are in the band."""
        ladder = _width_ladder(specs)
        band = set(self.sigmas or ladder[self.first : self.last + 1])
        return np.array([_sigma(spec) in band for spec in specs], dtype=bool)

    def kernels(self, specs) -> list:
        """The band's kernels: its Gaussians on all features (with ``sigmas``), else those of ``specs`` in it."""
        if self.sigmas:
            return [Gaussian(sigma=s) for s in self.sigmas]
        return [spec for spec, keep in zip(specs, self.mask(specs)) if keep]

    def describe(self, specs) -> dict:
        """What the fitted attribute ``width_band_`` records: the ranks, the widths, how many there were."""
        ladder = AUTO_BAND_EXPONENTS if self.sigmas else _width_ladder(specs)
        out = {
            "first": int(self.first),
            "last": int(self.last),
            "sigmas": [float(s) for s in (self.sigmas or ladder[self.first : self.last + 1])],
            "widths": len(ladder),
        }
        if self.sigmas:  # the model is the band's own kernels (kernels="auto")
            out["own_kernels"] = True
        return out


#: ``kernels="auto"`` scores its bands on a ladder of widths ``2^e sigma_0`` that goes beyond the scaled family's
#: (``2^-2.5 ... 2^2.5``, the narrowest of which its uniform mixture leaves out where they would memorise) by two
#: octaves either way, so that a band at the edge of the family can be extended (see :func:`auto_width_bands`).
AUTO_BAND_EXPONENTS = tuple(k / 2.0 for k in range(-9, 10))
#: The bands first scored: centred on every other width of the scaled family's (ladder ranks 5, 7, ..., 13).
AUTO_BAND_CENTRES = (5, 7, 9, 11, 13)


def auto_band_ladder(sigma0: float) -> tuple:
    """The widths :data:`AUTO_BAND_EXPONENTS` times ``sigma0``, narrowest first."""
    return tuple(float(sigma0 * 2.0**e) for e in AUTO_BAND_EXPONENTS)


def auto_width_bands(sigma0: float, centres=AUTO_BAND_CENTRES) -> list:
    """The bands of three neighbouring widths of :func:`auto_band_ladder` centred on ``centres`` (ladder ranks)."""
    ladder = auto_band_ladder(sigma0)
    return [WidthBand(c - 1, c + 1, ladder[c - 1 : c + 2]) for c in centres if 1 <= c < len(ladder) - 1]


def more_bands(band: WidthBand, sigma0: float, scored) -> list:
    """The bands to score after ``scored`` when ``band`` is the best of them (``kernels="auto"``).

    First the two bands centred one rank either side of the best one (the coarse bands are centred on every
    other width), where not scored yet; once those are, one band two ranks beyond the best when it is the
    narrowest or the widest scored (the cross-validation's optimum at the edge of what was tried).  Empty when
    there is nothing more to try (or the ladder ends).
    """
    centre = (band.first + band.last) // 2
    centres = {(b.first + b.last) // 2 for b in scored}
    nearby = [c for c in (centre - 1, centre + 1) if c not in centres]
    if not nearby:
        step = -2 if centre == min(centres) else 2 if centre == max(centres) else 0
        nearby = [centre + step] if step and centre + step not in centres else []
    return auto_width_bands(sigma0, nearby)


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
