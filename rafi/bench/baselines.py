"""What rafi is measured against, on the same bytes in the same run.

- ``raw_floor``: the bare transport moving items that are already partitioned
  (host: ``Alltoallv``, plus pinned device-host copies when items live on a GPU);
- ``hand_written``: what a user writes without rafi: argsort by destination, gather,
  counts exchange, ``Alltoallv`` (staged through the host for device arrays).
"""

import time

import numpy as np

__all__ = ["destinations", "raw_floor", "hand_written"]

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


def _alltoallv(comm, send, send_counts, recv, words):
    size = comm.Get_size()
    recv_counts = np.empty(size, np.int64)
    comm.Alltoall(send_counts, recv_counts)
    sd = np.concatenate([[0], np.cumsum(send_counts)[:-1]]) * words
    rd = np.concatenate([[0], np.cumsum(recv_counts)[:-1]]) * words
    comm.Alltoallv([send, (send_counts * words, sd)], [recv, (recv_counts * words, rd)])
    return int(recv_counts.sum())


def raw_floor(comm, xp, words_per_item, dest, rounds):
    """Median seconds of moving pre-partitioned items with the bare host transport."""
    n = len(dest)
    counts = np.bincount(dest, minlength=comm.Get_size()).astype(np.int64)
    host_send = _host(xp, n * words_per_item)
    host_recv = _host(xp, comm.Get_size() * n * words_per_item + 64)
    dev_send = xp.zeros(n * words_per_item, np.uint64)
    dev_recv = xp.zeros(len(host_recv), np.uint64)
    times = []
    for _ in range(rounds):
        comm.Barrier()
        t = time.perf_counter()
        if xp is not np:
            dev_send.get(out=host_send)
        got = _alltoallv(comm, host_send, counts, host_recv, words_per_item)
        if xp is not np:
            dev_recv[: got * words_per_item].set(host_recv[: got * words_per_item])
            xp.cuda.runtime.deviceSynchronize()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def hand_written(comm, xp, words_per_item, dest, rounds):
    """Median seconds of argsort + gather + counts + Alltoallv, as a user writes it."""
    n = len(dest)
    size = comm.Get_size()
    items = xp.arange(n * words_per_item, dtype=np.uint64).reshape(n, words_per_item)
    dev_dest = xp.asarray(dest)
    recv = np.zeros(size * n * words_per_item + 64, np.uint64)
    times = []
    for _ in range(rounds):
        comm.Barrier()
        t = time.perf_counter()
        order = xp.argsort(dev_dest, kind="stable") if xp is np else xp.argsort(dev_dest)
        ordered = items[order]
        counts = xp.bincount(dev_dest, minlength=size)
        if xp is not np:
            counts, ordered = counts.get(), ordered.get()
        got = _alltoallv(comm, ordered.reshape(-1), counts.astype(np.int64), recv, words_per_item)
        if xp is not np:
            xp.asarray(recv[: got * words_per_item])
            xp.cuda.runtime.deviceSynchronize()
        times.append(time.perf_counter() - t)
    return float(np.median(times))
