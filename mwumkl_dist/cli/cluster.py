"""The ``cluster`` command of ``mwumkl-dist``: a local Dask cluster that stays up until Ctrl-C.

``mwumkl-dist cluster`` starts a scheduler and worker processes on this machine (Dask's
``LocalCluster``) and prints the scheduler's address: pass it to ``fit --scheduler`` (or to
``MWUMKLClassifier(engine="dask", client=ADDRESS)``) from another terminal, as many times as you
like.  Ctrl-C (or SIGTERM) stops the workers and the scheduler.  For clusters on several machines see
``deploy/``.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import signal
import socket
import sys
import threading

from mwumkl_dist.cli.args import CommandError, positive_int
from mwumkl_dist.devices.threads import available_cpus
from mwumkl_dist.io.atomic import atomic_file

__all__ = ["add_cluster_command", "cmd_cluster", "DEFAULT_PORT"]

#: Dask's usual scheduler port.
DEFAULT_PORT = 8786


def _port(text: str) -> int:
    """A TCP port number, 0 to 65535 (0: any free one)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port from 0 to 65535 (0: any free one), got {text!r}")
    return value


#: Worker processes (and threads per worker) at most, per core of this machine: more only competes for the cores.
MAX_PER_CPU = 4


def _bounded_count(what: str):
    """A positive integer at most :data:`MAX_PER_CPU` times this machine's cores (at least 8)."""

    def parse(text: str) -> int:
        value = positive_int(text)
        limit = max(8, MAX_PER_CPU * available_cpus())
        if value > limit:
            raise argparse.ArgumentTypeError(
                f"{value} {what} on a machine of {available_cpus()} cores: at most {limit} (for more, start workers "
                "on several machines, see deploy/)"
            )
        return value

    return parse


def _memory_limit(text: str) -> str | int | float:
    """Dask's ``memory_limit``: ``auto``, ``0`` (none), a fraction of the memory in (0, 1], or a size (``2GiB``)."""
    from dask.utils import parse_bytes

    word = text.strip().lower()
    if word == "auto":
        return "auto"
    try:
        value = float(word)
    except ValueError:
        try:
            value = parse_bytes(word)
        except (ValueError, TypeError):
            value = None
        if value is None or value < 0:
            raise argparse.ArgumentTypeError(
                f"must be 'auto', 0 (no limit), a fraction of the memory (0.5) or a size (2GiB), got {text!r}"
            ) from None
        return int(value)
    if not (value >= 0 and value == value and value != float("inf")):
        raise argparse.ArgumentTypeError(
            f"must be 'auto', 0 (no limit), a fraction of the memory (0.5) or a size (2GiB), got {text!r}"
        )
    return value if value <= 1 else int(value)


def add_cluster_command(sub, parents) -> None:
    """Register ``cluster`` on the subparsers ``sub``."""
    p = sub.add_parser(
        "cluster",
        parents=parents,
        help="start a local Dask cluster (scheduler + workers) that stays up; fit --scheduler ADDRESS uses it",
        description="Start a Dask scheduler and worker processes on this machine and keep them up until Ctrl-C. "
        "Prints the scheduler's address: pass it to 'fit --scheduler ADDRESS' from another terminal.",
    )
    cpus = available_cpus()
    p.add_argument(
        "--workers", type=_bounded_count("workers"), default=2, metavar="N", help="worker processes (default 2)"
    )
    p.add_argument(
        "--threads-per-worker",
        type=_bounded_count("threads per worker"),
        default=None,
        metavar="T",
        help=f"threads of each worker (default: this machine's {cpus} cores shared by the workers, at least 1)",
    )
    p.add_argument(
        "--port",
        type=_port,
        default=DEFAULT_PORT,
        help=f"the scheduler's port (default {DEFAULT_PORT}; 0: any free one)",
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="the address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 for the network, "
        "see deploy/README.md on security)",
    )
    p.add_argument(
        "--memory-limit",
        type=_memory_limit,
        default="auto",
        metavar="BYTES",
        help="memory of each worker, e.g. 2GiB (default auto: the machine's memory shared by the workers)",
    )
    p.add_argument("--dashboard", action="store_true", help="also serve Dask's dashboard on port 8787")
    p.add_argument(
        "--address-file",
        metavar="FILE",
        help="also write the scheduler's address to FILE (one line), once the workers are up: for scripts",
    )
    p.set_defaults(func=cmd_cluster)


def _check_port_free(host: str, port: int) -> None:
    """A one-line error now when ``port`` is taken (Dask would fail with a long "Cluster failed to start")."""
    if port == 0:
        return
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise CommandError(
                    f"--port {port}: already in use (another cluster?); give another, or --port 0"
                ) from None
            raise CommandError(f"--host {host} --port {port}: cannot listen there ({exc.strerror})") from None


def _stop_on_signals() -> threading.Event:
    """An event set by SIGINT, SIGTERM or SIGHUP (the main thread waits on it)."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if sig is not None and (sig != getattr(signal, "SIGHUP", None) or signal.getsignal(sig) is not signal.SIG_IGN):
            signal.signal(sig, lambda *_: stop.set())
    return stop


def cmd_cluster(args) -> int:
    """``cluster``: start the scheduler and workers, print the address, wait for Ctrl-C, stop them."""
    from distributed import LocalCluster

    threads = args.threads_per_worker or max(1, available_cpus() // args.workers)
    _check_port_free(args.host, args.port)
    try:
        cluster = LocalCluster(
            n_workers=args.workers,
            threads_per_worker=threads,
            processes=True,
            host=args.host,
            scheduler_port=args.port,
            # ":0": the scheduler's HTTP server (always started) on a free port; the default 8787 is often taken.
            dashboard_address=":8787" if args.dashboard else ":0",
            memory_limit=args.memory_limit,
            silence_logs=logging.ERROR,  # Dask's start/stop chatter; errors still show
        )
    except (OSError, RuntimeError) as exc:
        raise CommandError(f"cannot start the cluster on --host {args.host} --port {args.port}: {exc}") from None
    except ValueError as exc:  # a bad --memory-limit
        raise CommandError(f"--memory-limit {args.memory_limit}: {exc}") from None
    try:
        address = cluster.scheduler_address
        stop = _stop_on_signals()
        if args.address_file:
            with atomic_file(args.address_file, "address file") as fh:
                fh.write(f"{address}\n".encode())
        print(
            f"Dask cluster up: scheduler {address}, {args.workers} worker processes x {threads} thread"
            f"{'s' * (threads != 1)}" + (f", dashboard {cluster.dashboard_link}" if args.dashboard else ""),
            flush=True,
        )
        print(f"fit on it:  mwumkl-dist fit --data FILE --model MODEL --scheduler {address} --shards {args.workers}")
        print("stop it:    Ctrl-C", flush=True)
        while not stop.wait(1.0):
            pass
    finally:
        print("stopping the cluster ...", file=sys.stderr, flush=True)
        cluster.close(timeout=30)
        if args.address_file and os.path.exists(args.address_file):
            os.unlink(args.address_file)
    return 0
