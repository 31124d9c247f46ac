"""Progress of a fit, phase by phase: what the solvers report and what the callback, the log and the CLI see.

A fit runs in phases: cross-validation folds, MWU iterations, the exact polish, the Nystroem rank,
the kernel columns on the landmarks, Newton steps, Platt's folds.  Whoever runs one opens it and
advances it::

    with progress.phase("cross-validation", total=18, unit="fits", description="choosing C") as step:
        for fold in folds:
            ...
            step.advance()

Without a reporter (the default, and inside a fold's nested fit, see :func:`quiet`) a phase is a
no-op.  The estimator's fit installs one (:func:`reporting`) that hands each event, a
:class:`ProgressInfo`, to its sink: the ``callback``, the ``verbose`` log (:class:`LogSink`), the
command line's bars.  A nested fit that is part of the outer one (the two-stage weight stage)
reports into the same reporter, its descriptions prefixed by :func:`stage`.

The reporter is found through a context variable, so it follows the thread that runs the fit; a
worker thread sees none unless handed a :class:`Phase` (which is thread-safe, and pickles to a
silent phase: a remote shard reports nothing).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

__all__ = ["PHASES", "LogSink", "Phase", "ProgressInfo", "phase", "quiet", "reporting", "stage"]

#: The phases a fit reports (``ProgressInfo.phase``), in the order they run.
PHASES = {
    "cross-validation": "folds of C='auto' / selectivity='auto' (and their group selections and bands of widths)",
    "iterations": "the MWU iterations (one phase per one-vs-rest problem; ``s`` is set)",
    "polish": "the exact polish: the combined Gram matrix and LIBSVM, one step per binary problem",
    "traces": "the two-stage fit's pass over every row for the kernels' traces, in rows",
    "nystroem": "the two-stage fit's Nystroem maps: one step per rank tried",
    "columns": "the two-stage fit's kernel columns on the landmarks, in rows",
    "newton": "the two-stage fit's Newton steps (their number is not known in advance)",
    "check-C": "the two-stage fit's final-size check of C='auto', one step per solve",
    "calibration": "probability=True's Platt folds",
}


#: While a phase waits on a call that reports nothing (LIBSVM, a factorisation), its sink hears from it every this
#: many seconds (:meth:`Phase.waiting`).
HEARTBEAT_SECONDS = 2.0


@dataclass
class ProgressInfo:
    """One progress event: ``done`` of ``total`` units of ``phase``, ``elapsed`` seconds after it began.

    ``total`` is None where the count is not known in advance (Newton steps).  ``description`` says
    what the phase does, for people; a phase waiting on a long call repeats its count (:meth:`Phase.waiting`).
    In the ``"iterations"`` phase ``iteration`` and ``n_iter``
    (the same as ``done`` and ``total``) count the current binary problem's iterations and ``s`` holds
    the solver's margins ``alpha' G_i alpha``; elsewhere ``s`` is None.
    """

    phase: str
    done: int
    total: int | None
    elapsed: float
    description: str = ""
    unit: str = ""
    s: np.ndarray | None = field(default=None, repr=False)

    @property
    def iteration(self) -> int:
        return self.done

    @property
    def n_iter(self) -> int | None:
        return self.total


class Phase:
    """A running phase: :meth:`advance` it as its units complete (from any thread)."""

    def __init__(self, sink: Callable | None, name: str, total, unit: str, description: str):
        self._sink, self.name, self.unit, self.description = sink, name, unit, description
        self.total = None if total is None else int(total)
        self.done = 0
        self._start = time.perf_counter()
        self._lock = threading.Lock()
        self._closed = False

    @property
    def silent(self) -> bool:
        return self._sink is None

    def _emit(self, s=None) -> bool:
        info = ProgressInfo(self.name, self.done, self.total, time.perf_counter() - self._start, self.description,
                            self.unit, s)  # fmt: skip
        return self._sink(info) is True

    def start(self) -> Phase:
        if self._sink is not None:
            with self._lock:
                self._emit()
        return self

    def advance(self, k: int = 1, *, s=None) -> bool:
        """``k`` more units done; True when the sink asked to stop (only the MWU iterations heed it)."""
        return self.update(None, k, s=s)

    def update(self, done: int | None, k: int = 0, *, s=None) -> bool:
        """Set the count to ``done`` (or add ``k``); True when the sink asked to stop."""
        if self._sink is None:
            return False
        with self._lock:
            new = int(done) if done is not None else self.done + int(k)
            if new == self.done and s is None:
                return False
            self.done = new
            return self._emit(s)

    @contextlib.contextmanager
    def waiting(self):
        """Around a long call that reports nothing (LIBSVM, a Newton step's factorisation): the sink sees the phase
        again, the same count with its elapsed time, every :data:`HEARTBEAT_SECONDS` until the call returns, so
        that a long wait is not taken for a hang."""
        if self._sink is None:
            yield self
            return
        stop = threading.Event()

        def beat():
            while not stop.wait(HEARTBEAT_SECONDS):
                with self._lock:
                    if self._closed:
                        return
                    self._emit()

        thread = threading.Thread(target=beat, name="mwumkl-progress-heartbeat", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join()

    def close(self) -> None:
        """End the phase.  When its count did not reach ``total`` (unknown, or a phase that ended early: the
        Nystroem rank stops doubling, a fit stops) the sink sees it end at the count reached."""
        if self._sink is None or self._closed:
            return
        with self._lock:
            self._closed = True
            if self.total != self.done:
                self.total = self.done
                self._emit()

    def __enter__(self) -> Phase:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is None:
            self.close()
        else:  # a failed phase is not shown complete
            self._closed = True

    def __reduce__(self):  # sent to a remote shard: it reports nothing there
        return (_silent, ())


def _silent() -> Phase:
    return Phase(None, "", None, "", "")


class _Reporter:
    def __init__(self, sink: Callable, stages: tuple = ()):
        self.sink, self.stages = sink, stages


_current: contextvars.ContextVar[_Reporter | None] = contextvars.ContextVar("mwumkl_progress", default=None)


def phase(name: str, total: int | None = None, *, unit: str = "", description: str = "", done: int = 0) -> Phase:
    """Open phase ``name`` of ``total`` units (None: unknown) in this thread's reporter; a silent phase without one.

    ``done``: units done already (a fit resumed from a checkpoint).  Use it as a context manager
    (closing it reports the end when ``total`` was unknown or not reached).
    """
    reporter = _current.get()
    if reporter is None:
        return _silent()
    text = ": ".join([*reporter.stages, description or name])
    step = Phase(reporter.sink, name, total, unit, text)
    step.done = int(done)
    return step.start()


@contextlib.contextmanager
def reporting(sink: Callable | None):
    """Report this thread's phases to ``sink(info)`` inside the block (None: keep what is there).

    An outer fit's reporter stays: a nested fit that calls this again reports into it.
    """
    if sink is None or _current.get() is not None:
        yield
        return
    token = _current.set(_Reporter(sink))
    try:
        yield
    finally:
        _current.reset(token)


@contextlib.contextmanager
def quiet():
    """No progress inside the block (a cross-validation fold's nested fit: the fold itself is the unit)."""
    token = _current.set(None)
    try:
        yield
    finally:
        _current.reset(token)


@contextlib.contextmanager
def stage(description: str):
    """Prefix the descriptions of the phases opened inside with ``description`` (``"weight stage: ..."``)."""
    reporter = _current.get()
    if reporter is None:
        yield
        return
    token = _current.set(_Reporter(reporter.sink, (*reporter.stages, description)))
    try:
        yield
    finally:
        _current.reset(token)


class LogSink:
    """``verbose``'s sink: each phase logged when it starts, at each further tenth or ``every`` seconds, and done."""

    def __init__(self, logger: logging.Logger, every: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self.logger, self.every, self.clock = logger, float(every), clock
        self._shown: dict = {}  # description -> (tenth, time) last logged

    def __call__(self, info: ProgressInfo) -> None:
        key = info.description or info.phase
        now = self.clock()
        total = info.total
        tenth = 10 * info.done // total if total else (1 if info.done else 0)
        last = self._shown.get(key)
        complete = total is not None and info.done >= total
        if last is not None and not complete and tenth == last[0] and now - last[1] < self.every:
            return
        if last is not None and complete and last[0] == "done":
            return
        self._shown[key] = ("done" if complete else tenth, now)
        count = f"{info.done}/{total}" if total is not None else f"{info.done}"
        rate = info.done / info.elapsed if info.elapsed > 0 else 0.0
        eta = ""
        if total and 0 < info.done < total and rate > 0:
            eta = f", about {(total - info.done) / rate:.0f} s left"
        self.logger.info("%s: %s %s (%.1f s%s)", key, count, info.unit, info.elapsed, eta)
