"""The linear stage as map-reduce: the state on the rows stays on the shards, the client gets sums of r-sized parts."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from mwumkl_dist import MWUMKLClassifier
from mwumkl_dist.core import partition
from mwumkl_dist.engines.pool import LocalPool
from mwumkl_dist.solvers import two_stage
from mwumkl_dist.solvers.two_stage.margins import exact_step, line_sums

pytestmark = pytest.mark.timeout(300, method="thread")


def _sorted_line_search(vd, dd, m, q, cw, C) -> float:
    """The exact line search by a sort of all breakpoints (the solver's before the map-reduce), clipped to [0, 1]."""
    active = (m > 0) | ((m == 0) & (q < 0))
    alpha = vd - C * np.sum((cw * q * m)[active])
    beta = dd + C * np.sum((cw * q * q)[active])
    with np.errstate(divide="ignore", invalid="ignore"):
        tj = m / q
    leaving, entering = active & (q > 0), ~active & (q < 0)
    events = np.flatnonzero((leaving | entering) & (tj > 0))
    order = events[np.argsort(tj[events], kind="stable")]
    sign = np.where(leaving[order], 1.0, -1.0)
    alphas = alpha + np.concatenate(([0.0], np.cumsum(sign * C * (cw * q * m)[order])))
    betas = beta + np.concatenate(([0.0], np.cumsum(-sign * C * (cw * q * q)[order])))
    nxt = np.concatenate((tj[order], [np.inf]))
    with np.errstate(invalid="ignore", over="ignore"):
        g = np.where(np.isinf(nxt), np.inf, alphas + betas * nxt)
    k = int(np.flatnonzero(g >= 0)[0])
    t = float(-alphas[k] / betas[k]) if betas[k] > 0 else 0.0
    return min(max(t, 0.0), 1.0)


@pytest.mark.parametrize("seed", range(12))
def test_the_line_search_from_sums_finds_the_sorted_search_step(seed):
    rng = np.random.default_rng(seed)
    n = 5000
    m = rng.standard_normal(n) * 2.0
    q = rng.standard_normal(n) * rng.choice([0.1, 1.0, 5.0])
    q[rng.random(n) < 0.05] = 0.0
    m[rng.random(n) < 0.02] = 0.0
    cw = rng.uniform(0.5, 2.0, n)
    C, dd = float(rng.choice([0.1, 1.0, 30.0])), float(rng.uniform(0.5, 5.0))
    vd = float(rng.uniform(-3.0, 1.0)) * dd
    cuts = [0, 1234, 1300, 4100, n]  # the sums of any parts add up to the same root

    def sums(ts):
        return sum(line_sums(m[a:b], q[a:b], cw[a:b], ts) for a, b in zip(cuts[:-1], cuts[1:]))

    rounds = []

    def query(ts):
        rounds.append(len(ts))
        return sums(ts)

    t = exact_step(vd, dd, C, sums((0.0, 1.0)), query)
    want = _sorted_line_search(vd, dd, m, q, cw, C)
    assert t == pytest.approx(want, rel=1e-9, abs=1e-12)
    assert len(rounds) <= 12 and max(rounds, default=0) <= 8  # a few round trips of a few steps each


def test_the_line_search_ends_at_the_interval_ends():
    m, q, cw = np.array([1.0, 2.0]), np.array([1.0, 1.0]), np.ones(2)
    first = line_sums(m, q, cw, (0.0, 1.0))
    assert exact_step(5.0, 1.0, 1.0, first, None) == 0.0  # not a descent direction
    assert exact_step(-100.0, 1.0, 1.0, first, None) == 1.0  # the minimum beyond the full step


def _pool(F, y, c, n_shards):
    slots = partition.linear_row_ranges(len(y), n_shards, 64)
    pool = LocalPool(
        slots, lambda r: functools.partial(two_stage.LinearShard, F[r[0] : r[1]], *r, row_block=64, storage="memory")
    )
    pool.call("load_problem", lambda r: (two_stage.GivenFeatures(F.shape[1]), y[r[0] : r[1]], c[r[0] : r[1]], None,
                                         None, "float64"))  # fmt: skip
    return pool


def test_a_rebuilt_shard_replays_the_solve_to_the_same_bits():
    """A shard built again and given the solve's log holds the lost one's outputs and Hessian rows, bit for bit."""
    rng = np.random.default_rng(4)
    F = rng.standard_normal((500, 8))
    y = np.where(F[:, 0] + 0.7 * rng.standard_normal(500) > 0, 1.0, -1.0)
    c = rng.uniform(0.5, 2.0, 500)
    train = rng.random(500) < 0.8
    with _pool(F, y, c, 3) as pool:
        first = two_stage.newton_solve(pool, two_stage.Basis(8, None), 2.0, train=train)
        start = np.append(first.coef, first.intercept) * 0.9
        second = two_stage.newton_solve(pool, two_stage.Basis(8, None), 5.0, start=start, hessian=first.hessian)
        log = second.hessian[1]
        assert len(log.steps) == second.n_iter and log.from_log is not None
        for slot, lost in zip(pool.slots, pool.shards):
            # the rebuilt shard: its problem loaded, then the kept call (the log as it is now)
            fresh = two_stage.LinearShard(F[slot[0] : slot[1]], *slot, row_block=64, storage="memory")
            fresh.load_problem(two_stage.GivenFeatures(8), y[slot[0] : slot[1]], c[slot[0] : slot[1]], None, None,
                               "float64")  # fmt: skip
            fresh.solve_begin(log.for_rows(*slot))
            np.testing.assert_array_equal(fresh.solve_.o, lost.solve_.o)
            np.testing.assert_array_equal(fresh.solve_.active, lost.solve_.active)
            np.testing.assert_array_equal(fresh.solve_.was_active, lost.solve_.was_active)
            np.testing.assert_array_equal(fresh._masks[first.hessian[1].token], lost._masks[first.hessian[1].token])


def _shapes(value):
    """The shapes of every array in a shard's answer (nested in lists, tuples, dicts)."""
    if isinstance(value, np.ndarray):
        return [value.shape]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _shapes(v)]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _shapes(v)]
    return []


def _recording(monkeypatch, cls, answers):
    original = cls.call

    def call(self, method, args_for=None, **options):
        out = original(self, method, args_for, **options)
        if cls is LocalPool and not isinstance(self.shards[0], two_stage.LinearShard):
            return out  # the weight stage's MWU shards
        answers.append((method if isinstance(method, str) else getattr(method, "__name__", "?"), _shapes(out)))
        return out

    monkeypatch.setattr(cls, "call", call)


# The rank grows from 20 landmarks by the held-out error (rank_by="gain"): the solves report their held-out outputs.
PARAMS = dict(C=10.0, solver="two-stage", kernels="poly:1,gaussian:0.5,gaussian:1", n_jobs=1, polish=False)


@pytest.fixture
def small(monkeypatch):
    monkeypatch.setattr(partition, "ROW_BLOCK", 256)
    monkeypatch.setattr(two_stage.solver, "N_COMPONENTS", 20)


def _data(n, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.random((n, 4))
    y = np.where(np.sin(3 * X[:, 0]) + X[:, 1] ** 2 + 0.3 * rng.standard_normal(n) > 0.9, "yes", "no")
    return X, y


def _assert_no_row_vectors(answers, n):
    """No answer of the linear stage has a dimension of the rows' size (the old solver's ``F d`` per Newton step
    did): r-vectors, r x r parts, the sketch's rows; the outputs come on the held-out rows only, once per solve."""
    assert any(name == "solve_step" for name, _ in answers)
    held = round(two_stage.CHECK_FRACTION * n)
    for name, shapes in answers:
        if name == "solve_outputs":
            assert 0 < sum(s[0] for s in shapes) <= held + 2, (name, shapes)
        else:
            assert max((max(s, default=0) for s in shapes), default=0) < n // 8, (name, shapes)


def test_the_client_receives_no_row_vector_in_the_local_linear_stage(small, monkeypatch):
    X, y = _data(2400)
    answers: list = []
    _recording(monkeypatch, LocalPool, answers)
    est = MWUMKLClassifier(**PARAMS, n_shards=2).fit(X, y)
    assert est.rank_stop_reason_ in ("gain", "residual") and len(est.rank_path_) >= 2
    _assert_no_row_vectors(answers, len(y))


distributed = pytest.importorskip("distributed")


@pytest.mark.timeout(300, method="thread")
def test_the_client_receives_no_row_vector_from_dask_shards_and_gets_the_local_model(small, monkeypatch):
    from mwumkl_dist.engines.dask_pool import DaskPool

    X, y = _data(2400)
    ref = MWUMKLClassifier(**PARAMS).fit(X, y)
    answers: list = []
    _recording(monkeypatch, DaskPool, answers)
    with distributed.Client(processes=False, n_workers=2, threads_per_worker=1, dashboard_address=":0") as client:
        est = MWUMKLClassifier(**PARAMS, engine="dask", client=client).fit(X, y)
    _assert_no_row_vectors(answers, len(y))
    for name in ("kernel_weights_", "support_", "dual_coef_", "intercept_", "C_"):
        np.testing.assert_array_equal(getattr(est, name), getattr(ref, name), err_msg=name)


def test_the_newton_system_is_solved_where_rounding_left_the_gram_sums_a_little_indefinite():
    import scipy.linalg

    from mwumkl_dist.solvers.two_stage.newton import newton_system_solution

    rng = np.random.default_rng(3)
    vectors, _ = np.linalg.qr(rng.standard_normal((6, 6)))
    b, C = rng.standard_normal(6), 100.0
    eigenvalues = np.array([5.0, 2.0, 1.0, 0.5, 1e-3, 0.0])
    gram = (vectors * eigenvalues) @ vectors.T
    assert np.allclose(newton_system_solution(gram, C, b), np.linalg.solve(np.eye(6) + C * gram, C * b))
    # A running sum's rounding: the last eigenvalue below -1 / C, where no Cholesky factor exists.
    eigenvalues[-1] = -3.0 / C
    indefinite = (vectors * eigenvalues) @ vectors.T
    with pytest.raises(np.linalg.LinAlgError):
        scipy.linalg.cho_factor(np.eye(6) + C * indefinite)
    nearest = (vectors * np.maximum(eigenvalues, 0.0)) @ vectors.T  # the nearest positive semi-definite sums
    assert np.allclose(newton_system_solution(indefinite, C, b), np.linalg.solve(np.eye(6) + C * nearest, C * b))
