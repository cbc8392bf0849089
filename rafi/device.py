"""The device API, called inside kernels on every backend.

::

    slot = device.push(outbox, dest)        # one slot for dest; its index, or -1 if full
    slot = device.push(outbox, device.ANY)  # an item any rank may run: forward() places it by load
    base = device.reserve(outbox, n, dest)  # n consecutive slots; the first index, or -1
    ok = device.emit(outbox, item, dest)    # copy a whole record; False if full
    outbox.items[slot].field = value        # fill a reserved slot
    device.contribute(red, index, value)    # combine into an entry of a rafi.Reducer
    old = device.atomic_add(array, index, v)  # (and atomic_max, atomic_min) on every backend
    u = device.random(seed, stream, counter)  # uniform in [0, 1): the same stream on every backend
"""

from rafi.kernels.atomics import atomic_add, atomic_max, atomic_min
from rafi.kernels.counter_rng import random
from rafi.kernels.outbox import ANY, emit, push, reserve
from rafi.kernels.reduce import contribute

__all__ = ["ANY", "push", "reserve", "emit", "contribute", "atomic_add", "atomic_max", "atomic_min", "random"]
