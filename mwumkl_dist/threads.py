"""How many threads a fit or a prediction may use (public name; see :mod:`mwumkl_dist.devices.threads`)."""

from mwumkl_dist.devices.threads import *  # noqa: F403
from mwumkl_dist.devices.threads import __all__  # noqa: F401
