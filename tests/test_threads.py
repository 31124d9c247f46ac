"""Thread counts: affinity/cgroup-aware cores, n_jobs resolution, the default and its caps."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

from mwumkl_dist.devices import threads
from mwumkl_dist.solvers.auto import FewIterationsWarning


@pytest.fixture
def cpus(monkeypatch, tmp_path):
    """A fake machine: ``cpus(n)`` sets the affinity mask; cgroup files live under tmp_path."""
    root = tmp_path / "cgroup"
    root.mkdir()
    proc = tmp_path / "proc_self_cgroup"
    proc.write_text("0::/\n")
    monkeypatch.setattr(threads, "_CGROUP_ROOT", str(root))
    monkeypatch.setattr(threads, "_PROC_SELF_CGROUP", str(proc))
    monkeypatch.setattr(threads, "_CGROUP_TTL", 0.0)
    for name in (threads.ENV_VAR, "OMP_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(threads, "_openmp_limit", lambda: None)
    monkeypatch.setattr(threads, "_dask_worker_threads", lambda: None)

    def set_cpus(n):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(n)), raising=False)

    set_cpus.root = root
    set_cpus.proc = proc
    set_cpus(16)
    return set_cpus


def test_affinity(cpus):
    cpus(6)
    assert threads.available_cpus() == 6


def test_no_affinity_function_falls_back_to_cpu_count(cpus, monkeypatch):
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    assert threads.available_cpus() == 3


def test_cgroup_v2_quota(cpus):
    (cpus.root / "cpu.max").write_text("250000 100000\n")
    assert threads.available_cpus() == 3  # 2.5 cores rounded up
    (cpus.root / "cpu.max").write_text("max 100000\n")
    assert threads.available_cpus() == 16


def test_cgroup_v2_nested_group_and_parent_limits(cpus):
    cpus.proc.write_text("0::/job/step\n")
    step = cpus.root / "job" / "step"
    step.mkdir(parents=True)
    (step / "cpu.max").write_text("max 100000\n")
    (cpus.root / "job" / "cpu.max").write_text("400000 100000\n")
    assert threads.available_cpus() == 4
    (step / "cpu.max").write_text("100000 100000\n")
    assert threads.available_cpus() == 1


def test_cgroup_quota_never_raises_above_affinity(cpus):
    cpus(2)
    (cpus.root / "cpu.max").write_text("800000 100000\n")
    assert threads.available_cpus() == 2


def test_cgroup_v1_quota(cpus):
    cpus.proc.write_text("4:memory:/x\n1:cpu,cpuacct:/\n")
    v1 = cpus.root / "cpu,cpuacct"
    v1.mkdir()
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert threads.available_cpus() == 16
    (v1 / "cpu.cfs_quota_us").write_text("50000\n")
    assert threads.available_cpus() == 1


def test_cgroup_quota_is_cached(cpus, monkeypatch):
    monkeypatch.setattr(threads, "_CGROUP_TTL", 60.0)
    (cpus.root / "cpu.max").write_text("200000 100000\n")
    assert threads.available_cpus() == 2
    (cpus.root / "cpu.max").write_text("400000 100000\n")
    assert threads.available_cpus() == 2  # read again after the TTL only
    monkeypatch.setattr(threads, "_CGROUP_TTL", 0.0)
    assert threads.available_cpus() == 4


def test_garbage_cgroup_files_are_ignored(cpus):
    (cpus.root / "cpu.max").write_text("lots 0\n")
    cpus.proc.write_text("garbage\n")
    assert threads.available_cpus() == 16


def test_resolve_n_jobs_sklearn_meaning(cpus):
    cpus(8)
    assert threads.resolve_n_jobs(None) == 8
    assert threads.resolve_n_jobs(-1) == 8
    assert threads.resolve_n_jobs(-2) == 7
    assert threads.resolve_n_jobs(-100) == 1
    assert threads.resolve_n_jobs(3) == 3
    assert threads.resolve_n_jobs(np.int64(2)) == 2
    assert threads.resolve_n_jobs(64) == 8  # capped at the available cores


@pytest.mark.parametrize("bad", [0, 1.5, 2.0, "2", "all", True, [2]])
def test_resolve_n_jobs_rejects(cpus, bad):
    with pytest.raises(ValueError, match="n_jobs"):
        threads.resolve_n_jobs(bad)


def test_default_is_all_cores(cpus):
    cpus(12)
    assert threads.default_threads() == 12


def test_env_override(cpus, monkeypatch):
    cpus(8)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the explicit override wins over the caps
    monkeypatch.setenv(threads.ENV_VAR, "3")
    assert threads.default_threads() == 3
    assert threads.resolve_n_jobs(None) == 3
    assert threads.resolve_n_jobs(-1) == 8  # an explicit n_jobs is not overridden
    monkeypatch.setenv(threads.ENV_VAR, "100")
    assert threads.default_threads() == 8
    for text in ("auto", "0", " AUTO "):
        monkeypatch.setenv(threads.ENV_VAR, text)
        assert threads.default_threads() == 8


@pytest.mark.parametrize("bad", ["-1", "two", "1.5"])
def test_env_override_rejects(cpus, monkeypatch, bad):
    monkeypatch.setenv(threads.ENV_VAR, bad)
    with pytest.raises(ValueError, match=threads.ENV_VAR):
        threads.default_threads()


def test_omp_num_threads_caps_the_default(cpus, monkeypatch):
    cpus(8)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert threads.default_threads() == 2
    monkeypatch.setenv("OMP_NUM_THREADS", "4,2")
    assert threads.default_threads() == 4
    monkeypatch.setenv("OMP_NUM_THREADS", "nonsense")
    assert threads.default_threads() == 8


def test_dask_worker_caps_the_default(cpus, monkeypatch):
    cpus(8)
    monkeypatch.setattr(threads, "_dask_worker_threads", lambda: 3)
    assert threads.default_threads() == 3


def test_openmp_limit_caps_the_default(cpus, monkeypatch):
    cpus(8)
    monkeypatch.setattr(threads, "_openmp_limit", lambda: 2)
    assert threads.default_threads() == 2


def test_threadpoolctl_limits_are_honoured(monkeypatch):
    threadpoolctl = pytest.importorskip("threadpoolctl")
    monkeypatch.delenv(threads.ENV_VAR, raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    if not threadpoolctl.ThreadpoolController().select(user_api="openmp").lib_controllers:
        pytest.skip("no OpenMP library loaded")
    with threadpoolctl.threadpool_limits(limits=1, user_api="openmp"):
        assert threads.default_threads() == 1


def test_not_in_a_dask_worker():
    assert threads._dask_worker_threads() is None


@pytest.mark.timeout(60)
def test_inside_a_dask_worker():
    distributed = pytest.importorskip("distributed")
    with (
        distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster,
        distributed.Client(cluster) as client,
    ):
        assert client.submit(threads._dask_worker_threads, pure=False).result() == 1


def test_thread_state_and_policy_need_no_numba(monkeypatch):
    """devices/threads.py runs alone: no numba, numpy or package import; without a pool, the cores cap it."""
    import importlib.util
    import sys

    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("numba", "numpy", "mwumkl_dist"):
                raise ImportError(f"{name} is blocked")

    monkeypatch.setattr(sys, "meta_path", [Block(), *sys.meta_path])
    spec = importlib.util.spec_from_file_location("threads_alone", threads.__file__)
    alone = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(alone)
    assert alone.pool_size() == alone.available_cpus()
    with alone.limit_threads(10**6):
        assert alone.current_threads() == alone.available_cpus()
    alone.register_pool(lambda: 1)
    with alone.thread_limit(None), alone.limit_threads(3):
        assert alone.current_threads() == 1
    assert alone.ordered_map(lambda x: 2 * x, range(5)) == [0, 2, 4, 6, 8]
    assert alone.dask_worker() is None and alone.worker_threads(object()) is None


def test_ordered_map_keeps_the_order_on_several_threads():
    with threads.limit_threads(2):
        assert threads.ordered_map(lambda x: x * x, range(50)) == [x * x for x in range(50)]


def _pool_of(n, monkeypatch):
    """A compute pool of ``n`` threads, whatever the machine (the region's counts are the policy's, not numba's)."""
    monkeypatch.setattr(threads, "_pool", [lambda: n])


def test_a_region_runs_at_most_its_threads_and_hands_a_leaving_workers_threads_on(monkeypatch):
    """ordered_map's workers share the caller's threads: never more at once, and more once others are done."""
    import threading
    import time

    _pool_of(8, monkeypatch)
    lock, running, peak = threading.Lock(), [0], [0]

    def item(i):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        share = threads.current_threads()
        time.sleep(0.01)
        with lock:
            running[0] -= 1
        return share

    with threads.limit_threads(3):
        shares = threads.ordered_map(item, range(12))
    assert peak[0] <= 3 and max(shares) <= 3 and min(shares) >= 1
    three = threading.Barrier(3, timeout=30)

    def side_by_side(i):
        three.wait()
        share = threads.current_threads()
        three.wait()  # none has left before all have read their share
        return share

    with threads.limit_threads(6):  # 6 threads, 3 items: each item's own parallel work gets 2
        assert threads.ordered_map(side_by_side, range(3)) == [2, 2, 2]
    # Two items side by side get one thread each; the one still running gets both once the other is done.
    both = threading.Barrier(2, timeout=30)

    def pair(i):
        both.wait()
        first = threads.current_threads()
        both.wait()  # both have read their share
        deadline = time.monotonic() + 30
        while i == 0 and threads.current_threads() != 2 and time.monotonic() < deadline:
            time.sleep(0.001)
        return first, threads.current_threads()

    with threads.limit_threads(2):
        assert threads.ordered_map(pair, range(2)) == [(1, 2), (1, 1)]
        assert threads.current_threads() == 2  # the caller's own limit is back

        def nested(i):  # a nested map inside an item of share 1 runs on that item's thread
            both.wait()
            ids = threads.ordered_map(lambda j: threading.get_ident(), range(4))
            both.wait()
            return ids

        assert all(len(set(ids)) == 1 for ids in threads.ordered_map(nested, range(2)))


def test_a_region_raises_the_first_items_error_and_starts_no_item_after_it(monkeypatch):
    _pool_of(2, monkeypatch)
    started = []

    def item(i):
        started.append(i)
        if i in (3, 5):
            raise ValueError(f"item {i}")
        return i

    with threads.limit_threads(2), pytest.raises(ValueError, match="item 3"):
        threads.ordered_map(item, range(40))
    assert max(started) <= 5  # at most the item the other worker had claimed


def test_a_ctrl_c_stops_a_region_after_its_running_items(monkeypatch):
    """The first Ctrl-C reaches every worker (a fold on a helper thread too); no new item starts."""
    import signal
    import threading
    import time

    monkeypatch.setattr(threads, "_CTRL_C_ASKS_TO_STOP", True)  # the suite gives Ctrl-C to pytest
    _pool_of(2, monkeypatch)
    heard, started = [], []
    both = threading.Barrier(2, timeout=30)

    def item(i):
        started.append(i)
        both.wait()
        if i == 0:
            os.kill(os.getpid(), signal.SIGINT)  # the handler runs on the main thread: it asks, it raises nothing
        with threads.sigint_requests_stop() as stop:  # what a fold's MWU iteration listens to
            deadline = time.monotonic() + 30
            while not stop.requested and time.monotonic() < deadline:
                time.sleep(0.001)
            heard.append(stop.requested)
        return i

    with threads.limit_threads(2), pytest.raises(KeyboardInterrupt):
        threads.ordered_map(item, range(20))
    assert len(started) == 2 and heard == [True, True]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_one_blas_thread_holds_while_any_block_runs():
    """BLAS's thread count is per process: blocks on several threads keep it at 1 until the last one ends."""
    import threading

    threadpoolctl = pytest.importorskip("threadpoolctl")

    def blas_threads():
        return {lib["num_threads"] for lib in threadpoolctl.threadpool_info() if lib["user_api"] == "blas"}

    before = blas_threads()
    entered, release, done = threading.Event(), threading.Event(), threading.Event()

    def other():  # a block on another thread that ends first
        with threads.one_blas_thread():
            entered.set()
            release.wait(30)
        done.set()

    helper = threading.Thread(target=other)
    helper.start()
    assert entered.wait(30) and blas_threads() <= {1}
    with threads.one_blas_thread():
        release.set()
        helper.join(30)
        assert done.is_set() and blas_threads() <= {1}  # this block still runs
        with threads.one_blas_thread():  # nested: nothing changes
            assert blas_threads() <= {1}
        assert blas_threads() <= {1}
    assert blas_threads() == before


# ----------------------------------------------------------------------------- n_jobs of the estimator


def _problem(n=300, d=6, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.random((n, d))
    X[::5] = X[1::5][: len(X[::5])]  # duplicated rows: exact ties
    y = np.where(X[:, 0] + 0.3 * rng.standard_normal(n) > 0.5, 1, -1)
    y[::5] = y[1::5][: len(y[::5])]
    return X, y


def _fit(n_jobs, **params):
    from mwumkl_dist import MWUMKLClassifier

    seen = []

    def callback(info):
        seen.append(threads.current_threads())

    X, y = _problem(600, 10)
    # 120 kernels (two tiles) x 600 rows: enough work per superstep for the parallel path on 2 threads.
    params = {"kernels": "paper-per-feature", "C": 1.0, "max_iter": 40, "polish": False, **params}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FewIterationsWarning)
        clf = MWUMKLClassifier(n_jobs=n_jobs, callback=callback, callback_every=10, **params).fit(X, y)
    return clf, seen, X


@pytest.mark.timeout(300)
def test_models_are_bit_identical_for_every_n_jobs():
    import numba

    ref, seen, X = _fit(1)
    assert set(seen) == {1}  # the fit ran under its n_jobs
    ref_scores = ref.decision_function(X)
    for n_jobs in (2, -1, None):
        clf, seen, _ = _fit(n_jobs)
        if n_jobs is None:  # what this thread uses by default (default_threads() within numba's pool)
            expected = threads.current_threads()
        else:
            expected = min(threads.resolve_n_jobs(n_jobs), numba.config.NUMBA_NUM_THREADS)
        assert set(seen) == {expected}, n_jobs
        for name in ("support_", "dual_coef_", "intercept_", "kernel_weights_"):
            assert np.array_equal(getattr(clf, name), getattr(ref, name)), (n_jobs, name)
        assert np.array_equal(clf.decision_function(X), ref_scores), n_jobs
        clf.set_params(n_jobs=1)
        assert np.array_equal(clf.decision_function(X), ref_scores), n_jobs


@pytest.mark.timeout(300)
def test_auto_C_folds_use_n_jobs():
    """C="auto": the cross-validation folds run with the estimator's n_jobs too (and the same choice)."""
    from mwumkl_dist.solvers.mwu import one_vs_rest

    seen = []
    original = one_vs_rest.solve

    def solve(*args, **kwargs):
        seen.append(threads.current_threads())
        return original(*args, **kwargs)

    from mwumkl_dist import MWUMKLClassifier

    X, y = _problem(120)
    params = {"kernels": "linear,gaussian:1", "max_iter": 20, "polish": False, "selectivity": 100.0}
    try:
        one_vs_rest.solve = solve
        one = MWUMKLClassifier(n_jobs=1, **params).fit(X, y)
        assert set(seen) == {1} and len(seen) > 1  # folds and the final fit
    finally:
        one_vs_rest.solve = original
    two = MWUMKLClassifier(n_jobs=2, **params).fit(X, y)
    assert one.C_ == two.C_ and np.array_equal(one.dual_coef_, two.dual_coef_)


@pytest.mark.timeout(300)
def test_auto_folds_run_side_by_side_within_n_jobs_and_choose_the_same(monkeypatch):
    """C="auto" / selectivity="auto": the folds share the fit's threads (never more) and choose as on one thread."""
    import threading
    import time

    from mwumkl_dist import MWUMKLClassifier
    from mwumkl_dist.solvers.mwu import one_vs_rest

    _pool_of(2, monkeypatch)  # two threads whatever the machine
    lock, state = threading.Lock(), {"in_use": 0, "peak": 0, "running": 0, "side_by_side": 0, "folds": 0}
    original = one_vs_rest.solve

    def solve(*args, **kwargs):  # each fold's (and the final fit's) MWU solve, with the threads it may use
        share = threads.current_threads()
        with lock:
            state["in_use"] += share
            state["running"] += 1
            state["peak"] = max(state["peak"], state["in_use"])
            state["side_by_side"] = max(state["side_by_side"], state["running"])
            state["folds"] += 1
        try:
            time.sleep(0.05)  # long enough for the folds to meet
            return original(*args, **kwargs)
        finally:
            with lock:
                state["in_use"] -= share
                state["running"] -= 1

    monkeypatch.setattr(one_vs_rest, "solve", solve)
    X, y = _problem(150)
    params = {"kernels": "linear,gaussian:1", "max_iter": 20, "polish": False, "selectivity": "auto"}
    fits, peaks = {}, {}
    for n in (1, 2):
        state.update(peak=0, side_by_side=0, folds=0)
        with threads.limit_threads(n):
            fits[n] = MWUMKLClassifier(**params).fit(X, y)
        peaks[n] = state["peak"], state["side_by_side"]
    assert state["folds"] == 6 * 3 + 3 * 3 + 1  # the grids' folds and the final fit
    assert peaks == {1: (1, 1), 2: (2, 2)}  # side by side on two threads, one each: never more than the fit's
    one, two = fits[1], fits[2]
    assert one.C_path_ == two.C_path_ and one.selectivity_path_ == two.selectivity_path_
    for name in ("support_", "dual_coef_", "intercept_", "kernel_weights_"):
        assert np.array_equal(getattr(one, name), getattr(two, name)), name


def test_n_jobs_inside_a_caller_limit():
    """n_jobs=None inside threads.thread_limit(1) keeps the caller's 1 thread."""
    with threads.thread_limit(1):
        _, seen, _ = _fit(None, max_iter=20)
    assert set(seen) == {1}


def test_fit_inside_threadpool_limits(monkeypatch):
    """n_jobs=None inside threadpoolctl's OpenMP limit of 1 fits on 1 thread (also right after another fit)."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    monkeypatch.delenv(threads.ENV_VAR, raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    if not threadpoolctl.ThreadpoolController().select(user_api="openmp").lib_controllers:
        pytest.skip("no OpenMP library loaded")
    _fit(None, max_iter=10)
    with threadpoolctl.threadpool_limits(limits=1, user_api="openmp"):
        _, seen, _ = _fit(None, max_iter=20)
    assert set(seen) == {1}


@pytest.mark.parametrize("bad", [0, 1.5, "all", True])
def test_bad_n_jobs_is_a_clear_error(bad):
    from mwumkl_dist import MWUMKLClassifier

    X, y = _problem(40)
    with pytest.raises(ValueError, match="n_jobs"):
        MWUMKLClassifier(n_jobs=bad, C=1.0, max_iter=5).fit(X, y)


def test_n_jobs_is_a_parameter_and_survives_save(tmp_path):
    from sklearn.base import clone

    from mwumkl_dist import MWUMKLClassifier

    clf = MWUMKLClassifier(n_jobs=2)
    assert clone(clf).get_params()["n_jobs"] == 2
    X, y = _problem(60)
    clf.set_params(C=1.0, max_iter=10, polish=False).fit(X, y)
    clf.save(tmp_path / "m.npz")
    loaded = MWUMKLClassifier.load(tmp_path / "m.npz")
    assert loaded.n_jobs == 2
    assert np.array_equal(loaded.decision_function(X), clf.decision_function(X))


def test_cli_n_jobs_option(tmp_path):
    from mwumkl_dist.cli import main

    X, y = _problem(80)
    data = tmp_path / "train.csv"
    np.savetxt(data, np.column_stack([X, y]), delimiter=",")
    model = tmp_path / "m.npz"
    args = ["fit", "--data", str(data), "--model", str(model), "--C", "1", "--max-iter", "10", "--quiet"]
    assert main([*args, "--n-jobs", "1"]) == 0
    assert main(["evaluate", "--model", str(model), "--data", str(data), "--n-jobs", "-1"]) == 0
    out = str(tmp_path / "p.txt")
    assert main(["predict", "--model", str(model), "--data", str(data), "--n-jobs", "2", "-o", out]) == 0
    assert main([*args, "--n-jobs", "0"]) == 2
    assert main([*args, "--n-jobs", "many"]) == 2


def test_a_nannys_omp_num_threads_does_not_cap_the_client(cpus, monkeypatch):
    """A process LocalCluster leaves OMP_NUM_THREADS=1 in the client's os.environ (issue 22): not the user's cap."""
    pytest.importorskip("distributed")
    cpus(8)
    monkeypatch.setattr(threads, "_OMP_AT_IMPORT", None)
    monkeypatch.setattr(threads, "_OMP_AT_LAUNCH", None)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the nanny's pre-spawn value, written after import
    assert threads.user_omp_num_threads() is None and threads.default_threads() == 8
    monkeypatch.setattr(threads, "_OMP_AT_LAUNCH", "1")  # the user started the process with it
    monkeypatch.setattr(threads, "_OMP_AT_IMPORT", "1")
    assert threads.default_threads() == 1
    monkeypatch.setattr(threads, "_OMP_AT_LAUNCH", "3")  # imported after a cluster replaced the user's 3
    assert threads.default_threads() == 3
    monkeypatch.setattr(threads, "_dask_worker_threads", lambda: 4)  # on a worker the variable is its own
    monkeypatch.setattr(threads, "dask_worker", lambda: object())
    assert threads.default_threads() == 1


@pytest.mark.timeout(120)
def test_after_a_process_local_cluster_the_default_uses_every_core(monkeypatch):
    distributed = pytest.importorskip("distributed")
    monkeypatch.delenv(threads.ENV_VAR, raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "_OMP_AT_IMPORT", None)
    monkeypatch.setattr(threads, "_OMP_AT_LAUNCH", None)
    before = threads.default_threads()
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0"):
        pass
    assert os.environ.get("OMP_NUM_THREADS") == "1"  # what distributed leaves behind
    assert threads.default_threads() == before


def test_a_fit_records_its_thread_count(caplog):
    from mwumkl_dist import MWUMKLClassifier

    X = np.random.default_rng(0).normal(size=(60, 3))
    y = np.where(X[:, 0] > 0, 1, 0)
    assert MWUMKLClassifier(kernels="linear", C=1.0, n_jobs=1).fit(X, y).n_threads_ == 1
    with caplog.at_level("INFO", logger="mwumkl_dist"):
        clf = MWUMKLClassifier(kernels="linear", C=1.0, verbose=True).fit(X, y)
    assert clf.n_threads_ == threads.current_threads()
    assert f"fitting on {clf.n_threads_} thread" in caplog.text


def test_other_processes_load_lowers_the_default(cpus, monkeypatch, tmp_path):
    """A busy machine (issue 22): the default leaves the cores other processes use, explicit counts stay."""
    cpus(8)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.setattr(threads, "_cgroup_cpus", lambda: None)
    monkeypatch.setattr(threads, "_BUSY_TTL", 0.0)
    stat = tmp_path / "stat"
    tasks = tmp_path / "task"
    for tid, state in [(1, "R"), (2, "S"), (3, "R")]:  # two of our threads run
        (tasks / str(tid)).mkdir(parents=True)
        (tasks / str(tid) / "stat").write_text(f"{tid} (python (x)) {state} 1 2 3")
    monkeypatch.setattr(threads, "_PROC_STAT", str(stat))
    monkeypatch.setattr(threads, "_PROC_SELF_TASKS", str(tasks))
    for running, expected in [(2, 8), (5, 5), (9, 1), (40, 1)]:
        stat.write_text(f"cpu  1 2 3\nprocs_running {running}\nprocs_blocked 0\n")
        assert threads.busy_cpus() == running - 2 and threads.default_threads() == expected
    assert threads.resolve_n_jobs(4) == 4 and threads.resolve_n_jobs(-1) == 8  # asked for: not adapted
    monkeypatch.setattr(os, "cpu_count", lambda: 64)  # an affinity mask narrower than the machine: unknown
    assert threads.busy_cpus() == 0 and threads.default_threads() == 8
