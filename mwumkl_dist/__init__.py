"""mwumkl_dist: scalable multiple kernel learning (MWUMKL, Moeller et al., AISTATS 2014).

The public names are loaded on first use (PEP 562): ``import mwumkl_dist`` alone, and the command
line's ``--version`` and ``--help``, do not pay for scikit-learn, numba and the compiled kernels.
"""

from __future__ import annotations

import importlib

from mwumkl_dist.core.version import __version__

#: Each public name -> the module that defines it.
_PUBLIC = {
    "MWUMKLClassifier": "mwumkl_dist.estimator",
    "KernelSpec": "mwumkl_dist.kernels.specs",
    "Linear": "mwumkl_dist.kernels.specs",
    "Polynomial": "mwumkl_dist.kernels.specs",
    "Gaussian": "mwumkl_dist.kernels.specs",
    "RandomGaussianBank": "mwumkl_dist.kernels.specs",
    "KernelSet": "mwumkl_dist.kernels.specs",
    "paper_family": "mwumkl_dist.kernels.specs",
    "paper_per_feature_family": "mwumkl_dist.kernels.specs",
    "parse_kernels": "mwumkl_dist.kernels.specs",
    "ProgressInfo": "mwumkl_dist.core.mwu_rules",
    "ConvergenceWarning": "mwumkl_dist.core.mwu_rules",
    "FewIterationsWarning": "mwumkl_dist.core.mwu_rules",
    "MajorityClassWarning": "mwumkl_dist.core.mwu_rules",
    "DataStore": "mwumkl_dist.stores",
    "KernelStore": "mwumkl_dist.stores",
    "StoreError": "mwumkl_dist.stores",
    "open_store": "mwumkl_dist.stores",
    "write_data_store": "mwumkl_dist.stores",
    "write_kernel_store": "mwumkl_dist.stores",
}

__all__ = [*_PUBLIC, "__version__"]


def __getattr__(name: str):
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'mwumkl_dist' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # loaded once
    return value


def __dir__():
    return sorted({*globals(), *_PUBLIC})
