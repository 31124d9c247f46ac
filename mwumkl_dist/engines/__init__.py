"""Engines: where the shards live and how the small per-superstep messages move."""

from mwumkl_dist.engines.local import LocalEngine

__all__ = ["LocalEngine"]
