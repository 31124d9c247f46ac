"""Kernel specifications, kernel families and their compiled evaluation plan.

A *kernel spec* is a small immutable description (``Gaussian(sigma=2.0,
features=(0, 3))``).  A :class:`KernelSet` is an ordered list of specs for a
given feature count; it compiles to a :class:`KernelPlan` of flat arrays that
the numba column kernels in :mod:`mwumkl_dist.devices.cpu` evaluate.  Kernels on
the same feature subset form a *group* and share one inner-product /
distance pass, so two kernel columns for all kernels cost one pass over the
data.

A :class:`RandomGaussianBank` alone compiles, with array operations and
without a spec object per kernel, to the very plan of its kernels written out
as :class:`Gaussian` specs (:func:`bank_plan`), so banks run through the same
supersteps and predictor as every other kernel set.
"""

from __future__ import annotations

import functools
import math
import re
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields, replace

import numpy as np

from mwumkl_dist.core.exact import exact_to_float
from mwumkl_dist.core.kernel_syntax import KERNEL_SPEC_HELP

__all__ = [
    "KernelSpec",
    "Linear",
    "Polynomial",
    "Gaussian",
    "RandomGaussianBank",
    "KernelSet",
    "KernelPlan",
    "BankKernelNames",
    "bank_of",
    "bank_plan",
    "PAPER_SIGMAS",
    "PAPER_DEGREES",
    "paper_family",
    "paper_per_feature_family",
    "DataScale",
    "SCALED_EXPONENTS",
    "BANK_EXPONENTS",
    "bank_widths",
    "MEMORISING_WIDTH",
    "scaled_family",
    "scaled_per_feature_family",
    "AUTO_KERNELS",
    "searches_structure",
    "SUBSET_EXPONENTS",
    "SCREEN_MAX_FEATURES",
    "subset_kernels",
    "parse_kernels",
    "format_number",
    "parse_number",
]

# Kind codes shared with the numba column kernels.
LINEAR, POLYNOMIAL, GAUSSIAN = 0, 1, 2

#: Gaussian bandwidths of the paper's family: 2^0, 2^0.5, ..., 2^4.
PAPER_SIGMAS = tuple(float(2.0 ** (k / 2.0)) for k in range(9))
#: Polynomial degrees of the paper's family.
PAPER_DEGREES = (1, 2, 3)
#: Widths of a data-scaled random bank (``random:COUNT``), powers of two times the subsets' scale: as many
#: as the paper's 9 and spanning the tuned RBF SVC's ``gamma = 2^-4 ... 2^4`` times ``gamma="scale"``.
BANK_EXPONENTS = tuple(k / 2.0 for k in range(-4, 5))

#: Gaussian widths of the scaled family, as powers of two times the data's scale ``sigma_0``:
#: ``2^-2.5 ... 2^2.5 sigma_0`` in half octaves.  scikit-learn's ``gamma="scale"`` is
#: ``1 / (2 sigma_0^2)``, and a grid search over ``gamma = 2^-4 ... 2^4`` times it (the usual
#: tuned RBF SVC) spans ``2^-2 ... 2^2 sigma_0``: every width it can pick lies inside this grid.
SCALED_EXPONENTS = tuple(k / 2.0 for k in range(-5, 6))


def _features_tuple(features) -> tuple[int, ...] | None:
    if features is None:
        return None
    if isinstance(features, (int, np.integer)):
        features = (features,)
    out = tuple(sorted({int(f) for f in features}))
    if not out:
        raise ValueError("a kernel's feature subset must not be empty")
    if out[0] < 0:
        raise ValueError(f"feature indices must be >= 0, got {out[0]}")
    return out


#: Largest polynomial degree: each kernel value is ``degree`` multiplications.
MAX_DEGREE = 100
#: Most kernels of a random bank: each costs a few numbers per iteration (the benchmarks use up to 10^6).
MAX_BANK_KERNELS = 10**8
#: Gaussian widths accepted: ``gamma = 1 / (2 sigma^2)`` stays a normal, finite float.
SIGMA_RANGE = (1e-100, 1e100)


def _check_sigma(sigma, what: str) -> None:
    """``sigma`` a number in :data:`SIGMA_RANGE`, else a ``ValueError`` saying so."""
    lo, hi = SIGMA_RANGE
    try:
        ok = lo <= float(sigma) <= hi
    except (TypeError, ValueError, OverflowError):
        ok = False
    if not ok:
        raise ValueError(f"{what} must be a positive number from {lo:g} to {hi:g}, got {sigma!r}")


@dataclass(frozen=True)
class KernelSpec:
    """Base class of the closed-form kernels; ``features=None`` means all features."""

    # Keyword-only so that Gaussian(2.0) and Polynomial(3) set sigma and degree.
    features: tuple[int, ...] | None = field(default=None, kw_only=True)

    kind = -1

    def __post_init__(self):
        object.__setattr__(self, "features", _features_tuple(self.features))

    def _params(self) -> tuple[float, float]:
        raise NotImplementedError

    def _feature_suffix(self) -> str:
        if self.features is None:
            return ""
        return "@" + _format_ranges(self.features)


@dataclass(frozen=True)
class Linear(KernelSpec):
    """Linear kernel ``x . z``."""

    kind = LINEAR

    def _params(self):
        return 0.0, 0.0

    def __str__(self):
        return "linear" + self._feature_suffix()


@dataclass(frozen=True)
class Polynomial(KernelSpec):
    """Polynomial kernel ``(x . z + coef0) ** degree``."""

    degree: int = 2
    coef0: float = 1.0
    kind = POLYNOMIAL

    def __post_init__(self):
        super().__post_init__()
        if int(self.degree) != self.degree or not 1 <= self.degree <= MAX_DEGREE:
            # Bounded: a kernel value is `degree` multiplications (the same bits on every device).
            raise ValueError(f"polynomial degree must be a positive integer, at most {MAX_DEGREE}, got {self.degree!r}")
        if not np.isfinite(self.coef0):
            raise ValueError(f"polynomial coef0 must be finite, got {self.coef0!r}")
        object.__setattr__(self, "degree", int(self.degree))
        object.__setattr__(self, "coef0", float(self.coef0))

    def _params(self):
        return float(self.degree), self.coef0

    def __str__(self):
        extra = "" if self.coef0 == 1.0 else f":coef0={format_number(self.coef0)}"
        return f"poly:{self.degree}{extra}" + self._feature_suffix()


@dataclass(frozen=True)
class Gaussian(KernelSpec):
    """Gaussian kernel ``exp(-|x - z|^2 / (2 sigma^2))``."""

    sigma: float = 1.0
    kind = GAUSSIAN

    def __post_init__(self):
        super().__post_init__()
        _check_sigma(self.sigma, "gaussian sigma")
        object.__setattr__(self, "sigma", float(self.sigma))

    @property
    def gamma(self) -> float:
        return 1.0 / (2.0 * self.sigma**2)

    def _params(self):
        return self.gamma, 0.0

    def __str__(self):
        return f"gaussian:{format_number(self.sigma)}" + self._feature_suffix()


#: Largest |k| of the exponents k / 4 that :func:`format_number` writes as ``2^(k/4)``.
_MAX_QUARTER_EXPONENT = 4 * 64


def format_number(value: float) -> str:
    """A short text for ``value`` that :func:`parse_number` reads back as the identical float.

    The decimal form (12 significant digits when they round-trip, e.g. ``"0.5"``, ``"3"``, else
    ``repr``), or ``"2^0.5"`` when ``value`` is a power of two with an exponent in quarters (the
    paper's Gaussian widths are ``2 ** (k / 2)``) and that is shorter.
    """
    value = float(value)
    text = f"{value:.12g}"
    if float(text) != value:
        text = repr(value)
    if value > 0 and math.isfinite(value):
        k = round(4.0 * math.log2(value))
        power = f"2^{k / 4:g}"
        if abs(k) <= _MAX_QUARTER_EXPONENT and 2.0 ** (k / 4) == value and len(power) < len(text):
            return power
    return text


def parse_number(text: str) -> float:
    """A float from ``text``: a decimal number, or ``B^E`` for ``float(B) ** float(E)`` (e.g. ``2^0.5``).

    Raises ``ValueError`` when ``text`` is neither.
    """
    base, caret, exponent = text.strip().partition("^")
    if not caret:
        return float(base)
    try:
        return float(base) ** float(exponent)
    except OverflowError:
        raise ValueError(f"{text!r} overflows a float") from None


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """Vectorised splitmix64 finaliser: a counter-based hash (no state to store)."""
    with np.errstate(over="ignore"):
        z = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


@dataclass(frozen=True)
class RandomGaussianBank:
    """A seeded bank of Gaussian kernels on random feature subsets.

    Kernel ``i`` is a pure function of ``(seed, i)``: its subset is the
    ``subset_size`` features with the smallest hash ``h(seed, i, f)`` and its
    bandwidth is one of ``sigmas`` picked by another hash, so a bank of a
    million kernels needs no storage and any block of it can be rebuilt on
    any worker.
    """

    n_kernels: int
    subset_size: int = 2
    seed: int = 0
    sigmas: tuple[float, ...] = PAPER_SIGMAS

    def __post_init__(self):
        if int(self.n_kernels) != self.n_kernels or not 1 <= self.n_kernels <= MAX_BANK_KERNELS:
            raise ValueError(
                f"n_kernels must be a positive integer, at most {MAX_BANK_KERNELS:.0e}, got {self.n_kernels!r}"
            )
        if int(self.seed) != self.seed or not 0 <= self.seed < 2**64:
            raise ValueError(f"seed must be an integer from 0 to 2^64 - 1, got {self.seed!r}")
        if int(self.subset_size) != self.subset_size or self.subset_size < 1:
            raise ValueError(f"subset_size must be a positive integer, got {self.subset_size!r}")
        if not self.sigmas:
            raise ValueError("sigmas must be positive finite numbers")
        for s in self.sigmas:
            _check_sigma(s, "random bank sigma")
        object.__setattr__(self, "sigmas", tuple(float(s) for s in self.sigmas))

    def block(self, start: int, stop: int, n_features: int) -> tuple[np.ndarray, np.ndarray]:
        """Feature subsets ``(stop-start, k)`` and sigmas of kernels ``start..stop-1``."""
        k = min(self.subset_size, n_features)
        ids = np.arange(start, stop, dtype=np.uint64)
        key = _splitmix64(np.uint64(self.seed) * np.uint64(0x100000001B3) + ids)
        feats = np.arange(n_features, dtype=np.uint64)
        h = _splitmix64(key[:, None] ^ _splitmix64(feats + np.uint64(0xABCDEF))[None, :])
        # A row's hashes are distinct (splitmix64 and xor by one key are bijections): its k smallest are one set,
        # which a partial sort finds (about 5 times quicker than sorting the row, as the bank's definition reads).
        subsets = np.sort(np.argpartition(h, k - 1, axis=1)[:, :k], axis=1)
        sig = np.asarray(self.sigmas)[_splitmix64(key ^ np.uint64(0x5DEECE66D)) % np.uint64(len(self.sigmas))]
        return subsets.astype(np.int64), sig

    def specs(self, n_features: int) -> list[Gaussian]:
        subsets, sig = self.block(0, self.n_kernels, n_features)
        return [Gaussian(sigma=float(s), features=tuple(f)) for f, s in zip(subsets, sig)]

    def __str__(self):
        widths = ":widths=paper" if self.sigmas == PAPER_SIGMAS else ""  # the string form's default is scaled
        return f"random:{self.n_kernels}:size={self.subset_size}:seed={self.seed}{widths}"


def bank_widths(scale: DataScale, subset_size: int) -> tuple[float, ...]:
    """The widths of a data-scaled random bank: :data:`BANK_EXPONENTS` powers of two times ``sigma_k``.

    ``sigma_k = sqrt(k var / 2)`` is ``gamma="scale"``'s width on ``k`` of the data's features
    (``k = min(subset_size, d)``, ``var`` the variance of all the training values): every subset
    has the same widths, so the bank's squaring chains (widths ``sqrt(2)`` apart) and its
    one exponential per distinct (subset, width) stay.
    """
    d = len(scale.sums)
    sigma_k = scale.sigma() * math.sqrt(min(int(subset_size), d) / d)
    return tuple(float(sigma_k * 2.0**e) for e in BANK_EXPONENTS)


def paper_family(features=None) -> list[KernelSpec]:
    """The paper's 12 kernels: polynomial degrees 1-3 and 9 Gaussian bandwidths."""
    return [Polynomial(degree=d, features=features) for d in PAPER_DEGREES] + [
        Gaussian(sigma=s, features=features) for s in PAPER_SIGMAS
    ]


def paper_per_feature_family(n_features: int) -> list[KernelSpec]:
    """The paper's 12 kernels on every single feature (``12 * n_features`` kernels)."""
    out: list[KernelSpec] = []
    for f in range(n_features):
        out.extend(paper_family(features=(f,)))
    return out


class FeatureSums(Sequence):
    """Per-feature values (exact integers), zero but in the features given: a tuple's interface in
    memory that follows the features used, not the largest feature index (10^7 in a sparse file)."""

    __slots__ = ("n", "values")

    def __init__(self, n: int, values: dict):
        self.n, self.values = int(n), {int(f): v for f, v in values.items() if v}

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, f):
        if isinstance(f, slice):
            return tuple(self)[f]
        f = int(f) + (self.n if f < 0 else 0)
        if not 0 <= f < self.n:
            raise IndexError(f"feature {f} out of range for {self.n} features")
        return self.values.get(f, 0)

    def __iter__(self):
        return (self.values.get(f, 0) for f in range(self.n))

    def nonzero(self) -> list:
        """The non-zero values (in no particular order)."""
        return list(self.values.values())

    def __eq__(self, other):
        if isinstance(other, FeatureSums):
            return self.n == other.n and self.values == other.values
        return isinstance(other, Sequence) and len(other) == self.n and all(a == b for a, b in zip(self, other))

    def __hash__(self):
        return hash((self.n, frozenset(self.values.items())))

    def __repr__(self):
        return f"FeatureSums({self.n}, {len(self.values)} non-zero)"


def _nonzero(values) -> list:
    return values.nonzero() if isinstance(values, FeatureSums) else list(filter(None, values))


@dataclass(frozen=True)
class DataScale:
    """The training data's scale, from exact per-feature sums of ``x`` and ``x^2`` over ``n_samples`` rows.

    :meth:`sigma` is the Gaussian width ``sigma_0 = sqrt(d var / 2)`` of scikit-learn's
    ``gamma="scale"`` (``1 / (d var)``, ``var`` the variance of all the ``n d`` values) on the
    ``d`` features a kernel reads. The sums are exact (:mod:`mwumkl_dist.core.exact`), so the
    widths do not depend on the input's representation (dense, CSR, a store) or its chunking.
    """

    n_samples: int
    sums: Sequence  # per feature: exact sum of x, in units of 2**-SHIFT (Python ints; a tuple or FeatureSums)
    squares: Sequence  # per feature: exact sum of x^2, likewise
    #: The median distance from a training row to its nearest neighbour (on all features, over a
    #: fixed sample of rows); None when not measured.
    neighbour_distance: float | None = None

    def sigma(self, features=None) -> float:
        """``sigma_0`` of the features (all when None); 1.0 where the values are constant."""
        if features is None:
            # All features: C-level sums of the non-zero totals (one large feature index makes d large, and adding
            # a 0 to a big exact int still copies it).
            n_feats = len(self.sums)
            total, total_sq = exact_to_float([sum(_nonzero(self.sums)), sum(_nonzero(self.squares))])
        else:
            n_feats = len(features)
            total, total_sq = exact_to_float(
                [sum(self.sums[f] for f in features), sum(self.squares[f] for f in features)]
            )
        count = float(self.n_samples) * n_feats
        var = total_sq / count - (total / count) ** 2
        if not (np.isfinite(var) and var > 0):
            return 1.0  # constant features: every width gives the same (constant) kernel
        return float(np.sqrt(n_feats * var / 2.0))


#: A Gaussian narrower than this fraction of the median nearest-neighbour distance gives a row and its
#: nearest neighbour a similarity below 0.1 (``1 / sqrt(2 ln 10)``): on the training rows it is nearly
#: the identity, which the trace-normalised margins reward and which cannot generalise.  The scaled
#: family leaves such widths out.  German credit (24 features, 750 rows, 5 splits): 28.5 % test error
#: with them, 24.9 % without (the paper's family: 24.7 %); sonar 10.0 % and 8.9 %.
MEMORISING_WIDTH = 1.0 / math.sqrt(2.0 * math.log(10.0))


def scaled_family(scale: float, features=None, neighbour_distance: float | None = None) -> list[KernelSpec]:
    """The scaled family: polynomial degrees 1-3 and Gaussians of widths :data:`SCALED_EXPONENTS` times ``scale``.

    With ``neighbour_distance`` (the data's median nearest-neighbour distance), widths below
    :data:`MEMORISING_WIDTH` times it are left out (the narrowest is always kept).
    """
    widths = [scale * 2.0**e for e in SCALED_EXPONENTS]
    if neighbour_distance is not None:
        floor = MEMORISING_WIDTH * neighbour_distance
        widths = [w for w in widths if w >= floor] or widths[-1:]
    return [Polynomial(degree=d, features=features) for d in PAPER_DEGREES] + [
        Gaussian(sigma=w, features=features) for w in widths
    ]


def scaled_per_feature_family(scale: DataScale) -> list[KernelSpec]:
    """The scaled family on every single feature, each at that feature's own scale."""
    out: list[KernelSpec] = []
    for f in range(len(scale.sums)):
        out.extend(scaled_family(scale.sigma((f,)), features=(f,)))
    return out


# ----------------------------------------------------------------------------- the structure search's kernels
#
# ``kernels="auto"`` (the default) is the scaled family on all features plus a search for structure: a Gaussian
# with one width per feature, fitted on a sample of the rows, says which features are relevant, and they get a
# model of their own (see :mod:`mwumkl_dist.solvers.structure`); cross-validation decides whether it is kept.

#: The default ``kernels``: the scaled family on all features, and the search for feature-subset structure.
AUTO_KERNELS = "auto"

#: Widths of every kernel on a feature subset of a structured model, as powers of two times the subset's own
#: scale ``sigma_S`` (:meth:`DataScale.sigma` of its features): half an octave either side, so one exponential and
#: two squarings per subset and column (a squaring chain, see :class:`KernelSet`).
SUBSET_EXPONENTS = (-0.5, 0.0, 0.5)
#: Above this many features the structure is not searched (the relevance fit's cost grows with the features).
SCREEN_MAX_FEATURES = 1000


def searches_structure(kernels) -> bool:
    """Whether the ``kernels`` parameter asks for the structure search (:data:`AUTO_KERNELS`)."""
    return isinstance(kernels, str) and kernels.strip().lower() == AUTO_KERNELS


def subset_kernels(scale: DataScale, features, exponents=SUBSET_EXPONENTS) -> list[Gaussian]:
    """Gaussians on ``features`` at widths ``2^e sigma_S`` for ``e`` in ``exponents`` (``sigma_S``: their scale)."""
    features = tuple(int(f) for f in features)
    sigma = scale.sigma(features)
    return [Gaussian(sigma=sigma * 2.0**e, features=features) for e in exponents]


# ----------------------------------------------------------------------------- parsing

_ITEM = re.compile(r"^(?P<name>[a-z][a-z0-9_-]*)(?P<params>(:[^@:]+)*)(@(?P<feats>[0-9+\-]+))?$")


def _format_ranges(features: Sequence[int]) -> str:
    parts, i = [], 0
    feats = list(features)
    while i < len(feats):
        j = i
        while j + 1 < len(feats) and feats[j + 1] == feats[j] + 1:
            j += 1
        parts.append(str(feats[i]) if i == j else f"{feats[i]}-{feats[j]}")
        i = j + 1
    return "+".join(parts)


def _parse_ranges(text: str, item: str, n_features: int | None = None) -> tuple[int, ...]:
    """The features of ``@FEATURES``; every index below ``n_features``, checked before the list is built.

    ``n_features`` None checks the syntax only: the parts' end points are returned, not the whole list
    (``@0-10000000000`` would be ten billion integers).
    """
    parts = []
    for part in text.split("+"):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise ValueError(f"bad feature list {text!r} in kernel spec {item!r}: use e.g. 0-4+7")
        a = int(m.group(1))
        b = int(m.group(2)) if m.group(2) else a
        if b < a:
            raise ValueError(f"bad feature range {part!r} in kernel spec {item!r}")
        if n_features is not None and b >= n_features:
            raise ValueError(f"kernel {item!r} uses feature {b} but the data has {n_features} features")
        parts.append((a, b))
    if n_features is None:
        return tuple(sorted({x for ab in parts for x in ab}))
    out = []
    for a, b in parts:
        out.extend(range(a, b + 1))
    return tuple(out)


def _parse_params(params: str, item: str) -> tuple[list[str], dict[str, str]]:
    positional, named = [], {}
    for p in [p for p in params.split(":") if p]:
        if "=" in p:
            k, v = p.split("=", 1)
            named[k.strip()] = v.strip()
        else:
            positional.append(p.strip())
    return positional, named


def _num(text: str, item: str, cast=parse_number):
    try:
        return cast(text)
    except ValueError:
        raise ValueError(f"bad number {text!r} in kernel spec {item!r}") from None


def parse_kernels(text: str, n_features: int | None, scale: Callable[[], DataScale] | None = None) -> list:
    """Parse a kernel spec string (see ``KERNEL_SPEC_HELP``) into specs and banks.

    ``scale`` gives the training data's :class:`DataScale` (called only for the scaled families).
    Feature indices are checked against ``n_features``; None checks the syntax only (the specs
    returned then stand for the spec's form, not for kernels on any data).
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"empty kernel spec; expected {KERNEL_SPEC_HELP}")
    out: list = []
    for raw in text.split(","):
        item = raw.strip().lower()
        m = _ITEM.match(item)
        if not m:
            raise ValueError(f"cannot parse kernel spec {raw!r}; expected {KERNEL_SPEC_HELP}")
        name = m.group("name")
        pos, named = _parse_params(m.group("params") or "", item)
        feats = _parse_ranges(m.group("feats"), item, n_features) if m.group("feats") else None
        if name == AUTO_KERNELS:
            if pos or named or feats is not None:
                raise ValueError(f"kernel spec {raw!r}: 'auto' takes no parameters or feature list")
            name = "scaled"
        if name in ("scaled", "scaled-per-feature"):
            _no_params(pos, named, item)
            if scale is None:
                raise ValueError(f"kernels {name!r} take their widths from the training data; give concrete kernels")
            if name == "scaled":
                data = scale()
                nn = data.neighbour_distance if feats is None else None  # measured on all the features
                out.extend(scaled_family(data.sigma(feats), features=feats, neighbour_distance=nn))
            elif feats is not None:
                raise ValueError(f"'scaled-per-feature' takes no feature list (in {raw!r})")
            else:
                out.extend(scaled_per_feature_family(scale()))
        elif name == "paper":
            _no_params(pos, named, item)
            out.extend(paper_family(features=feats))
        elif name == "paper-per-feature":
            _no_params(pos, named, item)
            if feats is not None:
                raise ValueError(f"'paper-per-feature' takes no feature list (in {raw!r})")
            out.extend(paper_per_feature_family(1 if n_features is None else n_features))
        elif name == "linear":
            _no_params(pos, named, item)
            out.append(Linear(features=feats))
        elif name in ("poly", "polynomial"):
            if len(pos) != 1 or set(named) - {"coef0"}:
                raise ValueError(f"kernel spec {raw!r}: expected 'poly:DEGREE[:coef0=C]'")
            out.append(
                Polynomial(
                    degree=_num(pos[0], item, int),
                    coef0=_num(named.get("coef0", "1"), item),
                    features=feats,
                )
            )
        elif name in ("gaussian", "rbf"):
            if len(pos) != 1 or named:
                raise ValueError(f"kernel spec {raw!r}: expected 'gaussian:SIGMA'")
            out.append(Gaussian(sigma=_num(pos[0], item), features=feats))
        elif name == "random":
            if feats is not None:
                raise ValueError(f"kernel spec {raw!r}: expected 'random:COUNT[:size=K][:seed=S][:widths=W]'")
            out.append(_random_bank(pos, named, raw, scale))
        else:
            raise ValueError(f"unknown kernel {name!r} in spec {raw!r}; expected {KERNEL_SPEC_HELP}")
    return out


def _random_bank(pos: list, named: dict, raw: str, scale) -> RandomGaussianBank:
    """The bank of a ``random:COUNT[:size=K][:seed=S][:widths=W]`` item ``raw`` (see :func:`parse_kernels`)."""
    item = raw.strip().lower()
    widths = named.get("widths", "scaled")
    if len(pos) != 1 or set(named) - {"size", "seed", "widths"}:
        raise ValueError(f"kernel spec {raw!r}: expected 'random:COUNT[:size=K][:seed=S][:widths=W]'")
    if widths not in ("scaled", "paper"):
        raise ValueError(f"kernel spec {raw!r}: widths must be 'scaled' (the default) or 'paper'")
    bank = RandomGaussianBank(
        n_kernels=_num(pos[0], item, int),
        subset_size=_num(named.get("size", "2"), item, int),
        seed=_num(named.get("seed", "0"), item, int),
    )
    if widths == "scaled":
        if scale is None:
            raise ValueError(
                f"kernel spec {raw!r}: a random bank takes its widths from the training data; give concrete "
                "kernels, 'widths=paper', or a RandomGaussianBank with its sigmas"
            )
        bank = replace(bank, sigmas=bank_widths(scale(), bank.subset_size))
    return bank


def _no_params(pos, named, item):
    if pos or named:
        raise ValueError(f"kernel spec {item!r} takes no parameters")


# ----------------------------------------------------------------------------- plan


@dataclass
class KernelPlan:
    """Flat arrays describing ``m`` kernels over ``G`` feature groups (for numba).

    ``kind[i]``, ``param_a[i]`` (degree or gamma), ``param_b[i]`` (coef0) and
    ``group[i]`` describe kernel ``i``.  ``feat_ptr``/``feat_groups`` map each
    feature to the groups containing it (CSR), so one pass over a row's
    non-zeros accumulates every group's inner products.  ``square_of[i]`` is
    ``j >= 0`` when kernel ``i`` is Gaussian with twice kernel ``j``'s gamma
    on the same group: its value is then ``K_j ** 2`` (one ``exp`` per chain);
    ``order`` evaluates chain sources first.
    """

    kind: np.ndarray
    param_a: np.ndarray
    param_b: np.ndarray
    group: np.ndarray
    square_of: np.ndarray
    order: np.ndarray
    feat_ptr: np.ndarray
    feat_groups: np.ndarray
    n_groups: int
    n_features: int
    #: ``(bank, n_features, start, stop)`` for a plan built by :func:`bank_plan`: it is pickled as
    #: that and rebuilt where it is unpickled (a Dask worker), not shipped as ``O(m)`` arrays.
    source: tuple | None = field(default=None, repr=False, compare=False)

    @property
    def n_kernels(self) -> int:
        return len(self.kind)

    def __reduce__(self):
        if self.source is not None:
            return bank_plan, self.source
        return KernelPlan, tuple(getattr(self, f.name) for f in fields(self))


class KernelSet:
    """An ordered set of base kernels for data with ``n_features`` features.

    Parameters
    ----------
    kernels : str, KernelSpec, RandomGaussianBank or sequence of those
        See :func:`parse_kernels` for the string form.
    n_features : int
        Number of input features the kernels act on.
    scale : callable, optional
        Returns the training data's :class:`DataScale`; needed by the scaled families (called once, when used).

    Exactly one random bank (alone, as its spec string or as a one-item list)
    keeps ``bank`` and builds its plan with :func:`bank_plan`; ``specs`` and
    :meth:`names` then generate the kernels on demand.  Anything else is
    expanded into specs (a bank among other kernels included) and compiled.
    """

    def __init__(self, kernels, n_features: int, scale: Callable[[], DataScale] | None = None):
        if int(n_features) != n_features or n_features < 1:
            raise ValueError(f"n_features must be a positive integer, got {n_features!r}")
        self.n_features = int(n_features)
        scale = None if scale is None else functools.cache(scale)  # called once, by the first scaled family
        #: The random bank when the set is exactly one (its specs are then generated on demand).
        self.bank: RandomGaussianBank | None = bank_of(kernels, scale)
        listed = [k for k in _listed(kernels) if isinstance(k, RandomGaussianBank)]
        for bank in [self.bank] if self.bank is not None else listed:
            if bank.subset_size > self.n_features:  # said, not cut to the data's width without a word
                warnings.warn(
                    f"random bank {bank}: subset size {bank.subset_size} is more than the data's {self.n_features} "
                    f"features: every kernel uses all {self.n_features} (give size={self.n_features} or less)",
                    UserWarning,
                    stacklevel=2,
                )
        #: The training data's scale when a scaled family or bank used it (None otherwise).
        self.scale: DataScale | None = None
        if self.bank is not None:
            self.scale = scale() if scale is not None and scale.cache_info().currsize else None
            self.specs: Sequence[KernelSpec] = _BankSpecs(self.bank, self.n_features)
            self._plan = bank_plan(self.bank, self.n_features)
            return
        self.specs = self._expand(kernels, scale)
        self.scale = scale() if scale is not None and scale.cache_info().currsize else None
        if not self.specs:
            raise ValueError("the kernel set is empty")
        for spec in self.specs:
            if spec.features is not None and spec.features[-1] >= self.n_features:
                raise ValueError(
                    f"kernel {spec} uses feature {spec.features[-1]} but the data has {self.n_features} features"
                )
        self._plan = None  # compiled when first used: O(n_features), which a compact set avoids (compacted)

    @property
    def plan(self) -> KernelPlan:
        """The compiled :class:`KernelPlan` (built on first use)."""
        if self._plan is None:
            self._plan = self._compile()
        return self._plan

    @plan.setter
    def plan(self, value: KernelPlan) -> None:
        self._plan = value

    def compacted(self, used) -> KernelSet | None:
        """The same kernels on the features ``used`` alone (sorted, distinct), renumbered ``0..len(used)-1``.

        Rows that store values in the ``used`` features only get the same kernel values from the
        compact set on their columns ``used`` as from this set on all columns: a feature zero in
        both rows adds nothing to a dot product or a distance.  ``used`` must hold every feature a
        kernel names (:meth:`named_features`).  None for a random bank (its subsets are drawn
        over all features).
        """
        if self.bank is not None:
            return None
        used = np.asarray(used, dtype=np.int64)
        position = {int(f): i for i, f in enumerate(used)} if len(used) <= 1 << 20 else None
        specs = []
        for spec in self.specs:
            if spec.features is None:
                specs.append(spec)
                continue
            if position is None:
                return None
            specs.append(replace(spec, features=tuple(position[f] for f in spec.features)))
        return KernelSet(specs, max(len(used), 1))

    def named_features(self) -> np.ndarray:
        """The features some kernel names (its ``@FEATURES``), sorted: a compact set must keep them."""
        named = {f for spec in self.specs if spec.features is not None for f in spec.features}
        return np.asarray(sorted(named), dtype=np.int64)

    def _expand(self, kernels, scale=None) -> list[KernelSpec]:
        if isinstance(kernels, str):
            kernels = parse_kernels(kernels, self.n_features, scale)
        elif isinstance(kernels, (KernelSpec, RandomGaussianBank)):
            kernels = [kernels]
        if not isinstance(kernels, Iterable):
            raise TypeError(
                f"kernels must be a spec string, a KernelSpec or a list of them, got {type(kernels).__name__}"
            )
        out: list[KernelSpec] = []
        for k in kernels:
            if isinstance(k, RandomGaussianBank):
                out.extend(k.specs(self.n_features))
            elif isinstance(k, KernelSpec) and type(k) is not KernelSpec:
                out.append(k)
            elif isinstance(k, str):
                out.extend(self._expand(k, scale))
            else:
                raise TypeError(f"not a kernel spec: {k!r}")
        return out

    def __len__(self):
        return len(self.specs)

    def __iter__(self):
        return iter(self.specs)

    def names(self) -> Sequence[str]:
        """The kernels' spec strings (a bank's: a :class:`BankKernelNames`, generated on demand)."""
        if self.bank is not None:
            return BankKernelNames(self.bank, self.n_features)
        return [str(s) for s in self.specs]

    def block_plan(self, start: int, stop: int) -> KernelPlan:
        """The plan of kernels ``[start, stop)`` alone: ``KernelSet(self.specs[start:stop], n_features).plan``."""
        start, stop = int(start), int(stop)
        if (start, stop) == (0, len(self)):
            return self.plan
        if self.bank is not None:
            return bank_plan(self.bank, self.n_features, start, stop)
        return KernelSet(list(self.specs[start:stop]), self.n_features).plan

    def _compile(self) -> KernelPlan:
        d = self.n_features
        group_ids: dict[tuple[int, ...] | None, int] = {}
        group_feats: list[Sequence[int]] = []
        m = len(self.specs)
        kind = np.empty(m, np.int64)
        pa = np.empty(m)
        pb = np.empty(m)
        grp = np.empty(m, np.int64)
        for i, spec in enumerate(self.specs):
            key = spec.features
            if key not in group_ids:
                group_ids[key] = len(group_feats)
                group_feats.append(range(d) if key is None else key)
            grp[i] = group_ids[key]
            kind[i] = spec.kind
            pa[i], pb[i] = spec._params()
        # Gaussian squaring chains: gamma_i == 2 gamma_j on one group => K_i = K_j ** 2.
        # Compared to ~1e-12 relative, not exactly: for the paper's sigmas 2^(k/2) the
        # computed gammas are an ulp off exact doubles.
        square_of = np.full(m, -1, np.int64)
        by_key: dict[tuple[int, float], int] = {}
        for i in np.flatnonzero(kind == GAUSSIAN):
            by_key.setdefault((int(grp[i]), round(math.log2(pa[i]), 12)), int(i))
        for i in np.flatnonzero(kind == GAUSSIAN):
            src = by_key.get((int(grp[i]), round(math.log2(pa[i]) - 1.0, 12)))
            if src is not None and src != i and abs(2.0 * pa[src] - pa[i]) <= 1e-12 * pa[i]:
                square_of[i] = src
        order = _chain_order(square_of)
        # feature -> its groups (CSR, groups ascending within a feature), in numpy: O(d) at C speed, so a
        # data set with one large feature index does not spend seconds here.
        feats = [np.asarray(f, dtype=np.int64) if not isinstance(f, range) else np.arange(d) for f in group_feats]
        sizes = np.array([len(f) for f in feats], dtype=np.int64)
        flat = np.concatenate(feats) if feats else np.zeros(0, np.int64)
        groups = np.repeat(np.arange(len(feats), dtype=np.int64), sizes)
        counts = np.zeros(d + 1, np.int64)
        counts[1:] = np.bincount(flat, minlength=d)
        feat_ptr = np.cumsum(counts)
        feat_groups = groups[np.argsort(flat, kind="stable")]  # stable: a feature's groups stay ascending
        return KernelPlan(kind, pa, pb, grp, square_of, order, feat_ptr, feat_groups, len(group_feats), d)

    def __repr__(self):
        return f"KernelSet({len(self)} kernels, {self.plan.n_groups} feature groups, n_features={self.n_features})"


def _chain_order(square_of: np.ndarray) -> np.ndarray:
    """An evaluation order in which every chain source precedes its squares.

    Kernels sorted (stably) by their depth in their chain, the number of
    ``square_of`` links down to the chain's source.
    """
    square_of = np.asarray(square_of, dtype=np.int64)
    depth = np.zeros(len(square_of), np.int64)
    cur = square_of.copy()
    active = np.flatnonzero(cur >= 0)
    while len(active):  # one round per chain level (at most the number of distinct gammas)
        depth[active] += 1
        cur[active] = square_of[cur[active]]
        active = active[cur[active] >= 0]
    return np.argsort(depth, kind="stable").astype(np.int64)


def _feature_groups(group_feats: np.ndarray, n_features: int) -> tuple[np.ndarray, np.ndarray]:
    """``(feat_ptr, feat_groups)``: the groups holding each feature (CSR), groups ascending within a feature.

    ``group_feats`` is ``(n_groups, k)``: group ``g``'s sorted features.
    """
    n_groups, k = group_feats.shape
    feats = group_feats.ravel().astype(np.int64)
    counts = np.zeros(n_features + 1, np.int64)
    counts[1:] = np.bincount(feats, minlength=n_features)
    feat_ptr = np.cumsum(counts)
    groups = np.repeat(np.arange(n_groups, dtype=np.int64), k)
    small = np.int16 if n_features < 2**15 else np.int64  # numpy's stable sort is a radix sort on 16-bit keys
    feat_groups = groups[np.argsort(feats.astype(small), kind="stable")]
    return feat_ptr, feat_groups


# ----------------------------------------------------------------------------- random banks as plans

#: Kernels generated per call of :meth:`RandomGaussianBank.block` (bounds its ``(block, d)`` hash matrix).
_GEN_BLOCK = 1 << 15


def _listed(kernels) -> list:
    """The items of ``kernels`` given as objects (a list, or one object); spec strings are checked when parsed."""
    return list(kernels) if isinstance(kernels, (list, tuple)) else [kernels]


def bank_of(kernels, scale: Callable[[], DataScale] | None = None) -> RandomGaussianBank | None:
    """The bank when ``kernels`` is exactly one random bank (object, spec string or one-item list), else None.

    A spec string with data-scaled widths (the default) needs ``scale``, as :func:`parse_kernels` does.
    """
    if isinstance(kernels, RandomGaussianBank):
        return kernels
    if isinstance(kernels, str) and kernels.strip().lower().startswith("random:") and "," not in kernels:
        parsed = parse_kernels(kernels, 1, scale)
        if len(parsed) == 1 and isinstance(parsed[0], RandomGaussianBank):
            return parsed[0]
    if isinstance(kernels, (list, tuple)) and len(kernels) == 1:
        return bank_of(kernels[0], scale)
    return None


def _bank_tables(bank: RandomGaussianBank, n_features: int, start: int, stop: int):
    """Subsets ``(m, k)`` (int32) and sigmas ``(m,)`` of kernels ``[start, stop)``, generated block by block."""
    k = min(bank.subset_size, n_features)
    subsets = np.empty((stop - start, k), np.int32)
    sigmas = np.empty(stop - start)
    for a in range(start, stop, _GEN_BLOCK):
        b = min(stop, a + _GEN_BLOCK)
        subsets[a - start : b - start], sigmas[a - start : b - start] = bank.block(a, b, n_features)
    return subsets, sigmas


def _first_appearance(subsets: np.ndarray, n_features: int) -> tuple[np.ndarray, np.ndarray]:
    """``(group, first)``: each row's distinct-row id (numbered in order of first appearance), each id's first row."""
    m, k = subsets.shape
    if k * math.log2(max(n_features, 2)) < 62:
        code = np.zeros(m, np.int64)  # one int64 per subset: sorting codes is much faster than unique(axis=0)
        for t in range(k):
            code = code * n_features + subsets[:, t]
        _, first, inverse = np.unique(code, return_index=True, return_inverse=True)
    else:
        _, first, inverse = np.unique(subsets, axis=0, return_index=True, return_inverse=True)
    by_first = np.argsort(first, kind="stable")
    rank = np.empty(len(first), np.int64)
    rank[by_first] = np.arange(len(first))
    return rank[inverse.ravel()], first[by_first]


def _square_sources(group: np.ndarray, gamma: np.ndarray) -> np.ndarray:
    """``square_of`` of Gaussians with these groups and gammas, as :meth:`KernelSet._compile` finds it.

    The source of kernel ``i`` is the first kernel of its group whose
    ``round(log2 gamma, 12)`` is ``round(log2 gamma_i - 1, 12)``, kept when
    ``|2 gamma_src - gamma_i| <= 1e-12 gamma_i``; vectorised over the (few)
    distinct gammas.
    """
    m = len(gamma)
    square_of = np.full(m, -1, np.int64)
    values, value_of = np.unique(gamma, return_inverse=True)
    value_of = value_of.ravel()
    keys = [round(math.log2(float(v)), 12) for v in values]
    key_ids = {key: i for i, key in enumerate(dict.fromkeys(keys))}
    n_keys = len(key_ids)
    key_of_value = np.array([key_ids[key] for key in keys], np.int64)
    target_of_value = np.array([key_ids.get(round(math.log2(float(v)) - 1.0, 12), -1) for v in values], np.int64)
    target = target_of_value[value_of]
    wanted = np.flatnonzero(target >= 0)
    if not len(wanted):
        return square_of
    codes, first = np.unique(group * n_keys + key_of_value[value_of], return_index=True)
    look = group[wanted] * n_keys + target[wanted]
    pos = np.minimum(np.searchsorted(codes, look), len(codes) - 1)
    found = codes[pos] == look
    i, src = wanted[found], first[pos[found]]
    ok = np.abs(2.0 * gamma[src] - gamma[i]) <= 1e-12 * gamma[i]
    square_of[i[ok]] = src[ok]
    return square_of


def bank_plan(bank: RandomGaussianBank, n_features: int, start: int = 0, stop: int | None = None) -> KernelPlan:
    """The :class:`KernelPlan` of kernels ``[start, stop)`` of a bank, built from its tables.

    Equal, array for array, to ``KernelSet([Gaussian(sigma, features=subset) ...], n_features).plan``
    of the same kernels (groups are the distinct subsets in order of first
    appearance, gammas are :attr:`Gaussian.gamma`, squaring chains and the
    evaluation order found as :meth:`KernelSet._compile` finds them), built
    with array operations: ``O(m * subset_size)`` memory, never ``m`` spec
    objects.  Cached (the few most recent): the driver and the shards of one
    process share a plan; do not modify the arrays of the plan returned.
    """
    stop = bank.n_kernels if stop is None else int(stop)
    if not 0 <= int(start) < stop <= bank.n_kernels:
        raise ValueError(f"kernel block ({start}, {stop}) is outside the bank's {bank.n_kernels} kernels")
    return _bank_plan(bank, int(n_features), int(start), stop)


@functools.lru_cache(maxsize=4)
def _bank_plan(bank: RandomGaussianBank, n_features: int, start: int, stop: int) -> KernelPlan:
    subsets, sigmas = _bank_tables(bank, n_features, start, stop)
    m = stop - start
    distinct = sorted(set(bank.sigmas))
    gammas = np.array([Gaussian(sigma=s).gamma for s in distinct])  # bit-identical to the specs' gamma
    gamma = np.ascontiguousarray(gammas[np.searchsorted(np.asarray(distinct), sigmas)])
    group, first = _first_appearance(subsets, n_features)
    n_groups = len(first)
    square_of = _square_sources(group, gamma)
    feat_ptr, feat_groups = _feature_groups(subsets[first], n_features)
    return KernelPlan(
        kind=np.full(m, GAUSSIAN, np.int64),
        param_a=gamma,
        param_b=np.zeros(m),
        group=group,
        square_of=square_of,
        order=_chain_order(square_of),
        feat_ptr=feat_ptr,
        feat_groups=feat_groups,
        n_groups=n_groups,
        n_features=n_features,
        source=(bank, n_features, start, stop),
    )


class _BankSpecs(Sequence):
    """A bank's kernels as :class:`Gaussian` specs, generated on demand (a read-only list)."""

    def __init__(self, bank: RandomGaussianBank, n_features: int):
        self.bank = bank
        self.n_features = int(n_features)

    def __len__(self):
        return self.bank.n_kernels

    def _specs(self, start: int, stop: int) -> list[Gaussian]:
        subsets, sig = self.bank.block(start, stop, self.n_features)
        return [Gaussian(sigma=float(s), features=tuple(int(f) for f in fs)) for fs, s in zip(subsets, sig)]

    def __getitem__(self, i):
        if isinstance(i, slice):
            a, b, step = i.indices(len(self))
            if step == 1:
                return self._specs(a, b) if b > a else []
            return [self[j] for j in range(a, b, step)]
        i = int(i)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError("kernel index out of range")
        return self._specs(i, i + 1)[0]

    def __iter__(self):
        for a in range(0, len(self), _GEN_BLOCK):
            yield from self._specs(a, min(len(self), a + _GEN_BLOCK))

    def __eq__(self, other):
        if isinstance(other, _BankSpecs):
            return (self.bank, self.n_features) == (other.bank, other.n_features) or list(self) == list(other)
        if isinstance(other, (list, tuple)):
            return len(other) == len(self) and list(self) == list(other)
        return NotImplemented

    __hash__ = None


class BankKernelNames(Sequence):
    """``kernel_names_`` of a bank fit: the kernels' spec strings, generated on demand.

    Behaves like a read-only list of ``bank.n_kernels`` strings (``len``,
    indexing, iteration) without building them all; ``str()`` gives the
    bank's spec.
    """

    def __init__(self, bank: RandomGaussianBank, n_features: int):
        self.bank = bank
        self.n_features = int(n_features)
        self._specs = _BankSpecs(bank, n_features)

    def __len__(self):
        return self.bank.n_kernels

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [str(s) for s in self._specs[i]]
        return str(self._specs[i])

    def __iter__(self):
        return (str(s) for s in self._specs)

    def __eq__(self, other):
        if isinstance(other, BankKernelNames):
            return self.bank == other.bank and self.n_features == other.n_features
        return NotImplemented

    def __hash__(self):
        return hash((self.bank, self.n_features))

    def __str__(self):
        return str(self.bank)

    def __repr__(self):
        return f"BankKernelNames({self.bank!r}, n_features={self.n_features})"
