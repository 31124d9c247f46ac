"""Shared plumbing of the experiments: context, machine info, statistics, output files, progress."""

from __future__ import annotations

import csv
import functools
import json
import math
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

__all__ = ["Context", "machine_info", "median_ci", "write_outputs", "Progress", "RowJournal", "REPO"]

REPO = Path(__file__).resolve().parent.parent


@dataclass
class Context:
    """What every experiment gets: where to write, quick or full, where the data are."""

    out: Path
    quick: bool = False
    datasets_dir: Path | None = None
    command: str = ""
    jobs: int = 2
    progress: bool = True
    seed: int = 0
    splits: int | None = None
    log_stream: object = field(default=None, repr=False)

    def __post_init__(self):
        _git_commit()  # recorded now: the results describe the code this run loaded, not a later checkout

    def log(self, message: str) -> None:
        stream = self.log_stream if self.log_stream is not None else sys.stderr
        print(message, file=stream, flush=True)


@functools.cache
def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        return out + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def machine_info() -> dict:
    """CPU, cores, memory, library versions and git commit of this run."""
    import numba
    import scipy
    import sklearn

    import mwumkl_dist
    from mwumkl_dist.devices import threads

    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mem = None
    try:
        mem = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "available_cpus": threads.available_cpus(),
        "memory_gib": mem,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "scikit-learn": sklearn.__version__,
        "numba": numba.__version__,
        "numba_threads": numba.get_num_threads(),
        "blas_threads": _blas_threads(),
        # The threads a fit started here uses (MWUMKL_NUM_THREADS, thread limits and numba's pool included).
        "mwumkl_threads": threads.current_threads(),
        "mwumkl_dist": mwumkl_dist.__version__,
        "git_commit": _git_commit(),
    }


def _blas_threads():
    from threadpoolctl import threadpool_info

    return max((p.get("num_threads", 0) for p in threadpool_info() if p.get("user_api") == "blas"), default=None)


def run_info() -> dict:
    """:func:`machine_info` plus the exact command of this run (for the stand-alone benchmark scripts)."""
    return {**machine_info(), "command": " ".join([sys.executable, *sys.argv])}


def median_ci(values, level: float = 0.95) -> dict:
    """Median with a distribution-free confidence interval from order statistics.

    The interval ``[x_(j), x_(n-j+1)]`` with the largest ``j`` whose binomial
    coverage ``P(j <= B < n-j+1)``, ``B ~ Bin(n, 1/2)``, is at least ``level``
    (for n = 30: ``x_(10)`` to ``x_(21)``, coverage 95.7 %).  With too few
    values for that level the interval is ``[min, max]`` and ``coverage`` says
    what it really is.
    """
    from scipy.stats import binom

    x = np.sort(np.asarray(values, dtype=np.float64))
    n = len(x)
    if n == 0:
        return {"median": math.nan, "lo": math.nan, "hi": math.nan, "coverage": 0.0, "n": 0}
    j = 1
    for cand in range(1, n // 2 + 1):
        coverage = 1.0 - 2.0 * binom.cdf(cand - 1, n, 0.5)
        if coverage >= level:
            j = cand
        else:
            break
    coverage = float(1.0 - 2.0 * binom.cdf(j - 1, n, 0.5))
    return {"median": float(np.median(x)), "lo": float(x[j - 1]), "hi": float(x[n - j]), "coverage": coverage, "n": n}


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def write_csv(path: Path, rows: list[dict], value=lambda v: v) -> None:
    """One CSV line per row; the columns are every key in order of first appearance, cells ``value(v)``."""
    columns: list[str] = []
    for r in rows:
        columns.extend(k for k in r if k not in columns)
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=columns)
        w.writeheader()
        for r in rows:
            w.writerow({k: value(v) for k, v in r.items()})


def write_outputs(
    ctx: Context,
    key: str,
    title: str,
    rows: list[dict],
    summary: dict,
    settings: dict,
    figures: list[str],
    started: float,
    resumed: int = 0,
) -> Path:
    """``{key}.csv`` (one line per measurement) and ``{key}.json`` (everything, with machine and command)."""
    ctx.out.mkdir(parents=True, exist_ok=True)
    csv_path = ctx.out / f"{key}.csv"
    write_csv(csv_path, rows, _jsonable)
    doc = {
        "experiment": key,
        "title": title,
        "command": ctx.command,
        "quick": ctx.quick,
        "machine": machine_info(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)),
        "seconds": round(time.time() - started, 2),
        # Measurements taken over from an interrupted earlier run of the same settings (see RowJournal).
        "resumed_measurements": resumed,
        "settings": settings,
        "summary": summary,
        "figures": figures,
        "rows": rows,
    }
    json_path = ctx.out / f"{key}.json"
    with open(json_path, "w", encoding="utf-8") as fh:
        json.dump(_jsonable(doc), fh, indent=1)
    return json_path


class Progress:
    """A progress bar over an experiment's units of work (quiet when disabled)."""

    def __init__(self, ctx: Context, total: int, label: str):
        from mwumkl_dist.cli.progress import progress_bar

        self.enabled = ctx.progress and total > 0
        self.done = 0
        self.label = label
        self.bar = progress_bar(max(total, 1), file=ctx.log_stream or sys.stderr, unit="runs") if self.enabled else None

    def step(self, what: str = "") -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.set_description_str(f"{self.label} {what}".strip().replace("  ", " "), refresh=False)
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class RowJournal:
    """Result rows appended to ``{key}.partial.jsonl`` as they are measured, so a run can resume.

    An interrupted experiment keeps every finished measurement: the next run
    with the same ``settings`` skips them (a journal written with other
    settings is set aside, never mixed in).  :meth:`finish` removes the journal
    once the experiment's outputs are written.
    """

    def __init__(self, ctx: Context, key: str, settings: dict):
        self.path = ctx.out / f"{key}.partial.jsonl"
        self.header = json.dumps(_jsonable({"settings": settings, "quick": ctx.quick}), sort_keys=True)
        self.rows: dict[str, dict] = {}
        ctx.out.mkdir(parents=True, exist_ok=True)
        if self.path.is_file():
            with open(self.path, encoding="utf-8") as fh:
                lines = fh.read().splitlines()
            if lines and lines[0] == self.header:
                good = [lines[0]]
                for line in lines[1:]:
                    try:
                        entry = json.loads(line)
                    except json.JSONDecodeError:  # a line cut by the interruption
                        continue
                    self.rows[entry["id"]] = entry["row"]
                    good.append(line)
                if len(good) < len(lines):  # rewrite without the cut line, so appends stay line-aligned
                    with open(self.path, "w", encoding="utf-8") as fh:
                        fh.write("\n".join(good) + "\n")
                if self.rows:
                    ctx.log(f"resuming {key}: {len(self.rows)} measurements from {self.path.name}")
            else:
                self.path.replace(self.path.with_suffix(".stale"))
        if not self.path.is_file():
            with open(self.path, "w", encoding="utf-8") as fh:
                fh.write(self.header + "\n")
        self.resumed = len(self.rows)

    def get(self, ident: str) -> dict | None:
        return self.rows.get(ident)

    def add(self, ident: str, row: dict) -> None:
        self.rows[ident] = row
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(_jsonable({"id": ident, "row": row})) + "\n")

    def finish(self) -> None:
        self.path.unlink(missing_ok=True)


def smoke_datasets(folder, sizes: dict) -> Path:
    """Write generated stand-ins as ``NAME.svm.gz`` files into ``folder`` (``{file name: (set, rows)}``, e.g.
    ``{"a9a.svm.gz": ("a9a", 300)}``) and return it: the data of a benchmark script's ``--smoke`` run, which
    reads the files as it reads the real ones (CI has no data folder).  The numbers mean nothing."""
    import gzip

    from sklearn.datasets import dump_svmlight_file

    from benchmarks.datasets import synthetic_standin

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for seed, (file_name, (name, rows)) in enumerate(sorted(sizes.items())):
        ds = synthetic_standin(name, seed=seed, n_samples=rows)
        with gzip.open(folder / file_name, "wb") as fh:
            dump_svmlight_file(ds.X, ds.y, fh, zero_based=False)
    return folder
