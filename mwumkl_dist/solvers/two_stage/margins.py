"""The Newton solve as map-reduce: the state on the rows stays on the shards, the client holds ``r``-sized state.

A shard keeps, for its rows, the outputs ``o = F v + b`` of the current iterate, ``F d + d_b`` of the current
direction, the fitted rows and the active sets (:class:`ShardSolve`).  The client (:mod:`.newton`) sends
``r``-vectors (a direction, a step length, a product's coefficients) and gets back sums over the rows: the loss and
the active rows' counts, ``r x r`` Gram parts, ``r``-vectors, and for the line search a few numbers per candidate step
(:func:`line_sums`, :func:`exact_step`).  Every sum follows the tree over the global row blocks, so any sharding gives
the same bits.

A lost shard rebuilds its state from the client's :class:`SolveLog` (the start, every step's direction and length,
which step the Hessian's sums were last brought to): the replay repeats the same operations, so a rebuilt shard
holds the same bits as the one lost.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace

import numpy as np

__all__ = ["LINE_FIELDS", "MAX_LINE_ROUNDS", "SolveLog", "ShardSolve", "exact_step", "line_sums", "row_keys"]

#: Per candidate step ``t`` a shard returns ``[a_right, b_right, a_left, b_left, n_le, n_lt]`` (:func:`line_sums`).
LINE_FIELDS = 6
#: Candidate steps per round trip of the line search after its first (which asks for ``t = 0`` and ``t = 1`` with the
#: direction's outputs): the two pieces' roots at the bracket's ends and evenly spaced ones between.
LINE_CANDIDATES = 8
#: Round trips after which the line search takes the root of its lower end's piece (never reached where measured:
#: two or three rounds per step).
MAX_LINE_ROUNDS = 60

_tokens = itertools.count(1)


def line_sums(m, q, cw, ts) -> np.ndarray:
    """The line search's sums on some rows at each candidate step: ``(len(ts), LINE_FIELDS)``.

    Along ``v + t d`` a fitted row's loss is ``c max(0, m - t q)^2 / 2`` (``m = 1 - y o``, ``q = y (F d + d_b)``):
    active (inside the margin) for ``t`` below its breakpoint ``m / q`` where ``q > 0``, above it where ``q < 0``,
    always or never where ``q = 0``.  ``f'(t) = v'd + t d'd - C (a - t b)`` with ``a = sum c q m``, ``b = sum c q^2``
    over the active rows: a line between breakpoints.  Per ``t``: ``a``, ``b`` over the rows active just right of
    ``t`` and just left of it, and the breakpoints ``<= t`` and ``< t`` (counts, for the exactness test of
    :func:`exact_step`).  Breakpoints decide the active rows, not ``m - t q``, so the counts and the sums agree.
    """
    m, q, cw = (np.asarray(a, dtype=np.float64) for a in (m, q, cw))
    pos, neg, moving = q > 0, q < 0, q != 0
    always = ~moving & (m > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        tj = np.where(moving, m / np.where(moving, q, 1.0), 0.0)
    qm, qq = cw * q * m, cw * q * q
    out = np.empty((len(ts), LINE_FIELDS))
    for k, t in enumerate(ts):
        right = always | (pos & (t < tj)) | (neg & (t >= tj))
        left = always | (pos & (t <= tj)) | (neg & (t > tj))
        out[k] = (np.sum(qm[right]), np.sum(qq[right]), np.sum(qm[left]), np.sum(qq[left]),
                  np.count_nonzero(moving & (tj <= t)), np.count_nonzero(moving & (tj < t)))  # fmt: skip
    return out


def exact_step(vd: float, dd: float, C: float, first, query) -> float:
    """The exact minimiser in ``[0, 1]`` of ``f(v + t d)`` (the squared hinge along a direction), from sums only.

    ``first``: :func:`line_sums`' totals at ``t = 0`` and ``t = 1`` (sent with the direction's outputs);
    ``query(ts)``: the totals at other steps (one round trip).  ``f'`` is increasing and piecewise linear
    (:func:`line_sums`): a bracket ``lo < root <= hi`` narrows by each round's candidates (the root of the piece
    right of ``lo``, of the piece left of ``hi``, evenly spaced steps between) until no breakpoint lies strictly
    inside it; there ``f'`` is one line, whose root is the step: the piece's own root, as a sort of all breakpoints
    finds it, with its sums in tree order.  0 where ``d`` is no descent direction, 1 where the root is beyond it.
    """

    def derivative(row, t, side=0):
        return vd - C * row[2 * side] + t * (dd + C * row[2 * side + 1])

    def root(row, side, fallback):
        slope = dd + C * row[2 * side + 1]
        return (C * row[2 * side] - vd) / slope if slope > 0 else fallback

    at0, at1 = first
    if derivative(at0, 0.0) >= 0:
        return 0.0
    if derivative(at1, 1.0) <= 0:
        return 1.0
    lo, hi, rlo, rhi = 0.0, 1.0, at0, at1
    for _ in range(MAX_LINE_ROUNDS):
        if rhi[5] - rlo[4] <= 0:  # no breakpoint in (lo, hi): one line
            break
        guesses = [root(rlo, 0, lo), root(rhi, 1, hi), *np.linspace(lo, hi, LINE_CANDIDATES)[1:-1]]
        ts = sorted({float(t) for t in guesses if lo < t < hi})
        if not ts:  # the bracket is as narrow as doubles go
            break
        for t, row in zip(ts, query(ts)):
            if derivative(row, t) < 0:
                lo, rlo = t, row
            else:
                hi, rhi = t, row
                break
    t = root(rlo, 0, lo)
    return float(min(max(t, lo), hi)) if np.isfinite(t) else lo


def row_keys(seed: int, rows) -> np.ndarray:
    """A pseudo-random key in ``[0, 1)`` for each global row index (splitmix64 of the seed and the row): the same
    for a row on any shard, so a random sample of rows drawn by the smallest keys does not depend on the sharding."""
    with np.errstate(over="ignore"):
        z = np.asarray(rows, dtype=np.uint64) + np.uint64((int(seed) * 0x9E3779B97F4A7C15) % 2**64)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) / float(2**53)


@dataclass
class SolveLog:
    """What the client sends to start a solve, and what a rebuilt shard needs to rebuild its state (``r``-sized
    apart from the fitted rows' mask, which the client holds and sends each shard its own rows of).

    ``token``: the solve's number (its Hessian's active set is kept under it); ``level``: the features' level;
    ``fitted``: a boolean mask of the fitted rows (None: all; on the shard: ``np.packbits`` of its rows, see
    :meth:`for_rows`); ``start``: the starting ``[w, b]`` (None: 0); ``from_log``: the log of the explicit solve
    whose active set the Hessian's sums start from (None: no rows); ``steps``: ``(d, t)`` of each step taken;
    ``pending``: the direction whose outputs the shards hold (not stepped along yet); ``synced``: the steps after
    which the Hessian's sums were last brought to the active set (None: not in this solve).
    """

    level: int
    fitted: np.ndarray | None = None
    start: np.ndarray | None = None
    from_log: SolveLog | None = None
    token: int = field(default_factory=lambda: next(_tokens))
    steps: list = field(default_factory=list)
    pending: np.ndarray | None = None
    synced: int | None = None

    def for_rows(self, lo: int, hi: int) -> SolveLog:
        """The log as the shard of rows ``[lo, hi)`` gets it (its rows of the mask, packed; a snapshot)."""
        fitted = None if self.fitted is None else np.packbits(self.fitted[lo:hi])
        from_log = None if self.from_log is None else self.from_log.for_rows(lo, hi)
        return replace(self, fitted=fitted, from_log=from_log, steps=list(self.steps))


@dataclass
class ShardSolve:
    """A shard's state of one solve on its rows: ``o``, the direction's outputs ``delta``, the fitted rows,
    the active rows now, and ``was_active``: the rows the client's Hessian sums hold (see :mod:`.newton`)."""

    token: int
    level: int
    fitted: np.ndarray
    o: np.ndarray
    active: np.ndarray
    was_active: np.ndarray
    delta: np.ndarray | None = None

    def margins(self, y) -> np.ndarray:
        """The fitted rows inside the margin: ``y o < 1``."""
        return (y * self.o < 1.0) & self.fitted
