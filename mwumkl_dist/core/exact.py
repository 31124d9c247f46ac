"""Exactly rounded sums that do not depend on how the rows (or the kernels) are split.

Kernel traces are sums over all training rows, computed shard by shard, and the
final margins ``h_j = sum_i mu_i V_ji`` are sums over kernels, computed kernel
block by kernel block (on CPU threads or a GPU).  Floating-point addition is not
associative, so a plain sum of per-shard sums changes in the last bits with the
sharding, and so would every number after it.  Instead each shard returns its
sums as exact integers (in units of ``2**-SHIFT``); integers add exactly in any
order, and the driver rounds the total once (:func:`exact_to_float`).

How a sum is held while it is formed: an ``int64`` array of limbs, limb ``k``
counting units of ``2**(LIMB_BITS * k - SHIFT)``.  :func:`add_exact` splits a
double's 53-bit mantissa over the three limbs its bits fall in (each part below
``2**33``), so a limb takes at least ``2**30`` values before it could overflow,
in any order.  The same function runs compiled by numba here and, as a device
function, on a GPU (``mwumkl_dist.data.cuda.kernels``); :func:`limbs_to_ints`
turns limbs into the Python ints the engines add.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

__all__ = [
    "SHIFT",
    "LIMB_BITS",
    "N_LIMBS",
    "MAX_TERMS",
    "add_exact",
    "exact_column_sums",
    "exact_sums_by_column",
    "exact_row_dots",
    "limbs_to_ints",
    "exact_to_float",
]

# Any finite double times 2**(1074 + 53) is an integer once its 53-bit mantissa is one.
SHIFT = 1074 + 53
#: Bits of a limb's own range (the rest of its int64 takes carries: see the module docstring).
LIMB_BITS = 32
#: Limbs that hold any double: a mantissa's bits reach position ``1024 - 53 + SHIFT + 53 = 2151``.
N_LIMBS = (1024 + SHIFT) // LIMB_BITS + 1
#: Terms of one sum that can never overflow a limb (each adds less than ``2**33`` to a limb).
MAX_TERMS = 2**30

_LOW = (1 << LIMB_BITS) - 1
_MANTISSA = 2.0**53

_OPTS = {"cache": True, "error_model": "numpy", "nogil": True}


def add_exact(acc, row, first, x):
    """Add the finite double ``x`` exactly to the limbs ``acc[row]``, whose limb 0 is limb ``first``.

    ``x = M 2**(e - 53)`` with an integer ``|M| < 2**53`` (``math.frexp``), i.e. ``M`` units at bit
    ``pos = e - 53 + SHIFT >= 0``; ``|M| << (pos % 32)`` is cut at limb boundaries into three parts,
    each added with ``x``'s sign.  Plain Python on scalars: compiled by numba for the CPU (below) and
    for a GPU, where every thread keeps its own limbs.
    """
    f, e = math.frexp(x)
    mantissa = int(f * _MANTISSA)  # exact: f in [0.5, 1) times a power of 2
    if mantissa == 0:
        return
    pos = e - 53 + SHIFT
    limb = pos // LIMB_BITS
    lo = (abs(mantissa) & _LOW) << (pos - limb * LIMB_BITS)  # below 2**63
    hi = (abs(mantissa) >> LIMB_BITS) << (pos - limb * LIMB_BITS)  # below 2**52
    part0 = lo & _LOW
    part1 = (lo >> LIMB_BITS) + (hi & _LOW)
    part2 = hi >> LIMB_BITS
    k = limb - first
    if mantissa < 0:
        acc[row, k] -= part0
        acc[row, k + 1] -= part1
        acc[row, k + 2] -= part2
    else:
        acc[row, k] += part0
        acc[row, k + 1] += part1
        acc[row, k + 2] += part2


_add_exact = njit(inline="always", **_OPTS)(add_exact)


@njit(inline="always", **_OPTS)
def _limb_of(x):
    f, e = math.frexp(x)
    return (e - 53 + SHIFT) // LIMB_BITS


@njit(**_OPTS)
def _limb_range(values):
    """The lowest and highest first limb of the non-zero values of a 2-d array (``(0, -1)`` when all are zero)."""
    first, last = N_LIMBS, -1
    for j in range(values.shape[0]):
        for k in range(values.shape[1]):
            x = values[j, k]
            if x != 0.0:
                b = _limb_of(x)
                first = min(first, b)
                last = max(last, b)
    return (first, last) if last >= 0 else (0, -1)


@njit(**_OPTS)
def _sum_by_column(values, columns, first, acc):
    for t in range(values.shape[0]):
        if values[t] != 0.0:
            _add_exact(acc, columns[t], first, values[t])


@njit(**_OPTS)
def _sum_2d(values, by_column, first, acc):
    """Each column of ``values`` into its ``acc`` row (``by_column``), else each row (walked in memory order)."""
    for j in range(values.shape[0]):
        for k in range(values.shape[1]):
            if values[j, k] != 0.0:
                _add_exact(acc, k if by_column else j, first, values[j, k])


@njit(**_OPTS)
def _row_dots(V, rows, weights, acc):
    """``acc[r] += V[rows[r], i] * weights[i]`` (each product rounded) over all ``i``; False on a non-finite one."""
    for i in range(V.shape[1]):  # kernel-major: V's columns are contiguous (Fortran order)
        w = weights[i]
        for r in range(rows.shape[0]):
            x = V[rows[r], i] * w
            if x != 0.0:
                if not math.isfinite(x):
                    return False
                _add_exact(acc, r, 0, x)
    return True


@njit(**_OPTS)
def _carry(acc):
    """Propagate carries in place: every limb but the last in ``[0, 2**32)``, the last signed (the same value)."""
    for r in range(acc.shape[0]):
        for k in range(acc.shape[1] - 1):
            c = acc[r, k] >> LIMB_BITS  # floor division by 2**32
            acc[r, k] -= c << LIMB_BITS
            acc[r, k + 1] += c


def limbs_to_ints(acc: np.ndarray, first: int = 0) -> list[int]:
    """The exact sums (times ``2**SHIFT``) held in the limb rows of ``acc``, whose limb 0 is limb ``first``.

    ``acc`` is ``(n_sums, n_limbs)`` int64, as :func:`add_exact` fills it (overwritten here).
    """
    acc = np.ascontiguousarray(acc, dtype=np.int64)
    if acc.size == 0:
        return [0] * acc.shape[0]
    _carry(acc)
    # Little-endian two's complement: 32-bit limbs, then the last one sign-extended to 64 bits.
    row = np.concatenate([acc[:, :-1].astype("<u4").view(np.uint8), acc[:, -1:].astype("<i8").view(np.uint8)], axis=1)
    width, raw = row.shape[1], np.ascontiguousarray(row).tobytes()
    shift = LIMB_BITS * int(first)
    return [int.from_bytes(raw[i : i + width], "little", signed=True) << shift for i in range(0, len(raw), width)]


def _check_terms(values: np.ndarray, per_sum: int) -> None:
    if not np.all(np.isfinite(values)):
        raise ValueError("cannot sum non-finite values exactly")
    if per_sum > MAX_TERMS:
        raise ValueError(f"exact sums take at most {MAX_TERMS} terms each")


def exact_column_sums(values: np.ndarray) -> list[int]:
    """Exact ``sum(values[:, k]) * 2**SHIFT`` for each column ``k``, as Python ints."""
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 2:
        raise ValueError("exact_column_sums expects a 2-d array")
    n, m = values.shape
    if values.size == 0:  # no rows, or no columns (a shard without support rows passes (m, 0))
        return [0] * m
    _check_terms(values, n)
    first, last = _limb_range(values)
    acc = np.zeros((m, last - first + 3), np.int64)
    if values.flags.f_contiguous and not values.flags.c_contiguous:  # e.g. a transposed block: its rows
        _sum_2d(values.T, False, first, acc)
    else:
        _sum_2d(np.ascontiguousarray(values), True, first, acc)
    return limbs_to_ints(acc, first)


def exact_sums_by_column(values: np.ndarray, columns: np.ndarray, n_columns: int) -> list[int]:
    """Exact sums (times ``2**SHIFT``) of ``values`` grouped by ``columns`` (``0 .. n_columns - 1``)."""
    values = np.ascontiguousarray(values, dtype=np.float64).ravel()
    _check_terms(values, values.size)
    if values.size == 0:
        return [0] * n_columns
    columns = np.ascontiguousarray(columns, dtype=np.int64).ravel()
    if columns.shape != values.shape or columns.min() < 0 or columns.max() >= n_columns:
        raise ValueError(f"columns must give one column in 0 .. {n_columns - 1} per value")
    first, last = _limb_range(values.reshape(1, -1))
    acc = np.zeros((n_columns, last - first + 3), np.int64)
    _sum_by_column(values, columns, first, acc)
    return limbs_to_ints(acc, first)


def exact_row_dots(V: np.ndarray, rows: np.ndarray, weights: np.ndarray) -> list[int]:
    """Exact ``sum_i fl(V[j, i] weights[i]) * 2**SHIFT`` for each ``j`` in ``rows``: products rounded, sums exact.

    The same numbers as ``exact_column_sums((V[rows] * weights).T)`` without its two ``len(rows) x m``
    copies; a GPU shard computes them on the GPU (``mwumkl_dist.data.cuda.kernels.exact_row_dots``).
    """
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    weights = np.ascontiguousarray(weights, dtype=np.float64)
    if V.shape[1] != len(weights):
        raise ValueError(f"V has {V.shape[1]} kernels but there are {len(weights)} weights")
    if V.shape[1] > MAX_TERMS:  # (the products' finiteness is checked as they are formed)
        raise ValueError(f"exact sums take at most {MAX_TERMS} terms each")
    acc = np.zeros((len(rows), N_LIMBS), np.int64)
    if not _row_dots(V, rows, weights, acc):
        raise ValueError("cannot sum non-finite values exactly")
    return limbs_to_ints(acc)


def exact_to_float(totals) -> np.ndarray:
    """Round exact sums from :func:`exact_column_sums` (already added together) to doubles."""
    scale = 1 << SHIFT
    return np.array([t / scale for t in totals], dtype=np.float64)  # int / int is correctly rounded
