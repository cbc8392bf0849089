"""The device side of a round after the grants: records move by plan rows, one replay each.

A plan is ``2 * size`` rows of ``(count, first sorted slot, first destination slot)``
(kernels/partition.py::ROW words each), written by the host into pinned memory:

- receive rows ``0..size-1``, one per source rank: what this rank copies into its inbox
  from its own outbox (the self-send) and from each IPC-mapped node peer's outbox;
- keep rows ``size..2*size-1``, one per destination: items not granted this round, which
  go back to the front of the outbox, in order.

``deliver`` replays: upload the plan and the outbox's new counters, then one gather per
source. ``keep`` replays (only when something was held back, and after IPC peers are done
reading): gather the kept items into scratch, then place them at the outbox's front.
"""

import numpy as np

from rafi.kernels import outbox as ob
from rafi.kernels.partition import ROW, gather_rows, place_rows

__all__ = ["Delivery"]


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
        self._inbox, self._scratch, self._sources = inbox, scratch, dict(sources)
        self._threads = backend.threads(len(order) * width)
        self.plan = backend.host_buffer(2 * size * ROW, np.int64)
        self.rows = self.plan.reshape(2 * size, ROW)
        self._plan = backend.zeros(2 * size * ROW, np.int64)
        self.state = backend.host_buffer(ob.STATE_LEN, np.int64)
        self._deliver = backend.graph(self._enqueue_deliver)
        self._keep = backend.graph(self._enqueue_keep)

    def _enqueue_deliver(self):
        b, t = self._b, self._threads
        b.to_device(self.plan, self._plan)
        b.to_device(self.state, self._outbox.state)
        sources = {self._rank: (self._words, self._order), **self._sources}
        for source, (words, order) in sorted(sources.items()):
            b.launch(gather_rows, t, t, self._plan, source, 1, order, words, self._width, self._inbox)

    def _enqueue_keep(self):
        b, t, size, w = self._b, self._threads, self._size, self._width
        b.launch(gather_rows, t, t, self._plan, size, size, self._order, self._words, w, self._scratch)
        b.launch(place_rows, t, t, self._plan, size, size, self._scratch, w, self._words, self._outbox.dest)

    def plan_keep(self, requests, starts, sent):
        """Fill the keep rows: per destination, the items not sent this time; set the
        outbox's counters to their number (uploaded by ``deliver``) and return it."""
        size, rows = self._size, self.rows
        kept = requests - sent
        rows[size:, 0] = kept
        rows[size:, 1] = starts + sent
        rows[size, 2] = 0
        rows[size + 1 :, 2] = np.cumsum(kept[:-1])
        total = int(kept.sum())
        self.state[ob.COUNT] = total
        self.state[ob.REFUSED] = 0
        return total

    def deliver(self):
        """Copy the self-send and the IPC peers' segments into the inbox; set the outbox counters."""
        self._deliver()

    def keep(self):
        """Move the kept items (keep rows) to the front of the outbox."""
        self._keep()
