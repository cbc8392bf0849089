"""The device side of a round after the grants: records move by plan rows, one replay each.

A plan is ``2 * size + 1`` rows of ``(count, first sorted slot, first destination slot)``
(kernels/partition.py::ROW words each), written by the host into pinned memory:

- receive rows ``0..size-1``, one per source rank: what this rank copies into its inbox
  from its own outbox (the self-send) and from each IPC-mapped node peer's outbox;
- keep rows ``size..2*size-1``, one per destination: items not granted this round, which
  go back to the front of the outbox, in order; then row ``2*size``: items for ``ANY``
  not yet given a rank (a round that raised an error before placing them keeps them).

``deliver`` replays: upload the plan and the outbox's new counters, then one gather per
source. ``keep`` replays (only when something was held back, and after IPC peers are done
reading): gather the kept items into scratch, then place them at the outbox's front.
"""

import numba
import numpy as np

from rafi.kernels import outbox as ob
from rafi.kernels.partition import ROW, gather_rows, place_rows

__all__ = ["Delivery"]


@numba.njit(nogil=True, cache=True)
def _keep_rows(rows, size, requests, starts, sent, anywhere, anywhere_start):
    """Keep rows: per destination, the items not sent, back to the outbox front in order;
    then the ``anywhere`` items for ANY (from sorted slot ``anywhere_start``)."""
    at = 0
    for p in range(size):
        kept = requests[p] - sent[p]
        rows[size + p, 0] = kept
        rows[size + p, 1] = starts[p] + sent[p]
        rows[size + p, 2] = at
        at += kept
    rows[2 * size, 0], rows[2 * size, 1], rows[2 * size, 2] = anywhere, anywhere_start, at
    return at + anywhere


@numba.njit(nogil=True, cache=True)
def _receive_rows(rows, size, given, peer_starts, copied, displs):
    """Receive rows of the sources copied on the device (``copied[p]``: self and node peers);
    ``displs[p]``: where each source's items start in the inbox. Returns the items given."""
    at = 0
    for p in range(size):
        displs[p] = at
        if copied[p]:
            rows[p, 0], rows[p, 1], rows[p, 2] = given[p], peer_starts[p], at
        else:
            rows[p, 0] = rows[p, 1] = rows[p, 2] = 0
        at += given[p]
    return at


class Delivery:
    """Owns the plan of a round and the two replays that carry it out on the device.

    Args:
        backend: the forwarder's backend.
        rank, size: this rank and the communicator's size.
        outbox: the outbox (its ``dest`` and ``state`` arrays are written).
        words: the outbox's records as machine words; ``width`` words per record.
        order: the partition's sort order of this rank's outbox.
        inbox: the inbox's records as machine words.
        scratch: ``capacity * width`` words this class may overwrite in ``keep``.
        sources: ``{peer: (words, order)}`` of IPC-mapped node peers.
    """

    def __init__(self, backend, rank, size, outbox, words, width, order, inbox, scratch, sources):
        self._b = backend
        self._rank, self._size = rank, size
        self._outbox, self._words, self._width, self._order = outbox, words, width, order
        self._inbox, self._scratch = inbox, scratch
        self._sources = sorted({rank: (words, order), **sources}.items())  # self included
        self._threads = backend.threads(len(order) * width)
        self.plan = backend.host_buffer((2 * size + 1) * ROW, np.int64)
        self.rows = self.plan.reshape(2 * size + 1, ROW)
        self.displs = np.zeros(size, np.int64)  # where each source's items start in the inbox
        self._plan = backend.zeros((2 * size + 1) * ROW, np.int64) if backend.device_arrays else self.plan
        self.state = backend.host_buffer(ob.STATE_LEN, np.int64)
        self._deliver = backend.graph(self._enqueue_deliver)
        self._keep = backend.graph(self._enqueue_keep)

    def _enqueue_deliver(self):
        b, t = self._b, self._threads
        if b.device_arrays:
            b.to_device(self.plan, self._plan)
        b.to_device(self.state, self._outbox.state)
        for source, (words, order) in self._sources:
            b.launch(gather_rows, t, t, self._plan, source, 1, order, words, self._width, self._inbox, 1)

    def _enqueue_keep(self):
        b, t, size, w = self._b, self._threads, self._size, self._width
        keep = (self._plan, size, size + 1)  # a row per destination, then ANY's
        b.launch(gather_rows, t, t, *keep, self._order, self._words, w, self._scratch, 0)
        b.launch(place_rows, t, t, *keep, self._scratch, w, self._words, self._outbox.dest, size)

    def plan_keep(self, requests, starts, sent, anywhere=0, anywhere_start=0):
        """Fill the keep rows: per destination, the items not sent this time, and
        ``anywhere`` items for ANY not yet placed; set the outbox's counters to their number
        (uploaded by ``deliver``) and return it."""
        total = _keep_rows(self.rows, self._size, requests, starts, sent, anywhere, anywhere_start)
        self.state[ob.COUNT] = total
        self.state[ob.REFUSED] = 0
        return total

    def plan_round(self, given, granted, summary, peer_starts, copied):
        """Plan a round: receive rows for the sources ``copied`` on the device (self and node
        peers: ``given[p]`` items from ``peer_starts[p]`` of their sort order, placed after
        the items of every lower source, as ``displs`` says) and the keep rows (the items
        for ANY still unplaced, after an error, among them). Returns the items received and
        the items kept."""
        received = _receive_rows(self.rows, self._size, given, peer_starts, copied, self.displs)
        s = summary
        return received, self.plan_keep(s.requests, s.starts, granted, s.anywhere, s.anywhere_start)

    def deliver(self):
        """Copy the self-send and the IPC peers' segments into the inbox; set the outbox counters."""
        self._deliver()

    def keep(self):
        """Move the kept items (keep rows) to the front of the outbox."""
        self._keep()
