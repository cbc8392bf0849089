"""Shared memory between the CPU ranks of one node: each rank reads its node peers' outboxes.

The CPU counterpart of CUDA IPC (``_ipc``), for the cpu backend in rounds. A forwarder
allocates its outbox records and the partition's sort ``order`` in one MPI-3 shared-memory
window of its node (``MPI.Win.Allocate_shared``), every rank the same arrays in the same
order, so each array lies at the same offset of every rank's segment. In a round a
receiver copies what it was granted straight from each node peer's outbox into its inbox
(kernels/partition.py::gather_rows, as for IPC): one copy per byte, no MPI payload, no
packing. (Packing into the window and copying contiguous segments instead measured slower
on the CPU machine: 41 ms against 35 ms a round of 1M 64-byte items on two ranks.) Reads
happen only inside ``forward()``, between the count exchange (after which the peer's
partition is complete and visible) and the node barrier of ``release``, so no rank's next
kernel overwrites an outbox a peer is still reading.
"""

import numpy as np

__all__ = ["ShmArena", "ShmPeers"]

_ALIGN = 64  # bytes: every array starts on a cache line


class ShmArena:
    """One shared-memory window of the node, handed out as zeroed numpy arrays.

    Collective over ``node``; every rank must then call ``zeros`` with the same sizes in the
    same order. ``nbytes`` bounds what ``zeros`` hands out.
    """

    def __init__(self, node, nbytes):
        from mpi4py import MPI

        self._node = node
        self._win = MPI.Win.Allocate_shared(max(int(nbytes), 1), 1, comm=node)
        self._segments = [self._segment(r) for r in range(node.Get_size())]
        self._mine = self._segments[node.Get_rank()]
        self._used = 0

    def _segment(self, node_rank):
        buffer, _ = self._win.Shared_query(node_rank)
        return np.frombuffer(buffer, np.uint8)

    @staticmethod
    def size_of(shapes):
        """Bytes ``zeros`` needs for arrays of these ``(count, dtype)``."""
        return sum(_aligned(count * np.dtype(dtype).itemsize) for count, dtype in shapes)

    def zeros(self, count, dtype):
        """A zeroed array of ``count`` ``dtype`` in this rank's segment."""
        dtype = np.dtype(dtype)
        nbytes = count * dtype.itemsize
        if self._used + nbytes > len(self._mine):
            raise ValueError("shared-memory arena exhausted")
        array = self._mine[self._used : self._used + nbytes].view(dtype)
        array[...] = 0
        self._used += _aligned(nbytes)
        return array

    def peer_view(self, node_rank, array):
        """The array of node rank ``node_rank`` at the offset where ``array`` lies in ours."""
        offset = array.ctypes.data - self._mine.ctypes.data
        return self._segments[node_rank][offset : offset + array.nbytes].view(array.dtype)

    def free(self):
        """Free the window (collective over the node); no array of it may be used after."""
        self._segments = self._mine = None
        self._win.Free()


def _aligned(nbytes):
    return (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN


class ShmPeers:
    """The node peers' shared arrays, seen here: ``sources[peer] = (array, ...)``.

    Args:
        comm: the forwarder's communicator; ``node`` its ranks on this node.
        arena: the node's ``ShmArena`` the ``arrays`` were allocated from.
        arrays: this rank's shared arrays (the same kinds on every rank).
        watch: the forwarder's ``Watch``, under whose deadline ``release`` waits.
    """

    def __init__(self, comm, node, arena, arrays, watch):
        self._node, self._arena, self._watch = node, arena, watch
        ranks = node.allgather(comm.Get_rank())
        me = comm.Get_rank()
        self.sources = {
            peer: tuple(arena.peer_view(node_rank, array) for array in arrays)
            for node_rank, peer in enumerate(ranks)
            if peer != me
        }

    def release(self):
        """Return once every node peer has finished reading this rank's outbox."""
        self._watch.collective("Barrier", what="forward() (node peers reading)", comm=self._node)

    def close(self):
        """Unmap and free the window; collective over the node."""
        self.sources = {}
        self._watch.collective("Barrier", what="close()", comm=self._node)
        self._arena.free()
