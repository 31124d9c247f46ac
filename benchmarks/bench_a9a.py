"""Speed of the MWUMKL solver on a9a (run on demand; not a test).

Cases (``benchmarks/README.md`` explains each and records the figures)::

    a) kernels "poly:1,gaussian:2,gaussian:4", eps 0.05, rho 0.5 (T = 8313):
       ms per iteration of the solver loop, whole fit, test error, decision
       function on the 16281 test rows
    b) the paper's 12 kernels, same eps: ms per iteration on a fixed number of
       iterations, then the whole fit (not with --quick)
    c) scikit-learn SVC(kernel="precomputed") on the trace-normalised average
       of the 3 kernels ("Uniform") against MWUMKL on the same random
       10,000-point subsample: fit times and their ratio
    d) a literal numpy loop (dense X, numpy kernel columns every iteration)
       against the numba path: ms per iteration and the speed ratio
    e) where a superstep's time goes, through the public kernel functions:
       the two kernel columns (dot products and kernel values, materialised),
       the V/g update with argmax from those columns, the fused superstep,
       and the Python overhead per iteration

Every figure is wall-clock time.  The numba path runs on one thread unless
stated (``--threads N`` adds N-thread figures, default: the usable cores; the
library's own default is every core, see the estimator's ``n_jobs`` and
:mod:`mwumkl_dist.threads`).  Run it on an otherwise idle machine: the load
average at start and end is printed with the results.

Usage::

    python benchmarks/bench_a9a.py [--quick] [--out DIR] [--threads N]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import time
import warnings
from functools import partial
from pathlib import Path

import numba
import numpy as np
import scipy
import sklearn
from sklearn.datasets import load_svmlight_file
from sklearn.metrics.pairwise import polynomial_kernel, rbf_kernel
from sklearn.svm import SVC
from threadpoolctl import threadpool_limits

import mwumkl_dist
from mwumkl_dist import MWUMKLClassifier
from mwumkl_dist.data.problems import FeatureProblem
from mwumkl_dist.devices import cpu as _columns
from mwumkl_dist.engines.local import LocalEngine
from mwumkl_dist.kernels import KernelSet
from mwumkl_dist.kernels.evaluation import as_csr, plan_args
from mwumkl_dist.solvers import mwu

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "datasets"
THREE = "poly:1,gaussian:2,gaussian:4"
SIGMAS = (2.0, 4.0)  # the Gaussians of THREE
EPS, RHO = 0.05, 0.5


# ----------------------------------------------------------------------------- helpers


def machine_info(argv) -> dict:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    commit = "unknown"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        commit = (
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
            ).stdout.strip()
            or "unknown"
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        if dirty and commit != "unknown":
            commit += " (with uncommitted changes)"
    try:
        from mwumkl_dist.threads import available_cpus

        usable = available_cpus()  # affinity and cgroup quota
    except ImportError:  # versions before mwumkl_dist.threads
        usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "command": shlex.join(["python", *argv]),
        "cwd": os.getcwd(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "cpu": cpu,
        "logical_cores": os.cpu_count(),
        "usable_cores": usable,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "scikit-learn": sklearn.__version__,
        "numba": numba.__version__,
        "numba_threads": numba.config.NUMBA_NUM_THREADS,
        "mwumkl_dist": mwumkl_dist.__version__,
        "mwumkl_dist_path": str(Path(mwumkl_dist.__file__).parent),
        "commit": commit,
        "load_average_start": [round(x, 2) for x in os.getloadavg()],
    }


def has_threads() -> bool:
    """Whether the library takes ``n_jobs`` (versions before it ran on one thread)."""
    return "n_jobs" in MWUMKLClassifier().get_params()


@contextlib.contextmanager
def threads(n: int):
    """The library's threads in this thread for the duration of a block (public API: mwumkl_dist.threads)."""
    if not has_threads():
        if n != 1:
            raise RuntimeError("this mwumkl_dist has no thread setting; run with --threads 1")
        yield
        return
    from mwumkl_dist.threads import thread_limit

    with thread_limit(n):
        yield


class Timer:
    """Wall-clock seconds (``wall``) and this thread's CPU seconds (``cpu``) of a block.

    On a machine shared with other work, the CPU time of a one-thread run is
    what its wall time would be on an idle machine (time-slicing excluded);
    the report gives both.
    """

    def __enter__(self):
        self._wall = time.perf_counter()
        self._cpu = time.thread_time()
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self._wall
        self.cpu = time.thread_time() - self._cpu


@contextlib.contextmanager
def timed_solver(record: list):
    """Time every ``mwu.solve`` call the estimator makes (the solver loop alone).

    The estimator calls it as ``one_vs_rest.solve`` (imported there by name): both names are replaced.
    """
    from mwumkl_dist.solvers.mwu import one_vs_rest

    original = mwu.solve

    def solve(*args, **kwargs):
        with Timer() as t:
            result = original(*args, **kwargs)
        record.append((t, result.n_iter))
        return result

    mwu.solve = one_vs_rest.solve = solve
    try:
        yield
    finally:
        mwu.solve = one_vs_rest.solve = original


def fit_timed(X, y, n_threads: int, **params) -> dict:
    """Fit an estimator; wall and CPU time of the fit and of its solver loop.

    Without the exact polish of newer versions (``polish=False``): what is
    timed is the MWU algorithm.  (``polish="auto"`` skips problems of a9a's
    size anyway: their support sets exceed its budget.)
    """
    record: list = []
    if "polish" in MWUMKLClassifier().get_params():
        params.setdefault("polish", False)  # time the MWU algorithm alone
    params.setdefault("C", 100.0)  # the default until C="auto" became it: no cross-validation inside the timing
    if has_threads():
        params.setdefault("n_jobs", n_threads)
    clf = MWUMKLClassifier(**params)
    with threads(n_threads), timed_solver(record), Timer() as fit:
        clf.fit(X, y)
    n_iter = sum(r[1] for r in record)
    out = {"clf": clf, "n_iter": n_iter, "fit_s": fit.wall, "solve_s": sum(r[0].wall for r in record)}
    out["ms_per_iter"] = 1e3 * out["solve_s"] / n_iter
    if n_threads == 1:  # CPU time of the calling thread is the whole work only on one thread
        out["fit_cpu_s"] = fit.cpu
        out["solve_cpu_s"] = sum(r[0].cpu for r in record)
        out["ms_per_iter_cpu"] = 1e3 * out["solve_cpu_s"] / n_iter
    return out


def decision_timed(clf, X, n_threads: int) -> tuple[np.ndarray, Timer]:
    with threads(n_threads), Timer() as t:
        scores = clf.decision_function(X)
    return scores, t


def error_rate(clf, scores, y) -> float:
    pred = clf.classes_[(scores > 0).astype(int)]
    return float(np.mean(pred != y))


def warm_up(X, y, specs, n_threads_list):
    """Compile (or load from numba's cache) every kernel the runs below use.

    A few iterations on all the rows, so that the parallel paths are taken as in the runs.
    """
    start = time.perf_counter()
    for spec in specs:
        for n_threads in n_threads_list:
            clf = fit_timed(X, y, n_threads, kernels=spec, epsilon=EPS, rho=RHO, max_iter=3)["clf"]
            decision_timed(clf, X[:2000], n_threads)
    return time.perf_counter() - start


# ----------------------------------------------------------------------------- cases


def case_a(X, y, Xt, yt, n_threads_list, quick) -> dict:
    max_iter = 1000 if quick else None
    out = {"kernels": THREE, "epsilon": EPS, "rho": RHO, "T": mwu.iteration_count(EPS, RHO, X.shape[0])}
    out["max_iter"] = max_iter
    models = {}
    for n_threads in n_threads_list:
        r = fit_timed(X, y, n_threads, kernels=THREE, epsilon=EPS, rho=RHO, max_iter=max_iter)
        clf = r.pop("clf")
        scores, dec = decision_timed(clf, Xt, n_threads)
        models[n_threads] = clf
        if n_threads == 1:
            r["decision_cpu_s"] = dec.cpu
        r.update(
            test_error=error_rate(clf, scores, yt),
            decision_s=dec.wall,
            n_support=int(len(clf.support_)),
            kernel_weights=[round(float(w), 6) for w in clf.kernel_weights_],
        )
        out[f"threads_{n_threads}"] = r
    base = models[n_threads_list[0]]
    out["same_model_all_thread_counts"] = all(
        np.array_equal(m.dual_coef_, base.dual_coef_) and np.array_equal(m.intercept_, base.intercept_)
        for m in models.values()
    )
    return out


def case_b(X, y, n_threads_list, quick) -> dict:
    fixed = 300 if quick else 2000
    out = {"kernels": "paper", "epsilon": EPS, "rho": RHO, "T": mwu.iteration_count(EPS, RHO, X.shape[0])}
    out["fixed_iterations"] = fixed
    for n_threads in n_threads_list:
        r = fit_timed(X, y, n_threads, kernels="paper", epsilon=EPS, rho=RHO, max_iter=fixed)
        r.pop("clf")
        out[f"threads_{n_threads}"] = r
    if not quick:
        r = fit_timed(X, y, 1, kernels="paper", epsilon=EPS, rho=RHO)
        clf = r.pop("clf")
        r["n_support"] = int(len(clf.support_))
        out["whole_fit_threads_1"] = r
    return out


def uniform_kernel(A, B, traces, n):
    """``sum_i n / (m r_i) K_i(A, B)`` for the 3 kernels (unit mean diagonal on the training rows)."""
    m = 1 + len(SIGMAS)
    K = polynomial_kernel(A, B, degree=1, gamma=1.0, coef0=1.0) * (n / (m * traces[0]))
    for sigma, r in zip(SIGMAS, traces[1:]):
        K += rbf_kernel(A, B, gamma=1.0 / (2.0 * sigma**2)) * (n / (m * r))
    return K


def case_c(X, y, Xt, yt, quick, svc_C) -> dict:
    n_sub = min(3000 if quick else 10_000, X.shape[0])  # a smoke run's data are smaller
    rng = np.random.default_rng(0)
    idx = np.sort(rng.choice(X.shape[0], n_sub, replace=False))
    Xs, ys = X[idx], y[idx]
    out = {"n_subsample": n_sub, "seed": 0, "svc_C": svc_C}

    with Timer() as t:
        sq = np.asarray(Xs.multiply(Xs).sum(axis=1)).ravel()
        traces = np.array([np.sum(sq + 1.0), n_sub, n_sub], dtype=np.float64)
        K = uniform_kernel(Xs, Xs, traces, n_sub)
    out["uniform_kernel_s"], out["uniform_kernel_cpu_s"] = t.wall, t.cpu
    svc = SVC(kernel="precomputed", C=svc_C)
    with Timer() as t:
        svc.fit(K, ys)
    out["svc_fit_s"], out["svc_fit_cpu_s"] = t.wall, t.cpu
    out["svc_n_support"] = int(svc.support_.size)
    del K
    wrong = 0
    for a in range(0, Xt.shape[0], 4000):
        Kt = uniform_kernel(Xt[a : a + 4000], Xs, traces, n_sub)
        wrong += int(np.sum(svc.predict(Kt) != yt[a : a + 4000]))
    out["svc_test_error"] = wrong / Xt.shape[0]

    r = fit_timed(Xs, ys, 1, kernels=THREE, epsilon=EPS, rho=RHO)
    clf = r.pop("clf")
    scores, _ = decision_timed(clf, Xt, 1)
    out["mwumkl"] = {**r, "test_error": error_rate(clf, scores, yt), "n_support": int(len(clf.support_))}
    out["ratio_svc_fit_over_mwumkl_fit"] = out["svc_fit_s"] / r["fit_s"]
    out["ratio_svc_kernel_and_fit_over_mwumkl_fit"] = (out["svc_fit_s"] + out["uniform_kernel_s"]) / r["fit_s"]
    out["ratio_cpu_svc_fit_over_mwumkl_fit"] = out["svc_fit_cpu_s"] / r["fit_cpu_s"]
    return out


def numpy_loop(Xd, y, n_iter, C=100.0):
    """The algorithm (SPEC section 1) written literally with numpy on dense data.

    Returns the picks ``[(iP, iN), ...]`` and the :class:`Timer` of the loop.
    """
    n = Xd.shape[0]
    gammas = [1.0 / (2.0 * s**2) for s in SIGMAS]
    sq = np.einsum("ij,ij->i", Xd, Xd)
    traces = np.array([np.sum(sq + 1.0), n, n], dtype=np.float64)
    inv = 1.0 / traces
    ridge = 1.0 / (C * n)
    eps_p = mwu.eps_prime(EPS, RHO)
    pos, neg = np.flatnonzero(y > 0), np.flatnonzero(y < 0)

    def columns(j):
        dot = Xd @ Xd[j]
        dist2 = np.maximum(sq + sq[j] - 2.0 * dot, 0.0)
        return np.stack([dot + 1.0] + [np.exp(-g * dist2) for g in gammas], axis=1)

    V = np.zeros((n, 3))
    s = np.zeros(3)
    ip, iq = int(pos[0]), int(neg[0])
    picks = []
    timer = Timer().__enter__()
    for _ in range(n_iter):
        picks.append((ip, iq))
        kp, kq = columns(ip), columns(iq)
        g_pp, g_nn, g_pn = kp[ip] * inv + ridge, kq[iq] * inv + ridge, -kp[iq] * inv
        s = s + V[ip] + V[iq] + (g_pp + g_nn + 2.0 * g_pn) / 4.0
        V += 0.5 * (y[:, None] * kp - y[:, None] * kq) * inv
        V[ip] += 0.5 * ridge
        V[iq] += 0.5 * ridge
        u = np.sqrt(s)
        coef = 2.0 * -np.sinh(eps_p / (2.0 * RHO) * u) / u
        g = V @ coef
        ip, iq = int(pos[np.argmax(g[pos])]), int(neg[np.argmax(g[neg])])
    timer.__exit__()
    return picks, timer


def library_picks(X, y, n_iter, C=100.0):
    """The first ``n_iter`` picks of the library's solver (local engine, one thread)."""
    problem = FeatureProblem(X, y, KernelSet(THREE, X.shape[1]))
    engine = LocalEngine(problem)
    inv = 1.0 / engine.traces()
    ridge = 1.0 / (C * X.shape[0])
    engine.configure(inv, ridge)
    last = []

    def keep(state):
        last[:] = [state]

    with threads(1):
        mwu.solve(engine, inv_trace=inv, ridge=ridge, iterations=mwu.Iterations(EPS, RHO, n_iter), on_state=keep)
    return [tuple(map(int, p)) for p in last[0].picks]


def case_d(X, y, numba_ms, numba_ms_cpu, quick) -> dict:
    n_iter = 50 if quick else 300
    Xd = X.toarray()
    y_pm = np.where(y > 0, 1.0, -1.0)
    out = {"iterations": n_iter}
    with threadpool_limits(limits=1):
        picks, one = numpy_loop(Xd, y_pm, n_iter)
    out["numpy_ms_per_iter_blas_1_thread"] = 1e3 * one.wall / n_iter
    out["numpy_ms_per_iter_blas_1_thread_cpu"] = 1e3 * one.cpu / n_iter
    _, default = numpy_loop(Xd, y_pm, n_iter)
    out["numpy_ms_per_iter_blas_default_threads"] = 1e3 * default.wall / n_iter
    out["numba_ms_per_iter_1_thread"] = numba_ms
    out["numba_ms_per_iter_1_thread_cpu"] = numba_ms_cpu
    out["speedup_numba_vs_numpy_1_thread"] = out["numpy_ms_per_iter_blas_1_thread"] / numba_ms
    out["speedup_numba_vs_numpy_1_thread_cpu"] = out["numpy_ms_per_iter_blas_1_thread_cpu"] / numba_ms_cpu
    out["speedup_numba_vs_numpy_default_blas"] = out["numpy_ms_per_iter_blas_default_threads"] / numba_ms
    # Same algorithm: the numpy loop and the library pick the same points.
    lib = library_picks(X, y_pm, n_iter)
    agree = next((k for k, (a, b) in enumerate(zip(picks, lib)) if a != b), n_iter)
    out["picks_agree_first"] = agree
    return out


# -- e) breakdown: the superstep's pieces through the library's public kernel functions


def _kernel_columns(X, p, q, pa, row_sq, reps):
    for _ in range(reps):
        cols = _columns.kernel_columns(X, p, q, pa, row_sq=row_sq)
    return cols


def _column_updates(y, V, cols, ip, iq, inv, coef, reps):
    for _ in range(reps):
        pick = _columns.Pick(ip, iq, 1.0, -1.0, 1e-6, 1e-6)
        _columns.superstep_columns(_columns.RowBlock(y, 0, V, inv), cols[0], cols[1], pick, coef)


def _best_of(fn, reps, rounds=5):
    fn(1)
    times = []
    for _ in range(rounds):
        with Timer() as t:
            fn(reps)
        times.append(t.cpu / reps)  # CPU time: robust to other work on the machine
    return 1e3 * min(times)


def case_e(X, y, solver_ms: dict, quick) -> dict:
    """Milliseconds per superstep spent in each piece (one thread), for both kernel sets."""
    reps = 20 if quick else 100
    X = as_csr(X)
    n = X.shape[0]
    y_pm = np.where(y > 0, 1.0, -1.0)
    rng = np.random.default_rng(0)
    pos, neg = np.flatnonzero(y_pm > 0), np.flatnonzero(y_pm < 0)
    pairs = [(int(rng.choice(pos)), int(rng.choice(neg))) for _ in range(8)]
    C = X.tocsc()
    C.sort_indices()
    out = {"note": "mean over 8 random (positive, negative) pairs; best of 5 rounds each"}
    for spec in (THREE, "paper"):
        plan = KernelSet(spec, X.shape[1]).plan
        pa = plan_args(plan)
        m = plan.n_kernels
        row_sq = _columns.group_sqnorms(X.indptr, X.indices, X.data, plan.feat_ptr, plan.feat_groups, 1)
        csc = (C.indptr, C.indices, C.data)
        res = {"kernel_columns_ms": [], "v_update_g_argmax_ms": [], "superstep_ms": []}
        V = np.zeros((n, m), order="F")
        coef, inv = -np.ones(m), np.full(m, 1e-4)
        for ip, iq in pairs:
            p = X[ip].toarray().ravel()
            q = X[iq].toarray().ravel()
            res["kernel_columns_ms"].append(_best_of(partial(_kernel_columns, X, p, q, pa, row_sq), reps))
            cols = _kernel_columns(X, p, q, pa, row_sq, 1)
            update = partial(_column_updates, y_pm, V, cols, ip, iq, inv, coef)
            res["v_update_g_argmax_ms"].append(_best_of(update, reps))
            step = partial(_supersteps, X, y_pm, V, p, q, ip, iq, inv, coef, pa, _columns.RowViews(row_sq, csc))
            with threads(1):
                res["superstep_ms"].append(_best_of(step, max(reps // 5, 5)))
        res = {k: float(np.mean(v)) for k, v in res.items()}
        if spec in solver_ms:
            res["solver_ms_per_iter"] = solver_ms[spec]
            res["python_and_driver_ms_per_iter"] = solver_ms[spec] - res["superstep_ms"]
        out[spec] = res
    return out


def _supersteps(X, y, V, p, q, ip, iq, inv, coef, pa, views, reps):
    rows, pick = _columns.RowBlock(y, 0, V, inv), _columns.Pick(ip, iq, 1.0, -1.0, 1e-6, 1e-6)
    for _ in range(reps):
        _columns.superstep_features(X, rows, p, q, pick, coef, pa, views)


# ----------------------------------------------------------------------------- report


def _fmt(x, unit=""):
    if isinstance(x, float):
        if math.isnan(x):
            return "n/a"
        return f"{x:.3g}{unit}" if abs(x) < 100 else f"{x:.0f}{unit}"
    return f"{x}{unit}"


def _row(label, r, test="", decision=""):
    cpu = r.get("ms_per_iter_cpu")
    return (
        label,
        f"{r['ms_per_iter']:.3f}",
        "" if cpu is None else f"{cpu:.3f}",
        f"{r['solve_s']:.2f}",
        f"{r['fit_s']:.2f}",
        "" if r.get("fit_cpu_s") is None else f"{r['fit_cpu_s']:.2f}",
        str(r["n_iter"]),
        test,
        decision,
    )


def print_report(res: dict) -> None:
    info = res["machine"]
    print("\n=== mwumkl_dist a9a speed benchmark ===")
    keys = ("command", "date", "cpu", "usable_cores", "python", "numpy", "scipy", "scikit-learn", "numba")
    for k in (*keys, "commit", "mwumkl_dist_path"):
        print(f"{k:>16}: {info[k]}")
    print(f"{'load average':>16}: start {info['load_average_start']}, end {info.get('load_average_end')}")
    print(f"{'warm-up':>16}: {res['warm_up_s']:.1f} s (numba compile or cache load, not counted below)")
    print("\nwall = elapsed time; cpu = CPU time of the (single) working thread, i.e. the idle-machine time")
    _print_ab(res)
    for key, show in (("c", _print_c), ("d", _print_d), ("e", _print_e)):
        if key in res:
            show(res[key])


def _print_ab(res):
    a, b = res.get("a", {}), res.get("b", {})
    rows = []
    for key, r in a.items():
        if key.startswith("threads_"):
            dec = f"{r['decision_s']:.2f}" + (f" / {r['decision_cpu_s']:.2f}" if "decision_cpu_s" in r else "")
            rows.append(_row(f"a) 3 kernels, {key[8:]} thr", r, f"{100 * r['test_error']:.2f}%", dec))
    for key, r in b.items():
        if key.startswith("threads_"):
            rows.append(_row(f"b) paper 12, {key[8:]} thr", r))
    if "whole_fit_threads_1" in b:
        rows.append(_row("b) paper 12, whole fit, 1 thr", b["whole_fit_threads_1"]))
    if not rows:
        return
    head = ("case", "ms/iter wall", "ms/iter cpu", "solver s", "fit s", "fit cpu s", "iters", "test err", "decision s")
    widths = [max(len(str(r[i])) for r in [*rows, head]) for i in range(len(head))]
    print()
    print("  ".join(h.ljust(w) for h, w in zip(head, widths)))
    for r in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))
    if a:
        print(
            f"a) same model for every thread count: {a['same_model_all_thread_counts']}; "
            f"decision s = wall / cpu on the {res['n_test']} test rows"
        )


def _print_c(c):
    mw = c["mwumkl"]
    print(f"\nc) {c['n_subsample']}-point subsample (seed 0), 3 kernels")
    print(
        f"   Uniform: kernel matrix {c['uniform_kernel_s']:.2f} s, SVC(precomputed, C={c['svc_C']}) fit "
        f"{c['svc_fit_s']:.2f} s (cpu {c['svc_fit_cpu_s']:.2f} s), {c['svc_n_support']} SVs, "
        f"test error {100 * c['svc_test_error']:.2f}%"
    )
    print(
        f"   MWUMKL : fit {mw['fit_s']:.2f} s (cpu {mw['fit_cpu_s']:.2f} s; {mw['n_iter']} iterations, "
        f"{mw['ms_per_iter']:.3f} ms/iter), {mw['n_support']} SVs, test error {100 * mw['test_error']:.2f}%"
    )
    print(
        f"   ratio SVC fit / MWUMKL fit = {c['ratio_svc_fit_over_mwumkl_fit']:.2f}x wall, "
        f"{c['ratio_cpu_svc_fit_over_mwumkl_fit']:.2f}x cpu "
        f"(SVC with its kernel matrix: {c['ratio_svc_kernel_and_fit_over_mwumkl_fit']:.2f}x wall)"
    )


def _print_d(d):
    print(f"\nd) literal numpy loop, dense X, {d['iterations']} iterations")
    print(
        f"   numpy: {d['numpy_ms_per_iter_blas_1_thread']:.3f} ms/iter wall, "
        f"{d['numpy_ms_per_iter_blas_1_thread_cpu']:.3f} cpu (BLAS 1 thread); "
        f"{d['numpy_ms_per_iter_blas_default_threads']:.3f} wall (BLAS default threads)"
    )
    print(
        f"   numba: {d['numba_ms_per_iter_1_thread']:.3f} ms/iter wall, "
        f"{d['numba_ms_per_iter_1_thread_cpu']:.3f} cpu (1 thread, case a)"
    )
    print(
        f"   speed-up numba / numpy (1 thread each): {d['speedup_numba_vs_numpy_1_thread']:.1f}x wall, "
        f"{d['speedup_numba_vs_numpy_1_thread_cpu']:.1f}x cpu; "
        f"{d['speedup_numba_vs_numpy_default_blas']:.1f}x against numpy with default BLAS threads"
    )
    print(f"   both loops pick the same points for the first {d['picks_agree_first']} of {d['iterations']} iterations")


def _print_e(e):
    print(f"\ne) one superstep by piece, ms of cpu on 1 thread ({e['note']})")
    keys = [
        ("kernel_columns_ms", "kernel columns (dots + values, materialised)"),
        ("v_update_g_argmax_ms", "V/g/argmax"),
        ("superstep_ms", "superstep"),
        ("solver_ms_per_iter", "solver/iter"),
        ("python_and_driver_ms_per_iter", "driver+Python/iter"),
    ]
    for spec in (THREE, "paper"):
        if spec in e:
            print(f"   {spec}: " + ", ".join(f"{name} {_fmt(e[spec][k])}" for k, name in keys if k in e[spec]))
    if "error" in e:
        print(f"   breakdown failed: {e['error']}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations and a 3000-point subsample")
    parser.add_argument("--out", type=Path, help="write bench_a9a.json (all figures) into this directory")
    parser.add_argument("--threads", type=int, help="also measure with this many threads (default: usable cores)")
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA, help=f"default {DEFAULT_DATA}")
    parser.add_argument("--cases", default="abcde", help="which cases to run (default: abcde; d needs a)")
    parser.add_argument(
        "--svc-C", type=float, default=1.0, help="C of the Uniform SVC (kernel scaled to unit mean diagonal)"
    )
    parser.add_argument("--smoke", action="store_true",
                        help="--quick on generated a9a stand-ins, 1 thread: checks the script")  # fmt: skip
    args = parser.parse_args(argv)
    if args.smoke:
        import tempfile

        if str(ROOT) not in sys.path:
            sys.path.insert(0, str(ROOT))
        from benchmarks.common import smoke_datasets

        sizes = {"a9a.svm.gz": ("a9a", 600), "a9a.test.svm.gz": ("a9a", 300)}
        args.data_dir = smoke_datasets(tempfile.mkdtemp(prefix="bench-smoke-"), sizes)
        args.quick, args.threads = True, 1
    cases = set(args.cases.lower())
    if not cases or not cases <= set("abcde"):
        parser.error(f"--cases takes letters from 'abcde', got {args.cases!r}")
    if "d" in cases:
        cases.add("a")
    train, test = args.data_dir / "a9a.svm.gz", args.data_dir / "a9a.test.svm.gz"
    for path in (train, test):
        if not path.is_file():
            parser.error(f"data file not found: {path} (use --data-dir)")
    info = machine_info([sys.argv[0], *(sys.argv[1:] if argv is None else argv)])
    n_threads = args.threads if args.threads is not None else info["usable_cores"]
    if not has_threads():
        n_threads = 1
    thread_list = [1] if n_threads <= 1 else [1, n_threads]
    if n_threads > numba.config.NUMBA_NUM_THREADS:
        parser.error(f"--threads {n_threads} exceeds numba's thread count {numba.config.NUMBA_NUM_THREADS}")

    X, y = load_svmlight_file(str(train), n_features=123)
    Xt, yt = load_svmlight_file(str(test), n_features=123)
    X, Xt = X.tocsr(), Xt.tocsr()
    warnings.simplefilter("ignore", category=mwu.ConvergenceWarning)
    res: dict = {"machine": info, "n_test": Xt.shape[0]}
    print(f"a9a: train {X.shape}, {X.nnz} non-zeros; test {Xt.shape}", flush=True)
    res["warm_up_s"] = warm_up(X, y, [THREE, "paper"], thread_list)
    if len(thread_list) > 1:
        info["numba_threading_layer"] = numba.threading_layer()

    if "a" in cases:
        print("case a ...", flush=True)
        res["a"] = case_a(X, y, Xt, yt, thread_list, args.quick)
    if "b" in cases:
        print("case b ...", flush=True)
        res["b"] = case_b(X, y, thread_list, args.quick)
    if "c" in cases:
        print("case c ...", flush=True)
        res["c"] = case_c(X, y, Xt, yt, args.quick, args.svc_C)
    if "d" in cases:
        print("case d ...", flush=True)
        a1 = res["a"]["threads_1"]
        res["d"] = case_d(X, y, a1["ms_per_iter"], a1["ms_per_iter_cpu"], args.quick)
    if "e" in cases:
        print("case e ...", flush=True)
        solver_ms = {}
        if "a" in res:
            solver_ms[THREE] = res["a"]["threads_1"]["ms_per_iter_cpu"]
        if "b" in res:
            solver_ms["paper"] = res["b"]["threads_1"]["ms_per_iter_cpu"]
        try:
            res["e"] = case_e(X, y, solver_ms, args.quick)
        except Exception as exc:  # the breakdown drives the kernel functions directly: keep the other figures
            res["e"] = {"note": "", "error": f"{type(exc).__name__}: {exc}"}
    info["load_average_end"] = [round(x, 2) for x in os.getloadavg()]

    print_report(res)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / "bench_a9a.json"
        path.write_text(json.dumps(res, indent=2, default=float) + "\n")
        print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
