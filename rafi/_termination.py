"""Distributed termination detection and error agreement for asynchronous forwarding.

Ranks run waves over a binomial tree rooted at rank 0 (nonblocking point-to-point on a
communicator of its own, so waves match by sequence number: MPI keeps the order of
messages between two ranks): a rank waits for its children's records, adds its own, sends
the sum to its parent; the root's sum travels back down, and each rank starts the next
wave as soon as it has the sum of the last one. A wave costs ``2 (P - 1)`` small messages
in all and ``2 log2 P`` steps. (Open MPI 5's nonblocking ``Iallgather`` was seen to stall
forever under oversubscription, once in a few hundred loops; plain messages do not.)

A rank's record: its counters of messages sent and received (payloads and
acknowledgements alike, counted when posted and when completed), whether it was busy, and
whether it saw an error since its last record. The tree sums sent and received and takes
the largest busy and error words.

Termination (the four-counter method of Mattern): the computation has ended when two
consecutive waves ``k`` and ``k + 1`` show no rank busy, the same sums of sent and of
received messages in both, and as many received as sent. Why this cannot end early:
counters only grow, so equal sums mean no rank sent or received anything between its two
contributions. Wave ``k + 1`` starts at a rank only after wave ``k`` has completed there,
and wave ``k`` completes nowhere before the root has every contribution to it, at some
time T: every rank's interval between its two contributions contains T. A rank idle at
its first contribution that receives nothing stays idle (an idle rank holds no items and
runs no kernel: only a message can give it work), so at T every rank is idle, and with
sends equal to receives no message is in flight: nothing can ever create work again.
Every rank sees the same sums, so all return at the same wave.

Leaving the loop: a rank learns of termination when the wave's sum reaches it, the root
first, the leaves last. A rank that knows may start its next loop and send new items to a
rank that does not know yet, which would then take them into the loop that has ended (and
go on running waves that the others no longer join: a hang, seen under CPU load). So a
terminated wave ends with a barrier: no rank leaves before every rank knows, and nothing
a rank receives inside a loop belongs to the next one.

Errors: a wave whose sum carries the error word makes every rank exchange its full error
record (``_control.Block``) of that wave with an ``Allgather``, which every rank enters at
the same wave, and raise the same ``RafiError`` (``_control.verdict``); no rank leaves it
before every rank has entered it.

Every wait goes through the forwarder's ``Watch`` (``_liveness``): a wave in flight longer
than the deadline raises ``CollectiveTimeout`` naming the ranks that stopped taking part.
"""

import time

import numpy as np

from . import _control

__all__ = ["Waves", "tree"]

SENT, RECEIVED, BUSY, ERROR = range(4)  # the words of a record
WORDS = 4
_UP, _DOWN = 21, 22  # tags
_ERRORS = (_control.Block.SEND_ERROR, _control.Block.INVALID, _control.Block.REFUSED)


def tree(rank, size):
    """``(parent, children)`` of ``rank`` in the binomial tree over ``size`` ranks rooted at 0
    (``parent`` is None at the root)."""
    low = rank & -rank if rank else size  # children sit below the lowest set bit
    children, step = [], 1
    while step < low and rank + step < size:
        children.append(rank + step)
        step *= 2
    return (rank - low if rank else None), children


class Waves:
    """One rank's side of the waves on ``comm``; ``watch`` keeps the deadline (``_liveness``).

    ``poll(sent, received, busy, flags)`` starts a wave if none is in flight, or advances
    the one in flight; it returns ``"running"``, ``"terminated"``, or raises the wave's
    error. ``flags`` is a ``Block.WORDS`` int64 array of this rank's error words; they are
    taken (reported once) by the wave that carries them.
    """

    def __init__(self, comm, capacity, watch):
        self._comm = comm.Dup()  # its own: closing aligns waves with a collective on ``comm``
        self._watch = watch
        self._capacity = capacity
        self._rank = comm.Get_rank()
        self._parent, self._children = tree(self._rank, comm.Get_size())
        self._flags = np.zeros(_control.Block.WORDS, np.int64)  # this rank's, in the wave in flight
        self._mine = np.zeros(WORDS, np.int64)
        self._from_children = np.zeros((len(self._children), WORDS), np.int64)
        self._sum = np.zeros(WORDS, np.int64)  # going up; the wave's result, once it came down
        self._up = np.zeros((2, WORDS), np.int64)  # send buffers by wave parity: a send is
        self._down = np.zeros((2, WORDS), np.int64)  # complete two waves later (module doc)
        self._sends = ([], [])  # by wave parity
        self._pending = None  # receives of the wave in flight not yet complete
        self._sent_up = False
        self._parity = 0
        self._previous = None
        self.started = 0
        self.since = time.perf_counter()  # when the wave in flight started here

    def poll(self, sent, received, busy, flags, bad_sends=None):
        if self._pending is None:
            self._mine[:] = sent, received, int(bool(busy)), int(flags[list(_ERRORS)].any())
            self._flags[:] = flags
            flags[:] = 0
            self._start()
        if not self._advance(wait=False):
            self._watch.check(self.since, self.what())
            return "running"
        if self._judge(bad_sends) == "running":
            return "running"
        self._watch.wait([self._comm.Ibarrier()], f"batches() (leaving the loop after wave {self.started})")
        return "terminated"

    def what(self):
        """Where this rank waits, as timeouts and census answers say it."""
        return f"batches() (termination wave {self.started})"

    def _start(self):
        from mpi4py import MPI

        comm, parity = self._comm, self.started % 2
        MPI.Request.Waitall(self._sends[parity])  # two waves old: received (module doc)
        self._sends[parity].clear()
        children = enumerate(self._children)
        self._pending = [comm.Irecv(self._from_children[k], source=child, tag=_UP) for k, child in children]
        self._sent_up = False
        self._parity = parity
        self.started += 1
        self.since = time.perf_counter()

    def _advance(self, wait):
        """Move the wave on; True once its result is in ``_sum``."""
        comm, parity = self._comm, self._parity
        if not self._sent_up:
            if not self._complete(self._pending, wait):
                return False
            total = self._mine + self._from_children.sum(axis=0)
            total[BUSY:] = np.maximum(self._mine[BUSY:], self._from_children[:, BUSY:].max(axis=0, initial=0))
            self._sent_up = True
            if self._parent is None:
                self._sum[:] = total
                self._pending = []
            else:
                self._up[parity] = total
                self._sends[parity].append(comm.Isend(self._up[parity], dest=self._parent, tag=_UP))
                self._pending = [comm.Irecv(self._sum, source=self._parent, tag=_DOWN)]
        if not self._complete(self._pending, wait):
            return False
        self._down[parity] = self._sum
        down = [comm.Isend(self._down[parity], dest=child, tag=_DOWN) for child in self._children]
        self._sends[parity].extend(down)
        self._pending = None
        return True

    def _complete(self, requests, wait):
        from mpi4py import MPI

        if wait:
            self._watch.wait(requests, self.what())
            return True
        return MPI.Request.Testall(requests)

    def _judge(self, bad_sends):
        result = self._sum.copy()
        if result[ERROR]:
            everyone = np.zeros((self._comm.Get_size(), _control.Block.WORDS), np.int64)
            self._watch.wait([self._comm.Iallgather(self._flags, everyone)], self.what())
            self._previous = None
            raise _control.verdict(everyone, self._rank, self._capacity, bad_sends)
        previous, self._previous = self._previous, result
        if previous is None or result[BUSY] or previous[BUSY]:
            return "running"
        if np.array_equal(result[:BUSY], previous[:BUSY]) and result[SENT] == result[RECEIVED]:
            self._previous = None
            return "terminated"
        return "running"

    def close(self, comm):
        """Complete every wave any rank started, then free; collective over ``comm``.

        Ranks that leave a loop early may be one wave apart; the laggards run empty waves
        until all have run as many, so no message is left pending.
        """
        from mpi4py import MPI

        target = np.array([self.started], np.int64)
        self._watch.wait([comm.Iallreduce(MPI.IN_PLACE, target, op=MPI.MAX)], "close() (aligning waves)")
        target = int(target[0])
        if self._pending is not None:
            self._advance(wait=True)
        while self.started < target:
            self._mine[:] = 0
            self._start()
            self._advance(wait=True)
        self._watch.wait(self._sends[0] + self._sends[1], "close() (aligning waves)")
        self._comm.Free()
