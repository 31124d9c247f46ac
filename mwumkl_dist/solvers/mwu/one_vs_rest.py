"""The MWU solver's one-vs-rest loop: each binary problem on its engine, with checkpoints and resume.

:func:`solve_one_vs_rest` builds each problem's engine (:func:`make_engine`: local or Dask, CPU or
GPU shards), runs the MWU iteration on it (:func:`mwumkl_dist.solvers.mwu.iterate.solve`), writes
checkpoints and resumes from one, and names the checkpoint to resume from when a Dask cluster is lost.
"""

from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass

import numpy as np

from mwumkl_dist.core import progress
from mwumkl_dist.core.mwu_rules import Candidate, FitInterrupted, MWUResult, SolverState
from mwumkl_dist.data.backends import CPUBackend
from mwumkl_dist.data.problems import Problem, TrainingInput, check_traces
from mwumkl_dist.devices.memory import resolve_memory_limit
from mwumkl_dist.devices.threads import current_threads
from mwumkl_dist.engines.base import Engine
from mwumkl_dist.engines.layout import Layout, cluster_threads, mwu_layout
from mwumkl_dist.engines.local import LocalEngine
from mwumkl_dist.io.atomic import exclusive_writer
from mwumkl_dist.io.checkpoint import Checkpointer, check_resumable, fingerprint, load_checkpoint
from mwumkl_dist.solvers.base import fit_backend, one_vs_rest_targets
from mwumkl_dist.solvers.mwu.iterate import Iterations, solve
from mwumkl_dist.solvers.spec import FitSpec

__all__ = [
    "MIN_ROWS_PER_SHARD",
    "SolveSettings",
    "base_ridge",
    "check_shard_count",
    "iterations_phase",
    "make_engine",
    "solve_one_vs_rest",
]

#: Fewer rows than this per row shard draws a warning: a shard's fixed cost per superstep (and,
#: on Dask, its actor and socket) then outweighs its work.  More shards than rows is an error.
MIN_ROWS_PER_SHARD = 16


@dataclass
class SolveSettings:
    """What the binary problems of a fit are solved with.

    ``ridges`` holds one ridge per binary problem (one-vs-rest target): ``1 / C_eff``
    as a float, or ``1 / C_j`` per training point with sample or class weights
    (see :mod:`mwumkl_dist.data.weights`); each goes to the engines and to the polish as it is.
    ``selectivity`` is what :func:`mwumkl_dist.solvers.mwu.solve` takes (None: the paper's rule).
    """

    epsilon: float
    rho: float
    n_iter: int
    ridges: list
    selectivity: float | None = None


def base_ridge(C: float, n_samples: int, scale_C: bool) -> float:
    """``1 / C_eff`` with ``C_eff = C * n`` (``scale_C``) or ``C``; 0 for the hard margin."""
    return 0.0 if np.isinf(C) else 1.0 / (C * n_samples if scale_C else C)


def check_shard_count(n_shards, n_samples: int) -> None:
    """Refuse more row shards than training points; warn below :data:`MIN_ROWS_PER_SHARD` rows per shard.

    Every row shard costs a fixed amount per superstep (on Dask also an actor and a
    connection set up before the first iteration), whatever its rows: 300 shards of one row
    each on 208 points ran 93 s where 1 shard takes 2 s.  The model does not depend on the
    sharding, so fewer shards lose nothing.
    """
    if isinstance(n_shards, bool) or not isinstance(n_shards, (int, np.integer)) or n_shards < 1:
        raise ValueError(f"n_shards must be a positive integer, got {n_shards!r}")
    n_shards = int(n_shards)
    if n_shards > n_samples:
        raise ValueError(
            f"n_shards={n_shards} row shards for {n_samples} training points: a shard needs at least one row; "
            f"use at most {max(1, n_samples // MIN_ROWS_PER_SHARD)} shards ({MIN_ROWS_PER_SHARD}+ rows each)"
        )
    if n_shards > 1 and n_samples < n_shards * MIN_ROWS_PER_SHARD:
        warnings.warn(
            f"n_shards={n_shards} gives {n_samples // n_shards} rows per shard (fewer than {MIN_ROWS_PER_SHARD}): "
            f"each shard's fixed cost per iteration outweighs its work; "
            f"{max(1, n_samples // MIN_ROWS_PER_SHARD)} shards or fewer would be faster, with the same model",
            UserWarning,
            stacklevel=5,
        )


def make_engine(spec: FitSpec, problem: Problem, client, backend: CPUBackend | None = None) -> Engine:
    """The spec's engine (``"local"`` or ``"dask"``) holding ``problem``'s shards on ``backend``'s device (the fit
    task's; None: :func:`~mwumkl_dist.solvers.base.fit_backend`'s).

    A local ``device="cuda"`` fit runs where :func:`mwumkl_dist.devices.routing.mwu_device` says it is cheaper:
    a small one (a cross-validation fold, a two-stage fit's weight stage) on CPU threads, a large one on the
    GPU; the GPU is checked either way, so a missing one is the same error for every size
    (:meth:`~mwumkl_dist.data.backends.CPUBackend.mwu_problem`).

    ``n_shards="auto"``: one shard on the local engine; on Dask the layout of
    :func:`~mwumkl_dist.engines.layout.mwu_layout` (this process where a superstep is cheaper than a round trip to
    the workers, else one shard per worker).  The engine's ``layout`` says which, and why (None locally).
    """
    options = spec.execution
    backend = fit_backend(spec) if backend is None else backend
    problem, runs_on = backend.mwu_problem(problem, current_threads())
    auto = options.n_shards == "auto"
    if options.engine == "local":
        engine = LocalEngine(problem, n_shards=1 if auto else options.n_shards, backend=runs_on)
        engine.layout = None  # nothing to say: the local engine as asked
        return engine
    from mwumkl_dist.engines.dask import DaskEngine

    def on_dask(n_shards):
        return DaskEngine(problem, client, n_shards=n_shards, n_kernel_shards=options.n_kernel_shards,
                          timeout=options.worker_timeout, call_timeout=options.superstep_timeout)  # fmt: skip

    if not auto:
        engine = on_dask(options.n_shards)
        engine.layout = Layout("dask", options.n_shards, f"n_shards={options.n_shards} on the Dask workers")
        return engine
    if options.n_kernel_shards != 1:  # kernel blocks ask for the workers: one row shard per worker
        k = max(1, min(len(cluster_threads(client)), problem.n_samples // MIN_ROWS_PER_SHARD))
        engine = on_dask(k)
        engine.layout = Layout("dask", k, f"{k} row shard(s) x {options.n_kernel_shards} kernel blocks on the workers")
        return engine
    engine, layout = mwu_layout(
        problem, client, current_threads(), lambda: LocalEngine(problem, backend=runs_on), on_dask,
        memory_bytes=resolve_memory_limit(options.memory_limit)[0], on_host=runs_on.on_host,
        min_rows=MIN_ROWS_PER_SHARD,
    )  # fmt: skip
    engine.layout = layout
    return engine


def _fingerprint(data: TrainingInput, classes, settings: SolveSettings) -> str:
    ridges = settings.ridges
    if all(isinstance(r, float) and r == ridges[0] for r in ridges):
        ridge = ridges[0]  # one ridge for every problem and point: the fingerprint of unweighted fits
    else:  # per-point ridges: their bytes (a JSON list would be huge)
        digest = hashlib.sha256()
        for r in ridges:
            digest.update(np.ascontiguousarray(r, dtype=np.float64).tobytes())
        ridge = digest.hexdigest()
    return fingerprint(
        data.fingerprint_data(),
        data.y,
        data.kernel_names,
        {
            "eps": settings.epsilon,
            "rho": settings.rho,
            "ridge": ridge,
            "n_iter": settings.n_iter,
            "selectivity": settings.selectivity,
            "classes": np.asarray(classes).tolist(),
        },
    )


def solve_one_vs_rest(
    spec, data: TrainingInput, classes, settings: SolveSettings, client, resume=None, rows_to_score=None, backend=None
):
    """Solve the binary problem of each one-vs-rest target in turn (resuming from a checkpoint when given one),
    on ``backend``'s device (the fit task's; see :func:`make_engine`).

    Returns ``(results, traces, stats)``: the :class:`~mwumkl_dist.solvers.MWUResult` of
    each problem solved, the kernels' traces and the engines' shard counters.  ``rows_to_score``
    (see :func:`~mwumkl_dist.solvers.mwu.iterate.solve`) asks each problem solved here for its
    decision values on training rows; problems finished in a checkpoint resumed from have none.
    Raises :class:`~mwumkl_dist.solvers.FitInterrupted` when a stop left some of
    several problems unsolved.  A lost Dask cluster (``ConnectionError``, e.g.
    :class:`~mwumkl_dist.engines.dask.SchedulerLostError`, or a shard that stopped
    answering) is raised with the checkpoint to resume from added to its message.
    """
    targets = one_vs_rest_targets(classes)
    fp = None
    if spec.execution.checkpoint is not None or resume is not None:
        fp = _fingerprint(data, classes, settings)
    resumed = None
    if resume is not None:
        resumed = load_checkpoint(resume, fp)
        check_resumable(resume, resumed, n_samples=data.n_samples, n_kernels=len(data.kernel_names),
                        n_problems=len(targets), n_iter=settings.n_iter, y=data.y, targets=targets)  # fmt: skip
    results: list[MWUResult] = list(resumed["finished"]) if resumed is not None else []
    try:
        # two fits writing one checkpoint: the second fails
        with exclusive_writer(spec.execution.checkpoint, "checkpoint"):
            traces, stats = _solve_problems(spec, data, targets, settings, client, resumed, results, fp, rows_to_score,
                                            backend)  # fmt: skip
    except _cluster_failures(spec) as exc:
        raise _with_checkpoint_note(exc, spec, fp) from None
    if len(results) < len(targets):
        how = (
            f"resume it with fit(..., resume={spec.execution.checkpoint!r})"
            if spec.execution.checkpoint is not None
            else "refit with checkpoint=PATH to be able to resume"
        )
        raise FitInterrupted(
            f"the fit was interrupted after {len(results)} of {len(targets)} one-vs-rest problems; {how}"
        )
    return results, np.asarray(traces, dtype=np.float64), stats


def _solve_problems(
    spec,
    data: TrainingInput,
    targets,
    settings: SolveSettings,
    client,
    resumed,
    results,
    fp,
    rows_to_score=None,
    backend=None,
):
    """Solve the binary problems not in ``results`` yet (appending to it); ``(traces, stats)``."""
    traces, stats = data.traces, []
    for k in range(len(results), len(targets)):
        problem = data.binary(np.where(data.y == targets[k], 1.0, -1.0))
        with make_engine(spec, problem, client, backend) as engine:
            if traces is None:
                traces = engine.traces()
            check_traces(traces, data.kernel_names)
            inv_trace = 1.0 / traces
            engine.configure(inv_trace, settings.ridges[k])
            state = None
            if resumed is not None and resumed["problem_index"] == k:
                state = resume_state(resumed, problem, engine)
            on_state = None
            if spec.execution.checkpoint is not None:
                on_state = Checkpointer(spec.execution.checkpoint, spec.execution.checkpoint_every, fp, k, results)
            done = 0 if state is None else state.iteration
            with iterations_phase(settings.n_iter, k, len(targets), problem.n_samples, done) as step:
                result = solve(
                    engine, Iterations(settings.epsilon, settings.rho, settings.n_iter), inv_trace=inv_trace,
                    ridge=settings.ridges[k], progress=step, callback_every=spec.execution.callback_every, state=state,
                    on_state=on_state, selectivity=settings.selectivity, rows_to_score=rows_to_score,
                )  # fmt: skip
            stats.extend(engine.stats())
            if engine.layout is not None:
                stats.append({"layout": engine.layout})
        if result.interrupted and on_state is not None:
            on_state.save_last()  # a stop (Ctrl-C, SIGTERM): the checkpoint holds every iteration done
        results.append(result)
        if result.interrupted:
            break  # keep what was computed; the remaining classes are not fitted
    return traces, stats


def _cluster_failures(spec) -> tuple:
    """The errors of a lost cluster (scheduler, workers, shards): reported with the checkpoint to resume from."""
    if spec.execution.engine != "dask":
        return ()
    from mwumkl_dist.engines.dask import ShardLostError

    return (ConnectionError, ShardLostError)


def _with_checkpoint_note(exc: Exception, spec, fp) -> Exception:
    """``exc`` (same type) whose message also names the checkpoint this fit can resume from, if any."""
    path = spec.execution.checkpoint
    if path is None:
        if type(exc) is ConnectionError:  # e.g. no workers at the start: nothing to resume
            return exc
        note = "the fit wrote no checkpoint (fit with checkpoint=PATH, CLI --checkpoint, to be able to resume)"
    else:
        try:
            saved = load_checkpoint(path, fp)
        except (OSError, ValueError):
            saved = None
        if saved is None:
            note = (
                f"no checkpoint of this fit was written yet ({path} is written every "
                f"{spec.execution.checkpoint_every} iterations)"
            )
        else:
            note = (
                f"resume from the checkpoint {path} (iteration {saved['iteration']} of one-vs-rest problem "
                f"{saved['problem_index'] + 1}): fit(..., resume={str(path)!r}), or the CLI's --resume {path}"
            )
    message = f"{exc}; {note}"
    try:
        return type(exc)(message)
    except Exception:  # an exception type with another signature
        return ConnectionError(message)


def resume_state(resumed: dict, problem: Problem, engine: Engine) -> SolverState:
    """Replay a checkpoint's picks on a freshly configured engine; the solver state to continue from."""
    engine.replay(resumed["picks"])
    (pi, pg, pv), (ni, ng, nv) = resumed["pos"], resumed["neg"]
    return SolverState(
        resumed["iteration"],
        resumed["s"],
        Candidate(pi, pg, pv, problem.point(pi)),
        Candidate(ni, ng, nv, problem.point(ni)),
        resumed["picks"],
    )


def iterations_phase(n_iter: int, k: int, n_problems: int, n_samples: int, done: int = 0) -> progress.Phase:
    """The ``"iterations"`` progress phase of binary problem ``k`` of ``n_problems`` (``done``: resumed there)."""
    which = f", class {k + 1} of {n_problems}" if n_problems > 1 else ""
    description = f"MWU iterations on {n_samples} rows{which}"
    return progress.phase("iterations", n_iter, unit="it", description=description, done=done)
