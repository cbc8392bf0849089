"""``RAFI_NODE_SIZE=k``: ranks grouped k per emulated node (consecutive world ranks), so one
machine runs jobs whose ranks reach some peers on their node and others as remote peers.
A bad or disagreeing value is a ConfigError on every rank, never a hang."""

import numpy as np
import pytest
from mpi4py import MPI

import rafi
from rafi._mpi_support import node_comm, node_local
from traffic import check_exactly_once, hop_dtype, make_items, random_routes, run_routes

pytestmark = pytest.mark.mpi(min_size=2)


def expected_node(world_rank, world_size, k):
    """The world ranks on ``world_rank``'s emulated node of ``k``."""
    first = world_rank // k * k
    return list(range(first, min(first + k, world_size)))


@pytest.mark.parametrize("k", [1, 2, 3, 64])
def test_ranks_are_grouped_k_per_node_by_world_rank(comm, monkeypatch, k):
    monkeypatch.setenv("RAFI_NODE_SIZE", str(k))
    world = MPI.COMM_WORLD
    mine = expected_node(world.Get_rank(), world.Get_size(), k)
    node = node_comm(comm)
    try:
        members = node.allgather(world.Get_rank())
    finally:
        node.Free()
    assert members == mine  # in the communicator's order
    assert node_local(comm) == (mine.index(world.Get_rank()), len(mine))


def test_a_communicators_node_is_its_ranks_on_the_emulated_node(comm, monkeypatch):
    """Emulated nodes are made of world ranks; a communicator of some of them sees those on
    its rank's node (here: the even and the odd world ranks, nodes of 2)."""
    monkeypatch.setenv("RAFI_NODE_SIZE", "2")
    world = MPI.COMM_WORLD
    half = comm.Split(world.Get_rank() % 2, world.Get_rank())
    try:
        node = node_comm(half)
        members = node.allgather(world.Get_rank())
        node.Free()
    finally:
        half.Free()
    assert members == [
        r for r in expected_node(world.Get_rank(), world.Get_size(), 2) if r % 2 == world.Get_rank() % 2
    ]


@pytest.mark.parametrize("value", ["0", "-2", "2.5", "two", " "])
def test_a_bad_node_size_is_a_config_error_on_every_rank(comm, monkeypatch, value):
    monkeypatch.setenv("RAFI_NODE_SIZE", value)
    if not value.strip():  # empty: unset
        assert node_local(comm)[1] >= 1
        return
    with pytest.raises(rafi.ConfigError, match="RAFI_NODE_SIZE=.* is not a positive integer"):
        node_local(comm)
    with pytest.raises(rafi.ConfigError, match="RAFI_NODE_SIZE"):
        rafi.Forwarder(comm, np.int64, 8, backend="cpu")
    comm.Barrier()  # every rank got here: none is left waiting in a collective


def test_a_bad_value_on_one_rank_only_fails_on_every_rank(comm, monkeypatch):
    if comm.Get_rank() == comm.Get_size() - 1:
        monkeypatch.setenv("RAFI_NODE_SIZE", "0")
    else:
        monkeypatch.delenv("RAFI_NODE_SIZE", raising=False)
    with pytest.raises(rafi.ConfigError, match=f"rank {comm.Get_size() - 1}: RAFI_NODE_SIZE='0'"):
        node_local(comm)
    comm.Barrier()


def test_values_that_differ_between_ranks_fail_on_every_rank(comm, monkeypatch):
    monkeypatch.setenv("RAFI_NODE_SIZE", "1" if comm.Get_rank() == 0 else "2")
    with pytest.raises(rafi.ConfigError, match="RAFI_NODE_SIZE differs between ranks"):
        rafi.Forwarder(comm, np.int64, 8, backend="cpu")
    monkeypatch.delenv("RAFI_NODE_SIZE") if comm.Get_rank() == 0 else None
    with pytest.raises(rafi.ConfigError, match="rank 0: unset"):
        node_local(comm)
    comm.Barrier()


def test_two_plus_one_mixes_shared_memory_and_mpi_exactly_once(comm, monkeypatch):
    """Nodes of 2: on 3 ranks, ranks 0 and 1 reach each other through shared memory and rank
    2 through MPI; rank 2 reaches both through MPI. Multi-hop routes arrive exactly once."""
    if comm.Get_size() < 3:
        pytest.skip("needs 3 ranks or more: a node of two and a rank on another")
    monkeypatch.setenv("RAFI_NODE_SIZE", "2")
    paths = random_routes(comm, 200, 3, seed=27)
    dtype = hop_dtype(40)
    with rafi.Forwarder(comm, dtype, 200 * comm.Get_size(), backend="cpu") as fwd:
        alone = MPI.COMM_WORLD.Get_rank() // 2 * 2 + 1 >= MPI.COMM_WORLD.Get_size()
        assert fwd.transport == ("host" if alone else "shm+host")
        assert fwd._engine.links.bulk is not None  # MPI payloads to the other node
        arrived = run_routes(fwd, make_items(dtype, fwd.rank, paths[fwd.rank]))[0]
    check_exactly_once(comm, dtype, paths, arrived)
