"""The fit's memory budget (``memory_limit``): parsing sizes, the automatic default, the cgroup's and Dask's limits.

One number bounds the large arrays a fit makes (the two-stage fit's kernel columns, Nystroem maps, Hessian
and the final check of ``C``): :func:`resolve_memory_limit` turns the estimator's ``memory_limit`` into bytes
at the start of the fit.  ``"auto"`` is a constant, :data:`AUTO_MEMORY`, capped by what the process is allowed
(its cgroup's memory limit, a Dask worker's ``memory_limit``), never by what happens to be free at the start:
two fits started together must not both size themselves from the same free memory, and the model must not
depend on the load of the machine it was fitted on.
"""

from __future__ import annotations

import numbers
import os
import re

from mwumkl_dist.devices import threads

__all__ = ["AUTO_MEMORY", "MIN_MEMORY", "WORKER_SHARE", "cgroup_memory_limit", "format_bytes", "parse_memory_limit",
           "resolve_memory_limit"]  # fmt: skip

#: ``memory_limit="auto"``: the fit's large arrays within 1 GiB (a quarter of a 4 GiB laptop's, a twentieth of
#: the 24 GiB development box's memory, so several fits side by side stay within the machine) ...
AUTO_MEMORY = 2**30
#: ... or within this share of the process's cgroup memory limit, or of a Dask worker's limit, where smaller
#: (the interpreter, the data and the libraries take the rest; Dask pauses a worker at 80 % of its limit).
LIMIT_SHARE = 0.25
#: ``memory_limit="auto"`` for a linear-stage shard on a Dask worker: this share of the worker's Dask
#: ``memory_limit``, less the memory the worker already holds (Dask spills its own data at 70 % of the limit and
#: pauses the worker at 80 %; the interpreter, the libraries and arrays the plan does not count take the rest).
WORKER_SHARE = 0.6
#: The smallest ``memory_limit`` accepted at all (a number below it is almost surely a unit slip: 512 bytes).
MIN_MEMORY = 2**20

_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}  # fmt: skip
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_memory_limit(value) -> int | None:
    """``memory_limit`` as the estimator takes it: None for ``"auto"``, else bytes (an int >= :data:`MIN_MEMORY`).

    An int is bytes; a string is a number with an optional unit, decimal (``"500MB"``, ``"2GB"``, ``"1.5G"``)
    or binary (``"512MiB"``, ``"1GiB"``), case-insensitive.  Raises ``ValueError`` naming ``memory_limit``.
    """
    if isinstance(value, str):
        if value.strip().lower() == "auto":
            return None
        match = _SIZE.match(value)
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _UNITS:
            raise ValueError(f'memory_limit must be "auto", a number of bytes or a size such as "1GB" or "512MiB", '
                             f"got {value!r}")  # fmt: skip
        size = float(match.group(1)) * _UNITS[unit]
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
        size = float(value)
    else:
        raise ValueError(f'memory_limit must be "auto", a number of bytes or a size such as "1GB", got {value!r}')
    if not size >= MIN_MEMORY or size != size or size == float("inf"):
        raise ValueError(f"memory_limit must be at least {format_bytes(MIN_MEMORY)}, got {value!r}")
    return int(size)


def format_bytes(n: float) -> str:
    """``n`` bytes as a short binary size (``"1.5 GiB"``, ``"300 MiB"``)."""
    n = float(n)
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} B"


def cgroup_memory_limit() -> int | None:
    """The memory limit of this process's cgroup (v2 ``memory.max``, v1 ``memory.limit_in_bytes``, the smallest of
    its own and its parents'), None where there is none or it cannot be read."""
    root, own, limits = threads._CGROUP_ROOT, threads._own_cgroups(), []
    for d in threads._ancestors(root, own.get("", "/")):
        limits.append(threads._read(os.path.join(d, "memory.max")))
    base = os.path.join(root, "memory")
    if os.path.isdir(base):
        for d in threads._ancestors(base, own.get("memory", "/")):
            limits.append(threads._read(os.path.join(d, "memory.limit_in_bytes")))
    values = [int(text) for text in limits if text and text.isdigit()]
    values = [v for v in values if 0 < v < 2**60]  # v1 writes "no limit" as a huge number
    return min(values) if values else None


def resolve_memory_limit(value) -> tuple[int, str]:
    """``(bytes, where from)`` of ``memory_limit`` (as :func:`parse_memory_limit` takes it) in this process.

    A given size is used as it is.  ``"auto"``: :data:`AUTO_MEMORY`, or :data:`LIMIT_SHARE` of the cgroup's
    memory limit or of the Dask worker's ``memory_limit`` (when running in one) where that is smaller.
    """
    given = parse_memory_limit(value)
    if given is not None:
        return given, f"memory_limit={value!r}"
    candidates = [(AUTO_MEMORY, f'memory_limit="auto" ({format_bytes(AUTO_MEMORY)})')]
    cgroup = cgroup_memory_limit()
    if cgroup:
        candidates.append((int(LIMIT_SHARE * cgroup), f"a quarter of the cgroup's memory limit {format_bytes(cgroup)}"))
    worker = getattr(getattr(threads.dask_worker(), "memory_manager", None), "memory_limit", None)
    if worker:
        candidates.append((int(LIMIT_SHARE * worker), f"a quarter of the Dask worker's limit {format_bytes(worker)}"))
    return min(candidates, key=lambda c: c[0])
