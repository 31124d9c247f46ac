"""The two-stage solver: kernel weights from a subsample, the classifier from all rows."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace

import numpy as np

from mwumkl_dist.core import progress
from mwumkl_dist.data.weights import problem_weights
from mwumkl_dist.devices.threads import one_blas_thread
from mwumkl_dist.kernels.specs import KernelSet
from mwumkl_dist.solvers.auto import stratified_rows
from mwumkl_dist.solvers.base import Calibration, FitTask, FittedModel
from mwumkl_dist.solvers.groups import chosen_selectivity
from mwumkl_dist.solvers.mwu.polish import POLISH_MAX_POINTS
from mwumkl_dist.solvers.spec import FitSpec
from mwumkl_dist.solvers.two_stage.newton import newton_solve
from mwumkl_dist.solvers.two_stage.nystroem import (
    N_COMPONENTS,
    PRUNE,
    RESIDUAL_POINTS,
    RESIDUAL_TOL,
    WEIGHT_POINTS,
    landmark_order,
    nystroem_map,
    nystroem_residual,
    pruned_weights,
    rank_cap,
    rank_levels,
    unit_weights,
)
from mwumkl_dist.solvers.two_stage.shards import linear_shards, sum_parts

__all__ = ["AUTO_TWO_STAGE_POINTS", "TwoStageSolver", "two_stage_blocker", "weight_points_for"]

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
    if spec.C is not None and np.isinf(spec.C):
        return "the hard margin (C = inf)"
    if spec.checkpoint is not None:
        return "checkpoints (they hold the MWU iterations' state)"
    if spec.device != "cpu":
        return f'device="{spec.device}" (the two-stage fit runs on the CPU)'
    if resume is not None:
        return "resuming an MWU checkpoint"
    return None


@dataclass(frozen=True)
class TwoStageSolver:
    """Kernel weights from a subsample by the MWU solver, the classifier from all rows (``solver="two-stage"``).

    The options are the two-stage fit's own (see the module): the weight sample
    (None: :func:`weight_points_for`), the Nystroem rank (None: adaptive, see
    :meth:`choose_maps`; an int: that many landmarks), the residual at which the
    adaptive rank stops, the pruning threshold, the row block and whether
    shards spill their features; narrow them with :func:`dataclasses.replace`.
    """

    name: str = "two-stage"
    weight_points: int | None = None
    n_components: int | None = None
    residual_tol: float = RESIDUAL_TOL
    prune: float = PRUNE
    row_block: int | None = None
    spill: object = "auto"

    def blocker(self, spec: FitSpec, data, *, resume=None) -> str | None:
        return two_stage_blocker(data, spec, resume=resume)

    def fit(self, spec: FitSpec, task: FitTask) -> FittedModel:
        """Stage 1 by a nested fit (the MWU solver on a stratified subsample), stages 2 and 3 on shards."""
        # BLAS and LAPACK on one thread: their results change with the thread count (eigh, products), the
        # model must not, and n_jobs holds for BLAS too.  The threads work on fixed blocks instead (the folds,
        # the shards' row blocks, the driver's blocked_product) and in the kernel evaluations (numba).
        with one_blas_thread():
            return self._fit(spec, task)

    def _fit(self, spec: FitSpec, task: FitTask) -> FittedModel:
        data = task.data
        n = data.n_samples
        clock = [time.process_time()]
        rows = self.weight_rows(task)
        weight_spec = replace(spec, C=spec.C_per_point(n), scale_C=True, engine="local", n_shards=1,
                              n_kernel_shards=1, checkpoint=None, probability=False, solver="mwu",
                              width_bands=spec.width_bands and n <= BAND_TRANSFER * len(rows))  # fmt: skip
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
            engine=spec.engine,
            n_shards=spec.n_shards,
            client=task.client,
            timeout=spec.worker_timeout,
            call_timeout=spec.superstep_timeout,
            row_block=self.row_block,
            spill=self.spill,
        ) as shards:
            attrs = self._full_stage(task, shards, weights, clock)
        if spec.verbose:
            stage_seconds = np.diff(clock)
            logger.info("two-stage: weights on %d rows %.1f s CPU; rank %s (Nystroem residual %s) %.1f s; per "
                        "problem, features and linear solve: %s", len(rows), stage_seconds[0], attrs["n_components_"],
                        np.round(attrs["nystroem_residual_"], 4), stage_seconds[1],
                        " ".join(f"{t:.1f}" for t in stage_seconds[2:]))  # fmt: skip
        C_rel = float(weights["C_"])
        attrs.update(weight_points_=len(rows), C_=C_rel if spec.scale_C else C_rel * n)
        if chosen is not None:
            attrs["kernel_names_"] = data.kernel_names
        # the folds are polished MWU fits: the polish solves the same SVM exactly
        return FittedModel(attrs, Calibration(C_rel, polished=True, selectivity=chosen_selectivity(weights)))

    def weight_rows(self, task: FitTask) -> np.ndarray:
        """The stratified subsample the kernel weights are learnt on (a class too small to stratify: its first row)."""
        y, n = task.data.y, task.data.n_samples
        size = weight_points_for(n) if self.weight_points is None else self.weight_points
        rows = stratified_rows(y, size, task.seed)
        missing = np.setdiff1d(task.classes, y[rows])
        if len(missing):
            rows = np.union1d(rows, [np.flatnonzero(y == c)[0] for c in missing])
        return rows

    def _full_stage(self, task: FitTask, shards, weights: dict, clock: list) -> dict:
        """Stages 2 and 3 on ``shards``: the fitted attributes (with the weight stage's ``epsilon_``, paths, ...)."""
        data, n = task.data, task.data.n_samples
        if data.traces is not None:
            traces = data.traces
        else:  # the blocks' traces, summed in row order
            traces = sum_parts((p for parts in shards.call("trace_parts") for p in parts), len(data.kernel_set))
        mus = np.atleast_2d(weights["kernel_weights_"]).astype(np.float64)
        kernel_weights = np.vstack([pruned_weights(mu, self.prune) for mu in mus])
        unit = [unit_weights(mu, traces, n, self.prune) for mu in mus]
        order = landmark_order(n, task.seed)
        maps, residuals = self.choose_maps(data, order, unit)
        clock.append(time.process_time())
        landmarks = order[: maps[0][-1].n_columns]
        C = float(weights["C_"])
        dual_coef = np.zeros((len(task.targets), len(landmarks)))
        intercept = np.zeros(len(task.targets))
        ranks, spilled = [], False
        for k, target in enumerate(task.targets):
            levels = maps[k]
            fmap = levels[-1]
            y_pm, cw = np.where(data.y == target, 1.0, -1.0), self._point_weights(task, target)
            which = f", class {k + 1} of {len(task.targets)}" if len(task.targets) > 1 else ""
            spilled |= _load_problem(shards, fmap, y_pm, cw, [m.basis for m in levels], which)
            clock.append(time.process_time())
            start = None
            if len(levels) > 1:  # the smaller map's model on the first landmarks starts the full-rank solve
                with _newton_phase(levels[0], n, which) as step:
                    warm = newton_solve(shards, levels[0].basis, y_pm, C, cw, level=0, step=step)
                start = np.append(fmap.coefficients(levels[0].expansion(warm.coef)), warm.intercept)
            with _newton_phase(fmap, n, which) as step:
                result = newton_solve(shards, fmap.basis, y_pm, C, cw, level=len(levels) - 1, start=start, step=step)
            intercept[k] = result.intercept
            clock.append(time.process_time())
            dual_coef[k] = n * fmap.expansion(result.coef)  # on the raw kernels: raw weights are mu / r = w / n
            ranks.append(fmap.rank)
        sort = np.argsort(landmarks, kind="stable")  # the support in row order, as the MWU models keep it
        single = len(task.targets) == 1
        attrs = {key: weights[key] for key in _FROM_WEIGHT_STAGE if key in weights}
        attrs.update(
            fit_warnings_=list(weights.get("fit_warnings_", [])),
            kernel_traces_=traces,
            kernel_weights_=kernel_weights[0] if single else kernel_weights,
            raw_kernel_weights_=(kernel_weights / traces)[0] if single else kernel_weights / traces,
            support_=landmarks[sort],
            support_vectors_=maps[0][-1].landmarks[sort],  # the landmarks' rows, read once
            dual_coef_=dual_coef[:, sort],
            intercept_=intercept,
            polished_=False,
            solver_="two-stage",
            n_components_=ranks[0] if single else np.array(ranks),
            nystroem_residual_=residuals[0] if single else np.array(residuals),
            features_spilled_=bool(spilled),
        )
        return attrs

    def choose_maps(self, data, order: np.ndarray, unit: list) -> tuple[list, list]:
        """Each problem's Nystroem maps on the first landmarks of ``order``: ``(maps, residuals)``.

        ``unit``: each problem's raw kernel weights (:func:`unit_weights`).
        ``maps[k]`` lists problem ``k``'s maps from the smallest rank tried to
        the chosen one (the first starts the solve); ``residuals[k]`` is the
        chosen map's :func:`nystroem_residual` on up to :data:`RESIDUAL_POINTS`
        rows at the end of ``order`` (never landmarks).

        With ``n_components`` an int, the map on that many landmarks (and one
        on :data:`N_COMPONENTS` to start from when it is at least twice that).
        Adaptive (None): :data:`N_COMPONENTS` landmarks, doubled while a
        problem's residual is above ``residual_tol`` and the rank below
        :func:`rank_cap` (every problem takes the same landmarks).  Deterministic: the
        same ``order`` (seed) gives the same landmarks.
        """
        n = len(order)
        if self.n_components is not None:
            top = min(int(self.n_components), n)
            levels = [N_COMPONENTS, top] if top >= 2 * N_COMPONENTS else [top]
        else:
            top = rank_cap(n)
            levels = rank_levels(N_COMPONENTS, top)
        L = data.support_vectors(order[:top])
        sample = order[max(top, n - RESIDUAL_POINTS) :]
        S = data.support_vectors(sample) if len(sample) else None
        maps, residuals = [[] for _ in unit], [None] * len(unit)
        description = f"Nystroem rank: {'adaptive, ' if self.n_components is None else ''}up to {levels[-1]} landmarks"
        with progress.phase("nystroem", len(levels) * len(unit), unit="maps", description=description) as step:
            for r in levels:
                for k, weights in enumerate(unit):
                    maps[k].append(nystroem_map(data.kernel_set, L[:r], weights))
                    residuals[k] = nystroem_residual(maps[k][-1], S) if S is not None else 0.0
                    step.advance()
                if self.n_components is None and S is not None and max(residuals) <= self.residual_tol:
                    break
        return [[m[0], m[-1]] if len(m) > 1 else m for m in maps], [float(x) for x in residuals]

    @staticmethod
    def _point_weights(task: FitTask, target) -> np.ndarray:
        """``c_j`` of one binary problem: its class and sample weights (1 without)."""
        weights = problem_weights(task.data.y, task.classes, target, task.class_weight, task.sample_weight)
        return np.ones(task.data.n_samples) if weights is None else np.asarray(weights, dtype=np.float64)


def _chosen_kernels(data, weights: dict) -> list | None:
    """The kernels the weight stage's model is on, where they are not ``data``'s (else None)."""
    if data.kernel_set.bank is not None or list(weights["kernel_names_"]) == list(data.kernel_names):
        return None
    return KernelSet(list(weights["kernel_names_"]), data.n_features_in).specs


#: Attributes of the two-stage model that are the weight stage's.
_FROM_WEIGHT_STAGE = ("epsilon_", "selectivity_", "C_path_", "selectivity_path_", "group_selection_",
                      "group_selection_path_", "width_band_", "width_band_path_", "structure_", "structure_path_",
                      "cross_validation_", "n_iter_", "interrupted_")  # fmt: skip


def _load_problem(shards, fmap, y_pm: np.ndarray, cw: np.ndarray, bases, which: str = "") -> bool:
    """Every shard computes its rows' kernel columns of ``fmap`` (labels, ``c_j``, the levels' bases); whether
    one spilled them.  The ``"columns"`` progress phase counts the rows done (a shard in this process
    advances it block by block; a remote shard's rows count when its call returns)."""
    n = len(y_pm)
    description = f"kernel columns on {fmap.n_columns} landmarks for {n} rows{which}"
    with progress.phase("columns", n, unit="rows", description=description) as step:

        def load(rows):
            return (fmap, y_pm[rows[0] : rows[1]], cw[rows[0] : rows[1]], bases, step)

        spilled = shards.call("load_problem", load, keep=True)  # kept: a rebuilt Dask shard loads it again
        step.update(n)  # the remote shards' rows
    return any(spilled)


def _newton_phase(fmap, n: int, which: str) -> progress.Phase:
    """The ``"newton"`` progress phase of one Newton solve (its step count is not known in advance)."""
    description = f"Newton steps at rank {fmap.rank} on {n} rows{which}"
    return progress.phase("newton", None, unit="steps", description=description)
