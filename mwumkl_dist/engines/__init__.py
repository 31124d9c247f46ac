"""Engines: shard pools (where the shards live, how their calls move) and the MWU engine on them."""

from mwumkl_dist.engines.local import LocalEngine
from mwumkl_dist.engines.pool import LocalPool, ShardPool

__all__ = ["LocalEngine", "LocalPool", "ShardPool"]
