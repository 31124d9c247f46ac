"""The grammar of a kernel spec string, as the users read it: one text for the library's errors and the command
line's ``--help`` (this module imports nothing, so that ``--help`` loads no numpy or numba).

The parser is :func:`mwumkl_dist.kernels.specs.parse_kernels`.
"""

__all__ = ["KERNEL_SPEC_HELP"]

#: What a ``kernels`` string may be.
KERNEL_SPEC_HELP = (
    "comma-separated kernels: 'auto' (the default: the 'scaled' family, and kernels on feature subsets where "
    "cross-validation finds that a few features carry the signal), 'scaled' (polynomials of degree 1-3 and up "
    "to 11 Gaussians on all features, widths set from the data's scale), 'scaled-per-feature' (the same per "
    "feature), 'paper' (the paper's 12, widths 1 to 16), "
    "'paper-per-feature' (12 per feature), 'linear', 'poly:DEGREE[:coef0=C]', "
    "'gaussian:SIGMA' (SIGMA may be written 2^0.5), 'random:COUNT[:size=K][:seed=S][:widths=scaled|paper]' "
    "(Gaussians on random feature subsets, widths from the data's scale or the paper's); "
    "any closed-form kernel may take '@FEATURES' (e.g. 'gaussian:2@0-4+7'), and 'scaled@FEATURES', "
    "'paper@FEATURES' restrict the family"
)
