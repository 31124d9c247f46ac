"""The 2-norm soft-margin SVM on features by a finite Newton method (L2-SVM-MFN) over shards."""

from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass, replace

import numpy as np
import scipy.linalg

from mwumkl_dist.core.partition import tree_total
from mwumkl_dist.data.backends import backend_named
from mwumkl_dist.engines.pool import LocalPool
from mwumkl_dist.solvers.two_stage.margins import LINE_FIELDS, SolveLog, exact_step
from mwumkl_dist.solvers.two_stage.nystroem import Basis, blocked_product
from mwumkl_dist.solvers.two_stage.shards import GivenFeatures, LinearShard

__all__ = [
    "NewtonOptions",
    "NewtonResult",
    "cg_newton_solve",
    "linear_costs",
    "linear_method",
    "fit_linear",
    "fit_squared_hinge",
    "newton_solve",
    "solve_squared_hinge",
]

logger = logging.getLogger("mwumkl_dist")


def fit_linear(F, y_pm, C: float, sample_weight=None, *, tol: float = 1e-4, max_iter: int = 1000):
    """The 2-norm soft-margin SVM on features ``F``: ``(coef, intercept)``.

    ``min_w,b 1/2 |w|^2 + C/2 sum_j c_j max(0, 1 - y_j (w' f_j + b))^2`` with
    ``c_j`` = ``sample_weight`` (1 by default): the primal of the MWU's problem
    with ridge ``1 / (C c_j)`` on a unit-diagonal kernel.  Solved by LIBLINEAR's
    primal trust-region Newton method (``LinearSVC(loss="squared_hinge",
    dual=False)``, whose ``C`` is half of this one); the bias is an extra
    feature of value 1, regularised like the weights (negligible at large ``n``).
    """
    from sklearn.svm import LinearSVC

    svc = LinearSVC(C=0.5 * float(C), loss="squared_hinge", dual=False, tol=tol, max_iter=max_iter)
    svc.fit(F, y_pm, sample_weight=sample_weight)
    return svc.coef_[0].copy(), float(svc.intercept_[0])


@dataclass(frozen=True)
class NewtonOptions:
    """The options of a Newton solve (:func:`newton_solve`, :func:`cg_newton_solve`; narrow them with
    :func:`dataclasses.replace` or as keywords of the solve).

    ``level``: the features' level on the shards (the index of their basis); ``start``: starting coefficients
    ``[w, b]`` (default 0); ``train``: a boolean mask of the rows fitted (the others get outputs and no loss;
    default all); ``outputs_on``: a boolean mask of the rows whose outputs ``F w + b`` the result carries (the
    shards send only those; default none); ``tol``: the objective's relative decrease that ends the solve;
    ``max_iter``: the most Newton steps; ``step``: a progress phase advanced by each Newton step (the conjugate
    gradients': by each pass over the columns); ``hessian``: the :attr:`NewtonResult.hessian` of an earlier
    explicit solve on the same features to start from.  The conjugate gradients' own: ``seed`` (the
    preconditioner's rows), ``gtol`` (the gradient's relative norm that ends the solve), ``max_cg`` (the most
    products per step).
    """

    level: int = -1
    start: np.ndarray | None = None
    train: np.ndarray | None = None
    outputs_on: np.ndarray | None = None
    tol: float = 1e-10
    max_iter: int = 100
    step: object = None
    hessian: tuple | None = None
    seed: int = 0
    gtol: float = 1e-7
    max_cg: int = 500


@dataclass
class NewtonResult:
    """A solve's coefficients ``v = [w, b]``, its outputs ``o = F w + b`` on the rows asked for
    (:attr:`NewtonOptions.outputs_on`; None: none), and its Newton steps.

    ``hessian``: the explicit solve's sums over its last active rows and the log the shards rebuild those rows
    from, ``(gram, log)`` (see :func:`newton_solve`), to start another solve on the same features from (None
    from the CG solve).
    """

    coef: np.ndarray
    intercept: float
    outputs: np.ndarray | None
    n_iter: int
    hessian: tuple | None = None


def _total(answers):
    """The tree-ordered total of the shards' node sums (:func:`~mwumkl_dist.core.partition.tree_total`)."""
    nodes = dict(node for parts in answers if parts is not None for node in parts)
    return tree_total(nodes, max(hi for _, hi in nodes)) if nodes else None


class _Problem:
    """What both Newton solves share: the shards (each keeping its rows' state, :mod:`.margins`), ``C``, the
    options, the solve's log and the progress.  Every call sends ``r``-sized values and gets sums back."""

    def __init__(self, shards, C: float, options: NewtonOptions, count_outputs: bool):
        self.shards, self.C, self.options, self.count_outputs = shards, float(C), options, count_outputs
        self.log: SolveLog | None = None

    def advance(self):
        if self.options.step is not None:
            self.options.step.advance()

    def call(self, method, *args, superstep: bool = True):
        """The tree total of ``method(*args)`` on every shard (the same arguments to each)."""
        return _total(self.shards.call(method, lambda rows: args, shared=True, superstep=superstep))

    def begin(self, from_log) -> np.ndarray:
        """Start the solve on the shards: its status there (``[loss, active rows, rows changed]``)."""
        options = self.options
        start = None if options.start is None else np.asarray(options.start, dtype=np.float64).copy()
        train = None if options.train is None else np.asarray(options.train, dtype=bool)
        if from_log is not None:  # the rows of an earlier solve: its own start does not matter here
            from_log = replace(from_log, from_log=None, pending=None)
        self.log = log = SolveLog(options.level, train, start, from_log)
        # kept: a rebuilt shard replays the log as it is then (every step taken so far)
        status = _total(self.shards.call("solve_begin", lambda rows, log=log: (log.for_rows(*rows),), keep=True))
        if start is not None and self.count_outputs:
            self.advance()
        return status

    def objective(self, v, status) -> float:
        return 0.5 * v @ v + 0.5 * self.C * float(status[0])

    def line_search(self, v, d) -> float:
        """The exact step along ``d`` (:func:`~.margins.exact_step`): the shards keep ``F d``; steps go to them."""
        first = self.call("solve_direction", d).reshape(-1, LINE_FIELDS)
        self.log.pending = d
        if self.count_outputs:
            self.advance()
        return exact_step(float(v @ d), float(d @ d), self.C, first,
                          lambda ts: self.call("solve_line", tuple(ts)).reshape(-1, LINE_FIELDS))  # fmt: skip

    def step(self, t: float) -> np.ndarray:
        """``v + t d`` on the shards: the status there."""
        status = self.call("solve_step", float(t))
        self.log.steps.append((self.log.pending, float(t)))
        self.log.pending = None
        return status

    def outputs(self):
        """The outputs on :attr:`NewtonOptions.outputs_on`'s rows (None: none asked for)."""
        mask = self.options.outputs_on
        if mask is None:
            return None
        mask = np.asarray(mask, dtype=bool)
        parts = self.shards.call("solve_outputs", lambda rows: (np.packbits(mask[rows[0] : rows[1]]),))
        return np.concatenate(parts) if parts else np.zeros(0)


def _newton_loop(problem: _Problem, direction):
    """The Newton steps shared by both solves: ``(v, steps)``.

    Each step asks ``direction`` for a step ``d`` on the active rows (None: converged by its own test), takes
    the exact line search along it, and ends when the direction's own rule says so (:meth:`end_step`), when the
    objective stops decreasing (relative ``tol``), or after ``max_iter`` steps.
    """
    options = problem.options
    v = np.zeros(direction.size) if options.start is None else np.asarray(options.start, dtype=np.float64).copy()
    status = problem.begin(direction.from_log)
    f_old = problem.objective(v, status)
    steps = 0
    for steps in range(1, options.max_iter + 1):
        d = direction(status, v)
        if d is None:
            break
        t = problem.line_search(v, d)
        v = v + t * d
        status = problem.step(t)
        f_new = problem.objective(v, status)
        if direction.end_step(steps, t, f_new) or f_old - f_new <= options.tol * max(f_old, 1e-300):
            break
        f_old = f_new
    return v, steps


def newton_system_solution(gram: np.ndarray, C: float, labels: np.ndarray) -> np.ndarray:
    """``(I + C G)^-1 C b`` for the active rows' Gram sums ``G`` (positive semi-definite) and ``b``: by Cholesky, or,
    where rounding has left ``G`` a little indefinite, by its eigenvalues with the negative ones taken as 0.

    ``G`` is a running sum of the parts of the rows that entered the active set less those that left, some of them
    lifted from the column space by the Nystroem projection: on ill-conditioned landmarks the rounding of those sums
    can put an eigenvalue below ``-1 / C`` (seen on 3,000 rows of magic04), where a Cholesky factor does not exist
    although the exact ``G`` has one.  The line search measures the true objective, so a direction from the nearest
    positive semi-definite ``G`` still descends.
    """
    H = C * gram
    H[np.diag_indices(len(H))] += 1.0
    try:
        factor = scipy.linalg.cho_factor(H, lower=True, overwrite_a=True, check_finite=False)
    except np.linalg.LinAlgError:
        eigenvalues, vectors = np.linalg.eigh(0.5 * (gram + gram.T))
        logger.debug("newton: the Gram sums are indefinite (smallest eigenvalue %.3g): their PSD part", eigenvalues[0])
        return vectors @ ((vectors.T @ (C * labels)) / (1.0 + C * np.maximum(eigenvalues, 0.0)))
    return scipy.linalg.cho_solve(factor, C * labels, check_finite=False)


class _CholeskyDirection:
    """The explicit Newton step: the Hessian's sums over the active rows, updated by the rows that changed sides,
    and its Cholesky factor (see :func:`newton_solve`)."""

    def __init__(self, problem: _Problem, basis, hessian):
        self.problem, self.basis = problem, basis
        r = self.size - 1
        self.lift = np.zeros((basis.width + 1, r + 1))  # [P 0; 0 1]: column-space parts to the features' space
        if basis.projection is not None:
            self.lift[: basis.width, :r] = basis.projection
            self.lift[basis.width, r] = 1.0
        if hessian is not None:  # sum over the active rows of c [z z' ; y z'], z = [f, 1]: kept from an earlier solve
            self.gram, self.from_log = hessian[0].copy(), hessian[1]
        else:
            self.gram, self.from_log = np.zeros((r + 2, r + 1)), None
        self.changed = self.n_active = 0

    @property
    def size(self) -> int:
        return self.basis.rank + 1

    @property
    def hessian(self) -> tuple:
        return self.gram, self.problem.log

    def _update(self, changed: int):
        """Add the Gram parts of the rows that entered the active set and take away those that left."""
        on_columns = self.basis.projection is not None and changed > self.basis.rank
        change = self.problem.call("solve_gram", on_columns)
        self.problem.log.synced = len(self.problem.log.steps)
        if change is not None and on_columns:  # O(r^3): in fixed row blocks over the threads
            lift = self.lift
            change = np.vstack([blocked_product(blocked_product(lift.T, change[:-1]), lift), change[-1] @ lift])
        if change is not None:
            self.gram += change

    def __call__(self, status, v):
        r, C = self.basis.rank, self.problem.C
        self.n_active, self.changed = int(status[1]), int(status[2])
        if self.changed:
            self._update(self.changed)
        return newton_system_solution(self.gram[: r + 1], C, self.gram[r + 1]) - v

    def end_step(self, steps: int, t: float, f_new: float) -> bool:
        """Log and count the step; True where the active set repeats with a full step (the exact optimum)."""
        logger.debug("newton: step %d, %d active rows, %d changed, step length %.3g, objective %.10g",
                     steps, self.n_active, self.changed, t, f_new)  # fmt: skip
        self.problem.advance()
        return t == 1.0 and steps > 1 and self.changed == 0


class _ConjugateGradientDirection:
    """The truncated Newton step: the Newton system by conjugate gradients, preconditioned by a sketch of the
    Hessian on random active rows (see :func:`cg_newton_solve`)."""

    hessian = None
    from_log = None

    def __init__(self, problem: _Problem, basis):
        options = problem.options
        self.problem, self.basis = problem, basis
        self.seed, self.gtol, self.max_cg = options.seed, options.gtol, options.max_cg
        self.g0, self.built_at, self.factor = None, -1, None
        self.n_active, self.g_norm = 0, 0.0

    @property
    def size(self) -> int:
        return self.basis.rank + 1

    def _loss_sums(self, u, labels: bool):
        """``C Z_A' D (Z_A u - [y_A])`` in the features' space (one pass over the active rows)."""
        r, M = self.basis.rank, self.basis.projection
        beta = M @ u[:r] if M is not None else u[:r]
        total = self.problem.call("solve_products", beta, float(u[r]), labels)
        self.problem.advance()
        if total is None:
            return np.zeros(r + 1)
        return self.problem.C * np.append(M.T @ total[:-1] if M is not None else total[:-1], total[-1])

    def _sketch(self, n_active: int):
        """The preconditioner's Cholesky factor from ``s`` random active rows (None: no active row)."""
        r, M, problem = self.basis.rank, self.basis.projection, self.problem
        if not n_active:
            return None
        size = min(n_active, 2 * (r + 1))
        answers = problem.shards.call("solve_sample", lambda rows: (self.seed, size), shared=True)
        keys, rows, columns, cw = (np.concatenate([a[i] for a in answers]) for i in range(4))
        pick = np.sort(np.lexsort((rows, keys))[:size])  # the smallest keys of all, in row order
        K = columns[pick]
        Z = np.empty((size, r + 1))
        Z[:, :r] = K @ M if M is not None else K
        Z[:, r] = 1.0
        Z *= np.sqrt(cw[pick])[:, None]
        P = (problem.C * n_active / size) * (Z.T @ Z)
        P[np.diag_indices(r + 1)] += 1.0
        return scipy.linalg.cho_factor(P, lower=True, check_finite=False)

    def __call__(self, status, v):
        """The step solving ``H d = -g`` to the forcing tolerance (None: the gradient is below ``gtol``)."""
        self.n_active = n_active = int(status[1])
        g = v + self._loss_sums(v, True)
        self.g_norm = g_norm = float(np.linalg.norm(g))
        self.g0 = g0 = g_norm if self.g0 is None else self.g0
        if g_norm <= self.gtol * max(g0, 1e-300):
            return None
        if self.built_at < 0 or not self.built_at / 2 <= n_active <= 2 * self.built_at:
            self.factor, self.built_at = self._sketch(n_active), n_active

        def precondition(x, factor=self.factor):
            return x if factor is None else scipy.linalg.cho_solve(factor, x, check_finite=False)

        return _conjugate_gradients(lambda u: u + self._loss_sums(u, False), -g, precondition,
                                    min(0.1, math.sqrt(g_norm / g0)), self.max_cg)  # fmt: skip

    def end_step(self, steps: int, t: float, f_new: float) -> bool:
        """Log the step; the conjugate gradients' solve has no stopping rule of its own here."""
        logger.debug("newton-cg: step %d, %d active rows, step length %.3g, gradient %.3g, objective %.10g",
                     steps, self.n_active, t, self.g_norm, f_new)  # fmt: skip
        return False


def newton_solve(shards, basis, C: float, options: NewtonOptions | None = None, **changes) -> NewtonResult:
    """The 2-norm soft-margin SVM on the shards' features by a finite Newton method (:func:`solve_squared_hinge`).

    ``basis``: the shards' :class:`~mwumkl_dist.solvers.two_stage.nystroem.Basis` at ``options.level`` (its index
    in their list), whose features are fitted, with the labels and weights the shards were loaded with;
    ``options``: :class:`NewtonOptions` (``changes``: keywords replacing some of them).  ``options.hessian``: the
    :attr:`NewtonResult.hessian` of an earlier solve on the same features (another ``C``, other training rows):
    its sums over its active rows are kept and only the rows that changed sides since are added or taken away
    (the sums do not depend on ``C``), so a warm solve does not form the Hessian again.

    The Hessian is formed explicitly, ``I + C Z_A' D Z_A``, and updated by the
    rows that enter or leave the active set only (after the first steps a
    few per step): ``O(|changed| r^2)`` per step on the shards, ``O(r^3)`` for
    its Cholesky factor on the driver.  Where more rows change than the rank,
    the shards add the Gram matrix of the stored kernel columns (``m^2`` per
    row instead of ``2 m r + r^2`` for projecting them first) and the driver
    projects it once (``2 m^2 r``).  Truncated Newton with conjugate
    gradients on the same system was slower where measured: on cod-rna
    (59,535 rows, rank 500, 2-core box) 360 CG products (47 per Newton step,
    about as many with Falkon's landmark preconditioner, whose condition
    number 67-1100 against 3e4-7e4 unpreconditioned does not cluster the
    spectrum better) took 18.6 s against 2.3 s for the explicit Hessian; a
    product streams the ``n x r`` features from memory, the Hessian is one
    compute-bound ``syrk`` on the changed rows.

    The state on the rows (outputs, the direction's outputs, the active rows) stays on the shards
    (:mod:`.margins`): per step the client sends the direction and a few step lengths and gets back the Gram
    parts, the loss and the line search's sums, never an ``n``-vector.
    """
    options = replace(options or NewtonOptions(), **changes)
    problem = _Problem(shards, C, options, count_outputs=False)
    direction = _CholeskyDirection(problem, basis, options.hessian)
    v, steps = _newton_loop(problem, direction)
    return _result(basis, v, problem.outputs(), steps, direction.hessian)


def cg_newton_solve(shards, basis, C: float, options: NewtonOptions | None = None, **changes) -> NewtonResult:
    """:func:`newton_solve`'s problem by a truncated Newton method: each step's system by preconditioned conjugate
    gradients (CG), never forming the Hessian.

    The Hessian ``H = I + C Z_A' D Z_A`` of the squared hinge (``A`` the active rows) is only multiplied by:
    one pass over the active rows' kernel columns per product (:meth:`LinearShard.active_sums`,
    ``O(n_A r)``, summed in tree order: the same bits for any sharding), against ``O(n_A r^2)`` to form it
    and ``O(r^3)`` per step to factor it.  The preconditioner is a sketch of ``H`` in the spirit of Falkon
    (Rudi, Carratino, Rosasco 2017): ``I + C (n_A / s) Z_S' D Z_S`` on ``s = min(n_A, 2 (r + 1))`` active
    rows drawn with ``options.seed`` (the smallest :func:`~.margins.row_keys`, their columns fetched once,
    :meth:`LinearShard.solve_sample`; ``O(s r^2 + r^3 / 3)``), built at the first step and again when the active
    set has grown or shrunk by half since.  (The landmarks themselves are no sample for it: a landmark's own
    feature is far larger than the other rows' there; on 6000 rows at rank 400 that estimate left a condition
    number of 6.6e11 where 800 random active rows leave 7.)

    Each step solves ``H d = -g`` to the relative residual ``min(0.1, sqrt(|g| / |g_0|))`` (at most
    ``max_cg`` products; truncated Newton's forcing sequence: superlinear convergence), then the exact line
    search of :func:`newton_solve`.  It ends when the gradient falls below ``gtol`` times its first norm,
    when the objective stops decreasing (relative ``tol``), or after ``max_iter`` steps.  The progress phase is
    advanced once per pass over the columns (each product, each step's outputs).
    """
    options = replace(options or NewtonOptions(), **changes)
    problem = _Problem(shards, C, options, count_outputs=True)
    direction = _ConjugateGradientDirection(problem, basis)
    v, steps = _newton_loop(problem, direction)
    return _result(basis, v, problem.outputs(), steps, direction.hessian)


def _result(basis, v, outputs, steps: int, hessian) -> NewtonResult:
    r = basis.rank
    return NewtonResult(v[:r].copy(), float(v[r]), outputs, steps, hessian)


def _conjugate_gradients(product, b, precondition, rtol: float, max_iter: int) -> np.ndarray:
    """Preconditioned conjugate gradients for ``A x = b`` (``A`` symmetric positive definite), from ``x = 0``,
    to ``|A x - b| <= rtol |b|`` or ``max_iter`` products."""
    x = np.zeros_like(b)
    res = b.copy()
    z = precondition(res)
    p = z.copy()
    rz = float(res @ z)
    limit = rtol * float(np.linalg.norm(b))
    for _ in range(max_iter):
        Ap = product(p)
        alpha = rz / float(p @ Ap)
        x += alpha * p
        res -= alpha * Ap
        if float(np.linalg.norm(res)) <= limit:
            break
        z = precondition(res)
        rz_new = float(res @ z)
        p = z + (rz_new / rz) * p
        rz = rz_new
    return x


#: The cost model that picks the linear solve's method (:func:`linear_method`; one core of the 2-core development
#: box, measured with numpy): dense products and factorisations at ``GEMM_RATE`` flops per second (a Gram matrix
#: of 8192 x 501 rows: 7.7e10), a pass over stored single-precision columns at ``PASS_SECONDS`` per entry (their
#: product with a vector, widened to double: 1.8 ns; the conjugate gradients' product over the active rows, a
#: gather and two products: 3.3 ns), ``NEWTON_STEPS`` Newton steps and ``CG_PRODUCTS`` products per step (6000
#: rows, rank 400, 9 per step at C = 1, 120 at C = 100).
GEMM_RATE = 5e10
PASS_SECONDS = 1.8e-9
CG_PASS_SECONDS = 3.3e-9
NEWTON_STEPS = 10
CG_PRODUCTS = 30


def linear_costs(n_rows: int, width: int, rank: int, warm: bool = False, device="cpu", *, lanes: int = 1,
                 round_trip: float = 0.0, entry_seconds: float = 0.0) -> dict:  # fmt: skip
    """The cost model's estimated seconds of each method, ``{"explicit": s, "cg": s}`` (see :func:`linear_method`).

    ``device``: a device name or its back-end (:meth:`~mwumkl_dist.data.backends.CPUBackend.pass_costs`: a GPU's
    passes are the device's, and its explicit Hessian copies the columns it needs to the host first).
    ``lanes``: the threads the shards' passes run on together (a cluster's worker threads; 1 for the local engine,
    whose model must not depend on its thread count); ``round_trip``: seconds of one call to every shard (each pass
    is one, and the conjugate gradients make many); ``entry_seconds``: the extra cost of a column entry per pass
    where the shards do not keep the columns in memory (read back or computed again,
    :func:`~mwumkl_dist.solvers.two_stage.shards.pass_cost`).  The driver's factorisations are not parallel.
    """
    n, w, r = float(n_rows), float(width), float(rank)
    p = float(max(1, lanes))
    n_active = n / 4 if warm else n
    output_pass, product, copy = backend_named(device).pass_costs(PASS_SECONDS, CG_PASS_SECONDS)
    outputs = NEWTON_STEPS * (n * w * (output_pass + entry_seconds) / p + round_trip)
    explicit = (2 * n_active * w * w / p + NEWTON_STEPS * r**3 / 3) / GEMM_RATE + outputs
    explicit += n_active * w * (copy + entry_seconds) / p
    cg = (4 * (r + 1) * r * r + r**3 / 3) / GEMM_RATE + outputs
    cg += NEWTON_STEPS * (1 + CG_PRODUCTS) * (min(n_active, n / 4) * w * (product + entry_seconds) / p + round_trip)
    return {"explicit": explicit, "cg": cg}


def linear_method(n_rows: int, width: int, rank: int, warm: bool = False, device="cpu", **cluster) -> str:
    """The cheaper way to solve the squared hinge on ``n_rows`` rows' columns of ``width`` landmarks at ``rank``:
    ``"explicit"`` (:func:`newton_solve`) or ``"cg"`` (:func:`cg_newton_solve`), by the cost model above.

    The explicit Hessian costs ``O(n_A width^2)`` to form (every row is active at a cold start, about a quarter
    from a warm one) and ``O(rank^3 / 3)`` per step; the conjugate gradients ``O(n_A width)`` per product and a
    sketch of ``2 rank`` rows.  Both make one pass over all rows per step for the outputs.  On a GPU
    (``device="cuda"``, or its back-end) the passes are the device's, and the explicit Hessian copies the columns
    it needs to the host first.  ``cluster``: where the shards run (:func:`linear_costs`' ``lanes``,
    ``round_trip``, ``entry_seconds``): the shards' work divides over the lanes, the driver's does not, and each
    pass pays a round trip, so a cluster may choose the other method than one process (their solutions agree to
    the solver's tolerance, not bit for bit).
    """
    costs = linear_costs(n_rows, width, rank, warm, device, **cluster)
    return "cg" if costs["cg"] < costs["explicit"] else "explicit"


def solve_squared_hinge(shards, rank: int, C: float, *, tol: float = 1e-10, max_iter: int = 100, **options):
    """The 2-norm soft-margin SVM on the shards' loaded features by a finite Newton method: ``(coef, intercept)``.

    Minimises ``1/2 (|w|^2 + b^2) + C/2 sum_j c_j max(0, 1 - y_j (w' f_j + b))^2``
    (``y_j``, ``c_j``: the labels and weights the shards were loaded with; the bias regularised as
    LIBLINEAR does it, so this is ``LinearSVC(C=C/2, loss="squared_hinge")``'s
    problem) by L2-SVM-MFN (Keerthi & DeCoste, JMLR 2005): Newton steps on the
    active set ``A = {j : y_j o_j < 1}``, ``(I + C Z_A' D_A Z_A) v = C Z_A' D_A y_A``
    with ``Z = [F, 1]``, each followed by an exact line search.  It ends when the
    active set repeats with a full step (the exact optimum), when the objective
    stops decreasing (relative ``tol``), or after ``max_iter`` steps.  Per step
    the shards add the Gram parts of the rows that changed sides (in tree
    order over the row blocks) and keep ``F d`` and the outputs ``o`` on their rows (:mod:`.margins`); the driver
    holds ``r``-sized state.  ``shards``: a shard pool
    (:mod:`mwumkl_dist.engines.pool`) of :class:`LinearShard`, their slots their
    row ranges, their problems loaded.  ``options``: :class:`NewtonOptions`' fields.
    """
    result = newton_solve(shards, Basis(int(rank), None), C, tol=tol, max_iter=max_iter, **options)
    return result.coef, result.intercept


def fit_squared_hinge(F, y_pm, C: float, sample_weight=None, *, tol: float = 1e-10, max_iter: int = 100):
    """:func:`solve_squared_hinge` on in-memory features ``F`` (``(n, r)``): ``(coef, intercept)``."""
    F = np.asarray(F, dtype=np.float64)
    y = np.asarray(y_pm, dtype=np.float64)
    cw = np.ones(len(y)) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    with LocalPool([(0, F.shape[0])], lambda rows: functools.partial(LinearShard, F, *rows, storage="memory")) as pool:
        pool.call("load_problem", lambda rows: (GivenFeatures(F.shape[1]), y, cw, None, None, "float64"))
        return solve_squared_hinge(pool, F.shape[1], C, tol=tol, max_iter=max_iter)
