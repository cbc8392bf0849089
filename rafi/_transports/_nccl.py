"""NCCL transport: packed segments between GPUs, one rank per GPU, through CuPy's NCCL.

The unique id is made on rank 0 and broadcast over MPI; a round's sends and receives are
one NCCL group on the legacy default stream, so they are ordered with the partition before
and the delivery after without a host synchronization. NCCL refuses two ranks on one GPU:
``choose_links`` offers this transport only when every rank has its own GPU.
"""

from .._errors import ConfigError
from .._mpi_support import allgather
from ._base import Transport

__all__ = ["NcclTransport", "nccl_available"]


def nccl_available(backend):
    """Return True when CuPy was built with NCCL (and the backend is a real GPU)."""
    if backend.cupy is None or backend.simulator:
        return False
    try:
        from cupy.cuda import nccl
    except ImportError:
        return False
    return bool(getattr(nccl, "available", False))


class NcclTransport(Transport):
    """Grouped ``ncclSend``/``ncclRecv`` of byte segments, one pair per peer with items."""

    name = "nccl"

    def __init__(self, comm, backend, item_dtype, capacity, watch):
        super().__init__(comm, backend, item_dtype, capacity, watch)
        from cupy.cuda import nccl

        self._nccl = nccl
        mine = nccl.get_unique_id() if comm.Get_rank() == 0 else None
        uid = allgather(comm, mine, "Forwarder() (starting NCCL)", watch)[0]
        try:
            self._comm = nccl.NcclCommunicator(comm.Get_size(), uid, comm.Get_rank())
        except Exception as exc:
            raise ConfigError(f"NCCL could not start on rank {comm.Get_rank()}: {exc}") from None

    def exchange(self, send, send_counts, send_displs, recv, recv_counts, recv_displs):
        from .._backends._cuda import pointer

        nccl, size, nbytes = self._nccl, len(send_counts), self.itemsize
        send_at, recv_at = pointer(send), pointer(recv)
        nccl.groupStart()
        for peer in range(size):
            if send_counts[peer]:
                at = send_at + int(send_displs[peer]) * nbytes
                self._comm.send(at, int(send_counts[peer]) * nbytes, nccl.NCCL_UINT8, peer, 0)
            if recv_counts[peer]:
                at = recv_at + int(recv_displs[peer]) * nbytes
                self._comm.recv(at, int(recv_counts[peer]) * nbytes, nccl.NCCL_UINT8, peer, 0)
        nccl.groupEnd()

    def close(self):
        if self._comm is not None:
            self._comm.destroy()
            self._comm = None
        super().close()
