"""Exact column sums (core.exact): the true sums of the doubles, whatever the values and however they are split."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from mwumkl_dist.core.exact import SHIFT, exact_column_sums, exact_sums_by_column, exact_to_float


def _values(n, seed):
    rng = np.random.default_rng(seed)
    v = rng.standard_normal(n) * np.exp(rng.uniform(-740, 700, n))  # subnormals to 1e304
    v[::11], v[::13] = 0.0, -0.0
    v[:6] = [5e-324, -5e-324, np.finfo(float).max / 64, -np.finfo(float).max / 64, np.finfo(float).tiny, 1.0]
    return v


@pytest.mark.parametrize("seed", [0, 1])
def test_sums_are_the_exact_sums_of_the_doubles(seed):
    v = _values(3000, seed)
    cols = np.random.default_rng(seed + 10).integers(0, 7, len(v))
    got = exact_sums_by_column(v, cols, 8)  # column 7 gets no value
    want = [sum((Fraction(float(x)) for x in v[cols == k]), Fraction(0)) for k in range(8)]
    assert [Fraction(g, 2**SHIFT) for g in got] == want
    assert np.array_equal(exact_to_float(got), np.array([float(w) for w in want]))  # rounded once
    # parts add up to the whole exactly, in any split
    halves = [exact_sums_by_column(v[part], cols[part], 8) for part in (slice(None, 1234), slice(1234, None))]
    assert [a + b for a, b in zip(*halves)] == got


def test_column_sums_zeros_and_errors():
    assert exact_column_sums(np.array([[1.0, 2.0], [3.0, -2.0]])) == [4 << SHIFT, 0]
    assert exact_column_sums(np.zeros((3, 2))) == [0, 0] and exact_column_sums(np.zeros((0, 4))) == [0] * 4
    assert exact_column_sums(np.array([[-0.0], [5e-324]])) == [1 << (SHIFT - 1074)]
    with pytest.raises(ValueError, match="non-finite"):
        exact_column_sums(np.array([[1.0], [np.inf]]))


def test_compiled_row_products_and_column_totals_equal_the_exact_sums():
    from mwumkl_dist.devices.cpu import exact_column_totals, exact_row_products

    rng = np.random.default_rng(3)
    M = _values(7 * 130, 4).reshape(130, 7)  # more rows than one compiled call takes
    w = np.array([1.0, -0.5, 3.0, 1e-300, 0.0, 2.0**-1000, -7.0])
    assert exact_row_products(M, w) == exact_column_sums((M * w).T)
    V = np.asfortranarray(rng.random((40, 300)))  # a shard's V, Fortran order
    rows = np.array([3, 17, 39])
    assert exact_row_products(V[rows], w.repeat(50)[:300]) == exact_column_sums((V[rows] * w.repeat(50)[:300]).T)
    with pytest.raises(ValueError, match="non-finite"):
        exact_row_products(np.array([[1e308, 1.0]]), np.array([10.0, 1.0]))
    D = _values(150 * 9, 5).reshape(150, 9)
    assert exact_column_totals(D) == exact_column_sums(D)
    assert exact_column_totals(np.ones((166, 130))) == [166 << SHIFT] * 130  # a bank's traces
    with pytest.raises(ValueError, match="non-finite"):
        exact_column_totals(np.array([[np.nan]]))
