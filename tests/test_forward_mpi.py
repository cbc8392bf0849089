"""Guarantee 1 (exactly once, byte for byte) and termination, under mpirun."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rafi
from conftest import SIMULATOR
from traffic import (
    MAX_HOPS,
    all_ranks_ok,
    check_exactly_once,
    hop_dtype,
    make_items,
    payload_of,
    run_backlog,
    run_routes,
)

pytestmark = pytest.mark.mpi(min_size=2)

EXAMPLES = 4 if SIMULATOR else 25
MAX_ITEMS = 6 if SIMULATOR else 40

mpi_settings = settings(
    max_examples=EXAMPLES,
    derandomize=True,  # every rank's engine runs the same examples in the same order
    database=None,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)


def traffic(size):
    """Per-rank lists of routes (1 to MAX_HOPS ranks each); some ranks send nothing."""
    route = st.lists(st.integers(0, size - 1), min_size=1, max_size=MAX_HOPS)
    return st.lists(st.lists(route, max_size=MAX_ITEMS), min_size=size, max_size=size)


def drawn_on_root(comm, data, strategy):
    """Draw from ``strategy`` and take rank 0's value, so every rank tests the same case.

    Every rank draws (its engine then consumes the same data and runs as many examples as
    rank 0's), and rank 0's value is broadcast, so a rank's own draw never decides.
    """
    value = data.draw(strategy)
    return comm.bcast(value, root=0)


def agreed(comm, check):
    """Run ``check()``; fail on every rank if it failed on any (keeps hypothesis in step)."""
    try:
        check()
        ok, error = True, None
    except AssertionError as exc:
        ok, error = False, exc
    if not all_ranks_ok(comm, ok):
        raise error or AssertionError("the check failed on another rank")


@mpi_settings
@given(data=st.data())
def test_exactly_once_multi_hop_kernel_routing(comm, backend, data, rounds_mode):
    size = comm.Get_size()
    paths = drawn_on_root(comm, data, traffic(size))
    payload = drawn_on_root(comm, data, st.sampled_from([1, 224]))  # 32- and 256-byte items
    dtype = hop_dtype(payload)
    total = sum(len(p) for p in paths)
    with rafi.Forwarder(comm, dtype, max(total, 1), backend=backend, mode=rounds_mode) as fwd:
        items = make_items(dtype, fwd.rank, paths[fwd.rank])
        arrived, results = run_routes(fwd, items)
    agreed(comm, lambda: check_exactly_once(comm, dtype, paths, arrived))
    assert results[-1].alive == 0 and all(r.alive > 0 for r in results[:-1])
    assert [r.round for r in results] == list(range(len(results)))


@mpi_settings
@given(data=st.data())
def test_exactly_once_under_tight_capacity(comm, backend, data, rounds_mode):
    """Capacity far below the traffic (down to 1): host-side routing with a backlog."""
    size = comm.Get_size()
    paths = drawn_on_root(comm, data, traffic(size))
    capacity = drawn_on_root(comm, data, st.sampled_from([1, 2, 3, 7]))
    dtype = hop_dtype(8)

    def check(fwd, result, inbox):
        assert result.received <= capacity
        assert (inbox["path"][np.arange(len(inbox)), inbox["hop"]] == fwd.rank).all()

    with rafi.Forwarder(comm, dtype, capacity, backend=backend, mode=rounds_mode) as fwd:
        arrived = run_backlog(fwd, make_items(dtype, fwd.rank, paths[fwd.rank]), check=check)
    agreed(comm, lambda: check_exactly_once(comm, dtype, paths, arrived))


def test_four_byte_items(comm, backend, rounds_mode):
    """Items of 4 bytes (plain int32) to random ranks, self included, arrive once each."""
    rank, size = comm.Get_rank(), comm.Get_size()
    n = 5 if SIMULATOR else 500
    rng = np.random.default_rng(1234 + rank)
    dests = rng.integers(0, size, n).astype(np.int32)
    values = (rank << 20) + np.arange(n, dtype=np.int32)
    with rafi.Forwarder(comm, np.int32, n * size, backend=backend, mode=rounds_mode) as fwd:
        fwd.send(values, dests)
        result = fwd.forward()
        got = np.sort(rafi.asnumpy(fwd.inbox))
        assert result.received == len(got) and result.deferred == 0
        assert fwd.forward().alive == 0
    sent = comm.allgather((values, dests))
    expected = np.sort(np.concatenate([v[d == rank] for v, d in sent]))
    np.testing.assert_array_equal(got, expected)
    assert result.alive == n * size


def test_emit_forwards_whole_records(comm, backend, rounds_mode):
    """device.emit copies an inbox record byte for byte to the outbox (there and back)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    dtype = hop_dtype(40)
    n = 4 if SIMULATOR else 64
    items = make_items(dtype, rank, [[(rank + 1) % size, rank]] * n)
    with rafi.Forwarder(comm, dtype, n, backend=backend, mode=rounds_mode) as fwd:
        fwd.send(items, (rank + 1) % size)
        fwd.forward()
        fwd.launch(echo, len(fwd.inbox), fwd.inbox, fwd.outbox)
        fwd.forward()
        back = rafi.asnumpy(fwd.inbox)
    back = back[np.argsort(back["serial"])]
    assert back.tobytes() == items.tobytes()


@rafi.kernel
def echo(i, inbox, outbox):
    ok = rafi.device.emit(outbox, inbox[i], inbox[i].origin)
    if not ok:
        inbox[i].hop = -1


def test_termination_exact_round_count(comm, backend, rounds_mode):
    """A chain of L hops takes exactly L + 1 forward() calls, the last with alive == 0."""
    size = comm.Get_size()
    hops = 3
    paths = [[[(r + k) % size for k in range(hops)]] for r in range(size)]
    dtype = hop_dtype(1)
    with rafi.Forwarder(comm, dtype, size, backend=backend, mode=rounds_mode) as fwd:
        arrived, results = run_routes(fwd, make_items(dtype, fwd.rank, paths[fwd.rank]))
        assert len(results) == hops + 1
        assert [r.alive for r in results] == [size] * hops + [0]
        empty = fwd.forward()  # an empty round after the end
        assert (empty.received, empty.alive, empty.deferred) == (0, 0, 0)
    check_exactly_once(comm, dtype, paths, arrived)


def test_payload_is_per_item(comm):
    """Sanity of the test oracle itself: different items get different payloads."""
    assert not np.array_equal(payload_of(0, 1, 16), payload_of(1, 0, 16))
