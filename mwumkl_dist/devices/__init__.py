"""Devices: thread policy, the CPU (numba) and CUDA compute kernels. They compute on arrays only."""
