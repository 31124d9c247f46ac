"""Decision values on the GPU: :func:`weighted_kernel_sums`, the same arguments and numbers as the CPU's.

Part of :mod:`mwumkl_dist.data.cuda` (see its docstring for the numbers and the memory).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from mwumkl_dist.data.cuda.plans import _plan_host
from mwumkl_dist.data.cuda.runtime import DeviceMemoryError, _kernels, _size, check_device, device_memory
from mwumkl_dist.devices import cpu as _columns
from mwumkl_dist.kernels.specs import KernelPlan

__all__ = ["weighted_kernel_sums"]


def weighted_kernel_sums(X, n_features, support_vectors, sv_sq, coef, weights, plan, *,
                         max_block_bytes: int | None = None):  # fmt: skip
    """:func:`mwumkl_dist.devices.cpu.weighted_kernel_sums` on the GPU: the same arguments, the same numbers.

    The support vectors go to the GPU dense (``n_sv x n_features``), the rows
    in dense blocks sized to the free memory (at most ``max_block_bytes``).
    """
    k = _kernels()
    cuda = check_device()
    n = len(X.indptr) - 1
    d = int(n_features)
    plan = KernelPlan(*_columns.PlanArrays.of(plan), d)
    G = plan.n_groups
    weights = np.ascontiguousarray(np.atleast_2d(weights), dtype=np.float64)
    coef = np.ascontiguousarray(np.atleast_2d(coef), dtype=np.float64)
    n_out = weights.shape[0]
    out = np.zeros((n, n_out))
    n_sv = len(support_vectors.indptr) - 1
    if n == 0 or n_sv == 0:
        return out
    rows = sp.csr_matrix((X.data, X.indices, X.indptr), shape=(n, d))
    sv = sp.csr_matrix((support_vectors.data, support_vectors.indices, support_vectors.indptr), shape=(n_sv, d))
    sv = sv.toarray()
    host = _plan_host(plan)
    fixed = sv.nbytes + 8 * n_sv * G + coef.nbytes + weights.nbytes + sum(a.nbytes for a in host.values())
    per_row = 8 * (d + G + n_out)
    free, _ = device_memory()
    budget = min(0.5 * free - fixed, max_block_bytes if max_block_bytes is not None else 2**31)
    if budget < per_row:
        raise DeviceMemoryError(
            f"prediction needs about {_size(2 * (fixed + per_row))} of GPU memory (the support vectors "
            f"dense: {n_sv} x {d}) but the GPU has {_size(free)} free: predict on the CPU"
        )
    block = int(max(1, min(n, budget // per_row)))
    P = {key: cuda.to_device(a) for key, a in host.items()}
    d_sv = cuda.to_device(sv)
    d_sv_sq = cuda.to_device(np.ascontiguousarray(sv_sq, dtype=np.float64))
    d_coef = cuda.to_device(coef)
    d_w = cuda.to_device(weights)
    for a in range(0, n, block):
        b = min(n, a + block)
        chunk = rows[a:b]
        sqx = _columns.group_sqnorms(chunk.indptr, chunk.indices, chunk.data, plan.feat_ptr, plan.feat_groups, G)
        d_xt = cuda.to_device(np.ascontiguousarray(chunk.toarray().T))
        d_sqx = cuda.to_device(np.ascontiguousarray(sqx.T))
        d_out = cuda.device_array((b - a, n_out), np.float64)
        k.weighted_kernel_sums[k.launch((b - a) * n_out)](
            d_xt, d_sqx, d_sv, d_sv_sq, d_coef, d_w, P["kind"], P["pa"], P["pb"], P["grp"], P["square_of"],
            P["root"], P["depth"], P["gptr"], P["gfeat"], d_out,
        )  # fmt: skip
        out[a:b] = d_out.copy_to_host()
    return out
