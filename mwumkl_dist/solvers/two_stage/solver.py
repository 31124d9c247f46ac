"""The two-stage solver: kernel weights from a subsample, the classifier from all rows."""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import time
import warnings
from dataclasses import dataclass, replace

import numpy as np

from mwumkl_dist.core import partition, progress
from mwumkl_dist.data.weights import problem_weights, score_weights
from mwumkl_dist.devices.memory import parse_memory_limit, resolve_memory_limit
from mwumkl_dist.devices.threads import current_threads, one_blas_thread
from mwumkl_dist.engines.layout import linear_shard_count, pool_lanes, worker_memory
from mwumkl_dist.kernels.specs import KernelSet
from mwumkl_dist.solvers.auto import standard_error_of_sum, stratified_rows
from mwumkl_dist.solvers.base import Calibration, FitTask, FittedModel, predicted_labels
from mwumkl_dist.solvers.candidates import chosen_candidate, search_attributes
from mwumkl_dist.solvers.mwu.polish import POLISH_MAX_POINTS
from mwumkl_dist.solvers.spec import FitSpec
from mwumkl_dist.solvers.two_stage.budget import MemoryLimitError, MemoryPlan, memory_plan, shard_memory
from mwumkl_dist.solvers.two_stage.exact import exact_affordable, exact_gram, solve_exact
from mwumkl_dist.solvers.two_stage.newton import (
    NewtonOptions,
    cg_newton_solve,
    linear_costs,
    linear_method,
    newton_solve,
)
from mwumkl_dist.solvers.two_stage.nystroem import (
    COLUMN_MEMORY,
    N_COMPONENTS,
    PRUNE,
    RANK_MAX,
    RESIDUAL_POINTS,
    RESIDUAL_TOL,
    WEIGHT_POINTS,
    landmark_order,
    nystroem_map,
    nystroem_residual,
    pruned_weights,
    rank_budget,
    rank_levels,
    unit_weights,
)
from mwumkl_dist.solvers.two_stage.shards import linear_shards, pass_cost, sum_parts

__all__ = [
    "AUTO_TWO_STAGE_POINTS",
    "CHECK_FACTORS",
    "CHECK_FRACTION",
    "CHECK_POINTS",
    "RANK_STOP_REASONS",
    "ResidualWarning",
    "TwoStageSolver",
    "exact_wanted",
    "two_stage_blocker",
    "weight_points_for",
]

logger = logging.getLogger("mwumkl_dist")


#: ``solver="auto"`` uses the two-stage fit wherever the exact polish cannot run (above its
#: :data:`~mwumkl_dist.solvers.mwu.polish.POLISH_MAX_POINTS` rows) and the MWU fit, polished, below.
#: The raw MWU classifier between the two is worse or slower (2 splits each, 75 % training rows,
#: default kernels, 2-core box): banana 9.55 % in 21 s against 9.66 % in 23 s two-stage, twonorm
#: 2.14 % (14-41 s) against 2.08 % (13-14 s), ringnorm 1.89 % (14-18 s) against 1.70 % (12-14 s);
#: with the paper's kernels a held-out 7,000-row set: raw MWU 49.2 %, two-stage 37.4 %.
AUTO_TWO_STAGE_POINTS = POLISH_MAX_POINTS + 1


#: The weight stage scores bands of Gaussian widths (see :mod:`mwumkl_dist.solvers.groups`) only where the data
#: have at most this many times its rows.  A band chosen on 3000 rows is too smooth for far more data: the
#: kernel width that cross-validates best shrinks as n grows, and a smooth band caps the Nystroem rank.
#: cod-rna (pooled files, the default fit): at 10^5 rows the band 6-8 gave 3.61 % (rank 389), the family
#: 3.43 %; at 3 x 10^5 the band 8-10 3.90 % (rank 195), the family 3.32 %; at its official 59,535 rows the
#: band 3.39 %, the family 3.38 %.  magic04 (14,265 rows, 4.8 times the sample): the band 12.81 %, the family
#: 13.56 %.
BAND_TRANSFER = 10.0


def weight_points_for(n_samples: int) -> int:
    """Rows the two-stage fit learns the kernel weights on: all up to :data:`WEIGHT_POINTS`, then that many."""
    return int(min(n_samples, WEIGHT_POINTS))


def two_stage_blocker(data, spec: FitSpec | None = None, *, resume=None) -> str | None:
    """Why the two-stage fit cannot run on ``data`` with ``spec``'s settings (None: it can)."""
    if getattr(data, "kernel_set", None) is None:
        return "precomputed kernels (it needs feature rows, in memory or in a data store)"
    if spec is None:
        return None
    if spec.model.C is not None and np.isinf(spec.model.C):
        return "the hard margin (C = inf)"
    if spec.execution.checkpoint is not None:
        return "checkpoints (they hold the MWU iterations' state)"
    if resume is not None:
        return "resuming an MWU checkpoint"
    return None


@dataclass(frozen=True)
class TwoStageSolver:
    """Kernel weights from a subsample by the MWU solver, the classifier from all rows (``solver="two-stage"``).

    The options are the two-stage fit's own (see the module): the weight sample
    (None: :func:`weight_points_for`), the Nystroem rank (None: the estimator's
    ``n_components``; an int: that many landmarks), the residual at which the
    adaptive rank stops, the pruning threshold, the row block, where the shards
    keep their kernel columns (``storage``, see
    :class:`~mwumkl_dist.solvers.two_stage.shards.LinearShard`) and in which
    precision, the linear solve's method (``"explicit"``, ``"cg"`` or ``"auto"``:
    :func:`~mwumkl_dist.solvers.two_stage.newton.linear_method`) and whether
    ``C="auto"`` is checked again at the final size (:meth:`_check_C`) and how the adaptive rank stops
    (``rank_by``: ``"gain"``, by the held-out error, :meth:`_grow_stage`; ``"residual"``, by the Nystroem
    residual alone, :meth:`choose_maps`); narrow them with :func:`dataclasses.replace`.
    """

    name: str = "two-stage"
    weight_points: int | None = None
    n_components: int | None = None
    residual_tol: float = RESIDUAL_TOL
    prune: float = PRUNE
    row_block: int | None = None
    storage: str = "auto"
    precision: str = "float32"
    method: str = "auto"
    check_C: bool = True
    rank_by: str = "gain"

    def blocker(self, spec: FitSpec, data, *, resume=None) -> str | None:
        return two_stage_blocker(data, spec, resume=resume)

    def fit(self, spec: FitSpec, task: FitTask) -> FittedModel:
        """Stage 1 by a nested fit (the MWU solver on a stratified subsample), stages 2 and 3 on shards."""
        # BLAS and LAPACK on one thread: their results change with the thread count (eigh, products), the
        # model must not, and n_jobs holds for BLAS too.  The threads work on fixed blocks instead (the folds,
        # the shards' row blocks, the driver's blocked_product) and in the kernel evaluations (numba).
        with one_blas_thread():
            return self._fit(spec, task)

    def memory_plan(self, spec: FitSpec, n_samples: int, client=None) -> MemoryPlan:
        """What the fit may take within the execution's ``memory_limit``
        (:mod:`~mwumkl_dist.solvers.two_stage.budget`; on Dask, ``client``'s workers' memory for the shards); raises
        :class:`~mwumkl_dist.solvers.two_stage.budget.MemoryLimitError` where it cannot run within it."""
        limit, source = resolve_memory_limit(spec.execution.memory_limit)
        n_components = self.n_components if self.n_components is not None else spec.model.n_components
        shards = None
        if spec.execution.engine == "dask" and client is not None:
            k = spec.execution.n_shards
            row_block = partition.ROW_BLOCK if self.row_block is None else self.row_block
            k = linear_shard_count("dask", n_samples, client, row_block).n_shards if k == "auto" else int(k)
            given = parse_memory_limit(spec.execution.memory_limit)
            shards = shard_memory(worker_memory(client), n_samples, k, given, row_block)
        return memory_plan(limit, source, n_samples, rank_max=rank_budget(n_samples, np.dtype(self.precision).itemsize),
                           rank_min=N_COMPONENTS, given_rank=n_components, threads=current_threads(),
                           column_bytes=np.dtype(self.precision).itemsize, shards=shards)  # fmt: skip

    def _fit(self, spec: FitSpec, task: FitTask) -> FittedModel:
        data = task.data
        n = data.n_samples
        # before any work: a fit that cannot run within memory_limit says so now
        plan = self.memory_plan(spec, n, task.client)
        if spec.model.polish is True and not plan.exact_fits and exact_wanted(True, data, None) is not None:
            raise MemoryLimitError(f"memory_limit ({plan.source}) is too small for polish=True on {n} rows (the "
                                   f"exact solve's {n} x {n} Gram matrix); pass a larger memory_limit")  # fmt: skip
        clock = [time.process_time()]
        rows = self.weight_rows(task)
        weight_model = replace(spec.model, C=spec.model.C_per_point(n), scale_C=True, probability=False, solver="mwu",
                               width_bands=spec.model.width_bands and n <= BAND_TRANSFER * len(rows))  # fmt: skip
        weight_spec = FitSpec(weight_model, spec.execution.local())
        sub_weight = None if task.sample_weight is None else task.sample_weight[rows]
        with progress.stage(f"weight stage on {len(rows)} of {n} rows"):
            weights = task.fit(weight_spec, data.rows_in_memory(rows), seed=task.seed, sample_weight=sub_weight)
        if not np.array_equal(weights["classes_"], task.classes):
            raise ValueError("the weight subsample misses a class; the two-stage solver needs every class in it")
        chosen = _chosen_kernels(data, weights)
        if chosen is not None:  # kernels="auto" chose kernels of its own (a structure): all rows take them
            data = data.with_kernels(chosen)
            task = replace(task, data=data)
        clock.append(time.process_time())
        with linear_shards(
            data,
            engine=spec.execution.engine,
            n_shards=spec.execution.n_shards,
            client=task.client,
            timeout=spec.execution.worker_timeout,
            call_timeout=spec.execution.superstep_timeout,
            row_block=self.row_block,
            storage=self.storage,
            device=task.backend,
            plan=plan,
        ) as shards:
            attrs = self._full_stage(spec, task, shards, weights, clock, plan)
        if spec.execution.verbose:
            stage_seconds = np.diff(clock)
            logger.info("two-stage: weights on %d rows %.1f s CPU; %s (Nystroem residual %s) %.1f s; per "
                        "problem, features and linear solve: %s", len(rows), stage_seconds[0],
                        "the exact solve" if attrs["polished_"]
                        else f"rank {attrs['n_components_']} ({attrs['rank_stop_reason_']})",
                        np.round(attrs["nystroem_residual_"], 4), stage_seconds[1],
                        " ".join(f"{t:.1f}" for t in stage_seconds[2:]))  # fmt: skip
        C_rel = float(attrs.pop("C_relative"))
        attrs.update(weight_points_=len(rows), C_=C_rel if spec.model.scale_C else C_rel * n)
        if chosen is not None:
            attrs["kernel_names_"] = data.kernel_names
        # the folds are polished MWU fits: the polish solves the same SVM exactly
        selectivity, candidate = chosen_candidate(weights)
        return FittedModel(attrs, Calibration(C_rel, polished=True, selectivity=selectivity, candidate=candidate))

    def weight_rows(self, task: FitTask) -> np.ndarray:
        """The stratified subsample the kernel weights are learnt on (a class too small to stratify: its first row)."""
        y, n = task.data.y, task.data.n_samples
        size = weight_points_for(n) if self.weight_points is None else self.weight_points
        rows = stratified_rows(y, size, task.seed)
        missing = np.setdiff1d(task.classes, y[rows])
        if len(missing):
            rows = np.union1d(rows, [np.flatnonzero(y == c)[0] for c in missing])
        return rows

    def _full_stage(self, spec: FitSpec, task: FitTask, shards, weights: dict, clock: list, plan: MemoryPlan) -> dict:
        """Stages 2 and 3 on ``shards``: the fitted attributes (with the weight stage's ``epsilon_``, paths, ...)."""
        data, n = task.data, task.data.n_samples
        if data.traces is not None:
            traces = data.traces
        else:  # the blocks' traces, summed in row order (a pass over every row: the shards read them)
            with progress.phase("traces", n, unit="rows", description=f"kernel traces on {n} rows") as step:
                parts = shards.call("trace_parts", progress=lambda rows: step.update(min(rows, n)))
                traces = sum_parts((p for block in parts for p in block), len(data.kernel_set))
                step.update(n)
        mus = np.atleast_2d(weights["kernel_weights_"]).astype(np.float64)
        kernel_weights = np.vstack([pruned_weights(mu, self.prune) for mu in mus])
        unit = [unit_weights(mu, traces, n, self.prune) for mu in mus]
        order = landmark_order(n, task.seed)
        n_components = self.n_components if self.n_components is not None else spec.model.n_components
        exact = exact_wanted(spec.model.polish, data, n_components)
        if exact == "auto" and not plan.exact_fits:
            exact = None
        grow = n_components is None and self.rank_by == "gain"
        cap = min(rank_budget(n, np.dtype(self.precision).itemsize), plan.rank_cap)
        maps, residuals = self.choose_maps(data, order, unit, n_components, first_only=exact == "auto" or grow,
                                           cap=cap)  # fmt: skip
        exact = exact == "always" or (exact == "auto" and max(residuals) > self.residual_tol)
        clock.append(time.process_time())
        C = float(weights["C_"])
        check = self.check_C and spec.model.C is None
        point_weights = [self._point_weights(task, target) for target in task.targets]
        rank_path = None
        if exact:
            ones = np.ones(n)  # the exact solve takes every row's c_j
            exact_weights = [ones if w is None else w for w in point_weights]
            attrs, C = self._exact_stage(task, unit, exact_weights, C, check, clock)
            ranks, residuals, spilled, reason = [n] * len(task.targets), [0.0] * len(task.targets), False, "exact"
        elif grow:
            itemsize = np.dtype(self.precision).itemsize
            cap_reason = "memory_limit" if plan.rank_cap < rank_budget(n, itemsize) else "budget"
            stage = _LinearStage(self, task, shards, point_weights, clock, plan)
            grown = self._grow_stage(stage, maps, residuals, unit, order, cap, cap_reason, C, check)
            attrs, C, ranks, residuals, spilled, reason, rank_path = grown
        else:
            stage = _LinearStage(self, task, shards, point_weights, clock, plan)
            attrs, C, ranks, spilled = self._nystroem_stage(stage, maps, C, check)
            if n_components is not None:
                reason = "given"
            elif max(residuals) <= self.residual_tol:
                reason = "residual"
            else:
                reason = "memory_limit" if max(ranks) >= plan.rank_cap and plan.rank_cap < rank_budget(n) else "budget"
        single = len(task.targets) == 1
        out = {key: weights[key] for key in _FROM_WEIGHT_STAGE if key in weights}
        out.update(attrs)
        out.update(
            fit_warnings_=list(weights.get("fit_warnings_", [])),
            kernel_traces_=traces,
            kernel_weights_=kernel_weights[0] if single else kernel_weights,
            raw_kernel_weights_=(kernel_weights / traces)[0] if single else kernel_weights / traces,
            solver_="two-stage",
            n_components_=ranks[0] if single else np.array(ranks),
            nystroem_residual_=residuals[0] if single else np.array(residuals),
            rank_stop_reason_=reason,
            features_spilled_=bool(spilled),
            C_relative=C,
        )
        if rank_path is not None:
            out["rank_path_"] = rank_path
        # the rank stopped by its cap with a residual above the target (stopped by the held-out error: its choice)
        if not exact and reason != "gain" and max(residuals) > self.residual_tol:
            message = _residual_message(max(residuals), max(ranks), self.residual_tol, n, n_components,
                                        plan if reason == "memory_limit" else None)  # fmt: skip
            out["fit_warnings_"].append(message)
            warnings.warn(out["fit_warnings_"][-1], ResidualWarning, stacklevel=6)
        return out

    def _nystroem_stage(self, stage: _LinearStage, maps: list, C: float, check: bool) -> tuple[dict, float, list, bool]:
        """The linear stage on the Nystroem features: ``(attributes, C, ranks, spilled)``.

        A problem's first solve starts from the model of its smaller map (the first landmarks), where it has one;
        ``C="auto"``'s candidates (``check``) each start from the nearest solved one's solution."""
        task, n = stage.task, stage.n
        landmarks = landmark_order(n, task.seed)[: maps[0][-1].n_columns]
        solutions: list = [{} for _ in range(stage.K)]  # per problem: C -> NewtonResult (on the training rows)

        def solve(k, c, fitted, start):
            levels = maps[k]
            stage.load(k, len(levels) - 1, levels)
            if start is None and len(levels) > 1:  # the smaller map's model on the first landmarks starts the solve
                with _newton_phase(levels[0], n, stage.which(k)) as warm_step:
                    options = NewtonOptions(level=0, train=~stage.held if fitted else None, step=warm_step,
                                            seed=task.seed)  # fmt: skip
                    warm = self._solve(stage.shards, levels[0], c, stage.method(levels[0], False), options)
                start = np.append(levels[-1].coefficients(levels[0].expansion(warm.coef)), warm.intercept)
            return stage.solve(k, len(levels) - 1, levels[-1], c, fitted, start)

        if check:
            C, path = stage.check_C(C, solutions, solve, "")
        dual_coef, intercept, ranks = stage.final_models(C, solutions, solve, [m[-1] for m in maps])
        attrs = _linear_attributes(landmarks, maps[0][-1].landmarks, dual_coef, intercept, stage.methods,
                                   stage.layout())  # fmt: skip
        if check:
            attrs["final_C_path_"] = path
        return attrs, C, ranks, stage.spilled

    def _grow_stage(self, stage: _LinearStage, first: list, residuals: list, unit: list, order: np.ndarray,
                    cap: int, cap_reason: str, C: float, check: bool) -> tuple:  # fmt: skip
        """The linear stage with the rank chosen by the held-out error: ``(attributes, C, ranks, residuals, spilled,
        rank_stop_reason, rank_path)``.

        From :data:`N_COMPONENTS` landmarks (``first``: each problem's map there, with its ``residuals``), the rank
        doubles (nested landmarks, the stored columns extended by the new landmarks' only) while the error on the
        held-out rows of the final-size check of ``C`` (:meth:`_held_out`), of the model fitted on the other rows at
        the weight stage's ``C``, falls by more than the standard error of the paired difference; the Nystroem
        residual is a guide, not a goal: the growth stops where it is within :attr:`residual_tol` (the features
        reproduce the kernel) and at ``cap`` (``cap_reason``).  The chosen rank is the last one tried, or the one
        before where that had the lower held-out error.  Each rank's solve starts from the last one's model;
        ``C="auto"``'s candidates (``check``) are then solved at the chosen rank, each from its neighbour's
        solution and the last solve's Hessian sums, and the final model on all rows from the chosen ``C``'s.
        ``rank_path``: the held-out error at each rank tried.
        """
        data, n, K = stage.task.data, stage.n, stage.K
        levels = rank_levels(N_COMPONENTS, cap)
        L = data.support_vectors(order[: levels[-1]])
        sample = order[max(levels[-1], n - RESIDUAL_POINTS) :]
        S = data.support_vectors(sample) if len(sample) else None
        maps = [[m[0]] for m in first]  # per problem, the map of each level tried
        fits, errors, losses, reason = [], [], [], None
        for level, r in enumerate(levels):
            if level > 0:
                with progress.phase("nystroem", K, unit="maps", description=f"Nystroem rank: {r} landmarks") as step:
                    for k in range(K):
                        maps[k].append(nystroem_map(data.kernel_set, L[:r], unit[k]))
                        residuals[k] = nystroem_residual(maps[k][-1], S) if S is not None else 0.0
                        step.advance()
            results = []
            for k in range(K):
                start = None
                if level > 0:  # the last rank's model, as nearly as this rank's features give it
                    old, new = maps[k][level - 1], maps[k][level]
                    start = np.append(new.coefficients(old.expansion(fits[-1][k].coef)), fits[-1][k].intercept)
                    old.factor = None  # only the newest map's factor starts a solve
                stage.load(k, level, maps[k])
                results.append(stage.solve(k, level, maps[k][level], C, True, start))
            fits.append(results)
            losses.append(self._held_losses(stage.task, stage.held, np.column_stack([r.outputs for r in results])))
            errors.append(float(np.sum(losses[-1])))
            reason = self._rank_stop(level == len(levels) - 1, errors, losses, max(residuals), cap_reason)
            if reason is not None:
                break
        chosen = len(fits) - 1
        if chosen > 0 and errors[chosen - 1] < errors[chosen]:
            chosen -= 1
        rank_path = {int(maps[0][i].n_columns): errors[i] for i in range(len(errors))}
        final_residuals = list(residuals)
        if chosen < len(fits) - 1:  # the residual of the chosen level's maps
            final_residuals = [nystroem_residual(maps[k][chosen], S) if S is not None else 0.0 for k in range(K)]
        solutions: list = [{C: fits[chosen][k]} for k in range(K)]  # per problem: C -> result on the training rows

        def solve(k, c, fitted, start):
            stage.load(k, chosen, maps[k], keep_higher=True)
            return stage.solve(k, chosen, maps[k][chosen], c, fitted, start)

        if check:
            C, path = stage.check_C(C, solutions, solve, f", rank {maps[0][chosen].n_columns}")
        dual_coef, intercept, ranks = stage.final_models(C, solutions, solve, [m[chosen] for m in maps])
        stage.hessian = None
        landmarks = order[: maps[0][chosen].n_columns]
        attrs = _linear_attributes(landmarks, maps[0][chosen].landmarks, dual_coef, intercept, stage.methods,
                                   stage.layout())  # fmt: skip
        if check:
            attrs["final_C_path_"] = path
        return attrs, C, ranks, final_residuals, stage.spilled, reason, rank_path

    def _rank_stop(self, last: bool, errors: list, losses: list, residual: float, cap_reason: str) -> str | None:
        """Why the adaptive rank stops after the level just tried (None: it grows on)."""
        if last and residual > self.residual_tol:
            return cap_reason  # the cap stopped it, whatever the last step's gain: more memory may help
        if len(errors) > 1 and errors[-2] - errors[-1] <= standard_error_of_sum(losses[-2] - losses[-1]):
            return "gain"
        if residual <= self.residual_tol:
            return "residual"
        return None

    def _method(self, n_rows: int, fmap, warm: bool, device: str, **cluster) -> tuple:
        """``(method, costs)`` of one solve: :attr:`method`, or for ``"auto"`` the cheaper by
        :func:`~mwumkl_dist.solvers.two_stage.newton.linear_costs` (``costs`` None where :attr:`method` is set)."""
        if self.method != "auto":
            return self.method, None
        args = (n_rows, fmap.n_columns, fmap.rank)
        return linear_method(*args, warm=warm, device=device, **cluster), linear_costs(*args, warm, device, **cluster)

    def _solve(self, shards, fmap, C: float, method, options: NewtonOptions):
        """One solve of the squared hinge on ``fmap``'s features (``options.level`` on the shards) by ``method``
        (:meth:`_method`'s ``(method, costs)``); ``options.hessian``: an earlier explicit solve's sums on the same
        features to start from (:func:`newton_solve`; the explicit method then, its Hessian is all but formed)."""
        method = "explicit" if options.hessian is not None else method[0]
        step = options.step
        with step.waiting() if step is not None else contextlib.nullcontext():  # a step's factorisation is long
            solve = cg_newton_solve if method == "cg" else newton_solve
            return solve(shards, fmap.basis, C, options)

    def _exact_stage(self, task: FitTask, unit: list, point_weights: list, C: float, check: bool,
                     clock: list) -> tuple[dict, float]:  # fmt: skip
        """The exact 2-norm SVM on all rows (:mod:`~mwumkl_dist.solvers.two_stage.exact`): ``(attributes, C)``."""
        data, n = task.data, task.data.n_samples
        targets = task.targets
        labels = [np.where(data.y == target, 1.0, -1.0) for target in targets]
        held = self._held_out(task) if check else None
        candidates = _C_candidates(C) if check else [C]
        decisions = {c: np.zeros((int(held.sum()) if check else 0, len(targets))) for c in candidates}
        grams: list = [None] * len(targets)

        def gram(k):
            if grams[k] is None:
                which = f", class {k + 1} of {len(targets)}" if len(targets) > 1 else ""
                grams[:] = [None] * len(targets)  # one n x n matrix at a time
                with progress.phase(
                    "polish", n, unit="rows", description=f"exact solve: the combined kernel of {n} rows{which}"
                ) as step:
                    grams[k] = exact_gram(data.kernel_set, data.X, unit[k], step)
                clock.append(time.process_time())
            return grams[k]

        if check:
            description = f"C at the final size: {len(candidates)} exact solves on {n - held.sum()} rows, " \
                          f"{held.sum()} held out"  # fmt: skip
            with progress.phase("check-C", len(candidates) * len(targets), unit="solves",
                                description=description) as step:  # fmt: skip
                for k in range(len(targets)):
                    K = gram(k)
                    for c in candidates:
                        with step.waiting():  # LIBSVM reports nothing
                            alpha, b = solve_exact(K, labels[k], 1.0 / (c * point_weights[k]), left_out=held)
                        decisions[c][:, k] = (K @ (alpha * labels[k]))[held] + b
                        step.advance()
            C, path = self._chosen_C(task, held, decisions, C)
        coef = np.zeros((len(targets), n))
        intercept = np.zeros(len(targets))
        with progress.phase("polish", len(targets), unit="problems",
                            description=f"exact solve: LIBSVM on {n} rows at C = {C:g}") as step:  # fmt: skip
            for k in range(len(targets)):
                K = gram(k)
                with step.waiting():  # LIBSVM reports nothing
                    alpha, intercept[k] = solve_exact(K, labels[k], 1.0 / (C * point_weights[k]))
                coef[k] = n * alpha * labels[k]  # on the raw kernels: raw weights are mu / r = unit weights / n
                step.advance()
                clock.append(time.process_time())
        support = np.flatnonzero((coef != 0.0).any(axis=0))
        attrs = {
            "support_": support,
            "dual_coef_": coef[:, support],
            "intercept_": intercept,
            "support_vectors_": data.support_vectors(support),
            "polished_": True,
        }
        if check:
            attrs["final_C_path_"] = path
        return attrs, C

    def _held_out(self, task: FitTask) -> np.ndarray:
        """The rows the final-size check of ``C`` holds out (a stratified :data:`CHECK_FRACTION`, at most
        :data:`CHECK_POINTS`), as a mask."""
        y, n = task.data.y, task.data.n_samples
        size = int(min(CHECK_POINTS, max(1, round(CHECK_FRACTION * n))))
        held = np.zeros(n, dtype=bool)
        held[stratified_rows(y, size, task.seed + 1)] = True
        return held

    @staticmethod
    def _held_losses(task: FitTask, held: np.ndarray, decisions: np.ndarray) -> np.ndarray:
        """Each held-out row's share of the (weighted) held-out error of ``decisions`` (held-out rows x problems)."""
        y = task.data.y[held]
        weights = score_weights(task.data.y, task.class_weight, task.sample_weight)
        w = np.ones(len(y)) if weights is None else np.asarray(weights)[held]
        return (predicted_labels(task.classes, decisions) != y) * w / np.sum(w)

    def _chosen_C(self, task: FitTask, held: np.ndarray, decisions: dict, C: float) -> tuple[float, dict]:
        """The candidate with the lowest (weighted) error on the held-out rows, where it beats the weight stage's
        ``C`` by more than the standard error of their paired difference, else that ``C``; and every
        candidate's held-out error (``final_C_path_``)."""
        losses = {c: self._held_losses(task, held, d) for c, d in decisions.items()}
        errors = {c: float(np.sum(loss)) for c, loss in losses.items()}
        best = min(errors, key=lambda c: (errors[c], c != C))
        if errors[C] - errors[best] > standard_error_of_sum(losses[best] - losses[C]):
            return float(best), errors
        return float(C), errors

    def choose_maps(self, data, order: np.ndarray, unit: list, n_components=None, first_only: bool = False,
                    cap: int | None = None):  # fmt: skip
        """Each problem's Nystroem maps on the first landmarks of ``order``: ``(maps, residuals)``.

        ``unit``: each problem's raw kernel weights (:func:`unit_weights`).
        ``maps[k]`` lists problem ``k``'s maps from the smallest rank tried to
        the chosen one (the first starts the solve); ``residuals[k]`` is the
        chosen map's :func:`nystroem_residual` on up to :data:`RESIDUAL_POINTS`
        rows at the end of ``order`` (never landmarks).

        With ``n_components`` an int, the map on that many landmarks (and one
        on :data:`N_COMPONENTS` to start from when it is at least twice that).
        Adaptive (None): :data:`N_COMPONENTS` landmarks, doubled while a
        problem's residual is above ``residual_tol`` and the rank within
        :func:`rank_budget` (every problem takes the same landmarks); ``first_only``:
        the first level only (the exact solve follows where its residual is above the target).
        Deterministic: the same ``order`` (seed) gives the same landmarks.  ``n_components`` None: the
        solver's own (:attr:`n_components`).  ``cap``: the most landmarks of the adaptive rank (default
        :func:`rank_budget`; the fit passes the smaller of that and its memory plan's).
        """
        n = len(order)
        n_components = self.n_components if n_components is None else n_components
        if n_components is not None:
            top = min(int(n_components), n)
            levels = [N_COMPONENTS, top] if top >= 2 * N_COMPONENTS else [top]
        else:
            cap = rank_budget(n, np.dtype(self.precision).itemsize) if cap is None else cap
            levels = rank_levels(N_COMPONENTS, cap)
            if first_only:
                levels = levels[:1]
            top = levels[-1]
        maps, residuals = [[] for _ in unit], [None] * len(unit)
        description = f"Nystroem rank: {'adaptive, ' if n_components is None else ''}up to {levels[-1]} landmarks"
        with (
            progress.phase("nystroem", len(levels) * len(unit), unit="maps", description=description) as step,
            step.waiting(),
        ):  # the largest map alone is a long step (a factorisation of K(L, L)); a store's scattered rows too
            L = data.support_vectors(order[:top])
            sample = order[max(top, n - RESIDUAL_POINTS) :]
            S = data.support_vectors(sample) if len(sample) else None
            for r in levels:
                for k, weights in enumerate(unit):
                    maps[k].append(nystroem_map(data.kernel_set, L[:r], weights))
                    residuals[k] = nystroem_residual(maps[k][-1], S) if S is not None else 0.0
                    step.advance()
                if n_components is None and S is not None and max(residuals) <= self.residual_tol:
                    break
        return [[m[0], m[-1]] if len(m) > 1 else m for m in maps], [float(x) for x in residuals]

    @staticmethod
    def _point_weights(task: FitTask, target) -> np.ndarray | None:
        """``c_j`` of one binary problem: its class and sample weights (None: all 1, no ``n``-array held)."""
        weights = problem_weights(task.data.y, task.classes, target, task.class_weight, task.sample_weight)
        return None if weights is None else np.asarray(weights, dtype=np.float64)


class _LinearStage:
    """The solves of one fit's linear stage on its shards: the problem loaded there, each problem's method, the
    last explicit solve's Hessian sums (kept for the next solve on the same features), the held-out rows of the
    final-size check of ``C``.  Shared by the fixed rank (:meth:`TwoStageSolver._nystroem_stage`) and the adaptive
    one (:meth:`TwoStageSolver._grow_stage`)."""

    def __init__(self, solver: TwoStageSolver, task: FitTask, shards, point_weights: list, clock: list, plan=None):
        self.solver, self.task, self.shards, self.point_weights, self.clock = solver, task, shards, point_weights, clock
        self.solver_plan = plan
        self.n, self.K = task.data.n_samples, len(task.targets)
        self.held = solver._held_out(task)
        self.train = ~self.held
        self.cluster = pool_lanes(shards)  # where the passes run, for the linear method's cost model
        self.methods: list = [None] * self.K  # each problem's last solve: (method, costs)
        self.loaded, self.storage, self.spilled = None, "memory", False
        self.hessian, self.hessian_of = None, None

    def which(self, k: int) -> str:
        return f", class {k + 1} of {self.K}" if self.K > 1 else ""

    def layout(self) -> str:
        """The shards, their columns' budget and where the last problem's columns were kept, for the summary."""
        budget = "" if self.solver_plan is None else f"; {self.solver_plan.describe()}"
        return f"{self.shards.layout}{budget}; columns {_KEPT.get(self.storage, self.storage)}"

    def load(self, k: int, level: int, maps: list, keep_higher: bool = False) -> None:
        """Problem ``k``'s columns of ``maps[level]`` (and the levels below) on the shards, extended where a lower
        level's are there; ``keep_higher``: a higher level's loaded columns do too."""
        loaded = self.loaded
        if loaded is not None and loaded[0] == k and (loaded[1] == level or keep_higher and loaded[1] >= level):
            return
        extend = loaded is not None and loaded[0] == k and loaded[1] < level
        labels = functools.partial(_pm_labels, self.task.data.y, self.task.targets[k])
        self.storage = _load_problem(self.shards, maps[level], self.n, labels, self.point_weights[k],
                                     [m.basis for m in maps[: level + 1]], self.which(k), self.solver.precision,
                                     extend=extend)  # fmt: skip
        self.spilled |= self.storage == "spill"
        self.clock.append(time.process_time())
        self.loaded, self.hessian = (k, level), None

    def method(self, fmap, warm: bool) -> tuple:
        entry = _entry_seconds(fmap, self.storage, self.solver.precision)
        return self.solver._method(self.n, fmap, warm, self.task.backend, entry_seconds=entry, **self.cluster)

    def solve(self, k: int, level: int, fmap, C: float, fitted: bool, start):
        """Problem ``k``'s solve on ``fmap``'s features (``level`` on the shards) at ``C``, on the training rows
        (``fitted``: its outputs on the held-out rows come with it) or all, from ``start``."""
        hessian = self.hessian if self.hessian_of == (k, level) else None  # sums on these features only
        self.methods[k] = self.method(fmap, start is not None)
        if hessian is not None:  # the Hessian's sums are there: explicit (the costs said for the record)
            self.methods[k] = ("explicit", self.methods[k][1])
        with _newton_phase(fmap, self.n, self.which(k)) as step:
            options = NewtonOptions(level=level, start=start, train=self.train if fitted else None, step=step,
                                    seed=self.task.seed, hessian=hessian,
                                    outputs_on=self.held if fitted else None)  # fmt: skip
            result = self.solver._solve(self.shards, fmap, C, self.methods[k], options)
        self.hessian, self.hessian_of, result.hessian = result.hessian, (k, level), None  # one at a time
        return result

    def check_C(self, C: float, solutions: list, solve, note: str) -> tuple[float, dict]:
        """``C="auto"``'s candidates at the final size on the training rows (each from the nearest solved one's
        solution; ``solutions``: per problem ``C -> result``, filled in): the chosen ``C`` and the path."""
        candidates = _C_candidates(C)
        held = self.held
        todo = sum(c not in solved for solved in solutions for c in candidates)
        description = f"C at the final size: {len(candidates)} candidates on {self.n - held.sum()} rows, " \
                      f"{held.sum()} held out{note}"  # fmt: skip
        with progress.phase("check-C", todo, unit="solves", description=description) as step:
            for k in range(self.K):
                for c in candidates:
                    if c in solutions[k]:
                        continue
                    near = min(solutions[k], key=lambda s, c=c: abs(math.log(s / c)), default=None)
                    solutions[k][c] = solve(k, c, True, None if near is None else _start_of(solutions[k][near]))
                    step.advance()
        decisions = {c: np.column_stack([solutions[k][c].outputs for k in range(self.K)]) for c in candidates}
        return self.solver._chosen_C(self.task, held, decisions, C)

    def final_models(self, C: float, solutions: list, solve, fmaps: list) -> tuple:
        """Each problem's model on all rows at ``C`` (from its solution on the training rows where there is one):
        ``(dual_coef, intercept, ranks)``."""
        dual_coef = np.zeros((self.K, fmaps[0].n_columns))
        intercept = np.zeros(self.K)
        ranks = []
        for k, fmap in enumerate(fmaps):
            start = _start_of(solutions[k][C]) if C in solutions[k] else None
            result = solve(k, C, False, start)
            intercept[k] = result.intercept
            self.clock.append(time.process_time())
            dual_coef[k] = self.n * fmap.expansion(result.coef)  # on the raw kernels: raw weights are mu / r = w / n
            ranks.append(fmap.rank)
        return dual_coef, intercept, ranks


#: The final-size check of ``C="auto"`` holds out this share of the rows (stratified) ...
CHECK_FRACTION = 0.2
#: ... at most this many ...
CHECK_POINTS = 100_000
#: ... and scores the weight stage's ``C`` times these (solved in this order, each from its neighbour's solution).
#: The weight stage chooses ``C`` by 3-fold cross-validation on 3000 rows, i.e. for models of 2000 rows; a model
#: of all rows can afford a weaker ridge (banana, 3975 rows, the exact solve: C = 10 from the weight stage
#: 9.36 % test error, 100 8.68 %; E7's synthetic set at 10^5 rows, rank 500: 6.77 % and 6.66 %).
CHECK_FACTORS = (1.0, 10.0, 100.0, 0.1)


def _C_candidates(C: float) -> list[float]:
    return [float(C * f) for f in CHECK_FACTORS]


def _start_of(result) -> np.ndarray:
    return np.append(result.coef, result.intercept)


def exact_wanted(polish, data, n_components) -> str | None:
    """Whether the two-stage fit may solve exactly on all rows: ``"always"`` (``polish=True``), ``"auto"`` (where
    its first Nystroem map's residual is above the target, ``polish="auto"``), or None.

    Only for rows in memory, within :func:`~mwumkl_dist.solvers.two_stage.exact.exact_affordable`, with the rank
    left to the fit (``n_components="auto"``).
    """
    if polish is False or data.polish_blocker is not None or not hasattr(data, "X"):
        return None
    if polish is True:
        return "always"
    return "auto" if n_components is None and exact_affordable(data.n_samples) else None


class ResidualWarning(UserWarning):
    """A two-stage fit ended with Nystroem features above their residual target: the linear stage
    approximates the learned kernel (see ``n_components``)."""


def _residual_message(residual: float, rank: int, tol: float, n: int, n_components, plan=None) -> str:
    if n_components is not None:
        why = f"the rank is n_components={n_components}"
        how = f"pass a larger n_components (e.g. {2 * int(n_components)})"
    elif plan is not None:
        where = plan.shards.source if plan.shards is not None else plan.source
        why = f"the rank stopped at the most landmarks memory_limit ({where}) affords"
        how = "pass a larger memory_limit for more landmarks" + (", or add Dask workers" if plan.shards else "")
    else:
        budget = rank_budget(n)
        why = (f"the rank stopped at its budget ({budget} landmarks on {n} rows: at most {RANK_MAX}, and the rows' "
               f"single-precision kernel columns within {COLUMN_MEMORY / 2**30:g} GiB)")  # fmt: skip
        how = f"pass n_components={2 * rank} (an int) for more landmarks, at more time and memory"
    exact = "" if not exact_affordable(n) else ", or polish=True for the exact solve on all rows"
    return (f"the two-stage fit's Nystroem features leave a residual of {residual:.3g} of the learned kernel at rank "
            f"{rank}, above the target {tol:g}: {why}; the model approximates the kernel ({how}{exact})")  # fmt: skip


def _chosen_kernels(data, weights: dict) -> list | None:
    """The kernels the weight stage's model is on, where they are not ``data``'s (else None)."""
    if data.kernel_set.bank is not None or list(weights["kernel_names_"]) == list(data.kernel_names):
        return None
    return KernelSet(list(weights["kernel_names_"]), data.n_features_in).specs


#: Why the rank of a two-stage fit stopped growing (``rank_stop_reason_``): its held-out error stopped improving, the
#: residual met its target, the rows' rank budget, the memory limit, a given ``n_components``, the exact solve.
RANK_STOP_REASONS = ("gain", "residual", "budget", "memory_limit", "given", "exact")


#: Attributes of the two-stage model that are the weight stage's.
_FROM_WEIGHT_STAGE = ("epsilon_", *search_attributes(), "n_iter_", "interrupted_")


def _pm_labels(y, target, lo: int, hi: int) -> np.ndarray:
    """The +-1 labels of rows ``[lo, hi)`` of one-vs-rest problem ``target``."""
    return np.where(y[lo:hi] == target, 1.0, -1.0)


def _load_problem(
    shards, fmap, n: int, labels, cw, bases, which: str = "", dtype="float32", extend: bool = False
) -> str:
    """Every shard computes its rows' kernel columns of ``fmap`` (labels, ``c_j``, the levels' bases, their
    precision; ``extend``: :meth:`LinearShard.load_problem`'s); the storage they took (``"spill"`` when one shard
    spilled, else the first's).  ``labels(lo, hi)``: the +-1 labels of rows ``[lo, hi)``; ``cw``: the ``c_j`` of
    the ``n`` rows (None: all 1).  Each shard's are made as it is sent its call, so the client holds no ``n``-array
    of them.  The ``"columns"`` progress phase counts the rows done (a shard in this process advances it block by
    block; a remote shard's rows count when its call returns)."""
    description = f"kernel columns on {fmap.n_columns} landmarks for {n} rows{which}"
    with progress.phase("columns", n, unit="rows", description=description) as step:

        def load(rows):
            lo, hi = rows
            weights = np.ones(hi - lo) if cw is None else cw[lo:hi]
            return (fmap, labels(lo, hi), weights, bases, step, dtype, extend)

        # kept: a rebuilt Dask shard loads it again; remote shards' rows come with their heartbeats
        storages = shards.call("load_problem", load, keep=True, progress=lambda rows: step.update(min(rows, n)))
        step.update(n)
    return "spill" if "spill" in storages else storages[0]


def _entry_seconds(fmap, storage: str, precision: str) -> float:
    """The extra seconds per column entry of a pass where the shards do not keep the columns in memory."""
    if storage not in ("spill", "recompute"):
        return 0.0
    spilled, recomputed = pass_cost(fmap.kernel_set, fmap.weights, np.dtype(precision).itemsize)
    return spilled if storage == "spill" else recomputed


#: How the summary names a storage (:meth:`LinearShard.load_problem`'s answer).
_KEPT = {"memory": "kept in memory", "spill": "spilled to disk (one shard or more)", "recompute": "computed again at "
         "every pass", "device": "kept on the GPU"}  # fmt: skip


def _newton_phase(fmap, n: int, which: str) -> progress.Phase:
    """The ``"newton"`` progress phase of one linear solve (its passes over the columns are not known in advance)."""
    description = f"Newton steps at rank {fmap.rank} on {n} rows{which}"
    return progress.phase("newton", None, unit="passes", description=description)


def _linear_attributes(landmarks, landmark_rows, dual_coef, intercept, methods: list, layout) -> dict:
    """The linear stage's fitted attributes: the support (the landmarks, in row order, as the MWU models keep it),
    and how the squared hinge was solved (``methods``: ``(method, costs)`` per binary problem) on which shards."""
    sort = np.argsort(landmarks, kind="stable")
    attrs = {
        "support_": landmarks[sort],
        "support_vectors_": landmark_rows[sort],  # the landmarks' rows, read once
        "dual_coef_": dual_coef[:, sort],
        "intercept_": intercept,
        "polished_": False,
    }
    names = [m for m, _ in methods]
    attrs["linear_method_"] = names[0] if len(names) == 1 else names
    method, costs = methods[0]
    model = "" if costs is None else f" (cost model: explicit {costs['explicit']:.3g} s, CG {costs['cg']:.3g} s)"
    solved = "explicit Hessian" if method == "explicit" else "conjugate gradients"
    attrs["shard_layout_"] = f"linear stage: {layout}; {solved}{model}"
    return attrs
