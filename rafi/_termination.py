"""Distributed termination detection and error agreement for asynchronous forwarding.

Ranks run waves: every rank sends its record to every other rank and receives theirs
(nonblocking point-to-point on a communicator of its own, so waves match by sequence
number: MPI keeps the order of messages between two ranks), started again as soon as the
last one completes. (Open MPI 5's nonblocking ``Iallgather`` was seen to stall forever
under oversubscription, once in a few hundred loops; plain messages do not.) A record
holds the rank's counters of messages sent and received
(payloads and acknowledgements alike, counted when posted and when completed), whether the
rank was busy, and the error flags of ``_control.Block`` since its last record.

Termination (the four-counter method of Mattern, with per-rank counters): the computation
has ended when two consecutive waves ``k`` and ``k + 1`` show every rank idle, every rank
with the same counters in both, and as many messages received as sent. Why this cannot end
early: counters only grow, so equal counters mean no rank sent or received anything
between its two contributions. Wave ``k + 1`` starts only after wave ``k`` completed, i.e.
after the last contribution to wave ``k`` at some time T; every rank's interval between
its contributions contains T. A rank idle at its first contribution that receives nothing
stays idle (an idle rank holds no items and runs no kernel: only a message can give it
work), so at T every rank is idle, and with sends equal to receives no message is in
flight: nothing can ever create work again. Every rank sees the same records, so all
return at the same wave.

Errors: any wave whose records carry error flags makes every rank raise the same
``RafiError`` (``_control.verdict``) when that wave completes.
"""

import numpy as np

from . import _control

__all__ = ["Waves"]

SENT = _control.Block.WORDS  # words after the control block's
RECEIVED = SENT + 1
BUSY = RECEIVED + 1
WORDS = BUSY + 1
_TAG = 21


class Waves:
    """One rank's side of the waves on ``comm``.

    ``poll(sent, received, busy, flags)`` starts a wave if none is in flight, or tests the
    one in flight; it returns ``"running"``, ``"terminated"``, or raises the wave's error.
    ``flags`` is a ``Block.WORDS`` int64 array of this rank's error words; they are taken
    (reported once) by the wave that carries them.
    """

    def __init__(self, comm, capacity):
        self._comm = comm.Dup()  # its own: closing aligns waves with a collective on ``comm``
        self._capacity = capacity
        self._rank = comm.Get_rank()
        self._peers = [p for p in range(comm.Get_size()) if p != self._rank]
        self._mine = np.zeros(WORDS, np.int64)
        self._all = np.zeros((comm.Get_size(), WORDS), np.int64)
        self._request = None
        self._previous = None
        self.started = 0

    def poll(self, sent, received, busy, flags, detail=None):
        if self._request is None:
            self._mine[: _control.Block.WORDS] = flags
            self._mine[SENT], self._mine[RECEIVED], self._mine[BUSY] = sent, received, int(bool(busy))
            flags[:] = 0
            self._start()
            return "running"
        from mpi4py import MPI

        if not MPI.Request.Testall(self._request):
            return "running"
        self._request = None
        blocks = self._all.copy()
        words = blocks[:, : _control.Block.WORDS]
        error = _control.verdict(words, self._rank, self._capacity, detail)
        if error is not None:
            self._previous = None
            raise error
        previous, self._previous = self._previous, blocks
        if previous is None or blocks[:, BUSY].any() or previous[:, BUSY].any():
            return "running"
        counts = blocks[:, SENT:BUSY]
        if np.array_equal(counts, previous[:, SENT:BUSY]) and counts[:, 0].sum() == counts[:, 1].sum():
            self._previous = None
            return "terminated"
        return "running"

    def _start(self):
        comm = self._comm
        self._all[self._rank] = self._mine
        receives = [comm.Irecv(self._all[p], source=p, tag=_TAG) for p in self._peers]
        self._request = receives + [comm.Isend(self._mine, dest=p, tag=_TAG) for p in self._peers]
        self.started += 1

    def close(self, comm):
        """Complete every wave any rank started, then free; collective over ``comm``.

        Ranks that leave a loop early may be one wave apart; the laggards start empty
        waves until all have started as many, so no collective is left pending.
        """
        from mpi4py import MPI

        target = comm.allreduce(self.started, op=MPI.MAX)
        if self._request is not None:
            MPI.Request.Waitall(self._request)
        while self.started < target:
            self._mine[:] = 0
            self._start()
            MPI.Request.Waitall(self._request)
        self._request = None
        self._comm.Free()
