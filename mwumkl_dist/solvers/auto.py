"""The automatic choices: ``epsilon="auto"``, ``C="auto"``, whether a fit ends with the exact polish.

Each is a function of explicit arguments, used by the estimator's fit driver
(:mod:`mwumkl_dist.solvers.driver`) and by the command line to say in advance what a
fit will do.  Also here: the warning for a user's ``epsilon`` (or ``max_iter``)
that gives far too few iterations for an unpolished fit, and ``random_state``.
"""

from __future__ import annotations

import functools
import logging
import math
import numbers
from dataclasses import dataclass, field

import numpy as np

from mwumkl_dist.core import mwu_rules as mwu
from mwumkl_dist.core import progress
from mwumkl_dist.core.mwu_rules import FewIterationsWarning
from mwumkl_dist.data.weights import score_weights, weighted_error
from mwumkl_dist.kernels.specs import SCREEN_MAX_FEATURES, searches_structure
from mwumkl_dist.solvers.base import Fitter, fold_decisions, fold_fit, fold_map, predicted_labels, stratified_rows
from mwumkl_dist.solvers.candidates import (
    AUTO_C_POINTS,
    AUTO_SELECTIVITY_GRID,
    CANDIDATE_KINDS,
    Selectivity,
    kind_of,
    screen_rows,
)
from mwumkl_dist.solvers.mwu.polish import polish_budget_ok
from mwumkl_dist.solvers.spec import FitSpec

__all__ = [
    "AUTO_EPS_POLISHED",
    "AUTO_EPS",
    "AUTO_T_FRACTION",
    "FEW_T_FRACTION",
    "AUTO_C_GRID",
    "AUTO_C_POINTS",
    "AUTO_C_STORE",
    "FewIterationsWarning",
    "IterationPlan",
    "Search",
    "SearchResult",
    "random_seed",
    "will_polish",
    "auto_epsilon",
    "plan_iterations",
    "stratified_rows",
    "fold_spec",
    "choose_C",
    "AUTO_SELECTIVITY_GRID",
    "AUTO_SELECTIVITY_START",
    "AUTO_SELECTIVITY_SEARCH_START",
    "AUTO_SELECTIVITY_STORE",
    "solver_selectivity",
    "screen_rows",
    "no_iterations_needed",
    "standard_error_of_sum",
]

logger = logging.getLogger("mwumkl_dist")

#: ``epsilon="auto"`` when the exact polish follows (the MWU then only has to find the weights) ...
AUTO_EPS_POLISHED = 0.2
#: ... and when the MWU solution is the model (large data): at most 0.1 (2-6x more accurate than 0.2 on a9a /
#: cod-rna), and small enough for T >= AUTO_T_FRACTION * n iterations (see :func:`auto_epsilon`).
AUTO_EPS = 0.1
AUTO_T_FRACTION = 0.2
#: An unpolished fit with fewer than ``FEW_T_FRACTION * n`` iterations (half the automatic rule's) warns:
#: ``epsilon=0.1`` gives T = 0.064 n on a9a (32561 points, 23.7 % test error, worse than the majority
#: class) and 0.037 n on cod-rna (44.4 %); T = 0.05 n gives 34 % on Adult, against 14.6 % at 0.22 n.
FEW_T_FRACTION = 0.1
#: ``C="auto"`` chooses the size-relative ``C`` from these ...
AUTO_C_GRID = (0.1, 1.0, 10.0, 100.0, 1000.0, 10000.0)
#: ... by cross-validation on a stratified subsample of at most :data:`AUTO_C_POINTS` training rows
#: (:mod:`mwumkl_dist.solvers.candidates`, re-exported here).
#: ``C="auto"`` for a fit from a kernel store (its rows are not sampled): suits large noisy data (a9a, cod-rna).
AUTO_C_STORE = 1.0
#: ``selectivity="auto"`` tries :data:`AUTO_SELECTIVITY_GRID` (:mod:`mwumkl_dist.solvers.candidates`) at the C
#: that cross-validation chose, and chooses C with uniform weights (0) first: a C chosen at 100 suits the
#: selective combinations and leaves uniform weights, the usual pick of the one-standard-error rule,
#: under-regularised (sonar, 5 splits: 10.8 % test error against 8.9 % with C chosen at 0).
AUTO_SELECTIVITY_SEARCH_START = 0.0
#: The selectivity of ``selectivity="auto"`` where nothing is cross-validated (a given C): on E6's synthetic
#: problems (4 relevant of 30 features, 360 kernels) 100 puts 0.5-0.95 of the weight on the relevant kernels
#: without collapsing onto one kernel as 300 can at large C.
AUTO_SELECTIVITY_START = 100.0
#: ``selectivity="auto"`` for a fit from a kernel store (nothing is cross-validated there).
AUTO_SELECTIVITY_STORE = 100.0


def random_seed(random_state) -> int:
    """The integer seed a fit uses for ``random_state`` (an int, a ``RandomState`` or None).

    An int is used as it is (so ``random_state=0`` gives the same folds and
    samples every time); a ``RandomState`` draws one seed (advancing it, as
    scikit-learn estimators do); None draws one from numpy's global generator.
    """
    if isinstance(random_state, (bool, np.bool_)):
        raise ValueError(f"random_state must be an int, a numpy RandomState or None, got {random_state!r}")
    if isinstance(random_state, numbers.Integral):
        if not 0 <= random_state < 2**32:
            raise ValueError(f"random_state must be in [0, 2**32 - 1], got {random_state!r}")
        return int(random_state)
    if random_state is None or isinstance(random_state, np.random.RandomState):
        from sklearn.utils import check_random_state  # None: numpy's global RandomState

        return int(check_random_state(random_state).randint(2**31))
    raise ValueError(f"random_state must be an int, a numpy RandomState or None, got {random_state!r}")


def will_polish(polish, n_samples: int, n_kernels: int, *, in_memory: bool = True, C=None) -> bool:
    """Whether a fit ends with the exact polish (see the estimator's ``polish``).

    ``C`` is the given constant, or None for ``C="auto"``; ``in_memory`` is
    False for a fit from a store (the polish needs the data in memory).
    """
    if polish is False or not in_memory or (C is not None and np.isinf(C)):
        return False
    return polish is True or polish_budget_ok(n_samples, n_kernels)


def auto_epsilon(n_samples: int, rho: float, *, polished: bool) -> float:
    """``epsilon="auto"``: :data:`AUTO_EPS_POLISHED` when the polish re-solves the SVM; else the largest
    ``epsilon <= AUTO_EPS`` that gives ``T >= AUTO_T_FRACTION * n`` iterations (and at most ``rho``).

    Without the polish the MWU dual is the model, and on noisy data it is only
    good once the iterations have placed weight on a good part of the points:
    on Adult (39073 points, 3 kernels, C=1) ``T = 0.05 n`` gives 34 % test error,
    ``0.11 n`` 21 % and ``0.22 n`` 14.6 %, while a fixed ``epsilon`` gives
    ``T ~ ln n``.  The rule costs ``O(n)`` iterations (``O(m n^2)`` time);
    pass an ``epsilon`` for a faster, rougher fit.
    """
    rho = float(rho)
    if polished:
        return min(AUTO_EPS_POLISHED, rho)
    n = max(n_samples, 2)
    # T = 8 rho^2 / eps^2 ln n >= f n  <=>  eps <= sqrt(8 rho^2 ln n / (f n)).
    by_size = np.sqrt(8.0 * rho**2 * np.log(n) / (AUTO_T_FRACTION * n))
    return float(min(AUTO_EPS, by_size, rho))


@dataclass(frozen=True)
class IterationPlan:
    """What a fit will run: ``epsilon``, ``n_iter`` iterations, whether it ends with the polish.

    ``warning`` is the :class:`FewIterationsWarning` message, or None.
    """

    epsilon: float
    n_iter: int
    polished: bool
    warning: str | None = None


def plan_iterations(
    *, epsilon, max_iter, rho: float, polish, C, n_samples: int, n_kernels: int, in_memory: bool = True
) -> IterationPlan:
    """The epsilon and iteration count of a fit, as the estimator resolves them.

    Parameters
    ----------
    epsilon : float or "auto"
    max_iter : int or None
    rho : float
    polish : {"auto", True, False}
    C : float, or "auto" / None
    n_samples, n_kernels : int
    in_memory : bool
        False for a fit from a store.
    """
    C = None if isinstance(C, str) or C is None else float(C)
    polished = will_polish(polish, n_samples, n_kernels, in_memory=in_memory, C=C)
    automatic = auto_epsilon(n_samples, rho, polished=polished)
    given = not (isinstance(epsilon, str) and epsilon == "auto")
    eps = float(epsilon) if given else automatic
    mwu.eps_prime(eps, rho)  # e.g. rho < 0.1 leaves no room for the automatic value
    n_iter = int(max_iter) if max_iter is not None else mwu.iteration_count(eps, rho, n_samples)
    warning = None
    if (given or max_iter is not None) and not polished and n_iter < FEW_T_FRACTION * n_samples:
        warning = _few_iterations_message(n_iter, n_samples, eps, rho, max_iter, automatic)
    return IterationPlan(eps, n_iter, polished, warning)


def _few_iterations_message(n_iter, n_samples, eps, rho, max_iter, automatic) -> str:
    needed = mwu.iteration_count(automatic, rho, n_samples)
    cause = f"max_iter={max_iter}" if max_iter is not None else f"epsilon={eps:g}"
    fix = "leave max_iter unset (epsilon='auto')" if max_iter is not None else "use epsilon='auto'"
    return (
        f"{cause} gives {n_iter} iteration{'s' * (n_iter != 1)} for {n_samples} training points, far fewer than "
        f"an unpolished fit needs on noisy data (about n / 5 = {int(AUTO_T_FRACTION * n_samples)}; epsilon=0.1 "
        f"on a9a's 32561 points gives 23.7 % test error, worse than the majority class): {fix}, "
        f"i.e. epsilon={automatic:.3g} with {needed} iterations"
    )


def fold_spec(
    spec: FitSpec, *, polished: bool, iterations_per_point: float | None = None, n_train: int = 0, **changes
) -> FitSpec:
    """The specification of a cross-validation fold's fit: ``spec``'s, local and quiet, ``C`` size-relative.

    Used by ``C="auto"`` and by ``probability=True``'s held-out decision values;
    a fold fit never cross-validates probabilities itself and always runs the
    MWU solver (folds hold at most :data:`AUTO_C_POINTS` rows).  With
    ``iterations_per_point`` a fold on ``n_train`` points runs that many
    iterations per point (``max_iter``), as many as the final fit: an
    unpolished MWU model depends on ``T / n`` (with too few iterations per point
    its dual stays on a few points and, with class weights, its bias drifts to
    the class of smaller ridge), so a fold with the fold's own ``T`` would be
    judged in another regime than the final fit.  ``changes`` (``C``,
    ``selectivity``, ``kernels``) are applied last.
    """
    if iterations_per_point is not None:
        changes.setdefault("max_iter", max(1, math.ceil(iterations_per_point * n_train)))
    return spec.nested(polish=polished, scale_C=True, probability=False, solver="mwu", **changes)


def no_iterations_needed(
    polished: bool, iterations_per_point, selectivity, n_train: int, n_kernels: int, candidate=None
) -> bool:
    """Whether a nested fit (a fold) may run no MWU iteration (``max_iter=0``) and give the same model.

    So when it is polished and its weights are uniform whatever the iterations do: selectivity 0, or a
    ``candidate`` of a kind with uniform weights (a band of widths, a structure, refitted at selectivity 0; a
    group selection is not: its selection fit iterates), within the polish budget (``n_kernels`` at most the
    fit's).  The polish then solves the SVM exactly on the uniform combination.
    """
    if candidate is not None:
        uniform = kind_of(candidate).uniform_weights
    else:
        uniform = isinstance(selectivity, float) and selectivity == 0.0
    return polished and iterations_per_point is None and uniform and polish_budget_ok(n_train, n_kernels)


def solver_selectivity(selectivity, epsilon: float, n_kernels: int) -> float | None:
    """What :func:`mwumkl_dist.solvers.mwu.solve` takes for a checked, non-"auto" ``selectivity``.

    "paper": None (the published absolute scale); "exact": :func:`mwumkl_dist.solvers.mwu.exact_selectivity`,
    the sparsity of the MKL problem's own optimum at precision ``epsilon``; a number: itself.
    """
    if selectivity == "paper":
        return None
    if selectivity == "exact":
        return mwu.exact_selectivity(epsilon, n_kernels)
    return float(selectivity)


@dataclass(frozen=True)
class SearchResult:
    """What :func:`choose_C` chose.

    ``C`` is size-relative; ``selectivity`` the plain selectivity; ``candidate`` the refitted candidate that won (a
    group selection, a band of widths, a feature structure; then ``C`` is its fit's), or None.  ``paths`` are the
    fitted attributes to record, by name (``C_path_``, ``selectivity_path_`` when the selectivity was searched,
    each other kind's path when it scored candidates): the cross-validated error of each candidate, keyed by
    ``C``, by selectivity, or by ``(candidate, C)``.  ``chosen`` is the chosen candidate's cross-validation
    (:meth:`_FoldScorer.record`; empty when none was cross-validated): the fitted attribute ``cross_validation_``.
    """

    C: float
    selectivity: object
    candidate: object = None
    paths: dict = field(default_factory=dict)
    chosen: dict = field(default_factory=dict)


def choose_C(
    spec: FitSpec,
    data,
    *,
    fit: Fitter,
    polished: bool,
    seed: int,
    sample_weight=None,
    iterations_per_point=None,
    choose_selectivity: bool = False,
) -> SearchResult:
    """``C="auto"`` and ``selectivity="auto"``: the size-relative ``C`` of :data:`AUTO_C_GRID` and the search
    candidate (a selectivity of :data:`AUTO_SELECTIVITY_GRID`, a group selection, a band of widths, a feature
    structure) with the best cross-validated error.

    A coordinate search: ``C`` first (when ``spec.model.C`` is "auto"), with ``spec``'s selectivity or, with
    ``choose_selectivity``, :data:`AUTO_SELECTIVITY_SEARCH_START`; then, with ``choose_selectivity``, each kind
    of :data:`~mwumkl_dist.solvers.candidates.CANDIDATE_KINDS` in turn scores its candidates near that ``C``
    and says by its own rule whether one wins (:meth:`~mwumkl_dist.solvers.candidates.CandidateKind.search`;
    the selectivity: the least selective within one standard error of the best; a group selection: within one
    standard error of the best, fewer inputs; a band, a structure: better than the best other candidate by more
    than the standard error of their paired difference, :meth:`_FoldScorer.paired_standard_error`).  The two
    interact: a small ``C`` is a large ridge ``I / C``, which keeps kernels that memorise the training points
    from winning the margin, so each is judged with the other near its final value; ties go to the smaller
    ``C``.  Each candidate is scored by stratified 3-fold cross-validation (:class:`_FoldScorer`; a grid's
    folds run side by side) on at most :data:`AUTO_C_POINTS` rows; a kernel store is not sampled
    (:data:`AUTO_C_STORE`, :data:`AUTO_SELECTIVITY_STORE`).

    Parameters
    ----------
    spec : FitSpec
        Configures the fold fits (:func:`fold_spec`).
    data : mwumkl_dist.data.problems.TrainingInput
    fit : callable
        A whole fit (the driver's :func:`~mwumkl_dist.solvers.driver.fit_model`), run on each fold.
    polished : bool
        Whether the final fit ends with the exact polish (the folds are judged in that regime).
    seed : int
    sample_weight : ndarray of shape (n_samples,), optional
        Positive weights of ``data``'s points (an in-memory input: its own cross-validation input).
    iterations_per_point : float, optional
        Run the folds at the final fit's ``T / n`` (see :func:`fold_spec`); None: each fold its own.
    choose_selectivity : bool
        Also choose the selectivity and the candidates (else the selectivity is ``spec``'s).

    Returns
    -------
    SearchResult
    """
    given_C = spec.model.C_per_point(data.n_samples)  # the folds take C relative to their size
    start = AUTO_SELECTIVITY_START if spec.model.selectivity == "auto" else spec.model.selectivity
    searched = {Selectivity.path_attribute: {}} if choose_selectivity else {}
    cv = data.cross_validation_input(AUTO_C_POINTS, seed)
    if cv is None:
        C = AUTO_C_STORE if given_C is None else given_C
        selectivity = AUTO_SELECTIVITY_STORE if choose_selectivity else start
        return SearchResult(C, selectivity, paths={"C_path_": {}, **searched})
    scorer = _FoldScorer.make(fit, spec, cv, seed, sample_weight, polished, iterations_per_point)
    if scorer is None:  # a class too small for two folds
        C = AUTO_C_GRID[len(AUTO_C_GRID) // 2] if given_C is None else given_C
        return SearchResult(C, start, paths={"C_path_": {}, **searched})
    if choose_selectivity:
        start = AUTO_SELECTIVITY_SEARCH_START
    C, C_path = given_C, {}
    if C is None:  # each grid's candidates in one batch: their folds side by side
        C_path = dict(zip(AUTO_C_GRID, scorer.errors([(c, start) for c in AUTO_C_GRID], "choosing C")))
        C = _first_best(C_path)
    state = Search(scorer, given_C, start, C_path, C, C, start, paths=searched)
    if choose_selectivity and len(cv.kernel_names) > 1:
        for kind in CANDIDATE_KINDS.values():
            kind.search(state)
    candidate = state.candidate
    # a structure's screen takes no part in comparisons: the same key
    chosen = scorer.record((state.C, state.selectivity if candidate is None else candidate))
    return SearchResult(float(state.C), state.selectivity, candidate, {"C_path_": C_path, **state.paths}, chosen)


@dataclass
class Search:
    """The state of :func:`choose_C`'s search, which each kind of candidate's ``search`` reads and extends.

    ``scorer`` cross-validates candidates; ``given_C`` is the given size-relative ``C`` (None: ``"auto"``);
    ``start`` the selectivity ``C`` was chosen at; ``C_path`` the errors of the ``C`` grid; ``base_C`` the ``C``
    chosen there; ``C``, ``selectivity`` and ``candidate`` the choice so far; ``paths`` every kind's path so far,
    by fitted attribute.  Its methods are the rules the kinds share.
    """

    scorer: _FoldScorer
    given_C: float | None
    start: object
    C_path: dict
    base_C: float
    C: float
    selectivity: object
    candidate: object = None
    paths: dict = field(default_factory=dict)
    C_grid: tuple = AUTO_C_GRID

    def choose(self, C: float, candidate) -> None:
        """``candidate`` at ``C`` won."""
        self.C, self.candidate = C, candidate

    def scored(self) -> dict:
        """Every candidate scored so far, by ``(C, candidate)``, in the order scored: the ``C`` grid at ``start``,
        the selectivities at ``base_C``, then each kind's."""
        out = {(c, self.start): e for c, e in self.C_path.items()}
        for kind in CANDIDATE_KINDS.values():
            out.update(kind.scored(self.paths.get(kind.path_attribute, {}), self))
        return out

    @staticmethod
    def first_best(path: dict):
        return _first_best(path)

    def within_one_standard_error(self, error: float, errors) -> bool:
        return _within_one_standard_error(error, errors, len(self.scorer.rows))

    def least_selective_within_one_standard_error(self, path: dict):
        return _least_selective_within_one_standard_error(path, len(self.scorer.rows))


@dataclass(frozen=True)
class _FoldScorer:
    """Stratified 3-fold cross-validation of ``spec``'s fit on at most :data:`AUTO_C_POINTS` rows of ``cv``.

    The rows are drawn with ``seed`` (a data store's rows are read as whole chunks in a random order
    first). With sample or class weights the folds are fitted with them and scored by the weighted
    error (:func:`mwumkl_dist.data.weights.score_weights`: the balanced error for ``"balanced"``).
    """

    fit: Fitter
    spec: FitSpec
    cv: object
    rows: np.ndarray
    folds: list
    fold_kernels: list
    scoring: np.ndarray | None
    sample_weight: np.ndarray | None
    polished: bool
    iterations_per_point: float | None
    seed: int = 0
    #: What each kind's candidates share (a group selection's selection fits, a structure's screens), by kind name.
    shared: dict = field(default_factory=dict, compare=False, repr=False)
    #: Each scored candidate's loss on every cross-validated row (in fold order), by ``(C, selectivity)``:
    #: what :meth:`paired_standard_error` compares.
    _losses: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def n_features(self) -> int:
        return int(self.cv.n_features_in)

    @functools.cached_property
    def searches_structure(self) -> bool:
        """Whether the search is ``kernels="auto"``'s on feature rows with 2 to
        :data:`~mwumkl_dist.kernels.specs.SCREEN_MAX_FEATURES` features: structured candidates are scored, and
        bands of widths beyond the kernel set's."""
        kernel_set = self.cv.kernel_set
        if not searches_structure(self.spec.model.kernels) or kernel_set is None or kernel_set.bank is not None:
            return False
        return 2 <= self.n_features <= SCREEN_MAX_FEATURES

    @classmethod
    def make(cls, fit, spec, cv, seed, sample_weight, polished, iterations_per_point):
        """The scorer, or None when a class has fewer than two sampled rows."""
        rows = stratified_rows(cv.y, AUTO_C_POINTS, seed)
        ys = cv.y[rows]
        n_folds = int(min(3, np.unique(ys, return_counts=True)[1].min()))
        if n_folds < 2:
            return None
        from sklearn.model_selection import StratifiedKFold

        folds = list(StratifiedKFold(n_folds, shuffle=True, random_state=seed).split(rows, ys))
        scoring = score_weights(cv.y, spec.model.class_weight, sample_weight)  # class_weight: checked by the fit
        # A kernel that is zero on a fold's training rows (a feature seen in a few rows only) is left
        # out of that fold's fits: it carries nothing there, and its zero trace would stop the fit.
        cv.kernels_with_trace(np.arange(len(cv.y)), check=True)  # a kernel zero on all the data: say so now
        fold_kernels = [cv.kernels_with_trace(rows[a]) for a, _ in folds]
        return cls(fit, spec, cv, rows, folds, fold_kernels, scoring, sample_weight, polished, iterations_per_point,
                   seed)  # fmt: skip

    def errors(self, candidates, what: str = "cross-validation") -> list[float]:
        """The cross-validated (weighted) error of each ``(C, candidate)`` (``C`` size-relative).

        All the candidates' folds run side by side (:func:`~mwumkl_dist.solvers.base.fold_map`); a
        candidate's error adds its folds' shares in fold order: the same for any thread count.  A candidate's
        kind (:mod:`mwumkl_dist.solvers.candidates`) says what its fold fits share (a group selection's
        selection fits, run once per fold and shared by every refit ``C``; a structure's screens), run first
        side by side, and each fold fit's selectivity and kernels.  ``what`` names the search in the
        ``"cross-validation"`` progress phase.
        """
        k = len(self.folds)
        by_kind = {}
        for _, candidate in candidates:
            by_kind.setdefault(kind_of(candidate), {})[candidate] = None
        shared = {kind: kind.shared_jobs(self, list(values)) for kind, values in by_kind.items()}
        jobs = [(C, candidate, fold) for C, candidate in candidates for fold in range(k)]
        plural = "s" if len(candidates) != 1 else ""
        description = f"{what}: {len(candidates)} candidate{plural} x {k} folds on {len(self.rows)} rows"
        n_shared = sum(map(len, shared.values()))
        if n_shared:  # the fits the candidates share come first, in the same count
            noun = [kind.shared_noun for kind in CANDIDATE_KINDS.values() if shared.get(kind)][-1]
            description += f" (+ {n_shared} shared {noun})"
        with progress.phase("cross-validation", len(jobs) + n_shared, unit="fits", description=description) as step:
            for kind in CANDIDATE_KINDS.values():  # in the registry's order
                if kind in by_kind:
                    todo = shared[kind]
                    done = fold_map(functools.partial(kind.run_shared, self), todo, doing=kind.shared_doing, step=step)
                    kind.keep_shared(self, todo, done, list(by_kind[kind]))
            parts = fold_map(lambda job: self._fold_error(*job), jobs, doing="choosing C by cross-validation",
                             step=step)  # fmt: skip
        out = []
        for i, (C, candidate) in enumerate(candidates):
            error = 0.0
            for part, _ in parts[i * k : (i + 1) * k]:
                error += part
            self._losses[C, candidate] = np.concatenate([losses for _, losses in parts[i * k : (i + 1) * k]])
            if self.spec.execution.verbose:
                logger.info("auto: C=%g selectivity=%s cross-validated error %.4f", C, candidate, error)
            out.append(error)
        return out

    def paired_standard_error(self, a, b) -> float:
        """The standard error of the difference of two scored candidates' cross-validated errors.

        From their losses on the same rows (``n / (n - 1)`` times the sum of the squared deviations of
        the rows' differences, square-rooted): far smaller than either error's binomial standard error
        when the two candidates mostly agree, as a band of widths and its whole family do.
        """
        return standard_error_of_sum(self._losses[a] - self._losses[b])

    def record(self, candidate) -> dict:
        """A scored candidate's cross-validation: its ``error``, the ``standard_error`` of that error (from
        its per-row losses, as :meth:`paired_standard_error`), the ``rows`` scored and the ``folds``."""
        if candidate not in self._losses:
            return {}
        losses = self._losses[candidate]
        return {"error": float(np.sum(losses)), "standard_error": standard_error_of_sum(losses),
                "rows": len(self.rows), "folds": len(self.folds)}  # fmt: skip

    def selection_fit(self, C, selectivity, k: int) -> np.ndarray:
        """The kernel weights of a group selection fit on fold ``k``'s training rows (nothing scored)."""
        train = self.rows[self.folds[k][0]]
        spec = fold_spec(self.spec, polished=self.polished, iterations_per_point=self.iterations_per_point,
                         n_train=len(train), C=C, selectivity=selectivity)  # fmt: skip
        attrs = fold_fit(self.fit, spec, self.cv, self.fold_kernels[k], train, self.sample_weight,
                         doing="choosing C by cross-validation")  # fmt: skip
        return attrs["kernel_weights_"]

    def _fold_error(self, C, candidate, k: int) -> tuple[float, np.ndarray]:
        """Fold ``k``'s share of the cross-validated error, and each of its test rows' share of it."""
        attrs, decisions = self._fit_fold(k, C, *kind_of(candidate).fold_fit(self, candidate, k))
        test = self.rows[self.folds[k][1]]
        predicted = predicted_labels(attrs["classes_"], decisions)
        test_weights = None if self.scoring is None else self.scoring[test]
        wrong = (predicted != self.cv.y[test]).astype(np.float64)
        share = wrong / len(test) if test_weights is None else wrong * test_weights / np.sum(test_weights)
        return weighted_error(predicted, self.cv.y[test], test_weights) / len(self.folds), share / len(self.folds)

    def _fit_fold(self, k: int, C, selectivity, kernels=None):
        """Fold ``k``'s fit (on its kernels, or ``kernels``) and its decision values on the fold's test rows.

        A polished fold at selectivity 0 runs no MWU iteration (``max_iter=0``): its weights are uniform
        whatever the iterations do, and the polish solves its SVM exactly, so the model is the same.
        """
        (a, b) = self.folds[k]
        train, test = self.rows[a], self.rows[b]
        kernels = self.fold_kernels[k] if kernels is None else kernels
        n_kernels = getattr(kernels, "n_kernels", None) or len(kernels)
        skip = no_iterations_needed(self.polished, self.iterations_per_point, selectivity, len(train), n_kernels)
        fold = fold_spec(self.spec, polished=self.polished, iterations_per_point=self.iterations_per_point,
                         n_train=len(train), C=C, selectivity=selectivity,
                         **({"max_iter": 0} if skip else {}))  # fmt: skip
        return fold_decisions(self.fit, fold, self.cv, kernels, train, test, self.sample_weight,
                              doing="choosing C by cross-validation")  # fmt: skip


def standard_error_of_sum(d: np.ndarray) -> float:
    """The standard error of ``sum(d)`` for per-row shares ``d`` of an error (inf for one row)."""
    n = len(d)
    return math.sqrt(n / (n - 1) * float(np.sum((d - d.mean()) ** 2))) if n > 1 else math.inf


def _least_selective_within_one_standard_error(path: dict, n_scored: int):
    """The first (least selective) candidate whose error is within one standard error of the lowest.

    The standard error is the binomial one of the lowest error on the ``n_scored`` cross-validated
    rows (Breiman's one-standard-error rule).  A more selective combination is kept only when it is
    measurably better: with the scaled family the CV minimum often sits on a selective candidate that
    collapses onto one narrow Gaussian and generalises worse (5 splits, default kernels, test error %,
    the lowest CV error with C chosen at 100 / this rule with C chosen at 0: heart 20.0 / 17.4, sonar
    10.0 / 8.9, german 24.6 / 24.3, ionosphere 5.7 / 4.8, breast cancer 3.0 / 3.4, banana (1000 rows)
    10.1 / 10.2).
    """
    errors = list(path.values())
    return list(path)[next(i for i, e in enumerate(errors) if _within_one_standard_error(e, errors, n_scored))]


def _within_one_standard_error(error: float, errors, n_scored: int) -> bool:
    """Whether ``error`` is within one binomial standard error (on ``n_scored`` rows) of the lowest of ``errors``."""
    best = float(min(errors))
    se = math.sqrt(max(best * (1.0 - best), 0.0) / max(int(n_scored), 1))
    return error <= best + se + 1e-12


def _first_best(path: dict):
    """The first candidate (smallest C, least selective) within 1e-12 of the lowest error."""
    errors = np.array(list(path.values()))
    return list(path)[int(np.flatnonzero(errors <= errors.min() + 1e-12)[0])]
