"""Under numba-cuda's CUDA simulator, rafi makes the shared-array allocation atomic
(rafi/_simulator.py). A slow allocation forces the race on every launch."""

import time
import warnings

import numpy as np
import pytest

import rafi
from conftest import SIMULATOR

pytestmark = [
    pytest.mark.cuda_path,
    pytest.mark.skipif(not SIMULATOR, reason="concerns the CUDA simulator (NUMBA_ENABLE_CUDASIM=1)"),
]


@pytest.fixture
def slow_shared_allocation(monkeypatch):
    """Sleep inside the simulator's creation of a shared array (reached only on that path),
    so every thread of a block checks before any stores: the race, on every launch."""
    from numba.cuda.simulator import kernelapi

    from rafi._targets import enable_cuda

    enable_cuda()

    class SlowNumpy:
        def __getattr__(self, name):
            return getattr(np, name)

        def empty(self, *args, **kwargs):
            time.sleep(0.02)
            return np.empty(*args, **kwargs)

    monkeypatch.setattr(kernelapi, "np", SlowNumpy())
    return kernelapi.FakeCUDAShared


def scan(values):
    from numba import cuda

    from rafi.kernels import cuda_scan

    out = cuda.device_array(len(values) + 1, np.int64)
    scratch = cuda.device_array(2 * cuda_scan.TILE + 1, np.int64)
    cuda_scan.exclusive_scan(cuda.to_device(values), len(values), out, scratch)
    return out.copy_to_host()


def test_scan_is_right_with_a_slow_shared_allocation(slow_shared_allocation):
    values = np.random.default_rng(5).integers(0, 100, 40).astype(np.int64)
    np.testing.assert_array_equal(scan(values), np.concatenate([[0], np.cumsum(values)]))


def test_the_slow_allocation_breaks_the_simulators_own(slow_shared_allocation, monkeypatch):
    """Without rafi's fix the same test fails: the threads of a block scan different arrays."""
    monkeypatch.setattr(slow_shared_allocation, "array", slow_shared_allocation.array.unlocked)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # sums of uninitialised memory overflow
        got = scan(np.ones(40, np.int64))
    assert not np.array_equal(got, np.arange(41))


def test_a_round_is_exactly_once_with_a_slow_shared_allocation(slow_shared_allocation):
    from mpi4py import MPI

    items = np.arange(30, dtype=np.int64)
    with rafi.Forwarder(MPI.COMM_SELF, np.int64, 64, backend="cuda") as fwd:
        fwd.send(items, 0)
        result = fwd.forward()
        assert (result.received, result.alive, result.deferred) == (30, 30, 0)
        np.testing.assert_array_equal(np.sort(rafi.asnumpy(fwd.inbox)), items)
