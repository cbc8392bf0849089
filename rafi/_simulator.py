"""A fix for numba-cuda's CUDA simulator, applied while rafi runs kernels there.

The simulator runs every CUDA thread of a block as an OS thread, and creates a block's
``cuda.shared.array`` on first use with an unlocked check-then-create
(``FakeCUDAShared.array`` in ``numba/cuda/simulator/kernelapi.py``): when the interpreter
switches threads between the lookup and the store, threads of one block get different
"shared" arrays, and a scan reads memory no thread wrote (rare wrong partition counts,
phantom items and hangs under the simulator, never on a GPU). ``shared_arrays_atomic``
replaces that method with one that looks up and creates under a lock. Allocations are
still keyed by the caller's file and line, as the simulator does.
"""

import sys
import threading

__all__ = ["shared_arrays_atomic"]

_lock = threading.Lock()


def shared_arrays_atomic():
    """Make the simulator's shared-array allocation atomic (idempotent)."""
    from numba.cuda.simulator import kernelapi

    shared = kernelapi.FakeCUDAShared
    if getattr(shared.array, "atomic", False):
        return
    unlocked = shared.array

    def array(self, shape, dtype, alignment=None):
        if alignment is not None or shape == 0:  # refused, or the dynamic buffer: no lookup
            return unlocked(self, shape, dtype, alignment)
        frame = sys._getframe(1)
        caller = (frame.f_code.co_filename, frame.f_lineno)
        with _lock:
            allocation = self._allocations.get(caller)
            if allocation is None:
                if isinstance(dtype, kernelapi.types.Type):
                    dtype = kernelapi.numpy_support.as_dtype(dtype)
                allocation = kernelapi.np.empty(shape, dtype)
                self._allocations[caller] = allocation
        return allocation

    array.atomic = True
    array.unlocked = unlocked  # the simulator's own, for the test that shows the race
    shared.array = array
