"""Guarantee 2: flow control under flooding, and outbox overflow raised on every rank."""

import numpy as np
import pytest

import rafi
from conftest import SIMULATOR
from rafi import device
from traffic import to_backend

pytestmark = pytest.mark.mpi(min_size=2)


def test_flood_one_receiver(comm, backend, rounds_mode):
    """Every rank sends a full outbox to rank 0: it never takes more than its capacity."""
    rank, size = comm.Get_rank(), comm.Get_size()
    capacity = 5 if SIMULATOR else 37
    values = (rank << 16) + np.arange(capacity, dtype=np.int64)
    received = []
    with rafi.Forwarder(comm, np.int64, capacity, backend=backend, mode=rounds_mode) as fwd:
        fwd.send(values, 0)
        left = capacity  # items this rank still holds
        alive = size * capacity  # items in flight anywhere
        for _ in range(10 * size):
            result = fwd.forward()
            assert result.alive == alive
            got = rafi.asnumpy(fwd.inbox)
            assert result.received == len(got) <= capacity
            if rank == 0:
                assert result.received == min(capacity, alive)
            else:
                assert result.received == 0
            sent_now = fwd.stats[-1].sent[0]
            left -= sent_now
            assert result.deferred == left
            # fairness: a sender with items left got at least the fair share of this round
            shares = np.array(comm.allgather((int(sent_now), int(sent_now + left))))
            hungry = shares[:, 1] > 0
            fair = min(capacity, alive) // max(1, hungry.sum())
            assert (shares[hungry, 0] >= np.minimum(fair, shares[hungry, 1])).all()
            received.append(got)
            alive -= result.received if rank == 0 else 0
            alive = comm.bcast(alive, root=0)
            if not result.alive:
                break
        assert fwd.forward().alive == 0
    got = np.sort(np.concatenate(received))
    if rank == 0:
        expected = np.sort(np.concatenate([(r << 16) + np.arange(capacity) for r in range(size)]))
        np.testing.assert_array_equal(got, expected)
    else:
        assert len(got) == 0


def test_capacity_one_serves_every_sender(comm, backend, rounds_mode):
    """With capacity 1 and several senders, every sender is served within ``size`` rounds."""
    rank, size = comm.Get_rank(), comm.Get_size()
    with rafi.Forwarder(comm, np.int32, 1, backend=backend, mode=rounds_mode) as fwd:
        fwd.send(np.array([rank], np.int32), 0)
        order = []
        while fwd.forward().alive:
            order.extend(rafi.asnumpy(fwd.inbox).tolist())
    if rank == 0:
        assert sorted(order) == list(range(size))


@rafi.kernel
def push_many(i, outbox, dest, slots):
    slots[i] = device.push(outbox, dest)


@rafi.kernel
def reserve_block(i, outbox, n, dest, bases):
    bases[i] = device.reserve(outbox, n, dest)


def test_outbox_overflow_raises_on_every_rank(comm, backend, rounds_mode):
    """Rank 0 pushes past its outbox: push returns -1, then forward() raises everywhere."""
    rank, size = comm.Get_rank(), comm.Get_size()
    capacity = 4
    n = 7 if rank == 0 else 2
    with rafi.Forwarder(comm, np.int32, capacity, backend=backend, mode=rounds_mode) as fwd:
        slots = to_backend(backend, np.zeros(n, np.int64))
        fwd.launch(push_many, n, fwd.outbox, (rank + 1) % size, slots)
        slots = rafi.asnumpy(slots)
        assert (slots >= 0).sum() == min(n, capacity) and (slots == -1).sum() == max(0, n - capacity)
        with pytest.raises(rafi.OutboxOverflow) as info:
            fwd.forward()
        assert info.value.refused == 3 and info.value.needed == 7 and info.value.ranks == [0]
        assert "capacity 4" in str(info.value) and "7" in str(info.value)
        assert isinstance(info.value, rafi.RafiError) and isinstance(info.value, OverflowError)
        # the items that fit are still queued and arrive on the next forward
        result = fwd.forward()
        assert result.alive == capacity + 2 * (size - 1)
        assert fwd.forward().alive == 0


def test_reserve_refuses_whole_blocks(comm, backend, rounds_mode):
    """reserve() hands out whole blocks or none; refused blocks count in the overflow error."""
    rank, size = comm.Get_rank(), comm.Get_size()
    with rafi.Forwarder(comm, np.int32, 10, backend=backend, mode=rounds_mode) as fwd:
        bases = to_backend(backend, np.zeros(4, np.int64))
        fwd.launch(reserve_block, 4, fwd.outbox, 3, rank, bases)  # 4 blocks of 3 into 10 slots
        bases = np.sort(rafi.asnumpy(bases))
        assert list(bases[:1]) == [-1] and sorted(bases[1:]) == [0, 3, 6]
        with pytest.raises(rafi.OutboxOverflow) as info:
            fwd.forward()
        assert info.value.refused == 3 * size and info.value.needed == 12
        assert fwd.forward().received == 9
