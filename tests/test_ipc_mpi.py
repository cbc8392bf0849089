"""The CUDA IPC transport on a real GPU: exactly once, flow control, mixed node/remote peers.

The other MPI tests run through ``auto``, which picks ``ipc`` on a GPU machine with CuPy;
these ask for it by name, check what ``fwd.transport`` reports, and fake a two-node
topology on one machine to run IPC and host-staged peers side by side.
"""

import numpy as np
import pytest

import rafi
from rafi import _transports
from traffic import (
    check_exactly_once,
    hop_dtype,
    make_items,
    open_close_many,
    random_routes,
    run_async,
    run_backlog,
    run_routes,
)

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.cuda_path]


def _real_gpu_with_cupy():
    from rafi._targets import simulator

    if simulator():
        return False
    try:
        import cupy  # noqa: F401
        from numba import cuda

        return bool(cuda.is_available())
    except Exception:
        return False


needs_gpu = pytest.mark.skipif(
    not _real_gpu_with_cupy(),
    reason="CUDA IPC needs a real GPU and CuPy (CI has neither; run on the GPU machine)",
)


@needs_gpu
@pytest.mark.parametrize("capacity_factor", [1.0, 0.05])
def test_ipc_exactly_once(comm, capacity_factor):
    """Multi-hop routes over IPC; with a small capacity, flow control defers and resends."""
    paths = random_routes(comm, 300, 4, seed=11)
    dtype = hop_dtype(56)
    capacity = max(3, int(capacity_factor * 300 * comm.Get_size()))
    with rafi.Forwarder(comm, dtype, capacity, backend="cuda", transport="ipc") as fwd:
        assert fwd.transport == "ipc"
        arrived = run_backlog(fwd, make_items(dtype, fwd.rank, paths[fwd.rank]))
        deferred = comm.allreduce(sum(r.deferred for r in fwd.stats))
    check_exactly_once(comm, dtype, paths, arrived)
    if capacity_factor < 1:
        assert deferred > 0  # flow control really ran


@needs_gpu
@pytest.mark.parametrize("progress", ["poll", "thread"])
def test_async_over_ipc_exactly_once(comm, progress):
    """mode="async" over IPC: senders write into the receivers' device slots, the messages
    carry counts only. (Small windows over IPC: test_async_mpi's flood test, under auto.)"""
    paths = random_routes(comm, 300, 4, seed=13)
    dtype = hop_dtype(40)
    capacity = 300 * comm.Get_size()  # every item of the run fits any one outbox
    config = dict(backend="cuda", transport="ipc", mode="async", progress=progress)
    with rafi.Forwarder(comm, dtype, capacity, **config) as fwd:
        assert fwd.transport == "ipc"
        arrived = run_async(fwd, make_items(dtype, fwd.rank, paths[fwd.rank]))
    check_exactly_once(comm, dtype, paths, arrived)


@needs_gpu
@pytest.mark.parametrize("mode", ["bsp", "async"])
def test_ipc_and_host_peers_side_by_side(comm, monkeypatch, mode):
    """Two fake nodes (even and odd ranks): node peers over IPC, the others host-staged."""
    if comm.Get_size() < 3:
        pytest.skip("needs 3 ranks or more for a node with two ranks and a remote peer")
    monkeypatch.setattr(_transports, "node_comm", lambda c, *_: c.Split(c.Get_rank() % 2, c.Get_rank()))
    paths = random_routes(comm, 200, 3, seed=5)
    dtype = hop_dtype(24)
    config = dict(backend="cuda", transport="ipc", mode=mode)
    with rafi.Forwarder(comm, dtype, 200 * comm.Get_size(), **config) as fwd:
        node_size = len(range(fwd.rank % 2, fwd.size, 2))
        assert fwd.transport == ("ipc+host" if node_size > 1 else "host")
        items = make_items(dtype, fwd.rank, paths[fwd.rank])
        arrived = run_async(fwd, items) if mode == "async" else run_routes(fwd, items)[0]
    check_exactly_once(comm, dtype, paths, arrived)


@needs_gpu
def test_ipc_open_close_many_times(comm):
    """Handles are opened once per forwarder and closed on close(): no leak over many."""
    assert open_close_many(comm, backend="cuda", transport="ipc")


def test_ipc_refused_where_unsafe(comm):
    """Without a real GPU (CI, the simulator), asking for IPC is a ConfigError on every rank."""
    if _real_gpu_with_cupy():
        pytest.skip("this machine can do IPC")
    with pytest.raises(rafi.ConfigError, match="ipc"):
        rafi.Forwarder(comm, np.int32, 4, backend="cpu", transport="ipc")
