"""The MWU solver's model: support set and duals from the iterations, the exact polish, the bias check."""

from __future__ import annotations

import warnings

import numpy as np

from mwumkl_dist.core import progress
from mwumkl_dist.core.mwu_rules import FewIterationsWarning, guarded_bias
from mwumkl_dist.data.problems import TrainingInput
from mwumkl_dist.data.weights import problem_weights
from mwumkl_dist.solvers.auto import stratified_rows
from mwumkl_dist.solvers.base import fit_backend, score_rows
from mwumkl_dist.solvers.mwu.polish import polish_budget_ok, solve_l2_svm
from mwumkl_dist.solvers.spec import FitSpec

__all__ = [
    "BIAS_CHECK_POINTS",
    "bias_check_rows",
    "guard_biases",
    "model_attributes",
    "polish_model",
    "polishes",
    "polish_skipped",
    "rows_to_score",
    "solved_scores",
]


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


def bias_check_rows(y: np.ndarray, support: np.ndarray, seed) -> np.ndarray:
    """The training rows an unpolished model's biases are checked on (increasing; see :func:`guard_biases`).

    A stratified sample of :data:`BIAS_CHECK_POINTS` rows outside the support set ``support``, or of
    all rows when too few are outside it (or they hold one class only).
    """
    # Points outside the support set where there are enough of them: a support point's own term inflates its
    # score (on a9a with 200 iterations: 21 % training error on all points, 24 % on the test set).
    n = len(y)
    candidates = np.setdiff1d(np.arange(n), support)
    if len(candidates) < min(BIAS_CHECK_POINTS, n) // 2 or len(np.unique(y[candidates])) < 2:
        candidates = np.arange(n)
    return candidates[stratified_rows(y[candidates], BIAS_CHECK_POINTS, seed)]


def rows_to_score(y: np.ndarray, n_problems: int, seed):
    """What :func:`~mwumkl_dist.solvers.mwu.iterate.solve` is asked to score for :func:`guard_biases`.

    One problem: :func:`bias_check_rows` of its support set (its rows with alpha counts > 0).  Several
    (one-vs-rest): all rows, since the check's rows depend on the union of all the problems' support
    sets, known only after the last (``n`` margins per problem, the cost of one superstep's update).
    """
    if n_problems > 1:
        return lambda counts: np.arange(len(y))
    return lambda counts: bias_check_rows(y, np.flatnonzero(counts > 0), seed)


def solved_scores(results, rows: np.ndarray) -> np.ndarray | None:
    """Decision values without bias ``(len(rows), n_problems)`` at ``rows``, from the solves' ``scores``.

    None when a result lacks some of the rows (e.g. a problem finished in a checkpoint resumed from).
    """
    out = np.empty((len(rows), len(results)))
    for k, r in enumerate(results):
        scored = r.scored_rows
        if scored is None or not len(scored):
            return None
        at = np.minimum(np.searchsorted(scored, rows), len(scored) - 1)
        if not np.array_equal(scored[at], rows):
            return None
        out[:, k] = r.scores[at]
    return out


def guard_biases(
    spec: FitSpec,
    model: dict,
    data: TrainingInput,
    targets,
    class_weight,
    sample_weight,
    seed,
    *,
    few_iterations: bool,
    results=None,
) -> tuple[np.ndarray, np.ndarray] | None:
    """Check each unpolished problem's bias on a training sample; replace it where it is clearly wrong.

    On a stratified sample of :data:`BIAS_CHECK_POINTS` training points (:func:`bias_check_rows`), a bias
    whose (class- and sample-weighted) error exceeds the majority class's, or,
    after ``few_iterations`` (far fewer than the plan's, see
    :func:`mwumkl_dist.solvers.auto.plan_iterations`), the best bias's by more than a
    point, is replaced by the error-minimising one
    (:func:`mwumkl_dist.solvers.guarded_bias`): with few iterations (a large
    ``epsilon``) the authors' bias can be far off, and the classifier must not
    be worse than predicting the majority class.  A fit with enough iterations
    keeps the authors' bias unless it is worse than the majority class.  Each replacement is warned
    about (:class:`~mwumkl_dist.solvers.FewIterationsWarning`) and kept in
    ``fit_warnings_``.

    The decision values come from the solves' ``results`` where they scored those rows
    (:func:`solved_scores`: read off ``V``, no kernel evaluated), else from the predictor; inputs
    whose rows cannot be read back (a kernel store) are then left as they are.

    Returns
    -------
    (rows, scores) or None
        The rows checked and the model's decision values there without biases,
        ``(len(rows), n_problems)`` (for :func:`mwumkl_dist.solvers.driver.check_against_majority`);
        None when nothing was checked.
    """
    rows = bias_check_rows(data.y, model["support_"], seed)
    scores = None if results is None else solved_scores(results, rows)
    if scores is None:
        scoring = data.scoring_rows(rows, model["support_"])
        if scoring is None or not len(model["support_"]):
            return None
        X, support = scoring
        scores = score_rows(spec.model.kernels, data.kernel_names, data.n_features_in, X, support,
                            model["support_vectors_"], model["dual_coef_"], model["raw_kernel_weights_"],
                            fit_backend(spec))  # fmt: skip
    classes = model["classes_"]
    for k, target in enumerate(targets):
        y_pm = np.where(data.y[rows] == target, 1.0, -1.0)
        weights = problem_weights(data.y, classes, target, class_weight, sample_weight)
        weights = None if weights is None else np.asarray(weights)[rows]
        bias, err, own, majority = guarded_bias(
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
            warnings.warn(message, FewIterationsWarning, stacklevel=5)
            model["fit_warnings_"].append(message)
            model["intercept_"][k] = bias
    return rows, scores


def polish_skipped(polish, data: TrainingInput, C: float, n_kernels: int) -> str | None:
    """Why :func:`polish_model` does not re-solve a model (the summary's words), or None when it does.

    ``polish=True`` where it cannot run raises ``ValueError`` naming why.
    """
    if polish is False:
        return "polish=False"
    blocker = data.polish_blocker
    if blocker is None and np.isinf(C):
        blocker = "the hard margin (C = inf): the hulls may intersect"
    if blocker is not None:
        if polish is True:
            raise ValueError(f"polish=True is not available for {blocker}")
        return f"auto: not available for {blocker}"
    # All points, never the MWU support set alone: on noisy data (cod-rna) the support set is the
    # overlap of the classes, and the exact solution on it alone has a useless bias (62 % error).
    if polish is True or polish_budget_ok(data.n_samples, n_kernels):
        return None
    return f"auto: too large for it, {data.n_samples} rows x {n_kernels} kernels"


def polishes(polish, data: TrainingInput, C: float, n_kernels: int) -> bool:
    """Whether :func:`polish_model` re-solves a model (unless the iterations were interrupted).

    ``polish=True`` where it cannot run raises ``ValueError`` naming why.
    """
    return polish_skipped(polish, data, C, n_kernels) is None


def polish_model(model: dict, data: TrainingInput, targets, ridges, polish) -> dict:
    """Re-solve each binary problem exactly on all points with the learned weights (see ``polish``).

    ``ridges`` holds each problem's ridge (:class:`SolveSettings`).  Returns
    ``polished_`` and, when polished, the exact ``support_``, ``dual_coef_``, ``intercept_`` and
    ``support_vectors_`` replacing the MWU ones; when not, ``polish_skipped_``: why.
    """
    weights = np.atleast_2d(model["raw_kernel_weights_"])
    n, m = data.n_samples, weights.shape[1]
    skipped = "the iterations were interrupted" if model["interrupted_"] else None
    skipped = skipped or polish_skipped(polish, data, model["C_"], m)
    if skipped is not None:
        return {"polished_": False, "polish_skipped_": skipped}
    coef = np.zeros((len(targets), n))
    intercept = np.array(model["intercept_"], dtype=np.float64)
    description = f"exact polish: LIBSVM on the combined kernel of {n} rows"
    with progress.phase("polish", len(targets), unit="problems", description=description) as step:
        for k, target in enumerate(targets):
            y_pm = np.where(data.y == target, 1.0, -1.0)
            alpha, intercept[k] = solve_l2_svm(data.combined_gram(weights[k]), y_pm, ridges[k])
            coef[k] = alpha * y_pm
            step.advance()
    support = np.flatnonzero((coef != 0.0).any(axis=0))
    return {
        "support_": support,
        "dual_coef_": coef[:, support],
        "intercept_": intercept,
        "support_vectors_": data.support_vectors(support),
        "polished_": True,
    }
