"""Which stores carry items to the node's other ranks on the cpu backend: a probe at start.

A rank of resident rounds writes the items it sends to a rank of its node straight into
that rank's inbox (kernels/resident.py), which the receiver read a round before. Two kinds
of store can do it, and which is faster is a property of the machine, not of the program:

- ``cached``: ordinary stores. Each takes the line from the receiver's core first (its
  copy, read last round, is invalidated), then the receiver reads the line from the
  sender's cache. On the CPU machine of 2026-12-07 (2 vCPUs of an Intel Xeon, KVM) the
  ring's 1000 x 64 B round: delivery 10 us, the step 9 us.
- ``streaming``: non-temporal stores, which take no line from anywhere and write to
  memory; the receiver reads the items from memory. Same machine and round: delivery 16
  us, the step 29 us. Where a line taken from another core costs much (2 vCPUs of an AMD
  EPYC, 2026-12-07), streaming halved the delivery against staging the items for the
  receivers to pull (kernels/resident.py's ``PUSH_BYTES``).

The probe runs both in a ring over the node's inboxes (node rank ``j`` writes into rank
``j + 1``'s, then reads its own), the same bytes a round of 1000 items moves, and takes
the kind with the smaller median of write plus read, summed over the node (every rank of
the node takes the same): about a millisecond once a forwarder (0.9 ms at 2 ranks, 2.4 at
4 ranks on the machine's 2 cores; a process's first probe also loads numba's compiled
code, which the persistent launcher would load next). ``RAFI_NODE_STORES`` chooses
instead. Past ``STREAM_BYTES`` a round is streamed either way (kernels/streaming.py).
"""

import time

import numba
import numpy as np

from rafi.kernels.streaming import stream_fence, stream_store

from .._config import env_node_stores
from .._mpi_support import allgather

__all__ = ["node_stores"]

PROBE_BYTES = 1 << 16  # what the probe moves a rank: the ring's 1000 x 64 B round
_LEAST = 1 << 12  # an inbox smaller than this (in bytes) moves too little for the kind to matter
_TRIALS = 7  # timed rounds of the probe per kind (the median)
_KINDS = ("cached", "streaming")


@numba.njit(nogil=True, cache=True)
def _write(box, value, streaming):
    if streaming:
        for w in range(box.size):
            stream_store(box, w, value + w)
        stream_fence()
    else:
        for w in range(box.size):
            box[w] = value + w


@numba.njit(nogil=True, cache=True)
def _read(box):
    total = 0
    for w in range(box.size):
        total += box[w]
    return total


def node_stores(node, boxes, slot, watch):
    """``"cached"`` or ``"streaming"``: ``RAFI_NODE_STORES``, else the probe's choice, the
    same on every rank of ``node`` (collective over it). ``boxes``: every node rank's inbox
    (uint8 views, this rank's at ``slot``), which the probe writes and leaves zeroed."""
    chosen = env_node_stores()
    if chosen != "auto":
        return chosen
    ranks = node.Get_size()
    nbytes = min(PROBE_BYTES, boxes[slot].size) // 8 * 8
    if ranks < 2 or nbytes < _LEAST:
        return "cached"  # no peer, or rounds too small for the kind to matter
    mine = boxes[slot][:nbytes].view(np.uint64)
    onward = boxes[(slot + 1) % ranks][:nbytes].view(np.uint64)
    what = "Forwarder() (probing the node's memory)"
    medians = []
    for streaming in (False, True):
        seconds = []
        for trial in range(_TRIALS + 1):  # the first: compilation (or the disk cache), first touch
            watch.collective("Barrier", what=what, comm=node)
            started = time.perf_counter()
            _write(onward, trial, streaming)
            wrote = time.perf_counter() - started
            watch.collective("Barrier", what=what, comm=node)
            started = time.perf_counter()
            _read(mine)
            seconds.append(wrote + time.perf_counter() - started)
        medians.append(float(np.median(seconds[1:])))
    watch.collective("Barrier", what=what, comm=node)  # every read done before any zeroing
    mine[:] = 0
    cached, streamed = np.sum(allgather(node, medians, what, watch), axis=0)
    return "cached" if cached <= streamed else "streaming"
