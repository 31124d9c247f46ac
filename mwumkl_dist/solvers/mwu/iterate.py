"""The MWUMKL iteration: Find-alpha, the superstep and Exponentiate-M on an engine, until ``T``.

The rules it applies are :mod:`mwumkl_dist.core.mwu_rules`; the engine (:class:`mwumkl_dist.engines.base.Engine`)
holds the ``O(m n)`` state and only moves data.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from mwumkl_dist.core.mwu_rules import (
    MWUResult,
    SolverState,
    bias_and_scale,
    check_ridge,
    eps_prime,
    exponentiate,
    kernel_weights,
    training_scores,
)
from mwumkl_dist.core.progress import Phase
from mwumkl_dist.devices.threads import sigint_requests_stop
from mwumkl_dist.engines.base import Engine

__all__ = ["Iterations", "solve"]


# A first Ctrl-C asks the loop to stop after the current iteration, a second aborts (in a fold on a
# helper thread of a parallel region too: the region shares the main thread's request).
_sigint_requests_stop = sigint_requests_stop


@dataclass(frozen=True)
class Iterations:
    """How the MWU iteration runs: precision ``epsilon``, width ``rho`` and ``n_iter`` iterations."""

    epsilon: float
    rho: float
    n_iter: int


def solve(
    engine: Engine,
    iterations: Iterations,
    *,
    inv_trace: np.ndarray,
    ridge: float | np.ndarray,
    progress: Phase | None = None,
    callback_every: int = 100,
    state: SolverState | None = None,
    on_state: Callable[[SolverState], None] | None = None,
    selectivity: float | None = None,
    rows_to_score: Callable[[np.ndarray], np.ndarray] | None = None,
) -> MWUResult:
    """Run ``iterations.n_iter`` MWUMKL iterations on ``engine`` and build the final model.

    ``n_iter = 0`` runs none: the weights are uniform (those of every fit at selectivity 0, see
    :func:`~mwumkl_dist.core.mwu_rules.kernel_weights`) and the dual is zero, for a fit whose model the
    exact polish solves (a cross-validation fold at selectivity 0, where the iterations change nothing).

    ``progress`` (the fit's ``"iterations"`` phase) is updated every ``callback_every`` iterations
    and at the end, with ``s``; when its sink returns ``True`` the loop stops early (the model is
    built from the iterations done).  Ctrl-C (SIGINT, when solving in the main thread or
    in a parallel region it started, :func:`~mwumkl_dist.devices.threads.ordered_map`) does
    the same at the end of the current iteration, so an interrupted fit keeps
    what it computed (``interrupted=True``); a second Ctrl-C aborts.
    ``state`` resumes from a :class:`SolverState`; ``on_state`` sees the state
    after every iteration (used for checkpoints).  ``ridge`` is ``1 / C``
    for every point, or an ``(n_samples,)`` array of per-point values (the
    engine's shards must be configured with the same).  ``selectivity`` sets the exponents'
    scale (:func:`exponent_scale`): ``None`` is the paper's rule.
    ``rows_to_score(counts)`` names the training rows (increasing) whose decision values the result
    brings (``scores``, without bias), given the alpha counts (the support set is known only now):
    read off ``V`` while the engine still holds it (:func:`~mwumkl_dist.core.mwu_rules.training_scores`),
    far cheaper than the predictor's kernel sums over the support vectors.

    The rules' ``m``-vectors live where the engine keeps them (:meth:`Engine.rules`): with GPU shards
    in this process on that GPU, so an iteration moves no ``m``-vector to the host; ``s`` is copied
    there for a callback and at the end.
    """
    eps_p, rho, n_iter = eps_prime(iterations.epsilon, iterations.rho), iterations.rho, iterations.n_iter
    ridge = check_ridge(ridge, engine.n_samples)
    if n_iter == 0 and state is None:  # weights only (see MWUSolver): uniform, the dual left to the exact polish
        m = engine.n_kernels
        return MWUResult(np.zeros(engine.n_samples), np.full(m, 1.0 / m), 0.0, 0, np.zeros(m), False, None, None)
    if state is None:
        pos, neg = engine.initial_candidates()
        state = SolverState(0, np.zeros(engine.n_kernels), pos, neg)
    rules = engine.rules(state.s, inv_trace=inv_trace, ridge=ridge, eps_p=eps_p, rho=rho, selectivity=selectivity)
    report = progress if progress is not None and not progress.silent else None  # s to the host only for a listener
    t, interrupted = _iterate(engine, rules, state, n_iter, on_state, report, callback_every)
    if t == 0:
        raise RuntimeError("the fit was interrupted before its first iteration; no model to build")
    s = rules.host_s()
    mu = kernel_weights(exponentiate(s, eps_p, rho, selectivity))  # once, on the host (numpy's sum)
    counts = engine.alpha_counts()
    pos_sum, neg_sum = engine.class_sums(mu)
    # alpha = counts / t, V = G counts: P (with alpha/t and V/t) = pos_sum / t^2.
    b, scale = bias_and_scale(pos_sum / t**2, neg_sum / t**2)
    rows = scores = None
    if rows_to_score is not None:
        rows = np.asarray(rows_to_score(counts), dtype=np.int64)
        h = engine.row_margins(rows, mu)
        scores = training_scores(
            h, counts[rows], ridge if np.ndim(ridge) == 0 else ridge[rows], engine.y[rows], scale / t
        )
    return MWUResult(counts / t * scale, mu, b, t, s, interrupted, rows, scores)


def _iterate(engine: Engine, rules, state: SolverState, n_iter: int, on_state, report, callback_every: int):
    """:func:`solve`'s loop from ``state`` to ``n_iter`` (or a stop): ``(iterations done, interrupted)``."""
    pos, neg, t, picks = state.pos, state.neg, state.iteration, list(state.picks)
    with _sigint_requests_stop() as stop:
        while t < n_iter:
            coef = rules.step(pos, neg, t + 1)
            picks.append((pos.index, neg.index))
            pos, neg = engine.superstep(pos, neg, coef)
            rules.commit(t + 1)
            t += 1
            if on_state is not None:
                on_state(SolverState(t, rules.s, pos, neg, picks))
            if report is not None and (t % callback_every == 0 or t == n_iter):
                if report.update(t, s=rules.host_s()):
                    return t, t < n_iter
            if stop.requested:
                warnings.warn(
                    f"interrupted after {t} of {n_iter} iterations: the model is built from those", stacklevel=3
                )
                return t, t < n_iter
    return t, False
