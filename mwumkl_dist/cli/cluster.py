"""The ``cluster`` command of ``mwumkl-dist``: a local Dask cluster that stays up until Ctrl-C.

``mwumkl-dist cluster`` starts a scheduler and worker processes on this machine (Dask's
``LocalCluster``) and prints the scheduler's address: pass it to ``fit --scheduler`` (or to
``MWUMKLClassifier(engine="dask", client=ADDRESS)``) from another terminal, as many times as you
like.  Ctrl-C (or SIGTERM) stops the workers and the scheduler.  For clusters on several machines see
``deploy/``.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import socket
import sys
import threading

from mwumkl_dist.cli.args import CommandError
from mwumkl_dist.devices.threads import available_cpus
from mwumkl_dist.io.atomic import atomic_file

__all__ = ["cmd_cluster"]


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
    # The worker processes start with SIGINT ignored (an ignored signal stays ignored in a child, and Python then
    # installs no KeyboardInterrupt): a terminal's Ctrl-C reaches the whole process group, and workers torn down
    # by it, each on its own, spill tracebacks and slow the orderly stop below (17 s in issue 41).
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
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
    finally:
        signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)
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
