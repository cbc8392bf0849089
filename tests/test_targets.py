"""A device-API call compiles for the target of the kernel that makes it (rafi/_targets.py).

numba inlines the cpu overloads of the device API into their callers; its pass that does
so takes any template with inlining data for the call's types, whatever its target. A
CUDA kernel compiled after a cpu kernel in the same process (a GPU test run, a program
using both backends) then got the cpu body, with no atomics, or did not compile."""

import types

import numba
import numpy as np
import pytest

import rafi
from conftest import SIMULATOR
from rafi import _kernel, device


def _ptx_compiler(monkeypatch):
    """numba-cuda's PTX compiler without a GPU (sm_90), or a skip where NVVM is missing."""
    if SIMULATOR:
        pytest.skip("the simulator compiles no CUDA code")
    cuda = pytest.importorskip("numba.cuda")
    from numba.cuda import dispatcher

    sm90 = types.SimpleNamespace(compute_capability=(9, 0))
    monkeypatch.setattr(dispatcher, "get_current_device", lambda: sm90)
    try:
        cuda.compile_ptx(lambda a: None, "void(int64[:])", cc=(9, 0))
    except Exception as exc:  # no libnvvm in this environment
        pytest.skip(f"numba-cuda cannot compile here: {type(exc).__name__}")
    return cuda


def test_a_cuda_kernel_compiled_after_a_cpu_kernel_gets_the_cuda_device_api(monkeypatch):
    cuda = _ptx_compiler(monkeypatch)
    monkeypatch.setenv("RAFI_CACHE", "0")  # compiled here, not loaded: the cpu compile types the calls
    from mpi4py import MPI

    @rafi.kernel
    def seed(i, outbox, hits):
        slot = device.push(outbox, 0)
        if slot >= 0:
            outbox.items[slot].id = i
            device.atomic_add(hits, 0, 1)

    item = np.dtype([("id", "i8"), ("value", "f8")])
    with rafi.Forwarder(MPI.COMM_SELF, item, 8, backend="cpu") as fwd:
        hits = np.zeros(1, np.int64)
        fwd.launch(seed, 5, fwd.outbox, hits)
        assert hits[0] == 5 and fwd.forward().received == 5
        outbox = numba.typeof(fwd._kernel_outbox)
    rafi._targets.enable_cuda()
    namespace = {"body": cuda.jit(device=True)(seed.py_func), "cuda": cuda}
    exec(compile(_kernel._source(_kernel._CUDA_GRID, 2), "<launcher>", "exec"), namespace)
    ptx, _ = cuda.compile_ptx(namespace["launcher"], (numba.int64, outbox, numba.int64[:]), cc=(9, 0))
    assert ptx.count("atom.") >= 2, "the CUDA kernel got the cpu body of device.push or device.atomic_add"
