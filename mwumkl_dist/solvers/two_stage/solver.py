"""The two-stage solver: kernel weights from a subsample, the classifier from all rows."""

from __future__ import annotations

import logging
import time

import numpy as np

from mwumkl_dist.solvers.two_stage.newton import solve_squared_hinge
from mwumkl_dist.solvers.two_stage.nystroem import (
    N_COMPONENTS,
    PRUNE,
    WEIGHT_FRACTION,
    WEIGHT_POINTS,
    WEIGHT_POINTS_MIN,
    landmark_rows,
    nystroem_map,
    one_blas_thread,
)
from mwumkl_dist.solvers.two_stage.shards import linear_shards, sum_parts

__all__ = [
    "weight_points_for",
    "fit_two_stage",
    "SOLVERS",
    "AUTO_TWO_STAGE_POINTS",
    "check_solver",
    "resolve_solver",
]

logger = logging.getLogger("mwumkl_dist")


#: ``solver="auto"`` uses the two-stage fit from this many training rows (in-memory feature rows, finite C);
#: below, the MWU fit (polished up to 3000 rows).  cod-rna 2e4 rows: MWU 18.7 s CPU, 4.52 %; two-stage 3.9 %.
AUTO_TWO_STAGE_POINTS = 10000


SOLVERS = ("auto", "mwu", "two-stage")


def weight_points_for(n_samples: int) -> int:
    """Rows the two-stage fit learns the kernel weights on: ``WEIGHT_FRACTION * n`` within the bounds."""
    return int(min(n_samples, max(WEIGHT_POINTS_MIN, min(WEIGHT_POINTS, round(WEIGHT_FRACTION * n_samples)))))


def check_solver(solver) -> str:
    """``solver`` as the estimator takes it: "auto", "mwu" or "two-stage"."""
    if not isinstance(solver, str) or solver not in SOLVERS:
        raise ValueError(f'solver must be "auto", "mwu" or "two-stage", got {solver!r}')
    return solver


def two_stage_blocker(data, C, estimator=None) -> str | None:
    """Why the two-stage fit cannot run on ``data`` with ``C`` and ``estimator``'s settings (None: it can)."""
    if not hasattr(data, "kernel_set"):
        return "precomputed kernels (it needs feature rows, in memory or in a data store)"
    if C is not None and np.isinf(C):
        return "the hard margin (C = inf)"
    if estimator is not None and getattr(estimator, "checkpoint", None) is not None:
        return "checkpoints (they hold the MWU iterations' state)"
    if estimator is not None and getattr(estimator, "device", "cpu") != "cpu":
        return f'device="{estimator.device}" (the two-stage fit runs on the CPU)'
    return None


def resolve_solver(solver, data, C, *, estimator=None, resume=None) -> str:
    """The solver a fit runs: "mwu" or "two-stage".

    ``"auto"``: the two-stage fit from :data:`AUTO_TWO_STAGE_POINTS` training
    rows when it can run (feature rows in memory or in a data store, finite
    ``C``, no checkpoint, the CPU; either engine) and the fit does not resume
    an MWU checkpoint; else the MWU fit.  ``"two-stage"`` where it cannot run
    is a ValueError.
    """
    solver = check_solver(solver)
    blocker = two_stage_blocker(data, C, estimator)
    if blocker is None and resume is not None:
        blocker = "resuming an MWU checkpoint"
    if solver == "two-stage":
        if blocker is not None:
            raise ValueError(f'solver="two-stage" is not available for {blocker}')
        return solver
    if solver == "auto" and blocker is None and data.n_samples >= AUTO_TWO_STAGE_POINTS:
        return "two-stage"
    return "mwu"


def _weight_params(estimator, C_rel) -> dict:
    """The parameters of the weight stage's fit: ``estimator``'s, size-relative ``C``, local, no extras."""
    params = estimator.get_params()
    params.update(C="auto" if C_rel is None else C_rel, scale_C=True, engine="local", n_shards=1, n_kernel_shards=1,
                  checkpoint=None, probability=False)  # fmt: skip
    if "solver" in params:
        params["solver"] = "mwu"
    return params


def fit_two_stage(
    estimator,
    data,
    *,
    epsilon,
    C,
    rho: float,
    seed: int,
    sample_weight=None,
    client=None,
    weight_points: int | None = None,
    n_components: int = N_COMPONENTS,
    prune: float = PRUNE,
    row_block: int | None = None,
    spill="auto",
) -> dict:
    """The two-stage fit of ``estimator`` on feature rows ``data``: the fitted attributes by name.

    Same contract as :func:`mwumkl_dist.solvers.driver.fit_model` (whose arguments it
    takes), and the same attributes: the kernel weights, ``C_``, the
    selectivity and ``epsilon_`` come from the MWU fit on a stratified
    subsample of ``weight_points`` rows (None: :func:`weight_points_for`; the
    estimator's own fit path, with ``C="auto"``'s cross-validation, in this
    process); ``support_`` are the landmark rows and ``dual_coef_`` the kernel
    expansion of the linear model on the Nystroem features of each binary
    problem's combined kernel (see the module), solved over the shards of
    :func:`linear_shards` (``engine="dask"``: on ``client``'s workers; a data
    store is read block by block, by the shards).  ``kernel_traces_`` are the
    traces on all rows; kernels with ``mu_i < prune * max(mu)`` get weight 0
    (the rest renormalised).  Also sets ``solver_`` ("two-stage"),
    ``weight_points_``, ``n_components_`` (the rank of each problem's map) and
    ``features_spilled_`` (whether a shard kept its features on disk).
    ``probability=True`` calibrates on the decision values of polished MWU
    folds (the exact solution of the problem the linear stage approximates),
    as a polished fit does.
    """
    from mwumkl_dist.data.weights import check_class_weight
    from mwumkl_dist.solvers import auto
    from mwumkl_dist.solvers.driver import drop_zero_weights, fit_model, training_classes

    blocker = two_stage_blocker(data, C, estimator)
    if blocker is not None:
        raise ValueError(f'solver="two-stage" is not available for {blocker}')
    data, kept, sample_weight = drop_zero_weights(data, sample_weight)
    classes = training_classes(data.y)
    class_weight = check_class_weight(estimator.class_weight, classes)
    n = data.n_samples
    C_rel = None if C is None else (float(C) if estimator.scale_C else float(C) / n)
    # 1. the kernel weights (and C, the selectivity) on a subsample, by the MWU fit path.
    clock = [time.process_time()]
    rows = auto.stratified_rows(data.y, weight_points_for(n) if weight_points is None else weight_points, seed)
    missing = np.setdiff1d(classes, data.y[rows])  # a class too small to stratify: its first row joins
    if len(missing):
        rows = np.union1d(rows, [np.flatnonzero(data.y == c)[0] for c in missing])
    sub = data.rows_in_memory(rows)
    sub_estimator = type(estimator)(**_weight_params(estimator, C_rel))
    sub_attrs = fit_model(sub_estimator, sub, epsilon=epsilon, C=C_rel, rho=rho, seed=seed,
                          sample_weight=None if sample_weight is None else sample_weight[rows])  # fmt: skip
    if not np.array_equal(sub_attrs["classes_"], classes):
        raise ValueError("the weight subsample misses a class; the two-stage solver needs every class in it")
    C_rel = float(sub_attrs["C_"])
    clock.append(time.process_time())
    # 2. the Nystroem map of each problem's combined kernel on shared landmarks, 3. the linear solve.
    # BLAS and LAPACK on one thread: their results change with the thread count (eigh, products), and
    # the model must not; the kernel evaluations use this thread's numba threads (same bits for any count).
    settings = dict(engine=estimator.engine, n_shards=estimator.n_shards, timeout=estimator.worker_timeout)
    with linear_shards(data, **settings, client=client, row_block=row_block, spill=spill) as shards, one_blas_thread():
        return _full_stage(estimator, data, shards, sub_attrs, classes, class_weight, sample_weight, kept, rows,
                           C_rel, n_components=n_components, prune=prune, seed=seed, clock=clock)  # fmt: skip


def _full_stage(estimator, data, shards, sub_attrs, classes, class_weight, sample_weight, kept, rows, C_rel, *,
                n_components, prune, seed, clock) -> dict:  # fmt: skip
    """Stages 2 and 3 of :func:`fit_two_stage` (see there) on ``shards``: the fitted attributes."""
    from mwumkl_dist.data.weights import problem_weights
    from mwumkl_dist.solvers.driver import one_vs_rest_targets

    n = data.n_samples
    ks = data.kernel_set
    if data.traces is not None:
        traces = data.traces
    else:  # the blocks' traces, summed in row order
        traces = sum_parts((p for parts in shards.call("trace_parts") for p in parts), len(ks))
    landmarks = landmark_rows(n, n_components, seed)
    L = data.support_vectors(landmarks)
    mus = np.atleast_2d(sub_attrs["kernel_weights_"]).astype(np.float64)
    targets = one_vs_rest_targets(classes)
    kernel_weights = np.zeros_like(mus)
    dual_coef = np.zeros((len(targets), len(landmarks)))
    intercept = np.zeros(len(targets))
    ranks, spilled = [], False
    for k, target in enumerate(targets):
        mu = np.where(mus[k] >= prune * mus[k].max(), mus[k], 0.0)
        kernel_weights[k] = mu / mu.sum()
        w = kernel_weights[k] / traces * n  # unit mean diagonal on the training rows
        fmap = nystroem_map(ks, L, w)
        y_pm = np.where(data.y == target, 1.0, -1.0)
        point_weights = problem_weights(data.y, classes, target, class_weight, sample_weight)
        cw = np.ones(n) if point_weights is None else np.asarray(point_weights, dtype=np.float64)
        ccw = C_rel * cw

        def load(rows, fmap=fmap, y_pm=y_pm, ccw=ccw):
            return (fmap, y_pm[rows[0] : rows[1]], ccw[rows[0] : rows[1]])

        spilled |= any(shards.call("load_problem", load, keep=True))  # keep: a rebuilt Dask shard loads it too
        clock.append(time.process_time())
        coef, intercept[k] = solve_squared_hinge(shards, fmap.rank, y_pm, C_rel, cw)
        clock.append(time.process_time())
        dual_coef[k] = n * fmap.expansion(coef)  # on the raw kernels: raw weights are mu / r = w / n
        ranks.append(fmap.rank)
    if estimator.probability:  # the same SVM as the exact polish solves: calibrated on polished folds
        from mwumkl_dist.solvers.driver import platt_scaling, probability_input

        attrs_prob = platt_scaling(
            estimator, probability_input(estimator, data, seed), classes, C=C_rel, polished=True, seed=seed,
            sample_weight=sample_weight, iterations_per_point=None,
        )  # fmt: skip
    stage_seconds = np.diff(clock)
    if estimator.verbose:
        logger.info("two-stage: weights on %d rows %.1f s CPU; per problem, features and linear solve: %s",
                    len(rows), stage_seconds[0], " ".join(f"{t:.1f}" for t in stage_seconds[1:]))  # fmt: skip
    single = len(targets) == 1
    support = landmarks if kept is None else kept[landmarks]
    attrs = {
        key: sub_attrs[key]
        for key in ("epsilon_", "selectivity_", "C_path_", "selectivity_path_", "n_iter_", "interrupted_")
        if key in sub_attrs
    }
    attrs.update(
        classes_=classes,
        kernel_names_=data.kernel_names,
        n_features_in_=data.n_features_in,
        fit_warnings_=list(sub_attrs.get("fit_warnings_", [])),
        C_=C_rel if estimator.scale_C else C_rel * n,
        kernel_traces_=traces,
        kernel_weights_=kernel_weights[0] if single else kernel_weights,
        raw_kernel_weights_=(kernel_weights / traces)[0] if single else kernel_weights / traces,
        support_=support,
        support_vectors_=L,
        dual_coef_=dual_coef,
        intercept_=intercept,
        polished_=False,
        solver_="two-stage",
        weight_points_=len(rows),
        n_components_=ranks[0] if single else np.array(ranks),
        features_spilled_=bool(spilled),
    )
    if estimator.probability:
        attrs["probA_"], attrs["probB_"] = attrs_prob
    return attrs
