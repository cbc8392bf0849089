"""The outbox a kernel pushes into, and the device API that fills it.

An outbox is a named tuple of three arrays, passed to kernels as one argument:

- ``items``: the records, ``capacity`` of them;
- ``dest``: the destination rank of each slot (int32; a destination outside int32's range
  is stored as ``WIDE``, an invalid destination, rather than wrapping into a rank);
- ``state``: int64 counters, ``state[COUNT]`` slots handed out (it may run past the
  capacity: every slot below ``min(count, capacity)`` belongs to a successful push) and
  ``state[REFUSED]`` items refused because the outbox was full.

``push``, ``reserve`` and ``emit`` are plain Python functions (the simulator runs them as
they are, under a lock) with an njit implementation (the cpu backend runs a launch as
one serial loop, so no atomics) and a CUDA implementation (atomics, compare-and-swap).
"""

import collections
import threading

from rafi._targets import overload_targets
from rafi.kernels.records import copy_record

__all__ = ["Outbox", "ANY", "COUNT", "REFUSED", "STATE_LEN", "WIDE", "push", "reserve", "emit"]

Outbox = collections.namedtuple("Outbox", ["items", "dest", "state"])

COUNT = 0
REFUSED = 1
STATE_LEN = 2
ANY = -2  # a destination: any rank may run the item; forward() places it by load (_anywhere)
WIDE = -(2**31)  # stored for a destination int32 cannot hold (2**32 + 1 would wrap to rank 1)

_LOCK = threading.Lock()  # the simulator runs one OS thread per CUDA thread


def push(outbox, dest):
    """Reserve one slot for ``dest``; return its index, or -1 if the outbox is full."""
    return reserve(outbox, 1, dest)


def reserve(outbox, n, dest):
    """Reserve ``n`` consecutive slots for ``dest``; return the first index, or -1 if full."""
    with _LOCK:
        return _serial_reserve(outbox, n, dest)


def emit(outbox, item, dest):
    """Copy the whole record ``item`` into a new slot for ``dest``; return False if full."""
    slot = push(outbox, dest)
    if slot < 0:
        return False
    raw = item
    while hasattr(raw, "_item") or hasattr(raw, "_ary"):  # unwrap the simulator's array wrappers
        raw = raw._item if hasattr(raw, "_item") else raw._ary
    outbox.items[slot] = raw
    return True


# ----------------------------------------------------------------------------- njit (cpu)


def _serial_reserve(outbox, n, dest):
    """``reserve`` for one thread at a time: the njit version, and the simulator's under a lock."""
    base = outbox.state[COUNT]
    if base + n > outbox.items.shape[0]:
        outbox.state[REFUSED] += n
        return -1
    outbox.state[COUNT] = base + n
    for k in range(n):
        outbox.dest[base + k] = dest if WIDE < dest < 2**31 else WIDE
    return base


def _cpu_push(outbox, dest):
    return reserve(outbox, 1, dest)


# ----------------------------------------------------------------------------- CUDA


def _cuda_push(outbox, dest):
    from numba import cuda

    def impl(outbox, dest):
        slot = cuda.atomic.add(outbox.state, COUNT, 1)
        if slot >= outbox.items.shape[0]:
            cuda.atomic.add(outbox.state, REFUSED, 1)
            return -1
        outbox.dest[slot] = dest if WIDE < dest < 2**31 else WIDE
        return slot

    return impl


def _cuda_reserve(outbox, n, dest):
    from numba import cuda

    def impl(outbox, n, dest):
        capacity = outbox.items.shape[0]
        base = outbox.state[COUNT]
        while True:
            if base + n > capacity:
                cuda.atomic.add(outbox.state, REFUSED, n)
                return -1
            seen = cuda.atomic.cas(outbox.state, COUNT, base, base + n)
            if seen == base:
                break
            base = seen
        for k in range(n):
            outbox.dest[base + k] = dest if WIDE < dest < 2**31 else WIDE
        return base

    return impl


# ----------------------------------------------------------------------------- emit, both


def _emit_typer(outbox, item, dest):
    from numba.core import types

    if not isinstance(item, types.Record) or item.dtype != outbox[0].dtype.dtype:
        return None

    def impl(outbox, item, dest):
        slot = push(outbox, dest)
        if slot < 0:
            return False
        copy_record(outbox.items[slot], item)
        return True

    return impl


overload_targets(reserve, lambda outbox, n, dest: _serial_reserve, _cuda_reserve)
overload_targets(push, lambda outbox, dest: _cpu_push, _cuda_push)
overload_targets(emit, _emit_typer, _emit_typer)
