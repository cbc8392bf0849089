"""``device.atomic_add``, ``atomic_max``, ``atomic_min``: read-modify-write of one array entry,
correct on every backend; each returns the entry's old value.

On CUDA they are numba-cuda's atomics; on the cpu backend a launch is one serial loop, so
the plain update is already atomic; under the simulator the plain body runs under a lock
(the simulator runs one OS thread per CUDA thread).
"""

import threading

from rafi._targets import overload_targets

__all__ = ["atomic_add", "atomic_max", "atomic_min"]

_LOCK = threading.Lock()


def _serial_add(array, index, value):
    old = array[index]
    array[index] = old + value
    return old


def _serial_max(array, index, value):
    old = array[index]
    array[index] = max(old, value)
    return old


def _serial_min(array, index, value):
    old = array[index]
    array[index] = min(old, value)
    return old


def atomic_add(array, index, value):
    """``array[index] += value`` atomically; return the old value."""
    with _LOCK:
        return _serial_add(array, index, value)


def atomic_max(array, index, value):
    """``array[index] = max(array[index], value)`` atomically; return the old value."""
    with _LOCK:
        return _serial_max(array, index, value)


def atomic_min(array, index, value):
    """``array[index] = min(array[index], value)`` atomically; return the old value."""
    with _LOCK:
        return _serial_min(array, index, value)


def _cuda_add(array, index, value):
    from numba import cuda

    return lambda array, index, value: cuda.atomic.add(array, index, value)


def _cuda_max(array, index, value):
    from numba import cuda

    return lambda array, index, value: cuda.atomic.max(array, index, value)


def _cuda_min(array, index, value):
    from numba import cuda

    return lambda array, index, value: cuda.atomic.min(array, index, value)


overload_targets(atomic_add, lambda array, index, value: _serial_add, _cuda_add)
overload_targets(atomic_max, lambda array, index, value: _serial_max, _cuda_max)
overload_targets(atomic_min, lambda array, index, value: _serial_min, _cuda_min)
