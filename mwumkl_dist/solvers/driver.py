"""The fit driver: one fit from a specification and a training input to the fitted attributes.

:func:`fit_model` does once what every solver's model needs: it picks the solver
(:func:`resolve_solver`, over the :data:`SOLVERS` registry), prepares the task (points of sample
weight 0 dropped, classes, class weights, seed; :meth:`~mwumkl_dist.solvers.base.FitTask.prepare`),
reaches the Dask cluster, hands the task to the solver, fits Platt's sigmoids for
``probability=True`` and assembles the model. It never looks at the kind of input: everything
kind-specific is a method of the training input or of its binary problems. Nested fits (the
cross-validation folds, the two-stage weight stage) call :func:`fit_model` again through
:attr:`FitTask.fit <mwumkl_dist.solvers.base.FitTask.fit>`.

Adding a solver: a module with a class that implements :class:`~mwumkl_dist.solvers.base.Solver`,
and one entry in :data:`SOLVERS` (and in :data:`mwumkl_dist.solvers.spec.SOLVER_NAMES`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import warnings
from dataclasses import replace

import numpy as np

from mwumkl_dist.core import progress
from mwumkl_dist.core.mwu_rules import MajorityClassWarning
from mwumkl_dist.data.problems import TrainingInput
from mwumkl_dist.data.weights import score_weights, weighted_error
from mwumkl_dist.solvers import auto
from mwumkl_dist.solvers.base import (
    Calibration,
    FitTask,
    Solver,
    continuous_target,
    fold_decisions,
    fold_map,
    model_decisions,
    predicted_labels,
)
from mwumkl_dist.solvers.calibration import fit_platt
from mwumkl_dist.solvers.candidates import path_attributes
from mwumkl_dist.solvers.mwu.solver import MWUSolver
from mwumkl_dist.solvers.spec import FitSpec
from mwumkl_dist.solvers.two_stage.solver import AUTO_TWO_STAGE_POINTS, TwoStageSolver

__all__ = [
    "SOLVERS",
    "check_against_majority",
    "fit_model",
    "platt_scaling",
    "probability_input",
    "progress_sink",
    "resolve_solver",
    "solver_note",
]

logger = logging.getLogger("mwumkl_dist")

#: The solvers by the name the ``solver`` parameter gives them ("auto" picks one of them).
SOLVERS: dict[str, Solver] = {"mwu": MWUSolver(), "two-stage": TwoStageSolver()}


def resolve_solver(spec: FitSpec, data: TrainingInput, *, resume=None) -> str:
    """The solver a fit runs: "mwu" or "two-stage".

    ``"auto"``: the two-stage fit from :data:`~mwumkl_dist.solvers.two_stage.solver.AUTO_TWO_STAGE_POINTS`
    training rows when it can run (feature rows in memory or in a data store, finite ``C``, no
    checkpoint; either engine and device) and the fit does not resume an MWU checkpoint; else the
    MWU fit.  A named solver that cannot run is a ValueError naming why.
    """
    if spec.model.solver == "auto":
        two_stage = SOLVERS["two-stage"].blocker(spec, data, resume=resume) is None
        return "two-stage" if two_stage and data.n_samples >= AUTO_TWO_STAGE_POINTS else "mwu"
    blocker = SOLVERS[spec.model.solver].blocker(spec, data, resume=resume)
    if blocker is not None:
        raise ValueError(f'solver="{spec.model.solver}" is not available for {blocker}')
    return spec.model.solver


#: Blockers of the two-stage fit that are no choice of the user's (``solver="auto"`` says nothing of them).
_SILENT_BLOCKERS = ("precomputed kernels", "resuming an MWU checkpoint")


def solver_note(spec: FitSpec, data: TrainingInput, *, resume=None) -> str | None:
    """Why ``solver="auto"`` runs the MWU fit where it would pick the two-stage fit (None: nothing to say).

    From :data:`~mwumkl_dist.solvers.two_stage.solver.AUTO_TWO_STAGE_POINTS` rows ``"auto"`` means the
    two-stage fit; a setting that rules it out (a checkpoint, ``C=inf``) makes it the MWU
    fit on all the rows, a much longer fit: the user should hear of it.
    """
    if spec.model.solver != "auto" or data.n_samples < AUTO_TWO_STAGE_POINTS:
        return None
    blocker = SOLVERS["two-stage"].blocker(spec, data, resume=resume)
    if blocker is None or blocker.startswith(_SILENT_BLOCKERS):
        return None
    return (
        f'solver="auto" runs the MWU solver on all {data.n_samples} points, not the two-stage fit it picks for '
        f"{AUTO_TWO_STAGE_POINTS} points or more, because the two-stage fit does not support {blocker}; "
        'this fit can take much longer (pass solver="mwu" to choose it explicitly)'
    )


def fit_model(
    spec: FitSpec, data: TrainingInput, *, sample_weight=None, seed: int | None = None, resume=None, nested=False
) -> dict:
    """Fit ``data`` as ``spec`` says; returns the fitted attributes by name.

    Parameters
    ----------
    spec : FitSpec
    data : TrainingInput
    sample_weight : array-like of shape (n_samples,) or None
        Per-point weights: points of weight 0 are left out (``support_`` still
        indexes all training points), the others get ``C_j = C_eff * w_j``.
    seed : int or None
        For the random choices (``C="auto"``'s folds and sample, ``probability``'s
        folds, the two-stage subsample and landmarks); None: drawn from ``spec.model.random_state``.
    resume : path or None
        An MWU checkpoint to continue from.
    nested : bool
        A fit inside another (a cross-validation fold, the two-stage weight stage): its model is
        not checked against the majority class (the outer fit's is).
    """
    with progress.reporting(None if nested else progress_sink(spec)):
        return _fit_model(spec, data, sample_weight=sample_weight, seed=seed, resume=resume, nested=nested)


def progress_sink(spec: FitSpec):
    """Where a fit's progress goes (:mod:`mwumkl_dist.core.progress`): the execution's ``callback`` and, with
    ``verbose``, the ``mwumkl_dist`` logger; None when neither is set.  Only the callback's answer (True: stop)
    counts."""
    log = progress.LogSink(logger) if spec.execution.verbose else None
    callback = spec.execution.callback
    if log is None:
        return callback
    if callback is None:
        return log

    def both(info):
        log(info)
        return callback(info)

    return both


def _fit_model(spec: FitSpec, data: TrainingInput, *, sample_weight, seed, resume, nested) -> dict:
    seed = auto.random_seed(spec.model.random_state) if seed is None else seed
    solver = SOLVERS[resolve_solver(spec, data, resume=resume)]
    note = None if nested else solver_note(spec, data, resume=resume)
    if note is not None:  # said before the (long) fit, and kept with the model
        warnings.warn(note, UserWarning, stacklevel=4)
    if not nested and (problem := continuous_target(data.y)) is not None:
        raise ValueError(problem)  # before any work; a fold of a checked fit may have fewer rows per class
    nested_fit = functools.partial(fit_model, nested=True)
    task = FitTask.prepare(spec, data, sample_weight=sample_weight, seed=seed, fit=nested_fit, resume=resume)
    calibration_data = probability_input(spec, task.data, seed)
    # Reach the cluster first: an unreachable scheduler fails fast, before any cross-validation.
    with cluster_client(spec) as client:
        model = solver.fit(spec, replace(task, client=client))
    attrs = {
        "classes_": task.classes,
        "kernel_names_": task.data.kernel_names,
        "n_features_in_": task.data.n_features_in,
        **model.attributes,
    }
    if note is not None:
        attrs["fit_warnings_"] = [note, *attrs.get("fit_warnings_", [])]
    if not nested:
        check_against_majority(spec, task, attrs, model.train_scores)
    kernel_set = task.data.kernel_set
    if kernel_set is not None and kernel_set.scale is not None:  # a scaled family: its widths' unit
        attrs["kernel_scale_"] = kernel_set.scale.sigma()
    if calibration_data is not None:
        attrs["probA_"], attrs["probB_"] = platt_scaling(
            spec, calibration_data, task.classes, model.calibration, seed=seed, sample_weight=task.sample_weight
        )
    if task.kept is not None:  # indices into all the training points given, those of weight 0 included
        attrs["support_"] = task.kept[attrs["support_"]]
    return attrs


@contextlib.contextmanager
def cluster_client(spec: FitSpec):
    """The Dask client of an ``engine="dask"`` fit (None for the local engine), closed after if opened here."""
    if spec.execution.engine != "dask":
        yield None
        return
    from mwumkl_dist.engines.dask import connect_client

    client, owns_client = connect_client(spec.execution.client, timeout=spec.execution.scheduler_timeout)
    try:
        _say_if_no_workers(client, spec)
        yield client
    finally:
        if owns_client:
            client.close()


def _say_if_no_workers(client, spec: FitSpec) -> None:
    """Log at once when the cluster has no workers (the engine waits for them, after ``C="auto"``'s folds)."""
    try:
        n_workers = len(client.nthreads())
    except Exception:  # the engine reports a lost scheduler when it needs one
        return
    if n_workers == 0:
        logger.warning(
            "the Dask scheduler at %s has no workers yet; the fit waits up to %g s (worker_timeout) for them",
            getattr(client.scheduler, "address", "?"),
            spec.execution.worker_timeout,
        )


def probability_input(spec: FitSpec, data: TrainingInput, seed: int):
    """The in-memory data ``probability=True`` calibrates on (None without it); refused before any fitting."""
    if not spec.model.probability:
        return None
    cv = data.cross_validation_input(auto.AUTO_C_POINTS, seed)
    if cv is None:
        raise ValueError(
            "probability=True needs held-out decision values, which a fit from a kernel store cannot "
            "cross-validate; fit without probabilities, or from arrays"
        )
    return cv


def platt_scaling(spec: FitSpec, cv: TrainingInput, classes, calibration: Calibration, *, seed: int, sample_weight):
    """``probability=True``: Platt's sigmoids ``(probA_, probB_)`` fitted to held-out decision values.

    Stratified 5-fold cross-validation (as LIBSVM) of the MWU fit with the final
    ``C`` (size-relative) on at most :data:`~mwumkl_dist.solvers.auto.AUTO_C_POINTS`
    of ``cv``'s rows (like ``C="auto"``, to bound the cost: 5 fits of that
    size), then :func:`mwumkl_dist.solvers.calibration.fit_platt` on the decision
    values of the points each fold left out, weighted by their sample weights
    (class weights shape the margin, not the probabilities).  The folds reproduce
    the model's regime (``calibration``): polished, or unpolished at the final
    fit's iterations per point (see :func:`mwumkl_dist.solvers.auto.fold_spec`),
    so that their decision values are on the final model's scale.
    """
    rows = auto.stratified_rows(cv.y, auto.AUTO_C_POINTS, seed)
    ys = cv.y[rows]
    counts = np.unique(ys, return_counts=True)[1]
    if len(counts) < len(classes) or counts.min() < 2:
        raise ValueError("probability=True needs at least 2 training points of every class for its cross-validation")
    from sklearn.model_selection import StratifiedKFold

    folds = list(StratifiedKFold(int(min(5, counts.min())), shuffle=True, random_state=seed).split(rows, ys))
    decisions = np.zeros((len(rows), 1 if len(classes) == 2 else len(classes)))
    chosen = {} if calibration.selectivity is None else {"selectivity": calibration.selectivity}
    if calibration.candidate is not None:  # the folds refit the model's candidate
        chosen["candidate"] = calibration.candidate

    def held_out(split):
        train, test = rows[split[0]], rows[split[1]]
        kernels = cv.kernels_with_trace(train)
        skip = auto.no_iterations_needed(calibration.polished, calibration.iterations_per_point,
                                         chosen.get("selectivity", spec.model.selectivity), len(train),
                                         getattr(kernels, "n_kernels", None) or len(kernels),
                                         candidate=calibration.candidate)  # fmt: skip
        fold = auto.fold_spec(spec, polished=calibration.polished, n_train=len(train), C=calibration.C,
                              iterations_per_point=calibration.iterations_per_point, **chosen,
                              **({"max_iter": 0} if skip else {}))  # fmt: skip
        nested_fit = functools.partial(fit_model, nested=True)
        _, values = fold_decisions(nested_fit, fold, cv, kernels, train, test, sample_weight,
                                   doing="calibrating probabilities")  # fmt: skip
        return values.reshape(len(test), -1)

    with progress.phase("calibration", len(folds), unit="fits",
                        description=f"calibrating probabilities: {len(folds)}-fold Platt scaling") as step:  # fmt: skip
        for (_, b), values in zip(folds, fold_map(held_out, folds, doing="calibrating probabilities", step=step)):
            decisions[b] = values
    weights = None if sample_weight is None else sample_weight[rows]
    return fit_platt(decisions, ys, classes, sample_weight=weights)


#: Training rows the model is scored on when no cross-validated error is known (see :func:`check_against_majority`).
MAJORITY_CHECK_POINTS = 4000


def check_against_majority(spec: FitSpec, task: FitTask, attrs: dict, train_scores=None) -> None:
    """Warn (and record in ``fit_warnings_``) when the model is no better than predicting the majority class.

    The error compared is the cross-validated one of the chosen ``C`` and selectivity when the fit
    cross-validated them (``C="auto"``; the two-stage fit's weight stage), else the training error:
    on the rows the solver scored the model on (``train_scores``, :attr:`FittedModel.train_scores
    <mwumkl_dist.solvers.base.FittedModel.train_scores>`: an unpolished MWU fit's bias check), or on a
    stratified sample of :data:`MAJORITY_CHECK_POINTS` rows (optimistic: a model that is no
    better even there is useless). Errors are weighted as ``C="auto"`` scores them (class and
    sample weights). Inputs whose rows cannot be read back (a kernel store) without a
    cross-validated error or ``train_scores`` are not checked.
    """
    y = task.data.y
    weights = score_weights(y, spec.model.class_weight, task.sample_weight)
    majority = min(weighted_error(np.full(len(y), c), y, weights) for c in task.classes)
    paths = [error for name in path_attributes() for error in attrs.get(name, {}).values()]
    if paths:
        error, what = min(paths), "cross-validated"
    else:
        if train_scores is not None:  # scored already: no second prediction
            rows, scores = train_scores
            decisions = scores + np.asarray(attrs["intercept_"])[None, :]
        else:
            rows = auto.stratified_rows(y, MAJORITY_CHECK_POINTS, task.seed)
            scoring = task.data.scoring_rows(rows, attrs["support_"])
            if scoring is None:
                return
            X, support = scoring
            decisions = model_decisions(spec.model.kernels, {**attrs, "support_": support}, X, task.backend)
        error = weighted_error(
            predicted_labels(task.classes, decisions), y[rows], None if weights is None else weights[rows]
        )
        what = "training"
    if error < majority:
        return
    message = (
        f"the model's {what} error ({100 * error:.1f} %) is no better than predicting the majority class "
        f"({100 * majority:.1f} %): these kernels and settings do not fit this data (try other kernels, e.g. "
        "'scaled-per-feature', or scale the features)"
    )
    warnings.warn(message, MajorityClassWarning, stacklevel=5)
    attrs["fit_warnings_"] = [*attrs.get("fit_warnings_", []), message]
