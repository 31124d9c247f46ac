"""The bottom layer: the MWU rules and messages, exactly rounded sums, partitioning, the version.

Nothing here imports any other part of the package.
"""
