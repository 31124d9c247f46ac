"""GPU shards: the superstep on an NVIDIA GPU with ``numba.cuda`` (``device="cuda"``).

A GPU shard is a :class:`~mwumkl_dist.data.shards.ShardBase` whose ``V`` block,
data and kernel plan live in GPU memory; every engine runs it unchanged (the
local engine in this process, the Dask engine on GPU workers: one worker per
GPU, as dask-cuda starts them, each seeing its GPU as device 0).  Per
superstep a shard gets the two picked points (their non-zeros) and ``coef``,
and sends back one message: the best row of each class.

* :class:`CudaFeatureShard`: feature rows (dense, or CSR when sparse), any
  kernel plan (linear / polynomial / Gaussian kernels on feature groups,
  Gaussian squaring chains, random banks);
* :class:`CudaPrecomputedShard`: rows of precomputed kernels;
* :func:`on_device`: a problem whose shards are GPU shards (the hook for
  ``device="cuda"``);
* :class:`DeviceRules`: the MWU rules on ``m``-vectors on the GPU, beside
  ``V`` (the local engine's; :class:`DeviceCoef` is the ``coef`` they hand
  the shards);
* :func:`weighted_kernel_sums`: decision values on the GPU (same signature
  as :func:`mwumkl_dist.devices.cpu.weighted_kernel_sums`).

Numbers: the kernels (:mod:`mwumkl_dist.data.cuda.kernels`) repeat the CPU
engine's floating-point operations in the same order (no FMA contraction, the
CPU's ``exp``), so supersteps, kernel weights and decision values equal the
CPU engine's bit for bit on the same problem; the picks then agree too, ties
included (equal scores go to the lowest row on both).  Only a difference in
a GPU's double arithmetic from IEEE 754 (none is known on NVIDIA GPUs), or
the rules' ``sinh`` and ``exp`` on the GPU (below), could make a pick differ,
and only between rows whose scores agree to the last bits.

Traces (``diagonal``) use the CPU code on a host copy of the rows.  The final
margins (``support_margins``: ``h_j = sum_i mu_i V_ji`` of the support rows)
are summed exactly on the GPU (:mod:`mwumkl_dist.core.exact`'s limbs, the
same integers as the CPU's): the weights go out once, and back come about
550 bytes per support row, whatever the kernel count.

The MWU rules where ``V`` lives: with the local engine (the shards in this
process) the rules' ``m``-vectors stay on the GPU too (:class:`DeviceRules`,
the functions of :mod:`mwumkl_dist.core.mwu_rules` compiled for it): the
picked points' kernel block (:class:`DevicePlan`), ``s``, ``coef`` and the
candidates' ``V`` rows never leave it.  An iteration sends the two picked
points' non-zeros (to the kernel block and to each shard) and brings back one
message per shard, its two candidates and whether ``coef`` was finite (40
bytes): nothing of size ``m``.  ``s`` comes to the host for a callback and at
the end, where the kernel weights are computed (numpy's sum).  The Dask
engine keeps the rules on the driver (its shards send their ``V`` rows
there).  The rules' ``sinh`` and ``exp`` are CUDA's on a GPU (within an ulp
or two of numpy's), so ``coef`` and the scores may differ from the CPU's in
the last bits and a pick may differ where two rows' scores agree to that
precision; ``s`` and the kernel weights follow from the picks alone.  Under
the simulator they are numpy's, and every number equals the CPU's.

GPU memory: :func:`feature_shard_bytes` /
:func:`precomputed_shard_bytes` (a shard's ``stats()["device_bytes"]``); a
shard that does not fit raises :class:`DeviceMemoryError` before allocating.

Without a GPU (or without numba's CUDA support) building a GPU shard raises
a :class:`RuntimeError` that says what is missing.  The tests run the same
kernels under numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``).
"""

from __future__ import annotations

from mwumkl_dist.data.cuda.columns import DeviceColumns
from mwumkl_dist.data.cuda.mwu import DevicePlan, DeviceProblem, DeviceRules, on_device, to_device_shard
from mwumkl_dist.data.cuda.plans import feature_shard_bytes, inline_groups, precomputed_shard_bytes
from mwumkl_dist.data.cuda.prediction import weighted_kernel_sums
from mwumkl_dist.data.cuda.runtime import DeviceMemoryError, check_device, device_memory, gpu_available, numpy_compat
from mwumkl_dist.data.cuda.shards import CudaFeatureShard, CudaPrecomputedShard, DeviceCoef

__all__ = [
    "DeviceMemoryError",
    "check_device",
    "device_memory",
    "gpu_available",
    "numpy_compat",
    "feature_shard_bytes",
    "inline_groups",
    "precomputed_shard_bytes",
    "CudaFeatureShard",
    "CudaPrecomputedShard",
    "DeviceCoef",
    "DevicePlan",
    "DeviceProblem",
    "DeviceRules",
    "on_device",
    "to_device_shard",
    "DeviceColumns",
    "weighted_kernel_sums",
]
