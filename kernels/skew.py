"""A workload with skewed per-item cost, for comparing bulk-synchronous and async forwarding.

Every item makes ``hops`` stops; at each it costs ``cost * spin`` rounds of integer
hashing. Rank 0's items first stay on rank 0 for ``heavy_hops`` stops costing ``heavy``
each (a hot spot that lasts a while), then wander over all ranks at cost 1; the other
ranks' items wander over ranks ``1..size-1`` at cost 1 all along.
"""

import numpy as np

from rafi import device
from rafi._kernel import kernel
from rafi._targets import func

__all__ = ["Item", "seed", "step", "DONE", "REFUSED"]

DONE, REFUSED = 0, 1  # words of ``step``'s tally

Item = np.dtype([("id", "i8"), ("hop", "i4"), ("hops", "i4"), ("acc", "u4"), ("home", "i4")], align=True)


@func
def mix(x):
    """A 32-bit integer hash (one round of work)."""
    x = (x ^ (x >> 16)) * 73244475 % 4294967296
    x = (x ^ (x >> 16)) * 73244475 % 4294967296
    return x ^ (x >> 16)


@func
def next_stop(home, hop, heavy_hops, key, size):
    """Where an item goes after stop ``hop``: see the module docstring."""
    if home == 0:
        if hop + 1 < heavy_hops:
            return 0
        return key % size
    return 1 + key % (size - 1)


@kernel
def seed(i, outbox, rank, size, hops, heavy_hops):
    """Make item ``i`` of this rank and send it to its first stop."""
    slot = device.push(outbox, next_stop(rank, -1, heavy_hops, rank + i, size))
    if slot >= 0:
        it = outbox.items[slot]
        it.id = rank * 1000000000 + i
        it.hop = 0
        it.hops = hops
        it.acc = 0
        it.home = rank


@kernel
def step(i, inbox, outbox, size, spin, heavy, heavy_hops, tally):
    """Do the item's work here, then send it on, or count it done (``tally[DONE]``); count
    an item the full outbox refused in ``tally[REFUSED]``."""
    it = inbox[i]
    cost = heavy if it.home == 0 and it.hop < heavy_hops else 1
    x = it.acc + it.id % 4294967296
    for _ in range(cost * spin):
        x = mix(x)
    if it.hop + 1 >= it.hops:
        device.atomic_add(tally, DONE, 1)
        return
    slot = device.push(outbox, next_stop(it.home, it.hop, heavy_hops, mix(it.id % 4294967296 + it.hop), size))
    if slot < 0:
        device.atomic_add(tally, REFUSED, 1)
        return
    out = outbox.items[slot]
    out.id = it.id
    out.hop = it.hop + 1
    out.hops = it.hops
    out.acc = x
    out.home = it.home
