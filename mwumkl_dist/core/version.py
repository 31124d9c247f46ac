"""The package version, read once from the installed metadata."""

from importlib.metadata import PackageNotFoundError, version

__all__ = ["__version__"]

try:
    __version__ = version("mwumkl_dist")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.1.0"
