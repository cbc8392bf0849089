"""Random walkers: the device code of rafi/examples/forward.py."""

import numpy as np

from rafi import device
from rafi._kernel import kernel
from rafi._targets import func

__all__ = ["Walker", "seed", "step"]

Walker = np.dtype([("id", "i8"), ("steps", "i4"), ("home", "i4"), ("x", "f8")], align=True)


@func
def next_rank(walker_id, steps, size):
    """A hash of (walker, step): where the walker goes next."""
    walker_id, steps = int(walker_id), int(steps)  # 64-bit math, also on int32 record fields
    h = (walker_id * 2654435761 + steps * 40503) % 4294967296
    h = (h ^ (h >> 15)) * 2246822519 % 4294967296
    return h % size


@kernel
def seed(i, outbox, rank, size):
    """Start walker ``i`` of this rank and send it on its first hop."""
    wid = rank + i * size  # walker ids interleave ranks: 0 .. size * n - 1
    slot = device.push(outbox, next_rank(wid, 0, size))
    if slot >= 0:
        w = outbox.items[slot]
        w.id = wid
        w.steps = 1
        w.home = rank
        w.x = 0.0


@kernel
def step(i, inbox, outbox, rank, size, steps, arrived):
    """Move walker ``i`` of the inbox on, or flag it as arrived after ``steps`` hops."""
    w = inbox[i]
    if w.steps >= steps:
        arrived[i] = 1
        return
    slot = device.push(outbox, next_rank(w.id, w.steps, size))
    if slot >= 0:
        o = outbox.items[slot]
        o.id = w.id
        o.steps = w.steps + 1
        o.home = w.home
        o.x = w.x + 1.0
