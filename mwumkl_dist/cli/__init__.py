"""The ``mwumkl-dist`` command-line tool (also ``python -m mwumkl_dist``).

Commands: ``demo`` (fit on scikit-learn's breast-cancer data and show the
kernel weights), ``fit``, ``predict`` and ``evaluate`` (:mod:`.model`), and
``store data|kernels|info`` (:mod:`.store`).  Bad input ends with one line
``mwumkl-dist: error: ...`` on stderr: exit code 2 for a bad command line, 1
for a problem found while running, 130 when interrupted (``fit`` still saves
the iterations done).  ``--debug`` shows the traceback instead.

The package's other modules never import this one: the command line sits on
top of the library.  The parser (:mod:`.parser`) loads nothing heavy: ``--version``,
``--help`` and usage errors answer at once, and a command's module is imported when it runs (:mod:`.commands`).
"""

from __future__ import annotations

import os
import sys
import warnings

from mwumkl_dist.cli import commands
from mwumkl_dist.cli.args import PROG, CommandError, UsageError, interrupted_code, signal_name, stop_signals
from mwumkl_dist.cli.parser import build_parser

__all__ = ["main", "build_parser"]

#: Errors of bad input or of the environment: reported by their message alone.
_EXPECTED = (ValueError, TypeError, OSError, MemoryError)


def _one_line(message) -> str:
    return " ".join(str(message).split())


def _fail(message, code: int) -> int:
    print(f"{PROG}: error: {_one_line(message)}", file=sys.stderr)
    return code


def _show_warning(message, category, filename, lineno, file=None, line=None):
    print(f"{PROG}: warning: {_one_line(message)}", file=sys.stderr)


def main(argv=None) -> int:
    """Run ``mwumkl-dist`` with ``argv`` (default ``sys.argv[1:]``) and return the exit code."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parser.parse_args(argv)
    except UsageError as exc:
        return _fail(exc, 2)
    if args.command is None:
        return _fail(f"choose a command: demo, fit, predict, evaluate, plot, store or cluster (see '{PROG} --help')", 2)
    try:
        with warnings.catch_warnings(), stop_signals():  # SIGTERM and SIGHUP: as Ctrl-C
            warnings.simplefilter("default")
            warnings.showwarning = _show_warning
            return commands.run(args)
    except UsageError as exc:
        return _fail(f"{exc} (see '{PROG} {args.command} --help')", 2)
    except CommandError as exc:
        return _fail(exc, exc.code)
    except KeyboardInterrupt:
        if args.debug:
            raise
        return _fail(f"interrupted{signal_name()}", interrupted_code())
    except BrokenPipeError:
        # The reader (e.g. `head`) went away: silence the flush at exit (the Python docs' recipe).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except Exception as exc:
        if args.debug:
            raise
        if isinstance(exc, MemoryError):  # its message is often empty
            return _fail(f"out of memory{': ' + str(exc) if str(exc) else ''}; the input is too large for this "
                         "machine (see the store commands for data larger than memory)", 1)  # fmt: skip
        if isinstance(exc, _EXPECTED):
            return _fail(exc, 1)
        return _fail(f"unexpected {type(exc).__name__}: {exc} (rerun with --debug for the traceback)", 1)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
