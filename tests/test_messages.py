"""The superstep's fixed binary layouts (mwumkl_dist.engines.messages): exact round trips, the reduction's rule."""

from __future__ import annotations

import numpy as np
import pytest

from mwumkl_dist.core.mwu_rules import Candidate, reduce_candidates
from mwumkl_dist.data.problems import FeatureProblem, PrecomputedProblem
from mwumkl_dist.engines import messages
from mwumkl_dist.kernels import KernelSet
from mwumkl_dist.kernels.evaluation import SparsePoint

POINTS = [
    None,
    7,
    np.int64(123456789012),
    SparsePoint(np.array([0, 5, 99]), np.array([0.5, -1e-300, 3.0]), 100),
    SparsePoint(np.array([], dtype=np.int64), np.array([]), 4),  # an all-zero row
    np.array([0.1, 0.0, -2.5, np.inf]),
    np.array([1.0, 2.0], dtype=np.float32),  # another kind: pickled, as it was
    ("any", "object"),
]


def _same_point(a, b) -> None:
    if isinstance(a, SparsePoint):
        assert isinstance(b, SparsePoint) and a.n_features == b.n_features
        for x, y in zip(a.entries(), b.entries()):
            assert x.dtype == y.dtype and y.flags.writeable and y.flags.c_contiguous and y.flags.aligned
            np.testing.assert_array_equal(x, y)
    elif isinstance(a, np.ndarray):
        assert b.dtype == a.dtype and b.flags.writeable and b.flags.aligned
        np.testing.assert_array_equal(a, b)
    else:
        assert b == a and type(b) is (int if isinstance(a, (int, np.integer)) else type(a))


@pytest.mark.parametrize("p", POINTS, ids=lambda p: type(p).__name__)
def test_a_step_message_round_trips_exactly(p):
    coef = np.array([1.5, -0.0, np.nextafter(1.0, 2.0), -1e308])
    ip, iq, p2, q2, coef2 = messages.unpack_step(messages.pack_step(3, 2**40, p, POINTS[3], coef))
    assert (ip, iq) == (3, 2**40)
    _same_point(p, p2)
    _same_point(POINTS[3], q2)
    assert coef2.dtype == np.float64 and coef2.flags.writeable and coef2.flags.aligned  # numba's usual array kind
    np.testing.assert_array_equal(coef2, coef)
    assert np.signbit(coef2[1])  # bits, not values: -0.0 stays -0.0


def _candidates(rng, n_shards, m):
    out = []
    for k in range(n_shards):
        pair = []
        for _ in range(2):
            if rng.random() < 0.2:
                pair.append(Candidate(-1, -np.inf))  # a shard without a row of the class
                continue
            g = float(rng.choice([0.25, 0.5, rng.standard_normal()]))  # repeated scores: ties
            point = SparsePoint(np.sort(rng.choice(50, 3, replace=False)), rng.random(3), 50)
            pair.append(Candidate(1000 * k + int(rng.integers(100)), g, rng.random(m), point))
        out.append(tuple(pair))
    return out


def test_the_packed_answers_reduce_to_the_same_candidates():
    rng = np.random.default_rng(0)
    for trial in range(300):
        pairs = _candidates(rng, int(rng.integers(1, 6)), int(rng.integers(0, 5)))
        if any(all(p[c].index < 0 for p in pairs) for c in (0, 1)):
            with pytest.raises(ValueError, match="no shard holds"):
                messages.best_candidates([messages.pack_candidates(*p) for p in pairs])
            continue
        got = messages.best_candidates([messages.pack_candidates(*p) for p in pairs])
        for c, cand in enumerate(got):
            want = reduce_candidates([p[c] for p in pairs])
            assert (cand.index, cand.g) == (want.index, want.g), trial
            np.testing.assert_array_equal(cand.v_row, want.v_row)
            assert cand.v_row.flags.writeable
            _same_point(want.point, cand.point)


@pytest.mark.parametrize("kind", ["features", "precomputed"])
def test_a_shard_answers_a_packed_superstep_as_its_own(kind):
    rng = np.random.default_rng(1)
    X = rng.random((40, 3))
    y = np.where(X[:, 0] > 0.5, 1.0, -1.0)
    if kind == "features":
        problem = FeatureProblem(X, y, KernelSet("paper", 3))
    else:
        problem = PrecomputedProblem(np.stack([X @ X.T, (X @ X.T + 1) ** 2]), y)
    a, b = (problem.shard_factory(10, 40, kernels=(0, problem.n_kernels))() for _ in range(2))
    for shard in (a, b):
        shard.configure(np.full(problem.n_kernels, 0.1), 0.01)
    coef = rng.standard_normal(problem.n_kernels)
    pos, neg = np.flatnonzero(y > 0), np.flatnonzero(y < 0)
    for ip, iq in [(int(pos[0]), int(neg[0])), (int(pos[-1]), int(neg[-1]))]:
        p, q = problem.point(ip), problem.point(iq)
        want = a.superstep(ip, iq, p, q, coef)
        got = messages.best_candidates([messages.superstep(b, messages.pack_step(ip, iq, p, q, coef))])
        np.testing.assert_array_equal(a.V, b.V)
        for w, g in zip(want, got):
            assert (w.index, w.g) == (g.index, g.g)
            np.testing.assert_array_equal(w.v_row, g.v_row)
            _same_point(w.point, g.point)
    partials = messages.superstep_scores(b, messages.pack_step(ip, iq, p, q, coef))
    np.testing.assert_array_equal(partials, a.superstep_scores(ip, iq, p, q, coef))


def test_fetched_rows_round_trip():
    problem = FeatureProblem(np.eye(5)[:, :4] * 2.0, np.array([1.0, -1.0, 1.0, -1.0, 1.0]), KernelSet("paper", 4))
    shard = problem.shard_factory(1, 5, kernels=(0, problem.n_kernels))()
    shard.V[:] = np.arange(shard.V.size).reshape(shard.V.shape)
    rows = messages.unpack_rows(messages.fetch_rows(shard, [2, -1, 3]), 3)
    assert rows[1] is None
    for local, (v_row, point) in zip([2, 3], [rows[0], rows[2]]):
        np.testing.assert_array_equal(v_row, shard.V[local])
        _same_point(shard.point(local), point)
