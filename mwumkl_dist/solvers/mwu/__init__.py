"""The MWU solver: the rules (:mod:`mwumkl_dist.core.mwu_rules`), the iteration and the exact polish."""

from mwumkl_dist.core.mwu_rules import *  # noqa: F403
from mwumkl_dist.core.mwu_rules import __all__ as _rules
from mwumkl_dist.solvers.mwu.iterate import Iterations, solve

__all__ = [*_rules, "Iterations", "solve"]
