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
Numbers are typed and marshalled at every launch (a Python int in int64's range here,
as numba-cuda would: ``int64``, one ``c_int64``). Any other argument (a host array
numba-cuda would copy, a record) sends the launch through numba-cuda, as do kernels whose
code depends on the launch configuration, and anything this numba-cuda does not provide
(then every launch goes through it).

A launch whose arguments are all kept arrays (or tuples of them) and Python ints goes
further: its parameter block (the words, and the array of their addresses the driver
reads) is made once and launched with one ``cuLaunchKernel``, the ints written into their
words in place (``_Block``). ``cuda.core``'s launch turns every word into a parameter again
at every launch: for the resident kernel's some 100 words, 25 us more a launch (H100). The
block launched last is tried first, its arrays compared by identity (``_Block.matches``):
a loop that launches a kernel with the same arrays pays 3 us of Python a launch of 21
arguments, not the 13 of the arguments' signature and its lookup (CPU machine).

A contiguous flat array that shares its memory object (``gpu_data``) with the block's, of
the same class and dtype, is the same array at another length: the block takes it, its
length written into its words at the launch (not a bound launch's block, ``bound``). A
forwarder's inbox views are such arrays (``fwd.inbox`` after each ``forward()``: a new
count each round), so that a loop that launches its step on the inbox does not make a
block a round (36 us and more).
"""

import ctypes
import threading
import weakref

import numpy as np
from numba.core import types as _types
from numba.cuda.cudadrv.devicearray import DeviceNDArray, MappedNDArray

try:
    from cuda.core import LaunchConfig
    from cuda.core import launch as _core_launch
    from numba.cuda._compat import CUDA_CORE_GE_1_0
except ImportError:  # another numba-cuda: launch through it
    _core_launch = None
try:
    from cuda.bindings import driver as _driver
except ImportError:  # launches go through cuda.core
    _driver = None

__all__ = ["LaunchCache"]

_KEPT = 256  # argument entries, and launch configurations, per kernel
_NUMBERS = (int, float, bool, np.number, np.bool_)
_INT64, _INT64_MIN, _INT64_MAX = _types.int64, -(2**63), 2**63 - 1  # a Python int numba-cuda types as int64


class LaunchCache:
    """Launches of one numba-cuda kernel dispatcher on the default stream."""

    def __init__(self, dispatcher):
        self._dispatcher = dispatcher
        self._configs = {}  # (blocks, threads) -> [numba-cuda launch configuration, core config or None]
        self._kept = {}  # _key(argument) -> (weak references to its arrays, numba type, parameter words)
        self._kernels = {}  # argument types -> compiled kernel
        self._blocks = {}  # _signature(arguments) -> _Block
        self._last = None  # the _Block launched last, tried first (``_Block.matches``)

    def launch_prepared(self, blocks, threads, args):
        """Launch as ``launch`` does where a parameter block for ``args`` is made (nothing
        to compile, no warning to expect): return whether it launched."""
        block = self._last
        if block is None or not block.matches(args):
            block = self._blocks.get(_signature(args))
            if block is None or not block.fits(args):
                return False
            self._last = block
        block.launch(blocks, threads, args, resized=True)
        return True

    def bound(self, blocks, threads, args):
        """A launch of ``blocks`` x ``threads`` with arguments like ``args`` (``f(*args)``)
        that skips ``launch_prepared``'s checks, or None until a launch has made the parameter
        block of ``args``: for a caller whose arrays stay these objects for as long as it
        launches, and whose ints fit int64 (``matches`` costs 3 us a launch of the resident
        kernel's 21 arguments on the CPU machine)."""
        block = self._blocks.get(_signature(args))
        if block is None or not block.fits(args, resizable=False):
            return None
        block.pin()  # its launches write no lengths: no other launch may change them

        def launch(*call):
            block.launch(blocks, threads, call)

        return launch

    def launch(self, blocks, threads, args):
        """Launch ``blocks`` x ``threads`` with ``args`` on the default stream."""
        if self.launch_prepared(blocks, threads, args):
            return
        signature = _signature(args)
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
        types, words, numbers, starts = marshalled
        kernel = self._kernels.get(types)
        if kernel is None:
            configured(*args)  # numba-cuda compiles or loads the kernel for these types
            self._learn(types)
            return
        if signature is not None and _driver is not None and configured.sharedmem == 0:
            block = _Block.make(kernel, args, words, numbers, starts)
            if block is not None:
                if len(self._blocks) >= _KEPT:
                    self._blocks.clear()
                self._blocks[signature] = self._last = block
                block.launch(blocks, threads, args)
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
        """The launch's argument types, parameter words, ``(position, word)`` of each Python
        int and where each argument's words begin, or None when an argument is not a device
        array, a tuple of them, or a number."""
        types, words, numbers, starts = [], [], [], []
        for position, arg in enumerate(args):
            starts.append(len(words))
            if type(arg) is int and _INT64_MIN <= arg <= _INT64_MAX:  # most numbers: one word, made here
                types.append(_INT64)
                numbers.append((position, ctypes.c_int64(arg)))
                words.append(numbers[-1][1])
                continue
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
        return tuple(types), words, numbers, starts

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


class _Block:
    """A kernel's parameter block for one signature of arguments: the words (the arrays'
    kept ones, and one of its own per Python int, rewritten at each launch) and the array
    of their addresses that ``cuLaunchKernel`` reads."""

    __slots__ = (
        "_function", "_cooperative", "_refs", "_kinds", "_flat", "_words", "_numbers", "_params", "_address",
        "_lock",
    )  # fmt: skip

    @classmethod
    def make(cls, kernel, args, words, numbers, starts):
        """The block of ``args`` (marshalled as ``words``, each argument's beginning at
        ``starts``), or None when a word is neither a ctypes value nor a Python int or bool
        (then cuda.core launches)."""
        if len(numbers) != sum(type(arg) is int for arg in args):  # an int beyond int64: its own words
            return None
        words = [_word(w) for w in words]
        if None in words:
            return None
        block = cls()
        block._function = _driver.CUfunction(int(kernel._codelibrary.get_cufunc().handle))
        block._cooperative = bool(kernel.cooperative)
        block._refs = [None if type(arg) is int else _ref(arg) for arg in args]
        block._kinds = tuple(_kind(arg) for arg in args)
        # contiguous flat arrays (numba types a 1-item array as contiguous whatever its
        # stride): position -> (their memory, class, dtype, strides, length words)
        block._flat = {
            position: _Flat(arg, words[starts[position] + 2], words[starts[position] + 5])
            for position, arg in enumerate(args)
            if _device_array(arg) and arg.ndim == 1 and arg.strides == (arg.dtype.itemsize,)
        }
        block._words, block._numbers = words, numbers
        block._params = (ctypes.c_void_p * len(words))(*[ctypes.addressof(w) for w in words])
        block._address = ctypes.addressof(block._params)
        block._lock = threading.Lock()  # an async forwarder's progress thread launches too
        return block

    def matches(self, args):
        """Whether ``args`` are this block's, checked without their signature (a third of
        the time of ``_signature`` and ``fits``, for a launch with the arguments of the one
        before): as many, ints that fit int64 where it has ints, the same arrays, alive (or
        a flat one at another length), where it has arrays or flat tuples of them (of the
        same class). False where it has a nested tuple: ``fits`` decides after the signature
        then."""
        if len(args) != len(self._kinds):
            return False
        for position, (kind, ref, arg) in enumerate(zip(self._kinds, self._refs, args)):
            if kind is None:
                if type(arg) is not int or not _INT64_MIN <= arg <= _INT64_MAX:
                    return False
            elif kind is True:
                if ref() is not arg and not self._resizes(position, arg):
                    return False
            elif kind is False or type(arg) is not kind or len(arg) != len(ref):
                return False
            else:
                for element, array in zip(ref, arg):
                    if element() is not array:
                        return False
        return True

    def fits(self, args, resizable=True):
        """Whether ``args`` (of this block's signature) are the same arrays, alive (or, where
        ``resizable``, a flat one at another length), and ints that fit their words."""
        for position, (ref, arg) in enumerate(zip(self._refs, args)):  # as many, of the same kinds
            if ref is None:
                if not _INT64_MIN <= arg <= _INT64_MAX:
                    return False
            elif type(ref) is tuple:
                if not _alive(ref, arg):
                    return False
            elif ref() is not arg and not (resizable and self._resizes(position, arg)):
                return False
        return True

    def pin(self):
        """Take no flat array at another length from now on (a bound launch's block)."""
        self._flat = {}

    def _resizes(self, position, arg):
        """Whether ``arg`` is the flat array at ``position`` at another length."""
        flat = self._flat.get(position)
        return flat is not None and flat.holds(arg)

    def launch(self, blocks, threads, args, resized=False):
        """Launch with ``args``' ints, and (where ``resized``: they passed ``matches`` or
        ``fits``) their flat arrays' lengths, written into the words first."""
        with self._lock:  # the words written and launched together
            if resized:
                refs = self._refs
                for position, flat in self._flat.items():
                    arg = args[position]
                    if refs[position]() is not arg:
                        flat.size.value = flat.shape.value = arg.shape[0]
                        refs[position] = weakref.ref(arg)
            self._launch(blocks, threads, args)

    def _launch(self, blocks, threads, args):
        for position, word in self._numbers:
            word.value = args[position]
        if self._cooperative:
            (error,) = _driver.cuLaunchCooperativeKernel(
                self._function, blocks, 1, 1, threads, 1, 1, 0, _driver.CUstream(0), self._address
            )
        else:
            (error,) = _driver.cuLaunchKernel(
                self._function, blocks, 1, 1, threads, 1, 1, 0, _driver.CUstream(0), self._address, 0
            )
        if error != _driver.CUresult.CUDA_SUCCESS:
            from numba.cuda.cudadrv.driver import CudaAPIError

            raise CudaAPIError(int(error), f"cuLaunchKernel of {blocks} x {threads}: {error.name}")


class _Flat:
    """What a flat device array argument of a block must share with another array for the
    block to take that one at its length: the memory object (weakly: nothing kept holds GPU
    memory), class, dtype and strides; and the block's two words of its length (size,
    shape)."""

    __slots__ = ("_memory", "_class", "_dtype", "_strides", "size", "shape")

    def __init__(self, array, size, shape):
        self._memory = weakref.ref(array.gpu_data)
        self._class, self._dtype, self._strides = type(array), array.dtype, array.strides
        self.size, self.shape = size, shape

    def holds(self, arg):
        return (
            type(arg) is self._class
            and arg.gpu_data is self._memory()
            and arg.strides == self._strides
            and arg.dtype == self._dtype
        )


def _word(word):
    """``word`` as a ctypes value: numba-cuda passes an array's sizes, strides and pointer
    as Python ints, which ``cuda.core`` takes as ``intptr_t`` (and a bool as ``bool``); None
    for anything else."""
    if isinstance(word, (ctypes._SimpleCData, ctypes.Structure)):
        return word
    if type(word) is bool:
        return ctypes.c_bool(word)
    if type(word) is int:
        return ctypes.c_ssize_t(word)
    return None


def _kind(arg):
    """How ``_Block.matches`` checks an argument: None (a Python int), True (a device array),
    a tuple's class (a flat tuple of device arrays), False (a nested tuple: it does not)."""
    if type(arg) is int:
        return None
    if _device_array(arg):
        return True
    return type(arg) if all(_device_array(a) for a in arg) else False


def _ref(arg):
    """A weak reference to the array ``arg``, or those of a tuple's arrays (``_refs``)."""
    return weakref.ref(arg) if _device_array(arg) else _refs(arg)


def _signature(args):
    """What a launch's parameter block depends on: each argument's ``_key`` (int for a
    Python int, whose value is written at each launch), or None when one has none."""
    signature = []
    for arg in args:
        key = int if type(arg) is int else _key(arg)
        if key is None:
            return None
        signature.append(key)
    return tuple(signature)


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
