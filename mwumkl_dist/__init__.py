"""mwumkl_dist: scalable multiple kernel learning (MWUMKL, Moeller et al., AISTATS 2014)."""

from mwumkl_dist.core.mwu_rules import ConvergenceWarning, FewIterationsWarning, MajorityClassWarning, ProgressInfo
from mwumkl_dist.core.version import __version__
from mwumkl_dist.estimator import MWUMKLClassifier
from mwumkl_dist.kernels.specs import (
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
from mwumkl_dist.stores import DataStore, KernelStore, StoreError, open_store, write_data_store, write_kernel_store

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
    "MajorityClassWarning",
    "DataStore",
    "KernelStore",
    "StoreError",
    "open_store",
    "write_data_store",
    "write_kernel_store",
    "__version__",
]
