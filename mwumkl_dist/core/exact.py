"""Exactly rounded column sums that do not depend on how the rows are split.

Kernel traces are sums over all training rows, computed shard by shard.
Floating-point addition is not associative, so a plain sum of per-shard sums
changes in the last bits with the sharding, and so would every number after
it.  Instead each shard returns its column sums as exact integers (in units
of ``2**-SHIFT``); integers add exactly in any order, and the driver rounds
the total once.
"""

from __future__ import annotations

import numpy as np

__all__ = ["exact_column_sums", "exact_sums_by_column", "exact_to_float", "slot_totals", "LOW_BITS"]

# Any finite double times 2**(1074 + 53) is an integer once its 53-bit mantissa is one.
SHIFT = 1074 + 53
_FRACTION_BITS = (1 << 52) - 1
_ABS_BITS = (1 << 63) - 1
#: Mantissas are summed as a high part and a low part of this many bits: int64 sums of up to 2**36 cannot overflow.
LOW_BITS = 26


def exact_column_sums(values: np.ndarray) -> list[int]:
    """Exact ``sum(values[:, k]) * 2**SHIFT`` for each column ``k``, as Python ints."""
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 2:
        raise ValueError("exact_column_sums expects a 2-d array")
    n, m = values.shape
    if values.size == 0:  # no rows, or no columns (a shard without support rows passes (m, 0))
        return [0] * m
    return exact_sums_by_column(values.ravel(), np.broadcast_to(np.arange(m), (n, m)).ravel(), m)


def exact_sums_by_column(values: np.ndarray, columns: np.ndarray, n_columns: int) -> list[int]:
    """Exact sums (times ``2**SHIFT``) of ``values`` grouped by ``columns`` (``0 .. n_columns - 1``)."""
    values = np.asarray(values, dtype=np.float64)
    if not np.all(np.isfinite(values)):
        raise ValueError("cannot sum non-finite values exactly")
    out = [0] * n_columns
    if values.size == 0:
        return out
    # value = mantissa * 2**(shift - SHIFT) from the bits (no float passes: frexp, ldexp and rint took 1.3 s for a
    # support set's margins over 10^5 kernels): zeros dropped, a subnormal's exponent field read as 1.
    bits = np.ascontiguousarray(values).view(np.int64)
    nonzero = (bits & _ABS_BITS) != 0
    if not nonzero.all():
        bits, columns = bits[nonzero], np.asarray(columns)[nonzero]
        if not len(bits):
            return out
    field = (bits >> 52) & 0x7FF
    mantissa = (bits & _FRACTION_BITS) | ((field != 0).astype(np.int64) << 52)
    mantissa = np.where(bits < 0, -mantissa, mantissa)  # |mantissa| < 2**53
    shift = np.maximum(field, 1) - 1075 + SHIFT  # >= 53
    high, low = mantissa >> LOW_BITS, mantissa & ((1 << LOW_BITS) - 1)
    lo_shift = int(shift.min())
    slot = shift - lo_shift
    n_slots = int(slot.max()) + 1
    acc_high = np.zeros((n_slots, n_columns), np.int64)
    acc_low = np.zeros((n_slots, n_columns), np.int64)
    np.add.at(acc_high, (slot, columns), high)
    np.add.at(acc_low, (slot, columns), low)
    return slot_totals(acc_high, acc_low, lo_shift)


def slot_totals(acc_high, acc_low, lo_shift: int) -> list[int]:
    """Column totals (times ``2**SHIFT``) from sums of mantissa parts by slot: ``acc_high[s, k]`` and
    ``acc_low[s, k]`` hold column ``k``'s mantissas ``high << LOW_BITS | low`` of values ``mantissa *
    2**(s + lo_shift - SHIFT)``."""
    out = [0] * acc_high.shape[1]
    for s in np.flatnonzero((acc_high != 0).any(axis=1) | (acc_low != 0).any(axis=1)):
        e = int(s) + lo_shift
        for k in np.flatnonzero((acc_high[s] != 0) | (acc_low[s] != 0)):
            out[k] += (int(acc_high[s, k]) << (e + LOW_BITS)) + (int(acc_low[s, k]) << e)
    return out


def exact_to_float(totals) -> np.ndarray:
    """Round exact sums from :func:`exact_column_sums` (already added together) to doubles."""
    scale = 1 << SHIFT
    return np.array([t / scale for t in totals], dtype=np.float64)  # int / int is correctly rounded
