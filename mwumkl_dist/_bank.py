"""Random Gaussian kernel banks at scale: a bank-aware problem, shard and predictor.

A :class:`~mwumkl_dist.kernels.RandomGaussianBank` of a million kernels must
never become a million :class:`~mwumkl_dist.kernels.Gaussian` objects: here a
bank is a pair of flat arrays (each kernel's feature subset and bandwidth),
generated block by block from ``(seed, i)`` on the worker that owns the block.

Kernel ``i`` of a bank evaluates as::

    K_i(x, z) = exp(-gamma_i * d2_i),   d2_i = sum over f in S_i (sorted) of (x_f - z_f) ** 2

a pure function of ``(x, z, i)`` (so results do not depend on the sharding),
exactly symmetric and exactly 1 on the diagonal (every trace is ``n``).  It
equals the :class:`~mwumkl_dist.kernels.Gaussian` spec of the same subset and
bandwidth up to rounding (that path expands ``|x - z|^2`` into norms and a dot
product).

Speed: a superstep first computes, per row, the squared differences to the two
chosen points once; a bank on few features repeats its (subset, bandwidth)
pairs many times (2-feature subsets of 60 features give at most
``1770 * 9 = 15930`` distinct kernels), so when a block has at most half as
many distinct pairs as kernels, the ``exp`` is taken once per distinct pair
and shared (bit-identical to taking it per kernel).  ``V`` is stored kernel
major, ``(n_kernels, n_rows)``, so the update streams through it once.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp
from numba import njit, prange

from ._exact import SHIFT
from .kernels import Gaussian, RandomGaussianBank, parse_kernels
from .mwu import Candidate
from .shard import ShardBase, split_rows

__all__ = [
    "bank_of",
    "BankTables",
    "BankKernelNames",
    "BankProblem",
    "BankShard",
    "bank_decision_function",
    "bank_kernel_block",
    "exact_weighted_row_sums",
]

#: Kernels generated per call of :meth:`RandomGaussianBank.block` (bounds its (block, d) hash matrix).
_GEN_BLOCK = 1 << 15
#: Share distinct (subset, bandwidth) evaluations when there are at most this fraction of them.
_MEMO_FRACTION = 0.5


def bank_of(kernels) -> RandomGaussianBank | None:
    """The bank when ``kernels`` is exactly one random bank (object or spec string), else None."""
    if isinstance(kernels, RandomGaussianBank):
        return kernels
    if isinstance(kernels, str) and kernels.strip().lower().startswith("random:") and "," not in kernels:
        parsed = parse_kernels(kernels, 1)
        if len(parsed) == 1 and isinstance(parsed[0], RandomGaussianBank):
            return parsed[0]
    if isinstance(kernels, (list, tuple)) and len(kernels) == 1:
        return bank_of(kernels[0])
    return None


# ----------------------------------------------------------------------------- tables


class BankTables:
    """Flat arrays for kernels ``[start, stop)`` of a bank on ``n_features`` features.

    Attributes
    ----------
    subsets : ndarray of int32, shape (m, k)
        Sorted feature subset of each kernel (``k = min(subset_size, n_features)``).
    sigma_index : ndarray of int64, shape (m,)
        Index of each kernel's bandwidth in ``bank.sigmas``.
    gamma : ndarray of float64, shape (m,)
        ``1 / (2 sigma^2)``, computed exactly as :attr:`Gaussian.gamma` does.
    pair_of : ndarray of int32, shape (m,)
        Each kernel's distinct (subset, bandwidth) pair.
    pair_subset, pair_gamma : ndarrays of shape (n_pairs,)
        Each pair's distinct subset (row of ``unique_subsets``) and gamma.
    unique_subsets : ndarray of int32, shape (n_subsets, k)
    """

    def __init__(self, bank: RandomGaussianBank, start: int, stop: int, n_features: int):
        self.bank = bank
        self.start, self.stop = int(start), int(stop)
        self.n_features = int(n_features)
        subsets, sig = [], []
        for a in range(self.start, self.stop, _GEN_BLOCK):
            s, g = bank.block(a, min(self.stop, a + _GEN_BLOCK), self.n_features)
            subsets.append(s.astype(np.int32))
            sig.append(g)
        self.subsets = np.ascontiguousarray(np.concatenate(subsets)) if subsets else np.zeros((0, 1), np.int32)
        sigma_values = np.concatenate(sig) if sig else np.zeros(0)
        # Bandwidth index and gamma through the Gaussian spec, so gamma is bit-identical to KernelSet's.
        distinct = sorted(set(bank.sigmas))
        self.sigma_index = np.searchsorted(np.asarray(distinct), sigma_values).astype(np.int64)
        gammas = np.array([Gaussian(sigma=s).gamma for s in distinct])
        self.gamma = np.ascontiguousarray(gammas[self.sigma_index])
        self._pairs = None

    @property
    def n_kernels(self) -> int:
        return self.stop - self.start

    def _build_pairs(self):
        m, k = self.subsets.shape
        n_sig = len(set(self.bank.sigmas))
        if m == 0:
            z = np.zeros(0, np.int32)
            return z, z, np.zeros(0), np.zeros((0, k), np.int32)
        d = self.n_features
        if k * np.log2(max(d, 2)) + np.log2(n_sig) < 62:
            # One int64 code per subset (and per pair): sorting codes is much faster than unique(axis=0).
            code = np.zeros(m, np.int64)
            for t in range(k):
                code = code * d + self.subsets[:, t]
            pair_code = code * n_sig + self.sigma_index
            pair_codes, first, pair_of = np.unique(pair_code, return_index=True, return_inverse=True)
            sub_codes, sub_first, pair_subset = np.unique(pair_codes // n_sig, return_index=True, return_inverse=True)
            unique_subsets = self.subsets[first[sub_first]]
        else:
            key = np.column_stack([self.subsets, self.sigma_index])
            _, first, pair_of = np.unique(key, axis=0, return_index=True, return_inverse=True)
            _, sub_first, pair_subset = np.unique(self.subsets[first], axis=0, return_index=True, return_inverse=True)
            unique_subsets = self.subsets[first[sub_first]]
        return (
            np.ascontiguousarray(pair_of.ravel(), dtype=np.int32),
            np.ascontiguousarray(pair_subset.ravel(), dtype=np.int32),
            np.ascontiguousarray(self.gamma[first]),
            np.ascontiguousarray(unique_subsets, dtype=np.int32),
        )

    @property
    def pairs(self):
        """``(pair_of, pair_subset, pair_gamma, unique_subsets)``, computed once."""
        if self._pairs is None:
            self._pairs = self._build_pairs()
        return self._pairs

    @property
    def n_pairs(self) -> int:
        return len(self.pairs[2])


@functools.lru_cache(maxsize=4)
def _driver_tables(bank: RandomGaussianBank, n_features: int) -> BankTables:
    return BankTables(bank, 0, bank.n_kernels, n_features)


class BankKernelNames(Sequence):
    """``kernel_names_`` of a bank fit: the kernels' spec strings, generated on demand.

    Behaves like a read-only list of ``bank.n_kernels`` strings (``len``,
    indexing, iteration) without building them all; ``str()`` gives the
    bank's spec.
    """

    def __init__(self, bank: RandomGaussianBank, n_features: int):
        self.bank = bank
        self.n_features = int(n_features)

    def __len__(self):
        return self.bank.n_kernels

    def _names(self, start, stop):
        subsets, sig = self.bank.block(start, stop, self.n_features)
        return [str(Gaussian(sigma=float(s), features=tuple(int(f) for f in fs))) for fs, s in zip(subsets, sig)]

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = int(i)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError("kernel index out of range")
        return self._names(i, i + 1)[0]

    def __iter__(self):
        for a in range(0, len(self), _GEN_BLOCK):
            yield from self._names(a, min(len(self), a + _GEN_BLOCK))

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


# ----------------------------------------------------------------------------- numba kernels


@njit(cache=True)
def _sq_diffs(X, p, out):
    """``out[f, j] = (X[j, f] - p[f]) ** 2``: feature-major, so subset sums run along rows."""
    n, d = X.shape
    for f in range(d):
        pf = p[f]
        for j in range(n):
            a = X[j, f] - pf
            out[f, j] = a * a


@njit(cache=True)
def _subset_sums(D, subsets, out):
    """``out[k, j] = sum_t D[subsets[k, t], j]`` in subset order."""
    ns, s = subsets.shape
    n = D.shape[1]
    for k in range(ns):
        f0 = subsets[k, 0]
        for j in range(n):
            out[k, j] = D[f0, j]
        for t in range(1, s):
            f = subsets[k, t]
            for j in range(n):
                out[k, j] += D[f, j]


@njit(cache=True)
def _row_factors(y, row_offset, ip, iq, ridge_p, ridge_q, sp_, sq_, dg):
    n = y.shape[0]
    for j in range(n):
        sp_[j] = 0.5 * y[j] * 1.0
        sq_[j] = 0.5 * y[j] * -1.0
        gj = row_offset + j
        dg[j] = 0.5 * ridge_p if gj == ip else (0.5 * ridge_q if gj == iq else 0.0)


@njit(cache=True)
def _best_per_class(y, g):
    best_pos, best_neg = -1, -1
    g_pos, g_neg = -np.inf, -np.inf
    for j in range(y.shape[0]):
        if y[j] > 0:
            if g[j] > g_pos:
                g_pos = g[j]
                best_pos = j
        elif g[j] > g_neg:
            g_neg = g[j]
            best_neg = j
    return best_pos, g_pos, best_neg, g_neg


@njit(cache=True)
def _step_setup(X, p, q, y, row_offset, ip, iq, ridge_p, ridge_q, work):
    """Per-feature squared differences of every row to both points, and the rows' column factors."""
    DP, DQ, sp_, sq_, dg = work[0], work[1], work[2], work[3], work[4]
    _sq_diffs(X, p, DP)
    _sq_diffs(X, q, DQ)
    _row_factors(y, row_offset, ip, iq, ridge_p, ridge_q, sp_, sq_, dg)
    return DP, DQ, sp_, sq_, dg


def bank_workspace(n_rows: int, n_features: int, n_subsets: int = 0, n_pairs: int = 0):
    """Scratch of the bank supersteps, kept by a shard and reused every superstep.

    ``(DP, DQ, sp, sq, diag, d2p, d2q, D2P, D2Q, inc)``; the last three are
    for :func:`bank_superstep_shared` (``n_subsets`` / ``n_pairs`` rows).
    Allocating them every superstep (``inc`` alone is ``n_pairs * n_rows``)
    made the C allocator return the pages and fault them in again each time.
    """
    n, d = int(n_rows), int(n_features)
    return (
        np.empty((d, n)),
        np.empty((d, n)),
        np.empty(n),
        np.empty(n),
        np.empty(n),
        np.empty(n),
        np.empty(n),
        np.empty((int(n_subsets), n)),
        np.empty((int(n_subsets), n)),
        np.empty((int(n_pairs), n)),
    )


@njit(cache=True)
def bank_superstep_direct(
    X, p, q, subsets, gamma, VT, y, row_offset, ip, iq, inv_trace, ridge_p, ridge_q, coef, g, work
):  # fmt: skip
    """``V += (G[:, ip] + G[:, iq]) / 2``, ``g = V @ coef``, one ``exp`` per kernel and row.

    ``VT`` is ``V`` kernel-major ``(m, n_rows)``; ``g`` (``n_rows``) is overwritten;
    ``work`` is a :func:`bank_workspace`; ``ridge_p`` / ``ridge_q`` are the
    ridges of the picked rows ``ip`` / ``iq``.
    Returns ``(best_pos, g_pos, best_neg, g_neg)`` as in :func:`mwumkl_dist._columns.superstep_features`.
    """
    n, d = X.shape
    m, s = subsets.shape
    DP, DQ, sp_, sq_, dg = _step_setup(X, p, q, y, row_offset, ip, iq, ridge_p, ridge_q, work)
    d2p, d2q = work[5], work[6]
    g[:] = 0.0
    for i in range(m):
        f0 = subsets[i, 0]
        for j in range(n):
            d2p[j] = DP[f0, j]
            d2q[j] = DQ[f0, j]
        for t in range(1, s):
            f = subsets[i, t]
            for j in range(n):
                d2p[j] += DP[f, j]
                d2q[j] += DQ[f, j]
        gam = gamma[i]
        it = inv_trace[i]
        c = coef[i]
        for j in range(n):
            kp = np.exp(-gam * d2p[j])
            kq = np.exp(-gam * d2q[j])
            v = VT[i, j] + (sp_[j] * kp + sq_[j] * kq) * it + dg[j]
            VT[i, j] = v
            g[j] += c * v
    return _best_per_class(y, g)


@njit(cache=True)
def bank_superstep_shared(
    X, p, q, unique_subsets, pair_subset, pair_gamma, pair_of, VT, y, row_offset, ip, iq, inv_trace, ridge_p, ridge_q,
    coef, g, work,
):  # fmt: skip
    """As :func:`bank_superstep_direct`, with one ``exp`` per distinct (subset, gamma) pair and row."""
    n, d = X.shape
    n_pairs = pair_gamma.shape[0]
    m = pair_of.shape[0]
    DP, DQ, sp_, sq_, dg = _step_setup(X, p, q, y, row_offset, ip, iq, ridge_p, ridge_q, work)
    D2P, D2Q, inc = work[7], work[8], work[9]
    _subset_sums(DP, unique_subsets, D2P)
    _subset_sums(DQ, unique_subsets, D2Q)
    # The same arithmetic as the direct loop: (sp * kp + sq * kq), then * inv_trace + diag.
    for u in range(n_pairs):
        gam = pair_gamma[u]
        k = pair_subset[u]
        for j in range(n):
            inc[u, j] = sp_[j] * np.exp(-gam * D2P[k, j]) + sq_[j] * np.exp(-gam * D2Q[k, j])
    g[:] = 0.0
    for i in range(m):
        u = pair_of[i]
        it = inv_trace[i]
        c = coef[i]
        for j in range(n):
            v = VT[i, j] + inc[u, j] * it + dg[j]
            VT[i, j] = v
            g[j] += c * v
    return _best_per_class(y, g)


@njit(cache=True)
def bank_point_values(p, q, subsets, gamma, out):
    """``out[i] = K_i(p, q)`` for every kernel of the table."""
    m, s = subsets.shape
    for i in range(m):
        d2 = 0.0
        for t in range(s):
            a = p[subsets[i, t]] - q[subsets[i, t]]
            if t == 0:
                d2 = a * a
            else:
                d2 += a * a
        out[i] = np.exp(-gamma[i] * d2)


@njit(cache=True)
def _exact_slots(VT, cols, weights, acc_hi, acc_lo):
    """Exact per-column sums of ``VT[i, col] * weights[i]`` as integer mantissa sums per binary exponent.

    Returns False (and stops) at a non-finite product.
    """
    m = VT.shape[0]
    lo_mask = (1 << 26) - 1
    prod = np.empty(m)
    bits = prod.view(np.int64)
    for c in range(cols.shape[0]):
        col = cols[c]
        for i in range(m):
            prod[i] = VT[i, col] * weights[i]
        for i in range(m):
            b = bits[i]
            e = (b >> 52) & 0x7FF
            if e == 0x7FF:
                return False
            mant = b & ((1 << 52) - 1)
            if e == 0:
                e = 1  # subnormal: no implicit bit, the exponent of the smallest normal
            else:
                mant |= 1 << 52
            if b < 0:
                acc_hi[c, e] -= mant >> 26
                acc_lo[c, e] -= mant & lo_mask
            else:
                acc_hi[c, e] += mant >> 26
                acc_lo[c, e] += mant & lo_mask
    return True


def exact_weighted_row_sums(VT: np.ndarray, cols: np.ndarray, weights: np.ndarray) -> list[int]:
    """``sum_i VT[i, c] * weights[i]`` for each column ``c`` in ``cols``, exactly, in units of ``2**-SHIFT``.

    Equal to ``exact_column_sums((VT[:, cols].T * weights).T)`` of :mod:`mwumkl_dist._exact`
    (each product rounded once, then summed exactly), without its ``O(m * len(cols))`` temporaries.
    """
    cols = np.ascontiguousarray(cols, dtype=np.int64)
    weights = np.ascontiguousarray(weights, dtype=np.float64)
    acc_hi = np.zeros((len(cols), 2048), np.int64)
    acc_lo = np.zeros((len(cols), 2048), np.int64)
    if not _exact_slots(VT, cols, weights, acc_hi, acc_lo):
        raise ValueError("cannot sum non-finite values exactly")
    out = []
    # Field exponent e: value = mantissa * 2**(e - 1075), i.e. a shift of e - 1075 + SHIFT in units of 2**-SHIFT.
    base = SHIFT - 1075
    for c in range(len(cols)):
        total = 0
        for e in np.flatnonzero((acc_hi[c] != 0) | (acc_lo[c] != 0)):
            sh = int(e) + base
            total += (int(acc_hi[c, e]) << (sh + 26)) + (int(acc_lo[c, e]) << sh)
        out.append(total)
    return out


@njit(cache=True, parallel=True)
def _bank_predict(Xq, SV, coef, W, unique_subsets, pair_subset, pair_gamma):
    """``out[t, o] = sum_j coef[o, j] sum_u W[o, u] exp(-gamma_u d2_u(x_t, sv_j))``."""
    n, d = Xq.shape
    n_sv = SV.shape[0]
    n_out, n_pairs = W.shape
    ns, s = unique_subsets.shape
    out = np.zeros((n, n_out))
    for t in prange(n):
        diff = np.empty(d)
        d2 = np.empty(ns)
        for j in range(n_sv):
            for f in range(d):
                a = Xq[t, f] - SV[j, f]
                diff[f] = a * a
            for k in range(ns):
                acc = diff[unique_subsets[k, 0]]
                for r in range(1, s):
                    acc += diff[unique_subsets[k, r]]
                d2[k] = acc
            for o in range(n_out):
                c = coef[o, j]
                if c != 0.0:
                    acc = 0.0
                    for u in range(n_pairs):
                        acc += W[o, u] * np.exp(-pair_gamma[u] * d2[pair_subset[u]])
                    out[t, o] += c * acc
    return out


def bank_decision_function(X, support_vectors, dual_coef, raw_weights, bank: RandomGaussianBank) -> np.ndarray:
    """``sum_j dual_coef[o, j] sum_i raw_weights[o, i] K_i(x, sv_j)`` for a bank, shape ``(n, n_out)``.

    The weights of kernels sharing a (subset, bandwidth) pair are added first,
    so the cost is ``n * n_SV * n_pairs`` kernel values (at most ``m``).
    """
    Xq = _dense(X)
    SV = _dense(support_vectors)
    tables = _driver_tables(bank, Xq.shape[1])
    pair_of, pair_subset, pair_gamma, unique_subsets = tables.pairs
    raw_weights = np.atleast_2d(raw_weights)
    W = np.zeros((raw_weights.shape[0], len(pair_gamma)))
    for o in range(raw_weights.shape[0]):
        W[o] = np.bincount(pair_of, weights=raw_weights[o], minlength=len(pair_gamma))
    coef = np.ascontiguousarray(np.atleast_2d(dual_coef), dtype=np.float64)
    return _bank_predict(Xq, SV, coef, W, unique_subsets, pair_subset, pair_gamma)


def _dense(X) -> np.ndarray:
    if sp.issparse(X):
        X = X.toarray()
    return np.ascontiguousarray(X, dtype=np.float64)


# ----------------------------------------------------------------------------- shard and problem


class BankShard(ShardBase):
    """Rows ``X`` (dense) for kernels ``[k0, k1)`` of a bank.

    The kernel tables are generated here from ``(seed, i)``; ``V`` is kept
    kernel-major (``self.V`` is its transposed view, shape ``(n_rows, m)``).
    """

    def __init__(self, X, y, row_offset: int, bank: RandomGaussianBank, kernels: tuple[int, int] | None = None):
        X = _dense(X)
        if X.ndim != 2 or X.shape[0] != len(y):
            raise ValueError(f"shard has {X.shape[0]} rows but {len(y)} labels")
        k0, k1 = (0, bank.n_kernels) if kernels is None else (int(kernels[0]), int(kernels[1]))
        if not 0 <= k0 < k1 <= bank.n_kernels:
            raise ValueError(f"kernel block {kernels} is outside the bank's {bank.n_kernels} kernels")
        super().__init__(y, row_offset, k1 - k0)
        self.X = X
        self.bank = bank
        self.kernels = (k0, k1)
        self.tables = BankTables(bank, k0, k1, X.shape[1])
        self.shared = self.tables.n_pairs <= _MEMO_FRACTION * self.n_kernels
        if not self.shared:
            self.tables._pairs = None  # not needed: free them
        self._VT = np.zeros((self.n_kernels, self.n_rows))
        self.V = self._VT.T
        self._g = np.zeros(self.n_rows)
        if self.shared:
            _, _, pair_gamma, unique_subsets = self.tables.pairs
            self._work = bank_workspace(self.n_rows, X.shape[1], unique_subsets.shape[0], pair_gamma.shape[0])
        else:
            self._work = bank_workspace(self.n_rows, X.shape[1])

    def point(self, local: int) -> np.ndarray:
        return self.X[local].copy()

    def diagonal(self) -> np.ndarray:
        return np.ones((self.n_rows, self.n_kernels))

    def trace_parts(self) -> list[int]:
        # K_i(x, x) = exp(0) = 1 exactly, so every trace part is the row count.
        return [self.n_rows << SHIFT] * self.n_kernels

    def _step(self, ip, iq, p, q, coef):
        p = np.ascontiguousarray(p, dtype=np.float64)
        q = np.ascontiguousarray(q, dtype=np.float64)
        t = self.tables
        ridge_p, ridge_q = self.picked_ridge(ip, iq)
        if self.shared:
            pair_of, pair_subset, pair_gamma, unique_subsets = t.pairs
            return bank_superstep_shared(
                self.X, p, q, unique_subsets, pair_subset, pair_gamma, pair_of, self._VT, self.y, self.row_offset,
                ip, iq, self.inv_trace, ridge_p, ridge_q, coef, self._g, self._work,
            )  # fmt: skip
        return bank_superstep_direct(
            self.X, p, q, t.subsets, t.gamma, self._VT, self.y, self.row_offset,
            ip, iq, self.inv_trace, ridge_p, ridge_q, coef, self._g, self._work,
        )  # fmt: skip

    def superstep_scores(self, ip, iq, p, q, coef) -> np.ndarray:
        """Superstep, then this block's partial ``g`` (computed in the same pass)."""
        self.superstep(ip, iq, p, q, coef)
        return self._g.copy()

    def support_margins(self, weights):
        local = np.flatnonzero(self.alpha > 0)
        return local + self.row_offset, self.alpha[local], exact_weighted_row_sums(self._VT, local, weights)

    def _candidate(self, local: int, g: float) -> Candidate:
        if local < 0:
            return Candidate(-1, -np.inf)
        return Candidate(self.row_offset + local, float(g), np.ascontiguousarray(self._VT[:, local]), self.point(local))


def bank_kernel_block(bank: RandomGaussianBank, n_features: int, p, q):
    """``K_i(p, p) = 1``, ``K_i(q, q) = 1`` and ``K_i(p, q)`` for every kernel of the bank (driver side)."""
    t = _driver_tables(bank, n_features)
    kpq = np.empty(bank.n_kernels)
    p = np.ascontiguousarray(p, dtype=np.float64)
    q = np.ascontiguousarray(q, dtype=np.float64)
    bank_point_values(p, q, t.subsets, t.gamma, kpq)
    ones = np.ones(bank.n_kernels)
    return ones, ones, kpq


class BankProblem:
    """Feature rows ``X`` with a :class:`RandomGaussianBank`, evaluated by :class:`BankShard`.

    A :class:`mwumkl_dist.problems.Problem`.

    ``X`` is kept dense (bank kernels read single features).  The driver's
    per-iteration ``kernel_block`` uses the whole bank's tables, built once
    (``O(m * subset_size)`` memory, never ``m`` Python objects).
    """

    def __init__(self, X, y, bank: RandomGaussianBank):
        self.X = _dense(X)
        self.y = np.asarray(y, dtype=np.float64)
        if len(self.y) != self.X.shape[0]:
            raise ValueError(f"{self.X.shape[0]} rows but {len(self.y)} labels")
        self.bank = bank
        self.n_samples = self.X.shape[0]
        self.n_features = self.X.shape[1]
        self.n_kernels = bank.n_kernels

    def make_shard(self, start: int, stop: int, kernels: tuple[int, int] | None = None) -> BankShard:
        return BankShard(self.X[start:stop], self.y[start:stop], start, self.bank, kernels)

    def shard_factory(self, start: int, stop: int, kernels: tuple[int, int] | None = None):
        """A picklable callable that builds the shard (and generates its kernel block) on the worker."""
        return functools.partial(
            BankShard, self.X[start:stop].copy(), self.y[start:stop].copy(), start, self.bank, kernels
        )

    def row_ranges(self, n_shards: int) -> list[tuple[int, int]]:
        return split_rows(self.n_samples, n_shards)

    def kernel_ranges(self, n_blocks: int) -> list[tuple[int, int]]:
        return split_rows(self.n_kernels, n_blocks)

    def kernel_block(self, p, q):
        return bank_kernel_block(self.bank, self.n_features, p, q)

    def point(self, j: int) -> np.ndarray:
        return self.X[int(j)].copy()
