"""Nonblocking, credit-limited channels to every peer: over CUDA IPC or mapped host memory.

The asynchronous engine's transport. Between every ordered pair of ranks there is one
receive slot of ``window`` items at the receiver, with an ``Irecv`` posted into it, and one
credit at the sender: a sender may have one message of at most ``window`` items in flight
to each peer; the receiver returns the credit with an acknowledgement once its device has
moved the slot's items into the inbox and the ``Irecv`` is posted again. So a receiver
never holds more than ``window`` items per sender beyond its inbox, and a message always
has a posted receive.

No copy goes through the host here. To a peer reached over CUDA IPC (same node, mapped
GPUs), the engine's partition replay writes the segment straight into the peer's device
receive slot for this rank, and the message carries only the count. To the others, both
stages are host memory the device maps (``backend.mapped_buffer``): the partition replay
writes each outgoing segment into the send stage, and the message carries the records.
Either way ``send``'s items are in place once the host has read the partition, and the
delivery replay reads arrived slots straight into the inbox; a slot is given back only
after an event shows the device has read it, so a turn waits for the device once. Every
send (payload or acknowledgement) is counted when posted and every receive when completed,
for termination detection (``_termination``).
"""

import numpy as np

__all__ = ["Channels"]

DATA, ACK = 11, 12  # tags, on the forwarder's own communicator


class Channels:
    """This rank's channels to its ``comm`` peers.

    Args:
        comm: the forwarder's communicator (its own duplicate).
        backend: where the items live; it provides the mapped stages and the event.
        datatype: the MPI datatype of one item.
        width, word: machine words per item and their type.
        window: the most items in flight from one rank to another.
        ipc: ``{peer: (its device receive slots,)}`` mapped here, for peers over IPC.

    ``send_stage`` / ``recv_stage`` are the kernels' views of the host stages: ``size *
    window`` records each, peer ``p``'s at record ``p * window`` (a peer over IPC uses this
    rank's exported device slots instead, with the same layout); one record each when every
    peer is over IPC, as nothing is staged then.
    """

    def __init__(self, comm, backend, datatype, width, word, window, ipc=None):
        from mpi4py import MPI

        self._MPI = MPI
        self._comm, self._datatype = comm, datatype
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.peers = [p for p in range(self.size) if p != self.rank]
        self.width, self.window = width, window
        self.ipc = dict(ipc or {})
        staged = any(p not in self.ipc for p in self.peers)  # else the stages are never read
        words = self.size * window * width if staged else width
        sends, self.send_stage = backend.mapped_buffer(words, word)
        receives, self.recv_stage = backend.mapped_buffer(words, word)
        self._sends = sends.reshape(self.size, window * width) if staged else None
        self._receives = receives.reshape(self.size, window * width) if staged else None
        self._event = backend.event()
        self._ack_in = np.zeros((self.size, 1), np.int64)
        self._ack_out = np.zeros((self.size, 1), np.int64)
        self._notice_in = np.zeros((self.size, 1), np.int64)  # counts of IPC payloads
        self._notice_out = np.zeros((self.size, 1), np.int64)
        self.credit = np.ones(self.size, bool)
        self.credit[self.rank] = False
        self.full = np.zeros(self.size, np.int64)  # items waiting in each receive slot
        self._reading = []  # slots the device may still be reading
        self._data_in = [MPI.REQUEST_NULL] * self.size
        self._acks_in = [MPI.REQUEST_NULL] * self.size
        self._data_out = [MPI.REQUEST_NULL] * self.size
        self._acks_out = [MPI.REQUEST_NULL] * self.size
        self.sent = self.received = 0
        for peer in self.peers:
            self._post_data(peer)
            self._acks_in[peer] = comm.Irecv(self._ack_in[peer], source=peer, tag=ACK)

    def _post_data(self, peer):
        if peer in self.ipc:
            buffer = self._notice_in[peer]
        else:
            buffer = [self._receives[peer], self.window, self._datatype]
        self._data_in[peer] = self._comm.Irecv(buffer, source=peer, tag=DATA)

    @property
    def pending(self):
        """Whether a slot waits for the device before it can be given back."""
        return bool(self._reading)

    def poll(self):
        """Complete what has arrived: payloads fill slots, acknowledgements return credits;
        give back the slots the device has finished reading. Returns how many messages
        completed or were posted."""
        MPI = self._MPI
        moved = self._give_back() if self._reading and self._event.query() else 0
        status = MPI.Status()
        done = 0
        for peer in self.peers:
            if self._data_in[peer] != MPI.REQUEST_NULL and self._data_in[peer].Test(status):
                ipc = peer in self.ipc
                self.full[peer] = self._notice_in[peer, 0] if ipc else status.Get_count(self._datatype)
                done += 1
        acks = MPI.Request.Testsome(self._acks_in) or []
        for peer in acks:
            self._data_out[peer].Wait()  # acknowledged, so received: the stage is free
            self.credit[peer] = True
            self._acks_in[peer] = self._comm.Irecv(self._ack_in[peer], source=peer, tag=ACK)
        self.received += done + len(acks)
        MPI.Request.Testsome(self._acks_out)  # let finished acknowledgements go
        return moved + done + len(acks)

    def send(self, peer, count):
        """Send the ``count`` items the device has written for ``peer`` (to the host stage, or
        over IPC into the peer's slot)."""
        if peer in self.ipc:
            self._notice_out[peer, 0] = count  # free: the last one was acknowledged
            message = self._notice_out[peer]
        else:
            message = [self._sends[peer, : count * self.width], count, self._datatype]
        self._data_out[peer] = self._comm.Isend(message, dest=peer, tag=DATA)
        self.credit[peer] = False
        self.sent += 1

    def read(self, peers):
        """The device has been told to read these slots (enqueued before this call); they are
        given back once it has, at a later ``poll`` or ``device_idle``."""
        if peers:
            self._reading.extend((peer, int(self.full[peer])) for peer in peers)
            self.full[peers] = 0
            self._event.record()

    def device_idle(self):
        """The host has waited for the device: every slot it was reading is free."""
        if self._reading:
            self._give_back()

    def _give_back(self):
        """Post each read slot's receive again and return its sender's credit."""
        for peer, count in self._reading:
            self._post_data(peer)
            self._acks_out[peer].Wait()  # the previous acknowledgement's buffer is free
            self._ack_out[peer, 0] = count
            self._acks_out[peer] = self._comm.Isend(self._ack_out[peer], dest=peer, tag=ACK)
            self.sent += 1
        moved = len(self._reading)
        self._reading = []
        return moved

    def close(self):
        """Cancel the posted receives and let the sends go (after termination none is in
        flight; after an early exit, unmatched ones stay with the communicator, which the
        forwarder then keeps)."""
        MPI = self._MPI
        for request in self._data_in + self._acks_in:
            if request != MPI.REQUEST_NULL:
                request.Cancel()
                request.Wait()
        for request in self._data_out + self._acks_out:
            if request != MPI.REQUEST_NULL and not request.Test():
                request.Free()
