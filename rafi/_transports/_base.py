"""The transport interface: one object per forwarder, one method per step of a payload move."""

import abc

from .._mpi_support import item_datatype

__all__ = ["Transport"]


class Transport(abc.ABC):
    """Moves already partitioned items between ranks.

    Counts and displacements are in items, one entry per rank; the entry of the calling
    rank is always zero (the forwarder copies self-sends locally).
    """

    name = "?"

    def __init__(self, comm, backend, item_dtype, capacity, watch):
        self.comm = comm
        self.watch = watch  # the forwarder's deadline (``_liveness``)
        self.backend = backend
        self.itemsize = item_dtype.itemsize
        self.capacity = capacity
        self.datatype = item_datatype(self.itemsize)

    @abc.abstractmethod
    def exchange(self, send, send_counts, send_displs, recv, recv_counts, recv_displs):
        """Send ``send[send_displs[p] : +send_counts[p]]`` to each peer ``p`` and receive likewise.

        ``send`` and ``recv`` are the backend's word arrays of whole items. Returns when the
        received items are in ``recv`` (and visible to the next kernel). The slots of
        ``recv`` reserved for the self-send may be overwritten; the forwarder fills them after.
        """

    def _alltoallv(self, send, send_counts, send_displs, recv, recv_counts, recv_displs):
        """``Alltoallv`` of whole items, under the forwarder's deadline."""
        send = [send, (send_counts, send_displs), self.datatype]
        recv = [recv, (recv_counts, recv_displs), self.datatype]
        self.watch.collective("Alltoallv", send, recv, what="forward() (payload exchange)", comm=self.comm)

    def close(self):
        """Release MPI and device resources."""
        if self.datatype is not None:
            self.datatype.Free()
            self.datatype = None
