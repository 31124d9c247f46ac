#!/usr/bin/env python
"""Fit on Dask workers that dask-jobqueue submits as SLURM jobs.

Starts a ``dask_jobqueue.SLURMCluster`` (its scheduler runs in this process),
submits ``--jobs`` worker jobs configured by ``jobqueue.yaml``, waits for the
workers and runs the same fit and report as ``deploy/driver.py``.  Run it on a
login node or, better, inside a small batch job (``submit.sbatch``).  Without
dask-jobqueue use ``allocation.sbatch`` instead, which needs only dask.

``--dry-run`` prints the worker job script without submitting anything.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

from mwumkl_dist.cli.args import positive_int

HERE = Path(__file__).resolve().parent

# The shared driver (deploy/driver.py), loaded under its own name: this file is also called driver.py.
_spec = importlib.util.spec_from_file_location("mwumkl_deploy_driver", HERE.parent / "driver.py")
common = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(common)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="driver.py",
        description="Fit MWUMKLClassifier(engine='dask') on SLURM jobs started by dask-jobqueue's SLURMCluster.",
    )
    slurm = parser.add_argument_group("SLURM (dask-jobqueue)")
    slurm.add_argument(
        "--config",
        default=str(HERE / "jobqueue.yaml"),
        metavar="YAML",
        help="dask-jobqueue settings with a jobqueue.slurm section (default: jobqueue.yaml next to this script)",
    )
    slurm.add_argument("--jobs", type=positive_int, default=2, metavar="J", help="worker jobs to submit (default 2)")
    slurm.add_argument("--queue", help="partition, overrides the config")
    slurm.add_argument("--account", help="account, overrides the config")
    slurm.add_argument("--walltime", help="walltime of each worker job, e.g. 02:00:00, overrides the config")
    slurm.add_argument("--memory", help="memory of each worker job, e.g. 8GiB, overrides the config")
    slurm.add_argument("--dry-run", action="store_true", help="print the worker job script and exit")
    common.add_fit_arguments(parser)
    # Worker jobs may wait in the queue: a longer default than the shared driver's.
    parser.set_defaults(timeout=3600.0, workers=None)
    return parser


def load_config(path) -> dict:
    """The YAML settings, checked to hold a ``jobqueue.slurm`` mapping."""
    import yaml

    try:
        with open(path, encoding="utf-8") as fh:
            config = yaml.safe_load(fh)
    except OSError as exc:
        raise common.DriverError(f"cannot read the dask-jobqueue config {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise common.DriverError(f"{path} is not valid YAML: {exc}") from None
    slurm = config.get("jobqueue", {}).get("slurm") if isinstance(config, dict) else None
    if not isinstance(slurm, dict):
        raise common.DriverError(f"{path} has no 'jobqueue: slurm:' section")
    return config


def import_slurm_cluster():
    try:
        from dask_jobqueue import SLURMCluster
    except ImportError:
        raise common.DriverError(
            "dask-jobqueue is not installed: 'pip install dask-jobqueue', or use deploy/slurm/allocation.sbatch, "
            "which needs only dask"
        ) from None
    return SLURMCluster


def make_cluster(args):
    """A ``SLURMCluster`` from ``--config`` and the command-line overrides."""
    config = load_config(args.config)
    SLURMCluster = import_slurm_cluster()
    import dask

    # After importing dask_jobqueue (which registers its defaults): merge, do not replace.
    dask.config.update(dask.config.config, config, priority="new")
    overrides = {
        key: value
        for key, value in (
            ("queue", args.queue),
            ("account", args.account),
            ("walltime", args.walltime),
            ("memory", args.memory),
        )
        if value is not None
    }
    return SLURMCluster(**overrides)


def _main_body(args) -> None:
    from distributed import Client

    load_config(args.config)  # fail fast: a bad config, no dask-jobqueue, bad data
    import_slurm_cluster()
    data = None if args.dry_run else common.load_dataset(args)
    cluster = make_cluster(args)
    try:
        if args.dry_run:
            print(cluster.job_script())
            return
        cluster.scale(jobs=args.jobs)
        args.workers = len(cluster.plan)  # worker processes: jobs x processes per job
        print(f"submitted {args.jobs} SLURM jobs for {args.workers} Dask workers; waiting (up to {args.timeout:g} s)")
        sys.stdout.flush()
        with Client(cluster) as client:
            common.wait_for_workers(client, args.workers, args.timeout)
            common.fit_and_report(client, args, data)
    finally:
        cluster.close()


def main(argv=None) -> int:
    return common.run_cli(_main_body, argv, parser=build_parser())


if __name__ == "__main__":
    sys.exit(main())
