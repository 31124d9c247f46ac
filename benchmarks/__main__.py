"""``python -m benchmarks``: see :mod:`benchmarks.runner`."""

import sys

from .runner import main

if __name__ == "__main__":
    sys.exit(main())
