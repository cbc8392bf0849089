"""Host side of the partition step: owns its scratch buffers, replays kernels/partition.py.

A round's partition is one replay (a CUDA graph on a GPU with CuPy): count, scan,
summarize, scatter, and one small copy to the host of the per-destination segment starts,
the outbox counters and an invalid example. No buffer is allocated after construction.
"""

import numpy as np

from rafi.kernels import partition as kern
from rafi.kernels.outbox import COUNT, REFUSED

__all__ = ["Partitioner", "Summary"]


class Summary:
    """What the partition tells the host: per-destination counts and the outbox counters."""

    def __init__(self, words, size, capacity):
        starts = words[: size + 2]
        self.starts = starts[:size].copy()  # first sorted slot of each destination
        self.requests = np.diff(starts[: size + 1])  # items for each destination
        self.valid = int(starts[size])  # items with a valid destination
        self.invalid = int(starts[size + 1] - starts[size])
        self.pushed = min(int(words[size + 2]), capacity)  # slots in use
        self.refused = int(words[size + 3])
        self.example = int(words[size + 4])


class Partitioner:
    """Stable counting sort of an outbox by destination, on the forwarder's backend.

    After ``run``, ``order[slot]`` is the outbox slot of the item in sorted slot ``slot``;
    with ``pack``, ``packed`` also holds the records themselves in sorted order (what an
    MPI transport sends). ``packed`` is scratch space between rounds either way. ``then``,
    if given, enqueues more work into the same replay, before the summary goes to the host:
    ``then(summary, order)``, with the summary still on the device.
    """

    def __init__(self, backend, outbox, words, order, size, capacity, width, word, pack, then=None):
        self.backend = backend
        self.size = size
        self.capacity = capacity
        self.width = width
        self.pack = bool(pack)
        self._then = then
        self.nchunks = backend.partition_chunks(capacity, size)
        rows = size + 1
        self._outbox = outbox
        self._words = words
        self._counts = backend.zeros(rows * self.nchunks, np.int64)
        self._cursors = backend.zeros(rows * self.nchunks + 1, np.int64)
        self._info = backend.zeros(kern.INFO_LEN, np.int64)
        self._summary = backend.zeros(size + 5, np.int64)
        self._summary_host = backend.host_buffer(size + 5, np.int64)
        self.order = order
        self.packed = backend.zeros(capacity * width, word)
        self._replay = backend.graph(self._enqueue)

    def _enqueue(self):
        b, size, nchunks, outbox = self.backend, self.size, self.nchunks, self._outbox
        walk = (outbox.dest, outbox.state, self.capacity, size, nchunks)  # both chunk kernels
        b.launch(kern.count_chunks, nchunks, *walk, self._counts, self._info)
        b.scan(self._counts, (size + 1) * nchunks, self._cursors)
        summary = (self._cursors, nchunks, size, outbox.state, COUNT, REFUSED, self._info, self._summary)
        b.launch(kern.summarize, size + 2, *summary)
        scatter = (self._cursors, self.order, self._words, self.width, self.packed, int(self.pack))
        b.launch(kern.scatter_chunks, nchunks, *walk, *scatter)
        if self._then is not None:
            self._then(self._summary, self.order)
        b.to_host(self._summary, self._summary_host)

    def run(self):
        """Sort the outbox by destination; return a ``Summary`` once the host can read it."""
        self._replay()
        self.backend.synchronize()
        return Summary(self._summary_host, self.size, self.capacity)
