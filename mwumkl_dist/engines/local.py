"""The local engine: the MWU engine on shards in this process (one by default; several to test sharding)."""

from __future__ import annotations

from mwumkl_dist.engines.mwu_engine import MWUEngine
from mwumkl_dist.engines.pool import LocalPool

__all__ = ["LocalEngine"]


class LocalEngine(MWUEngine):
    """Runs a problem's row shards in a :class:`~mwumkl_dist.engines.pool.LocalPool`.

    Implements :class:`mwumkl_dist.engines.base.Engine`.
    """

    def __init__(self, problem, n_shards: int = 1):
        super().__init__(problem, LocalPool, n_shards)

    def rules(self, s, **settings):
        """On the GPU where the problem's shards are GPU shards (in this process: ``V`` is there), else the host's.

        A problem offers its device rules with ``device_rules`` (:class:`mwumkl_dist.data.cuda_shards.DeviceProblem`).
        """
        device_rules = getattr(self.problem, "device_rules", None)
        if device_rules is None:
            return super().rules(s, **settings)
        return device_rules(s, **settings)

    @property
    def shards(self) -> list:
        """The shards themselves (empty once closed)."""
        return self.pool.shards
