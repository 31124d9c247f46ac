"""The Solver protocol, the task a solver is handed, and the fitted model record it returns.

A fit runs in three steps (:func:`mwumkl_dist.solvers.driver.fit_model`):

1. the driver prepares a :class:`FitTask` once: points of sample weight 0 dropped, the classes
   and their one-vs-rest targets, the class weights, the seed and the Dask client;
2. a :class:`Solver` (chosen by name from :data:`mwumkl_dist.solvers.driver.SOLVERS`) turns
   the :class:`~mwumkl_dist.solvers.spec.FitSpec` and the task into a :class:`FittedModel`;
3. the driver adds what every model has (classes, kernel names, Platt's sigmoids, the support
   indices into all rows given) and the estimator sets the attributes.

A nested fit (a cross-validation fold, the two-stage weight stage) is a whole fit again: the
task carries the driver's :attr:`FitTask.fit` for it, so that no solver imports the driver.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from sklearn.model_selection._split import _approximate_mode  # train_test_split's class shares
from sklearn.utils.multiclass import check_classification_targets

from mwumkl_dist.core import progress
from mwumkl_dist.core.mwu_rules import FewIterationsWarning, FitInterrupted
from mwumkl_dist.data.backends import CPU, CPUBackend, backend_for, backend_named
from mwumkl_dist.data.problems import TrainingInput, make_predictor, make_training_input
from mwumkl_dist.data.weights import check_class_weight, check_sample_weight
from mwumkl_dist.devices.threads import current_threads, one_blas_thread, ordered_map
from mwumkl_dist.solvers.spec import FitSpec

__all__ = [
    "Calibration",
    "FitTask",
    "FittedModel",
    "Fitter",
    "Solver",
    "drop_zero_weights",
    "fold_decisions",
    "fold_fit",
    "fold_map",
    "fit_backend",
    "predicted_labels",
    "model_decisions",
    "score_rows",
    "stratified_rows",
    "one_vs_rest_targets",
    "training_classes",
    "continuous_target",
]

#: A whole fit: ``fit(spec, data, *, sample_weight=None, seed=None) -> attributes``.
Fitter = Callable[..., dict]


#: Labels scanned at a time by :func:`stratified_rows`.
SAMPLE_CHUNK = 2**20


def stratified_rows(y, size: int, seed: int) -> np.ndarray:
    """All row indices, or a stratified sample of ``size`` of them (sorted).

    The sample is scikit-learn's ``train_test_split(np.arange(n), train_size=size, stratify=y,
    random_state=seed)`` (a class of one row: a uniform sample instead), drawn as it draws it: each class's
    share by ``_approximate_mode``, its rows by a ``RandomState`` permutation of the class.  It is made here
    without ``train_test_split``'s ``n``-sized index arrays (80 bytes a row, 800 MB at 10^7 rows in the client
    of a fit from a store): the labels are scanned in chunks, and only one class's permutation is held at a time.
    """
    n = len(y)
    if n <= size:
        return np.arange(n)
    per_chunk = [np.unique(y[lo : lo + SAMPLE_CHUNK], return_counts=True) for lo in range(0, n, SAMPLE_CHUNK)]
    classes = np.unique(np.concatenate([values for values, _ in per_chunk]))
    counts = np.zeros(len(classes), dtype=np.int64)
    for values, seen in per_chunk:
        counts[np.searchsorted(classes, values)] += seen
    if counts.min() < 2 or size < len(classes) or n - size < len(classes):  # train_test_split refuses these
        return np.sort(np.random.default_rng(seed).choice(n, size=size, replace=False))
    rng = np.random.RandomState(seed)
    share = _approximate_mode(counts, size, rng)
    _approximate_mode(counts - share, n - size, rng)  # the held-out side's draw: the random state moves on
    # each class's chosen positions among its own rows, then found in one more pass over the labels
    wanted = [np.sort(rng.permutation(count)[:k]) for count, k in zip(counts.tolist(), share.tolist())]
    found, before = [], np.zeros(len(classes), dtype=np.int64)
    for lo in range(0, n, SAMPLE_CHUNK):
        chunk = y[lo : lo + SAMPLE_CHUNK]
        for k, c in enumerate(classes):
            members = np.flatnonzero(chunk == c)
            a, b = np.searchsorted(wanted[k], [before[k], before[k] + len(members)])
            found.append(members[wanted[k][a:b] - before[k]] + lo)
            before[k] += len(members)
    return np.sort(np.concatenate(found))


def training_classes(y) -> np.ndarray:
    """The classes of the training labels; at least two."""
    check_classification_targets(y)
    classes = np.unique(y)
    if len(classes) < 2:
        raise ValueError(f"the training labels hold one class only ({classes[0]!r}); MWUMKL needs at least two")
    return classes


#: Labels look like a continuous (regression) target rather than classes when there are more than
#: MANY_CLASSES of them and more than half have fewer than FEW_ROWS rows: one-vs-rest on a class of one
#: or two rows learns nothing (scikit-learn's diabetes target: 214 classes among 442 rows, 71 % of them
#: with one or two rows); a real many-class problem has several rows per class.
MANY_CLASSES = 10
FEW_ROWS = 3


def continuous_target(y, name: str = "MWUMKL") -> str | None:
    """Why the labels ``y`` look like a continuous target rather than classes, or None when they do not.

    ``name`` is what the message calls the classifier. Non-integer floats get scikit-learn's
    ``ValueError`` ("Unknown label type") first.
    """
    check_classification_targets(y)
    classes, counts = np.unique(np.asarray(y), return_counts=True)
    few = int(np.count_nonzero(counts < FEW_ROWS))
    if len(classes) <= MANY_CLASSES or 2 * few <= len(classes):
        return None
    return (
        f"{len(classes)} classes among {len(y)} rows ({few} with fewer than {FEW_ROWS} rows) look like a continuous "
        f"target; {name} fits a classifier: labels must be classes (bin the target)"
    )


def one_vs_rest_targets(classes: np.ndarray) -> list:
    """The positive class of each binary problem: ``classes[1]`` for two classes, else each class."""
    return [classes[1]] if len(classes) == 2 else list(classes)


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


@dataclass(frozen=True)
class FitTask:
    """What a solver fits: the training input and what the driver decided about it once.

    ``data`` holds the points of non-zero weight only (``kept`` their indices
    among all the rows given, None when all are kept), ``sample_weight`` their
    weights; ``targets`` the positive class of each one-vs-rest problem; ``backend`` the device's back-end
    (:mod:`mwumkl_dist.data.backends`), resolved once by :func:`fit_backend`.
    """

    data: TrainingInput
    classes: np.ndarray
    targets: list
    class_weight: dict | None
    sample_weight: np.ndarray | None
    seed: int
    fit: Fitter = field(repr=False)
    kept: np.ndarray | None = None
    resume: object = None
    client: object = None
    backend: CPUBackend = CPU

    @classmethod
    def prepare(cls, spec: FitSpec, data: TrainingInput, *, sample_weight, seed: int, fit: Fitter, resume=None):
        """The task of fitting ``data``: weights checked, zero-weight points dropped, classes found."""
        data, kept, sample_weight = drop_zero_weights(data, sample_weight)
        classes = training_classes(data.y)
        class_weight = check_class_weight(spec.model.class_weight, classes)
        return cls(data, classes, one_vs_rest_targets(classes), class_weight, sample_weight, seed, fit, kept, resume,
                   backend=fit_backend(spec))  # fmt: skip


@dataclass(frozen=True)
class Calibration:
    """How ``probability=True``'s folds reproduce a model's regime: size-relative ``C``, polished or not,
    the iterations per point of an unpolished fit (None: each fold resolves its own) and the selectivity
    (a number or a string; None: the specification's) and the candidate it refitted (see
    :mod:`mwumkl_dist.solvers.candidates`; None: a plain fit)."""

    C: float
    polished: bool
    iterations_per_point: float | None = None
    selectivity: object = None
    candidate: object = None


@dataclass
class FittedModel:
    """A solver's result: its fitted attributes by name, and how to calibrate its decision values.

    ``train_scores``: ``(rows, scores)``, training rows the solver scored the model on (the MWU bias
    check) and its decision values there without biases, ``(len(rows), n_problems)``; None when it
    scored none.  The driver's training-error check reuses them instead of predicting again.
    """

    attributes: dict
    calibration: Calibration
    train_scores: tuple | None = None


class Solver(Protocol):
    """What a solver provides. Register a new one in :data:`mwumkl_dist.solvers.driver.SOLVERS`."""

    name: str

    def blocker(self, spec: FitSpec, data: TrainingInput, *, resume=None) -> str | None:
        """Why this solver cannot fit ``data`` with ``spec`` (None: it can)."""

    def fit(self, spec: FitSpec, task: FitTask) -> FittedModel:
        """Fit every one-vs-rest problem of ``task``: kernel weights, duals, biases, ``C_``, ``epsilon_``, ..."""


def fit_backend(spec: FitSpec) -> CPUBackend:
    """The back-end of ``spec``'s device and engine (:func:`mwumkl_dist.data.backends.backend_for`): the one
    place a fit's device is decided; :meth:`FitTask.prepare` keeps it in the task.

    It scores rows with a model (the bias check, folds, majority check) on the GPU of a local ``device="cuda"``
    fit, else on the CPU (a Dask driver may have no GPU).  The GPU's decision values are the CPU's bit for bit,
    so the model does not depend on it; at a million kernels the CPU's take minutes.
    """
    return backend_for(spec.execution.device, spec.execution.engine)


def score_rows(kernels, kernel_names, n_features_in: int, X, support, support_vectors, dual_coef, raw_weights,
               device="cpu") -> np.ndarray:  # fmt: skip
    """A model's decision values without its biases, ``(n_samples, n_problems)``, on checked rows ``X``.

    On ``device`` (a name or a back-end, :func:`fit_backend`) where that pays (its ``scoring``: a small fold's
    rows on the CPU); where the GPU cannot hold the support vectors (dense there) the CPU computes the same
    numbers.
    """
    args = (X, support, support_vectors, dual_coef, np.atleast_2d(raw_weights))
    backend = backend_named(device).scoring(X.shape[0], len(support), args[-1].shape[1], current_threads())
    try:
        return make_predictor(kernels, kernel_names, n_features_in, backend).decision_values(*args)
    except MemoryError:  # the GPU's DeviceMemoryError, raised before it allocates
        if backend == CPU:
            raise
        return make_predictor(kernels, kernel_names, n_features_in, CPU).decision_values(*args)


def model_decisions(kernels, attributes: dict, X, device="cpu") -> np.ndarray:
    """Decision values ``(n_samples, n_problems)`` of a fitted model's ``attributes`` on checked rows ``X``."""
    scores = score_rows(kernels, attributes["kernel_names_"], attributes["n_features_in_"], X, attributes["support_"],
                        attributes["support_vectors_"], attributes["dual_coef_"], attributes["raw_kernel_weights_"],
                        device)  # fmt: skip
    return scores + attributes["intercept_"][None, :]


def fold_decisions(fit: Fitter, spec: FitSpec, cv: TrainingInput, kept, train, test, sample_weight, *, doing: str):
    """One cross-validation fold of ``cv``: ``spec``'s fit on rows ``train`` (kernels ``kept``) and the
    decision values ``(len(test), n_problems)`` of rows ``test``: ``(attributes, decisions)``.

    Run it through :func:`fold_map` (which quiets the folds' few-iterations warning). A fold
    interrupted by Ctrl-C raises :class:`~mwumkl_dist.core.mwu_rules.FitInterrupted` (``doing`` says
    what was interrupted): a half-run fold must not count.
    """
    X_train, X_test, kernel_params = cv.fold_data(kept, train, test)
    spec = spec.with_model(**kernel_params)
    attributes = _fold_attributes(fit, spec, X_train, cv.y[train], sample_weight, train, doing)
    return attributes, model_decisions(spec.model.kernels, attributes, X_test, fit_backend(spec))


def fold_fit(fit: Fitter, spec: FitSpec, cv: TrainingInput, kernels, train, sample_weight, *, doing: str) -> dict:
    """``spec``'s fit on rows ``train`` of ``cv`` with ``kernels``: its attributes, nothing scored (e.g. a
    selection's or a screen's fit, whose weights are all that is wanted).  Run it through :func:`fold_map`."""
    X_train, _, kernel_params = cv.fold_data(kernels, train, train[:0])
    return _fold_attributes(fit, spec.with_model(**kernel_params), X_train, cv.y[train], sample_weight, train, doing)


def _fold_attributes(fit: Fitter, spec: FitSpec, X_train, y_train, sample_weight, train, doing: str) -> dict:
    data = make_training_input(X_train, y_train, spec.model.kernels, estimator=None)
    attributes = fit(spec, data, sample_weight=None if sample_weight is None else sample_weight[train])
    if attributes["interrupted_"]:
        raise FitInterrupted(f"interrupted while {doing}; nothing was fitted")
    return attributes


def fold_map(run: Callable, folds, *, doing: str, step: progress.Phase | None = None) -> list:
    """``[run(fold) for fold in folds]``, the folds (e.g. :func:`fold_decisions` calls) run side by side.

    The folds are a parallel region (:func:`~mwumkl_dist.devices.threads.ordered_map`): up to this
    thread's threads run folds at once, each fold's own parallel work on its share of them, and BLAS
    on one thread (:func:`~mwumkl_dist.devices.threads.one_blas_thread`: no oversubscription, and
    the same bits for any thread count, as every fold is a whole fit that does not depend on it).
    The folds' few-iterations warning is not repeated (the final fit says it once); the filter is
    set here, once for all the folds, as warning filters are process-wide (set per fold on parallel
    threads, they would be restored out of order).  A Ctrl-C raises
    :class:`~mwumkl_dist.core.mwu_rules.FitInterrupted` (``doing`` says what was interrupted).
    The folds' own fits report no progress (:func:`~mwumkl_dist.core.progress.quiet`); each fold done
    advances ``step`` (a progress phase) by one.
    """

    def counted(fold):
        with progress.quiet():
            out = run(fold)
        if step is not None:
            step.advance()
        return out

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FewIterationsWarning)  # said once, for the final fit
        try:
            with one_blas_thread():
                return ordered_map(counted, folds)
        except KeyboardInterrupt:  # a Ctrl-C between two folds' iterations: no fold counts either
            raise FitInterrupted(f"interrupted while {doing}; nothing was fitted") from None


def predicted_labels(classes: np.ndarray, decisions: np.ndarray) -> np.ndarray:
    """The labels of decision values ``(n_samples, n_problems)``: sign for one problem, else the argmax."""
    if decisions.shape[1] == 1:
        return classes[(decisions[:, 0] > 0).astype(int)]
    return classes[np.argmax(decisions, axis=1)]
