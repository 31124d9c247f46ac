"""A branch-free fdlibm-style ``exp`` that the compiler vectorises (:func:`exp_block`; its constants are the GPU's
too).

Part of :mod:`mwumkl_dist.devices.cpu` (see its docstring for how the kernels are fast and exact).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from mwumkl_dist.devices.cpu.options import _OPTS

__all__ = ["exp_block", "EXP_CONSTANTS"]

_LOG2E = 1.4426950408889634
_LN2_HI = 6.93147180369123816490e-01  # fdlibm: k * _LN2_HI is exact for |k| < 2**20
_LN2_LO = 1.90821492927058770002e-10
_SHIFT = 6755399441055744.0  # 1.5 * 2**52: (x + _SHIFT) - _SHIFT rounds x to an integer
_P1 = 1.66666666666666019037e-01
_P2 = -2.77777777770155933842e-03
_P3 = 6.61375632143793436117e-05
_P4 = -1.65339022054652515390e-06
_P5 = 4.13813679705723846039e-08
#: The constants of :func:`_exp_into`, in the order above (the CUDA kernels' ``exp`` uses the same).
EXP_CONSTANTS = (_LOG2E, _LN2_HI, _LN2_LO, _SHIFT, _P1, _P2, _P3, _P4, _P5)


@njit(**_OPTS)
def _exp_into(x, out, kbits, n):
    """``out[b] = exp(x[b])`` for ``b < n``; ``kbits`` is int64 scratch of length ``>= 2 n``.

    fdlibm's ``e_exp.c`` algorithm without branches: ``x = k ln2 + r`` with
    ``|r| <= ln2 / 2``, a rational approximation of ``exp(r)`` (error below
    1 ulp), then ``2**k`` applied as two exact powers of two so that subnormal
    results round once.  Underflows to 0 below about -745.1, overflows to inf
    above 709.78, NaN stays NaN.
    """
    for b in range(n):
        xb = x[b]
        xb = xb if xb >= -746.0 else -746.0  # also maps NaN to -746 (restored below)
        xb = xb if xb <= 710.0 else 710.0
        kf = (xb * _LOG2E + _SHIFT) - _SHIFT
        hi = xb - kf * _LN2_HI
        lo = kf * _LN2_LO
        r = hi - lo
        t = r * r
        c = r - t * (_P1 + t * (_P2 + t * (_P3 + t * (_P4 + t * _P5))))
        out[b] = 1.0 - ((lo - (r * c) / (2.0 - c)) - hi)
        k = np.int64(kf)
        k1 = k >> 1
        kbits[b] = (k1 + 1023) << 52
        kbits[n + b] = (k - k1 + 1023) << 52
    scale = kbits.view(np.float64)
    for b in range(n):
        xb = x[b]
        v = (out[b] * scale[b]) * scale[n + b]
        out[b] = v if xb == xb else xb


@njit(**_OPTS)
def exp_block(x):
    """``exp(x)`` elementwise for a 1-d float64 array, with the solver's ``exp`` (for tests)."""
    n = x.shape[0]
    out = np.empty(n)
    _exp_into(x, out, np.empty(2 * n, np.int64), n)
    return out
