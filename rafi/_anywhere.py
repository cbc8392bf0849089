"""``device.ANY``: items any rank may run, placed by load in the round that finds them.

The rule, computed alike on every rank from counts every rank has: let ``L[r]`` be the
items pushed for rank ``r`` this round (by every rank) and ``A`` the ``ANY`` items of all
ranks. Rank ``r`` receives ``a[r] = max(0, T - L[r])`` of them for the highest level
``T`` that needs no more than ``A`` (water-filling, so every inbox ends with about the
same number of items); the few left over go one each to the ranks at level ``T``, lowest
rank first. Then the ``ANY`` items, taken in rank order of their senders and in push order
within a sender, are dealt in that order: the first ``a[0]`` to rank 0, the next ``a[1]``
to rank 1, and so on. Each is given its rank on the device and moves as if pushed for it;
flow control applies as to any item, so none is lost and none is sent twice.

In ``mode="async"`` there are no rounds to balance: an ``ANY`` item runs where it was pushed.
"""

import numpy as np

from rafi.kernels import partition as kern

__all__ = ["Anywhere", "shares"]


def shares(loads, anywhere):
    """How many of ``anywhere`` items each rank takes, given its ``loads`` (see the rule)."""
    loads = np.asarray(loads, np.int64)
    if anywhere <= 0:
        return np.zeros_like(loads)
    lo, hi = int(loads.min()), int(loads.max()) + int(anywhere)  # f(lo) = 0 <= A < f(hi)
    while lo < hi:  # the highest level T with sum(max(0, T - L)) <= A
        mid = (lo + hi + 1) // 2
        if np.maximum(0, mid - loads).sum() <= anywhere:
            lo = mid
        else:
            hi = mid - 1
    share = np.maximum(0, lo - loads)
    left = int(anywhere - share.sum())  # fewer than the ranks at level T
    share[np.flatnonzero(loads <= lo)[:left]] += 1
    return share


class Anywhere:
    """Gives a forwarder's ``ANY`` items their ranks on the device (``kern.assign_anywhere``).

    Args:
        backend: the forwarder's backend; ``outbox``, ``order``: what the partition sorted.
        rank, size: this rank and the communicator's size.
    """

    def __init__(self, backend, outbox, order, rank, size):
        self._b, self._outbox, self._order = backend, outbox, order
        self._rank, self._size = rank, size
        self._bounds_host = np.zeros(size, np.int64)
        self._bounds = backend.zeros(size, np.int64) if backend.device_arrays else self._bounds_host
        self._loads = np.zeros((size, 2), np.int64)

    def place(self, summary, incoming, watch, comm, what):
        """Agree with every rank on where the ``ANY`` items go and give this rank's theirs.

        ``incoming``: the items pushed for this rank this round (by every rank). Collective.
        """
        mine = np.array([incoming, summary.anywhere], np.int64)
        watch.collective("Allgather", mine, self._loads, what=what, comm=comm)
        loads, anywhere = self._loads[:, 0], self._loads[:, 1]
        share = shares(loads, int(anywhere.sum()))
        self._bounds_host[:] = np.concatenate([[0], np.cumsum(share)[:-1]])
        first_global = int(anywhere[: self._rank].sum())
        self._assign(summary, first_global)

    def keep_here(self, summary):
        """``mode="async"``: this rank's ``ANY`` items are for this rank."""
        self._bounds_host[:] = np.where(np.arange(self._size) <= self._rank, 0, np.iinfo(np.int64).max)
        self._assign(summary, 0)

    def _assign(self, summary, first_global):
        b = self._b
        if b.device_arrays:
            b.to_device(self._bounds_host, self._bounds)
        args = (
            self._order,
            summary.anywhere_start,
            self._outbox.dest,
            first_global,
            self._bounds,
            self._size,
        )
        b.launch(kern.assign_anywhere, summary.anywhere, *args)
