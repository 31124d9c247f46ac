"""``MWUMKLClassifier``: the scikit-learn estimator (binary, and one-vs-rest inside)."""

from __future__ import annotations

import json
import logging
import numbers
import os

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from . import _columns, mwu
from ._bank import BankKernelNames, BankProblem, bank_decision_function, bank_of
from ._exact import exact_column_sums, exact_to_float
from .checkpoint import Checkpointer, fingerprint, load_checkpoint
from .engines.local import LocalEngine
from .kernels import KernelSet, RandomGaussianBank
from .problem import FeatureProblem, PrecomputedProblem
from .shard import as_csr, plan_args
from .stores import KernelStore, as_store, merge_cache_stats

__all__ = ["MWUMKLClassifier"]

logger = logging.getLogger("mwumkl_dist")

#: ``epsilon="auto"`` when the exact polish follows (the MWU then only has to find the weights) ...
AUTO_EPS_POLISHED = 0.2
#: ... and when the MWU solution is the model (large data): at most 0.1 (2-6x more accurate than 0.2 on a9a /
#: cod-rna), and small enough for T >= AUTO_T_FRACTION * n iterations (see ``_auto_epsilon``).
AUTO_EPS = 0.1
AUTO_T_FRACTION = 0.2
#: ``C="auto"`` chooses the size-relative ``C`` from these ...
AUTO_C_GRID = (0.1, 1.0, 10.0, 100.0, 1000.0, 10000.0)
#: ... by cross-validation on a stratified subsample of at most this many training rows.
AUTO_C_POINTS = 4000
#: ``C="auto"`` for a fit from a kernel store (its rows are not sampled): suits large noisy data (a9a, cod-rna).
AUTO_C_STORE = 1.0

_FORMAT = "mwumkl_dist-model"
_FORMAT_VERSION = 1


def _bank_meta(bank: RandomGaussianBank) -> dict:
    return {"n_kernels": bank.n_kernels, "subset_size": bank.subset_size, "seed": bank.seed, "sigmas": bank.sigmas}


def _stratified_rows(y, size: int, seed: int) -> np.ndarray:
    """All row indices, or a stratified sample of ``size`` of them (sorted)."""
    if len(y) <= size:
        return np.arange(len(y))
    from sklearn.model_selection import train_test_split

    try:
        rows, _ = train_test_split(np.arange(len(y)), train_size=size, stratify=y, random_state=seed)
    except ValueError:  # a class with a single member cannot be stratified
        rows = np.random.default_rng(seed).choice(len(y), size=size, replace=False)
    return np.sort(rows)


def _store_sample(store, y, size: int, seed: int):
    """About ``size`` rows of a data store and their labels, read whole chunks at a time.

    Chunks are taken in a random order until they hold ``2 * size`` rows (all
    of them for a small store), so a store sorted by label still gives both
    classes; :func:`_stratified_rows` then thins the sample to ``size``.
    """
    ranges = store.row_ranges(-(-store.n_samples // store.chunk_rows))
    order = np.random.default_rng(seed).permutation(len(ranges))
    picked, total = [], 0
    for i in order:
        if total >= 2 * size:
            break
        picked.append(ranges[i])
        total += ranges[i][1] - ranges[i][0]
    picked.sort()
    blocks = [store.read_rows(a, b) for a, b in picked]
    X = sp.vstack(blocks, format="csr") if sp.issparse(blocks[0]) else np.concatenate(blocks)
    return X, np.concatenate([y[a:b] for a, b in picked])


class MWUMKLClassifier(ClassifierMixin, BaseEstimator):
    """Multiple kernel learning by matrix multiplicative weights (MWUMKL).

    Learns a convex combination of base kernels and a kernel classifier at
    once, with ``O(m n)`` memory and two kernel columns per kernel per
    iteration (Moeller et al., AISTATS 2014).  Two classes are solved
    directly; more classes one-vs-rest.

    Parameters
    ----------
    kernels : str, KernelSpec or list, default="paper"
        The base kernels.  A spec string such as ``"paper"`` (12 kernels on
        all features), ``"paper-per-feature"`` (12 per feature),
        ``"linear,poly:2,gaussian:2@0-4"`` or ``"random:1000:size=2:seed=0"``;
        kernel objects from :mod:`mwumkl_dist.kernels`; or ``"precomputed"``,
        where ``X`` is an ``(m, n_samples, n_train)`` array of kernel values.
    epsilon : float or "auto", default="auto"
        Approximation error; sets the iteration count
        ``T = ceil(8 rho^2 / epsilon^2 * ln n)``.  Must lie in ``(0, 2 rho)``.
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
    max_iter : int or None, default=None
        Run exactly this many iterations instead of ``T`` from ``epsilon``.
    scale_C : bool, default=True
        Whether ``C`` is relative to the training size (see ``C``).
    polish : {"auto", True, False}, default="auto"
        After the MWU iterations, re-solve the 2-norm soft-margin SVM exactly
        on all training points with the learned kernel weights (LIBSVM on the
        combined Gram matrix, see :mod:`mwumkl_dist.polish`): the same model,
        solved to optimality instead of to ``epsilon``.  It needs the
        ``n x n`` Gram matrix, so ``"auto"`` polishes only up to 3000
        training points and 1e9 kernel evaluations (and not for store data
        or ``C = inf``); ``True`` always does.  ``polish=False`` with
        ``scale_C=False`` is the paper's algorithm as published.
    engine : {"local", "dask"}, default="local"
        Where the shards live: in this process, or on Dask workers.
    client : distributed.Client, str or None, default=None
        With ``engine="dask"``: a client, a scheduler address
        (``"tcp://host:8786"``), or None for a local threaded cluster.
    n_shards : int, default=1
        Row shards (the result does not depend on the sharding).
    n_kernel_shards : int, default=1
        Kernel shards (``engine="dask"``): blocks of kernels over each row shard.
    checkpoint : path or None, default=None
        Write the driver state to this file every ``checkpoint_every``
        iterations; ``fit(..., resume=path)`` continues from it.
    checkpoint_every : int, default=100
        Iterations between checkpoints.
    scheduler_timeout : float, default=10.0
        Seconds to wait for a Dask scheduler before giving up with a clear error.
    callback : callable or None, default=None
        Called as ``callback(info)`` with a :class:`mwumkl_dist.mwu.ProgressInfo`
        every ``callback_every`` iterations; returning ``True`` stops the fit
        early, keeping the iterations done.
    callback_every : int, default=100
        Iterations between callback calls (and log lines when ``verbose``).
    verbose : int, default=0
        Log progress to the ``mwumkl_dist`` logger at INFO level.

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
        The base kernels, as spec strings.
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
        Only with ``C="auto"``: the cross-validated error of each candidate ``C``.
    polished_ : bool
        Whether the dual coefficients and biases come from the exact polish
        (see ``polish``) rather than from the MWU iterations alone.
    cache_info_ : dict
        Only after a fit from a :class:`~mwumkl_dist.stores.KernelStore`: the shards'
        column caches added up: ``hits``, ``misses``, ``hit_rate``, ``evictions``,
        ``bytes_read`` (bytes read from the store), ``cache_peak_bytes`` and
        ``cache_max_bytes`` (largest of one shard), ``n_shards``.
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

    def __init__(
        self,
        kernels="paper",
        epsilon="auto",
        C="auto",
        rho=0.5,
        max_iter=None,
        scale_C=True,
        engine="local",
        client=None,
        n_shards=1,
        n_kernel_shards=1,
        checkpoint=None,
        checkpoint_every=100,
        scheduler_timeout=10.0,
        callback=None,
        callback_every=100,
        verbose=0,
        polish="auto",
    ):
        self.kernels = kernels
        self.epsilon = epsilon
        self.C = C
        self.rho = rho
        self.max_iter = max_iter
        self.scale_C = scale_C
        self.engine = engine
        self.client = client
        self.n_shards = n_shards
        self.n_kernel_shards = n_kernel_shards
        self.checkpoint = checkpoint
        self.checkpoint_every = checkpoint_every
        self.scheduler_timeout = scheduler_timeout
        self.callback = callback
        self.callback_every = callback_every
        self.verbose = verbose
        self.polish = polish

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        # CSR input is supported (and never densified), except for precomputed kernels.
        tags.input_tags.sparse = not self._precomputed()
        return tags

    def __sklearn_is_fitted__(self):
        # A fit that failed half-way (e.g. one class) leaves classes_ behind but no model.
        return hasattr(self, "raw_kernel_weights_")

    # ------------------------------------------------------------------ validation

    def _precomputed(self) -> bool:
        return isinstance(self.kernels, str) and self.kernels.strip().lower() == "precomputed"

    def _check_params(self):
        def real(name, value, alternative=""):
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(f"{name} must be a real number{alternative}, got {value!r}")
            return float(value)

        rho = real("rho", self.rho)
        if not (np.isfinite(rho) and rho > 0):
            raise ValueError(f"rho must be positive and finite, got {self.rho!r}")
        if isinstance(self.epsilon, str) and self.epsilon == "auto":
            eps = None  # resolved in fit, once the polish regime is known
        else:
            eps = real("epsilon", self.epsilon, ' or "auto"')
            mwu.eps_prime(eps, rho)  # validates 0 < eps < 2 rho
        if isinstance(self.C, str) and self.C == "auto":
            C = None
        else:
            C = real("C", self.C, ' or "auto"')
            if not C > 0:
                raise ValueError(f"C must be positive (np.inf for the hard margin), got {self.C!r}")
        if self.max_iter is not None and (
            isinstance(self.max_iter, bool) or not isinstance(self.max_iter, numbers.Integral) or self.max_iter < 1
        ):
            raise ValueError(f"max_iter must be None or a positive integer, got {self.max_iter!r}")
        if self.engine not in ("local", "dask"):
            raise ValueError(f"engine must be 'local' or 'dask', got {self.engine!r}")
        if self.engine == "local" and self.n_kernel_shards != 1:
            raise ValueError("n_kernel_shards needs engine='dask' (the local engine shards rows only)")
        for name in ("n_shards", "n_kernel_shards", "callback_every", "checkpoint_every"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if self.callback is not None and not callable(self.callback):
            raise TypeError("callback must be callable or None")
        if not (self.polish is True or self.polish is False or self.polish == "auto"):
            raise ValueError(f"polish must be 'auto', True or False, got {self.polish!r}")
        if self.polish is True and C is not None and np.isinf(C):
            raise ValueError("polish=True is not available for the hard margin (C = inf): the hulls may intersect")
        return eps, C, rho

    def _validate_X_precomputed(self, X, reset: bool):
        if sp.issparse(X):
            raise TypeError("precomputed kernels must be a dense (m, n_samples, n_train) array")
        K = np.asarray(X, dtype=np.float64)
        if K.ndim != 3:
            raise ValueError(f"precomputed kernels must be a 3-d array (m, n_samples, n_train), got shape {K.shape}")
        if not np.all(np.isfinite(K)):
            raise ValueError("precomputed kernels contain NaN or infinity")
        if reset:
            if K.shape[1] != K.shape[2]:
                raise ValueError(f"training kernels must be (m, n, n), got shape {K.shape}")
            self.n_features_in_ = K.shape[2]
        else:
            if K.shape[0] != len(self.kernel_names_) or K.shape[2] != self.n_features_in_:
                raise ValueError(
                    f"precomputed kernels must have shape (m={len(self.kernel_names_)}, n_samples, "
                    f"n_train={self.n_features_in_}), got {K.shape}"
                )
        return K

    def _validate_X(self, X, reset: bool):
        if self._precomputed():
            return self._validate_X_precomputed(X, reset)
        return validate_data(self, X, accept_sparse="csr", dtype=np.float64, ensure_all_finite=True, reset=reset)

    # ------------------------------------------------------------------ fit

    def fit(self, X, y=None, resume=None):
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
        resume : path or None
            A checkpoint written by an earlier fit on the same data with the same
            settings (see ``checkpoint``): the fit continues from it and ends with
            the same model as an uninterrupted fit.

        Returns
        -------
        self : MWUMKLClassifier
        """
        eps, C, rho = self._check_params()
        # A failed refit must not leave the old model next to new classes_.
        for name in [a for a in vars(self) if a.endswith("_") and not a.startswith("_")]:
            delattr(self, name)
        store = as_store(X)
        if store is not None:
            if self.polish is True:
                raise ValueError("polish=True is not available for a fit from a store (the data are not in memory)")
            y = self._validate_store(store, y)
        elif self._precomputed():
            K = self._validate_X(X, reset=True)
            y = np.asarray(y)
            if y.ndim != 1 or len(y) != K.shape[1]:
                raise ValueError(f"y must be 1-d with {K.shape[1]} labels, got shape {y.shape}")
        else:
            X, y = validate_data(
                self, X, y, accept_sparse="csr", dtype=np.float64, ensure_all_finite=True, y_numeric=False
            )
        check_classification_targets(y)
        self.classes_ = np.unique(y)
        if len(self.classes_) < 2:
            raise ValueError(
                f"the training labels hold one class only ({self.classes_[0]!r}); MWUMKL needs at least two"
            )
        n = len(y)

        if store is not None:
            self.kernel_names_, traces, make_problem = store.problem_setup(self.kernels)
        elif self._precomputed():
            self.kernel_names_ = [f"precomputed[{i}]" for i in range(K.shape[0])]
            # Exactly rounded, as a kernel store's traces: the same model from memory or from a store.
            traces = exact_to_float(exact_column_sums(np.diagonal(K, axis1=1, axis2=2).T))
            make_problem = lambda y_pm: PrecomputedProblem(K, y_pm)  # noqa: E731
        elif (bank := bank_of(self.kernels)) is not None and (not sp.issparse(X) or X.shape[0] * X.shape[1] <= 2**27):
            # A bank alone: flat per-kernel tables instead of m Gaussian specs (see mwumkl_dist._bank);
            # its shards hold dense rows, so very large sparse data keeps the generic path.
            self.kernel_names_ = BankKernelNames(bank, X.shape[1])
            traces = np.full(bank.n_kernels, float(X.shape[0]))  # K_i(x, x) = 1 exactly: every trace is n
            make_problem = lambda y_pm: BankProblem(X, y_pm, bank)  # noqa: E731
        else:
            kernel_set = KernelSet(self.kernels, X.shape[1])
            self.kernel_names_ = kernel_set.names()
            Xc = as_csr(X)
            traces = None
            make_problem = lambda y_pm: FeatureProblem(Xc, y_pm, kernel_set)  # noqa: E731
        if eps is None:
            eps = self._auto_epsilon(n, len(self.kernel_names_), store, C)
            mwu.eps_prime(eps, rho)  # e.g. rho < 0.1 leaves no room for the automatic value
        self.epsilon_ = eps
        n_iter = self.max_iter if self.max_iter is not None else mwu.iteration_count(eps, rho, n)
        # Reach the cluster first: an unreachable scheduler fails fast, before any cross-validation.
        client, owns_client = None, False
        if self.engine == "dask":
            from .engines.dask import connect_client

            client, owns_client = connect_client(self.client, timeout=self.scheduler_timeout)
        try:
            if C is None:  # C="auto": chosen by cross-validation on the training data (see _auto_C)
                C = self._auto_C(X, y, store)
                self.C_ = C if self.scale_C else C * n
                ridge = 1.0 / (C * n)
            else:
                self.C_ = C
                ridge = 0.0 if np.isinf(C) else 1.0 / (C * n if self.scale_C else C)
        except BaseException:
            if owns_client:
                client.close()
            raise

        binary = len(self.classes_) == 2
        targets = [self.classes_[1]] if binary else list(self.classes_)
        results: list[mwu.MWUResult] = []
        resumed = None
        fp = None
        if self.checkpoint is not None or resume is not None:
            fp = fingerprint(
                store.content_id() if store is not None else K if self._precomputed() else X,
                y,
                self.kernel_names_,
                {
                    "eps": eps,
                    "rho": rho,
                    "ridge": ridge,
                    "n_iter": n_iter,
                    "classes": self.classes_.tolist(),
                },
            )
        if resume is not None:
            resumed = load_checkpoint(resume, fp)
            results = list(resumed["finished"])
        cache_stats: list[dict] = []
        try:
            for k in range(len(results), len(targets)):
                y_pm = np.where(y == targets[k], 1.0, -1.0)
                problem = make_problem(y_pm)
                engine = self._make_engine(problem, client)
                try:
                    if traces is None:
                        traces = engine.traces()
                        self._check_traces(traces)
                    inv_trace = 1.0 / traces
                    engine.configure(inv_trace, ridge)
                    state = None
                    if resumed is not None and resumed["problem_index"] == k:
                        state = self._resume_state(resumed, problem, engine)
                    on_state = None
                    if self.checkpoint is not None:
                        on_state = Checkpointer(self.checkpoint, self.checkpoint_every, fp, k, results)
                    result = mwu.solve(
                        engine,
                        inv_trace=inv_trace,
                        ridge=ridge,
                        epsilon=eps,
                        rho=rho,
                        n_iter=n_iter,
                        callback=self._progress_callback(k, len(targets)),
                        callback_every=self.callback_every,
                        state=state,
                        on_state=on_state,
                    )
                    if store is not None and hasattr(engine, "stats"):
                        cache_stats.extend(engine.stats())
                finally:
                    if hasattr(engine, "close"):
                        engine.close()
                results.append(result)
                if result.interrupted:
                    break  # keep what was computed; the remaining classes are not fitted
        finally:
            if owns_client:
                client.close()
        if len(results) < len(targets):
            how = (
                f"resume it with fit(..., resume={self.checkpoint!r})"
                if self.checkpoint is not None
                else "refit with checkpoint=PATH to be able to resume"
            )
            raise mwu.FitInterrupted(
                f"the fit was interrupted after {len(results)} of {len(targets)} one-vs-rest problems; {how}"
            )
        self.kernel_traces_ = np.asarray(traces, dtype=np.float64)
        cache_info = merge_cache_stats(cache_stats)
        if cache_info is not None:
            self.cache_info_ = cache_info
        self._set_model(results, y, targets, X)
        self._polish(X, y, targets, ridge, store)
        return self

    def _will_polish(self, n: int, m: int, store, C) -> bool:
        """Whether the fit ends with the exact polish (see ``polish``)."""
        from . import polish as _polish

        if self.polish is False or store is not None or (C is not None and np.isinf(C)):
            return False
        return self.polish is True or _polish.polish_budget_ok(n, m)

    def _auto_epsilon(self, n: int, m: int, store, C) -> float:
        """``epsilon="auto"``: :data:`AUTO_EPS_POLISHED` when the polish re-solves the SVM; else the largest
        ``epsilon <= AUTO_EPS`` that gives ``T >= AUTO_T_FRACTION * n`` iterations.

        Without the polish the MWU dual is the model, and on noisy data it is only
        good once the iterations have placed weight on a good part of the points:
        on Adult (39073 points, 3 kernels, C=1) ``T = 0.05 n`` gives 34 % test error,
        ``0.11 n`` 21 % and ``0.22 n`` 14.6 %, while a fixed ``epsilon`` gives
        ``T ~ ln n``.  The rule costs ``O(n)`` iterations (``O(m n^2)`` time);
        pass an ``epsilon`` for a faster, rougher fit.
        """
        rho = float(self.rho)
        if self._will_polish(n, m, store, C):
            return min(AUTO_EPS_POLISHED, rho)
        # T = 8 rho^2 / eps^2 ln n >= f n  <=>  eps <= sqrt(8 rho^2 ln n / (f n)).
        by_size = np.sqrt(8.0 * rho**2 * np.log(max(n, 2)) / (AUTO_T_FRACTION * max(n, 2)))
        return float(min(AUTO_EPS, by_size, rho))

    def _auto_C(self, X, y, store):
        """``C="auto"``: the size-relative ``C`` of :data:`AUTO_C_GRID` with the best cross-validated error.

        Each candidate is scored by stratified 3-fold cross-validation of this
        very estimator (same kernels, ``epsilon`` and ``rho``) on the
        training rows, at most :data:`AUTO_C_POINTS` of them, with the polish
        on or off as the final fit will have it: the candidates are judged in
        the regime they will be used in.  Ties go to the smaller ``C``.
        """
        n = len(y)
        m = len(self.kernel_names_)
        polished = self._will_polish(n, m, store, None)
        if isinstance(store, KernelStore):
            self.C_path_ = {}
            return AUTO_C_STORE  # (m, r, r) blocks of scattered rows: not read (see the ``C`` docstring)
        if store is not None:  # a data store: cross-validate on a sample of its rows, read into memory
            X, y = _store_sample(store, y, AUTO_C_POINTS, seed=0)
        rows = _stratified_rows(y, AUTO_C_POINTS, seed=0)
        ys = y[rows]
        n_folds = int(min(3, np.unique(ys, return_counts=True)[1].min()))
        if n_folds < 2:
            self.C_path_ = {}
            return AUTO_C_GRID[len(AUTO_C_GRID) // 2]
        from sklearn.model_selection import StratifiedKFold

        folds = list(StratifiedKFold(n_folds, shuffle=True, random_state=0).split(rows, ys))
        params = {
            **self.get_params(),
            "polish": polished,
            "scale_C": True,
            "engine": "local",
            "n_shards": 1,
            "n_kernel_shards": 1,
            "checkpoint": None,
            "callback": None,
            "verbose": 0,
        }
        # A kernel that is zero on a fold's training rows (a feature seen in a few rows only) is left
        # out of that fold's fits: it carries nothing there, and its zero trace would stop the fit.
        self._kernels_with_trace(X, np.arange(len(y)), check=True)  # a kernel zero on all the data: say so now
        fold_kernels = [self._kernels_with_trace(X, rows[a]) for a, _ in folds]
        errors = np.zeros(len(AUTO_C_GRID))
        for c, C in enumerate(AUTO_C_GRID):
            for (a, b), kept in zip(folds, fold_kernels):
                train, test = rows[a], rows[b]
                if self._precomputed():
                    fold = type(self)(**{**params, "C": C})
                    fold.fit(X[np.ix_(kept, train, train)], y[train])
                    pred = fold.predict(X[np.ix_(kept, test, train)])
                else:
                    fold = type(self)(**{**params, "C": C, "kernels": kept})
                    fold.fit(X[train], y[train])
                    pred = fold.predict(X[test])
                if fold.interrupted_:  # Ctrl-C inside a fold: a half-run fold must not score a candidate
                    raise mwu.FitInterrupted("interrupted while choosing C by cross-validation; nothing was fitted")
                errors[c] += np.mean(pred != y[test]) / len(folds)
            if self.verbose:
                logger.info("C=auto: C=%g cross-validated error %.4f", C, errors[c])
        self.C_path_ = dict(zip(AUTO_C_GRID, errors.tolist()))
        return float(AUTO_C_GRID[int(np.flatnonzero(errors <= errors.min() + 1e-12)[0])])

    def _kernels_with_trace(self, X, rows, check: bool = False):
        """The kernels (as ``kernels`` accepts them; indices for precomputed ones) not all zero on ``rows``.

        ``check``: raise the fit's own error instead when a kernel has a zero trace there.
        """
        if self._precomputed():
            traces = np.diagonal(X, axis1=1, axis2=2)[:, rows].sum(axis=1)  # a view: no (m, n, n) copy
            if check:
                self._check_traces(traces)
            return np.flatnonzero(traces > 0)
        if bank_of(self.kernels) is not None:
            return self.kernels  # Gaussians: K(x, x) = 1, never a zero trace
        from .polish import kernel_traces

        kernel_set = KernelSet(self.kernels, X.shape[1])
        traces = kernel_traces(kernel_set, X[rows])
        if check:
            self._check_traces(traces)
        if np.all(traces > 0):
            return self.kernels
        return [spec for spec, r in zip(kernel_set.specs, traces) if r > 0]

    def _polish(self, X, y, targets, ridge, store):
        """Re-solve each binary problem exactly on all points with the learned weights (see ``polish``).

        The exact solution replaces ``dual_coef_``, ``intercept_`` and the support set.
        """
        from . import polish as _polish

        self.polished_ = False
        if self.polish is False or self.interrupted_:
            return
        blocker = None
        if store is not None:
            blocker = "a fit from a store (the data are not in memory)"
        elif ridge == 0.0:
            blocker = "the hard margin (C = inf): the hulls may intersect"
        if blocker is not None:
            if self.polish is True:
                raise ValueError(f"polish=True is not available for {blocker}")
            return
        weights = np.atleast_2d(self.raw_kernel_weights_)
        n, m = len(y), weights.shape[1]
        # All points, never the MWU support set alone: on noisy data (cod-rna) the support set is the
        # overlap of the classes, and the exact solution on it alone has a useless bias (62 % error).
        if self.polish == "auto" and not _polish.polish_budget_ok(n, m):
            return
        rows_per_problem = [np.arange(n)] * len(targets)
        if self._precomputed():
            K = np.asarray(X, dtype=np.float64)

            def gram(rows, w):
                return np.einsum("i,ijk->jk", w, K[:, rows][:, :, rows])
        else:
            kernel_set = KernelSet(self.kernels, self.n_features_in_)
            Xc = as_csr(X)

            def gram(rows, w):
                Xr = Xc[rows]
                return _polish.combined_kernel(kernel_set, Xr, Xr, w)

        coef = np.zeros((len(targets), n))
        for k, rows in enumerate(rows_per_problem):
            y_pm = np.where(y[rows] == targets[k], 1.0, -1.0)
            alpha, b = _polish.solve_l2_svm(gram(rows, weights[k]), y_pm, ridge)
            coef[k, rows] = alpha * y_pm
            self.intercept_[k] = b
        self.support_ = np.flatnonzero((coef != 0.0).any(axis=0))
        self.dual_coef_ = coef[:, self.support_]
        if not self._precomputed():
            self.support_vectors_ = X[self.support_]
        self.polished_ = True

    def _validate_store(self, store, y):
        """The labels of a store fit; checks that the store kind matches ``kernels``."""
        if isinstance(store, KernelStore) and not self._precomputed():
            raise ValueError(f"{store.path}: a kernel store needs kernels='precomputed'")
        if self._precomputed() and not isinstance(store, KernelStore):
            raise ValueError(f"{store.path}: kernels='precomputed' needs a kernel store, not a data store")
        y = store.training_labels(y)
        self.n_features_in_ = store.n_samples if self._precomputed() else store.n_features
        return y

    def _make_engine(self, problem, client):
        if self.engine == "local":
            return LocalEngine(problem, n_shards=self.n_shards)
        from .engines.dask import DaskEngine

        return DaskEngine(problem, client, n_shards=self.n_shards, n_kernel_shards=self.n_kernel_shards)

    @staticmethod
    def _resume_state(resumed, problem, engine) -> mwu.SolverState:
        engine.replay(resumed["picks"])
        (pi, pg, pv), (ni, ng, nv) = resumed["pos"], resumed["neg"]
        return mwu.SolverState(
            resumed["iteration"],
            resumed["s"],
            mwu.Candidate(pi, pg, pv, problem.point(pi)),
            mwu.Candidate(ni, ng, nv, problem.point(ni)),
            resumed["picks"],
        )

    def _check_traces(self, traces):
        bad = np.flatnonzero(~(np.isfinite(traces) & (traces > 0)))
        if len(bad):
            names = ", ".join(self.kernel_names_[i] for i in bad[:5])
            raise ValueError(
                f"kernel(s) {names} have zero or non-finite trace on the training data "
                "(e.g. a linear kernel on all-zero features); drop them"
            )

    def _progress_callback(self, k, n_problems):
        if self.callback is None and not self.verbose:
            return None

        def report(info):
            if self.verbose:
                logger.info(
                    "problem %d/%d: iteration %d/%d, %.1f it/s",
                    k + 1,
                    n_problems,
                    info.iteration,
                    info.n_iter,
                    info.iteration / max(info.elapsed, 1e-12),
                )
            if self.callback is not None:
                return self.callback(info)
            return None

        return report

    def _set_model(self, results, y, targets, X):
        alphas = np.vstack([r.alpha for r in results])
        self.support_ = np.flatnonzero((alphas > 0).any(axis=0))
        signs = np.vstack([np.where(y == t, 1.0, -1.0) for t in targets])
        self.dual_coef_ = (alphas * signs)[:, self.support_]
        self.intercept_ = np.array([r.bias for r in results])
        weights = np.vstack([r.kernel_weights for r in results])
        n_iter = np.array([r.n_iter for r in results])
        self.interrupted_ = any(r.interrupted for r in results)
        if len(targets) == 1:
            weights, n_iter = weights[0], int(n_iter[0])
        self.kernel_weights_ = weights
        self.raw_kernel_weights_ = weights / self.kernel_traces_
        self.n_iter_ = n_iter
        if self._precomputed():
            self.support_vectors_ = None
        else:
            Xs = X.take_rows(self.support_) if hasattr(X, "take_rows") else X[self.support_]
            self.support_vectors_ = Xs

    # ------------------------------------------------------------------ predict

    def decision_function(self, X):
        """Signed distance to the separating hyperplane of each binary problem.

        ``X`` may also be a :class:`~mwumkl_dist.stores.DataStore`, read one chunk of rows at a time.

        Returns
        -------
        ndarray of shape (n_samples,) for two classes, else (n_samples, n_classes)
        """
        check_is_fitted(self)
        store = as_store(X)
        if store is not None:
            if isinstance(store, KernelStore):
                raise TypeError(f"{store.path}: predict from precomputed test kernels (m, n_samples, n_train)")
            blocks = store.row_ranges(-(-store.n_samples // store.chunk_rows))
            return np.concatenate([self.decision_function(store.read_rows(a, b)) for a, b in blocks])
        X = self._validate_X(X, reset=False)
        weights = np.atleast_2d(self.raw_kernel_weights_)
        if self._precomputed():
            Ksv = X[:, :, self.support_]  # (m, n_samples, n_SV)
            out = np.einsum("ktj,oj,ok->to", Ksv, self.dual_coef_, weights, optimize=True)
        elif isinstance(self.kernel_names_, BankKernelNames):
            out = bank_decision_function(X, self.support_vectors_, self.dual_coef_, weights, self.kernel_names_.bank)
        else:
            ks = KernelSet(self.kernel_names_, self.n_features_in_)
            plan = ks.plan
            Xq = as_csr(X)
            sv = as_csr(self.support_vectors_)
            sv_sq = _columns.group_sqnorms(
                sv.indptr, sv.indices, sv.data, plan.feat_ptr, plan.feat_groups, plan.n_groups
            )
            out = _columns.weighted_kernel_sums(
                Xq.indptr,
                Xq.indices,
                Xq.data,
                self.n_features_in_,
                sv.indptr,
                sv.indices,
                sv.data,
                sv_sq,
                np.ascontiguousarray(self.dual_coef_),
                np.ascontiguousarray(weights),
                *plan_args(plan),
            )
        out = out + self.intercept_[None, :]
        return out[:, 0] if out.shape[1] == 1 else out

    def predict(self, X):
        """Predicted class labels for ``X``."""
        scores = self.decision_function(X)
        if scores.ndim == 1:
            return self.classes_[(scores > 0).astype(int)]
        return self.classes_[np.argmax(scores, axis=1)]

    # ------------------------------------------------------------------ portable save/load

    _ARRAYS = (
        "classes_",
        "kernel_weights_",
        "raw_kernel_weights_",
        "kernel_traces_",
        "support_",
        "dual_coef_",
        "intercept_",
    )

    def save(self, path) -> None:
        """Save the fitted model to ``path`` (a ``.npz`` file; no pickle needed to load).

        Callables (``callback``) are not saved.
        """
        check_is_fitted(self)
        from . import __version__

        params = {k: v for k, v in self.get_params().items() if k not in ("callback", "client")}
        bank = self.kernel_names_.bank if isinstance(self.kernel_names_, BankKernelNames) else None
        if not isinstance(params["kernels"], str):
            params["kernels"] = str(bank) if bank is not None else ",".join(self.kernel_names_)
        for k in ("C", "epsilon", "rho"):
            if params[k] != "auto":
                params[k] = float(params[k])
        meta = {
            "format": _FORMAT,
            "format_version": _FORMAT_VERSION,
            "package_version": __version__,
            "params": {k: (None if (isinstance(v, float) and np.isinf(v)) else v) for k, v in params.items()},
            "C_is_inf": self.C != "auto" and bool(np.isinf(float(self.C))),
            "kernel_names": None if bank is not None else self.kernel_names_,
            "kernel_bank": None if bank is None else _bank_meta(bank),
            "n_features_in": int(self.n_features_in_),
            "n_iter": np.asarray(self.n_iter_).tolist(),
            "interrupted": bool(self.interrupted_),
            "polished": bool(getattr(self, "polished_", False)),
            "C_": None if np.isinf(self.C_) else float(self.C_),
            "epsilon_": float(self.epsilon_),
            "feature_names_in": list(map(str, getattr(self, "feature_names_in_", []))) or None,
        }
        arrays = {}
        for name in self._ARRAYS:
            arr = np.asarray(getattr(self, name))
            if arr.dtype.kind == "O":
                arr = arr.astype(str)
            arrays[name] = arr
        sv = self.support_vectors_
        if sv is not None:
            if sp.issparse(sv):
                sv = sv.tocsr()
                arrays.update(sv_data=sv.data, sv_indices=sv.indices, sv_indptr=sv.indptr)
                meta["sv_sparse"] = True
            else:
                arrays["sv_dense"] = np.asarray(sv)
                meta["sv_sparse"] = False
        meta_arr = np.array(json.dumps(meta))
        with open(os.fspath(path), "wb") as fh:
            np.savez_compressed(fh, __meta__=meta_arr, **arrays)

    @classmethod
    def load(cls, path) -> MWUMKLClassifier:
        """Load a model written by :meth:`save`."""
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"model file not found: {path}")
        try:
            data = np.load(path, allow_pickle=False)
        except Exception as exc:  # zip/format errors
            raise ValueError(f"{path}: not a mwumkl_dist model file ({exc})") from None
        with data:
            if "__meta__" not in data.files:
                raise ValueError(f"{path}: not a mwumkl_dist model file (no metadata)")
            meta = json.loads(str(data["__meta__"]))
            if meta.get("format") != _FORMAT:
                raise ValueError(f"{path}: not a mwumkl_dist model file")
            if meta.get("format_version", 0) > _FORMAT_VERSION:
                raise ValueError(
                    f"{path}: model format version {meta['format_version']} is newer than this "
                    f"package supports ({_FORMAT_VERSION}); upgrade mwumkl_dist"
                )
            params = dict(meta["params"])
            if meta.get("C_is_inf"):
                params["C"] = np.inf
            est = cls(**params)
            for name in cls._ARRAYS:
                setattr(est, name, data[name])
            if meta.get("kernel_bank"):
                kb = meta["kernel_bank"]
                est.kernel_names_ = BankKernelNames(
                    RandomGaussianBank(kb["n_kernels"], kb["subset_size"], kb["seed"], tuple(kb["sigmas"])),
                    meta["n_features_in"],
                )
            else:
                est.kernel_names_ = list(meta["kernel_names"])
            est.n_features_in_ = meta["n_features_in"]
            n_iter = meta["n_iter"]
            est.n_iter_ = n_iter if isinstance(n_iter, int) else np.asarray(n_iter)
            est.interrupted_ = meta["interrupted"]
            est.polished_ = bool(meta.get("polished", False))
            if "epsilon_" in meta:
                est.C_ = np.inf if meta["C_"] is None else float(meta["C_"])
                est.epsilon_ = float(meta["epsilon_"])
            if meta.get("feature_names_in"):
                est.feature_names_in_ = np.asarray(meta["feature_names_in"], dtype=object)
            if "sv_sparse" not in meta:
                est.support_vectors_ = None
            elif meta["sv_sparse"]:
                shape = (len(data["sv_indptr"]) - 1, est.n_features_in_)
                est.support_vectors_ = sp.csr_matrix(
                    (data["sv_data"], data["sv_indices"], data["sv_indptr"]), shape=shape
                )
            else:
                est.support_vectors_ = data["sv_dense"]
        return est
