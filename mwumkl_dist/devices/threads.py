"""How many threads a fit or a prediction may use.

scikit-learn's ``n_jobs`` convention, resolved against the cores this process
may really use:

* :func:`available_cpus` -- the CPUs in the process's affinity mask
  (``os.sched_getaffinity``), further capped by a cgroup CPU quota (v2
  ``cpu.max``, v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``), as in a
  container or a Slurm/Kubernetes job;
* :func:`default_threads` -- what ``n_jobs=None`` means: the
  ``MWUMKL_NUM_THREADS`` environment variable when it is set (an explicit
  override; ``auto`` or ``0`` means all available cores), otherwise every
  available core, capped by the surroundings: a Dask worker's ``nthreads``
  when running inside a worker, ``OMP_NUM_THREADS`` (joblib/loky children
  set it; not the value a Dask nanny leaves in the client process, see
  :func:`user_omp_num_threads`), and the OpenMP limit of a :func:`threadpoolctl.threadpool_limits`
  block;
* :func:`resolve_n_jobs` -- an ``n_jobs`` value to a thread count.

:func:`thread_limit` caps the library's threads for a block (this thread
only) and :func:`current_threads` says what a fit started now would use.
Results never depend on the thread count: models are bit-identical for every
``n_jobs``.

The thread state lives here too: the per-thread cap (:func:`limit_threads`),
the process-wide override (:func:`set_num_threads`) and the cached default,
capped by the compute pool that :mod:`mwumkl_dist.devices.cpu` registers
(:func:`register_pool`: numba's).  So does what the package runs over
threads (:func:`ordered_map`: parallel regions whose workers share the
threads, and the Ctrl-C that stops them, :func:`sigint_requests_stop`),
BLAS's thread count (:func:`one_blas_thread`) and the Dask worker running
this code (:func:`dask_worker`).  This module is pure Python: it imports neither numba
nor the compiled code (``distributed`` only when it is already imported).
"""

from __future__ import annotations

import itertools
import math
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from numbers import Integral

__all__ = [
    "available_cpus",
    "default_threads",
    "resolve_n_jobs",
    "thread_limit",
    "current_threads",
    "ENV_VAR",
]
# Also public, for the package itself (not re-exported by mwumkl_dist.threads): limit_threads,
# set_num_threads, register_pool, ordered_map, sigint_requests_stop, one_blas_thread, dask_worker,
# worker_threads.

#: The environment variable overriding the default thread count.
ENV_VAR = "MWUMKL_NUM_THREADS"

# Where cgroup files are read from (tests point these at a temporary folder).
_CGROUP_ROOT = "/sys/fs/cgroup"
_PROC_SELF_CGROUP = "/proc/self/cgroup"
# Reading the cgroup files takes ~0.1-1 ms; a quota is kept this many seconds (tests set 0).
_CGROUP_TTL = 10.0
_cgroup_cache: dict = {}


# ----------------------------------------------------------------------------- cores


def _affinity_cpus() -> int:
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        n = os.cpu_count() or 1
    return max(1, n)


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as fh:
            return fh.read().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _own_cgroups() -> dict[str, str]:
    """``controller -> path`` from /proc/self/cgroup ('' is the v2 unified hierarchy)."""
    text = _read(_PROC_SELF_CGROUP)
    out: dict[str, str] = {}
    if not text:
        return out
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for controller in parts[1].split(","):
            out.setdefault(controller, parts[2])
    return out


def _ancestors(root: str, path: str) -> list[str]:
    """``root/path`` and its parents up to ``root`` (a limit anywhere above applies)."""
    parts = [p for p in path.strip("/").split("/") if p and p != ".."]
    dirs = [os.path.join(root, *parts[:k]) for k in range(len(parts), 0, -1)]
    dirs.append(root)
    return dirs


def _quota_cpus(quota: float, period: float) -> int | None:
    if quota <= 0 or period <= 0:
        return None
    return max(1, math.ceil(quota / period))


def _cgroup_v2_limit(dirs: list[str]) -> int | None:
    best = None
    for d in dirs:
        text = _read(os.path.join(d, "cpu.max"))
        if not text:
            continue
        fields = text.split()
        if not fields or fields[0] == "max":
            continue
        try:
            quota = float(fields[0])
            period = float(fields[1]) if len(fields) > 1 else 100000.0
        except ValueError:
            continue
        n = _quota_cpus(quota, period)
        if n is not None:
            best = n if best is None else min(best, n)
    return best


def _cgroup_v1_limit(dirs: list[str]) -> int | None:
    best = None
    for d in dirs:
        quota, period = _read(os.path.join(d, "cpu.cfs_quota_us")), _read(os.path.join(d, "cpu.cfs_period_us"))
        if not quota or not period:
            continue
        try:
            n = _quota_cpus(float(quota), float(period))
        except ValueError:
            continue
        if n is not None:
            best = n if best is None else min(best, n)
    return best


def _cgroup_cpus() -> int | None:
    """The CPU quota of this process's cgroup (v2 or v1), rounded up; None when unlimited/unknown.

    Cached for ``_CGROUP_TTL`` seconds.
    """
    key = (_CGROUP_ROOT, _PROC_SELF_CGROUP)
    now = time.monotonic()
    hit = _cgroup_cache.get(key)
    if hit is not None and now - hit[0] < _CGROUP_TTL:
        return hit[1]
    value = _read_cgroup_cpus()
    _cgroup_cache.clear()
    _cgroup_cache[key] = (now, value)
    return value


def _read_cgroup_cpus() -> int | None:
    root = _CGROUP_ROOT
    own = _own_cgroups()
    limits = []
    # v2: one unified hierarchy; the file sits in the process's cgroup (or its ancestors).
    v2 = _cgroup_v2_limit(_ancestors(root, own.get("", "/")))
    if v2 is not None:
        limits.append(v2)
    # v1: the cpu controller is mounted at root/cpu (or root/cpu,cpuacct).
    for mount in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        base = os.path.join(root, mount)
        if os.path.isdir(base):
            dirs = _ancestors(base, own.get("cpu", "/"))
            if base not in dirs:
                dirs.append(base)
            v1 = _cgroup_v1_limit(dirs)
            if v1 is not None:
                limits.append(v1)
            break
    return min(limits) if limits else None


def available_cpus() -> int:
    """The number of CPU cores this process may use (>= 1).

    The CPUs of the affinity mask (``os.sched_getaffinity``; ``os.cpu_count``
    where there is none), capped by the cgroup CPU quota (cgroup v2
    ``cpu.max`` or v1 ``cpu.cfs_quota_us / cpu.cfs_period_us``, rounded up)
    of the process's cgroup and its parents.
    """
    n = _affinity_cpus()
    quota = _cgroup_cpus()
    if quota is not None:
        n = min(n, quota)
    return max(1, n)


# ----------------------------------------------------------------------------- surroundings


def _parse_env_threads(name: str, text: str) -> int:
    """``auto``/``0`` -> 0 (all); a positive integer as given; anything else is a ValueError."""
    value = text.strip().lower()
    if value in ("auto", "0"):
        return 0
    try:
        n = int(value)
    except ValueError:
        n = -1
    if n < 0:
        raise ValueError(f"{name} must be a positive integer, 0 or 'auto' (all cores), got {text!r}")
    return n


def dask_worker():
    """The Dask worker whose thread runs this code, or None (not on a worker, or no ``distributed``).

    Never imports ``distributed``: code runs on a worker only where it is imported already.
    """
    if "distributed" not in sys.modules:
        return None
    try:
        from distributed import get_worker

        return get_worker()
    except Exception:  # not inside a worker (ValueError), or an old/odd distributed
        return None


def worker_threads(worker) -> int | None:
    """A Dask worker's ``nthreads`` (>= 1), None when it has none."""
    for owner in (worker, getattr(worker, "state", None)):
        n = getattr(owner, "nthreads", None)
        if isinstance(n, Integral) and n >= 1:
            return int(n)
    return None


def _dask_worker_threads() -> int | None:
    """The nthreads of the Dask worker running this code, if any."""
    worker = dask_worker()
    return None if worker is None else worker_threads(worker)


def _launch_environ_value(name: str) -> str | None:
    """``name`` in the environment this process was started with (``/proc/self/environ``), None if absent."""
    try:
        with open("/proc/self/environ", "rb") as fh:
            entries = fh.read().split(b"\0")
    except OSError:
        return None
    prefix = name.encode() + b"="
    for entry in entries:
        if entry.startswith(prefix):
            return entry[len(prefix) :].decode(errors="replace")
    return None


#: OMP_NUM_THREADS when the package was imported, and when the process started.
_OMP_AT_IMPORT = os.environ.get("OMP_NUM_THREADS")
_OMP_AT_LAUNCH = _launch_environ_value("OMP_NUM_THREADS")


def _nanny_environ_value(name: str) -> str | None:
    """The value a Dask nanny gives ``name`` (``distributed.nanny.pre-spawn-environ``), None without Dask."""
    if "distributed" not in sys.modules:
        return None
    try:
        import dask

        value = dict(dask.config.get("distributed.nanny.pre-spawn-environ", {}) or {}).get(name)
    except Exception:
        return None
    return None if value is None else str(value).strip()


def user_omp_num_threads() -> str | None:
    """OMP_NUM_THREADS as the user set it, None when unset.

    A process-based ``LocalCluster`` (its nannies) writes ``OMP_NUM_THREADS=1``
    into this process's ``os.environ`` for its worker processes and leaves it
    there after closing; that value caps the workers, not this process.  When
    the variable holds the nanny's value outside a Dask worker, the value it
    had at import or at process start, whichever differs, is the user's.
    """
    text = os.environ.get("OMP_NUM_THREADS")
    if text is None or dask_worker() is not None or text.strip() != _nanny_environ_value("OMP_NUM_THREADS"):
        return text
    for earlier in (_OMP_AT_IMPORT, _OMP_AT_LAUNCH):
        if earlier != text:
            return earlier
    return text


def _omp_env_threads() -> int | None:
    """OMP_NUM_THREADS as a cap (its first level for nested lists like '4,2'); None when unset or odd."""
    text = (user_omp_num_threads() or "").strip()
    if not text:
        return None
    try:
        n = int(text.split(",")[0].strip())
    except ValueError:
        return None
    return n if n >= 1 else None


# threadpoolctl's controller takes a few ms to build (it scans the loaded libraries), querying or setting its
# libraries microseconds: keep one, rebuilt when modules were imported.
_tp_cache: dict[str, object] = {"key": None, "controller": None}


def _threadpool_controller(tp):
    """threadpoolctl's (module ``tp``) controller of the loaded libraries, kept while no module is imported."""
    key = len(sys.modules)
    if _tp_cache["key"] != key:
        _tp_cache["controller"], _tp_cache["key"] = tp.ThreadpoolController(), key
    return _tp_cache["controller"]


def _openmp_limit() -> int | None:
    """The smallest current OpenMP thread limit (threadpoolctl), None when unknown.

    Only consulted when threadpoolctl is already imported (a
    ``threadpool_limits`` block needs it, and scikit-learn imports it).
    """
    tp = sys.modules.get("threadpoolctl")
    if tp is None:
        return None
    try:
        libs = _threadpool_controller(tp).lib_controllers
        limits = [lib.get_num_threads() for lib in libs if lib.user_api == "openmp"]
    except Exception:
        return None
    limits = [int(n) for n in limits if isinstance(n, Integral) and n >= 1]
    return min(limits) if limits else None


# Where the run queue is read from (tests point these at files of their own).
_PROC_STAT = "/proc/stat"
_PROC_SELF_TASKS = "/proc/self/task"
#: Run-queue samples per reading, this many seconds apart; the smallest count is kept (a shell
#: command or a daemon's wake-up is not a competitor).  A reading (~1 ms) is kept ``_BUSY_TTL`` seconds.
_BUSY_SAMPLES, _BUSY_GAP, _BUSY_TTL = 3, 0.0005, 1.0
_busy_cache: list = []  # [(monotonic time, busy cpus)]


def _own_running_threads() -> int:
    """This process's threads in state R (running or runnable), from ``/proc/self/task/*/stat``."""
    try:
        tasks = os.listdir(_PROC_SELF_TASKS)
    except OSError:
        return 0
    running = 0
    for tid in tasks:
        text = _read(os.path.join(_PROC_SELF_TASKS, tid, "stat"))
        if text and text.rpartition(")")[2].split()[:1] == ["R"]:
            running += 1
    return running


def _procs_running() -> int | None:
    text = _read(_PROC_STAT)
    for line in (text or "").splitlines():
        if line.startswith("procs_running "):
            try:
                return int(line.split()[1])
            except (IndexError, ValueError):
                return None
    return None


def busy_cpus() -> int:
    """CPUs kept busy by other processes now: the machine's runnable tasks less this process's own.

    0 where it cannot be told: no ``/proc``, or an affinity mask or cgroup quota narrower than
    the machine (the run queue then counts tasks on CPUs this process does not use).
    """
    now = time.monotonic()
    if _busy_cache and now - _busy_cache[0][0] < _BUSY_TTL:
        return _busy_cache[0][1]
    busy = _read_busy_cpus()
    _busy_cache[:] = [(now, busy)]
    return busy


def _read_busy_cpus() -> int:
    if _affinity_cpus() != (os.cpu_count() or 0) or _cgroup_cpus() is not None:
        return 0
    counts = []
    for k in range(_BUSY_SAMPLES):
        total = _procs_running()
        if total is None:
            return 0
        counts.append(max(0, total - max(1, _own_running_threads())))
        if k + 1 < _BUSY_SAMPLES:
            time.sleep(_BUSY_GAP)
    return min(counts)


def default_threads() -> int:
    """The thread count ``n_jobs=None`` means (>= 1).

    ``MWUMKL_NUM_THREADS`` when set: a positive integer (capped at
    :func:`available_cpus`), or ``auto`` / ``0`` for all available cores.
    Otherwise the available cores that other processes leave idle
    (:func:`available_cpus` less :func:`busy_cpus`, at least 1: a parallel
    region waits for its slowest thread, so a thread sharing a core with
    another process's work slows every superstep), capped by the nthreads of
    the Dask worker running this code, by ``OMP_NUM_THREADS`` and by the
    current OpenMP limit (a :func:`threadpoolctl.threadpool_limits` block).
    The fit re-reads it as it runs (every ``_DEFAULT_TTL`` seconds); models do
    not depend on the thread count.
    """
    cpus = available_cpus()
    text = os.environ.get(ENV_VAR, "").strip()
    if text:
        n = _parse_env_threads(ENV_VAR, text)
        return cpus if n == 0 else max(1, min(n, cpus))
    n = cpus
    for cap in (_dask_worker_threads(), _omp_env_threads(), _openmp_limit()):
        if cap is not None:
            n = min(n, cap)
    if n > 1:
        n = min(n, cpus - busy_cpus())
    return max(1, n)


def resolve_n_jobs(n_jobs) -> int:
    """The thread count for an ``n_jobs`` value (scikit-learn's meaning), >= 1.

    ``None``: :func:`default_threads`.  ``-1``: every available core
    (:func:`available_cpus`), ``-2`` all but one, and so on (at least 1).  A
    positive integer: that many threads, capped at :func:`available_cpus`.
    ``0`` and anything but an integer or None raise ValueError.
    """
    if n_jobs is None:
        return default_threads()
    if isinstance(n_jobs, bool) or not isinstance(n_jobs, Integral):
        raise ValueError(f"n_jobs must be None or a non-zero integer (-1: all cores), got {n_jobs!r}")
    n = int(n_jobs)
    if n == 0:
        raise ValueError("n_jobs == 0 has no meaning; use None (the default), -1 (all cores) or a positive integer")
    cpus = available_cpus()
    if n < 0:
        return max(1, cpus + 1 + n)
    return min(n, cpus)


# ----------------------------------------------------------------------------- the library's threads
#
# The thread count of a call: ``limit_threads(n)`` (this Python thread only) if one is active,
# else the process-wide ``set_num_threads`` value if set, else :func:`default_threads` (reused
# in a thread for ``_DEFAULT_TTL`` seconds), always capped by the compute pool's size
# (:func:`register_pool`; numba's once :mod:`mwumkl_dist.devices.cpu` is imported).

_local = threading.local()
_num_threads: int | None = None  # set_num_threads' process-wide override (None: the default)
_DEFAULT_TTL = 0.25  # seconds a resolved default is reused in a thread (resolving it takes 10-100 us)
_pool: list = []  # [size()] once a compute pool is registered


def register_pool(size) -> None:
    """Cap every thread count at ``size()``, the compute pool's size (read at each call).

    :mod:`mwumkl_dist.devices.cpu` registers numba's pool when it is imported.
    Without a pool the cap is :func:`available_cpus`.
    """
    _pool[:] = [size]


def pool_size() -> int:
    """The compute pool's size (:func:`register_pool`), or :func:`available_cpus` without one."""
    return int(_pool[0]()) if _pool else available_cpus()


def _is_count(n) -> bool:
    return isinstance(n, Integral) and not isinstance(n, bool)


@contextmanager
def limit_threads(n_threads: int):
    """Cap the threads of supersteps and predictions made in this (Python) thread during the block.

    Exactly ``n_threads`` (a positive integer; capped only by the pool), where
    :func:`thread_limit` takes an ``n_jobs``.  Thread-local: other threads
    keep their own setting.  Nested blocks apply the innermost cap.  Results
    do not depend on the thread count.
    """
    if not _is_count(n_threads) or n_threads < 1:
        raise ValueError(f"thread_limit needs a positive integer, got {n_threads!r}")
    before = getattr(_local, "limit", None)
    _local.limit = int(n_threads)
    try:
        yield int(n_threads)
    finally:
        _local.limit = before


def set_num_threads(n_threads: int | None) -> None:
    """Process-wide thread count of supersteps and predictions (``None``: the default).

    ``0`` means the whole pool.  The default (``None``) is
    :func:`default_threads`: every core the process may use.  A
    :func:`limit_threads` block takes precedence in its thread.
    """
    global _num_threads
    if n_threads is not None and (not _is_count(n_threads) or n_threads < 0):
        raise ValueError(f"n_threads must be None or a non-negative integer, got {n_threads!r}")
    _num_threads = None if n_threads is None else int(n_threads)


def _cached_default() -> int:
    """:func:`default_threads`, reused in this thread while the environment and imports stay the same."""
    key = (os.environ.get(ENV_VAR), os.environ.get("OMP_NUM_THREADS"), len(sys.modules))
    cached = getattr(_local, "default", None)
    now = time.monotonic()
    if cached is not None and cached[0] == key and now - cached[1] < _DEFAULT_TTL:
        return cached[2]
    n = default_threads()
    _local.default = (key, now, int(n))
    return int(n)


def current_threads() -> int:
    """The threads a fit or prediction started now in this thread would use (>= 1, within the pool)."""
    limit = getattr(_local, "limit", None)
    if isinstance(limit, _Region):  # a worker of an ordered_map region: its share now
        limit = limit.threads()
    elif limit is None:
        limit = _num_threads
        if limit is None:
            limit = _cached_default()
        elif limit == 0:
            limit = pool_size()
    return max(1, min(int(limit), pool_size()))


@contextmanager
def thread_limit(n_jobs=None):
    """Run a block with the library's threads capped for this thread; yields the count.

    ``n_jobs`` as :func:`resolve_n_jobs` takes it.  ``None`` keeps what this
    thread would use anyway (an enclosing limit or :func:`set_num_threads`,
    else :func:`default_threads`, resolved now), fixed for the block: the
    estimator's ``n_jobs=None`` fits inside a caller's ``thread_limit(2)`` use
    2 threads.  Other threads are not affected.  Results do not depend on the
    count.
    """
    n = _threads_now() if n_jobs is None else resolve_n_jobs(n_jobs)
    with limit_threads(n):
        yield n


def _threads_now() -> int:
    """:func:`current_threads`, with the default resolved afresh (not from the short-lived cache)."""
    if getattr(_local, "limit", None) is None and _num_threads is None:  # no limit, no override
        return max(1, min(default_threads(), pool_size()))
    return current_threads()


def ordered_map(fn, items) -> list:
    """``[fn(item) for item in items]`` over this thread's threads (``n_jobs``), the results in order.

    A parallel region: up to :func:`current_threads` workers (this thread one
    of them) take the items in order, and each worker's own parallel calls
    (numba, a nested map) get its share of the threads, so the region never
    runs more threads than this thread may use: the threads divided by the
    workers still busy (a worker that finds no item left hands its threads
    to the others: three folds on two threads run the third on both once
    the second ends).  The first Ctrl-C (main thread) only asks the region
    to stop (:func:`sigint_requests_stop`, shared by its workers): no new
    item starts, and the region raises ``KeyboardInterrupt`` when no item
    raised.  An item's exception is raised after the running items end (no
    new one starts); of several, the first item's, as a loop would.
    Whatever is summed from the results, in their order, does not depend on
    the thread count.
    """
    items = list(items)
    total = current_threads()
    n_workers = min(total, len(items))
    if n_workers <= 1:
        return [fn(item) for item in items]
    results: list = [None] * len(items)
    failures: dict = {}
    claim = itertools.count()  # next() is atomic: each item goes to one worker, in order
    with sigint_requests_stop() as stop:
        region = _Region(total, n_workers)

        def work():
            before = getattr(_local, "limit", None), getattr(_local, "stop", None)
            _local.limit, _local.stop = region, stop
            try:
                while not failures and not stop.requested:
                    i = next(claim)
                    if i >= len(items):
                        break
                    try:
                        results[i] = fn(items[i])
                    except BaseException as exc:  # raised by the caller, in item order
                        failures[i] = exc
            finally:
                region.leave()
                _local.limit, _local.stop = before

        helpers = [threading.Thread(target=work, name="mwumkl-worker", daemon=True) for _ in range(n_workers - 1)]
        for helper in helpers:
            helper.start()
        work()
        for helper in helpers:
            helper.join()
    if failures:
        raise failures[min(failures)]
    if stop.requested:
        raise KeyboardInterrupt
    return results


class _Region:
    """The threads of one :func:`ordered_map` call, shared by its workers that still have items."""

    __slots__ = ("total", "busy", "lock")

    def __init__(self, total: int, workers: int):
        self.total, self.busy, self.lock = int(total), int(workers), threading.Lock()

    def threads(self) -> int:
        """A busy worker's share (its thread included)."""
        return max(1, self.total // self.busy)

    def leave(self) -> None:
        with self.lock:
            self.busy = max(1, self.busy - 1)


class StopRequest:
    """Whether a Ctrl-C asked the running work to stop at its next safe point."""

    __slots__ = ("requested",)

    def __init__(self):
        self.requested = False


#: Whether :func:`sigint_requests_stop` takes over Ctrl-C; False leaves it to Python (KeyboardInterrupt at once).
#: The test suite sets it False, so that one Ctrl-C stops pytest (a test that checks the stop sets it back).
_CTRL_C_ASKS_TO_STOP = True


@contextmanager
def sigint_requests_stop():
    """While the block runs, a first Ctrl-C only sets the yielded :class:`StopRequest`; a second raises it.

    Raising ``KeyboardInterrupt`` at an arbitrary point could land between
    two shards' supersteps (or inside a numba call) and leave a state half
    updated; the work checks ``requested`` where it can stop.  Python runs
    signal handlers in the main thread only: there the block installs the
    handler (unless SIGINT is ignored or handled outside Python); inside an
    :func:`ordered_map` region, and in nested blocks, the workers share the
    region's request, so a fold on a helper thread hears the Ctrl-C too;
    elsewhere off the main thread no signal sets it.
    """
    inherited = getattr(_local, "stop", None)
    if inherited is not None:
        yield inherited
        return
    stop = StopRequest()
    previous = signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
    if previous is None or previous is signal.SIG_IGN or not _CTRL_C_ASKS_TO_STOP:
        yield stop
        return

    def handler(signum, frame):
        if stop.requested:
            raise KeyboardInterrupt
        stop.requested = True

    signal.signal(signal.SIGINT, handler)
    _local.stop = stop
    try:
        yield stop
    finally:
        _local.stop = None
        signal.signal(signal.SIGINT, previous)


# ----------------------------------------------------------------------------- BLAS

_blas: dict = {"users": 0, "limiter": None}
_blas_lock = threading.Lock()


@contextmanager
def one_blas_thread():
    """BLAS (and the LAPACK on it) on one thread while any such block runs in this process.

    Products, factorisations and eigensolvers may change their last bits with
    BLAS's thread count, and parallel regions call BLAS from several threads
    at once: the package's parallel work runs BLAS on one thread inside each
    fixed block and gets its threads from the blocks (:func:`ordered_map`).
    The count is one setting per process (OpenBLAS, MKL), so the blocks of
    all threads share it: the first sets it to 1, the last restores it.
    """
    with _blas_lock:
        if _blas["users"] == 0:
            import threadpoolctl

            _blas["limiter"] = _threadpool_controller(threadpoolctl).limit(limits=1, user_api="blas")
        _blas["users"] += 1
    try:
        yield
    finally:
        with _blas_lock:
            _blas["users"] -= 1
            if _blas["users"] == 0:
                _blas["limiter"].restore_original_limits()
                _blas["limiter"] = None
