"""Guarantee 3: bad input is a clear rafi error raised on every rank together, never a hang."""

import numpy as np
import pytest

import rafi
from traffic import push_to, to_backend

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]


def test_invalid_destination_from_a_kernel(comm, backend):
    rank, size = comm.Get_rank(), comm.Get_size()
    dests = np.array([0, size - 1, size + 3 if rank == 1 else 0, 1], np.int32)
    with rafi.Forwarder(comm, np.int32, 8, backend=backend) as fwd:
        fwd.launch(push_to, len(dests), fwd.outbox, to_backend(backend, dests))
        with pytest.raises(rafi.InvalidDestination) as info:
            fwd.forward()
        err = info.value
        assert (err.count, err.example, err.ranks) == (1, size + 3, [1])
        assert f"[0, {size})" in str(err) and str(size + 3) in str(err)
        assert isinstance(err, ValueError)
        result = fwd.forward()  # the valid items were kept and go now
        assert result.alive == 3 * size + (size - 1)
        assert fwd.forward().alive == 0


def test_negative_destination_from_send(comm, backend):
    rank = comm.Get_rank()
    with rafi.Forwarder(comm, np.int32, 8, backend=backend) as fwd:
        fwd.send(np.arange(3, dtype=np.int32), np.array([0, -1 if rank == 0 else 0, 0], np.int32))
        with pytest.raises(rafi.InvalidDestination) as info:
            fwd.forward()
        assert info.value.example == -1 and info.value.ranks == [0]


@pytest.mark.parametrize(
    "bad",
    [
        lambda: (np.arange(3, dtype=np.int64), 0),  # wrong dtype
        lambda: (np.zeros((2, 2), np.int32), 0),  # not 1-d
        lambda: (np.arange(3, dtype=np.int32), np.array([0, 1], np.int32)),  # dest too short
        lambda: (np.arange(3, dtype=np.int32), 0.5),  # dest not an integer
        lambda: ([1, 2, 3], 0),  # not an array at all
    ],
    ids=["dtype", "shape", "dest-length", "dest-float", "list"],
)
def test_bad_send_raises_config_error_everywhere(comm, backend, bad):
    rank = comm.Get_rank()
    with rafi.Forwarder(comm, np.int32, 8, backend=backend) as fwd:
        fwd.send(np.arange(2, dtype=np.int32), 0)
        if rank == comm.Get_size() - 1:
            fwd.send(*bad())
        with pytest.raises(rafi.ConfigError) as info:
            fwd.forward()
        assert f"rank(s) [{comm.Get_size() - 1}]" in str(info.value)
        result = fwd.forward()  # nothing of the bad call was queued; the good items go
        assert result.alive == 2 * comm.Get_size()


def test_dtype_mismatch_at_construction(comm, backend):
    dtype = np.float32 if comm.Get_rank() == 0 else np.float64
    with pytest.raises(rafi.ConfigError, match="same item_dtype"):
        rafi.Forwarder(comm, dtype, 4, backend=backend)


def test_capacity_mismatch_at_construction(comm, backend):
    with pytest.raises(rafi.ConfigError, match="same capacity"):
        rafi.Forwarder(comm, np.int32, 4 + comm.Get_rank(), backend=backend)


@pytest.mark.parametrize("capacity", [0, -3, 2.5, True])
def test_bad_capacity(comm, backend, capacity):
    with pytest.raises(rafi.ConfigError, match="capacity"):
        rafi.Forwarder(comm, np.int32, capacity, backend=backend)


def test_unknown_dtype_on_one_rank(comm):
    spec = "not-a-dtype" if comm.Get_rank() == 1 else np.int32
    with pytest.raises(rafi.ConfigError):
        rafi.Forwarder(comm, spec, 4, backend="cpu")


def test_bad_backend_and_transport_names(comm):
    with pytest.raises(rafi.ConfigError, match="backend"):
        rafi.Forwarder(comm, np.int32, 4, backend="tpu")
    with pytest.raises(rafi.ConfigError, match="transport"):
        rafi.Forwarder(comm, np.int32, 4, backend="cpu", transport="carrier-pigeon")


def test_cuda_aware_refused_where_unsafe(comm, backend):
    with pytest.raises(rafi.ConfigError, match="cuda-aware"):
        rafi.Forwarder(comm, np.int32, 4, backend=backend, transport="cuda-aware")


def test_closed_forwarder(comm):
    fwd = rafi.Forwarder(comm, np.int32, 4, backend="cpu")
    fwd.close()
    fwd.close()
    with pytest.raises(rafi.ConfigError, match="closed"):
        fwd.forward()


def test_misaligned_dtype_refused_on_the_gpu(comm):
    packed = np.dtype([("flag", "u1"), ("x", "f4")])  # x at offset 1: a GPU cannot load it
    with pytest.raises(rafi.ConfigError, match="align=True"):
        rafi.Forwarder(comm, packed, 4, backend="cuda")
    with rafi.Forwarder(comm, np.dtype([("flag", "u1"), ("x", "f4")], align=True), 4, backend="cpu"):
        pass
