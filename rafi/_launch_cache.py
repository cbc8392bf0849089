"""CUDA kernel launches without numba-cuda's per-launch work on arguments it has seen.

numba-cuda types every argument of every launch and marshals it into kernel parameters in
Python (a device array: seven words or more): 190 us a launch of the ray tracer's camera
kernel (10 arguments, two of them named tuples of arrays) on the H200 machine, where the
GPU runs the kernel in less. A program passes mostly the same objects launch after launch
(the outbox, a reduction, scene arrays): here each such object's numba type and
parameter words are kept, and once numba-cuda holds the kernel for the launch's argument
types, the launch goes to ``cuda.core`` directly.

Kept: numba-cuda device arrays (``DeviceNDArray``: a view never changes its pointer,
shape or strides) and tuples of them, by identity, holding a reference so that no id is
reused while kept (at most ``_KEPT`` objects, then it starts afresh); numbers are typed
and marshalled at every launch. Any other argument (a host array numba-cuda would copy, a
record) sends the launch through numba-cuda, as does anything this numba-cuda does not
provide (then every launch goes through it).
"""

import numpy as np
from numba.cuda.cudadrv.devicearray import DeviceNDArray

try:
    from cuda.core import LaunchConfig
    from cuda.core import launch as _core_launch
    from numba.cuda._compat import CUDA_CORE_GE_1_0
except ImportError:  # another numba-cuda: launch through it
    _core_launch = None

__all__ = ["LaunchCache"]

_KEPT = 256
_NUMBERS = (int, float, bool, np.number, np.bool_)


class LaunchCache:
    """Launches of one numba-cuda kernel dispatcher on the default stream."""

    def __init__(self, dispatcher):
        self._dispatcher = dispatcher
        self._configs = {}  # (blocks, threads) -> (numba-cuda launch configuration, core config or None)
        self._kept = {}  # id -> (object, numba type, parameter words)
        self._kernels = {}  # argument types -> compiled kernel

    def launch(self, blocks, threads, args):
        """Launch ``blocks`` x ``threads`` with ``args`` on the default stream."""
        entry = self._configs.get((blocks, threads))
        if entry is None:
            entry = self._configs[blocks, threads] = [self._dispatcher[blocks, threads, 0], None]
        configured = entry[0]
        marshalled = self._marshal(args) if _core_launch is not None else None
        if marshalled is None:
            configured(*args)
            if not self._kernels and _core_launch is not None:  # one kernel to marshal with
                self._learn(tuple(self._dispatcher.typeof_pyval(a) for a in args))
            return
        types, words = marshalled
        kernel = self._kernels.get(types)
        if kernel is None:
            configured(*args)  # numba-cuda compiles or loads the kernel for these types
            self._learn(types)
            return
        if entry[1] is None:
            entry[1] = _core_config(configured, kernel)
        _core_launch(configured.stream, entry[1], kernel._codelibrary.get_cufunc().kernel, *words)

    def _learn(self, types):
        """Launch the kernel numba-cuda holds for ``types`` directly from now on."""
        kernel = self._dispatcher.overloads.get(types)
        if kernel is not None and not kernel.debug and not kernel.extensions:
            self._kernels[types] = kernel

    def _marshal(self, args):
        """The launch's argument types and parameter words, or None when an argument is not
        one kept or a number."""
        types, words = [], []
        for arg in args:
            kept = self._kept.get(id(arg))
            if kept is None or kept[0] is not arg:
                kept = self._keep(arg)
                if kept is None:
                    return None
            types.append(kept[1])
            words.extend(kept[2])
        return tuple(types), words

    def _keep(self, arg):
        numbers = isinstance(arg, _NUMBERS)
        if not (numbers or _device_arrays(arg)):
            return None
        kind = self._dispatcher.typeof_pyval(arg)
        kernel = next(iter(self._kernels.values()), None)
        if kernel is None:  # no compiled kernel to marshal with yet: numba-cuda launches
            return None
        words, retr = [], []
        kernel._prepare_args(kind, arg, 0, retr, words)
        if retr:  # numba-cuda would copy something back after the launch
            return None
        kept = (arg, kind, words)
        if not numbers:
            if len(self._kept) >= _KEPT:
                self._kept.clear()
            self._kept[id(arg)] = kept
        return kept


def _device_arrays(arg):
    """Whether ``arg`` is a numba-cuda device array or a (named) tuple of only those."""
    if type(arg) is DeviceNDArray:
        return True
    return isinstance(arg, tuple) and len(arg) > 0 and all(_device_arrays(a) for a in arg)


def _core_config(configured, kernel):
    """The ``cuda.core`` launch configuration numba-cuda makes for ``configured``."""
    cooperative = {"is_cooperative" if CUDA_CORE_GE_1_0 else "cooperative_launch": kernel.cooperative}
    return LaunchConfig(
        grid=configured.griddim, block=configured.blockdim, shmem_size=configured.sharedmem, **cooperative
    )
