"""Exact sums (``mwumkl_dist.core.exact``) against Python's exact rationals, over the whole double range."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from mwumkl_dist.core.exact import (
    N_LIMBS,
    SHIFT,
    exact_column_sums,
    exact_row_dots,
    exact_sums_by_column,
    exact_to_float,
    limbs_to_ints,
)

TINY, HUGE = 5e-324, np.finfo(float).max


def exact(values) -> int:
    return int(sum((Fraction(float(x)) for x in values), Fraction(0)) * 2**SHIFT)


def wide(rng, shape, lo=-1074, hi=1000) -> np.ndarray:
    """Values of both signs whose exponents span ``[lo, hi)`` (subnormals included)."""
    return rng.normal(size=shape) * np.exp2(rng.integers(lo, hi, size=shape).astype(float))


def test_column_sums_are_exact_over_the_double_range():
    rng = np.random.default_rng(0)
    a = wide(rng, (40, 6))
    a[:, 0] = 0.0  # an all-zero column
    a[:3, 1] = [TINY, -TINY, 2 * TINY]  # subnormals
    a[3:6, 2] = [HUGE, HUGE, -HUGE]  # the largest double, twice (beyond a double), then less
    a[6:8, 3] = [1.0, -1.0]  # cancellation
    a[8, 4] = -0.0
    want = [exact(a[:, k]) for k in range(a.shape[1])]
    assert want[0] == 0
    assert exact_column_sums(np.array([[HUGE], [HUGE], [-HUGE]])) == [int(Fraction(HUGE) * 2**SHIFT)]
    for layout in (a, np.asfortranarray(a), a[::-1], a.T.copy().T):  # C, Fortran, strided: the same integers
        assert exact_column_sums(layout) == [exact(layout[:, k]) for k in range(a.shape[1])]
    assert exact_sums_by_column(a.ravel(), np.tile(np.arange(6), 40), 6) == want
    assert exact_to_float(exact_column_sums(np.array([[TINY], [-TINY], [2 * TINY]]))).tolist() == [2 * TINY]


def test_sums_split_anywhere_add_up_to_the_same_integers():
    rng = np.random.default_rng(1)
    a = wide(rng, (30, 4), -200, 200)
    whole = exact_column_sums(a)
    parts = [exact_column_sums(a[r0:r1]) for r0, r1 in ((0, 7), (7, 8), (8, 30))]
    assert [sum(p) for p in zip(*parts)] == whole
    assert exact_to_float(whole).tolist() == [float(Fraction(t, 2**SHIFT)) for t in whole]


def test_sums_by_column_in_any_order():
    rng = np.random.default_rng(2)
    values = wide(rng, 500, -60, 60)
    columns = rng.integers(0, 9, size=500)
    want = [exact(values[columns == k]) for k in range(9)]
    assert exact_sums_by_column(values, columns, 9) == want
    order = rng.permutation(500)
    assert exact_sums_by_column(values[order], columns[order], 9) == want
    assert exact_sums_by_column(np.zeros(0), np.zeros(0, np.int64), 3) == [0, 0, 0]
    with pytest.raises(ValueError, match="non-finite"):
        exact_sums_by_column(np.array([1.0, np.nan]), np.array([0, 1]), 2)
    with pytest.raises(ValueError, match="columns"):
        exact_sums_by_column(np.array([1.0]), np.array([2]), 2)


def test_row_dots_round_each_product_and_sum_exactly():
    rng = np.random.default_rng(3)
    V = np.asfortranarray(wide(rng, (7, 50), -300, 300))
    w = rng.random(50) * np.exp2(rng.integers(-600, 10, size=50).astype(float))
    w[::5] = 0.0
    rows = np.array([6, 0, 3])
    want = [exact(V[j] * w) for j in rows]
    assert exact_row_dots(V, rows, w) == want
    assert exact_row_dots(np.ascontiguousarray(V), rows, w) == want
    assert exact_row_dots(V, rows, w) == exact_column_sums((V[rows] * w).T)  # what the shards computed before
    assert exact_row_dots(V, np.zeros(0, np.int64), w) == []
    w[1] = HUGE
    V[6, 1] = 4.0
    with pytest.raises(ValueError, match="non-finite"):
        exact_row_dots(V, rows, w)


def test_limbs_carry_both_ways():
    """Limbs of either sign (as threads leave them) give the integer they stand for."""
    rng = np.random.default_rng(4)
    acc = rng.integers(-(2**62), 2**62, size=(5, N_LIMBS))
    want = [sum(int(v) << (32 * k) for k, v in enumerate(row)) for row in acc]
    assert limbs_to_ints(acc.copy()) == want
    assert limbs_to_ints(acc[:, :4].copy(), first=3) == [sum(int(v) << (32 * (k + 3)) for k, v in enumerate(row))
                                                          for row in acc[:, :4]]  # fmt: skip
