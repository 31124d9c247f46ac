"""One input abstraction: every kind of training data behind the same two protocols.

* :class:`Problem`: one binary (+1 / -1) problem, what the engines need: row
  and kernel ranges, a picklable shard factory, the kernel values of two
  picked points, and a point by index.
* :class:`TrainingInput`: a labelled training set of one kind, what the fit
  driver and the automatic choices need: kernel names, traces (when known up
  front), :meth:`~TrainingInput.binary` for each one-vs-rest target, support
  vectors, the Gram matrix for the exact polish, and the cross-validation data
  for ``C="auto"``.

:func:`make_training_input` decides the kind once (arrays with a kernel set,
precomputed kernels, a data store, a kernel store; a random bank is a kernel set
whose plan is built from the bank's tables);
:func:`make_predictor` does the same for ``decision_function`` from what a
saved model keeps (kernel names, the bank, ``n_features_in_``), so prediction
works after :func:`mwumkl_dist.io.model_files.load_model` without training data.
Nothing above this module branches on the kind of input.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

import numpy as np
import scipy.sparse as sp
from sklearn.utils.validation import check_X_y, validate_data

from mwumkl_dist.core.exact import exact_column_sums, exact_to_float
from mwumkl_dist.core.partition import chain_safe_ranges, split_rows
from mwumkl_dist.data.backends import backend_named
from mwumkl_dist.data.shards import FeatureShard, PrecomputedShard
from mwumkl_dist.data.store_problems import DataStoreProblem, KernelStoreProblem
from mwumkl_dist.data.weights import check_sample_weight
from mwumkl_dist.io.zarr_format import DataStore, KernelStore, as_store
from mwumkl_dist.kernels.evaluation import (
    SparsePoint,
    as_csr,
    combined_kernel,
    data_scale,
    kernel_traces,
    point_kernel_block,
    scale_sample_rows,
    support_vector_sums,
)
from mwumkl_dist.kernels.feature_scale import apply_feature_scale, learn_feature_scale
from mwumkl_dist.kernels.specs import BankKernelNames, DataScale, KernelSet

__all__ = [
    "Problem",
    "TrainingInput",
    "Predictor",
    "FeatureProblem",
    "PrecomputedProblem",
    "FeatureInput",
    "PrecomputedInput",
    "DataStoreInput",
    "KernelStoreInput",
    "make_training_input",
    "read_into_memory",
    "STORE_IN_MEMORY_BYTES",
    "make_predictor",
    "prediction_blocks",
    "is_precomputed",
    "check_traces",
    "chain_safe_ranges",
]

# ----------------------------------------------------------------------------- protocols


class Problem(Protocol):
    """A binary training problem: labels ``y`` (+1 / -1) and kernels, cut into shards by the engines.

    Every input kind implements it (:class:`FeatureProblem`, :class:`PrecomputedProblem`,
    :class:`~mwumkl_dist.stores.DataStoreProblem`,
    :class:`~mwumkl_dist.stores.KernelStoreProblem`).
    """

    y: np.ndarray
    n_samples: int
    n_kernels: int

    def row_ranges(self, n_shards: int) -> list[tuple[int, int]]:
        """Row shards ``[(start, stop), ...]`` (a store's follow its chunks)."""

    def kernel_ranges(self, n_blocks: int) -> list[tuple[int, int]]:
        """Kernel blocks ``[(k0, k1), ...]`` that evaluate each kernel as the whole set does."""

    def shard_factory(self, start: int, stop: int, kernels: tuple[int, int] | None = None) -> Callable[[], object]:
        """A picklable zero-argument callable building the shard of rows ``[start, stop)`` (where it runs)."""

    def make_shard(self, start: int, stop: int, kernels: tuple[int, int] | None = None):
        """The shard itself, built here."""

    def kernel_block(self, p, q) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Raw ``K_i(p, p)``, ``K_i(q, q)``, ``K_i(p, q)`` of two picked points, for every kernel."""

    def point(self, j: int):
        """What a superstep needs of row ``j``: its features (a ``SparsePoint``), or its index (precomputed kernels)."""


class TrainingInput(Protocol):
    """A labelled training set of one kind; built by :func:`make_training_input`.

    Attributes
    ----------
    y : ndarray of shape (n_samples,)
        The labels as given (any classes).
    n_samples : int
    n_features_in : int
        What ``n_features_in_`` records (features; ``n_train`` for precomputed kernels).
    kernel_names : sequence of str
    traces : ndarray of shape (n_kernels,) or None
        The kernels' traces when known without a pass over the data; None: the
        engine's shards add them up (exactly, so the sharding does not matter).
    polish_blocker : str or None
        Why the exact polish cannot run on this input (None: it can).
    kernel_set : KernelSet or None
        The kernels of feature rows (in memory or in a data store); None for precomputed kernels.
    feature_scale : tuple of two ndarrays of shape (n_features,), or None
        ``(factors, offsets)``: the rows are ``X * factors + offsets`` (``make_training_input(scale_features=True)``,
        :mod:`mwumkl_dist.kernels.feature_scale`); None: as given.
    """

    y: np.ndarray
    n_samples: int
    n_features_in: int
    kernel_names: Sequence[str]
    traces: np.ndarray | None
    polish_blocker: str | None
    kernel_set: KernelSet | None
    feature_scale: tuple[np.ndarray, np.ndarray] | None

    def binary(self, y_pm: np.ndarray) -> Problem:
        """The binary problem with labels ``y_pm`` (+1 / -1, one per row)."""

    def fingerprint_data(self):
        """An array (or CSR matrix) identifying the data, for checkpoint fingerprints."""

    def support_vectors(self, indices: np.ndarray):
        """The rows at ``indices`` as a model keeps them (None for precomputed kernels)."""

    def combined_gram(self, weights: np.ndarray) -> np.ndarray:
        """``sum_i weights[i] K_i`` on all training points, ``(n, n)`` (only without a polish blocker)."""

    def cross_validation_input(self, size: int, seed: int) -> TrainingInput | None:
        """In-memory data to cross-validate ``C`` on (about ``2 * size`` rows of a store), or None."""

    def kernels_with_trace(self, rows: np.ndarray, check: bool = False):
        """The kernels not all zero on ``rows``, as ``fold_data`` takes them (in-memory inputs)."""

    def fold_data(self, kept, train: np.ndarray, test: np.ndarray) -> tuple[object, object, dict]:
        """``(X_train, X_test, params)`` of one cross-validation fold (in-memory inputs)."""

    def rows_in_memory(self, rows: np.ndarray) -> TrainingInput:
        """The input of the training points ``rows``, in memory (a data store's are read; a kernel store raises)."""

    def scoring_rows(self, rows: np.ndarray, support: np.ndarray):
        """``(X, support)`` for the predictor's decision values of training ``rows`` (None: not readable)."""

    def with_kernels(self, kernels) -> TrainingInput:
        """The same rows with ``kernels`` (closed-form kernel specs; feature inputs only)."""

    def data_scale(self) -> DataScale:
        """The rows' :class:`~mwumkl_dist.kernels.specs.DataScale` (feature inputs only; computed once)."""

    def kernel_traces(self) -> np.ndarray:
        """Every kernel's trace ``sum_j K_i(x_j, x_j)`` on the training rows (feature inputs only)."""

    def subset(self, rows: np.ndarray) -> TrainingInput:
        """The same input on the training points ``rows`` only (sorted; e.g. those of non-zero sample weight).

        ``n_features_in`` stays (precomputed kernels keep their ``n_train``
        columns); a store raises ``ValueError`` (its rows are not in memory).
        """


class Predictor(Protocol):
    """The decision values of a fitted model; built by :func:`make_predictor`."""

    def check_input(self, estimator, X):
        """``X`` validated for prediction (feature count and names, or kernel shape)."""

    def decision_values(self, X, support, support_vectors, dual_coef, raw_weights) -> np.ndarray:
        """``sum_j dual_coef[o, j] sum_i raw_weights[o, i] K_i(x, x_j)`` over the support ``j``, ``(n_samples, n_out)``.

        ``support`` holds the support vectors' training indices (precomputed kernels
        pick those columns), ``support_vectors`` their rows (feature data).
        """


def is_precomputed(kernels) -> bool:
    """Whether ``kernels`` (an estimator's parameter) is ``"precomputed"``."""
    return isinstance(kernels, str) and kernels.strip().lower() == "precomputed"


def check_traces(traces: np.ndarray, kernel_names: Sequence[str]) -> None:
    """Raise when a kernel's trace on the training data is zero or not finite (it would divide by it)."""
    bad = np.flatnonzero(~(np.isfinite(traces) & (traces > 0)))
    if len(bad):
        names = ", ".join(kernel_names[int(i)] for i in bad[:5])
        raise ValueError(
            f"kernel(s) {names} have zero or non-finite trace on the training data "
            "(e.g. a linear kernel on all-zero features); drop them"
        )


# ----------------------------------------------------------------------------- in-memory problems


class FeatureProblem:
    """Feature rows ``X`` (dense or CSR) with a :class:`KernelSet` computed on the fly.

    A random bank is a kernel set too: its plan (and a kernel block's) is built
    from the bank's tables and pickles as the bank, so a Dask worker rebuilds
    it instead of receiving ``O(m)`` arrays.
    """

    def __init__(self, X, y, kernel_set: KernelSet):
        self.X = as_csr(X)
        self.y = np.asarray(y, dtype=np.float64)
        self.kernel_set = kernel_set
        self.n_samples = self.X.shape[0]
        self.n_kernels = len(kernel_set)

    def _plan(self, kernels):
        if kernels is None:
            return self.kernel_set.plan
        return self.kernel_set.block_plan(kernels[0], kernels[1])

    def shard_factory(self, start: int, stop: int, kernels: tuple[int, int] | None = None):
        """Rows ``[start, stop)`` for all kernels, or for the kernel block ``kernels = (k0, k1)``."""
        return functools.partial(FeatureShard, self.X[start:stop], self.y[start:stop], start, self._plan(kernels))

    def make_shard(self, start: int, stop: int, kernels: tuple[int, int] | None = None) -> FeatureShard:
        return self.shard_factory(start, stop, kernels)()

    def row_ranges(self, n_shards: int) -> list[tuple[int, int]]:
        return split_rows(self.n_samples, n_shards)

    def kernel_ranges(self, n_blocks: int) -> list[tuple[int, int]]:
        return chain_safe_ranges(self.kernel_set.plan.square_of, n_blocks)

    def kernel_block(self, p, q):
        return point_kernel_block(self.kernel_set.plan, p, q)

    def point(self, j: int) -> SparsePoint:
        """Row ``j`` as a :class:`SparsePoint` (what a superstep sends for a picked row)."""
        return SparsePoint.from_csr_row(self.X, j)


class PrecomputedProblem:
    """Precomputed kernel matrices ``K`` of shape ``(m, n, n)``."""

    def __init__(self, K, y):
        self.K = K
        self.y = np.asarray(y, dtype=np.float64)
        self.n_kernels, self.n_samples = K.shape[0], K.shape[1]

    def shard_factory(self, start: int, stop: int, kernels: tuple[int, int] | None = None):
        k0, k1 = (0, self.n_kernels) if kernels is None else kernels
        return functools.partial(PrecomputedShard, self.K[k0:k1, start:stop, :], self.y[start:stop], start)

    def make_shard(self, start: int, stop: int, kernels: tuple[int, int] | None = None) -> PrecomputedShard:
        return self.shard_factory(start, stop, kernels)()

    def row_ranges(self, n_shards: int) -> list[tuple[int, int]]:
        return split_rows(self.n_samples, n_shards)

    def kernel_ranges(self, n_blocks: int) -> list[tuple[int, int]]:
        return chain_safe_ranges(self.n_kernels, n_blocks)

    def kernel_block(self, p, q):
        p, q = int(p), int(q)
        K = self.K
        return np.asarray(K[:, p, p]), np.asarray(K[:, q, q]), np.asarray(K[:, p, q])

    def point(self, j: int) -> int:
        return int(j)


# ----------------------------------------------------------------------------- training inputs


class _FeatureData:
    """What the in-memory feature inputs share: rows ``X`` (dense or CSR) and their labels."""

    polish_blocker = None
    feature_scale = None

    def __init__(self, X, y, kernels):
        self.X = X
        self.y = y
        self.kernels = kernels  # the estimator's parameter, as given
        self.n_samples, self.n_features_in = X.shape

    def fingerprint_data(self):
        return self.X

    def support_vectors(self, indices):
        return self.X[indices]

    def combined_gram(self, weights):
        Xc = as_csr(self.X)
        return combined_kernel(KernelSet(self.kernels, self.n_features_in), Xc, Xc, weights)

    def cross_validation_input(self, size: int, seed: int):
        return self

    def fold_data(self, kept, train, test):
        return self.X[train], self.X[test], {"kernels": kept}

    def scoring_rows(self, rows, support):
        return self.X[rows], support


class FeatureInput(_FeatureData):
    """Feature rows with a :class:`KernelSet` (any kernel specs, or one random bank)."""

    def __init__(self, X, y, kernels):
        super().__init__(X, y, kernels)
        self.kernel_set = KernelSet(kernels, self.n_features_in, scale=functools.partial(_data_scale, X))
        # concrete widths: a subset of the rows keeps these kernels
        self.kernels = self.kernel_set.specs if self.kernel_set.bank is None else self.kernel_set.bank
        self.kernel_names = self.kernel_set.names()
        self.traces = _bank_traces(self.kernel_set, self.n_samples)
        self._csr = as_csr(X)
        # The solvers' kernels and rows: on the features the rows use, where they use few of many (compact_rows).
        self._engine_set, (self._csr,) = compact_rows(self.kernel_set, self._csr)

    def binary(self, y_pm):
        return FeatureProblem(self._csr, y_pm, self._engine_set)

    def subset(self, rows):
        return self if len(rows) == self.n_samples else FeatureInput(self.X[rows], self.y[rows], self.kernels)

    def with_kernels(self, kernels) -> FeatureInput:
        return FeatureInput(self.X, self.y, list(kernels))

    def data_scale(self) -> DataScale:
        if self.kernel_set.scale is None:  # concrete kernels: the rows' scale was not needed until now
            self.kernel_set.scale = _data_scale(self.X)
        return self.kernel_set.scale

    def kernel_traces(self) -> np.ndarray:
        return kernel_traces(self._engine_set, self._csr)

    def rows_in_memory(self, rows) -> FeatureInput:
        """The training input of ``rows`` (the two-stage fit's weight subsample)."""
        return self.subset(rows)

    def combined_gram(self, weights):
        return combined_kernel(self._engine_set, self._csr, self._csr, weights)

    def kernels_with_trace(self, rows, check: bool = False):
        if self.kernel_set.bank is not None:
            return self.kernels  # Gaussians: K(x, x) = 1, never a zero trace
        traces = kernel_traces(self._engine_set, self._csr[rows])
        if check:
            check_traces(traces, self.kernel_names)
        if np.all(traces > 0):
            return self.kernels
        return [spec for spec, r in zip(self.kernel_set.specs, traces) if r > 0]


#: Feature spaces at least this wide are compacted to the features the rows use, when that is a quarter or fewer.
COMPACT_MIN_FEATURES = 1 << 16


def compact_rows(kernel_set: KernelSet, *matrices) -> tuple[KernelSet, list]:
    """``(kernels, matrices)`` on the features the CSR ``matrices`` store values in (and those the kernels name).

    A kernel's plan and its evaluation cost ``O(n_features)`` (per-feature maps, dense point
    buffers); one far feature index in a sparse file (10^7) made every fold of a fit pay it.
    The kernel values are the same (:meth:`~mwumkl_dist.kernels.specs.KernelSet.compacted`).
    Returned unchanged for a narrow space, dense rows, a random bank, or rows using many of
    the features.
    """
    d = kernel_set.n_features
    if d < COMPACT_MIN_FEATURES or kernel_set.bank is not None or not all(sp.issparse(M) for M in matrices):
        return kernel_set, list(matrices)
    parts = [np.asarray(as_csr(M).indices, dtype=np.int64) for M in matrices]
    used = np.unique(np.concatenate([*parts, kernel_set.named_features()]))
    compact = kernel_set.compacted(used) if 4 * len(used) <= d else None
    if compact is None:
        return kernel_set, list(matrices)
    width = compact.n_features
    out = []
    for M in matrices:
        M = as_csr(M)  # renumbered in order: each row's columns stay sorted
        out.append(sp.csr_matrix((M.data, np.searchsorted(used, M.indices), M.indptr), shape=(M.shape[0], width)))
    return compact, out


def _bank_traces(kernel_set: KernelSet, n_samples: int) -> np.ndarray | None:
    """A bank's traces, known up front: ``n`` for every kernel (None for other kernel sets).

    A Gaussian's ``K(x, x)`` is exactly 1 in the column kernels (``exp(-gamma * 0)``),
    so these are the traces the shards would add up, without an ``(n, m)`` diagonal.
    """
    if kernel_set.bank is None:
        return None
    return np.full(len(kernel_set), float(n_samples))


class PrecomputedInput:
    """Precomputed training kernels ``K`` of shape ``(m, n, n)``."""

    polish_blocker = None
    feature_scale = None
    kernel_set = None

    def __init__(self, K, y):
        self.K = K
        self.y = y
        self.n_samples = self.n_features_in = K.shape[1]
        self.kernel_names = [f"precomputed[{i}]" for i in range(K.shape[0])]
        # Exactly rounded, as a kernel store's traces: the same model from memory or from a store.
        self.traces = exact_to_float(exact_column_sums(np.diagonal(K, axis1=1, axis2=2).T))

    def binary(self, y_pm):
        return PrecomputedProblem(self.K, y_pm)

    def with_kernels(self, kernels):
        raise ValueError("precomputed kernels have no feature groups to select")

    def data_scale(self):
        raise ValueError("precomputed kernels have no feature rows to scale kernels by")

    def kernel_traces(self):
        raise ValueError("precomputed kernels: their traces come with the fit")

    def subset(self, rows):
        if len(rows) == self.n_samples:
            return self
        sub = PrecomputedInput(self.K[np.ix_(np.arange(self.K.shape[0]), rows, rows)], self.y[rows])
        sub.n_features_in = self.n_features_in  # test kernels keep all n_train columns (support_ indexes them)
        return sub

    def rows_in_memory(self, rows):
        return self.subset(rows)

    def fingerprint_data(self):
        return self.K

    def support_vectors(self, indices):
        return None

    def combined_gram(self, weights):
        # Kernel-major memory fixes einsum's summation order (the order fits have always used).
        return np.einsum("i,ijk->jk", weights, np.asfortranarray(self.K))

    def cross_validation_input(self, size: int, seed: int):
        return self

    def scoring_rows(self, rows, support):
        """Only the support columns of the rows' kernels (the predictor reads no others)."""
        K = self.K[np.ix_(np.arange(self.K.shape[0]), np.asarray(rows), np.asarray(support))]
        return K, np.arange(len(support))

    def kernels_with_trace(self, rows, check: bool = False):
        traces = np.diagonal(self.K, axis1=1, axis2=2)[:, rows].sum(axis=1)  # a view: no (m, n, n) copy
        if check:
            check_traces(traces, self.kernel_names)
        return np.flatnonzero(traces > 0)

    def fold_data(self, kept, train, test):
        return self.K[np.ix_(kept, train, train)], self.K[np.ix_(kept, test, train)], {}


#: The rows a store input remembers of its last :meth:`DataStoreInput.support_vectors` reads (landmarks and the
#: residual's rows: a few thousand, a few MB).
REMEMBERED_ROWS = 2**15


class _StoreData:
    """What the store inputs share: the labels and the content come from the store."""

    polish_blocker = "a fit from a store (the data are not in memory)"
    feature_scale = None

    def __init__(self, store, y=None):
        self.store = store
        self.y = store.y if y is None else y  # a store's labels are read afresh at each access: one copy shared
        self.n_samples = store.n_samples

    def fingerprint_data(self):
        return self.store.content_id()

    def combined_gram(self, weights):
        raise ValueError(f"{self.store.path}: no Gram matrix for {self.polish_blocker}")

    def kernels_with_trace(self, rows, check: bool = False):
        raise ValueError(f"{self.store.path}: cross-validate on cross_validation_input(), read into memory")

    def fold_data(self, kept, train, test):
        raise ValueError(f"{self.store.path}: cross-validate on cross_validation_input(), read into memory")

    def with_kernels(self, kernels):
        raise ValueError(f"{self.store.path}: a store's kernels are chosen when it is opened")

    def data_scale(self):
        raise ValueError(f"{self.store.path}: a kernel store has no feature rows to scale kernels by")

    def kernel_traces(self):
        raise ValueError(f"{self.store.path}: a kernel store's traces come with the fit")

    def subset(self, rows):
        raise ValueError(
            f"{self.store.path}: sample_weight is not supported for a fit from a store (class_weight is); "
            "fit from arrays, or write a store of the rows and labels you want"
        )


def _data_scale(X):
    """The scale of rows ``X`` in memory (see :func:`~mwumkl_dist.kernels.evaluation.data_scale`)."""
    return data_scale([X], X.shape[1], X[scale_sample_rows(X.shape[0])])


def _store_scale(store: DataStore) -> DataScale:
    """The scale of a data store's rows (one pass over its chunks)."""
    return data_scale(_store_blocks(store), store.n_features, store.take_rows(scale_sample_rows(store.n_samples)))


def _store_blocks(store: DataStore):
    """A data store's rows, one chunk-aligned block at a time."""
    for a, b in store.row_ranges(-(-store.n_samples // store.chunk_rows)):
        yield store.read_rows(a, b)


class DataStoreInput(_StoreData):
    """Features in a :class:`~mwumkl_dist.stores.DataStore`, with a kernel set (or one random bank)."""

    def __init__(self, store: DataStore, kernels, y=None):
        super().__init__(store, y)
        self.n_features_in = store.n_features
        self._rows_read: dict = {}  # see support_vectors

        self.kernel_set = KernelSet(kernels, store.n_features, scale=functools.partial(_store_scale, store))
        # concrete widths: a subset of the rows keeps these kernels
        self.kernels = self.kernel_set.specs if self.kernel_set.bank is None else self.kernel_set.bank
        self.kernel_names = self.kernel_set.names()
        self.traces = _bank_traces(self.kernel_set, store.n_samples)

    def binary(self, y_pm):
        return DataStoreProblem(self.store, y_pm, self.kernel_set)

    def support_vectors(self, indices):
        """The rows at ``indices``; the last few such reads are remembered (the two-stage fit asks for the same
        landmarks and residual rows at several stages, and a store read of scattered rows decodes every chunk)."""
        indices = np.asarray(indices, dtype=np.int64)
        key = hashlib.sha1(indices.tobytes()).hexdigest()
        if key in self._rows_read:
            return self._rows_read[key]
        rows = self.store.take_rows(indices)
        if len(indices) <= REMEMBERED_ROWS:
            if isinstance(rows, np.ndarray):
                rows.flags.writeable = False  # shared by the reads that ask for them
            held = sum(r.shape[0] for r in self._rows_read.values())
            while self._rows_read and held + len(indices) > REMEMBERED_ROWS:  # the oldest go first
                held -= self._rows_read.pop(next(iter(self._rows_read))).shape[0]
            self._rows_read[key] = rows
        return rows

    def rows_in_memory(self, rows) -> FeatureInput:
        """The training input of ``rows``, read from the store (the two-stage fit's weight subsample)."""
        return FeatureInput(self.store.take_rows(rows), self.y[rows], self.kernels)

    def with_kernels(self, kernels) -> DataStoreInput:
        return DataStoreInput(self.store, list(kernels), y=self.y)

    def data_scale(self) -> DataScale:
        if self.kernel_set.scale is None:
            self.kernel_set.scale = _store_scale(self.store)
        return self.kernel_set.scale

    def kernel_traces(self) -> np.ndarray:
        """Summed over the store's chunks in row order (one pass over the store)."""
        return sum(kernel_traces(self.kernel_set, block) for block in _store_blocks(self.store))

    def scoring_rows(self, rows, support):
        return self.store.take_rows(rows), support

    def cross_validation_input(self, size: int, seed: int):
        """About ``2 * size`` of the store's rows, whole chunks in a random order, in memory."""
        X, y = self.store.sample_rows(size, seed)
        return FeatureInput(X, y, self.kernels)


class KernelStoreInput(_StoreData):
    """Precomputed kernels in a :class:`~mwumkl_dist.stores.KernelStore`."""

    kernel_set = None

    def __init__(self, store: KernelStore):
        super().__init__(store)
        self.n_features_in = store.n_samples
        self.kernel_names = store.kernel_names
        self.traces = store.traces

    def binary(self, y_pm):
        return KernelStoreProblem(self.store, y_pm)

    def support_vectors(self, indices):
        return None

    def rows_in_memory(self, rows):
        raise ValueError(f"{self.store.path}: a kernel store's scattered rows are not read into memory")

    def scoring_rows(self, rows, support):
        return None  # scattered kernel rows are not read

    def cross_validation_input(self, size: int, seed: int):
        return None  # (m, r, r) blocks of scattered rows: not read (C="auto" takes a fixed value)


# ----------------------------------------------------------------------------- the factories


def _check_precomputed(X, *, training: bool) -> np.ndarray:
    if sp.issparse(X):
        raise TypeError("precomputed kernels must be a dense (m, n_samples, n_train) array")
    K = np.asarray(X, dtype=np.float64)
    if K.ndim != 3:
        raise ValueError(f"precomputed kernels must be a 3-d array (m, n_samples, n_train), got shape {K.shape}")
    if not np.all(np.isfinite(K)):
        raise ValueError("precomputed kernels contain NaN or infinity")
    if training and K.shape[1] != K.shape[2]:
        raise ValueError(f"training kernels must be (m, n, n), got shape {K.shape}")
    return K


#: A data store whose rows take at most this many bytes in memory is read into memory and fitted as the
#: arrays it holds: the same model, in the same time, as its file (the exact polish included); a larger one
#: stays out of core (shards read their own rows). The environment variable ``MWUMKL_STORE_IN_MEMORY_BYTES``
#: sets another bound (0: every store out of core).
STORE_IN_MEMORY_BYTES = 256 << 20


def read_into_memory(store) -> bool:
    """Whether a fit reads ``store`` into memory: a data store of at most :data:`STORE_IN_MEMORY_BYTES`."""
    if not isinstance(store, DataStore):
        return False  # a kernel store's (m, n, n) values are what a store is for
    text = os.environ.get("MWUMKL_STORE_IN_MEMORY_BYTES", "").strip()
    try:
        bound = int(text) if text else STORE_IN_MEMORY_BYTES
    except ValueError:
        raise ValueError(f"MWUMKL_STORE_IN_MEMORY_BYTES must be a number of bytes, got {text!r}") from None
    n, d = store.shape
    size = store.meta["nnz"] * 12 + (n + 1) * 8 if store.sparse else n * d * 8
    return size <= bound


def _store_input(store, y, kernels, scale_features: bool, out_of_core_rows=None) -> TrainingInput:
    if isinstance(store, KernelStore) and not is_precomputed(kernels):
        raise ValueError(f"{store.path}: a kernel store needs kernels='precomputed'")
    if is_precomputed(kernels) and not isinstance(store, KernelStore):
        raise ValueError(f"{store.path}: kernels='precomputed' needs a kernel store, not a data store")
    if y is not None:
        raise ValueError(f"{store.path}: the labels come from the store; call fit(store) with y=None")
    if read_into_memory(store) and (out_of_core_rows is None or store.n_samples <= out_of_core_rows):
        X, y = check_X_y(store.read_rows(0, store.n_samples), store.y, **_FEATURE_CHECKS)
        return _feature_input(X, y, kernels, scale_features)
    if isinstance(store, KernelStore):
        return KernelStoreInput(store)
    if not scale_features:
        return DataStoreInput(store, kernels)
    # One pass over the store's chunks; every read of the fit (shards on their workers, samples, support
    # vectors) then goes through the scaled view, so the model is the one of the same rows in memory.
    scale = learn_feature_scale(_store_blocks(store), store.n_features, shift=not store.sparse)
    data = DataStoreInput(store.with_feature_scale(*scale), kernels)
    data.feature_scale = scale
    return data


def _feature_input(X, y, kernels, scale_features: bool, sample_weight=None) -> FeatureInput:
    """Feature rows in memory, each feature scaled as learned from them when ``scale_features`` (from the rows
    of positive ``sample_weight``: a row of weight 0 is a removed row)."""
    if not scale_features:
        return FeatureInput(X, y, kernels)
    weights = check_sample_weight(sample_weight, X.shape[0])
    rows = X if weights is None else X[np.flatnonzero(weights > 0)]
    scale = learn_feature_scale([rows], X.shape[1], shift=not sp.issparse(X))
    data = FeatureInput(apply_feature_scale(X, *scale), y, kernels)
    data.feature_scale = scale
    return data


_FEATURE_CHECKS = dict(accept_sparse="csr", dtype=np.float64, ensure_all_finite=True, y_numeric=False)


def make_training_input(
    X, y, kernels, *, estimator, scale_features: bool = False, sample_weight=None, out_of_core_rows=None
) -> TrainingInput:
    """The training input of ``(X, y)`` for the estimator parameter ``kernels``.

    The one place that tells the kinds of input apart.

    ``X`` is an array or sparse matrix of features, ``(m, n, n)`` kernels with
    ``kernels="precomputed"``, or a store (then ``y`` must be None); a small data store
    (:func:`read_into_memory`) is read and fitted as the arrays it holds.  Feature
    arrays are validated by scikit-learn's ``validate_data``, which also sets
    ``estimator.n_features_in_`` (and ``feature_names_in_``); with ``estimator=None``
    (a nested fit's rows, already validated) by ``check_X_y``.

    ``scale_features``: scale each feature as learned from these rows (min-max; sparse rows
    only multiplied: :mod:`mwumkl_dist.kernels.feature_scale`; not for precomputed kernels);
    the input's ``feature_scale`` holds ``(factors, offsets)`` (None when not scaled), learned from the
    rows of positive ``sample_weight``.  ``out_of_core_rows``: a store of more rows stays out of core whatever its
    size (a Dask fit's: its shards read their own rows, none pass through the client).
    """
    store = as_store(X)
    if store is not None:
        return _store_input(store, y, kernels, scale_features, out_of_core_rows)
    if is_precomputed(kernels):
        K = _check_precomputed(X, training=True)
        y = np.asarray(y)
        if y.ndim != 1 or len(y) != K.shape[1]:
            raise ValueError(f"y must be 1-d with {K.shape[1]} labels, got shape {y.shape}")
        return PrecomputedInput(K, y)
    checks = _FEATURE_CHECKS
    X, y = check_X_y(X, y, **checks) if estimator is None else validate_data(estimator, X, y, **checks)
    return _feature_input(X, y, kernels, scale_features, sample_weight)


class _FeatureRowsPredictor:
    """Feature rows against the support vectors; ``X`` is checked as scikit-learn does."""

    def check_input(self, estimator, X):
        return validate_data(estimator, X, accept_sparse="csr", dtype=np.float64, ensure_all_finite=True, reset=False)


@functools.lru_cache(maxsize=8)
def _named_kernel_set(kernel_names: tuple, n_features: int) -> KernelSet:
    """The kernel set of a model's kernel names, parsed once (a fit's bias and majority checks, then every
    prediction, ask for it again: 1344 per-feature names took 0.1 s each time)."""
    return KernelSet(list(kernel_names), n_features)


class _KernelSetPredictor(_FeatureRowsPredictor):
    """Kernels of a :class:`KernelSet` (from the model's kernel names, or its bank)."""

    def __init__(self, kernel_names, n_features: int, device="cpu"):
        if isinstance(kernel_names, BankKernelNames):
            self.kernel_set = KernelSet(kernel_names.bank, n_features)
        else:
            self.kernel_set = _named_kernel_set(tuple(kernel_names), int(n_features))
        self.backend = backend_named(device)

    def decision_values(self, X, support, support_vectors, dual_coef, raw_weights):
        sums = self.backend.kernel_sums()
        kernel_set = self.kernel_set
        if sp.issparse(X) and sp.issparse(support_vectors):  # wide sparse rows: on the features they use
            kernel_set, (X, support_vectors) = compact_rows(kernel_set, X, support_vectors)
        return support_vector_sums(kernel_set.plan, X, support_vectors, dual_coef, raw_weights, sums)


class _PrecomputedPredictor:
    """Test kernels ``(m, n_samples, n_train)`` against the training points."""

    def __init__(self, n_kernels: int, n_train: int):
        self.n_kernels, self.n_train = n_kernels, n_train

    def check_input(self, estimator, X):
        K = _check_precomputed(X, training=False)
        if K.shape[0] != self.n_kernels or K.shape[2] != self.n_train:
            raise ValueError(
                f"precomputed kernels must have shape (m={self.n_kernels}, n_samples, "
                f"n_train={self.n_train}), got {K.shape}"
            )
        return K

    def decision_values(self, X, support, support_vectors, dual_coef, raw_weights):
        return np.einsum("ktj,oj,ok->to", X[:, :, support], dual_coef, raw_weights, optimize=True)


def make_predictor(kernels, kernel_names, n_features_in: int, device="cpu") -> Predictor:
    """The predictor of a fitted model, from what a saved model keeps.

    Parameters
    ----------
    kernels : str, KernelSpec or list
        The estimator's ``kernels`` parameter (``"precomputed"`` or not).
    kernel_names : sequence of str
        The model's ``kernel_names_`` (a :class:`~mwumkl_dist.kernels.BankKernelNames` after a bank fit).
    n_features_in : int
        The model's ``n_features_in_`` (``n_train`` for precomputed kernels).
    device : {"cpu", "cuda"} or back-end
        Where feature rows are predicted (a name or a back-end of :mod:`mwumkl_dist.data.backends`; precomputed
        kernels: always the CPU).
    """
    if is_precomputed(kernels):
        return _PrecomputedPredictor(len(kernel_names), n_features_in)
    return _KernelSetPredictor(kernel_names, n_features_in, device)


def prediction_blocks(X) -> Iterator:
    """``X`` itself, or a data store's rows one chunk at a time (a kernel store cannot be predicted)."""
    store = as_store(X)
    if store is None:
        yield X
        return
    if isinstance(store, KernelStore):
        raise TypeError(f"{store.path}: predict from precomputed test kernels (m, n_samples, n_train)")
    for a, b in store.row_ranges(-(-store.n_samples // store.chunk_rows)):
        yield store.read_rows(a, b)
