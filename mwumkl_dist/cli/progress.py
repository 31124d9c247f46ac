"""Progress display of the command line (tqdm) and the note that numba is compiling.

On a terminal :func:`progress_bar` is a plain ``tqdm`` bar.  On a file or a
pipe (CI logs, ``2> log``) carriage-return redraws would pile up on one line,
so :class:`LineProgress` writes a whole line at the start, at every further
tenth of the work and at least every few seconds instead.  :class:`PhaseBars`
shows a fit's phases (:mod:`mwumkl_dist.core.progress`), one bar each.
"""

from __future__ import annotations

import os
import sys
import time

from tqdm import tqdm

from mwumkl_dist.devices import cpu as _columns

__all__ = ["LineProgress", "PhaseBars", "progress_bar", "format_rate", "numba_cache_is_cold", "COMPILING_NOTE"]

#: Printed on stderr before work that compiles the numba kernels (a fresh install: 20-30 s).
COMPILING_NOTE = "compiling numba kernels (first run only; later runs load them from the cache)..."


#: :class:`LineProgress` writes a line at least this often (seconds) while its phase reports.
LINE_SECONDS = 5.0


class LineProgress(tqdm):
    """A ``tqdm`` for logs and pipes: a line at each further tenth of the work, or after ``every`` seconds.

    Never a carriage return.  Without a total (Newton steps) each unit is a tenth.  ``every`` keeps a
    long phase from looking silent in a log (the time since the last line, on tqdm's clock).
    """

    def __init__(self, *args, every: float | None = None, **kwargs):
        self._shown_tenth = None  # tqdm's __init__ displays already
        self._every = LINE_SECONDS if every is None else float(every)
        self._shown_at = None
        super().__init__(*args, **kwargs)

    def display(self, msg=None, pos=None):
        if msg == "":  # tqdm clearing a bar it does not keep: a log has nothing to clear
            return False
        tenth = int(10 * self.n / self.total) if self.total else self.n
        now = self._time() if hasattr(self, "_time") else time.time()
        if tenth == self._shown_tenth and (self._shown_at is not None and now - self._shown_at < self._every):
            return True
        self._shown_tenth, self._shown_at = tenth, now
        self.fp.write((self.__str__() if msg is None else msg) + "\n")
        self.fp.flush()
        return True

    def close(self):
        if not self.disable:
            self.display()  # the last tenth, unless it was shown
            self.leave = False  # the base class then writes no newline of its own
        super().close()


def progress_bar(
    total: int | None, *, file=None, unit: str = "it", desc: str | None = None, disable: bool = False
) -> tqdm:
    """A progress bar over ``total`` units on ``file`` (default stderr): tqdm on a terminal, else lines."""
    file = sys.stderr if file is None else file
    isatty = getattr(file, "isatty", None)
    tty = bool(isatty and isatty())
    kind = tqdm if tty else LineProgress
    # miniters=1: every update may redraw (at most every mininterval): tqdm's adaptive miniters would skip the
    # updates of a phase whose first units were fast and whose later ones are slow, leaving it silent.
    return kind(total=total, file=file, unit=unit, desc=desc, disable=disable, dynamic_ncols=tty, leave=True,
                miniters=1)  # fmt: skip


class PhaseBars:
    """The command line's view of a fit's progress: one bar (or line series) per phase, on stderr.

    Called with every :class:`~mwumkl_dist.core.progress.ProgressInfo` of the fit (it is the
    estimator's ``callback``): a new phase (another description) closes the last bar and opens its own,
    with its count, unit and an ETA where the total is known.  Returns None: it never stops the fit.
    """

    def __init__(self, *, file=None, quiet: bool = False):
        self.file, self.quiet = file, quiet
        self.bar = None
        self._key = None

    def __call__(self, info) -> None:
        if self.quiet:
            return None
        key = (info.phase, info.description)
        if self.bar is None or key != self._key or info.done < self.bar.n:
            self.close()
            self.bar = progress_bar(info.total, file=self.file, unit=f" {info.unit}" if info.unit else "it",
                                    desc=info.description or info.phase)  # fmt: skip
            self._key = key
        if info.total != self.bar.total:  # a phase whose count became known as it ended
            self.bar.total = info.total
        if info.done == self.bar.n:  # a phase waiting on a long call: its elapsed time (a log line every so often)
            self.bar.refresh()
        self.bar.update(info.done - self.bar.n)
        if info.total is not None and info.done >= info.total:
            self.close()
        return None

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def format_rate(per_second: float) -> str:
    """``"873"``, ``"12.4k"`` or ``"1.20M"`` (iterations per second)."""
    return tqdm.format_sizeof(per_second)


def numba_cache_is_cold() -> bool:
    """Whether this run will compile most of the numba column kernels.

    numba caches each compiled kernel of :mod:`mwumkl_dist.devices.cpu` as files
    named after its module file, the function and its line, next to the sources (or in numba's
    user-wide cache where those are read-only).  True when fewer than a third of
    the package's kernels have such a file: the first run after an install (none),
    or a fit after a run that only predicted (which compiles about a quarter of
    them; the fit then compiles for 20-40 s).  A run that compiles only a few
    kernels (a variant not used before, say sparse input after dense) gets no
    note: a few seconds.
    """
    kernels = [k for module in _columns.KERNEL_MODULES for k in vars(module).values()
               if hasattr(k, "py_func") and getattr(k, "stats", None)]  # fmt: skip
    cache_paths = {k.stats.cache_path for k in kernels} - {None}
    if not cache_paths:
        return False  # caching is off: numba compiles on every run, so there is no "first run" to announce
    # A cache file is named after the module file that defines the kernel (a module imports its neighbours').
    prefixes = {
        f"{k.py_func.__module__.rsplit('.', 1)[-1]}.{k.py_func.__qualname__}-{k.py_func.__code__.co_firstlineno}."
        for k in kernels
    }
    cached = set()
    for path in cache_paths:
        try:
            names = os.listdir(path)
        except OSError:
            continue
        cached.update(p for name in names if name.endswith(".nbi") for p in prefixes if name.startswith(p))
    return 3 * len(cached) < len(prefixes)
