#!/usr/bin/env python
"""Fit an MWUMKL classifier on a running Dask cluster and report the result.

The driver of every deployment in ``deploy/``: it connects to a Dask scheduler
(``--scheduler``, ``--scheduler-file`` or the ``DASK_SCHEDULER_ADDRESS``
environment variable, which the dask-kubernetes operator sets in a DaskJob's
pod), waits for ``--workers`` workers, fits ``MWUMKLClassifier(engine="dask")``
with ``--shards`` row shards and prints the test error and the kernel weights.

Without ``--data`` it uses scikit-learn's bundled breast-cancer data (569
points, 30 features; no download), split 80/20 and min-max scaled on the
training part, like ``mwumkl-dist demo``.  The CLI equivalent of a fit on a
file is ``mwumkl-dist fit --data FILE --model OUT --scheduler tcp://HOST:8786
--shards N``.

Network: the driver talks to the scheduler (port 8786) and also opens one TCP
connection per shard *to the worker* holding it, on a port the worker's OS
picks: the driver must reach the workers' addresses on any port (same Docker
network, same Kubernetes pod network, same HPC cluster network).

Exit codes: 0 success, 1 a failure while running (unreachable scheduler, too
few workers, bad data file, failed fit), 2 a bad command line.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import time

PROG = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "driver.py"


class DriverError(Exception):
    """A failure reported as one ``error:`` line with exit code 1."""


# ----------------------------------------------------------------------------- arguments

from mwumkl_dist.cli.args import (  # noqa: E402
    C_or_auto,
    epsilon_or_auto,
    interrupted_code,
    n_jobs,
    positive_float,
    positive_int,
    received_signals,
    signal_name,
    stop_signals,
)


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must lie in [0, 1), got {text!r}")
    return value


def add_fit_arguments(parser: argparse.ArgumentParser) -> None:
    """The data, model, sharding and output options shared by all drivers."""
    data = parser.add_argument_group("data")
    data.add_argument(
        "--data",
        metavar="FILE",
        help="labelled training data (svmlight, CSV, .npy, .npz; see mwumkl_dist.io); "
        "default: scikit-learn's breast-cancer data",
    )
    data.add_argument(
        "--test-size",
        type=_fraction,
        default=0.2,
        metavar="F",
        help="fraction held out (stratified) to report the test error; 0 trains on everything (default 0.2)",
    )
    data.add_argument("--seed", type=int, default=0, help="seed of the train/test split (default 0)")
    data.add_argument(
        "--no-scale",
        dest="scale",
        action="store_false",
        help="do not min-max scale dense features to [0, 1] (scaled on the training part by default; "
        "sparse data is never scaled)",
    )

    model = parser.add_argument_group("model")
    model.add_argument("--kernels", default="auto", metavar="SPEC", help="kernel family (default 'auto')")
    model.add_argument(
        "--epsilon",
        type=epsilon_or_auto,
        default="auto",
        help="approximation error (default 'auto', the estimator's default)",
    )
    model.add_argument(
        "--C",
        type=C_or_auto,
        default="auto",
        help="soft-margin constant, 'inf' for the hard margin (default 'auto': cross-validated, "
        "the estimator's default)",
    )
    model.add_argument("--max-iter", type=positive_int, metavar="T", help="run exactly T iterations")
    model.add_argument(
        "--n-jobs",
        type=n_jobs,
        default=None,
        metavar="N",
        help="threads of the driver's own work (C='auto' cross-validation, predictions, --compare-local): -1 "
        "all cores, N that many (default: every core the driver may use); the shards use their workers' threads",
    )

    dist = parser.add_argument_group("distribution")
    dist.add_argument(
        "--shards", type=positive_int, metavar="N", help="row shards (default: the number of workers waited for)"
    )
    dist.add_argument("--kernel-shards", type=positive_int, default=1, metavar="K", help="kernel shards (default 1)")
    dist.add_argument(
        "--timeout",
        type=positive_float,
        default=60.0,
        metavar="S",
        help="seconds to wait for the scheduler and for the workers (default 60)",
    )

    out = parser.add_argument_group("output and resilience")
    out.add_argument("--model", metavar="OUT", help="save the fitted model here (.npz)")
    out.add_argument(
        "--checkpoint",
        metavar="PATH",
        help="write the driver state here every --checkpoint-every; '{fit}' in PATH becomes the data file's name "
        "and a hash of the data file and the model settings (e.g. ckpt-{fit}.npz -> ckpt-train-3f2a9c01b7de.npz), "
        "so fits of other data or settings in the same folder never share a checkpoint",
    )
    out.add_argument(
        "--checkpoint-every", type=positive_int, default=100, metavar="K", help="iterations between checkpoints"
    )
    out.add_argument(
        "--resume",
        metavar="PATH",
        help="continue from this checkpoint; 'auto' resumes from --checkpoint when that file exists "
        "(for jobs that the cluster may restart)",
    )
    out.add_argument("--json", metavar="OUT", help="also write a JSON summary of the result here")
    out.add_argument(
        "--compare-local",
        action="store_true",
        help="also fit with the local engine and report the largest difference (should be ~0)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Fit MWUMKLClassifier(engine='dask') on a running Dask cluster and print the result.",
        epilog="The scheduler comes from --scheduler, --scheduler-file or $DASK_SCHEDULER_ADDRESS, in that order.",
    )
    cluster = parser.add_argument_group("cluster")
    cluster.add_argument("--scheduler", metavar="ADDR", help="scheduler address, e.g. tcp://scheduler:8786")
    cluster.add_argument("--scheduler-file", metavar="FILE", help="file written by 'dask scheduler --scheduler-file'")
    cluster.add_argument(
        "--workers",
        type=positive_int,
        default=None,
        metavar="W",
        help="wait until W workers are connected before fitting (default: --shards, or 1)",
    )
    add_fit_arguments(parser)
    return parser


#: The settings a checkpoint name's ``{fit}`` hash covers: those that change the data fitted or the model
#: (not the sharding, the threads or the checkpoint interval, which leave the model as it is).
FIT_SETTINGS = ("kernels", "epsilon", "C", "max_iter", "test_size", "seed", "scale")


def fit_key(args) -> str:
    """``NAME-HASH``: the data file's name and 12 hex digits of a hash of the data file and the fit's settings.

    The data file counts by its absolute path, size and modification time (no read), the
    settings by :data:`FIT_SETTINGS`.  Two jobs of the same fit get the same key (a resubmitted
    job resumes), two different fits different keys.
    """
    if args.data is None:
        name, identity = "breast-cancer", ["sklearn.datasets.load_breast_cancer"]
    else:
        path = os.path.abspath(args.data)
        name = os.path.basename(path).split(".")[0]
        try:
            info = os.stat(path)
            identity = [path, info.st_size, info.st_mtime_ns]
        except OSError:  # reported when the data is loaded
            identity = [path]
    settings = {key: getattr(args, key, None) for key in FIT_SETTINGS}
    digest = hashlib.sha256(json.dumps([identity, settings], sort_keys=True, default=str).encode()).hexdigest()
    name = re.sub(r"[^A-Za-z0-9_-]+", "_", name).strip("_") or "data"
    return f"{name}-{digest[:12]}"


def expand_checkpoint(args) -> None:
    """Replace ``{fit}`` in ``--checkpoint`` by :func:`fit_key` (``--resume auto`` then looks for that file)."""
    if args.checkpoint and "{fit}" in args.checkpoint:
        args.checkpoint = args.checkpoint.replace("{fit}", fit_key(args))
    if args.resume and "{fit}" in args.resume:
        args.resume = args.resume.replace("{fit}", fit_key(args))


def check_args(args, parser) -> None:
    if args.resume == "auto" and not args.checkpoint:
        parser.error("--resume auto needs --checkpoint PATH")
    expand_checkpoint(args)
    # Found now rather than after a long fit.
    for option in ("model", "checkpoint", "json"):
        path = getattr(args, option)
        if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            parser.error(f"--{option} {path}: the directory does not exist")


# ----------------------------------------------------------------------------- data


def load_dataset(args):
    """``(X_train, X_test, y_train, y_test, description)``; ``X_test`` is None when ``--test-size 0``."""
    import numpy as np
    import scipy.sparse as sp
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import MinMaxScaler

    if args.data is None:
        from sklearn.datasets import load_breast_cancer

        X, y = load_breast_cancer(return_X_y=True)
        name = "breast cancer (scikit-learn)"
    else:
        from mwumkl_dist.io import load_data

        X, y = load_data(args.data)
        name = args.data
    description = f"{name}: {X.shape[0]} points, {X.shape[1]} features, {len(np.unique(y))} classes"
    if args.test_size > 0:
        X_train, X_test, y_train, y_test = train_test_split(
            X, y, test_size=args.test_size, random_state=args.seed, stratify=y
        )
    else:
        X_train, X_test, y_train, y_test = X, None, y, None
    if args.scale and not sp.issparse(X_train):
        scaler = MinMaxScaler().fit(X_train)  # on the training part only
        X_train = scaler.transform(X_train)
        X_test = None if X_test is None else scaler.transform(X_test)
        description += "; min-max scaled"
    return X_train, X_test, y_train, y_test, description


# ----------------------------------------------------------------------------- cluster


def scheduler_address(args) -> str:
    """The address from ``--scheduler``, ``--scheduler-file`` or ``$DASK_SCHEDULER_ADDRESS``."""
    if args.scheduler:
        return args.scheduler
    if args.scheduler_file:
        deadline = time.monotonic() + args.timeout
        while not os.path.exists(args.scheduler_file):  # the scheduler may still be starting
            if time.monotonic() > deadline:
                raise DriverError(f"scheduler file {args.scheduler_file} did not appear within {args.timeout:g} s")
            time.sleep(0.2)
        try:
            with open(args.scheduler_file, encoding="utf-8") as fh:
                return json.load(fh)["address"]
        except (OSError, ValueError, KeyError) as exc:
            raise DriverError(f"cannot read the scheduler address from {args.scheduler_file}: {exc}") from None
    env = os.environ.get("DASK_SCHEDULER_ADDRESS")
    if env:
        return env
    raise DriverError(
        "no scheduler given: pass --scheduler ADDR or --scheduler-file FILE, or set DASK_SCHEDULER_ADDRESS"
    )


def connect(address: str, n_workers: int, timeout: float):
    """A ``distributed.Client`` on ``address`` with at least ``n_workers`` workers, or a clear error."""
    from distributed import Client

    try:
        client = Client(address, timeout=f"{timeout}s")
    except ValueError as exc:
        raise DriverError(f"bad scheduler address {address!r}: {exc}") from None
    except Exception as exc:  # OSError, TimeoutError, ...: say what and where, not a traceback
        raise DriverError(
            f"cannot reach the Dask scheduler at {address} within {timeout:g} s ({type(exc).__name__}: {exc})"
        ) from None
    wait_for_workers(client, n_workers, timeout)
    return client


def wait_for_workers(client, n_workers: int, timeout: float, out=None) -> None:
    """Wait until ``n_workers`` workers are connected, saying so on ``out`` (stderr) after 2 s, then every 10 s."""
    from mwumkl_dist.engines.dask_pool import WAIT_FIRST_REPORT, WAIT_REPORT_EVERY

    out = sys.stderr if out is None else out
    start = time.monotonic()
    report_at = start + WAIT_FIRST_REPORT
    while True:
        try:
            have = len(client.nthreads())  # every worker (scheduler_info may list only some)
        except Exception as exc:  # the scheduler went away while we waited
            client.close()
            raise DriverError(
                f"lost the connection to the Dask scheduler at {client.scheduler.address} while waiting for "
                f"workers ({type(exc).__name__}: {exc})"
            ) from None
        if have >= n_workers:
            return
        now = time.monotonic()
        if now - start > timeout:
            client.close()
            raise DriverError(f"only {have} of {n_workers} Dask workers connected within {timeout:g} s")
        if now >= report_at:
            print(
                f"{PROG}: waiting for Dask workers: {have} of {n_workers} connected ({now - start:.0f} s of "
                f"{timeout:g} s, --timeout)",
                file=out,
                flush=True,
            )
            report_at = now + WAIT_REPORT_EVERY
        time.sleep(0.1)


# ----------------------------------------------------------------------------- fit


def fit_and_report(client, args, data=None, out=None) -> dict:
    """Fit on ``client``'s cluster, print a report to ``out`` and return a summary dict.

    ``data`` is what :func:`load_dataset` returns (loaded here when None).
    """
    import numpy as np

    from mwumkl_dist import MWUMKLClassifier

    out = sys.stdout if out is None else out
    X_train, X_test, y_train, y_test, description = load_dataset(args) if data is None else data
    workers = sorted(client.nthreads())
    n_shards = args.shards if args.shards is not None else max(1, args.workers or len(workers))
    resume = args.resume
    if resume == "auto":
        resume = args.checkpoint if os.path.exists(args.checkpoint) else None
    params = dict(
        kernels=args.kernels,
        epsilon=args.epsilon,
        C=args.C,
        max_iter=args.max_iter,
        n_jobs=getattr(args, "n_jobs", None),
        n_shards=n_shards,
        checkpoint=args.checkpoint,
        checkpoint_every=args.checkpoint_every,
    )
    print(f"scheduler        {client.scheduler.address}", file=out)
    print(f"workers          {len(workers)}: {', '.join(workers)}", file=out)
    print(f"data             {description}", file=out)
    print(
        f"training points  {X_train.shape[0]}" + ("" if X_test is None else f", test points {X_test.shape[0]}"),
        file=out,
    )
    print(f"shards           {n_shards} row x {args.kernel_shards} kernel", file=out)
    if args.checkpoint:
        print(f"checkpoint       {args.checkpoint}", file=out)
    if resume:
        print(f"resuming from    {resume}", file=out)
    out.flush()

    clf = MWUMKLClassifier(engine="dask", client=client, n_kernel_shards=args.kernel_shards, **params)
    start = time.perf_counter()
    clf.fit(X_train, y_train, resume=resume)
    elapsed = time.perf_counter() - start
    n_iter = int(np.sum(clf.n_iter_))
    print(f"fit time         {elapsed:.2f} s ({n_iter} iterations)", file=out)
    print(f"parameters       epsilon {clf.epsilon_:g}, C {clf.C_:g}, polished {bool(clf.polished_)}", file=out)
    if clf.interrupted_:
        print("interrupted      the model is built from the iterations done", file=out)
    summary = {
        "scheduler": client.scheduler.address,
        "n_workers": len(workers),
        "n_shards": n_shards,
        "n_kernel_shards": args.kernel_shards,
        "n_train": int(X_train.shape[0]),
        "n_iter": n_iter,
        "epsilon": float(clf.epsilon_),
        "C": float(clf.C_),
        "fit_seconds": elapsed,
        "resumed": bool(resume),
        "interrupted": bool(clf.interrupted_),
        "kernel_names": list(clf.kernel_names_),
        "kernel_weights": np.asarray(clf.kernel_weights_).tolist(),
        "intercept": np.asarray(clf.intercept_).tolist(),
        "test_error": None,
    }
    if X_test is not None:
        errors = int(np.sum(clf.predict(X_test) != y_test))
        summary["test_error"] = errors / len(y_test)
        print(f"test error       {errors / len(y_test):.2%} ({errors} of {len(y_test)})", file=out)
    print(f"support vectors  {len(clf.support_)} of {X_train.shape[0]}", file=out)
    weights = np.atleast_2d(clf.kernel_weights_)
    if weights.shape[0] == 1:
        print("kernel weights:", file=out)
        for name, w in zip(clf.kernel_names_, weights[0]):
            print(f"  {name:<28} {w:.6f}", file=out)
    if args.compare_local:
        local = MWUMKLClassifier(engine="local", **{**params, "checkpoint": None}).fit(X_train, y_train)
        diff = max(
            float(np.max(np.abs(local.kernel_weights_ - clf.kernel_weights_))),
            float(np.max(np.abs(local.intercept_ - clf.intercept_))),
        )
        same = bool(np.array_equal(local.support_, clf.support_))
        summary["local_max_difference"] = diff
        summary["local_same_support"] = same
        print(f"vs local engine  max |difference| {diff:.3g}, same support vectors: {same}", file=out)
    if args.model:
        clf.save(args.model)
        print(f"model saved to   {args.model}", file=out)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(summary, fh, indent=2)
    out.flush()
    return summary


def run_cli(main_body, argv=None, parser=None) -> int:
    """Parse, run ``main_body(args)`` and turn expected failures into one ``error:`` line."""
    parser = build_parser() if parser is None else parser
    args = parser.parse_args(argv)
    check_args(args, parser)
    try:
        with stop_signals():  # SIGTERM (Kubernetes, SLURM) and SIGHUP: as Ctrl-C, the fit stops and saves
            main_body(args)
    except KeyboardInterrupt:
        print(f"{parser.prog}: error: interrupted{signal_name()}", file=sys.stderr)
        return interrupted_code()
    except DriverError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 1
    except (ValueError, TypeError, OSError, ConnectionError) as exc:
        print(f"{parser.prog}: error: {type(exc).__name__}: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    if received_signals:  # the fit stopped early and saved what it had (and its checkpoint, if any)
        print(f"{parser.prog}: interrupted{signal_name()}: the fit stopped early", file=sys.stderr)
        return interrupted_code()
    return 0


def _main_body(args) -> None:
    address = scheduler_address(args)
    data = load_dataset(args)  # a bad data file fails now, not after waiting for the cluster
    n_workers = args.workers or args.shards or 1
    client = connect(address, n_workers, args.timeout)
    try:
        fit_and_report(client, args, data)
    finally:
        client.close()


def main(argv=None) -> int:
    return run_cli(_main_body, argv)


if __name__ == "__main__":
    sys.exit(main())
