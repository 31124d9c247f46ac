"""Kernels: specifications, families and banks, their compiled plans, and their evaluation on data.

The public names are those of :mod:`mwumkl_dist.kernels.specs`; evaluation is
:mod:`mwumkl_dist.kernels.evaluation`.
"""

from mwumkl_dist.kernels.specs import *  # noqa: F403
from mwumkl_dist.kernels.specs import __all__  # noqa: F401
