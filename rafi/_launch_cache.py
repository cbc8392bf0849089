"""CUDA kernel launches without numba-cuda's per-launch work on arguments it has seen.

numba-cuda types every argument of every launch and marshals it into kernel parameters in
Python (a device array: seven words or more): 190 us a launch of the ray tracer's camera
kernel (10 arguments, two of them named tuples of arrays) on the H200 machine, where the
GPU runs the kernel in less. A program passes mostly the same objects launch after launch
(the outbox, a reduction, scene arrays): here each such object's numba type and
parameter words are kept, and once numba-cuda holds the kernel for the launch's argument
types, the launch goes to ``cuda.core`` directly.

Kept: numba-cuda device arrays (``DeviceNDArray``, and ``MappedNDArray``: mapped host memory;
a view never changes its pointer,
shape or strides) and (named) tuples of them, found by the identity of the arrays and
checked through weak references, so that nothing kept holds GPU memory or can stand for
a newer object at a reused address (at most ``_KEPT`` entries, then it starts afresh).
Numbers are typed and marshalled at every launch. Any other argument (a host array
numba-cuda would copy, a record) sends the launch through numba-cuda, as do kernels whose
code depends on the launch configuration, and anything this numba-cuda does not provide
(then every launch goes through it).
"""

import weakref

import numpy as np
from numba.cuda.cudadrv.devicearray import DeviceNDArray, MappedNDArray

try:
    from cuda.core import LaunchConfig
    from cuda.core import launch as _core_launch
    from numba.cuda._compat import CUDA_CORE_GE_1_0
except ImportError:  # another numba-cuda: launch through it
    _core_launch = None

__all__ = ["LaunchCache"]

_KEPT = 256  # argument entries, and launch configurations, per kernel
_NUMBERS = (int, float, bool, np.number, np.bool_)


class LaunchCache:
    """Launches of one numba-cuda kernel dispatcher on the default stream."""

    def __init__(self, dispatcher):
        self._dispatcher = dispatcher
        self._configs = {}  # (blocks, threads) -> [numba-cuda launch configuration, core config or None]
        self._kept = {}  # _key(argument) -> (weak references to its arrays, numba type, parameter words)
        self._kernels = {}  # argument types -> compiled kernel

    def launch(self, blocks, threads, args):
        """Launch ``blocks`` x ``threads`` with ``args`` on the default stream."""
        entry = self._configs.get((blocks, threads))
        if entry is None:
            if len(self._configs) >= _KEPT:
                self._configs.clear()
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
        if kernel is None or kernel.debug or kernel.extensions:
            return
        sensitive = getattr(kernel, "launch_config_sensitive", False)  # compiled per grid and block
        if sensitive or getattr(self._dispatcher, "_launch_config_sensitive", False):
            return
        self._kernels[types] = kernel

    def _marshal(self, args):
        """The launch's argument types and parameter words, or None when an argument is not
        a device array, a tuple of them, or a number."""
        types, words = [], []
        for arg in args:
            if isinstance(arg, _NUMBERS):
                marshalled = self._prepare(arg)
            else:
                key = _key(arg)
                if key is None:
                    return None
                marshalled = self._kept.get(key)
                if marshalled is None or not _alive(marshalled[0], arg):
                    marshalled = self._keep(key, arg)
            if marshalled is None:
                return None
            types.append(marshalled[1])
            words.extend(marshalled[2])
        return tuple(types), words

    def _prepare(self, arg):
        """``(None, numba type, parameter words)`` of ``arg``, or None when numba-cuda must
        launch (no kernel to marshal with yet, or something to copy back after the launch)."""
        kernel = next(iter(self._kernels.values()), None)  # marshalling depends on no kernel
        if kernel is None:
            return None
        kind, words, copies_back = self._dispatcher.typeof_pyval(arg), [], []
        kernel._prepare_args(kind, arg, 0, copies_back, words)
        return None if copies_back else (None, kind, words)

    def _keep(self, key, arg):
        prepared = self._prepare(arg)
        if prepared is None:
            return None
        if len(self._kept) >= _KEPT:
            self._kept.clear()
        kept = self._kept[key] = (_refs(arg), prepared[1], prepared[2])
        return kept


def _key(arg):
    """What identifies ``arg`` among kept arguments: its arrays' identities (and tuple
    classes), or None when it is not a device array or a non-empty tuple of them."""
    if _device_array(arg):
        return id(arg)
    if isinstance(arg, tuple) and arg:
        keys = tuple(_key(a) for a in arg)
        return None if None in keys else (type(arg), keys)
    return None


def _device_array(arg):
    """Whether ``arg`` is passed as its device pointer: a device array, or mapped host memory."""
    return type(arg) is DeviceNDArray or type(arg) is MappedNDArray


def _refs(arg):
    """Weak references to the arrays of ``arg``, in order."""
    return tuple(weakref.ref(array) for array in _arrays(arg))


def _alive(refs, arg):
    """Whether ``refs`` still name the arrays of ``arg`` (and not objects since gone)."""
    return all(ref() is array for ref, array in zip(refs, _arrays(arg), strict=True))


def _arrays(arg):
    """The device arrays of ``arg``, in order."""
    if _device_array(arg):
        return (arg,)
    return tuple(array for a in arg for array in _arrays(a))


def _core_config(configured, kernel):
    """The ``cuda.core`` launch configuration numba-cuda makes for ``configured``."""
    cooperative = {"is_cooperative" if CUDA_CORE_GE_1_0 else "cooperative_launch": kernel.cooperative}
    return LaunchConfig(
        grid=configured.griddim, block=configured.blockdim, shmem_size=configured.sharedmem, **cooperative
    )
