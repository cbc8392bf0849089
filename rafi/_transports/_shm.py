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

A window /dev/shm cannot back is refused before it is asked for: Open MPI would warn and
leave every rank of the node spinning in ``MPI_Win_allocate_shared``. The node's ranks
agree on the whole request against the free space of the directory that backs it
(``shm_free``) and raise the same ``ConfigError``, naming the sizes and the fix.
"""

import os

import numpy as np

from .._config import size_text
from .._errors import ConfigError
from .._mpi_support import allgather

__all__ = ["ShmArena", "ShmPeers", "shm_free"]

_ALIGN = 64  # bytes: every array starts on a cache line
_SLACK = 1 << 20  # bytes beyond the arrays an MPI may need per rank (its own control data)
_RESIDENT_WHAT = "the node's shared memory of mode='resident' (inboxes, staging areas and mailboxes)"
_RESIDENT_FIX = "pass a smaller capacity, or mode='bsp' with transport='host' (which needs no window)"


def shm_free():
    """``(directory, bytes free there)`` where this MPI backs shared-memory windows (Open
    MPI's ``osc_sm_backing_directory``, by default /dev/shm), or None where that cannot be
    told (no such directory)."""
    directory = os.environ.get("OMPI_MCA_osc_sm_backing_directory") or "/dev/shm"
    try:
        stat = os.statvfs(directory)
    except OSError:
        return None
    return directory, stat.f_bavail * stat.f_frsize


def _room(node, nbytes, watch, fix, what):
    """Raise ``ConfigError`` on every rank of ``node`` unless its backing directory has room
    for every rank's ``nbytes``; collective over ``node``."""
    free = shm_free()
    said = allgather(node, (int(nbytes), free), "Forwarder() (sizing the node's shared memory)", watch)
    total = sum(n + _SLACK for n, _ in said)
    known = [f for _, f in said if f is not None]
    if not known:
        return
    directory, room = min(known, key=lambda f: f[1])
    if total <= room:
        return
    biggest = max(n for n, _ in said)
    raise ConfigError(
        f"{what} cannot be backed: the node's {len(said)} rank(s) need "
        f"{size_text(total)} together ({size_text(biggest)} for the largest rank), and {directory} has "
        f"{size_text(room)} free; {fix}, or give the node a larger {directory} (e.g. docker run --shm-size)"
    )


class ShmArena:
    """One shared-memory window of the node, handed out as zeroed numpy arrays.

    Collective over ``node``; every rank must then call ``zeros`` with the same sizes in the
    same order. ``nbytes`` bounds what ``zeros`` hands out.

    Args:
        watch: the forwarder's ``Watch``, under whose deadline the agreement on room waits.
        fix: what a message of too little room tells the user to do.
        what: what the window holds, as that message says it (the defaults speak of resident
            rounds' inboxes and mailboxes, ``_mailboxes``).

    Raises:
        ConfigError: on every rank of ``node``, when the backing directory (/dev/shm) has
            less room than the ranks ask for together.
    """

    def __init__(self, node, nbytes, watch=None, fix=_RESIDENT_FIX, what=_RESIDENT_WHAT):
        from mpi4py import MPI

        _room(node, nbytes, watch, fix, what)
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
        ranks = allgather(node, comm.Get_rank(), "Forwarder() (mapping the node's shared memory)", watch)
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
