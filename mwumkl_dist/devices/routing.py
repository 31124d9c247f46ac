"""Where an MWU fit runs when ``device="cuda"``: on the GPU where that pays, on CPU threads where it does not.

A GPU superstep costs a fixed time whatever its size (about ten kernel launches, the picked points sent, one
40-byte message back and the host waiting for it) plus very little per (row, kernel) entry; a CPU superstep
costs a little more per entry, shared by its threads, and nothing fixed.  A two-stage fit's weight stage is
many small MWU fits (its cross-validation folds, a few thousand rows and tens of kernels each): launch-bound
on a GPU ("Grid size 1 will likely result in GPU under-utilization"), each one thread's work on a CPU; a
10^6-kernel bank's superstep is 10^8 entries, where the GPU's throughput wins by far.  :func:`mwu_device`
weighs the two with the constants below; the fit then runs where it is cheaper, with the same numbers either
way (the GPU engine's supersteps equal the CPU's bit for bit).

The rest of a ``device="cuda"`` fit is not routed here: the two-stage fit's linear stage keeps its kernel
columns on the GPU (``LinearShard(device="cuda")``, computed there, resident for every Newton pass), and
:func:`mwumkl_dist.solvers.two_stage.newton.linear_method` weighs explicit Hessians against conjugate
gradients with the GPU's pass cost.

``MWUMKL_DEVICE_ROUTING=device`` turns routing off: every MWU fit of a ``device="cuda"`` estimator runs on
the GPU (the simulator tests use it, so that their tiny problems exercise the GPU engine).

The constants are estimates, not measurements of this code on hardware (no GPU was available when they
were set); ``benchmarks/device_check.py`` measures the fits they route, and they belong here, in one place,
to be corrected from its figures.
"""

from __future__ import annotations

import os

__all__ = ["GPU_STEP_SECONDS", "GPU_ENTRY_SECONDS", "CPU_ENTRY_SECONDS", "GPU_SCORE_SECONDS", "GPU_PASS_SECONDS",
           "COPY_SECONDS", "mwu_device", "scoring_device", "routing_enabled"]  # fmt: skip

#: Fixed cost of one GPU superstep, seconds: about 10 launches at 5-10 us, the points' copy in and the
#: message's copy back (each a synchronisation), and the Python around them.
GPU_STEP_SECONDS = 2e-4
#: Cost per (row, kernel) entry of a GPU superstep, seconds (kernel value, ``V`` update, tile partial; a
#: memory-bound pass over ``V`` at a fraction of an H100/H200's bandwidth).
GPU_ENTRY_SECONDS = 2e-11
#: Cost per entry of a CPU superstep on one thread, seconds (a Gaussian kernel's ``exp`` and the update):
#: measured 8-9 ns of CPU time per entry on one thread (a 166-row, 20,000-kernel bank and 3,000 rows x 40
#: Gaussians, 60 iterations; a shared AMD EPYC at load average 12 on 2 cores).
CPU_ENTRY_SECONDS = 8e-9
#: Fixed cost of scoring rows on the GPU, seconds: the support vectors, plan and rows sent (dense), a launch,
#: the values copied back.  Per (row, support vector, kernel) entry the costs are the supersteps' above.
GPU_SCORE_SECONDS = 2e-3
#: The two-stage fit's linear stage on a GPU shard: its passes over the kernel columns run on the device, at
#: ``GPU_PASS_SECONDS`` per entry (the simple kernels of :mod:`mwumkl_dist.data.cuda.kernels`, an estimate: a tenth
#: of an H100's bandwidth), and the explicit Hessian first copies the active rows' columns to the host at
#: ``COPY_SECONDS`` per entry (single precision over PCIe, about 20 GB/s).  The CPU's pass costs, and how
#: :func:`mwumkl_dist.solvers.two_stage.newton.linear_method` weighs them, are there.
GPU_PASS_SECONDS = 5e-11
COPY_SECONDS = 2e-10

ROUTING_ENV = "MWUMKL_DEVICE_ROUTING"


def routing_enabled() -> bool:
    """False where ``MWUMKL_DEVICE_ROUTING=device`` asks every MWU fit of a GPU estimator onto the GPU."""
    return os.environ.get(ROUTING_ENV, "cost").strip().lower() != "device"


def mwu_device(device: str, n_rows: int, n_kernels: int, threads: int) -> str:
    """The device an MWU fit of ``n_rows`` x ``n_kernels`` runs on, asked for ``device``, with ``threads`` CPU
    threads available to it: ``"cuda"`` where a GPU superstep is estimated cheaper than a CPU one, else
    ``"cpu"`` (``device="cpu"`` stays ``"cpu"``).

    ``gpu = GPU_STEP_SECONDS + n m GPU_ENTRY_SECONDS`` against ``cpu = n m CPU_ENTRY_SECONDS / threads``:
    with 16 threads the GPU takes fits from about 4 * 10^5 entries (e.g. 166 rows x 2,500 kernels, 3,000 rows
    x 140 kernels), with 1 thread from about 2.5 * 10^4.
    """
    if device != "cuda" or not routing_enabled():
        return device
    entries = float(n_rows) * float(n_kernels)
    cpu = entries * CPU_ENTRY_SECONDS / max(int(threads), 1)
    gpu = GPU_STEP_SECONDS + entries * GPU_ENTRY_SECONDS
    return "cuda" if gpu < cpu else "cpu"


def scoring_device(device: str, n_rows: int, n_support: int, n_kernels: int, threads: int) -> str:
    """Where ``n_rows`` rows are scored with a model of ``n_support`` support vectors and ``n_kernels`` kernels,
    asked for ``device`` (a fold's or a bias check's decision values): the GPU where
    ``GPU_SCORE_SECONDS + e GPU_ENTRY_SECONDS < e CPU_ENTRY_SECONDS / threads`` for ``e`` the kernel values,
    else the CPU (the same numbers either way)."""
    if device != "cuda" or not routing_enabled():
        return device
    entries = float(n_rows) * float(n_support) * float(n_kernels)
    cpu = entries * CPU_ENTRY_SECONDS / max(int(threads), 1)
    gpu = GPU_SCORE_SECONDS + entries * GPU_ENTRY_SECONDS
    return "cuda" if gpu < cpu else "cpu"
