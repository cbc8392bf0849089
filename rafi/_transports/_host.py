"""Host-staged transport: payloads through (pinned) host memory and plain MPI ``Alltoallv``."""

import numpy as np

from ._base import Transport

__all__ = ["HostTransport"]


class HostTransport(Transport):
    """Stage device items through host buffers; numpy items go to MPI as they are."""

    name = "host"

    def __init__(self, comm, backend, item_dtype, capacity, watch):
        super().__init__(comm, backend, item_dtype, capacity, watch)
        self._staged = backend.device_arrays
        if self._staged:
            self._send_host = backend.host_buffer(capacity * self.itemsize, np.uint8)
            self._recv_host = backend.host_buffer(capacity * self.itemsize, np.uint8)

    def exchange(self, send, send_counts, send_displs, recv, recv_counts, recv_displs):
        if not self._staged:
            self._alltoallv(send, send_counts, send_displs, recv, recv_counts, recv_displs)
            return
        words = send.size // self.capacity  # machine words per item
        n_send = int(np.max(send_displs + send_counts, initial=0))
        n_recv = int(np.max(recv_displs + recv_counts, initial=0))
        send_host = self._send_host.view(send.dtype)
        recv_host = self._recv_host.view(recv.dtype)
        if n_send:
            self.backend.to_host(send[: n_send * words], send_host[: n_send * words])
        self._alltoallv(send_host, send_counts, send_displs, recv_host, recv_counts, recv_displs)
        if n_recv:  # the self-send's slots in this range are filled by the forwarder afterwards
            self.backend.to_device(recv_host[: n_recv * words], recv[: n_recv * words])
