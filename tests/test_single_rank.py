"""One rank (COMM_SELF): self-sends are local copies; kernels, helpers, stats and inbox views."""

import json

import numpy as np
import pytest

import rafi
from conftest import SIMULATOR
from rafi import device
from traffic import check_exactly_once, hop_dtype, make_items, run_routes


@rafi.func
def bump(x):
    return x * 2 + 1


@rafi.kernel
def seed(i, outbox, base):
    slot = device.push(outbox, 0)
    if slot >= 0:
        outbox.items[slot].id = base + i
        outbox.items[slot].value = bump(i)


Item = np.dtype([("id", "i8"), ("value", "f8")])


def test_self_sends_with_kernel_and_helper(backend):
    from mpi4py import MPI

    n = 8 if SIMULATOR else 1000
    with rafi.Forwarder(MPI.COMM_SELF, Item, n, backend=backend) as fwd:
        assert (fwd.rank, fwd.size, fwd.backend, fwd.transport, fwd.capacity) == (0, 1, backend, "host", n)
        fwd.launch(seed, n, fwd.outbox, 100)
        result = fwd.forward()
        assert result == rafi.ForwardResult(n, n, 0, 0)
        inbox = rafi.asnumpy(fwd.inbox)
        assert len(fwd.inbox) == n
        order = np.argsort(inbox["id"])
        np.testing.assert_array_equal(inbox["id"][order], 100 + np.arange(n))
        np.testing.assert_array_equal(inbox["value"][order], 2 * np.arange(n) + 1)
        assert fwd.forward() == rafi.ForwardResult(0, 0, 0, 1)
        assert len(fwd.inbox) == 0
        stats = fwd.stats
        assert len(stats) == 2 and stats[0].sent[0] == n and stats[0].bytes_received[0] == n * 16
        assert "round" in stats.summary() and str(n) in stats.summary()
        json.dumps(stats.as_dict())


def test_multi_hop_on_one_rank(backend):
    from mpi4py import MPI

    dtype = hop_dtype(16)
    paths = [[[0, 0, 0]] * (3 if SIMULATOR else 50)]
    with rafi.Forwarder(MPI.COMM_SELF, dtype, 64, backend=backend) as fwd:
        arrived, results = run_routes(fwd, make_items(dtype, 0, paths[0]))
    assert len(results) == 4
    check_exactly_once(MPI.COMM_SELF, dtype, paths, arrived)


def test_send_device_arrays(backend):
    if backend != "cuda":
        pytest.skip("device arrays need the cuda backend")
    from mpi4py import MPI
    from numba import cuda

    items = np.arange(5, dtype=np.int32)
    with rafi.Forwarder(MPI.COMM_SELF, np.int32, 8, backend=backend) as fwd:
        fwd.send(cuda.to_device(items), cuda.to_device(np.zeros(5, np.int32)))
        fwd.forward()
        np.testing.assert_array_equal(np.sort(rafi.asnumpy(fwd.inbox)), items)


def test_send_overflow_is_reported(backend):
    from mpi4py import MPI

    with rafi.Forwarder(MPI.COMM_SELF, np.int32, 4, backend=backend) as fwd:
        fwd.send(np.arange(3, dtype=np.int32), 0)
        fwd.send(np.arange(3, dtype=np.int32), 0)
        with pytest.raises(rafi.OutboxOverflow) as info:
            fwd.forward()
        assert (info.value.refused, info.value.needed) == (2, 6)
        assert fwd.forward().received == 4


def test_helper_runs_as_python():
    assert bump(3) == 7


def test_asnumpy_copies():
    a = np.arange(3)
    b = rafi.asnumpy(a)
    b[0] = 9
    assert a[0] == 0


def test_host_buffers_start_zeroed(backend):
    """Pinned buffers reuse freed pages: rafi's plans and counters must not start as garbage."""
    from mpi4py import MPI

    from rafi._backends import make_backend

    b = make_backend(backend, MPI.COMM_SELF)
    for _ in range(5):
        dirty = b.host_buffer(1 << 16, np.int64)
        dirty[:] = -1
        del dirty
        assert not b.host_buffer(1 << 16, np.int64).any()


@rafi.kernel
def double(i, values):
    values[i] = values[i] * 2


def test_to_backend_gives_kernels_a_writable_array(backend):
    from mpi4py import MPI

    with rafi.Forwarder(MPI.COMM_SELF, np.int32, 4, backend=backend) as fwd:
        values = fwd.to_backend(np.arange(6, dtype=np.int64))
        fwd.launch(double, 6, values)
        np.testing.assert_array_equal(rafi.asnumpy(values), 2 * np.arange(6))


@rafi.kernel
def contribute_all(i, red, index, value):
    device.contribute(red, index[i], value[i])


@pytest.mark.parametrize("op", ["sum", "max"])
def test_reducer_on_one_rank(backend, op):
    """One rank owns every entry: a flush combines its partial straight into ``local``."""
    from mpi4py import MPI

    n, k = 11, (16 if SIMULATOR else 500)
    rng = np.random.default_rng(3)
    index, value = rng.integers(0, n, k), rng.integers(-9, 9, k).astype(np.float64)
    ufunc = {"sum": np.add, "max": np.maximum}[op]
    expected = np.full(n, 0.0 if op == "sum" else np.finfo(np.float64).min)  # max: the lowest float
    with (
        rafi.Reducer(MPI.COMM_SELF, n, np.float64, op, backend=backend) as red,
        rafi.Forwarder(MPI.COMM_SELF, np.int32, 4, backend=backend) as fwd,
    ):
        assert red.transport == "host" and "one rank" in red.transport_reason
        for _ in range(2):  # the second flush starts from a reset partial
            fwd.launch(contribute_all, k, red, fwd.to_backend(index), fwd.to_backend(value))
            red.flush()
            ufunc.at(expected, index, value)
        np.testing.assert_array_equal(red.local, expected)
        np.testing.assert_array_equal(red.gather(), expected)
