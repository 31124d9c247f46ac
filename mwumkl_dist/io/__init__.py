"""Files: labelled data files, the Zarr store format, model files and checkpoints.

The public names are those of :mod:`mwumkl_dist.io.files` (reading data files).
"""

from mwumkl_dist.io.files import *  # noqa: F403
from mwumkl_dist.io.files import __all__  # noqa: F401
