"""The fit driver: binary problems one-vs-rest, engines and their client, checkpoints and resume, the polish.

:func:`fit_model` turns a :class:`~mwumkl_dist.data.problems.TrainingInput` and an
estimator's parameters into the fitted attributes (``classes_``,
``kernel_weights_``, ``dual_coef_``, ...), which the estimator then takes
over.  It never looks at the kind of input: everything kind-specific is a
method of the training input or of its binary problems.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import warnings
from dataclasses import dataclass

import numpy as np
from sklearn.utils.multiclass import check_classification_targets

from mwumkl_dist.data.problems import Problem, TrainingInput, check_traces
from mwumkl_dist.data.store_problems import merge_cache_stats
from mwumkl_dist.data.weights import check_class_weight, check_sample_weight, point_ridge, problem_weights
from mwumkl_dist.engines.base import Engine
from mwumkl_dist.engines.local import LocalEngine
from mwumkl_dist.io.checkpoint import Checkpointer, fingerprint, load_checkpoint
from mwumkl_dist.solvers import auto, mwu
from mwumkl_dist.solvers.calibration import fit_platt
from mwumkl_dist.solvers.mwu.polish import polish_budget_ok, solve_l2_svm
from mwumkl_dist.solvers.two_stage import fit_two_stage, resolve_solver

__all__ = [
    "SolveSettings",
    "fit_model",
    "make_engine",
    "check_shard_count",
    "solve_one_vs_rest",
    "model_attributes",
    "polish_model",
    "MIN_ROWS_PER_SHARD",
    "DEFAULT_WORKER_TIMEOUT",
]

#: Fewer rows than this per row shard draws a warning: a shard's fixed cost per superstep (and,
#: on Dask, its actor and socket) then outweighs its work.  More shards than rows is an error.
MIN_ROWS_PER_SHARD = 16
#: Seconds a Dask fit waits for workers (the estimator's ``worker_timeout`` default).
DEFAULT_WORKER_TIMEOUT = 600.0

logger = logging.getLogger("mwumkl_dist")


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


def training_classes(y) -> np.ndarray:
    """The classes of the training labels; at least two."""
    check_classification_targets(y)
    classes = np.unique(y)
    if len(classes) < 2:
        raise ValueError(f"the training labels hold one class only ({classes[0]!r}); MWUMKL needs at least two")
    return classes


def one_vs_rest_targets(classes: np.ndarray) -> list:
    """The positive class of each binary problem: ``classes[1]`` for two classes, else each class."""
    return [classes[1]] if len(classes) == 2 else list(classes)


def base_ridge(C: float, n_samples: int, scale_C: bool) -> float:
    """``1 / C_eff`` with ``C_eff = C * n`` (``scale_C``) or ``C``; 0 for the hard margin."""
    return 0.0 if np.isinf(C) else 1.0 / (C * n_samples if scale_C else C)


def fit_model(
    estimator, data: TrainingInput, *, epsilon, C, rho: float, seed: int, resume=None, sample_weight=None
) -> dict:
    """Fit ``estimator``'s model on ``data``; returns the fitted attributes by name.

    Parameters
    ----------
    estimator : MWUMKLClassifier
        Its (validated) parameters; it is not modified.
    data : TrainingInput
    epsilon, C : float, or None for ``"auto"``
    rho : float
    seed : int
        For the random choices (``C="auto"``'s folds and sample, ``probability``'s folds).
    resume : path or None
        A checkpoint to continue from.
    sample_weight : array-like of shape (n_samples,) or None
        Per-point weights: points of weight 0 are left out (``support_`` still
        indexes all training points), the others get ``C_j = C_eff * w_j``.
    """
    if resolve_solver(getattr(estimator, "solver", "mwu"), data, C, estimator=estimator, resume=resume) == "two-stage":
        with _cluster_client(estimator) as client:
            return fit_two_stage(estimator, data, epsilon=epsilon, C=C, rho=rho, seed=seed,
                                 sample_weight=sample_weight, client=client)  # fmt: skip
    data, kept, sample_weight = drop_zero_weights(data, sample_weight)
    classes = training_classes(data.y)
    check_shard_count(estimator.n_shards, data.n_samples)
    class_weight = check_class_weight(estimator.class_weight, classes)
    n, m = data.n_samples, len(data.kernel_names)
    calibration_data = probability_input(estimator, data, seed)
    if estimator.polish is True and data.polish_blocker is not None:
        raise ValueError(f"polish=True is not available for {data.polish_blocker}")
    plan = auto.plan_iterations(
        epsilon="auto" if epsilon is None else epsilon, max_iter=estimator.max_iter, rho=rho,
        polish=estimator.polish, C=C, n_samples=n, n_kernels=m, in_memory=data.polish_blocker is None,
    )  # fmt: skip
    attrs = {"classes_": classes, "kernel_names_": data.kernel_names, "n_features_in_": data.n_features_in}
    attrs["solver_"] = "mwu"
    attrs.update(epsilon_=plan.epsilon, fit_warnings_=[])
    if plan.warning is not None:  # before any fitting, C="auto"'s included
        warnings.warn(plan.warning, auto.FewIterationsWarning, stacklevel=3)
        attrs["fit_warnings_"].append(plan.warning)
    # Reach the cluster first: an unreachable scheduler fails fast, before any cross-validation.
    with _cluster_client(estimator) as client:
        targets = one_vs_rest_targets(classes)
        point_weights = [problem_weights(data.y, classes, t, class_weight, sample_weight) for t in targets]
        # Unpolished and weighted: folds at the final fit's T / n (see auto.fold_params).
        unequal = any(np.ndim(point_ridge(1.0, w)) for w in point_weights)
        per_point = plan.n_iter / n if unequal and not plan.polished else None
        selectivity = auto.check_selectivity(estimator.selectivity)
        if C is None:  # cross-validated (with the selectivity when "auto"), in size-relative units
            C, selectivity, attrs["C_path_"], selectivity_path = auto.choose_C(
                estimator, data, polished=plan.polished, seed=seed, verbose=estimator.verbose,
                sample_weight=sample_weight, iterations_per_point=per_point,
                choose_selectivity=selectivity == "auto",
            )  # fmt: skip
            if estimator.selectivity == "auto":
                attrs["selectivity_path_"] = selectivity_path
            attrs["C_"] = C if estimator.scale_C else C * n
            ridge = base_ridge(C, n, scale_C=True)
        else:
            if selectivity == "auto":  # a given C: no cross-validation behind the user's back
                selectivity = auto.AUTO_SELECTIVITY_START
            attrs["C_"] = C
            ridge = base_ridge(C, n, estimator.scale_C)
        attrs["selectivity_"] = selectivity
        ridges = [point_ridge(ridge, w) for w in point_weights]
        settings = SolveSettings(
            plan.epsilon, rho, plan.n_iter, ridges, auto.solver_selectivity(selectivity, plan.epsilon, m)
        )
        results, traces, stats = solve_one_vs_rest(estimator, data, classes, settings, client, resume)
    attrs.update(model_attributes(results, data, targets, traces))
    cache_info = merge_cache_stats(stats)
    if cache_info is not None:
        attrs["cache_info_"] = cache_info
    attrs.update(polish_model(attrs, data, targets, ridges, estimator.polish))
    if not attrs["polished_"]:
        guard_biases(estimator, attrs, data, targets, class_weight, sample_weight, seed,
                     few_iterations=plan.warning is not None)  # fmt: skip
    if calibration_data is not None:
        relative_C = attrs["C_"] if estimator.scale_C else attrs["C_"] / n  # the folds scale C to their size
        attrs["probA_"], attrs["probB_"] = platt_scaling(
            estimator, calibration_data, classes, C=relative_C, polished=plan.polished, seed=seed,
            sample_weight=sample_weight, iterations_per_point=None if plan.polished else plan.n_iter / n,
        )  # fmt: skip
    if kept is not None:  # indices into all the training points given, those of weight 0 included
        attrs["support_"] = kept[attrs["support_"]]
    return attrs


@contextlib.contextmanager
def _cluster_client(estimator):
    """The Dask client of an ``engine="dask"`` fit (None for the local engine), closed after if opened here."""
    if estimator.engine != "dask":
        yield None
        return
    from mwumkl_dist.engines.dask import connect_client

    client, owns_client = connect_client(estimator.client, timeout=estimator.scheduler_timeout)
    try:
        _say_if_no_workers(client, estimator)
        yield client
    finally:
        if owns_client:
            client.close()


def _say_if_no_workers(client, estimator) -> None:
    """Log at once when the cluster has no workers (the engine waits for them, after ``C="auto"``'s folds)."""
    try:
        n_workers = len(client.nthreads())
    except Exception:  # the engine reports a lost scheduler when it needs one
        return
    if n_workers == 0:
        logger.warning(
            "the Dask scheduler at %s has no workers yet; the fit waits up to %g s (worker_timeout) for them",
            getattr(client.scheduler, "address", "?"),
            getattr(estimator, "worker_timeout", DEFAULT_WORKER_TIMEOUT),
        )


def drop_zero_weights(data: TrainingInput, sample_weight):
    """``(data, kept, weights)`` without the points of weight 0; ``kept``: their indices (None: all kept)."""
    sample_weight = check_sample_weight(sample_weight, data.n_samples)
    if sample_weight is None:
        return data, None, None
    kept = np.flatnonzero(sample_weight > 0)
    labels = np.unique(data.y[kept])
    if len(labels) < 2 and len(np.unique(data.y)) >= 2:
        raise ValueError(
            f"only one class ({labels.tolist()[0]!r}) has points of non-zero sample weight; "
            "MWUMKL needs at least two classes"
        )
    data = data.subset(kept)  # a store refuses sample weights here
    return data, (None if len(kept) == len(sample_weight) else kept), sample_weight[kept]


def probability_input(estimator, data: TrainingInput, seed: int):
    """The in-memory data ``probability=True`` calibrates on (None without it); refused before any fitting."""
    if not estimator.probability:
        return None
    cv = data.cross_validation_input(auto.AUTO_C_POINTS, seed)
    if cv is None:
        raise ValueError(
            "probability=True needs held-out decision values, which a fit from a kernel store cannot "
            "cross-validate; fit without probabilities, or from arrays"
        )
    return cv


def platt_scaling(
    estimator, cv: TrainingInput, classes, *, C: float, polished: bool, seed: int, sample_weight, iterations_per_point
):
    """``probability=True``: Platt's sigmoids ``(probA_, probB_)`` fitted to held-out decision values.

    Stratified 5-fold cross-validation (as LIBSVM) of ``estimator``'s fit with
    the final ``C`` (size-relative) on at most :data:`~mwumkl_dist.solvers.auto.AUTO_C_POINTS`
    of ``cv``'s rows (like ``C="auto"``, to bound the cost: 5 fits of that
    size), then :func:`mwumkl_dist.solvers.calibration.fit_platt` on the decision
    values of the points each fold left out, weighted by their sample weights
    (class weights shape the margin, not the probabilities).  Unpolished, the
    folds run the final fit's iterations per point (``iterations_per_point``,
    see :func:`mwumkl_dist.solvers.auto.fold_params`), so that their decision values
    are on the final model's scale.
    """
    rows = auto.stratified_rows(cv.y, auto.AUTO_C_POINTS, seed)
    ys = cv.y[rows]
    counts = np.unique(ys, return_counts=True)[1]
    if len(counts) < len(classes) or counts.min() < 2:
        raise ValueError("probability=True needs at least 2 training points of every class for its cross-validation")
    from sklearn.model_selection import StratifiedKFold

    folds = StratifiedKFold(int(min(5, counts.min())), shuffle=True, random_state=seed).split(rows, ys)
    decisions = np.zeros((len(rows), 1 if len(classes) == 2 else len(classes)))
    for a, b in folds:
        train, test = rows[a], rows[b]
        X_train, X_test, kernel_params = cv.fold_data(cv.kernels_with_trace(train), train, test)
        params = auto.fold_params(
            estimator, polished=polished, iterations_per_point=iterations_per_point, n_train=len(train)
        )
        fold = type(estimator)(**{**params, **kernel_params, "C": C})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", auto.FewIterationsWarning)  # said once, for the final fit
            fold.fit(X_train, cv.y[train], sample_weight=None if sample_weight is None else sample_weight[train])
        if fold.interrupted_:
            raise mwu.FitInterrupted("interrupted while calibrating probabilities; nothing was fitted")
        decisions[b] = fold.decision_function(X_test).reshape(len(test), -1)
    weights = None if sample_weight is None else sample_weight[rows]
    return fit_platt(decisions, ys, classes, sample_weight=weights)


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
            stacklevel=4,
        )


def make_engine(estimator, problem: Problem, client) -> Engine:
    """The estimator's engine (``"local"`` or ``"dask"``) holding ``problem``'s shards (on its ``device``)."""
    device = getattr(estimator, "device", "cpu")  # a model unpickled from before device: the CPU
    if device != "cpu":
        from mwumkl_dist.data import cuda_shards as cuda

        # The local engine's GPU is checked here, at once; Dask workers check their own.
        problem = cuda.on_device(problem, device, driver_gpu=estimator.engine == "local")
    if estimator.engine == "local":
        return LocalEngine(problem, n_shards=estimator.n_shards)
    from mwumkl_dist.engines.dask import DaskEngine

    return DaskEngine(
        problem,
        client,
        n_shards=estimator.n_shards,
        n_kernel_shards=estimator.n_kernel_shards,
        timeout=getattr(estimator, "worker_timeout", DEFAULT_WORKER_TIMEOUT),
    )


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


def solve_one_vs_rest(estimator, data: TrainingInput, classes, settings: SolveSettings, client, resume=None):
    """Solve the binary problem of each one-vs-rest target in turn (resuming from a checkpoint when given one).

    Returns ``(results, traces, stats)``: the :class:`~mwumkl_dist.solvers.mwu.MWUResult` of
    each problem solved, the kernels' traces and the engines' shard counters.
    Raises :class:`~mwumkl_dist.solvers.mwu.FitInterrupted` when a stop left some of
    several problems unsolved.  A lost Dask cluster (``ConnectionError``, e.g.
    :class:`~mwumkl_dist.engines.dask.SchedulerLostError`, or a shard that stopped
    answering) is raised with the checkpoint to resume from added to its message.
    """
    targets = one_vs_rest_targets(classes)
    fp = None
    if estimator.checkpoint is not None or resume is not None:
        fp = _fingerprint(data, classes, settings)
    resumed = load_checkpoint(resume, fp) if resume is not None else None
    results: list[mwu.MWUResult] = list(resumed["finished"]) if resumed is not None else []
    try:
        traces, stats = _solve_problems(estimator, data, targets, settings, client, resumed, results, fp)
    except _cluster_failures(estimator) as exc:
        raise _with_checkpoint_note(exc, estimator, fp) from None
    if len(results) < len(targets):
        how = (
            f"resume it with fit(..., resume={estimator.checkpoint!r})"
            if estimator.checkpoint is not None
            else "refit with checkpoint=PATH to be able to resume"
        )
        raise mwu.FitInterrupted(
            f"the fit was interrupted after {len(results)} of {len(targets)} one-vs-rest problems; {how}"
        )
    return results, np.asarray(traces, dtype=np.float64), stats


def _solve_problems(estimator, data: TrainingInput, targets, settings: SolveSettings, client, resumed, results, fp):
    """Solve the binary problems not in ``results`` yet (appending to it); ``(traces, stats)``."""
    traces, stats = data.traces, []
    for k in range(len(results), len(targets)):
        problem = data.binary(np.where(data.y == targets[k], 1.0, -1.0))
        with make_engine(estimator, problem, client) as engine:
            if traces is None:
                traces = engine.traces()
            check_traces(traces, data.kernel_names)
            inv_trace = 1.0 / traces
            engine.configure(inv_trace, settings.ridges[k])
            state = None
            if resumed is not None and resumed["problem_index"] == k:
                state = resume_state(resumed, problem, engine)
            on_state = None
            if estimator.checkpoint is not None:
                on_state = Checkpointer(estimator.checkpoint, estimator.checkpoint_every, fp, k, results)
            result = mwu.solve(
                engine, inv_trace=inv_trace, ridge=settings.ridges[k], epsilon=settings.epsilon, rho=settings.rho,
                n_iter=settings.n_iter, callback=progress_callback(estimator, k, len(targets)),
                callback_every=estimator.callback_every, state=state, on_state=on_state,
                selectivity=settings.selectivity,
            )  # fmt: skip
            stats.extend(engine.stats())
        results.append(result)
        if result.interrupted:
            break  # keep what was computed; the remaining classes are not fitted
    return traces, stats


def _cluster_failures(estimator) -> tuple:
    """The errors of a lost cluster (scheduler, workers, shards): reported with the checkpoint to resume from."""
    if estimator.engine != "dask":
        return ()
    from mwumkl_dist.engines.dask import ShardLostError

    return (ConnectionError, ShardLostError)


def _with_checkpoint_note(exc: Exception, estimator, fp) -> Exception:
    """``exc`` (same type) whose message also names the checkpoint this fit can resume from, if any."""
    path = estimator.checkpoint
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
                f"{estimator.checkpoint_every} iterations)"
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


def resume_state(resumed: dict, problem: Problem, engine: Engine) -> mwu.SolverState:
    """Replay a checkpoint's picks on a freshly configured engine; the solver state to continue from."""
    engine.replay(resumed["picks"])
    (pi, pg, pv), (ni, ng, nv) = resumed["pos"], resumed["neg"]
    return mwu.SolverState(
        resumed["iteration"],
        resumed["s"],
        mwu.Candidate(pi, pg, pv, problem.point(pi)),
        mwu.Candidate(ni, ng, nv, problem.point(ni)),
        resumed["picks"],
    )


def progress_callback(estimator, k: int, n_problems: int):
    """The estimator's ``callback`` and ``verbose`` logging for problem ``k``, or None when neither is set."""
    if estimator.callback is None and not estimator.verbose:
        return None

    def report(info: mwu.ProgressInfo):
        if estimator.verbose:
            logger.info(
                "problem %d/%d: iteration %d/%d, %.1f it/s",
                k + 1,
                n_problems,
                info.iteration,
                info.n_iter,
                info.iteration / max(info.elapsed, 1e-12),
            )
        if estimator.callback is not None:
            return estimator.callback(info)
        return None

    return report


def model_attributes(results, data: TrainingInput, targets, traces: np.ndarray) -> dict:
    """The model of the solved problems: support set, dual coefficients, biases, kernel weights."""
    alphas = np.vstack([r.alpha for r in results])
    support = np.flatnonzero((alphas > 0).any(axis=0))
    signs = np.vstack([np.where(data.y == t, 1.0, -1.0) for t in targets])
    weights = np.vstack([r.kernel_weights for r in results])
    n_iter = np.array([r.n_iter for r in results])
    if len(targets) == 1:
        weights, n_iter = weights[0], int(n_iter[0])
    return {
        "support_": support,
        "dual_coef_": (alphas * signs)[:, support],
        "intercept_": np.array([r.bias for r in results]),
        "kernel_traces_": traces,
        "kernel_weights_": weights,
        "raw_kernel_weights_": weights / traces,
        "n_iter_": n_iter,
        "interrupted_": any(r.interrupted for r in results),
        "support_vectors_": data.support_vectors(support),
    }


#: Training points an unpolished fit's biases are checked on (see :func:`guard_biases`).
BIAS_CHECK_POINTS = 4000


def guard_biases(
    estimator, model: dict, data: TrainingInput, targets, class_weight, sample_weight, seed, *, few_iterations: bool
) -> None:
    """Check each unpolished problem's bias on a training sample; replace it where it is clearly wrong.

    On a stratified sample of :data:`BIAS_CHECK_POINTS` training points, a bias
    whose (class- and sample-weighted) error exceeds the majority class's, or,
    after ``few_iterations`` (far fewer than the plan's, see
    :func:`mwumkl_dist.solvers.auto.plan_iterations`), the best bias's by more than a
    point, is replaced by the error-minimising one
    (:func:`mwumkl_dist.solvers.mwu.guarded_bias`): with few iterations (a large
    ``epsilon``) the authors' bias can be far off, and the classifier must not
    be worse than predicting the majority class.  A fit with enough iterations
    keeps the authors' bias unless it is worse than the majority class.  Each replacement is warned
    about (:class:`~mwumkl_dist.solvers.auto.FewIterationsWarning`) and kept in
    ``fit_warnings_``.  Inputs whose rows cannot be read back (a kernel store) are left as they are.
    """
    from mwumkl_dist.data.problems import make_predictor

    # Points outside the support set where there are enough of them: a support point's own term inflates its
    # score (on a9a with 200 iterations: 21 % training error on all points, 24 % on the test set).
    candidates = np.setdiff1d(np.arange(data.n_samples), model["support_"])
    if len(candidates) < min(BIAS_CHECK_POINTS, data.n_samples) // 2 or len(np.unique(data.y[candidates])) < 2:
        candidates = np.arange(data.n_samples)
    rows = candidates[auto.stratified_rows(data.y[candidates], BIAS_CHECK_POINTS, seed)]
    scoring = data.scoring_rows(rows, model["support_"])
    if scoring is None or not len(model["support_"]):
        return
    X, support = scoring
    predictor = make_predictor(estimator.kernels, data.kernel_names, data.n_features_in)
    scores = predictor.decision_values(X, support, model["support_vectors_"], model["dual_coef_"],
                                       np.atleast_2d(model["raw_kernel_weights_"]))  # fmt: skip
    classes = model["classes_"]
    for k, target in enumerate(targets):
        y_pm = np.where(data.y[rows] == target, 1.0, -1.0)
        weights = problem_weights(data.y, classes, target, class_weight, sample_weight)
        weights = None if weights is None else np.asarray(weights)[rows]
        bias, err, own, majority = mwu.guarded_bias(
            scores[:, k], y_pm, float(model["intercept_"][k]), weights, against_best=few_iterations
        )
        if bias != model["intercept_"][k]:
            problem = "" if len(targets) == 1 else f" for class {target!r}"
            message = (
                f"the MWU solution's bias misclassified {100 * own:.1f} % of {len(rows)} training points "
                f"(the majority class alone: {100 * majority:.1f} %){problem}"
                f": too few iterations for this data (epsilon={model['epsilon_']:g}); the bias was re-chosen on "
                f"those points ({100 * err:.1f} %). A smaller epsilon gives a better classifier"
            )
            warnings.warn(message, auto.FewIterationsWarning, stacklevel=4)
            model["fit_warnings_"].append(message)
            model["intercept_"][k] = bias


def polish_model(model: dict, data: TrainingInput, targets, ridges, polish) -> dict:
    """Re-solve each binary problem exactly on all points with the learned weights (see ``polish``).

    ``ridges`` holds each problem's ridge (:class:`SolveSettings`).  Returns
    ``polished_`` and, when polished, the exact ``support_``, ``dual_coef_``,
    ``intercept_`` and ``support_vectors_`` replacing the MWU ones.
    """
    if polish is False or model["interrupted_"]:
        return {"polished_": False}
    blocker = data.polish_blocker
    if blocker is None and np.isinf(model["C_"]):
        blocker = "the hard margin (C = inf): the hulls may intersect"
    if blocker is not None:
        if polish is True:
            raise ValueError(f"polish=True is not available for {blocker}")
        return {"polished_": False}
    weights = np.atleast_2d(model["raw_kernel_weights_"])
    n, m = data.n_samples, weights.shape[1]
    # All points, never the MWU support set alone: on noisy data (cod-rna) the support set is the
    # overlap of the classes, and the exact solution on it alone has a useless bias (62 % error).
    if polish == "auto" and not polish_budget_ok(n, m):
        return {"polished_": False}
    coef = np.zeros((len(targets), n))
    intercept = np.array(model["intercept_"], dtype=np.float64)
    for k, target in enumerate(targets):
        y_pm = np.where(data.y == target, 1.0, -1.0)
        alpha, intercept[k] = solve_l2_svm(data.combined_gram(weights[k]), y_pm, ridges[k])
        coef[k] = alpha * y_pm
    support = np.flatnonzero((coef != 0.0).any(axis=0))
    return {
        "support_": support,
        "dual_coef_": coef[:, support],
        "intercept_": intercept,
        "support_vectors_": data.support_vectors(support),
        "polished_": True,
    }
