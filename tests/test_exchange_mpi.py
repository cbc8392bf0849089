"""The sparse count exchange: the same rounds as the dense one, fewer control messages, and
``auto`` switching by traffic; errors and flow control agree on every rank."""

import re

import numpy as np
import pytest

import rafi
from conftest import SIMULATOR
from rafi._mpi_support import node_local
from traffic import all_ranks_ok, check_exactly_once, hop_dtype, make_items, random_routes, run_routes

pytestmark = pytest.mark.mpi(min_size=2)


def _rounds(comm, backend, exchange, items, dests, capacity):
    """Every round's inbox (sorted) of ``send(items, dests)`` under ``exchange``, and the stats."""
    got = []
    with rafi.Forwarder(comm, np.int64, capacity, backend=backend, exchange=exchange) as fwd:
        fwd.send(items, dests)
        while True:
            result = fwd.forward()
            got.append((result, np.sort(rafi.asnumpy(fwd.inbox))))
            if not result.alive:
                break
        return got, fwd.stats


@pytest.mark.parametrize("seed", [1, 2])
def test_sparse_rounds_equal_dense_rounds_under_flow_control(comm, backend, seed):
    """Skewed traffic into small inboxes (grants in most rounds): the same items arrive in
    the same rounds whichever exchange carries the counts."""
    rank, size = comm.Get_rank(), comm.Get_size()
    rng = np.random.default_rng(seed * 10 + rank)
    n = 8 if SIMULATOR else 200
    dests = np.where(rng.random(n) < 0.6, 0, rng.integers(0, size, n)).astype(np.int32)
    items = rank * 100_000 + np.arange(n, dtype=np.int64)
    capacity = max(n, 5)
    dense, _ = _rounds(comm, backend, "dense", items, dests, capacity)
    sparse, stats = _rounds(comm, backend, "sparse", items, dests, capacity)
    same = len(dense) == len(sparse) and all(
        a[0] == b[0] and np.array_equal(a[1], b[1]) for a, b in zip(dense, sparse)
    )
    assert all_ranks_ok(comm, same and len(dense) > 2)  # flow control took several rounds
    assert stats.as_dict()["totals"]["control_messages"] > 0


def test_sparse_sends_control_messages_only_to_peers(comm):
    """Ring traffic: a sparse round costs a rank one message per peer plus one (its part of
    the barrier and the reduction), a dense round ``size - 1``; when inboxes are too small
    for everything alive, grants add one message per asking peer, or ``size - 1``."""
    rank, size = comm.Get_rank(), comm.Get_size()
    items = np.arange(4, dtype=np.int64)
    right = (rank + 1) % size
    for capacity, grants in ((64, 0), (4 * size - 1, 1)):  # everything fits / grants are swapped
        for exchange, expected in (("dense", (size - 1) * (1 + grants)), ("sparse", 2 + grants)):
            _, stats = _rounds(comm, "cpu", exchange, items, right, capacity)
            assert stats[0].control_messages == expected
            assert stats[0].received.sum() == 4


def auto_rounds(comm):
    """Control messages of ``exchange="auto"``'s first two rounds, when only rank 0 sends,
    to rank 1, in the first."""
    with rafi.Forwarder(comm, np.int64, 8, backend="cpu", exchange="auto") as fwd:
        if comm.Get_rank() == 0:
            fwd.send(np.arange(3, dtype=np.int64), 1)
        fwd.forward()
        fwd.forward()
        return fwd.stats[0].control_messages, fwd.stats[1].control_messages


def test_auto_switches_to_sparse_when_few_pairs_talk(comm, monkeypatch):
    """The first round is dense; after a round in which one pair talked, auto goes sparse
    (with more than two ranks, and enough of them where all share one node), and every
    rank decides alike."""
    monkeypatch.delenv("RAFI_EXCHANGE", raising=False)  # the suite's sparse step sets it
    monkeypatch.setattr(rafi._sparse, "ONE_NODE_SPARSE_FROM", 3)  # as if the node were large
    size = comm.Get_size()
    first, second = auto_rounds(comm)
    assert first == size - 1
    assert second == (1 if size > 2 else size - 1)


def test_auto_stays_dense_on_one_small_node(comm, monkeypatch):
    """On one node of fewer ranks than ``ONE_NODE_SPARSE_FROM``, where one shared-memory
    ``Alltoall`` is cheaper than sparse's three waits, auto stays dense however few pairs
    talk."""
    monkeypatch.delenv("RAFI_EXCHANGE", raising=False)
    size = comm.Get_size()
    if size < 3 or node_local(comm)[1] != size:
        pytest.skip("needs three or more ranks, all on one node")
    assert size < rafi._sparse.ONE_NODE_SPARSE_FROM
    assert auto_rounds(comm) == (size - 1, size - 1)


@pytest.mark.parametrize("exchange", ["dense", "sparse"])
def test_only_auto_asks_where_the_ranks_are(comm, monkeypatch, exchange):
    """Dense and sparse need no collective to choose (RAFI_EXCHANGE is agreed on before
    auto's ``Split_type``)."""

    def asked(comm):
        raise AssertionError("node_local called")

    monkeypatch.delenv("RAFI_EXCHANGE", raising=False)
    monkeypatch.setattr(rafi._sparse, "node_local", asked)
    with rafi.Forwarder(comm, np.int64, 8, backend="cpu", exchange=exchange) as fwd:
        assert fwd.forward().alive == 0


def test_different_exchanges_in_the_environment_are_refused(comm, monkeypatch):
    """RAFI_EXCHANGE set differently on some ranks: ConfigError on every rank, no hang."""
    monkeypatch.setenv("RAFI_EXCHANGE", "dense" if comm.Get_rank() == 0 else "sparse")
    with pytest.raises(rafi.ConfigError, match="RAFI_EXCHANGE"):
        rafi.Forwarder(comm, np.int64, 8, backend="cpu")


def test_sparse_multi_hop_routes_exactly_once(comm, backend):
    paths = random_routes(comm, 6 if SIMULATOR else 60, 4, 7)
    dtype = hop_dtype(16)
    with rafi.Forwarder(comm, dtype, 64, backend=backend, exchange="sparse") as fwd:
        arrived, _ = run_routes(fwd, make_items(dtype, fwd.rank, paths[fwd.rank]))
    check_exactly_once(comm, dtype, paths, arrived)


def test_sparse_errors_are_the_dense_errors(comm):
    """An invalid destination on one rank and an overflow on another: every rank raises the
    same error, with the same message, whichever exchange runs."""
    rank, size = comm.Get_rank(), comm.Get_size()
    messages = {}
    for exchange in ("dense", "sparse"):
        with rafi.Forwarder(comm, np.int64, 4, backend="cpu", exchange=exchange) as fwd:
            if rank == 0:
                fwd.send(np.arange(2, dtype=np.int64), np.array([size + 3, 0], np.int32))
            if rank == size - 1:
                fwd.send(np.arange(6, dtype=np.int64), 0)  # two more than the outbox holds
            with pytest.raises(rafi.RafiError) as info:
                fwd.forward()
            # what every rank is told alike (a rank's own send() calls are added for it alone)
            told = re.sub(r" On this rank \(rank \d+\): .*?(?= Also: |$)", "", str(info.value))
            messages[exchange] = (type(info.value).__name__, told)
    assert messages["dense"] == messages["sparse"]
    assert all_ranks_ok(comm, comm.allgather(messages["sparse"]) == [messages["sparse"]] * size)


def test_bad_exchange_is_a_config_error(comm):
    with pytest.raises(rafi.ConfigError, match="exchange="):
        rafi.Forwarder(comm, np.int64, 4, backend="cpu", exchange="fast")
