"""``python -m mwumkl_dist``: the ``mwumkl-dist`` command-line tool."""

import sys

from mwumkl_dist.cli import main

if __name__ == "__main__":
    sys.exit(main())
