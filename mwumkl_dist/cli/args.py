"""Argument types, the parser class and the errors of the ``mwumkl-dist`` command line.

The types raise ``argparse.ArgumentTypeError`` with a message that says what is
wrong with the value; :class:`Parser` turns every parse error into a
:class:`UsageError`, which :func:`mwumkl_dist.cli.main` prints as one line.
Other command lines (``deploy/driver.py``) use the same types.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os

from mwumkl_dist.devices.memory import parse_memory_limit

__all__ = [
    "PROG",
    "EXIT_INTERRUPTED",
    "stop_signals",
    "signal_name",
    "interrupted_code",
    "UsageError",
    "CommandError",
    "Parser",
    "number",
    "positive_float",
    "positive_int",
    "n_jobs",
    "epsilon_or_auto",
    "C_or_auto",
    "selectivity_choice",
    "kernel_spec",
    "KERNEL_SPEC_HINT",
    "ZERO_BASED",
    "existing_file",
    "add_zero_based_argument",
]

PROG = "mwumkl-dist"
#: Exit code of an interrupted command (128 + SIGINT, as shells report it).
EXIT_INTERRUPTED = 130


#: The termination signals (SIGTERM, SIGHUP) received while a command ran, in order; see :func:`stop_signals`.
received_signals: list[int] = []


def signal_name() -> str:
    """``" (SIGTERM)"`` when a termination signal stopped the command, else ``""`` (a Ctrl-C)."""
    import signal

    return f" ({signal.Signals(received_signals[0]).name})" if received_signals else ""


def interrupted_code() -> int:
    """The exit code of an interrupted command: 128 + the signal (130 for Ctrl-C, 143 for SIGTERM)."""
    return 128 + received_signals[0] if received_signals else EXIT_INTERRUPTED


@contextlib.contextmanager
def stop_signals():
    """While the block runs, SIGTERM and SIGHUP do what Ctrl-C does (what Kubernetes, SLURM and a closed
    terminal send): a fit stops after its current iteration and saves the model (and a checkpoint, where one
    is configured); anything else stops at once.

    A signal the parent process set to be ignored (``nohup``) stays ignored; off the main thread, nothing changes.
    """
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received_signals.clear()

    def forward(signum, frame):
        received_signals.append(signum)
        handler = signal.getsignal(signal.SIGINT)  # the solver's (stop after this iteration), or Python's
        if callable(handler) and handler is not signal.default_int_handler:
            handler(signal.SIGINT, frame)
        else:
            raise KeyboardInterrupt

    previous = {}
    for sig in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)):
        if sig is not None and signal.getsignal(sig) is signal.SIG_DFL:
            previous[sig] = signal.signal(sig, forward)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class UsageError(Exception):
    """A bad command line: reported on one line with exit code 2."""


class CommandError(Exception):
    """A failure with its own exit code (1 unless given)."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


class Parser(argparse.ArgumentParser):
    """Raises :class:`UsageError` instead of printing the usage block; ``main`` prints one line."""

    def error(self, message):
        raise UsageError(f"{message} (see '{self.prog} --help')")


def number(text: str) -> float:
    """A float, or ``ArgumentTypeError`` naming the text."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def positive_float(text: str) -> float:
    """A positive finite float."""
    value = number(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive finite number, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def auto_or_positive_int(text: str):
    """``"auto"`` or an integer >= 1."""
    return "auto" if text == "auto" else positive_int(text)


def n_jobs(text: str) -> int:
    """A non-zero integer, scikit-learn's ``n_jobs``: -1 all cores, -2 all but one, N that many."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value == 0:
        raise argparse.ArgumentTypeError("must be a non-zero integer (-1: all cores, -2: all but one), got '0'")
    return value


def epsilon_or_auto(text: str) -> float | str:
    """``"auto"`` or a positive finite epsilon (the bound ``epsilon < 2 rho`` is checked with rho)."""
    if text.strip().lower() == "auto":
        return "auto"
    return positive_float(text)


def C_or_auto(text: str) -> float | str:
    """``"auto"``, a positive number, or ``inf`` (the hard margin)."""
    if text.strip().lower() == "auto":
        return "auto"
    value = number(text)
    if math.isnan(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be 'auto', a positive number or 'inf' (hard margin), got {text!r}")
    return value


def n_components_or_auto(text: str) -> int | str:
    """``"auto"`` or a positive integer (the two-stage fit's Nystroem rank)."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"must be 'auto' or a positive integer, got {text!r}") from None


def memory_size(text: str) -> int | str:
    """``"auto"`` or a size (``"1GB"``, ``"512MiB"``, bytes): the fit's ``memory_limit``."""
    try:
        return "auto" if parse_memory_limit(text) is None else parse_memory_limit(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("memory_limit ")) from None


def selectivity_choice(text: str) -> float | str:
    """``"auto"``, ``"exact"`` (also ``inf``), ``"paper"`` or a number ``>= 0``."""
    word = text.strip().lower()
    if word in ("auto", "exact", "paper"):
        return word
    value = number(text)
    if math.isnan(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be 'auto', 'exact', 'paper' or a number >= 0, got {text!r}")
    return "exact" if math.isinf(value) else value


#: What ``--kernels`` takes, in a few words (the whole list is in ``--help`` and docs/kernels.md).
KERNEL_SPEC_HINT = "e.g. scaled, paper, linear, poly:2, gaussian:0.5, random:1000, gaussian:1@0-4"


def kernel_spec(text: str) -> str:
    """A kernel spec string, checked for syntax (feature indices are checked against the data later).

    A bad spec is one short line: what is wrong and a few examples, not the whole spec help that the
    library's message carries (``; expected ...``).
    """
    if text.strip().lower() == "precomputed":
        return "precomputed"  # only with 'fit --store' of a kernel store; checked there
    # Here, not at the top: the parser of every command imports this module, and the kernels' loads numpy and numba.
    from mwumkl_dist.kernels.specs import DataScale, parse_kernels

    try:
        parse_kernels(text, None, scale=lambda: DataScale(1, (0,), (0,)))  # the syntax only
    except (ValueError, TypeError) as exc:
        what = str(exc).split("; expected ", 1)[0]
        raise argparse.ArgumentTypeError(f"{what} ({KERNEL_SPEC_HINT})") from None
    return text


def device_name(text: str) -> str:
    """A ``--device`` value: a name in the back-ends' registry (:data:`mwumkl_dist.data.backends.BACKENDS`), so
    that a new device needs no change here."""
    # Here, not at the top: the back-ends load numpy, which --help and usage errors do not pay for.
    from mwumkl_dist.data.backends import BACKENDS

    if text not in BACKENDS:
        raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from {', '.join(map(repr, BACKENDS))})")
    return text


def existing_file(path: str, option: str) -> str:
    """``path``, or a one-line :class:`CommandError` naming ``option`` when it is a directory or does not exist."""
    if os.path.isdir(path):
        raise CommandError(f"{option} {path}: is a directory, not a file")
    if not os.path.exists(path):
        raise CommandError(f"{option} {path}: no such file")
    return path


#: ``--zero-based`` choices -> ``load_data(zero_based=...)``.
ZERO_BASED = {"auto": "auto", "yes": True, "no": False}


def add_zero_based_argument(parser, option: str = "--data") -> None:
    """``--zero-based auto|yes|no`` on a command that reads an svmlight file given as ``option``."""
    parser.add_argument(
        "--zero-based",
        choices=tuple(ZERO_BASED),
        default="auto",
        help=f"feature indices of an svmlight {option} file: 'no' counts from 1 (LIBSVM), 'yes' from 0, 'auto' "
        "(default) reads a file that uses index 0 as 0-based; predict and evaluate read it as the model's "
        "training file was read (fit records the convention in the model)",
    )
