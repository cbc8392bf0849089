"""What rafi is measured against, on the same bytes in the same run.

- ``host_floor``: the bare MPI transport moving items that are already partitioned
  (``Alltoallv``, plus pinned device-host copies when items live on a GPU);
- ``ipc_floor``: the bare CUDA IPC copy: each rank copies the segments already
  partitioned for it straight from its node peers' device buffers (one ``cudaMemcpyAsync``
  per peer, its own segment locally), then all meet in a barrier;
- ``hand_written``: what a user writes without rafi: argsort by destination, gather,
  counts exchange, ``Alltoallv`` (staged through the host for device arrays).

Each returns the median seconds of ``rounds`` timed repetitions, all ranks synchronized
by a barrier before each.
"""

import time

import numpy as np

__all__ = ["destinations", "host_floor", "ipc_floor", "hand_written"]

_UNIFORM, _RING, _HOT = 0, 1, 2


def destinations(n, rank, size, pattern, seed):
    """The destinations kernels/bench.py::pattern_dest gives items ``0..n-1`` (numpy)."""
    i = np.arange(n, dtype=np.int64)
    if pattern == _RING:
        return np.full(n, (rank + 1) % size, np.int32)
    if pattern == _HOT:
        return np.zeros(n, np.int32)
    h = (i * 2654435761 + rank * 40503 + seed * 97) % 4294967296
    h = (h ^ (h >> 13)) * 1274126177 % 4294967296
    return (h % size).astype(np.int32)


def _host(xp, n):
    """A host buffer of ``n`` words, pinned when the items live on a GPU (as rafi's are)."""
    if xp is np:
        return np.zeros(n, np.uint64)
    import cupyx

    return cupyx.zeros_pinned(n, np.uint64)


def _median_time(comm, xp, step, rounds):
    times = []
    for _ in range(rounds):
        comm.Barrier()
        t = time.perf_counter()
        step()
        if xp is not np:
            xp.cuda.runtime.deviceSynchronize()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def _layout(comm, dest):
    """Counts and displacements (items) of a partitioned send buffer and of the receive side."""
    size = comm.Get_size()
    send_counts = np.bincount(dest, minlength=size).astype(np.int64)
    recv_counts = np.empty(size, np.int64)
    comm.Alltoall(send_counts, recv_counts)
    send_displs = np.concatenate([[0], np.cumsum(send_counts)[:-1]])
    recv_displs = np.concatenate([[0], np.cumsum(recv_counts)[:-1]])
    return send_counts, send_displs, recv_counts, recv_displs


def host_floor(comm, xp, words_per_item, dest, rounds):
    """Median seconds of moving pre-partitioned items with the bare host transport."""
    w = words_per_item
    sc, sd, rc, rd = _layout(comm, dest)
    got = int(rc.sum())
    host_send, host_recv = _host(xp, len(dest) * w + 1), _host(xp, got * w + 1)
    # words of its own in every page, as the items have: untouched zeros are all one shared
    # page of the kernel's, which a copy reads from the cache
    host_send[:] = np.arange(len(host_send), dtype=np.uint64)
    dev_send, dev_recv = xp.zeros(len(host_send), np.uint64), xp.zeros(len(host_recv), np.uint64)

    def step():
        if xp is not np:
            dev_send.get(out=host_send)
        comm.Alltoallv([host_send, (sc * w, sd * w)], [host_recv, (rc * w, rd * w)])
        if xp is not np:
            dev_recv.set(host_recv)

    return _median_time(comm, xp, step, rounds)


def ipc_floor(comm, words_per_item, dest, rounds):
    """Median seconds of the bare IPC copy of pre-partitioned items (one node, CuPy)."""
    import cupy as cp
    from numba import cuda

    w, rank, itemsize = words_per_item, comm.Get_rank(), words_per_item * 8
    runtime = cp.cuda.runtime
    sc, sd, rc, rd = _layout(comm, dest)
    send = cuda.device_array(len(dest) * w + 1, np.uint64)  # a dedicated allocation to export
    recv = cp.zeros(int(rc.sum()) * w + 1, np.uint64)
    handles = comm.allgather(bytes(runtime.ipcGetMemHandle(send.__cuda_array_interface__["data"][0])))
    their_displs = np.empty_like(sd)
    comm.Alltoall(sd, their_displs)  # where my segment starts in each peer's send buffer
    peers = {p: runtime.ipcOpenMemHandle(h) for p, h in enumerate(handles) if p != rank}
    bases = {**peers, rank: send.__cuda_array_interface__["data"][0]}

    def step():
        for p, base in bases.items():
            if rc[p]:
                src = base + int(their_displs[p]) * itemsize
                dst = recv.data.ptr + int(rd[p]) * itemsize
                runtime.memcpyAsync(dst, src, int(rc[p]) * itemsize, runtime.memcpyDefault, 0)
        runtime.deviceSynchronize()
        comm.Barrier()  # the senders may reuse their buffers only now

    try:
        return _median_time(comm, cp, step, rounds)
    finally:
        comm.Barrier()
        for address in peers.values():
            runtime.ipcCloseMemHandle(address)
        comm.Barrier()


def nccl_floor(comm, words_per_item, dest, rounds):
    """Median seconds of one grouped NCCL send/recv of pre-partitioned items (a GPU per
    rank), the own segment copied on the device, as rafi does."""
    import cupy as cp

    from rafi._transports._nccl import NcclTransport

    w, rank, itemsize = words_per_item, comm.Get_rank(), words_per_item * 8
    sc, sd, rc, rd = _layout(comm, dest)
    own = int(sc[rank])
    send, recv = cp.zeros(len(dest) * w + 1, np.uint64), cp.zeros(int(rc.sum()) * w + 1, np.uint64)
    sc[rank] = rc[rank] = 0  # the transport's contract: self-sends are copied locally
    nccl = NcclTransport(comm, None, np.dtype((np.void, itemsize)), len(dest), watch=None)

    def step():
        nccl.exchange(send, sc, sd, recv, rc, rd)
        cp.cuda.runtime.memcpyAsync(
            recv.data.ptr + int(rd[rank]) * itemsize,
            send.data.ptr + int(sd[rank]) * itemsize,
            own * itemsize,
            cp.cuda.runtime.memcpyDeviceToDevice,
            0,
        )

    try:
        return _median_time(comm, cp, step, rounds)
    finally:
        nccl.close()


def hand_written(comm, xp, words_per_item, dest, rounds):
    """Median seconds of argsort + gather + counts + Alltoallv, as a user writes it."""
    n, size, w = len(dest), comm.Get_size(), words_per_item
    items = xp.arange(n * w, dtype=np.uint64).reshape(n, w)
    dev_dest = xp.asarray(dest)
    recv = np.zeros(int(_layout(comm, dest)[2].sum()) * w + 1, np.uint64)

    def step():
        order = xp.argsort(dev_dest, kind="stable") if xp is np else xp.argsort(dev_dest)
        ordered = items[order]
        counts = xp.bincount(dev_dest, minlength=size)
        if xp is not np:
            counts, ordered = counts.get(), ordered.get()
        counts = counts.astype(np.int64)
        recv_counts = np.empty(size, np.int64)
        comm.Alltoall(counts, recv_counts)
        sd = np.concatenate([[0], np.cumsum(counts)[:-1]]) * w
        rd = np.concatenate([[0], np.cumsum(recv_counts)[:-1]]) * w
        comm.Alltoallv([ordered.reshape(-1), (counts * w, sd)], [recv, (recv_counts * w, rd)])
        if xp is not np:
            xp.asarray(recv[: int(recv_counts.sum()) * w])

    return _median_time(comm, xp, step, rounds)
