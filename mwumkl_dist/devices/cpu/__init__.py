"""Numba kernels: kernel columns on the fly, fused with the shard's V/g update.

Everything here works row by row, so a row's numbers do not depend on which
shard (or thread, or block of rows) holds it: the sharding invariance of the
engines rests on that.  Data is CSR (``indptr``, ``indices``, ``data``); the
kernel plan comes from :class:`mwumkl_dist.kernels.KernelPlan`.  The MWU rules
themselves (which columns, what weights) live in :mod:`mwumkl_dist.solvers.mwu`; this
module only evaluates kernels and applies ``V += (col_P + col_N) / 2``,
``g = V @ coef``.

How it is fast (a9a, 32561 x 123 sparse, 3 kernels: about 0.6 ms per
superstep on one core, against 3.2 ms for the first, row-at-a-time version;
``benchmarks/bench_a9a.py`` measures it):

* the dot products with the two picked points come from a pass over the
  columns where a point is non-zero (a CSC copy of the shard's rows) when
  that touches fewer entries than a pass over the rows; both passes add a
  row's terms in increasing feature order, so they give identical numbers;
* on dense data (one feature group) a transposed dense copy of the rows
  (:func:`dense_copy`) gives the same dot products in straight loops over
  rows: on cod-rna (8 features, 12 kernels) a 10^4-point fit went from 0.60 s
  to 0.47 s;
* the kernels are cut into tiles of about 64 (:func:`mwumkl_dist.core.partition.kernel_tiles`,
  a function of the plan only).  A row's score ``g_j`` is the sum, in tile
  order, of its tile partials, each a sequential sum over the tile's kernels
  from 0; kernel shards return their tiles' partials and the Dask driver adds
  them in the same order (:func:`mwumkl_dist.data.shards.sum_tile_partials`),
  so every layout gives the same bits, ties included;
* each distinct kernel value (kind, feature group, parameters) is computed
  once per row (:func:`value_plan`): in its tile when only that tile needs
  it, else in a pre-pass per block of rows (a random bank repeats its
  (subset, width) pairs, and its squaring chains join kernels that lie
  anywhere: such a chain once forced one tile of 19280 of 20000 kernels);
  a kernel adds its value's increment ``sp K(., p) + sq K(., q)`` to its
  ``V`` column;
* the work is (row block x tile) tasks, each with tile-local feature groups
  (a plan with 10^5 groups costs per task only its tile's groups and their
  features), rows processed in blocks of ``B`` rows, kernel by kernel inside
  a block, so every inner loop is a straight, vectorisable loop over rows;
  a thread's tasks of one row block run block of rows by block of rows (its
  pre-pass once per block); dense dots add up to four features per pass;
* the blocks' scratch (:func:`superstep_workspace`) is kept by the shard:
  allocated per superstep, megabytes of it with many kernels went back to the
  system and were faulted in again every iteration;
* ``exp`` is :func:`_exp_into`, a branch-free fdlibm-style ``exp`` (error
  below 1 ulp) that the compiler vectorises; the scalar libm call it replaces
  took half of the time; a Gaussian squaring chain still costs one ``exp``;
* ``V`` is best Fortran-ordered (the shards store it so): a block of column
  ``V[:, i]`` is then contiguous (any layout gives the same numbers);
* the rows' squared norms per feature group are computed once per shard
  (``row_sq``) instead of every superstep;
* the two picked points come as their non-zero entries and everything a
  superstep does with them (dense buffers filled and cleared entry by entry,
  their group norms, the choice of pass) costs ``O(non-zeros)``, never
  ``O(n_features)``: 3000 a9a rows plus one row ``+1 1000000:1`` took 28.5 ms
  per iteration (dense points, set up per call), now 0.47 ms, as without that row;
* threads by work (rows x kernels, at least :data:`PARALLEL_MIN_WORK` per
  thread; :func:`get_num_threads`, :func:`thread_limit`): the tasks run in
  contiguous runs per thread (``prange``), then a pass over row chunks adds the
  tile partials; per-chunk maxima are reduced in row order, ties to the lowest
  index, so the result is the same for every thread count.

Floating point: no ``fastmath`` and no FMA contraction, so vectorised and
scalar code paths give bit-identical values for a row.

The modules, bottom to top (each imports only those before it): :mod:`.options` (the compile options),
:mod:`.pool` (threads), :mod:`.exp`, :mod:`.groups` (feature groups), :mod:`.blocks` (the superstep's building
blocks and value plan), :mod:`.superstep`, :mod:`.columns` (columns, diagonal, the points' kernel block) and
:mod:`.predict` (the decision function).  numba caches each module's kernels next to it (``cache=True``).
"""

from __future__ import annotations

from mwumkl_dist.devices.cpu import blocks, columns, exp, groups, predict, superstep
from mwumkl_dist.devices.cpu import pool as pool  # the threads (tests set its PARALLEL_MIN_WORK)
from mwumkl_dist.devices.cpu.blocks import PlanArrays, SuperstepWorkspace, superstep_workspace, value_plan
from mwumkl_dist.devices.cpu.columns import kernel_columns, kernel_diagonal, point_kernels
from mwumkl_dist.devices.cpu.exp import EXP_CONSTANTS, exp_block
from mwumkl_dist.devices.cpu.groups import group_features, group_sqnorms, group_sqnorms_t
from mwumkl_dist.devices.cpu.pool import PARALLEL_MIN_WORK, parallel, threads_for
from mwumkl_dist.devices.cpu.predict import weighted_kernel_sums
from mwumkl_dist.devices.cpu.superstep import (
    Pick,
    RowBlock,
    RowViews,
    dense_copy,
    point_entries,
    superstep_columns,
    superstep_features,
)
from mwumkl_dist.devices.threads import current_threads as get_num_threads
from mwumkl_dist.devices.threads import limit_threads as thread_limit
from mwumkl_dist.devices.threads import set_num_threads

__all__ = [
    "PlanArrays",
    "Pick",
    "RowBlock",
    "RowViews",
    "kernel_columns",
    "kernel_diagonal",
    "superstep_features",
    "superstep_columns",
    "dense_copy",
    "superstep_workspace",
    "SuperstepWorkspace",
    "value_plan",
    "group_sqnorms",
    "group_sqnorms_t",
    "group_features",
    "weighted_kernel_sums",
    "point_kernels",
    "point_entries",
    "exp_block",
    "EXP_CONSTANTS",
    "thread_limit",
    "set_num_threads",
    "get_num_threads",
    "threads_for",
    "parallel",
    "PARALLEL_MIN_WORK",
    "KERNEL_MODULES",
]

#: The modules holding numba kernels (cached next to each of them).
KERNEL_MODULES = (exp, groups, blocks, superstep, columns, predict)
