"""The device API, called inside kernels on every backend.

::

    slot = device.push(outbox, dest)        # one slot for dest; its index, or -1 if full
    base = device.reserve(outbox, n, dest)  # n consecutive slots; the first index, or -1
    ok = device.emit(outbox, item, dest)    # copy a whole record; False if full
    outbox.items[slot].field = value        # fill a reserved slot
    device.contribute(red, index, value)    # combine into an entry of a rafi.Reducer
"""

from rafi.kernels.outbox import emit, push, reserve
from rafi.kernels.reduce import contribute

__all__ = ["push", "reserve", "emit", "contribute"]
