"""Synthetic traffic for the forwarding benchmark: fill an outbox with a destination pattern."""

from rafi import device
from rafi._kernel import kernel
from rafi._targets import func

__all__ = ["UNIFORM", "RING", "HOT", "fill", "pattern_dest"]

UNIFORM, RING, HOT = 0, 1, 2


@kernel
def fill(i, outbox, rank, size, pattern, seed):
    """Push item ``i`` for the destination ``pattern`` gives it: its tag says who made it,
    and its body bytes are ``(tag + k) % 256``, so a receiver can check every byte."""
    d = pattern_dest(i, rank, size, pattern, seed)
    slot = device.push(outbox, d)
    if slot >= 0:
        tag = rank * 4294967296 + i
        item = outbox.items[slot]
        item.tag = tag
        for k in range(item.body.shape[0]):
            item.body[k] = (tag + k) % 256


@func
def pattern_dest(i, rank, size, pattern, seed):
    """Destination of item ``i``: a hash (uniform), the next rank (ring) or rank 0 (hot)."""
    if pattern == RING:
        return (rank + 1) % size
    if pattern == HOT:
        return 0
    h = (i * 2654435761 + rank * 40503 + seed * 97) % 4294967296
    h = (h ^ (h >> 13)) * 1274126177 % 4294967296
    return h % size
