"""CUDA launches that skip numba-cuda's argument work for objects it has seen (rafi/_launch_cache.py)."""

import collections

import numpy as np
import pytest

import rafi
from conftest import SIMULATOR

Pair = collections.namedtuple("Pair", ["a", "b"])


@rafi.kernel
def combine(i, out, pair, scale, offset):
    out[i] = pair.a[i] * scale + pair.b[i] + offset


def _gpu():
    if SIMULATOR:
        pytest.skip("the simulator has no launches to cache")
    from numba import cuda

    if not cuda.is_available():
        pytest.skip("no GPU here")
    return cuda


def test_launches_see_new_numbers_new_arrays_and_views():
    """Every launch computes with its own arguments, whichever of them were seen before."""
    cuda = _gpu()
    from mpi4py import MPI

    from rafi._backends._cuda import CudaBackend

    backend = CudaBackend(MPI.COMM_SELF)
    n = 1000
    a, b = np.arange(n, dtype=np.float64), np.full(n, 0.5)
    pair = Pair(cuda.to_device(a), cuda.to_device(b))
    out = cuda.to_device(np.zeros(n))
    for step in range(5):  # the same arrays, other numbers: launched past numba-cuda from the second on
        backend.launch(combine, n, out, pair, 2.0 + step, step)
        np.testing.assert_array_equal(out.copy_to_host(), a * (2.0 + step) + b + step)
    assert any(cache._kernels for cache in combine._fast.values()), "no launch went past numba-cuda"
    for step in range(3):  # new arrays every time
        fresh, other = cuda.to_device(np.zeros(n)), Pair(cuda.to_device(a + step), pair.b)
        backend.launch(combine, n, fresh, other, 1.0, 0)
        np.testing.assert_array_equal(fresh.copy_to_host(), a + step + b)
    for k in (10, 500, 999):  # views of different lengths
        view = out[:k]
        backend.launch(combine, k, view, pair, 3.0, 1)
        np.testing.assert_array_equal(out.copy_to_host()[:k], a[:k] * 3 + b[:k] + 1)
    host = np.zeros(n)  # a host array: numba-cuda copies it in and back, so no cached words
    with pytest.warns(Warning, match="Host array"):  # numba-cuda's own warning about the copies
        backend.launch(combine, n, host, pair, 1.0, 0)
    np.testing.assert_array_equal(host, a + b)
    f32 = cuda.to_device(np.zeros(n, np.float32))  # other argument types: another kernel
    backend.launch(combine, n, f32, pair, np.float32(2), np.int32(1))
    np.testing.assert_allclose(f32.copy_to_host(), a * 2 + b + 1)
