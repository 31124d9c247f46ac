"""The paper's baselines, exactly as ``SPEC.md`` section 5 defines them.

* :class:`UniformMKL` ("Uniform"): LIBSVM (scikit-learn's ``SVC`` with a
  precomputed kernel) on the average of the trace-normalised base kernels,
  ``K = (1/m) sum_i K_i / r_i`` with ``r_i`` the trace on the training data.
* :class:`LibLinearPlus` ("LibLinear+"): a Nystroem feature map of each base
  kernel (150 components per kernel, fewer when the feature matrix would not
  fit the memory budget, as the paper did on mushrooms) concatenated, then
  LIBLINEAR (scikit-learn's ``LinearSVC``).

Both take the same kernel specs as :class:`mwumkl_dist.MWUMKLClassifier`.
``C`` of :class:`UniformMKL` is relative to the training size (LIBSVM gets
``C * n``): the trace-normalised kernel's entries are about ``1/n``, so the
same grid then fits every data size.  ``fit_seconds_`` records the training
time (kernel computation included) of the last ``fit``.
"""

from __future__ import annotations

import time

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.svm import SVC, LinearSVC

from mwumkl_dist.kernels import KernelSet
from mwumkl_dist.kernels.evaluation import combined_kernel, kernel_traces
from mwumkl_dist.kernels.specs import GAUSSIAN, LINEAR, POLYNOMIAL

__all__ = ["UniformMKL", "LibLinearPlus", "nystroem_components"]


class UniformMKL(ClassifierMixin, BaseEstimator):
    """SVC on the uniformly weighted, trace-normalised kernel sum ("Uniform").

    Parameters
    ----------
    kernels : str or list of kernel specs, default="paper"
    C : float, default=1.0
        LIBSVM's ``C`` is ``C * n_samples`` (see the module docstring).
    tol : float, default=1e-3
        LIBSVM's stopping tolerance.
    """

    def __init__(self, kernels="paper", C=1.0, tol=1e-3):
        self.kernels = kernels
        self.C = C
        self.tol = tol

    def fit(self, X, y):
        start = time.perf_counter()
        X = X if sp.issparse(X) else np.asarray(X, dtype=np.float64)
        self.classes_ = np.unique(y)
        ks = KernelSet(self.kernels, X.shape[1])
        self.kernel_set_ = ks
        self.weights_ = 1.0 / (len(ks) * kernel_traces(ks, X))
        n = X.shape[0]
        # The kernel scaled by n (entries of order 1) is what LIBSVM's tolerance expects.
        K = combined_kernel(ks, X, X, self.weights_ * n)
        self.svc_ = SVC(kernel="precomputed", C=float(self.C), tol=self.tol).fit(K, y)
        del K
        self.support_vectors_ = X[self.svc_.support_]
        self.n_train_ = n
        self.fit_seconds_ = time.perf_counter() - start
        return self

    def decision_function(self, X):
        X = X if sp.issparse(X) else np.asarray(X, dtype=np.float64)
        K = combined_kernel(self.kernel_set_, X, self.support_vectors_, self.weights_ * self.n_train_)
        return K @ self.svc_.dual_coef_[0] + self.svc_.intercept_[0]

    def predict(self, X):
        return self.classes_[(self.decision_function(X) > 0).astype(int)]


#: The weight vector of a one-kernel set.
_ONE = np.ones(1)


def nystroem_components(n_kernels: int, n_samples: int, requested: int = 150, memory_bytes: float = 4e9) -> int:
    """Components per kernel: ``requested``, at most ``n_samples``, cut to fit ``memory_bytes``.

    The feature matrix is ``n_samples x (n_kernels * components)`` float64;
    the paper reduced the sample count the same way on mushrooms.
    """
    fit = int(memory_bytes // (8.0 * n_kernels * max(n_samples, 1)))
    return max(1, min(requested, n_samples, fit))


def _sklearn_kernel(spec):
    """(kernel name, parameters) of scikit-learn's pairwise kernels for one spec."""
    if spec.kind == LINEAR:
        return "linear", {}
    if spec.kind == POLYNOMIAL:
        return "poly", {"degree": spec.degree, "coef0": spec.coef0, "gamma": 1.0}
    if spec.kind == GAUSSIAN:
        return "rbf", {"gamma": spec.gamma}
    raise ValueError(f"no scikit-learn kernel for {spec}")


class LibLinearPlus(ClassifierMixin, BaseEstimator):
    """Nystroem features of every base kernel + LinearSVC ("LibLinear+").

    Parameters
    ----------
    kernels : str or list of kernel specs, default="paper"
    C : float, default=1.0
        LinearSVC's ``C``.
    n_components : int, default=150
        Nystroem components per kernel (see :func:`nystroem_components`).
    memory_bytes : float, default=4e9
        Budget for the training feature matrix.
    random_state : int, default=0
    max_iter : int, default=1000
        LIBLINEAR's iteration limit (scikit-learn's default).
    """

    def __init__(self, kernels="paper", C=1.0, n_components=150, memory_bytes=4e9, random_state=0, max_iter=1000):
        self.kernels = kernels
        self.max_iter = max_iter
        self.C = C
        self.n_components = n_components
        self.memory_bytes = memory_bytes
        self.random_state = random_state

    def transform_fit(self, X):
        """Fit the Nystroem maps on ``X`` and return its features (independent of ``C``).

        The maps are scikit-learn's ``Nystroem`` (components drawn with
        ``random_state + i`` for kernel ``i``, normalisation ``U S^-1/2 V'``
        of the basis kernel's SVD, ``S`` clipped at 1e-12), evaluated with
        the library's :func:`~mwumkl_dist.kernels.evaluation.combined_kernel` instead of
        ``pairwise_kernels`` (much less overhead per kernel;
        ``tests/test_benchmarks.py`` checks the features are equal).
        """
        X = X if sp.issparse(X) else np.asarray(X, dtype=np.float64)
        ks = KernelSet(self.kernels, X.shape[1])
        n = X.shape[0]
        self.n_components_ = nystroem_components(len(ks), n, self.n_components, self.memory_bytes)
        self.maps_ = []
        for i, spec in enumerate(ks.specs):
            rows = np.random.RandomState(self.random_state + i).permutation(n)[: self.n_components_]
            basis = X[rows]
            single = KernelSet([spec], X.shape[1])
            U, S, V = np.linalg.svd(combined_kernel(single, basis, basis, _ONE))
            self.maps_.append((single, basis, (U / np.sqrt(np.clip(S, 1e-12, None))) @ V))
        return self.transform(X)

    def transform(self, X):
        X = X if sp.issparse(X) else np.asarray(X, dtype=np.float64)
        c = self.n_components_
        F = np.empty((X.shape[0], c * len(self.maps_)))
        for i, (single, basis, norm) in enumerate(self.maps_):
            F[:, i * c : (i + 1) * c] = combined_kernel(single, X, basis, _ONE) @ norm.T
        return F

    def fit_features(self, F, y):
        """Fit the linear SVM on features from :meth:`transform_fit`.

        With more features than points the SVM is fitted on the reduced
        coordinates of :meth:`fit_gram` (the same Gram matrix, hence the same
        LIBLINEAR steps and decision function, at ``n / n_features`` of the cost
        per step); ``basis_`` maps new feature rows onto them.
        """
        if F.shape[1] <= F.shape[0]:
            self.classes_ = np.unique(y)
            self.basis_ = None
            self.svm_ = LinearSVC(C=float(self.C), dual="auto", max_iter=self.max_iter).fit(F, y)
            return self
        self.fit_gram(F @ F.T, y)
        self.basis_ = F.T @ self.gram_map_
        return self

    def fit_gram(self, G, y):
        """Fit on the Gram matrix ``G = F F'`` of the training features alone.

        ``F F' = V S V'`` gives coordinates ``V S^1/2`` with the same inner
        products as the rows of ``F``; a new row ``f`` maps to ``(F f)' V S^-1/2``
        (``gram_map_``), see :meth:`decision_from_gram`.  LIBLINEAR's dual
        coordinate descent (what ``dual="auto"`` picks for more features than
        points) only uses inner products, so it takes the same steps.
        """
        self.classes_ = np.unique(y)
        self.basis_ = None
        evals, evecs = np.linalg.eigh(np.asarray(G, dtype=np.float64))
        keep = evals > max(evals.max(), 0.0) * 1e-12
        self.gram_map_ = evecs[:, keep] / np.sqrt(evals[keep])
        coords = evecs[:, keep] * np.sqrt(evals[keep])
        self.svm_ = LinearSVC(C=float(self.C), dual=True, max_iter=self.max_iter).fit(coords, y)
        return self

    def decision_from_gram(self, G_new):
        """The decision function from ``F_new F'`` (rows: new points, columns: training points)."""
        return self.svm_.decision_function(np.asarray(G_new) @ self.gram_map_)

    def fit(self, X, y):
        start = time.perf_counter()
        F = self.transform_fit(X)
        self.fit_features(F, y)
        self.fit_seconds_ = time.perf_counter() - start
        return self

    def decision_function(self, X):
        return self.decision_from_features(self.transform(X))

    def decision_from_features(self, F):
        """The decision function on features from :meth:`transform`."""
        return self.svm_.decision_function(F if self.basis_ is None else F @ self.basis_)

    def predict(self, X):
        return self.classes_[(self.decision_function(X) > 0).astype(int)]
