"""Peak memory of the two-stage fit, in memory at 3*10^5 rows and out of core from a large store (issue 12).

Issue 12 asks for a peak RSS of O(m n) or less, measured at 3*10^5 rows, and
out of core with a data store larger than the workers' memory.  Two parts
(``--part memory|store|both``, default both):

**memory**: in-process fits of ``n`` training rows (default 300000) of cod-rna,
LIBSVM's training and test files pooled (331,152 rows x 8; read with
``mwumkl_dist.io.load_data`` from ``--datasets-dir``, default
``../shared/datasets`` beside the repository), shuffled with seed 0; the last
30000 rows are the test set, the first ``n`` of the others the training rows;
a ``MinMaxScaler`` fit on the training rows scales both.  Without the files
(or with ``--synthetic``) a deterministic synthetic set of the same shape is
used instead, and the output says so (see "Synthetic data" below).  Each
configuration runs in a fresh Python process, so its
``getrusage(RUSAGE_SELF).ru_maxrss`` is its own peak, with
OMP/OPENBLAS/MKL/MWUMKL_NUM_THREADS=1 in its environment before numpy loads:

* ``baseline``: loads the data and imports the package, fits nothing (the
  interpreter + data floor);
* ``in-memory``: ``MWUMKLClassifier(verbose=1)`` with every other parameter at
  its default (``solver="auto"``: the two-stage fit; the features stay in
  memory, their budget being half the machine's available memory);
* ``spilled``: the same with ``MWUMKL_FEATURE_MEMORY=1`` (every shard spills
  its features to an unlinked file in ``MWUMKL_SCRATCH``, a temporary folder
  under ``--work-dir``);
* ``weights``: the weight stage alone, to tell its share of the peak from the
  linear stage's: ``MWUMKLClassifier(solver="mwu", verbose=1)`` (the
  estimator's MWU fit path with ``C="auto"``, as the two-stage fit runs it) on
  the stratified subsample of ``weight_points_for(n)`` training rows (seed 0)
  the two-stage fit learns the kernel weights on.

Per configuration: fit wall and CPU seconds, test error, the peak RSS
(``ru_maxrss`` right after the fit, before predicting; also the peak over the
fit alone, ``VmHWM`` after resetting it through ``/proc/self/clear_refs`` once
the data are loaded, where the kernel allows it, and the RSS before the fit),
``features_spilled_``, ``n_components_`` (``r``), the disk the spill took (the
scratch file system's free space before the fit minus its minimum during it,
sampled every 0.2 s: other writers on the machine show up in it too), and the
reference sizes: the training ``X`` bytes, ``m n 8`` bytes (``m =
len(kernel_names_)``) and ``n r 8`` bytes (the features).  The in-memory and
the spilled fit must give the identical model (``np.array_equal`` of
``dual_coef_``, ``intercept_`` and ``kernel_weights_``; reported).

**store**: out of core on Dask.  Writes a synthetic dense data store of
``--store-rows`` rows (default 3,000,000) x ``--store-features`` (default 128)
float64 features (2.86 GiB: 1.43 times the two 1 GiB workers' memory
together; 64 features would give 1.43 GiB, less than their 2 GiB) in
uncompressed chunks of 8192 rows (one per linear-stage row block; Zstandard
with ``--compress``) into a temporary folder under ``--work-dir``, plus a
50,000-row test set generated the same way (in the driver's memory).
``write_data_store`` takes the whole feature array (it checks and hashes it
in one piece), so the rows are generated block by block into a raw file that
is handed to it as a ``numpy.memmap``: one block of rows at a time is in
anonymous memory, plus ``write_data_store``'s ``n x d``-byte finiteness mask
(384 MB at the default size); the raw file is deleted once the store is
written.  The writer runs in its own process; its peak RSS (reported) counts
the memmap's file pages, which the kernel can drop.

Then a fresh process (the driver, one thread) starts
``distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
memory_limit=--memory-limit)`` (default 1GiB each), warms the workers up (a
two-stage fit on a row block per worker, so numba's cached machine code is
loaded before the clock starts) and fits ``MWUMKLClassifier(kernels=
--store-kernels, engine="dask", client=client, n_shards=2, verbose=1)`` from
the store (``solver="auto"``: the two-stage fit; each shard reads its rows
from the store block by block on its worker and keeps its ``rows x r x 8``
bytes of features in memory, or spills them to disk past its feature budget;
``--feature-memory`` sets ``MWUMKL_FEATURE_MEMORY`` on the workers).  The
default kernels ``poly:1,gaussian:1,gaussian:2`` suit the synthetic data
(squared distances between rows around 3).  The driver and each worker
process are sampled every 0.2 s (``MemorySampler`` of
``bench_million_kernels``, psutil RSS; a worker that its nanny restarts is
followed as ``workerN (restart)``).  Reported: the store's size on disk and
its ratio to the workers' total memory limit, the peak RSS of each worker and
of the driver, a timeline every 2 s (to see whether it stays bounded), the
fit's wall time (or its error: a fit whose workers are killed is a result),
the test error, ``features_spilled_``, the disk the spill took (free-space
drop on the file systems of ``--work-dir`` and the temp directory), the
feature budget and spill folder a worker gives a Dask task and a plain thread
(the shards run in their shard server's thread), whether a worker was
restarted, and the Dask memory manager's lines from the cluster's stderr
(pausing at 80 % of the limit, restarts at 95 %, "unmanaged memory" warnings)
and the engine's warnings (shards lost and rebuilt).  The store is deleted
afterwards unless ``--keep``.

Synthetic data: rows ``x = 0.5 + z P + 0.05 e`` with a latent ``z`` uniform on
``[-1, 1]^4``, ``P`` a fixed ``4 x d`` matrix with orthonormal rows and ``e``
standard normal noise; the label is ``+1`` inside the sphere ``|z|^2 < 1.3``
(half of the rows), ``-1`` outside, and 5 % of the labels are flipped (the
Bayes error is 5 %; a linear classifier can do no better than the majority
rate, about 50 %).  Rows are generated in blocks of 65536 from seeds
``(seed, stream, block)``, so any block is reproducible alone.

Run on demand (not a test), on an otherwise quiet machine::

    python benchmarks/bench_two_stage_memory.py                   # both parts: 3e5 rows; a 2.86 GiB store
    python benchmarks/bench_two_stage_memory.py --part memory     # the in-process fits only
    python benchmarks/bench_two_stage_memory.py --part store --store-rows 6000000 --keep
    python benchmarks/bench_two_stage_memory.py --smoke           # tiny: checks the script end to end

``--smoke``: part 1 on 20000 synthetic rows (10000 test rows), part 2 on a
60000-row store (10000 test rows) with the workers' feature budget forced to
16 MiB (``MWUMKL_FEATURE_MEMORY`` on the workers) so the spill path runs; it
writes ``benchmarks/results/two_stage_memory_smoke.json`` unless ``--out``.

Disk: part 2 needs about twice the store size while writing it, plus the
spilled features, ``store rows x r x 8`` bytes (12 GB at 3e6 rows and
r = 500; where a shard spills: ``MWUMKL_SCRATCH``, else the worker's local
directory, else the temp directory); part 1's spilled fit needs ``n r 8``
bytes (1.2 GB at 3e5 rows).
"""

from __future__ import annotations

import os

# One thread everywhere, before numpy is imported (children inherit it; so do the Dask workers).
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "MWUMKL_NUM_THREADS")
for _var in THREAD_VARS:
    os.environ[_var] = "1"

import argparse  # noqa: E402
import functools  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_million_kernels import MemorySampler, run_info  # noqa: E402
from bench_out_of_core import du  # noqa: E402

DATASETS = os.path.join(HERE, "..", "..", "shared", "datasets")
RESULTS = os.path.join(HERE, "results")
COD_RNA_FILES = ("cod-rna.svm.gz", "cod-rna.test.svm.gz")
COD_RNA_SHAPE = (331_152, 8)
SEED = 0
N_TEST = 30_000
STORE_TEST = 50_000
STORE_KERNELS = "poly:1,gaussian:1,gaussian:2"
STORE_CHUNK_ROWS = 8192  # the linear stage's row block: each block reads one chunk
SYNTH_BLOCK = 65_536
SYNTH_LATENT = 4
SYNTH_RADIUS2 = 1.3  # median of |z|^2 for z uniform on [-1, 1]^4
SYNTH_FLIP = 0.05
MIB = 2**20


# ----------------------------------------------------------------------------- synthetic data


def _projection(d: int, seed: int) -> np.ndarray:
    """A fixed ``(SYNTH_LATENT, d)`` matrix with orthonormal rows."""
    if d < SYNTH_LATENT:
        raise ValueError(f"the synthetic data need at least {SYNTH_LATENT} features, got {d}")
    q, _ = np.linalg.qr(np.random.default_rng([seed, 7919]).standard_normal((d, SYNTH_LATENT)))
    return np.ascontiguousarray(q.T)


def synthetic_block(seed: int, stream: int, block: int, rows: int, d: int, P=None):
    """Rows and +-1 labels of one block of the synthetic set (see the module docstring): reproducible alone."""
    P = _projection(d, seed) if P is None else P
    rng = np.random.default_rng([seed, stream, block])
    z = rng.uniform(-1.0, 1.0, (rows, SYNTH_LATENT))
    X = 0.5 + z @ P + 0.05 * rng.standard_normal((rows, d))
    y = np.where((z**2).sum(axis=1) < SYNTH_RADIUS2, 1.0, -1.0)
    flip = rng.random(rows) < SYNTH_FLIP
    y[flip] = -y[flip]
    return X, y


def synthetic_rows(seed: int, stream: int, n: int, d: int):
    """The first ``n`` rows of stream ``stream`` (blocks of ``SYNTH_BLOCK``), in memory."""
    P = _projection(d, seed)
    X, y = np.empty((n, d)), np.empty(n)
    for b, lo in enumerate(range(0, n, SYNTH_BLOCK)):
        hi = min(n, lo + SYNTH_BLOCK)
        X[lo:hi], y[lo:hi] = synthetic_block(seed, stream, b, hi - lo, d, P)
    return X, y


SYNTH_DESCRIPTION = (
    "x = 0.5 + z P + 0.05 e, z uniform on [-1,1]^4, P 4 x d orthonormal rows; y = +1 inside |z|^2 < 1.3, "
    "5 % of labels flipped (Bayes error 5 %)"
)


# ----------------------------------------------------------------------------- process memory


def maxrss_bytes() -> int:
    """``ru_maxrss`` of this process (KiB on Linux), in bytes."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _status_bytes(field: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def reset_hwm() -> bool:
    """Reset this process's ``VmHWM`` (peak RSS) to its current RSS; False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def disk_free(paths) -> int:
    """Free bytes on the file systems of ``paths`` (a path or a list; each file system counted once)."""
    seen, total = set(), 0
    for path in [paths] if isinstance(paths, str) else paths:
        dev = os.stat(path).st_dev
        if dev not in seen:
            seen.add(dev)
            st = os.statvfs(path)
            total += st.f_bavail * st.f_frsize
    return total


class Sampler(MemorySampler):
    """:class:`MemorySampler` (peak RSS per process) plus worker restarts, a coarse timeline and the disk free.

    ``workers``: the Dask worker processes (name -> pid) and ``worker_parent`` the pid that starts
    them (a ``LocalCluster``'s nannies live in the driver): a worker started later (a nanny restarts
    a killed worker) is sampled too, as ``workerN (restart)``.  ``disk_path``: a path or a list of
    paths (see :func:`disk_free`), or None.
    """

    def __init__(self, pids: dict[str, int], interval: float = 0.2, *, workers: dict[str, int] | None = None,
                 worker_parent: int | None = None, disk_path=None, every: float = 2.0):  # fmt: skip
        import psutil

        super().__init__({**pids, **(workers or {})}, interval)
        self.parent = psutil.Process(worker_parent) if worker_parent else None
        self.known = {pid for pid in (workers or {}).values()} | set(pids.values())
        self.ignored: set[int] = set()
        self.disk_path = disk_path
        self.free_before = disk_free(disk_path) if disk_path else None
        self.free_min = self.free_before
        self.every = every
        self.timeline: list[dict] = []
        self._t0 = time.perf_counter()

    def _new_workers(self):
        import psutil

        try:
            children = self.parent.children()
        except psutil.Error:
            return
        for c in children:
            if c.pid in self.known or c.pid in self.ignored:
                continue
            try:
                cmd = " ".join(c.cmdline())
            except psutil.Error:
                continue
            if "resource_tracker" in cmd or "semaphore_tracker" in cmd:
                self.ignored.add(c.pid)
                continue
            name = f"worker{len([k for k in self.procs if k.startswith('worker')])} (restart)"
            self.known.add(c.pid)
            self.procs[name] = c
            self.peak[name] = 0

    def _run(self):
        last = -np.inf
        while not self._stop.is_set():
            if self.parent is not None:
                self._new_workers()
            total, now = 0, {}
            for name, proc in list(self.procs.items()):
                try:
                    rss = proc.memory_info().rss
                except Exception:  # a process that ended
                    continue
                self.peak[name] = max(self.peak[name], rss)
                now[name] = rss
                total += rss
            self.peak_total = max(self.peak_total, total)
            if self.disk_path:
                self.free_min = min(self.free_min, disk_free(self.disk_path))
            t = time.perf_counter() - self._t0
            if t - last >= self.every:
                last = t
                point = {"t": round(t, 1), **{k: round(v / MIB, 1) for k, v in now.items()}}
                if self.disk_path:
                    point["disk_used_mib"] = round((self.free_before - disk_free(self.disk_path)) / MIB, 1)
                self.timeline.append(point)
            self._stop.wait(self.interval)

    def disk_used(self) -> int | None:
        return None if self.disk_path is None else max(0, self.free_before - self.free_min)


class LogCapture:
    """Keeps the ``mwumkl_dist`` logger's records (the two-stage timing line, warnings) in a list."""

    def __init__(self, level=None):
        import logging

        self.records: list[str] = []
        self.logger = logging.getLogger("mwumkl_dist")
        self.handler = logging.Handler(level or logging.INFO)
        self.handler.emit = lambda rec: self.records.append(
            f"{rec.created - self.t0:7.1f} s {rec.levelname}: {rec.getMessage()}"
        )
        self._old_level = self.logger.level
        self.t0 = time.time()

    def __enter__(self):
        import logging

        self.t0 = time.time()
        self.logger.addHandler(self.handler)
        if self.logger.getEffectiveLevel() > logging.INFO:
            self.logger.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc):
        self.logger.removeHandler(self.handler)
        self.logger.setLevel(self._old_level)

    def stage_lines(self) -> list[str]:
        return [r for r in self.records if "two-stage" in r or " WARNING: " in r or " ERROR: " in r]


# ----------------------------------------------------------------------------- part 1 (child side)


def load_memory_data(cfg: dict):
    """``(X_train, y_train, X_test, y_test, description)`` of part 1 (see the module docstring)."""
    from sklearn.preprocessing import MinMaxScaler

    n, n_test = int(cfg["n"]), int(cfg["n_test"])
    paths = [os.path.join(cfg["datasets_dir"], f) for f in COD_RNA_FILES]
    note = None
    if not cfg["synthetic"] and all(os.path.isfile(p) for p in paths):
        import scipy.sparse as sp

        from mwumkl_dist.io import load_data

        X0, y0 = load_data(paths[0])
        X1, y1 = load_data(paths[1], n_features=X0.shape[1])
        X = sp.vstack([X0, X1]).toarray()
        y = np.concatenate([y0, y1]).astype(np.float64)
        del X0, X1, y0, y1
        source = (
            f"cod-rna (LIBSVM training + test files pooled, {len(y)} rows x {X.shape[1]}, from {cfg['datasets_dir']})"
        )
    else:
        total = max(COD_RNA_SHAPE[0], n + n_test)
        X, y = synthetic_rows(SEED, 0, total, COD_RNA_SHAPE[1])
        why = "--synthetic" if cfg["synthetic"] else f"cod-rna files not found in {cfg['datasets_dir']}"
        source = f"SYNTHETIC stand-in for cod-rna ({why}): {total} rows x {COD_RNA_SHAPE[1]}; {SYNTH_DESCRIPTION}"
    perm = np.random.default_rng(SEED).permutation(len(y))
    X, y = X[perm], y[perm]
    if n + n_test > len(y):
        note = f"asked for {n} training rows, only {len(y) - n_test} left beside the {n_test} test rows"
        n = len(y) - n_test
    X_te, y_te = X[len(y) - n_test :], y[len(y) - n_test :]
    X_tr, y_tr = X[:n], y[:n]
    scaler = MinMaxScaler().fit(X_tr)
    X_tr = np.ascontiguousarray(scaler.transform(X_tr))
    X_te = np.ascontiguousarray(scaler.transform(X_te))
    y_tr, y_te = y_tr.copy(), y_te.copy()
    del X, y
    return (
        X_tr,
        y_tr,
        X_te,
        y_te,
        {"source": source, "n_train": n, "n_test": n_test, "n_features": X_tr.shape[1], "note": note},
    )


def child_memory(cfg: dict) -> dict:
    start = time.perf_counter()
    X_tr, y_tr, X_te, y_te, data = load_memory_data(cfg)
    import mwumkl_dist
    from mwumkl_dist import MWUMKLClassifier

    gc.collect()
    out = {
        "config": cfg["mode"],
        "data": data,
        "load_s": time.perf_counter() - start,
        "load_peak_rss_mib": maxrss_bytes() / MIB,
        "pre_fit_rss_mib": (_status_bytes("VmRSS") or 0) / MIB,
        "X_bytes": int(X_tr.nbytes),
        "mwumkl_dist": mwumkl_dist.__version__,
        "env": {k: os.environ.get(k) for k in (*THREAD_VARS, "MWUMKL_FEATURE_MEMORY", "MWUMKL_SCRATCH")},
    }
    if cfg["mode"] == "baseline":
        out["peak_rss_mib"] = maxrss_bytes() / MIB
        return out
    X_fit, y_fit = X_tr, y_tr
    if cfg["mode"] == "weights":  # the weight stage's subsample and fit path
        from mwumkl_dist.solvers.auto import stratified_rows
        from mwumkl_dist.solvers.two_stage import weight_points_for

        rows = stratified_rows(y_tr, weight_points_for(len(y_tr)), SEED)
        X_fit, y_fit = X_tr[rows], y_tr[rows]
    hwm_reset = reset_hwm()
    clf = MWUMKLClassifier(verbose=1, **({"solver": "mwu"} if cfg["mode"] == "weights" else {}))
    scratch = os.environ.get("MWUMKL_SCRATCH") or tempfile.gettempdir()
    with LogCapture() as logs, Sampler({}, disk_path=scratch) as disk:
        w0, c0 = time.perf_counter(), time.process_time()
        clf.fit(X_fit, y_fit)
        fit_s, fit_cpu = time.perf_counter() - w0, time.process_time() - c0
    out["peak_rss_mib"] = maxrss_bytes() / MIB
    out["fit_peak_rss_mib"] = (_status_bytes("VmHWM") or 0) / MIB if hwm_reset else None
    w0 = time.perf_counter()
    pred = clf.predict(X_te)
    n, m = len(y_tr), len(clf.kernel_names_)
    r = int(np.max(clf.n_components_)) if hasattr(clf, "n_components_") else None
    out.update(
        fit_rows=len(y_fit),
        fit_s=fit_s,
        fit_cpu_s=fit_cpu,
        predict_s=time.perf_counter() - w0,
        test_error=float(np.mean(pred != y_te)),
        solver_=getattr(clf, "solver_", None),
        features_spilled_=bool(getattr(clf, "features_spilled_", False)),
        n_components_=r,
        weight_points_=int(getattr(clf, "weight_points_", 0)),
        C_=float(clf.C_),
        epsilon_=float(clf.epsilon_),
        polished_=bool(getattr(clf, "polished_", False)),
        kernel_names_=list(map(str, clf.kernel_names_)),
        kernel_weights_=np.asarray(clf.kernel_weights_).tolist(),
        m=m,
        mn8_bytes=m * n * 8,
        nr8_bytes=None if r is None else n * r * 8,
        spill_disk_bytes=disk.disk_used(),
        scratch_dir=scratch,
        log=logs.stage_lines(),
    )
    np.savez(cfg["model_path"], dual_coef=clf.dual_coef_, intercept=clf.intercept_, kernel_weights=clf.kernel_weights_)
    return out


# ----------------------------------------------------------------------------- part 2 (child side)


def child_store_write(cfg: dict) -> dict:
    from mwumkl_dist.stores import write_data_store

    n, d = int(cfg["rows"]), int(cfg["features"])
    raw = cfg["store_path"] + ".raw.f64"
    start = time.perf_counter()
    P = _projection(d, SEED)
    y = np.empty(n)
    mm = np.memmap(raw, dtype=np.float64, mode="w+", shape=(n, d))
    for b, lo in enumerate(range(0, n, SYNTH_BLOCK)):
        hi = min(n, lo + SYNTH_BLOCK)
        mm[lo:hi], y[lo:hi] = synthetic_block(SEED, 1, b, hi - lo, d, P)
    mm.flush()
    generate_s = time.perf_counter() - start
    try:
        write_data_store(
            cfg["store_path"], mm, y, chunk_rows=int(cfg["chunk_rows"]), compress=bool(cfg["compress"]), overwrite=True
        )
    finally:
        del mm
        os.remove(raw)
    return {
        "generate_s": generate_s,
        "write_s": time.perf_counter() - start - generate_s,
        "writer_peak_rss_mib": maxrss_bytes() / MIB,
        "positive_fraction": float(np.mean(y > 0)),
    }


def child_store_fit(cfg: dict) -> dict:
    from dask.utils import parse_bytes
    from distributed import Client, LocalCluster

    from mwumkl_dist import MWUMKLClassifier
    from mwumkl_dist.stores import open_data_store

    start = time.perf_counter()
    store = open_data_store(cfg["store_path"])
    open_s = time.perf_counter() - start
    d, workers, kernels = store.n_features, int(cfg["workers"]), cfg["kernels"]
    X_te, y_te = synthetic_rows(SEED, 2, int(cfg["n_test"]), d)
    X_w, y_w = synthetic_rows(SEED, 3, 8192 * workers + 1000, d)  # a row block for every worker
    local_dir = cfg["local_directory"]
    os.makedirs(local_dir, exist_ok=True)
    cluster_kw = {}
    if cfg.get("feature_memory"):
        cluster_kw["env"] = {"MWUMKL_FEATURE_MEMORY": str(parse_bytes(cfg["feature_memory"]))}
    out = {"open_and_verify_s": open_s, "workers": workers, "n_shards": workers, "kernels": kernels}
    with (
        LocalCluster(
            n_workers=workers,
            threads_per_worker=1,
            processes=True,
            memory_limit=cfg["memory_limit"],
            dashboard_address=":0",
            local_directory=local_dir,
            **cluster_kw,
        ) as cluster,
        Client(cluster) as client,
    ):
        w0 = time.perf_counter()
        warm = MWUMKLClassifier(
            kernels=kernels, C=10.0, selectivity=1.0, solver="two-stage", engine="dask", client=client, n_shards=workers
        )
        warm.fit(X_w, y_w)
        out["warmup_s"] = time.perf_counter() - w0
        before = client.run(os.getpid)
        worker_pids = {f"worker{i}": pid for i, pid in enumerate(before.values())}
        rss = client.run(_rss)
        out["worker_rss_before_fit_mib"] = {f"worker{i}": v / MIB for i, v in enumerate(rss.values())}
        clf = MWUMKLClassifier(kernels=kernels, engine="dask", client=client, n_shards=workers, verbose=1)
        try:
            out["worker_feature_budget"] = client.submit(_feature_budget_probe, pure=False).result()
        except Exception as exc:  # noqa: BLE001 - a diagnostic (it reads private helpers)
            out["worker_feature_budget"] = {"error": repr(exc)}
        # Spilled features go to MWUMKL_SCRATCH, else the worker's local directory, else the temp directory.
        disk_paths = [local_dir, tempfile.gettempdir()]
        sampler = Sampler(
            {"driver": os.getpid()}, 0.2, workers=worker_pids, worker_parent=os.getpid(), disk_path=disk_paths
        )
        with LogCapture() as logs, sampler as mem:
            w0, c0 = time.perf_counter(), time.process_time()
            try:
                clf.fit(store)
            except Exception as exc:  # noqa: BLE001 - a failed fit is a result (e.g. workers killed for memory)
                out["fit_error"] = f"{type(exc).__name__}: {exc}"
                out["fit_traceback_tail"] = traceback.format_exc().splitlines()[-8:]
            out["fit_s"] = time.perf_counter() - w0
            out["driver_cpu_s"] = time.process_time() - c0
        out["memory"] = mem.report()
        out["timeline"] = mem.timeline
        out["spill_disk_bytes"] = mem.disk_used()
        out["memory_log_lines"] = _memory_log_lines(client)
        try:
            after = client.run(os.getpid)
            out["workers_alive_after_fit"] = len(after)
            out["worker_restarted"] = sorted(after.values()) != sorted(before.values())
        except Exception as exc:  # noqa: BLE001
            out["worker_restarted"] = f"unknown ({type(exc).__name__}: {exc})"
        out["log"] = logs.stage_lines()
        out["shard_rebuilds"] = sum("lost; rebuilding" in r for r in logs.records)
    out["driver_peak_rss_mib_ru_maxrss"] = maxrss_bytes() / MIB
    if "fit_error" in out:
        return out
    w0 = time.perf_counter()
    pred = clf.predict(X_te)
    n, r = store.n_samples, int(np.max(clf.n_components_))
    out.update(
        predict_s=time.perf_counter() - w0,
        test_error=float(np.mean(pred != y_te)),
        test_positive_fraction=float(np.mean(y_te > 0)),
        solver_=getattr(clf, "solver_", None),
        features_spilled_=bool(getattr(clf, "features_spilled_", False)),
        n_components_=r,
        weight_points_=int(getattr(clf, "weight_points_", 0)),
        C_=float(clf.C_),
        kernel_names_=list(map(str, clf.kernel_names_)),
        kernel_weights_=np.asarray(clf.kernel_weights_).tolist(),
        nr8_bytes=n * r * 8,
        mn8_bytes=len(clf.kernel_names_) * n * 8,
        worker_memory_limit_bytes=parse_bytes(cfg["memory_limit"]),
    )
    return out


def _feature_budget_probe() -> dict:
    """``feature_memory_budget()`` and the spill folder on a worker: in a task, and in a plain thread.

    A linear-stage shard runs in its shard server's own thread (not a Dask task): what it sees is
    the ``shard_thread`` entry.
    """
    from mwumkl_dist.solvers.two_stage.spill import feature_memory_budget
    from mwumkl_dist.solvers.two_stage.spill import scratch_dir as _scratch_dir

    out = {"task_thread": {"budget_bytes": feature_memory_budget(), "scratch": _scratch_dir()}}

    def probe():
        out["shard_thread"] = {"budget_bytes": feature_memory_budget(), "scratch": _scratch_dir()}

    t = threading.Thread(target=probe)
    t.start()
    t.join()
    return out


def _rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


MEMORY_WORDS = ("paus", "unmanaged", "restart", "terminat", "exceed", "kill")


def _memory_log_lines(client) -> list[str]:
    """Worker and nanny log lines about memory (pausing, unmanaged memory, restarts), and any warning."""
    lines = []
    for nanny in (False, True):
        try:
            logs = client.get_worker_logs(nanny=nanny)
        except Exception as exc:  # noqa: BLE001 - the logs are a diagnostic
            lines.append(f"(could not read {'nanny' if nanny else 'worker'} logs: {exc})")
            continue
        for addr, records in logs.items():
            for level, msg in records:
                if level in ("WARNING", "ERROR", "CRITICAL") or any(w in msg.lower() for w in MEMORY_WORDS):
                    lines.append(f"{'nanny' if nanny else 'worker'} {addr} {level}: {msg.splitlines()[0][:300]}")
    return lines


CHILDREN = {"memory": child_memory, "store-write": child_store_write, "store-fit": child_store_fit}


# ----------------------------------------------------------------------------- driver (parent side)


#: Lines of a child's stderr worth keeping (Dask's memory manager and nanny restarts).
STDERR_PATTERNS = {
    "pauses": "Pausing worker",
    "restarts_for_memory": "exceeded 95% memory budget",
    "unmanaged_memory_warnings": "Unmanaged memory use is high",
    "worker_restarts": "Restarting worker",
}


def run_child(kind: str, cfg: dict, work: str, env: dict | None = None) -> dict:
    """Run ``kind`` in a fresh Python process (the thread variables set), its result as a dict.

    ``env``: variables to set in the child's environment (None: remove the variable).
    """
    fd, result = tempfile.mkstemp(prefix=f"{kind}-", suffix=".json", dir=work)
    os.close(fd)
    cfg = {**cfg, "result": result}
    cfg_path = result + ".cfg"
    with open(cfg_path, "w") as fh:
        json.dump(cfg, fh)
    child_env = {**os.environ, **(env or {})}
    child_env = {k: v for k, v in child_env.items() if v is not None}
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--_child", kind, "--_config", cfg_path],
        env=child_env,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
    )
    noted = []  # its stderr (the Dask workers' and nannies' logs included) goes on to ours; lines about memory kept
    for line in proc.stderr:
        sys.stderr.write(line)
        if any(p in line for p in STDERR_PATTERNS.values()):
            noted.append(line.rstrip()[:400])
    proc.wait()
    wall = time.perf_counter() - start
    try:
        with open(result) as fh:
            out = json.load(fh) if proc.returncode == 0 else {}
    except (OSError, ValueError):
        out = {}
    if proc.returncode != 0 or not out:
        out = {"error": f"child {kind} failed with exit status {proc.returncode} (negative: killed by that signal)"}
    out["child_wall_s"] = wall
    out["stderr_memory_lines"] = noted[:200]
    out["stderr_counts"] = {name: sum(p in line for line in noted) for name, p in STDERR_PATTERNS.items()}
    for p in (result, cfg_path):
        with _suppress():
            os.remove(p)
    return out


def _suppress():
    import contextlib

    return contextlib.suppress(OSError)


def part_memory(args, work: str) -> dict:
    scratch = tempfile.mkdtemp(prefix="spill-", dir=work)
    base = {
        "n": args.n,
        "n_test": args.n_test,
        "datasets_dir": os.path.abspath(args.datasets_dir),
        "synthetic": bool(args.synthetic),
    }
    runs = {}
    for mode, env in (
        ("baseline", {}),
        ("in-memory", {}),
        ("spilled", {"MWUMKL_FEATURE_MEMORY": "1", "MWUMKL_SCRATCH": scratch}),
        ("weights", {}),
    ):
        print(f"[memory] {mode} ...", file=sys.stderr, flush=True)
        cfg = {**base, "mode": mode, "model_path": os.path.join(work, f"model-{mode}.npz")}
        runs[mode] = run_child("memory", cfg, work, {"MWUMKL_FEATURE_MEMORY": None, "MWUMKL_SCRATCH": None, **env})
    out = {"runs": runs}
    models = {}
    for mode in ("in-memory", "spilled"):
        path = os.path.join(work, f"model-{mode}.npz")
        if os.path.isfile(path):
            with np.load(path) as z:
                models[mode] = {k: z[k] for k in z.files}
    if len(models) == 2:
        a, b = models["in-memory"], models["spilled"]
        out["same_dual_coef"] = bool(np.array_equal(a["dual_coef"], b["dual_coef"]))
        out["same_model"] = bool(all(np.array_equal(a[k], b[k]) for k in a))
    shutil.rmtree(scratch, ignore_errors=True)
    return out


def part_store(args, work: str) -> dict:
    from dask.utils import parse_bytes

    store_dir = tempfile.mkdtemp(prefix="mwumkl-two-stage-store-", dir=args.work_dir)
    store_path = os.path.join(store_dir, "data.zarr")
    n, d = args.store_rows, args.store_features
    raw_bytes = n * d * 8
    spill_bytes = n * args.n_components_guess * 8
    free = shutil.disk_usage(store_dir).free
    need = 2 * raw_bytes + spill_bytes
    if free < need * 1.05:
        raise SystemExit(
            f"not enough disk in {store_dir}: about {need / 2**30:.1f} GiB needed (store while writing "
            f"+ spilled features), {free / 2**30:.1f} GiB free"
        )
    out = {
        "store_rows": n,
        "store_features": d,
        "store_test_rows": args.store_test,
        "data": SYNTH_DESCRIPTION,
        "chunk_rows": STORE_CHUNK_ROWS,
        "compressed": bool(args.compress),
        "workers": args.workers,
        "worker_memory_limit": args.memory_limit,
        "worker_feature_memory": args.feature_memory,
        "work_dir": store_dir,
    }
    try:
        print(f"[store] writing a {n} x {d} store ({raw_bytes / 2**30:.2f} GiB raw) ...", file=sys.stderr, flush=True)
        out["write"] = run_child(
            "store-write",
            {
                "store_path": store_path,
                "rows": n,
                "features": d,
                "chunk_rows": STORE_CHUNK_ROWS,
                "compress": args.compress,
            },
            work,
        )
        if "error" in out["write"]:
            return out
        out["store_bytes_on_disk"] = du(store_path)
        total_limit = args.workers * parse_bytes(args.memory_limit)
        out["total_worker_memory_limit_bytes"] = total_limit
        out["store_over_total_worker_limit"] = out["store_bytes_on_disk"] / total_limit
        print(
            f"[store] fitting on {args.workers} Dask workers ({args.memory_limit} each) ...",
            file=sys.stderr,
            flush=True,
        )
        cfg = {
            "store_path": store_path,
            "n_test": args.store_test,
            "workers": args.workers,
            "kernels": args.store_kernels,
            "memory_limit": args.memory_limit,
            "feature_memory": args.feature_memory,
            "local_directory": os.path.join(store_dir, "dask-scratch"),
        }
        out["fit"] = run_child("store-fit", cfg, work)
    finally:
        if args.keep:
            out["kept_store"] = store_path
        else:
            shutil.rmtree(store_dir, ignore_errors=True)
    return out


# ----------------------------------------------------------------------------- summary


def _fmt(row: dict, key: str, spec: str) -> str:
    return "-" if row.get(key) is None else format(row[key], spec)


def _mib(b) -> str:
    return "-" if b is None else f"{b / MIB:.0f}"


def summary(out: dict) -> str:
    lines = []
    mem = out.get("memory")
    if mem:
        runs = mem["runs"]
        fit = runs.get("in-memory") or runs.get("spilled") or {}
        data = (runs.get("baseline") or fit).get("data", {})
        lines.append(
            f"part 1, in-process fits: {data.get('n_train')} training rows x {data.get('n_features')}, "
            f"{data.get('n_test')} test rows; {data.get('source')}"
        )
        if data.get("note"):
            lines.append(f"  note: {data['note']}")
        lines.append(
            f"  {'config':<10} {'rows':>7} {'fit s':>7} {'cpu s':>7} {'test err':>8} {'peak RSS':>9} {'fit peak':>9} "
            f"{'pre-fit':>8} {'spilled':>7} {'r':>4} {'spill disk':>10}"
        )
        for mode, r in runs.items():
            if "error" in r:
                lines.append(f"  {mode:<10} {r['error']}")
                continue
            fmt = functools.partial(_fmt, r)
            lines.append(
                f"  {mode:<10} {fmt('fit_rows', 'd'):>7} {fmt('fit_s', '7.1f'):>7} {fmt('fit_cpu_s', '7.1f'):>7} "
                f"{fmt('test_error', '8.4f'):>8} "
                f"{fmt('peak_rss_mib', '.0f'):>5} MiB {fmt('fit_peak_rss_mib', '.0f'):>5} MiB "
                f"{fmt('pre_fit_rss_mib', '.0f'):>4} MiB {str(r.get('features_spilled_', '-')):>7} "
                f"{str(r.get('n_components_') or '-'):>4} {_mib(r.get('spill_disk_bytes')):>6} MiB"
            )
        if fit and "error" not in fit:
            lines.append(
                f"  reference sizes: X {_mib(fit['X_bytes'])} MiB, m n 8 = {_mib(fit['mn8_bytes'])} MiB "
                f"(m = {fit['m']}), n r 8 = {_mib(fit['nr8_bytes'])} MiB (r = {fit['n_components_']})"
            )
            base = runs.get("baseline", {}).get("peak_rss_mib")
            for mode in ("in-memory", "spilled", "weights"):
                r = runs.get(mode, {})
                if base is not None and "peak_rss_mib" in r:
                    over = (r["peak_rss_mib"] - base) * MIB
                    lines.append(
                        f"  {mode}: peak - baseline = {over / MIB:.0f} MiB = {over / fit['mn8_bytes']:.2f} x m n 8"
                        f" = {over / fit['nr8_bytes']:.2f} x n r 8 (m, n, r of the two-stage fit)"
                        + (
                            f"; fit peak - pre-fit RSS = {r['fit_peak_rss_mib'] - r['pre_fit_rss_mib']:.0f} MiB"
                            if r.get("fit_peak_rss_mib") is not None
                            else ""
                        )
                    )
            w = runs.get("weights", {})
            if "fit_s" in w:
                lines.append(
                    f"  weights: the MWU fit path on {w['fit_rows']} rows: eps {w['epsilon_']:.3g}, C_ {w['C_']:.3g}, "
                    f"polished {w['polished_']}"
                )
            for mode in ("in-memory", "spilled"):
                for line in runs.get(mode, {}).get("log", []):
                    if "two-stage" in line:
                        lines.append(f"  {mode} {line.strip()}")
        if "same_dual_coef" in mem:
            lines.append(
                f"  in-memory and spilled: identical dual_coef_ {mem['same_dual_coef']}, "
                f"identical model {mem['same_model']}"
            )
    st = out.get("store")
    if st:
        lines.append(f"part 2, out of core on Dask: {st['store_rows']} x {st['store_features']} synthetic store")
        w = st.get("write", {})
        if "error" in w:
            lines.append(f"  write: {w['error']}")
        elif w:
            if st["store_over_total_worker_limit"] <= 1:
                lines.append("  NOTE: the store is NOT larger than the workers' memory together")
            lines.append(
                f"  store {st['store_bytes_on_disk'] / 2**30:.3f} GiB on disk = "
                f"{st['store_over_total_worker_limit']:.2f} x the workers' total limit "
                f"({st['workers']} x {st['worker_memory_limit']}); generated {w['generate_s']:.1f} s, "
                f"written {w['write_s']:.1f} s, writer peak RSS {w['writer_peak_rss_mib']:.0f} MiB"
            )
        f = st.get("fit", {})
        if "error" in f:
            lines.append(f"  fit: {f['error']}")
        elif f:
            m = f["memory"]
            workers = ", ".join(f"{m[k]:.0f}" for k in sorted(m) if k.startswith("worker"))
            before = ", ".join(f"{v:.0f}" for v in f["worker_rss_before_fit_mib"].values())
            if "fit_error" in f:
                lines.append(f"  FIT FAILED after {f['fit_s']:.1f} s: {f['fit_error']}")
                lines.append(
                    f"  peak RSS MiB: driver {m['driver_peak_rss_mib']:.0f}, workers {workers} (before {before})"
                )
            else:
                lines.append(
                    f"  fit {f['fit_s']:.1f} s (warm-up {f['warmup_s']:.1f} s; driver CPU {f['driver_cpu_s']:.1f} s), "
                    f"test error {f['test_error']:.4f}, kernels {f['kernels']} -> weights "
                    f"{', '.join(f'{x:.3f}' for x in np.ravel(f['kernel_weights_']))}, C_ {f['C_']:.3g}"
                )
                lines.append(
                    f"  peak RSS MiB: driver {m['driver_peak_rss_mib']:.0f}, workers {workers} (before the fit "
                    f"{before}); features_spilled_ {f['features_spilled_']}, r = {f['n_components_']}, "
                    f"n r 8 = {_mib(f['nr8_bytes'])} MiB, spill disk {_mib(f['spill_disk_bytes'])} MiB"
                )
            probe = f.get("worker_feature_budget", {})
            if "shard_thread" in probe:
                task, shard = probe["task_thread"], probe["shard_thread"]
                lines.append(
                    f"  a worker's feature budget: {_mib(task['budget_bytes'])} MiB in a Dask task "
                    f"(spill to {task['scratch']}), {_mib(shard['budget_bytes'])} MiB in a shard's thread "
                    f"(spill to {shard['scratch']})"
                    + ("  <-- a shard's thread sees other settings than a task" if task != shard else "")
                )
            counts = ", ".join(f"{k} {v}" for k, v in f.get("stderr_counts", {}).items())
            lines.append(
                f"  workers restarted: {f['worker_restarted']}; shards rebuilt {f.get('shard_rebuilds')}; "
                f"in the cluster's logs: {counts}"
            )
            lines.extend(f"    {line}" for line in f.get("stderr_memory_lines", [])[:8])
            lines.extend(f"  {line.strip()}" for line in f["log"])
    return "\n".join(lines)


# ----------------------------------------------------------------------------- main


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="See the module docstring for what is measured and how.",
    )
    parser.add_argument("--part", choices=("memory", "store", "both"), default="both", help="which part (default both)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, synthetic data: checks the script end to end")
    parser.add_argument(
        "--out",
        help="JSON results (default benchmarks/results/two_stage_memory.json; "
        "two_stage_memory_smoke.json with --smoke)",
    )
    parser.add_argument("--work-dir", help="where the temporary folders go (default: the system's temp directory)")
    g = parser.add_argument_group("part 1 (memory)")
    g.add_argument("--n", type=int, default=300_000, help="training rows (default 300000)")
    g.add_argument("--n-test", type=int, default=N_TEST, help=f"test rows (default {N_TEST})")
    g.add_argument("--datasets-dir", default=DATASETS, help="folder with cod-rna.svm.gz and cod-rna.test.svm.gz")
    g.add_argument("--synthetic", action="store_true", help="use the synthetic stand-in even if cod-rna is there")
    g = parser.add_argument_group("part 2 (store)")
    g.add_argument("--store-rows", type=int, default=3_000_000, help="rows of the data store (default 3000000)")
    g.add_argument("--store-features", type=int, default=128, help="features of the data store (default 128)")
    g.add_argument("--store-test", type=int, default=STORE_TEST, help=f"test rows (default {STORE_TEST})")
    g.add_argument("--store-kernels", default=STORE_KERNELS, help=f"kernels (default {STORE_KERNELS})")
    g.add_argument("--workers", type=int, default=2, help="Dask workers = row shards (default 2)")
    g.add_argument("--memory-limit", default="1GiB", help="memory limit of each worker (default 1GiB)")
    g.add_argument(
        "--feature-memory",
        default=None,
        help="features a worker's shard may keep in memory before it spills them, e.g. 256MiB "
        "(MWUMKL_FEATURE_MEMORY on the workers; default: unset, the library's own budget)",
    )
    g.add_argument("--compress", action="store_true", help="Zstandard-compress the store's chunks")
    g.add_argument("--keep", action="store_true", help="keep the store afterwards")
    parser.add_argument("--_child", help=argparse.SUPPRESS)
    parser.add_argument("--_config", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args._child:
        with open(args._config) as fh:
            cfg = json.load(fh)
        result = CHILDREN[args._child](cfg)
        with open(cfg["result"], "w") as fh:
            json.dump(result, fh, indent=1, default=_json_default)
        return result
    if args.smoke:
        args.n, args.n_test, args.synthetic = 20_000, 10_000, True
        args.store_rows, args.store_test = 60_000, 10_000
        if args.feature_memory is None:
            args.feature_memory = "16MiB"
    args.n_components_guess = 500
    out_path = args.out or os.path.join(
        RESULTS, "two_stage_memory_smoke.json" if args.smoke else "two_stage_memory.json"
    )
    if args.work_dir:
        os.makedirs(args.work_dir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="mwumkl-two-stage-memory-", dir=args.work_dir)
    out = {
        "machine": run_info(),
        "smoke": bool(args.smoke),
        "threads": "1 per process (" + ", ".join(THREAD_VARS) + "=1)",
    }
    start = time.perf_counter()
    try:
        if args.part in ("memory", "both"):
            out["memory"] = part_memory(args, work)
        if args.part in ("store", "both"):
            out["store"] = part_store(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out["total_s"] = time.perf_counter() - start
    print(summary(out))
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    with open(out_path, "w") as fh:
        json.dump(out, fh, indent=2, default=_json_default)
    print(f"wrote {out_path}")
    return out


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


if __name__ == "__main__":
    main()
