"""``device.contribute``: add (or max/min) a value into a reduction from inside a kernel.

A reduction, as kernels see it, is a named tuple of ``partial`` (this rank's dense
partial result over the whole index range, combined into the owners' blocks at flush),
``errors`` (int64: count of out-of-range indices, and one of them) and ``op`` (int64[1]:
SUM, MAX or MIN). On CUDA the update is an atomic; on the cpu backend a launch is one
serial loop; under the simulator the plain body runs under a lock.
"""

import collections
import threading

from rafi._targets import overload_targets

__all__ = ["Reduction", "SUM", "MAX", "MIN", "contribute"]

Reduction = collections.namedtuple("Reduction", ["partial", "errors", "op"])

SUM, MAX, MIN = 0, 1, 2
_LOCK = threading.Lock()


def contribute(red, index, value):
    """Combine ``value`` into entry ``index``; a bad index is counted, never written."""
    with _LOCK:
        _serial_contribute(red, index, value)


def _serial_contribute(red, index, value):
    if index < 0 or index >= red.partial.shape[0]:
        red.errors[0] += 1
        red.errors[1] = index
        return
    op = red.op[0]
    if op == SUM:
        red.partial[index] += value
    elif op == MAX:
        red.partial[index] = max(red.partial[index], value)
    else:
        red.partial[index] = min(red.partial[index], value)


def _cuda_contribute(red, index, value):
    from numba import cuda

    def impl(red, index, value):
        if index < 0 or index >= red.partial.shape[0]:
            cuda.atomic.add(red.errors, 0, 1)
            red.errors[1] = index
            return
        op = red.op[0]
        if op == SUM:
            cuda.atomic.add(red.partial, index, value)
        elif op == MAX:
            cuda.atomic.max(red.partial, index, value)
        else:
            cuda.atomic.min(red.partial, index, value)

    return impl


overload_targets(contribute, lambda red, index, value: _serial_contribute, _cuda_contribute)
