"""A dependency-free progress display for the command-line tool.

On a terminal it redraws one line (``\\r``) at most ten times a second; when
the stream is a file or a pipe (CI logs) it prints a plain line at the first
update and at every further 10 % instead, so logs stay readable.
"""

from __future__ import annotations

import sys
import time

__all__ = ["ProgressBar", "format_duration", "format_rate"]


def format_duration(seconds: float) -> str:
    """``"0:07"``, ``"12:03"`` or ``"1:02:03"``."""
    seconds = max(0, int(round(seconds)))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def format_rate(per_second: float) -> str:
    """``"873"``, ``"12.4k"`` or ``"1.2M"`` (for iterations per second)."""
    if per_second >= 1e6:
        return f"{per_second / 1e6:.1f}M"
    if per_second >= 1e4:
        return f"{per_second / 1e3:.1f}k"
    if per_second >= 100:
        return f"{per_second:.0f}"
    return f"{per_second:.3g}"


class ProgressBar:
    """Progress of ``total`` units of work on ``stream``.

    Parameters
    ----------
    total : int
        Units of work (iterations) in all.
    stream : file-like, default=sys.stderr
    width : int, default=28
        Characters of the bar on a terminal.
    unit : str, default="it"
    """

    def __init__(self, total: int, stream=None, width: int = 28, unit: str = "it"):
        if total < 1:
            raise ValueError(f"total must be positive, got {total!r}")
        self.total = int(total)
        self.stream = sys.stderr if stream is None else stream
        self.width = width
        self.unit = unit
        isatty = getattr(self.stream, "isatty", None)
        self.tty = bool(isatty and isatty())
        self._last_draw = -1.0
        self._last_decile = -1
        self._drawn = False

    def update(self, done: int, rate: float | None = None, prefix: str = "") -> None:
        """Show ``done`` of ``total`` units; ``rate`` in units/s (for the ETA); ``prefix`` e.g. a class."""
        done = min(max(int(done), 0), self.total)
        frac = done / self.total
        now = time.monotonic()
        if self.tty:
            if done < self.total and now - self._last_draw < 0.1:
                return
            filled = int(round(frac * self.width))
            bar = "#" * filled + "-" * (self.width - filled)
            line = f"\r{prefix}{frac:4.0%} |{bar}| {done}/{self.total} {self.unit}{self._tail(done, rate)}"
            self.stream.write(line + "\x1b[K")  # erase what a longer previous line left
        else:
            decile = int(frac * 10)
            if self._drawn and decile == self._last_decile:
                return
            self._last_decile = decile
            self.stream.write(f"{prefix}{frac:4.0%} {done}/{self.total} {self.unit}{self._tail(done, rate)}\n")
        self.stream.flush()
        self._last_draw = now
        self._drawn = True

    def _tail(self, done: int, rate: float | None) -> str:
        if not rate or rate <= 0:
            return ""
        eta = (self.total - done) / rate
        return f", {format_rate(rate)} {self.unit}/s, ETA {format_duration(eta)}"

    def close(self) -> None:
        """End the display (a newline after a terminal bar)."""
        if self.tty and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
        self._drawn = False
