"""``python -m benchmarks EXPERIMENT [--quick] [--out DIR] [--datasets-dir DIR]``: run experiments, write the report.

A source-checkout tool: the installed package has no ``bench`` command (it ships
``mwumkl_dist`` only, not this folder).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path

from .common import Context

__all__ = ["main", "build_parser", "DEFAULT_OUT", "QUICK_OUT"]

HERE = Path(__file__).resolve().parent
#: Full runs write here (committed: small PNGs, CSV, JSON) and the report to benchmarks/RESULTS.md.
DEFAULT_OUT = HERE / "results"
#: Quick runs write here (git-ignored).
QUICK_OUT = HERE / "out" / "quick"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Reproduce the MWUMKL paper's experiments (E1-E5) against its baselines and write a report.",
    )
    p.add_argument(
        "experiments",
        nargs="+",
        metavar="EXPERIMENT",
        help="e1 (small-set accuracy), e2 (cod-rna time), e3 (a9a error), e4 (kernel scalability), "
        "e5 (dynamic kernels), all, or report (only rebuild the report)",
    )
    p.add_argument("--quick", action="store_true", help="shrunk versions of every experiment (a few minutes)")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"output folder (default: {DEFAULT_OUT.relative_to(HERE.parent)}, "
        f"or {QUICK_OUT.relative_to(HERE.parent)} with --quick)",
    )
    p.add_argument(
        "--datasets-dir",
        type=Path,
        default=None,
        help="folder with the data files of MANIFEST.json (default: ../shared/datasets when present; "
        "else downloads into $MWUMKL_DIST_CACHE or ~/.cache/mwumkl_dist)",
    )
    p.add_argument("--splits", type=int, default=None, help="E1: random splits per data set (default 30; quick 2)")
    p.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="parallel cross-validation fits (default 2; 1 with --quick, where process start-up dominates)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument(
        "--report",
        type=Path,
        default=None,
        help="where to write the Markdown report (default: benchmarks/RESULTS.md for the default "
        "output folder, else OUT/RESULTS.md)",
    )
    return p


def main(argv=None) -> int:
    """Run the experiments named in ``argv`` and rebuild the report; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    from . import experiments, report

    out = args.out if args.out is not None else (QUICK_OUT if args.quick else DEFAULT_OUT)
    if args.datasets_dir is not None and not args.datasets_dir.is_dir():
        parser.error(f"--datasets-dir {args.datasets_dir}: not a folder")
    if args.splits is not None and args.splits < 1:
        parser.error("--splits must be a positive integer")
    argv_list = sys.argv[1:] if argv is None else list(argv)
    ctx = Context(
        out=out.resolve(),
        quick=args.quick,
        datasets_dir=args.datasets_dir,
        command="python -m benchmarks " + " ".join(shlex.quote(a) for a in argv_list),
        jobs=max(1, args.jobs if args.jobs is not None else (1 if args.quick else 2)),
        progress=not args.no_progress,
        seed=args.seed,
        splits=args.splits,
    )
    names = [n.lower() for n in args.experiments]
    t0 = time.time()
    try:
        if names != ["report"]:
            from threadpoolctl import threadpool_limits

            # One BLAS thread and one solver thread (MWUMKL_NUM_THREADS=1, inherited by the joblib
            # workers): every method gets the same single core, and parallel cross-validation jobs do
            # not oversubscribe the machine.
            saved = os.environ.get("MWUMKL_NUM_THREADS")
            os.environ["MWUMKL_NUM_THREADS"] = "1"
            try:
                with threadpool_limits(1, user_api="blas"):
                    experiments.run([n for n in names if n != "report"], ctx)
            finally:
                if saved is None:
                    os.environ.pop("MWUMKL_NUM_THREADS", None)
                else:
                    os.environ["MWUMKL_NUM_THREADS"] = saved
    except (ValueError, RuntimeError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    target = args.report
    if target is None:
        target = HERE / "RESULTS.md" if ctx.out == DEFAULT_OUT.resolve() else ctx.out / "RESULTS.md"
    path = report.write_report(ctx.out, target)
    print(f"report: {path} ({time.time() - t0:.1f} s)")
    return 0
