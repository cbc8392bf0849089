"""CUDA-aware transport: device buffers handed straight to an MPI that says it takes them."""

from ._base import Transport

__all__ = ["CudaAwareTransport"]


class CudaAwareTransport(Transport):
    """``Ialltoallv`` on device arrays; the writing stream is synchronized first."""

    name = "cuda-aware"

    def exchange(self, send, send_counts, send_displs, recv, recv_counts, recv_displs):
        self.backend.synchronize()
        self._alltoallv(send, send_counts, send_displs, recv, recv_counts, recv_displs)
