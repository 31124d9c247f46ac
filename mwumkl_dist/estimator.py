"""``MWUMKLClassifier``: the scikit-learn estimator (binary, and one-vs-rest inside).

The estimator holds the parameters, validates them and delegates:
:mod:`mwumkl_dist.data.problems` turns the input into a training input (and a
fitted model into a predictor), :mod:`mwumkl_dist.solvers.driver` runs the fit,
:mod:`mwumkl_dist.solvers.auto` makes the automatic choices and
:mod:`mwumkl_dist.io.model_files` saves and loads models.
"""

from __future__ import annotations

import functools
import logging
from types import MethodType

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.exceptions import NotFittedError
from sklearn.utils.validation import check_is_fitted

from mwumkl_dist.data.backends import backend_named
from mwumkl_dist.data.problems import is_precomputed, make_predictor, make_training_input, prediction_blocks
from mwumkl_dist.devices.threads import current_threads, thread_limit
from mwumkl_dist.inspection import feature_weights, kernel_type_weights
from mwumkl_dist.io.model_files import load_model, load_model_with_extra, save_model
from mwumkl_dist.kernels.feature_scale import apply_feature_scale
from mwumkl_dist.plotting import plot_model, plot_panel
from mwumkl_dist.solvers.auto import random_seed
from mwumkl_dist.solvers.calibration import platt_probabilities
from mwumkl_dist.solvers.candidates import search_from_json, search_to_json
from mwumkl_dist.solvers.driver import fit_model
from mwumkl_dist.solvers.spec import FitSpec
from mwumkl_dist.solvers.two_stage.exact import EXACT_POINTS
from mwumkl_dist.summary import fit_summary

logger = logging.getLogger("mwumkl_dist")

__all__ = ["MWUMKLClassifier", "ProbabilityUnavailableError", "EXPECTED_FAILED_CHECKS"]

_WEIGHTS_ARE_NOT_REPEATS = (
    "sample_weight=k is C_j = k C for one point, which equals k copies of it in the exact 2-norm problem on a "
    "fixed Gram matrix, but the MWU iterations, the trace normalisation and the size-relative C see the "
    "copies as rows: the learned kernel weights differ (see mwumkl_dist.data.weights)"
)
#: scikit-learn estimator checks that this estimator fails by design, with the reason; pass it as
#: ``parametrize_with_checks(..., expected_failed_checks=lambda est: EXPECTED_FAILED_CHECKS)``.
EXPECTED_FAILED_CHECKS = {
    "check_sample_weight_equivalence_on_dense_data": _WEIGHTS_ARE_NOT_REPEATS,
    "check_sample_weight_equivalence_on_sparse_data": _WEIGHTS_ARE_NOT_REPEATS,
}


class ProbabilityUnavailableError(AttributeError):
    """``predict_proba`` of a model fitted without ``probability=True``.

    An ``AttributeError``, so that ``hasattr(model, "predict_proba")`` is False for such a model (as
    scikit-learn's ``available_if`` makes it), with a message that says what to do.
    """


class _needs_probability:
    """A method that exists only on a model with ``probability=True`` (scikit-learn's ``available_if``, whose
    ``AttributeError`` names the method alone: this one says to refit with probability=True)."""

    def __init__(self, method):
        self.method = method
        functools.update_wrapper(self, method)

    def __get__(self, obj, owner=None):
        if obj is None:
            return self.method  # the class's attribute: the documented function
        if not obj.probability:
            raise ProbabilityUnavailableError(
                f"This {type(obj).__name__!r} has no attribute {self.method.__name__!r}: probabilities need "
                "probability=True; refit with probability=True (Platt scaling on cross-validated decision "
                "values), or use decision_function for scores"
            )
        return MethodType(self.method, obj)


class MWUMKLClassifier(ClassifierMixin, BaseEstimator):
    """Multiple kernel learning by matrix multiplicative weights (MWUMKL).

    Learns a convex combination of base kernels and a kernel classifier at
    once, with ``O(m n)`` memory and two kernel columns per kernel per
    iteration (Moeller et al., AISTATS 2014).  Two classes are solved
    directly; more classes one-vs-rest.

    Parameters
    ----------
    kernels : str, KernelSpec or list, default="auto"
        The base kernels.  ``"auto"`` offers the ``"scaled"`` family below and
        kernels on feature subsets, and lets cross-validation choose (see
        :mod:`mwumkl_dist.solvers.structure`): a Gaussian with one width per
        feature, fitted on a sample of the rows to its alignment with the
        labels, says how relevant each feature is (interactions included);
        the relevant features, and the 1, 2, 4, ... most relevant ones, get a
        model of their own (a joint band of Gaussians at the learned width),
        each cross-validated like the other candidates.  Such a structured
        model replaces the all-features family only when it is better by more
        than the standard error of their paired difference; ``structure_``
        then says which features it kept, and ``kernel_names_`` holds its kernels (otherwise
        the scaled family's).  Where no feature subset stands out the model
        is the scaled family's.  A spec string such as ``"scaled"`` (on all
        features: polynomial degrees 1-3 and up to 11 Gaussians whose widths
        ``2^-2.5 ... 2^2.5 sigma_0`` are set from the training data's own scale,
        ``sigma_0 = sqrt(d var(X) / 2)``, scikit-learn's ``gamma="scale"``, less
        those too narrow for the data's nearest-neighbour distances;
        ``kernel_scale_`` records ``sigma_0``, ``kernel_names_`` the kernels
        used), ``"scaled-per-feature"`` (3 polynomials and 11 Gaussians
        per feature, each at its feature's scale), ``"paper"`` (the paper's 12
        kernels, widths fixed at 1 to 16: for data scaled to [0, 1]),
        ``"paper-per-feature"`` (12 per feature),
        ``"linear,poly:2,gaussian:2@0-4"`` or ``"random:1000:size=2:seed=0"`` (a bank of
        Gaussians on random feature pairs, 9 widths scaled to the data like
        ``"scaled"``; ``":widths=paper"`` for the paper's);
        kernel objects from :mod:`mwumkl_dist.kernels`; or ``"precomputed"``,
        where ``X`` is an ``(m, n_samples, n_train)`` array of kernel values.
    epsilon : float or "auto", default="auto"
        Approximation error; sets the iteration count
        ``T = ceil(8 rho^2 / epsilon^2 * ln n)``.  Must lie in ``(0, 2 rho)``.
        A given value (or ``max_iter``) that leaves an unpolished fit fewer than
        ``n / 10`` iterations warns before fitting (:class:`~mwumkl_dist.solvers.auto.FewIterationsWarning`,
        naming the automatic value) and the warning is kept in ``fit_warnings_``.
        ``"auto"`` is 0.2 (the paper's small-set value) when the fit ends with
        the exact polish, which re-solves the SVM so that the MWU only has to
        find the weights; otherwise at most 0.1 (on 10000 points of a9a /
        cod-rna, 12 kernels, C=1, 0.2 gives 34 % / 25 % test error and 0.1
        15.5 % / 4 %), and small enough for ``T >= n / 5`` iterations: the
        unpolished MWU needs that many on noisy data (Adult, 39073 points:
        ``T = n / 20`` gives 34 % error, ``n / 5`` 14.6 %), at ``O(n)``
        iterations.  ``epsilon_`` records the value used.
    C : float or "auto", default="auto"
        2-norm soft-margin constant; ``np.inf`` is the hard margin.  The
        solver adds ``I / C_eff`` to each trace-normalised kernel, with
        ``C_eff = C * n_samples`` when ``scale_C`` (entries of a
        trace-normalised kernel are about ``1 / n``, so ``C`` then means the
        same at every data size) and ``C_eff = C`` otherwise (the paper).
        ``"auto"`` picks the size-relative ``C`` from 0.1, 1, ..., 10000 by
        stratified 3-fold cross-validation of this estimator on at most 4000
        training points, polished or not as the final fit will be (about
        18 extra fits of that size; ``C_path_`` holds the cross-validated errors).
        The best value differs by orders of magnitude between data sets:
        10-1000 for per-feature kernels on small sets, about 1 on a9a and
        cod-rna.  A fit from a data store cross-validates on about 4000 of its
        rows (whole chunks in a random order), unpolished like the final fit;
        from a kernel store it uses 1.
    rho : float, default=0.5
        Width parameter.  The paper's bound is 3/2; the authors' code uses
        1/2, which needs 9x fewer iterations.
    selectivity : float, "auto", "exact" or "paper", default="auto"
        How sparse the kernel weights are, from uniform to the exact MKL
        optimum.  The weights follow a soft maximum of the kernels' margins
        ``sqrt(alpha' G_i alpha)`` taken *relative to the largest one*:
        ``mu_i ~ sinh(beta u_i / max u) / u_i``, with ``beta`` this value.
        0 gives uniform weights; a kernel whose margin is 1 % below the best
        gets about ``exp(-beta / 100)`` of its weight, so ``beta = 100``
        keeps a handful of kernels and ``"exact"`` (also ``np.inf``:
        ``beta = 10 ln(m) / epsilon``) converges to the optimal weights of
        the MKL problem itself as ``epsilon`` falls.  ``"auto"`` chooses from
        0, 30, 100 and 300 by cross-validation together with ``C="auto"`` (see
        :func:`mwumkl_dist.solvers.auto.choose_C`): the least selective within
        one standard error of the best, so data where every kernel helps keep
        near-uniform weights.  Kernels on different features (per-feature
        kernels, one family per data source) also try *group selection*
        (:mod:`mwumkl_dist.solvers.groups`): a strongly regularised, selective
        fit picks the feature groups, then the model is refitted on their
        kernels with uniform weights; it wins when within one standard error of
        the best (``group_selection_`` says what it kept).  Gaussians of five or
        more widths on one feature group (the default family) also try *bands*
        of three neighbouring widths with uniform weights; a band wins only
        when it is more than one standard error better than the rest
        (``width_band_`` says which).  With a given ``C``
        it is 100 (nothing is cross-validated).  ``"paper"`` is the published rule, whose
        exponents ``eps' / (2 rho) sqrt(s_i)`` are on an absolute scale: after
        trace normalisation they barely differ and its weights stay uniform
        to about 2 %.  ``selectivity_`` records the value used.
    max_iter : int or None, default=None
        Run exactly this many iterations instead of ``T`` from ``epsilon``.
    scale_C : bool, default=True
        Whether ``C`` is relative to the training size (see ``C``).
    scale_features : {"auto", True, False}, default="auto"
        Whether the fit learns each feature's scale: dense features are scaled
        min-max to [0, 1] on the training rows (``X * feature_scale_ +
        feature_offset_``, as ``MinMaxScaler``), sparse ones only multiplied by
        ``1 / (max - min)`` (they stay sparse), so features in different units
        (one in the thousands, one in [0, 1]) weigh alike.  Binary 0/1 features
        and data already in [0, 1] are unchanged, and a positive factor on any
        feature gives the same model.  Prediction applies the same scaling.
        ``"auto"``: with ``kernels="auto"`` (the default); explicit kernels keep
        their widths in the data's own units.  ``True``: with any kernels (their
        widths are then in the scaled units); ``False``: the features as given.
        Not with ``kernels="precomputed"``.
    polish : {"auto", True, False}, default="auto"
        After the MWU iterations, re-solve the 2-norm soft-margin SVM exactly
        on all training points with the learned kernel weights (LIBSVM on the
        combined Gram matrix, see :mod:`mwumkl_dist.kernels.evaluation`): the same model,
        solved to optimality instead of to ``epsilon``.  It needs the
        ``n x n`` Gram matrix, so ``"auto"`` polishes only up to 3000
        training points and 1e9 kernel evaluations (and not for store data
        or ``C = inf``); ``True`` always does.  ``polish=False`` with
        ``scale_C=False`` is the paper's algorithm as published.
    solver : {"auto", "mwu", "two-stage"}, default="auto"
        How the classifier is found (:mod:`mwumkl_dist.solvers.two_stage`).
        ``"mwu"``: the paper's algorithm on all training points (then the
        polish, see ``polish``); its cost grows as ``n^2`` (``T ~ n / 5``
        iterations).  ``"two-stage"``: the MWU fit (with ``C="auto"`` and
        ``selectivity="auto"``'s cross-validation) learns the kernel weights and
        ``C`` on a stratified subsample of 3000 rows (so it is polished), then
        the same 2-norm soft-margin SVM is solved on all rows on 500 Nystroem
        features of the learned combined kernel, by a finite Newton method: time
        linear in ``n``.  On cod-rna (10^5 rows) 3.7 % test error in about 20 s
        (one core) where the MWU fit takes minutes; a9a 14.8 % in 10 s.  The
        model is a kernel expansion on the 500 landmark rows (``support_``),
        predicted and saved as any other. The linear stage runs on the
        estimator's engine: ``n_shards`` shards (on Dask workers with
        ``engine="dask"``) each hold their rows' features, reading a data store
        block by block; features beyond a shard's memory budget (a quarter of a
        Dask worker's ``memory_limit``) go to a temporary file.  The model is
        the same, bit for bit, for every engine, shard count and thread count.
        ``"auto"``: two-stage above 3000 training rows (where the exact polish
        stops: the raw MWU classifier is worse or slower there) for feature rows
        (in memory or in a data store) with a finite ``C`` and without a
        checkpoint, on either device; else ``"mwu"``.  ``solver_`` records the one used.
    engine : {"local", "dask"}, default="local"
        Where the shards live: in this process, or on Dask workers.
    device : {"cpu", "cuda"}, default="cpu"
        Where the shards' supersteps and the decision function run.
        ``"cuda"`` keeps each shard's ``V`` and data on an NVIDIA GPU (the
        ``[gpu]`` extra, numba-cuda); with ``engine="dask"`` each worker's
        shards use that worker's GPU (one worker per GPU).  The results equal
        the CPU's (the same operations in the same order).  Without a usable
        GPU, ``"cuda"`` is a ``RuntimeError`` naming what is missing.  The
        two-stage fit runs its weight stage on the GPU engine and keeps its
        linear stage's kernel columns on the GPU (single precision), where the
        Newton passes run; its exact solve stays on the CPU.  Its model agrees
        with the CPU's to rounding, not bit for bit.
    client : distributed.Client, str or None, default=None
        With ``engine="dask"``: a client, a scheduler address
        (``"tcp://host:8786"``), or None for a local threaded cluster.
    n_shards : "auto" or int, default="auto"
        Row shards (the result does not depend on the sharding).  ``"auto"``: on
        the local engine one; on Dask the two-stage fit's linear stage puts one
        shard on each worker (each reads its own rows where the input is a data
        store), and the MWU iterations run where a superstep is cheapest: in
        this process where its threads beat a round trip to the workers (for a
        problem in memory; a cost model of a measured superstep and a measured
        round trip), else one shard per worker.  ``shard_layout_`` says which.
    n_kernel_shards : int, default=1
        Kernel shards (``engine="dask"``): blocks of kernels over each row shard.
    n_jobs : int or None, default=None
        Threads for the supersteps and the decision function in this process
        (scikit-learn's meaning): None uses every core the process may use
        (its CPU affinity and cgroup quota; fewer inside a
        ``threadpoolctl.threadpool_limits`` block, under ``OMP_NUM_THREADS``,
        or in a Dask worker, its ``nthreads``), or ``MWUMKL_NUM_THREADS``
        when that environment variable is set; ``-1`` all available cores,
        ``-2`` all but one; a positive number that many (at most the
        available cores).  ``C="auto"``'s and ``probability``'s fold fits use
        the same.  The model does not depend on it: every ``n_jobs`` gives
        bit-identical results.  With ``engine="dask"`` it only sets the
        driver's local work (the cross-validation folds, predictions); the
        shards use their workers' threads.
    checkpoint : path or None, default=None
        Write the driver state to this file every ``checkpoint_every``
        iterations; ``fit(..., resume=path)`` continues from it.
    checkpoint_every : int, default=100
        Iterations between checkpoints.
    scheduler_timeout : float, default=10.0
        Seconds to wait for a Dask scheduler before giving up with a clear error.
    worker_timeout : float, default=600.0
        With ``engine="dask"``: seconds to wait for Dask workers (at the
        start, and for a replacement when every worker is gone) and for a
        shard's answer; while waiting, a warning is logged every few seconds
        (the first after 2 s).  A cluster that has no worker after this long
        fails with a ConnectionError.
    superstep_timeout : float or None, default=None
        With ``engine="dask"``: seconds a shard may take to answer one
        superstep (or any other call) before its worker is declared hung and
        its shards are rebuilt on other workers (the model stays the same).
        None: ``worker_timeout``.  A shard silent for 10 s (or three times
        its slowest answer so far) is reported at once, whatever this is.
        Not shorter by default: a superstep's time grows with the shard's
        rows and kernels, and a worker's first one compiles the numba
        kernels (a minute on a cold cache), so a fixed short limit would
        rebuild healthy shards.
    callback : callable or None, default=None
        Called as ``callback(info)`` with a :class:`mwumkl_dist.ProgressInfo`
        for every phase of the fit (``info.phase``: ``"cross-validation"``,
        ``"iterations"``, ``"polish"``, ``"traces"``, ``"nystroem"``, ``"columns"``,
        ``"newton"``, ``"check-C"``, ``"calibration"``; ``info.done`` of ``info.total`` units,
        ``total`` None where unknown): at each phase's start, as its units
        complete, and in the MWU iterations every ``callback_every`` iterations
        (with ``info.s``).  Returning ``True`` there stops the fit early,
        keeping the iterations done; in other phases the answer is ignored.
    callback_every : int, default=100
        Iterations between the callback's calls in the MWU iterations.
    verbose : int, default=0
        Log every phase of the fit to the ``mwumkl_dist`` logger at INFO level:
        its start, each further tenth (or 10 s), its end, with an estimate of
        the time left.
    random_state : int, RandomState instance or None, default=0
        Seeds the random choices of ``C="auto"``: its subsample, its folds and,
        from a data store, the chunks it reads; and ``probability``'s folds.
        An int gives the same choices every fit (the default, 0, keeps fits
        reproducible); a ``RandomState`` or None draws a seed per fit
        (scikit-learn's convention).
    class_weight : dict, "balanced" or None, default=None
        Multiplies ``C`` per class, as in ``SVC``: a point of class ``c``
        gets ``C_j = C_eff * class_weight[c]`` (times its ``sample_weight``),
        i.e. the per-point ridge ``1 / C_j`` (:mod:`mwumkl_dist.data.weights`).
        ``"balanced"`` uses ``n / (n_classes * n_c)``.  One-vs-rest follows
        scikit-learn's convention for one-vs-rest models: a dict weighs every
        point by its own label in every binary problem, ``"balanced"``
        balances each binary problem (class ``k`` against the rest).  With
        ``C="auto"`` the candidates are scored by the weighted error (the
        balanced error for ``"balanced"``).
    probability : bool, default=False
        Fit Platt sigmoids (``probA_``, ``probB_``) for :meth:`predict_proba`,
        as ``SVC(probability=True)``: on the decision values of stratified
        5-fold cross-validation fits (on at most 4000 training points, like
        ``C="auto"``: 5 more fits of that size); see :mod:`mwumkl_dist.solvers.calibration`.
        More than two classes: one sigmoid per one-vs-rest problem,
        normalised.  The probabilities may disagree with :meth:`predict` near
        the decision boundary.
    memory_limit : "auto", int or str, default="auto"
        The memory the two-stage fit's large arrays may take (the kernel
        columns of its linear stage, its Nystroem maps and Newton Hessian):
        bytes, or a size such as ``"1GB"`` or ``"512MiB"``.  ``"auto"``: 1 GiB,
        or a quarter of the process's cgroup memory limit or of a Dask worker's
        ``memory_limit`` where smaller; never sized from the memory that happens
        to be free.  Kernel columns beyond it are spilled to a temporary file or
        computed again at each pass (the model is the same); the rank is capped
        to what its maps and Hessian need within it (``rank_stop_reason_``).  A
        fit that cannot run within it fails at the start, naming it.  On
        ``engine="dask"`` it holds per process: the client's arrays within it
        and each worker's linear-stage shards within theirs (a given size is
        each worker's too; ``"auto"``: 60 % of each worker's Dask
        ``memory_limit`` less what the worker holds), so the cluster's memory
        buys rank and keeps the columns (``shard_layout_`` says how much).

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
        Class labels; the positive class of a binary problem is ``classes_[1]``.
    kernel_weights_ : ndarray of shape (n_kernels,) or (n_classes, n_kernels)
        Weights ``mu_i`` of the trace-normalised kernels (each row sums to 1).
    raw_kernel_weights_ : ndarray, same shape as ``kernel_weights_``
        Weights on the raw kernels, ``mu_i / r_i``.
    kernel_traces_ : ndarray of shape (n_kernels,)
        Traces ``r_i`` of the base kernels on the training data.
    kernel_names_ : list of str
        The base kernels, as spec strings (the scaled families' widths as numbers); with
        ``kernels="auto"`` the kernels of the model it chose (the scaled family's, or a
        structured model's, see ``structure_``).
    feature_scale_ : ndarray of shape (n_features_in_,)
        Only when the features were scaled (``scale_features``): each feature's
        factor, ``1 / (max - min)`` on the training rows (1 for a constant feature).
        The support vectors and ``kernel_scale_`` are in the scaled units.
    feature_offset_ : ndarray of shape (n_features_in_,)
        With ``feature_scale_``: what is added after the factor, ``-min * factor``
        (0 for sparse training rows).
    kernel_scale_ : float
        Only with a scaled family (``kernels="scaled"`` or ``"auto"``, the default) or a
        random bank with scaled widths: the data's scale ``sigma_0`` its
        Gaussian widths are multiples of.
    n_threads_ : int
        The threads of this process the fit used (``n_jobs`` resolved; the
        Dask engine's shards use their workers' threads).  Not saved in model files.
    support_ : ndarray of shape (n_SV,)
        Indices of the training points with non-zero dual coefficient.
    support_vectors_ : ndarray or CSR matrix of shape (n_SV, n_features)
        Those training points (not stored for precomputed kernels).
    dual_coef_ : ndarray of shape (n_problems, n_SV)
        ``alpha_j y_j`` of the support vectors, per binary problem.
    intercept_ : ndarray of shape (n_problems,)
        The bias ``b`` of each binary problem.
    n_iter_ : int or ndarray of shape (n_classes,)
        Iterations run (per class for one-vs-rest).
    interrupted_ : bool
        Whether a fit stopped early (callback or Ctrl-C) and kept a partial model.
    epsilon_ : float
        The ``epsilon`` used (the automatic one with ``epsilon="auto"``).
    C_ : float
        The ``C`` used (the chosen one with ``C="auto"``, in the units ``scale_C`` gives it).
    C_path_ : dict
        Only with ``C="auto"``: the cross-validated error of each candidate ``C``
        (see :func:`mwumkl_dist.solvers.auto.choose_C`).
    selectivity_ : float or str
        The selectivity used (the chosen one with ``selectivity="auto"``; "exact" and "paper" as given).
    selectivity_path_ : dict
        Only with ``selectivity="auto"``: the cross-validated error of each candidate selectivity
        (empty when nothing was cross-validated, e.g. from a kernel store).
    group_selection_ : dict
        Only when ``selectivity="auto"`` chose a group selection (kernels in several feature
        groups, see :mod:`mwumkl_dist.solvers.groups`): the selection fit's ``C`` and selectivity,
        the threshold ``keep``, and how many of the feature groups were kept (``groups_kept``,
        ``groups``).  The model is the kept groups' kernels with uniform weights at ``C_``
        (``selectivity_`` is 0); the other kernels' weights are 0.
    group_selection_path_ : dict
        Only with ``selectivity="auto"`` and kernels in several feature groups: the cross-validated
        error of each group selection, by ``(GroupSelection, C)``.
    width_band_ : dict
        Only when ``selectivity="auto"`` chose a band of Gaussian widths (see
        :func:`mwumkl_dist.solvers.groups.width_bands`): the band's width ranks (``first``,
        ``last``; 0 is the narrowest), its ``sigmas`` and how many ``widths`` there were.  The model
        is the band's kernels with uniform weights at ``C_`` (``selectivity_`` is 0); the other
        kernels' weights are 0.
    width_band_path_ : dict
        Only with ``selectivity="auto"`` and five or more Gaussian widths on one feature group: the
        cross-validated error of each band, by ``(WidthBand, C)``.
    structure_ : dict
        Only when ``kernels="auto"`` chose a structured model (see ``kernels``): the kept
        ``features`` (ascending), the ``sigmas`` of their joint band, ``top`` (how many features
        were kept; 0: the relevant ones), ``screened_rows`` (how many rows the relevance fit read)
        and its ``feature_weights`` (each feature's relevance, summing to 1: the evidence the
        features were ranked by).  The model's kernels (``kernel_names_``) are the kept features'
        joint band, with uniform weights at ``C_`` (``selectivity_`` is 0).
    structure_path_ : dict
        Only with ``kernels="auto"`` on two or more features, ``C="auto"`` and ``selectivity="auto"``:
        the cross-validated error of each structured candidate, by
        ``(FeatureStructure(top), C)`` (each fold fitting the relevance on its own training rows).
    solver_ : str
        The solver used: "mwu" or "two-stage" (see ``solver``).
    weight_points_ : int
        Only after a two-stage fit: the rows the kernel weights were learnt on.
    n_components_ : int or ndarray of shape (n_problems,)
        Only after a two-stage fit: the rank of each binary problem's Nystroem map
        (chosen from the training rows and the residual below; ``len(support_)`` landmarks).
    nystroem_residual_ : float or ndarray of shape (n_problems,)
        Only after a two-stage fit: the relative Nystroem residual of each binary problem's
        combined kernel, ``sum_j (K(x_j, x_j) - |phi(x_j)|^2) / sum_j K(x_j, x_j)`` on up to 1000
        training rows that are not landmarks (0: the features reproduce the kernel there;
        see :func:`mwumkl_dist.solvers.two_stage.nystroem_residual`).
    rank_stop_reason_ : str or None
        Only after a two-stage fit: why the Nystroem rank stopped growing: ``"gain"`` (the held-out
        error of the last doubling improved by less than its standard error), ``"residual"`` (the
        features reproduce the kernel to the residual target), ``"budget"`` (the most landmarks the
        rows afford), ``"memory_limit"`` (the most the memory limit affords), ``"given"``
        (``n_components`` an int) or ``"exact"`` (the exact solve on all rows).
    features_spilled_ : bool
        Only after a two-stage fit: whether a shard kept its kernel columns on the landmarks in a
        temporary file (they exceeded its memory budget; see
        :func:`mwumkl_dist.solvers.two_stage.feature_memory_budget`).
    linear_method_ : str or list of str
        Only after a two-stage fit on Nystroem features: how each binary problem's final linear solve was made,
        ``"explicit"`` (Newton with the Hessian formed) or ``"cg"`` (conjugate gradients), as the cost model of
        :func:`~mwumkl_dist.solvers.two_stage.newton.linear_costs` chose for where the shards ran.
    shard_layout_ : str
        Where the shards ran and why (``n_shards``; the linear stage's method and its cost model's estimates).
    polished_ : bool
        Whether the dual coefficients and biases come from the exact polish
        (see ``polish``) rather than from the MWU iterations alone.
    polish_skipped_ : str
        Only when an MWU fit was not polished: why (``"polish=False"``, ``"auto: too large for it,
        ..."``, ``"auto: not available for a fit from a store (the data are not in memory)"``, ...).
    cache_info_ : dict
        Only after a fit from a :class:`~mwumkl_dist.stores.KernelStore`: the shards'
        column caches added up: ``hits``, ``misses``, ``hit_rate``, ``evictions``,
        ``bytes_read`` (bytes read from the store), ``cache_peak_bytes`` and
        ``cache_max_bytes`` (largest of one shard), ``n_shards``.
    fit_warnings_ : list of str
        Warnings about the fit's settings (see ``epsilon``); saved with the model.
    probA_, probB_ : ndarray of shape (n_problems,)
        Only with ``probability=True``: Platt's sigmoid ``1 / (1 + exp(A f + B))``
        of each binary problem's decision value ``f``.
    n_features_in_ : int
        Number of features seen in ``fit``.
    feature_names_in_ : ndarray of str
        Feature names, when ``X`` had them (pandas).

    Examples
    --------
    >>> from sklearn.datasets import load_breast_cancer
    >>> from sklearn.preprocessing import MinMaxScaler
    >>> X, y = load_breast_cancer(return_X_y=True)
    >>> X = MinMaxScaler().fit_transform(X)
    >>> clf = MWUMKLClassifier(kernels="paper").fit(X, y)
    >>> clf.kernel_weights_.shape
    (12,)
    """

    # How a model file keeps the search's choices and paths (mwumkl_dist.io.model_files cannot import the solvers).
    _search_to_json = staticmethod(search_to_json)
    _search_from_json = staticmethod(search_from_json)

    def __init__(
        self,
        kernels="auto",
        epsilon="auto",
        C="auto",
        rho=0.5,
        selectivity="auto",
        max_iter=None,
        scale_C=True,
        scale_features="auto",
        engine="local",
        device="cpu",
        client=None,
        n_shards="auto",
        n_kernel_shards=1,
        n_jobs=None,
        checkpoint=None,
        checkpoint_every=100,
        scheduler_timeout=10.0,
        worker_timeout=600.0,
        superstep_timeout=None,
        callback=None,
        callback_every=100,
        verbose=0,
        polish="auto",
        random_state=0,
        class_weight=None,
        probability=False,
        solver="auto",
        n_components="auto",
        memory_limit="auto",
    ):
        self.kernels = kernels
        self.epsilon = epsilon
        self.C = C
        self.rho = rho
        self.selectivity = selectivity
        self.max_iter = max_iter
        self.scale_C = scale_C
        self.scale_features = scale_features
        self.engine = engine
        self.device = device
        self.client = client
        self.n_shards = n_shards
        self.n_kernel_shards = n_kernel_shards
        self.n_jobs = n_jobs
        self.checkpoint = checkpoint
        self.checkpoint_every = checkpoint_every
        self.scheduler_timeout = scheduler_timeout
        self.worker_timeout = worker_timeout
        self.superstep_timeout = superstep_timeout
        self.callback = callback
        self.callback_every = callback_every
        self.verbose = verbose
        self.polish = polish
        self.random_state = random_state
        self.class_weight = class_weight
        self.probability = probability
        self.solver = solver
        self.n_components = n_components
        self.memory_limit = memory_limit

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        # CSR input is supported (and never densified), except for precomputed kernels.
        tags.input_tags.sparse = not is_precomputed(self.kernels)
        return tags

    def __sklearn_is_fitted__(self):
        # A fit that failed half-way (e.g. one class) may leave n_features_in_ behind but no model.
        return hasattr(self, "raw_kernel_weights_")

    # ------------------------------------------------------------------ fit

    def fit(self, X, y=None, sample_weight=None, resume=None):
        """Fit the kernel weights and the classifier.

        Parameters
        ----------
        X : array-like or sparse matrix of shape (n_samples, n_features), or a store
            Training data (or ``(m, n, n)`` kernels with ``kernels="precomputed"``);
            or a :class:`mwumkl_dist.stores.DataStore` (a
            :class:`~mwumkl_dist.stores.KernelStore` with ``kernels="precomputed"``),
            whose shards read their own rows: the labels then come from the store.
        y : array-like of shape (n_samples,), or None for a store
            Labels: any two or more distinct values.
        sample_weight : array-like of shape (n_samples,), optional
            Per-point weights, as in ``SVC``: ``C_j = C_eff * sample_weight[j]``
            (times the class weight), i.e. the per-point ridge ``1 / C_j`` of
            the 2-norm soft margin.  Points of weight 0 are left out of the fit
            (``support_`` still indexes all rows); negative weights are an error.
            Integer weights equal repeated points for the exact 2-norm problem on
            a fixed Gram matrix, not for the MWU iterations (see
            :mod:`mwumkl_dist.data.weights`).  Not available for a fit from a store.
        resume : path or None
            A checkpoint written by an earlier fit on the same data with the same
            settings (see ``checkpoint``): the fit continues from it and ends with
            the same model as an uninterrupted fit.

        Returns
        -------
        self : MWUMKLClassifier
        """
        spec = FitSpec.from_params(self.get_params())  # every parameter validated, once
        seed = random_seed(spec.model.random_state)
        # A failed refit must not leave the old model next to new classes_.
        for name in [a for a in vars(self) if a.endswith("_") and not a.startswith("_")]:
            delattr(self, name)
        # This thread's numba threads (the folds of C="auto" and probability inherit n_jobs); the
        # Dask engine's shards use their workers' threads.
        with thread_limit(spec.execution.n_jobs):
            n_threads = current_threads()
            if spec.execution.verbose:
                logger.info("fitting on %d thread%s of this process", n_threads, "s" * (n_threads != 1))
            # on Dask a store past the exact solve's rows stays out of core: the shards read their rows, not the client
            dask = spec.execution.engine == "dask" and spec.model.polish is not True
            data = make_training_input(
                X,
                y,
                spec.model.kernels,
                estimator=self,
                scale_features=spec.model.scales_features(),
                sample_weight=sample_weight,
                out_of_core_rows=EXACT_POINTS if dask else None,
            )
            fitted = fit_model(spec, data, seed=seed, resume=resume, sample_weight=sample_weight)
        for name, value in fitted.items():
            setattr(self, name, value)
        if data.feature_scale is not None:
            self.feature_scale_, self.feature_offset_ = data.feature_scale
        self.n_threads_ = n_threads
        return self

    # ------------------------------------------------------------------ what the weights say

    def _weights_per(self, aggregate):
        check_is_fitted(self)
        if is_precomputed(self.kernels):
            raise AttributeError("precomputed kernels have no features or kernel types to aggregate the weights by")
        rows = np.atleast_2d(self.kernel_weights_)
        out = [aggregate(self.kernel_names_, w, self.n_features_in_) for w in rows]
        return out[0] if np.ndim(self.kernel_weights_) == 1 else out

    @property
    def feature_weights_(self):
        """Kernel weight per input feature, ndarray of shape (n_features,) or (n_classes, n_features).

        Each kernel's weight ``mu_i`` is shared equally by the features it reads
        (:func:`mwumkl_dist.inspection.feature_weights`): with per-feature kernels
        it is the weight the data put on each feature.
        """
        out = self._weights_per(feature_weights)
        return out if isinstance(out, np.ndarray) else np.vstack(out)

    @property
    def kernel_type_weights_(self):
        """Kernel weight per kernel type (``"gaussian:2"``, ``"poly:1"``, ...) summed over features, largest first.

        A dict, or a list of dicts (one per one-vs-rest problem).
        """
        return self._weights_per(kernel_type_weights)

    # ------------------------------------------------------------------ summary and pictures

    def summary(self, X=None, y=None) -> str:
        """What the fitted model is, what the fit chose and why, its errors and weights, as text.

        The kernels, each automatic choice with its reason, the cross-validated error of the chosen
        settings with its standard error, the number of iterations and support vectors, the biases
        and the weights per kernel type, per Gaussian width and per feature (the largest).  Given the
        training data ``X, y`` it adds the training error (on a stratified sample of at most 4000
        rows) and the majority-class error (``y`` alone gives the latter).
        See :func:`mwumkl_dist.summary.fit_summary`.
        """
        check_is_fitted(self)
        return "\n".join(fit_summary(self, X, y))

    def plot(self, kind="all", *, ax=None, path=None):
        """A picture of the fitted model (needs matplotlib: ``pip install 'mwumkl-dist[plot]'``).

        Parameters
        ----------
        kind : {"all", "weights", "path", "features"}, default="all"
            ``"weights"``: the kernel weights (bars by width, or a map of feature groups x kernels);
            ``"path"``: the cross-validated error of each candidate C, selectivity, group selection
            and band of widths, with one standard error bars; ``"features"``: the weight per input
            feature; ``"all"``: those that apply, side by side.
        ax : matplotlib Axes, optional
            Draw one ``kind`` (not ``"all"``) on it.
        path : str or path-like, optional
            Also save the figure there (PNG, SVG, PDF, ... from the extension).

        Returns
        -------
        matplotlib Figure (``ax``'s figure when given)
        """
        check_is_fitted(self)
        if ax is None:
            return plot_model(self, kind, path)
        if kind == "all":
            raise ValueError("plot(ax=...) draws one kind: 'weights', 'path' or 'features', not 'all'")
        plot_panel(self, kind, ax)
        if path is not None:
            ax.figure.savefig(path)
        return ax.figure

    # ------------------------------------------------------------------ predict

    def decision_function(self, X):
        """Signed distance to the separating hyperplane of each binary problem.

        ``X`` may also be a :class:`~mwumkl_dist.stores.DataStore`, read one chunk of rows at a time.

        Returns
        -------
        ndarray of shape (n_samples,) for two classes, else (n_samples, n_classes)
        """
        check_is_fitted(self)
        backend = backend_named(getattr(self, "device", "cpu"))  # a model unpickled from before device: the CPU
        weights = np.atleast_2d(self.raw_kernel_weights_)
        n_rows = getattr(X, "shape", (None,))[0]
        if n_rows is not None:  # few rows or a small model: the CPU is quicker (the same values)
            backend = backend.scoring(n_rows, len(self.support_), weights.shape[1], current_threads())
        predictor = make_predictor(self.kernels, self.kernel_names_, self.n_features_in_, backend)
        scale = getattr(self, "feature_scale_", None), getattr(self, "feature_offset_", None)  # the SVs are scaled
        with thread_limit(getattr(self, "n_jobs", None)):  # a model unpickled from before n_jobs: None
            parts = [
                predictor.decision_values(
                    apply_feature_scale(predictor.check_input(self, block), *scale),
                    self.support_,
                    self.support_vectors_,
                    self.dual_coef_,
                    weights,
                )
                for block in prediction_blocks(X)
            ]
        out = np.concatenate(parts) + self.intercept_[None, :]
        if not np.all(np.isfinite(out)):  # huge but finite inputs overflow the kernel values: never a silent NaN
            bad = np.flatnonzero(~np.all(np.isfinite(out), axis=1))
            raise ValueError(
                f"X: the decision values of {len(bad)} of {len(out)} rows (row {bad[0]} first) are not finite: their "
                "feature values are too large for the kernels (a kernel value overflows a double); scale the "
                "features as the training data was"
            )
        return out[:, 0] if out.shape[1] == 1 else out

    def predict(self, X):
        """Predicted class labels for ``X``."""
        scores = self.decision_function(X)
        if scores.ndim == 1:
            return self.classes_[(scores > 0).astype(int)]
        return self.classes_[np.argmax(scores, axis=1)]

    @_needs_probability
    def predict_proba(self, X):
        """Class probabilities for ``X`` (Platt scaling of the decision values; needs ``probability=True``).

        Returns
        -------
        ndarray of shape (n_samples, n_classes)
            Columns in the order of ``classes_``; each row sums to 1.
        """
        check_is_fitted(self)
        if not hasattr(self, "probA_"):
            raise NotFittedError("predict_proba needs a model fitted with probability=True; refit it")
        return platt_probabilities(self.decision_function(X), self.probA_, self.probB_)

    @_needs_probability
    def predict_log_proba(self, X):
        """The logarithm of :meth:`predict_proba`."""
        with np.errstate(divide="ignore"):  # a probability that underflowed to 0: -inf, as SVC gives
            return np.log(self.predict_proba(X))

    # ------------------------------------------------------------------ portable save/load

    def save(self, path, *, extra_arrays=None, extra_meta=None, overwrite=False) -> None:
        """Save the fitted model to ``path`` (a ``.npz`` file; no pickle needed to load).

        Callables (``callback``) are not saved; ``extra_arrays`` / ``extra_meta``
        add the caller's own data (see :func:`mwumkl_dist.io.model_files.save_model`).
        An older model file at ``path`` is replaced; any other file there is refused
        (an ``OSError``) unless ``overwrite=True``; a symbolic link, a device node or a
        FIFO at ``path`` is always refused.
        """
        check_is_fitted(self)
        save_model(self, path, extra_arrays=extra_arrays, extra_meta=extra_meta, overwrite=overwrite)

    @classmethod
    def load(cls, path) -> MWUMKLClassifier:
        """Load a model written by :meth:`save`."""
        return load_model(path, cls)

    @classmethod
    def load_with_extra(cls, path) -> tuple[MWUMKLClassifier, dict, dict]:
        """Load a model written by :meth:`save` with the caller's ``(extra_arrays, extra_meta)``.

        Both dicts are empty for a file saved without extras.
        """
        return load_model_with_extra(path, cls)
