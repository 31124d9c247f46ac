"""Work arrays reused by the linear stage's passes (:mod:`mwumkl_dist.devices.scratch`)."""

import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from mwumkl_dist.devices.scratch import ALIGN, ScratchBuffers


def test_take_lends_aligned_arrays_of_the_asked_shapes_and_reuses_them():
    pool = ScratchBuffers()
    with pool.take(((3, 5), np.float64), ((7,), np.float32), ((2, 2), np.int64)) as (a, b, c):
        assert (a.shape, a.dtype, b.shape, b.dtype, c.shape, c.dtype) == (
            (3, 5), np.float64, (7,), np.float32, (2, 2), np.int64)  # fmt: skip
        assert all(x.ctypes.data % ALIGN == 0 for x in (a, b, c))
        a[:], b[:], c[:] = 1.0, 2.0, 3  # the three do not overlap
        assert a.sum() == 15 and b.sum() == 14 and c.sum() == 12
        first = a.ctypes.data
    with pool.take(((3, 5), np.float64)) as again:
        assert again.ctypes.data == first  # the same memory, no new allocation
    assert pool.nbytes > 0
    pool.clear()
    assert pool.nbytes == 0


def test_takers_in_flight_get_buffers_of_their_own_and_the_pool_stays_small():
    pool = ScratchBuffers()
    with pool.take(((100,), np.float64)) as a, pool.take(((100,), np.float64)) as b:
        assert a.ctypes.data != b.ctypes.data
    assert len(pool._free) == 2
    with pool.take(((10_000,), np.float64)):  # larger than both: a new one, the largest too small dropped
        pass
    assert len(pool._free) == 2 and max(buf.nbytes for buf in pool._free) >= 80_000
    with pool.take(((50,), np.float64)) as small:  # the smallest that fits
        assert small.base.nbytes < 80_000

    seen, errors = set(), []

    def worker():
        try:
            for _ in range(200):
                with pool.take(((64,), np.float64)) as x:
                    x[:] = threading.get_ident()
                    assert np.all(x == threading.get_ident())  # nobody else wrote into it meanwhile
                    seen.add(x.ctypes.data)
        except AssertionError as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(pool._free) <= 4 + 2


_PASSES = r"""
import json, resource, sys
import numpy as np
from mwumkl_dist.solvers import two_stage
rows, width, block = 8 * 2048, 256, 2048
rng = np.random.default_rng(0)
X = rng.random((rows, width))
shard = two_stage.LinearShard(X, 0, rows, row_block=block, storage=sys.argv[1])
y, cw = np.where(rng.random(rows) < 0.5, 1.0, -1.0), np.ones(rows)
shard.load_problem(two_stage.GivenFeatures(width), y, cw)
beta = rng.standard_normal(width + 1)
half = np.packbits(rng.random(rows) < 0.5)
none = np.packbits(np.zeros(rows, dtype=bool))

def passes():
    shard.direction(beta)
    shard.gram_parts(0, half, none)
    shard.active_sums(0, half, beta[:width], 0.5, True)

passes()  # the first takes the pool's buffers
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
    passes()
print(json.dumps({"faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}))
"""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("storage", ["memory", "spill"])
def test_a_pass_faults_in_no_new_pages_per_chunk_under_dasks_malloc_settings(storage):
    """Dask's nanny starts workers with ``MALLOC_TRIM_THRESHOLD_=65536``: every freed block over 128 KiB goes back to
    the system, so a temporary per chunk is pages faulted in afresh per chunk (a Dask fit of 10^6 rows spent a third
    of its time there).  Three rounds of the passes (directions, Gram sums, gradient sums) over 16 chunks of 1024
    double-precision rows x 257 (2 MiB, 513 pages each): the old passes faulted in 85,000 pages (590 per chunk and
    pass), these about 6,000 (a block's Gram sums are a fresh 0.5 MiB array, returned to the caller)."""
    env = dict(os.environ, MALLOC_TRIM_THRESHOLD_="65536", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", _PASSES, storage], capture_output=True, text=True, env=env,
                          timeout=240)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    faults = json.loads(done.stdout.strip().splitlines()[-1])["faults"]
    chunks = 3 * 3 * 16  # rounds x passes x chunks
    assert faults < 100 * chunks, faults  # a fresh double chunk each: 513 pages per chunk and pass


def test_combined_kernel_into_given_arrays_has_the_same_bits():
    """The shard computes its columns into reused arrays (``out``, ``work``): the same bits as a fresh result."""
    from mwumkl_dist.kernels.evaluation import combined_kernel
    from mwumkl_dist.kernels.specs import Gaussian, Polynomial

    rng = np.random.default_rng(0)
    X, Z = rng.random((3000, 7)), rng.random((200, 7))
    kernels = [Gaussian(0.5), Gaussian(1.0), Polynomial(2), Gaussian(1.0, features=(0, 1, 2))]
    w = np.array([0.2, 0.3, 0.1, 0.4])
    out, work = np.full((3000, 200), 7.0), np.empty(3000 * 200 + 5)
    got = combined_kernel(kernels, X, Z, w, out=out, work=work)
    assert got is out
    np.testing.assert_array_equal(got, combined_kernel(kernels, X, Z, w))
