"""Engines: where the shards live and how the small per-superstep messages move."""

from .local import LocalEngine

__all__ = ["LocalEngine"]
