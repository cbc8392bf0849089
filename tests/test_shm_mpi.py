"""The shared-memory transport of the cpu backend (``shm``): exactly once, flow control,
node and remote peers side by side (a fake two-node topology), many forwarders."""

import numpy as np
import pytest

import rafi
from rafi import _transports
from rafi._mpi_support import node_local
from traffic import (
    check_exactly_once,
    hop_dtype,
    make_items,
    open_close_many,
    random_routes,
    run_backlog,
    run_routes,
)

pytestmark = pytest.mark.mpi(min_size=2)


def shm_name(comm):
    """What ``fwd.transport`` says for shm here: ``shm`` on one node, else (``RAFI_NODE_SIZE``)
    ``shm+host`` on a rank with node peers, ``host`` on a rank alone on its node."""
    local = node_local(comm)[1]
    return "shm" if local == comm.Get_size() else "host" if local == 1 else "shm+host"


@pytest.mark.parametrize("capacity_factor", [1.0, 0.05])
def test_shm_exactly_once(comm, capacity_factor):
    """Multi-hop routes read straight from node peers' outboxes; with a small capacity,
    flow control defers (the kept items move to the outbox front after peers have read)."""
    paths = random_routes(comm, 300, 4, seed=12)
    dtype = hop_dtype(56)
    capacity = max(3, int(capacity_factor * 300 * comm.Get_size()))
    with rafi.Forwarder(comm, dtype, capacity, backend="cpu", transport="shm") as fwd:
        assert fwd.transport == shm_name(comm)
        assert (fwd._engine.links.bulk is None) == (fwd.transport == "shm")  # MPI payloads only off the node
        arrived = run_backlog(fwd, make_items(dtype, fwd.rank, paths[fwd.rank]))
        deferred = comm.allreduce(sum(r.deferred for r in fwd.stats))
    check_exactly_once(comm, dtype, paths, arrived)
    if capacity_factor < 1:
        assert deferred > 0


def test_shm_is_what_auto_picks_on_the_cpu(comm):
    with rafi.Forwarder(comm, np.int32, 8, backend="cpu") as fwd:
        assert fwd.transport == shm_name(comm)
    with rafi.Forwarder(comm, np.int32, 8, backend="cpu", mode="async") as fwd:
        assert fwd.transport == "host"  # the asynchronous channels
    with pytest.raises(rafi.ConfigError, match="mode='bsp'"):
        rafi.Forwarder(comm, np.int32, 8, backend="cpu", mode="async", transport="shm")


def test_shm_and_host_peers_side_by_side(comm, monkeypatch):
    """Two fake nodes (even and odd ranks): node peers through shared memory, the others by MPI."""
    if comm.Get_size() < 3:
        pytest.skip("needs 3 ranks or more for a node with two ranks and a remote peer")
    monkeypatch.setattr(_transports, "node_comm", lambda c, *_: c.Split(c.Get_rank() % 2, c.Get_rank()))
    paths = random_routes(comm, 200, 3, seed=6)
    dtype = hop_dtype(24)
    with rafi.Forwarder(comm, dtype, 200 * comm.Get_size(), backend="cpu") as fwd:
        node_size = len(range(fwd.rank % 2, fwd.size, 2))
        assert fwd.transport == ("shm+host" if node_size > 1 else "host")
        arrived = run_routes(fwd, make_items(dtype, fwd.rank, paths[fwd.rank]))[0]
    check_exactly_once(comm, dtype, paths, arrived)


def test_shm_open_close_many_times(comm):
    """Every forwarder frees its window on close(): no leak, no stale view over many."""
    assert open_close_many(comm, backend="cpu", transport="shm")
