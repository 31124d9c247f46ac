"""The shard pool: shards built where their data is, their methods called on all or some, a lost one rebuilt.

A pool holds one shard per *slot*: a hashable value the client names a shard by (a row range, a
block of rows and kernels), given with a ``factory_for(slot)`` that returns a picklable zero-argument
callable building that shard (it knows its rows: a store path and a row range, or the rows
themselves).  The pool calls the factory where the shard lives: in this process
(:class:`LocalPool`) or on a Dask worker (:class:`mwumkl_dist.engines.dask_pool.DaskPool`, which
talks to its shards over the socket channel of :mod:`mwumkl_dist.engines.channel`).

Its clients are the MWU engine (:class:`mwumkl_dist.engines.mwu_engine.MWUEngine`: ``LocalEngine``
and ``DaskEngine``) and the two-stage fit's linear stage
(:func:`mwumkl_dist.solvers.two_stage.shards.linear_shards`).

A shard that can be lost (on Dask: its worker died or stopped answering) is rebuilt from its
factory and brought back to the client's state in two declared ways, then asked again:

* ``call(..., keep=True)``: the call sets state a rebuilt shard must have (the linear stage's
  loaded problem); the pool records it (replacing an earlier kept call of the same method) and a
  rebuilt shard gets the kept calls in order;
* ``restore(slot) -> [(method, args), ...]`` given at construction: calls the client derives from
  its own log (the MWU engine's configuration and pick replay), made after the kept ones.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any, Protocol

__all__ = ["ShardPool", "LocalPool", "call_args", "invoke", "close_shard"]


class ShardPool(Protocol):
    """What a shard pool provides (:class:`LocalPool`, :class:`~mwumkl_dist.engines.dask_pool.DaskPool`).

    Built as ``Pool(slots, factory_for, *, restore=None, ...)`` (see the module).  A pool is a
    context manager that closes itself.
    """

    #: One per shard, in shard order: what ``args_for`` and a ``shared`` key function receive.
    slots: list
    #: Whether a shard can be lost and rebuilt (then ``keep`` and ``restore`` matter).
    rebuilds: bool
    #: Whether calls reach the shards over a connection (a Dask pool's sockets): arguments and answers
    #: are then serialized, so a client sends compact messages on its hot path (see :mod:`.messages`).
    remote: bool

    def call(
        self,
        method,
        args_for=None,
        *,
        shared=False,
        shards: Sequence[int] | None = None,
        keep=False,
        superstep=False,
        progress=None,
    ) -> list:
        """``method(*args_for(slot))`` on every shard (or on the shards at the indices ``shards``), in that order.

        ``method``: a shard method's name or a picklable ``fn(shard, *args)``.  ``args_for``:
        None (no arguments), or ``slot -> tuple``.  ``shared``: False (each shard its own
        arguments), True (``args_for`` is called once; every shard gets those arguments, sent
        once encoded), or ``key(slot)``: shards with equal keys get equal arguments (``args_for``
        is called once per key).  ``keep``: a rebuilt shard is given this call again (see the
        module).  ``superstep``: a short call the iteration repeats, so a shard that takes far
        longer than usual on it is hung (the Dask pool reports it, and rebuilds it after the
        estimator's ``superstep_timeout``; a busy remote shard sends heartbeats, so only a silent
        one counts).  ``progress(rows)``: told the rows the remote shards' calls have done so far
        (their heartbeats' counts; a local shard advances its own progress phase instead).  Shards
        work in parallel where they live apart; a lost shard is rebuilt and asked again.
        """

    def close(self) -> None:
        """Release the shards (each shard's ``close()``, where it has one) and what the pool started."""

    def __enter__(self) -> ShardPool: ...

    def __exit__(self, *exc) -> None: ...


def call_args(slots: Sequence, targets: Sequence[int], args_for, shared) -> list[tuple[Hashable, tuple]]:
    """Per target shard, ``(group, args)``: ``args_for(slot)`` computed once per group (see :meth:`ShardPool.call`).

    Targets of one group get the very same ``args`` object (a pool that sends messages encodes
    it once per group).
    """
    if args_for is None:
        return [(None, ())] * len(targets)
    if shared is True:
        args = tuple(args_for(slots[targets[0]])) if len(targets) else ()
        return [(None, args)] * len(targets)
    out, done = [], {}
    for i in targets:
        group = shared(slots[i]) if callable(shared) else i
        if group not in done:
            done[group] = tuple(args_for(slots[i]))
        out.append((group, done[group]))
    return out


def invoke(shard, method, args: tuple):
    """``shard.method(*args)``, or ``method(shard, *args)`` for a function; no private (``_``) methods."""
    if callable(method):
        return method(shard, *args)
    if not isinstance(method, str) or method.startswith("_"):
        raise AttributeError(f"{type(shard).__name__} has no shard method {method!r}")
    return getattr(shard, method)(*args)


def close_shard(shard) -> None:
    """The shard's ``close()``, where it has one (e.g. the linear stage's spilled features)."""
    close = getattr(shard, "close", None)
    if close is not None:
        close()


class LocalPool:
    """Shards in this process, built at once; implements :class:`ShardPool` (nothing is ever lost here)."""

    rebuilds = False
    remote = False

    def __init__(self, slots, factory_for: Callable[[Hashable], Callable[[], Any]], *, restore=None):
        self.slots = list(slots)
        self.shards = [factory_for(slot)() for slot in self.slots]

    def call(self, method, args_for=None, *, shared=False, shards: Sequence[int] | None = None, **_nothing_to_lose):
        """See :meth:`ShardPool.call`; ``keep``, ``superstep`` and ``progress`` mean nothing here (no shard is
        lost, each local shard advances its own progress)."""
        targets = range(len(self.shards)) if shards is None else shards
        args = call_args(self.slots, targets, args_for, shared)
        return [invoke(self.shards[i], method, a) for i, (_, a) in zip(targets, args)]

    def close(self) -> None:
        for shard in self.shards:
            close_shard(shard)
        self.shards = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
