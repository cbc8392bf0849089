"""Nonblocking, credit-limited channels to every peer, staged through host memory.

The asynchronous engine's transport. Between every ordered pair of ranks there is one
receive slot of ``window`` items at the receiver, with an ``Irecv`` posted into it, and one
credit at the sender: a sender may have one message of at most ``window`` items in flight
to each peer; the receiver returns the credit with an acknowledgement once it has moved
the slot's items into its inbox and posted the ``Irecv`` again. So a receiver never holds
more than ``window`` items per sender beyond its inbox, and a message always has a posted
receive. Every send (payload or acknowledgement) is counted when posted and every receive
when completed, for termination detection (``_termination``).
"""

import numpy as np

__all__ = ["Channels"]

DATA, ACK = 11, 12  # tags, on the forwarder's own communicator


class Channels:
    """This rank's channels to its ``comm`` peers.

    Args:
        comm: the forwarder's communicator (its own duplicate).
        backend: where the items live; staging buffers are its (pinned) host buffers.
        datatype: the MPI datatype of one item.
        width, word: machine words per item and their type.
        window: the most items in flight from one rank to another.
    """

    def __init__(self, comm, backend, datatype, width, word, window):
        from mpi4py import MPI

        self._MPI = MPI
        self._comm, self._backend, self._datatype = comm, backend, datatype
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.peers = [p for p in range(self.size) if p != self.rank]
        self.width, self.window = width, window
        size = self.size
        self._send_stage = backend.host_buffer((size, window * width), word)
        self._recv_stage = backend.host_buffer((size, window * width), word)
        self._ack_in = np.zeros((size, 1), np.int64)
        self._ack_out = np.zeros((size, 1), np.int64)
        self.credit = np.ones(size, bool)
        self.credit[self.rank] = False
        self.full = np.zeros(size, np.int64)  # items waiting in each receive slot
        self._data_in = [MPI.REQUEST_NULL] * size
        self._acks_in = [MPI.REQUEST_NULL] * size
        self._data_out = [MPI.REQUEST_NULL] * size
        self._acks_out = [MPI.REQUEST_NULL] * size
        self.sent = self.received = 0
        for peer in self.peers:
            self._post_data(peer)
            self._acks_in[peer] = comm.Irecv(self._ack_in[peer], source=peer, tag=ACK)

    def _post_data(self, peer):
        self._data_in[peer] = self._comm.Irecv(
            [self._recv_stage[peer], self.window, self._datatype], source=peer, tag=DATA
        )

    def poll(self):
        """Complete what has arrived: payloads fill slots, acknowledgements return credits.

        Returns how many messages completed.
        """
        MPI = self._MPI
        status = MPI.Status()
        done = []
        for peer in self.peers:
            if not self.full[peer] and self._data_in[peer].Test(status):
                self.full[peer] = status.Get_count(self._datatype)
                done.append(peer)
        acks = MPI.Request.Testsome(self._acks_in) or []
        for peer in acks:
            self._data_out[peer].Wait()  # acknowledged, so received: the stage is free
            self.credit[peer] = True
            self._acks_in[peer] = self._comm.Irecv(self._ack_in[peer], source=peer, tag=ACK)
        self.received += len(done) + len(acks)
        MPI.Request.Testsome(self._acks_out)  # let finished acknowledgements go
        return len(done) + len(acks)

    def send(self, peer, words, count):
        """Send ``count`` items (``words``: their machine words, device or host) to ``peer``."""
        stage = self._send_stage[peer, : count * self.width]
        self._backend.to_host(words, stage)
        self._data_out[peer] = self._comm.Isend([stage, count, self._datatype], dest=peer, tag=DATA)
        self.credit[peer] = False
        self.sent += 1

    def take(self, peer, dst):
        """Copy slot ``peer``'s items into ``dst`` (device or host words), then free the slot:
        post its receive again and return the sender's credit."""
        count = int(self.full[peer])
        self._backend.to_device(self._recv_stage[peer, : count * self.width], dst)
        self.full[peer] = 0
        self._post_data(peer)
        self._acks_out[peer].Wait()  # the previous acknowledgement's buffer is free
        self._ack_out[peer, 0] = count
        self._acks_out[peer] = self._comm.Isend(self._ack_out[peer], dest=peer, tag=ACK)
        self.sent += 1
        return count

    def close(self):
        """Cancel the posted receives and let finished sends go (after termination none is
        in flight; after an early exit, unmatched sends are abandoned with the communicator)."""
        MPI = self._MPI
        for request in self._data_in + self._acks_in:
            if request != MPI.REQUEST_NULL:
                request.Cancel()
                request.Wait()
        for request in self._data_out + self._acks_out:
            if request != MPI.REQUEST_NULL and not request.Test():
                request.Free()
