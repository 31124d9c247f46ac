"""Runs a parsed ``mwumkl-dist`` command: its module is imported when it runs.

The parser (:mod:`.parser`) names each command's handler as ``(module, function)`` (``handler``), and loads
nothing heavy, so that ``--version``, ``--help`` and a usage error answer at once; :func:`run` imports the
command's module (:mod:`.model`, :mod:`.store`, :mod:`.plot`, :mod:`.cluster`: scikit-learn, numba, zarr or
Dask), with a notice on a terminal when that takes long.  The dependency is one-way: this module imports the
command modules, they import the parser's constants, and the parser imports neither.
"""

from __future__ import annotations

import sys
import threading

from mwumkl_dist.cli.args import PROG

__all__ = ["run", "loading_notice"]

#: Seconds a command's modules may take to load before a terminal is told what is loading.
LOADING_NOTICE_SECONDS = 1.0


def _command_module(name: str):
    """The command module ``name`` of the parser's ``handler``, imported now."""
    if name == "model":
        from mwumkl_dist.cli import model

        return model
    if name == "store":
        from mwumkl_dist.cli import store

        return store
    if name == "plot":
        from mwumkl_dist.cli import plot

        return plot
    if name == "cluster":
        from mwumkl_dist.cli import cluster

        return cluster
    raise ValueError(f"no command module {name!r}")


def run(args) -> int:
    """Run the command ``args`` parsed (its ``handler``: ``(module, function)``); its exit code."""
    module, name = args.handler
    with loading_notice(quiet=getattr(args, "quiet", False)):
        handler = getattr(_command_module(module), name)
    return int(handler(args) or 0)


class loading_notice:
    """Says on a terminal's stderr what loads when loading takes longer than :data:`LOADING_NOTICE_SECONDS`."""

    def __init__(self, quiet: bool = False):
        self._timer = None if quiet or not sys.stderr.isatty() else threading.Timer(LOADING_NOTICE_SECONDS, self._say)
        self.said = False

    def _say(self) -> None:
        self.said = True
        print(f"{PROG}: loading scikit-learn, numba and the model code ...", file=sys.stderr, flush=True)

    def __enter__(self):
        if self._timer is not None:
            self._timer.daemon = True
            self._timer.start()
        return self

    def __exit__(self, *exc):
        if self._timer is not None:
            self._timer.cancel()
        return False
