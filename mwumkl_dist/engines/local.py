"""The local engine: the MWU engine on shards in this process (one by default; several to test sharding)."""

from __future__ import annotations

from mwumkl_dist.data.backends import CPU, CPUBackend
from mwumkl_dist.engines.mwu_engine import MWUEngine
from mwumkl_dist.engines.pool import LocalPool

__all__ = ["LocalEngine"]


class LocalEngine(MWUEngine):
    """Runs a problem's row shards in a :class:`~mwumkl_dist.engines.pool.LocalPool`.

    Implements :class:`mwumkl_dist.engines.base.Engine`.  ``backend``: the back-end of the device the problem's
    shards run on (:meth:`mwumkl_dist.data.backends.CPUBackend.mwu_problem`), which gives the rules.
    """

    def __init__(self, problem, n_shards: int = 1, backend: CPUBackend = CPU):
        super().__init__(problem, LocalPool, n_shards)
        self.backend = backend

    def rules(self, s, **settings):
        """The back-end's, where the shards' ``V`` is (in this process: a GPU's rules beside it), else the host's."""
        rules = self.backend.mwu_rules(self.problem, s, **settings)
        return super().rules(s, **settings) if rules is None else rules

    @property
    def shards(self) -> list:
        """The shards themselves (empty once closed)."""
        return self.pool.shards
