"""Host side of the partition step: owns its scratch buffers, replays kernels/partition.py.

A round's partition is one replay (a CUDA graph on a GPU with CuPy): count, scan,
summarize, scatter (by tiles, ``kernels/multisplit.py``, or by chunks when there are too
many destinations for a tile's table; a small outbox by one block in one launch), and one
small copy to the host of the per-destination segment starts, the outbox counters and an
invalid example; on the cpu backend, one compiled call. No buffer is allocated after
construction: the ``Summary`` is rewritten in place each round.
"""

import numba
import numpy as np

from rafi.kernels import partition as kern
from rafi.kernels.outbox import COUNT, REFUSED

__all__ = ["Partitioner", "Summary"]


class Summary:
    """What the partition tells the host: per-destination counts and the outbox counters.

    ``update`` rewrites it from the partition's summary words, allocating nothing.
    """

    def __init__(self, size, capacity):
        self._size, self._capacity = size, capacity
        self.starts = np.zeros(size, np.int64)  # first sorted slot of each destination
        self.requests = np.zeros(size, np.int64)  # items for each destination
        self.valid = self.invalid = self.pushed = self.refused = self.example = 0
        self.anywhere = self.anywhere_start = 0  # items for ANY, and their first sorted slot

    def update(self, words):
        # valid: items with a valid destination, ANY included; pushed: slots in use
        self.anywhere_start, self.valid, total, pushed, self.refused, self.example = _unpack(
            words, self.starts, self.requests
        )
        self.anywhere = self.valid - self.anywhere_start
        self.invalid = total - self.valid
        self.pushed = min(pushed, self._capacity)
        return self


@numba.njit(nogil=True, cache=True)
def _unpack(words, starts, requests):
    """Per-destination starts and counts into ``starts`` and ``requests``; return the scalar
    words: ANY's first sorted slot, valid items, all items, slots used, refused, example
    (one compiled call: the host path of a round is made of such microseconds)."""
    size = len(starts)
    for p in range(size):
        starts[p] = words[p]
        requests[p] = words[p + 1] - words[p]
    last = size + 2  # kernels/partition.py::rows
    return words[size], words[size + 1], words[last], words[last + 1], words[last + 2], words[last + 3]


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
        self._serial = backend.name == "cpu"
        self._tiles = 0 if self._serial else backend.multisplit.tiles(capacity, size)
        self.nchunks = self._tiles or backend.partition_chunks(capacity, size)
        rows = kern.rows(size)
        self._outbox = outbox
        self._words = words
        self._counts = backend.zeros(rows * self.nchunks, np.int64)
        self._cursors = backend.zeros(rows * self.nchunks + 1, np.int64)
        self._info = backend.zeros(kern.INFO_LEN, np.int64)
        self._summary = backend.zeros(kern.summary_len(size), np.int64)
        self._summary_host = backend.host_buffer(kern.summary_len(size), np.int64)
        self.summary = Summary(size, capacity)
        self.order = order
        self.packed = backend.zeros(capacity * width, word)
        self._replay = backend.graph(self._enqueue)

    def _enqueue(self):
        b, size, nchunks, outbox = self.backend, self.size, self.nchunks, self._outbox
        if self._serial:
            sort = (outbox.dest, outbox.state, self.capacity, size, self.order, self._words, self.width)
            kern.serial_partition(*sort, self.packed, self.pack, self._summary_host)
            if self._then is not None:
                self._then(self._summary_host, self.order)
            return
        walk = (outbox.dest, outbox.state, self.capacity, size, nchunks)  # both count and scatter
        tiles = b.multisplit if self._tiles else None
        if tiles and nchunks <= tiles.SMALL:  # one launch does it all
            scatter = (self.order, self._words, self.width, self.packed, int(self.pack), self._info)
            b.launch_blocks(tiles.partition_block, 1, tiles.THREADS, *walk, *scatter, self._summary)
            self._after_summary()
            return
        if tiles:
            b.launch_blocks(tiles.count_tiles, nchunks, tiles.THREADS, *walk, self._counts, self._info)
        else:
            b.launch(kern.count_chunks, nchunks, *walk, self._counts, self._info)
        b.scan(self._counts, kern.rows(size) * nchunks, self._cursors)
        summary = (self._cursors, nchunks, size, outbox.state, COUNT, REFUSED, self._info, self._summary)
        b.launch(kern.summarize, kern.rows(size) + 1, *summary)
        scatter = (self._cursors, self.order, self._words, self.width, self.packed, int(self.pack))
        if tiles:
            b.launch_blocks(tiles.scatter_tiles, nchunks, tiles.THREADS, *walk, *scatter)
        else:
            b.launch(kern.scatter_chunks, nchunks, *walk, *scatter)
        self._after_summary()

    def _after_summary(self):
        if self._then is not None:
            self._then(self._summary, self.order)
        self.backend.to_host(self._summary, self._summary_host)

    def run(self):
        """Sort the outbox by destination; return a ``Summary`` once the host can read it."""
        self._replay()
        self.backend.synchronize()
        return self.summary.update(self._summary_host)
