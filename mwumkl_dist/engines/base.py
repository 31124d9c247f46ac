"""The engine protocol: where a problem's shards live and how the superstep's messages move."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from mwumkl_dist.core.mwu_rules import Candidate, HostRules

__all__ = ["Engine"]


class Engine(Protocol):
    """What an engine (local, Dask) provides: it holds a problem's shards and only moves data.

    :func:`solve` uses the Find-alpha / superstep / final-model methods; the fit
    driver (:mod:`mwumkl_dist.solvers.driver`) also the traces, configuration, replay,
    counters and lifetime.  An engine is a context manager that closes itself.
    """

    n_kernels: int
    n_samples: int
    #: The binary problem's labels, +1 or -1 (``(n_samples,)``).
    y: np.ndarray

    def traces(self) -> np.ndarray:
        """``r_i = sum_j K_i(x_j, x_j)``, added up exactly over the shards (independent of the sharding)."""

    def configure(self, inv_trace: np.ndarray, ridge) -> None:
        """Set ``1 / r_i`` and the ridge (``1 / C``: a float, or one per point) and reset the shards' state."""

    def initial_candidates(self) -> tuple[Candidate, Candidate]:
        """With ``g = 0``: the first row of each class."""

    def kernel_block(self, pos: Candidate, neg: Candidate) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Raw ``K_i(p, p)``, ``K_i(q, q)``, ``K_i(p, q)`` of the two picked points."""

    def rules(self, s: np.ndarray, *, inv_trace, ridge, eps_p: float, rho: float, selectivity) -> HostRules:
        """The rules' ``m``-vectors from ``s`` on, where this engine keeps them (see :class:`HostRules`).

        On the host (:class:`HostRules`, with :meth:`kernel_block`), or on the GPU that holds ``V``
        (``mwumkl_dist.data.cuda.DeviceRules``: the same steps, ``coef`` stays there and
        :meth:`superstep` takes it as it is).
        """

    def superstep(self, pos: Candidate, neg: Candidate, coef) -> tuple[Candidate, Candidate]:
        """Add the picked columns to ``V``, score with ``g = V @ coef``, return the best row of each class.

        ``coef`` is what :meth:`rules`' ``step`` returned.
        """

    def class_sums(self, weights: np.ndarray) -> tuple[float, float]:
        """``(P, N)``: the sums of ``alpha_j h_j`` per class (see :func:`class_totals`)."""

    def row_margins(self, rows: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """``h_j = sum_i w_i V_i[j]`` of the increasing global ``rows``: exact sums rounded once (any sharding)."""

    def alpha_counts(self) -> np.ndarray:
        """The accumulated dual, in counts (+1/2 per pick), one per row."""

    def replay(self, picks) -> None:
        """Bring freshly configured shards to the state after ``picks`` (resume from a checkpoint)."""

    def stats(self) -> list[dict]:
        """Each shard's counters (e.g. a kernel store's column cache; ``{}`` when none)."""

    def close(self) -> None:
        """Release the shards (and a client the engine started)."""

    def __enter__(self) -> Engine: ...

    def __exit__(self, *exc) -> None: ...
