"""mwumkl_dist: scalable multiple kernel learning (MWUMKL, Moeller et al., AISTATS 2014)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("mwumkl_dist")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.1.0"

from .auto import FewIterationsWarning
from .estimator import MWUMKLClassifier
from .kernels import (
    Gaussian,
    KernelSet,
    KernelSpec,
    Linear,
    Polynomial,
    RandomGaussianBank,
    paper_family,
    paper_per_feature_family,
    parse_kernels,
)
from .mwu import ConvergenceWarning, ProgressInfo
from .stores import DataStore, KernelStore, StoreError, open_store, write_data_store, write_kernel_store

__all__ = [
    "MWUMKLClassifier",
    "KernelSpec",
    "Linear",
    "Polynomial",
    "Gaussian",
    "RandomGaussianBank",
    "KernelSet",
    "paper_family",
    "paper_per_feature_family",
    "parse_kernels",
    "ProgressInfo",
    "ConvergenceWarning",
    "FewIterationsWarning",
    "DataStore",
    "KernelStore",
    "StoreError",
    "open_store",
    "write_data_store",
    "write_kernel_store",
    "__version__",
]
