"""The Dask engine: the MWU engine on shards that live on Dask workers across supersteps (BSP).

The shards are in a :class:`~mwumkl_dist.engines.dask_pool.DaskPool` (placement, the socket
channel, recovery of lost shards); the engine's layouts and the rebuild of a lost block from the
pick log are the MWU engine's (:mod:`mwumkl_dist.engines.mwu_engine`).
"""

from __future__ import annotations

import functools

from mwumkl_dist.engines.dask_pool import DaskPool, SchedulerLostError, ShardLostError, connect_client
from mwumkl_dist.engines.mwu_engine import MWUEngine

__all__ = ["DaskEngine", "connect_client", "ShardLostError", "SchedulerLostError"]


class DaskEngine(MWUEngine):
    """Runs a problem's shards on Dask workers; implements :class:`mwumkl_dist.engines.base.Engine`.

    Parameters
    ----------
    problem : mwumkl_dist.data.problems.Problem
    client : distributed.Client, scheduler address, or None (local threaded cluster)
    n_shards : int
        Row shards.
    n_kernel_shards : int
        Kernel shards (blocks of kernels over the rows of each row shard).
    timeout : float
        Seconds to wait for Dask workers and for a shard's answer (see
        :class:`~mwumkl_dist.engines.dask_pool.DaskPool`); the estimator's ``worker_timeout``.
    call_timeout : float or None
        Seconds a shard may take on one superstep before its worker is taken for hung and its
        shards rebuilt elsewhere; None: ``timeout``.  The estimator's ``superstep_timeout``.
    """

    def __init__(
        self,
        problem,
        client=None,
        n_shards: int = 2,
        n_kernel_shards: int = 1,
        timeout: float = 600.0,
        call_timeout: float | None = None,
    ):
        make_pool = functools.partial(DaskPool, client=client, timeout=timeout, call_timeout=call_timeout)
        super().__init__(problem, make_pool, n_shards, n_kernel_shards)

    @property
    def blocks(self) -> list:
        """The pool's handles of the remote blocks (worker, channel), in slot order."""
        return self.pool.blocks

    @property
    def recoveries(self) -> int:
        """How many lost blocks were rebuilt."""
        return self.pool.recoveries

    @property
    def client(self):
        """The pool's Dask client (None once an owned client is closed)."""
        return self.pool.client
