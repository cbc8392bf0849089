"""Guarantee 3: bad input is a clear rafi error raised on every rank together, never a hang."""

import numpy as np
import pytest

import rafi
from rafi import device
from traffic import push_to, to_backend

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(120)]


def test_invalid_destination_from_a_kernel(comm, backend, rounds_mode):
    rank, size = comm.Get_rank(), comm.Get_size()
    dests = np.array([0, size - 1, size + 3 if rank == 1 else 0, 1], np.int32)
    with rafi.Forwarder(comm, np.int32, 8, backend=backend, mode=rounds_mode) as fwd:
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


@rafi.kernel
def push_one_to(i, outbox, dest):
    device.push(outbox, dest)


@pytest.mark.parametrize("wide", [2**32 + 1, -(2**32) + 1, 2**31])
def test_a_destination_beyond_int32_does_not_wrap(comm, backend, rounds_mode, wide):
    """A kernel's 64-bit destination that int32 cannot hold (``2**32 + 1`` would wrap to
    rank 1) is an invalid destination, not an item for another rank."""
    with rafi.Forwarder(comm, np.int32, 8, backend=backend, mode=rounds_mode) as fwd:
        fwd.launch(push_one_to, 1, fwd.outbox, wide if comm.Get_rank() == 0 else 0)
        with pytest.raises(
            rafi.InvalidDestination, match=r"one outside int32's range \(2\*\*31 or more"
        ) as info:
            fwd.forward()
        assert (info.value.count, info.value.ranks, info.value.example) == (1, [0], None)
        assert "-2147483648" not in str(info.value)
        assert fwd.forward().received == (comm.Get_size() - 1 if comm.Get_rank() == 0 else 0)


def test_negative_destination_from_send(comm, backend, rounds_mode):
    rank = comm.Get_rank()
    with rafi.Forwarder(comm, np.int32, 8, backend=backend, mode=rounds_mode) as fwd:
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
def test_bad_send_raises_config_error_everywhere(comm, backend, bad, rounds_mode):
    rank = comm.Get_rank()
    with rafi.Forwarder(comm, np.int32, 8, backend=backend, mode=rounds_mode) as fwd:
        fwd.send(np.arange(2, dtype=np.int32), 0)
        if rank == comm.Get_size() - 1:
            fwd.send(*bad())
        with pytest.raises(rafi.ConfigError) as info:
            fwd.forward()
        assert f"rank(s) [{comm.Get_size() - 1}]" in str(info.value)
        result = fwd.forward()  # nothing of the bad call was queued; the good items go
        assert result.alive == 2 * comm.Get_size()


@pytest.mark.parametrize("mode", ["bsp", "async"])
def test_every_bad_send_is_reported_with_its_count(comm, backend, mode):
    """Two bad calls and one with an invalid destination before one verdict: the error
    counts both bad calls and their items, tells both on the rank that made them, and also
    reports the invalid destinations; the next verdict is clean."""
    rank, size = comm.Get_rank(), comm.Get_size()
    with rafi.Forwarder(comm, np.int32, 16, backend=backend, mode=mode) as fwd:
        fwd.send(np.arange(2, dtype=np.int32), 0)
        if rank == size - 1:
            fwd.send(np.arange(3, dtype=np.int64), 0)  # wrong dtype
            fwd.send(np.arange(4, dtype=np.int32), np.array([0, 1], np.int32))  # dest too short
            fwd.send(np.arange(5, dtype=np.int32), size)  # every one for a rank that does not exist
        got = []  # async: batches may come before the wave that carries the error
        with pytest.raises(rafi.ConfigError) as info:
            if mode == "bsp":
                fwd.forward()
            for batch in fwd.batches() if mode == "async" else ():
                got.append(len(batch))
        text = str(info.value)
        assert f"rank {size - 1}: 2 call(s) with 7 item(s)" in text
        assert "wrong dtype" in text and "as long as the items" in text
        assert ("call 1:" in text and "call 2:" in text) == (rank == size - 1)
        assert [type(e) for e in info.value.also] == [rafi.InvalidDestination]
        assert info.value.also[0].count == 5 and f"destination {size}" in text
        if mode == "bsp":
            assert fwd.forward().alive == 2 * size  # the good items still go, once
        else:
            got += [len(batch) for batch in fwd.batches()]
            assert sum(got) == (2 * size if rank == 0 else 0)


def test_closed_forwarder_refuses_every_use(comm, backend):
    fwd = rafi.Forwarder(comm, np.int32, 4, backend=backend)
    fwd.close()
    fwd.close()
    uses = [
        fwd.forward,
        lambda: fwd.launch(push_to, 1, None, None),
        lambda: fwd.send(np.arange(1, dtype=np.int32), 0),
        lambda: fwd.outbox,
        lambda: fwd.inbox,
        lambda: fwd.to_backend(np.zeros(1)),
        lambda: fwd.checkpoint("never.h5"),
    ]
    for use in uses:
        with pytest.raises(rafi.ConfigError, match="closed"):
            use()


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


def test_misaligned_dtype_refused_on_the_gpu(comm):
    packed = np.dtype([("flag", "u1"), ("x", "f4")])  # x at offset 1: a GPU cannot load it
    with pytest.raises(rafi.ConfigError, match="align=True"):
        rafi.Forwarder(comm, packed, 4, backend="cuda")
    with rafi.Forwarder(comm, np.dtype([("flag", "u1"), ("x", "f4")], align=True), 4, backend="cpu"):
        pass
