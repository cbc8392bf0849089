"""device.ANY: items any rank may run are placed by load, exactly once, the same on every rank."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rafi
from conftest import SIMULATOR
from rafi import device
from rafi._anywhere import shares
from traffic import all_ranks_ok


@settings(max_examples=200, deadline=None)
@given(loads=st.lists(st.integers(0, 50), min_size=1, max_size=12), anywhere=st.integers(0, 300))
def test_shares_fill_the_lowest_loads_first(loads, anywhere):
    loads = np.array(loads)
    share = shares(loads, anywhere)
    assert share.sum() == anywhere and (share >= 0).all()
    after = loads + share
    taking = share > 0
    if taking.any():  # every rank that takes some ends no more than one above any other
        assert after[taking].max() <= after.min() + 1
    assert np.array_equal(share, shares(loads, anywhere))  # deterministic


def _placed(comm, backend, exchange, mine, directed=None, capacity=None, mode="bsp"):
    """Send ``mine`` ANY items (and ``directed`` items to rank 0); one round; the inbox."""
    rank, size = comm.Get_rank(), comm.Get_size()
    capacity = capacity or 64 * size
    with rafi.Forwarder(comm, np.int64, capacity, backend=backend, exchange=exchange, mode=mode) as fwd:
        fwd.send(rank * 1_000_000 + np.arange(mine, dtype=np.int64), device.ANY)
        if directed:
            fwd.send(rank * 1_000_000 + 500_000 + np.arange(directed, dtype=np.int64), 0)
        rounds = [fwd.forward()]
        got = [rafi.asnumpy(fwd.inbox).copy()]
        while rounds[-1].alive:
            rounds.append(fwd.forward())
            got.append(rafi.asnumpy(fwd.inbox).copy())
    return rounds, got


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("exchange", ["dense", "sparse"])
def test_skewed_source_is_balanced_after_one_round(comm, backend, exchange, rounds_mode):
    """Rank 0 pushes ten times what the others push, all for ANY: after one round every
    inbox holds the mean to within 10% (one item), and every item arrived once."""
    rank, size = comm.Get_rank(), comm.Get_size()
    base = 4 if SIMULATOR else 40
    mine = 10 * base if rank == 0 else base
    rounds, got = _placed(comm, backend, exchange, mine, capacity=10 * base * size, mode=rounds_mode)
    first = len(got[0])
    counts = comm.allgather(first)
    mean = sum(counts) / size
    everything = np.sort(np.concatenate(comm.allgather(np.concatenate(got))))
    sent = np.sort(
        np.concatenate([r * 1_000_000 + np.arange(10 * base if r == 0 else base) for r in range(size)])
    )
    ok = max(abs(c - mean) for c in counts) <= max(1, 0.1 * mean) and np.array_equal(everything, sent)
    assert all_ranks_ok(comm, ok and rounds[0].alive == len(sent))


@pytest.mark.mpi(min_size=2)
def test_any_items_fill_around_directed_load(comm, backend, rounds_mode):
    """Directed items pile on rank 0; ANY items go to the others first."""
    size = comm.Get_size()
    directed, mine = (3, 2) if SIMULATOR else (30, 20)
    _, got = _placed(comm, backend, "auto", mine, directed=directed, mode=rounds_mode)
    counts = comm.allgather(len(got[0]))
    total = size * (directed + mine)
    level = total / size
    expected_zero = size * directed >= level  # rank 0's directed load alone reaches the level
    ok = (not expected_zero or counts[0] == size * directed) and sum(counts) == total
    assert all_ranks_ok(comm, ok and max(counts[1:]) - min(counts[1:]) <= 1)


@pytest.mark.mpi(min_size=2)
def test_any_under_flow_control_loses_nothing(comm, rounds_mode):
    """More ANY items than the inboxes hold in a round: the rest are deferred, then arrive."""
    size = comm.Get_size()
    rounds, got = _placed(comm, "cpu", "auto", 12, capacity=12, mode=rounds_mode)
    everything = np.sort(np.concatenate(comm.allgather(np.concatenate(got))))
    sent = np.sort(np.concatenate([r * 1_000_000 + np.arange(12) for r in range(size)]))
    assert all_ranks_ok(comm, np.array_equal(everything, sent) and len(rounds) >= 2)


@pytest.mark.mpi(min_size=2)
def test_any_items_survive_a_round_that_raised(comm, backend, rounds_mode):
    """An invalid destination stops the round before ANY items are placed: they stay queued
    and arrive once in the rounds after, with the directed items."""
    rank, size = comm.Get_rank(), comm.Get_size()
    with rafi.Forwarder(comm, np.int64, 16, backend=backend, mode=rounds_mode) as fwd:
        mine = rank * 100 + np.arange(4, dtype=np.int64)
        fwd.send(mine[:2], device.ANY)
        fwd.send(mine[2:3], (rank + 1) % size)
        fwd.send(mine[3:4], size + 5)
        with pytest.raises(rafi.InvalidDestination):
            fwd.forward()
        got = []
        while True:
            result = fwd.forward()
            got.extend(rafi.asnumpy(fwd.inbox).tolist())
            if not result.alive:
                break
    everything = sorted(sum(comm.allgather(got), []))
    expected = sorted(r * 100 + k for r in range(size) for k in range(3))
    assert all_ranks_ok(comm, everything == expected)


@pytest.mark.mpi(min_size=2)
def test_async_runs_any_items_where_they_were_pushed(comm, backend):
    rank = comm.Get_rank()
    with rafi.Forwarder(comm, np.int64, 16, backend=backend, mode="async") as fwd:
        fwd.send(rank * 100 + np.arange(5, dtype=np.int64), device.ANY)
        got = np.concatenate([rafi.asnumpy(batch).copy() for batch in fwd.batches()])
    assert np.array_equal(np.sort(got), rank * 100 + np.arange(5))
