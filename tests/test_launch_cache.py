"""CUDA launches that skip numba-cuda's argument work for objects it has seen (rafi/_launch_cache.py)."""

import collections
import ctypes

import numpy as np
import pytest

import rafi
from conftest import SIMULATOR

Pair = collections.namedtuple("Pair", ["a", "b"])


@rafi.kernel
def combine(i, out, pair, scale, offset):
    out[i] = pair.a[i] * scale + pair.b[i] + offset


def _gpu():
    if SIMULATOR:
        pytest.skip("the simulator has no launches to cache")
    from numba import cuda

    if not cuda.is_available():
        pytest.skip("no GPU here")
    return cuda


def test_launches_see_new_numbers_new_arrays_and_views():
    """Every launch computes with its own arguments, whichever of them were seen before."""
    cuda = _gpu()

    from rafi._backends._cuda import CudaBackend

    backend = CudaBackend(0)
    n = 1000
    a, b = np.arange(n, dtype=np.float64), np.full(n, 0.5)
    pair = Pair(cuda.to_device(a), cuda.to_device(b))
    out = cuda.to_device(np.zeros(n))
    for step in range(5):  # the same arrays, other numbers: launched past numba-cuda from the second on
        backend.launch(combine, n, out, pair, 2.0 + step, step)
        np.testing.assert_array_equal(out.copy_to_host(), a * (2.0 + step) + b + step)
    assert any(cache._kernels for cache in combine._fast.values()), "no launch went past numba-cuda"
    for step in range(3):  # new arrays every time
        fresh, other = cuda.to_device(np.zeros(n)), Pair(cuda.to_device(a + step), pair.b)
        backend.launch(combine, n, fresh, other, 1.0, 0)
        np.testing.assert_array_equal(fresh.copy_to_host(), a + step + b)
    for k in (10, 500, 999):  # views of different lengths
        view = out[:k]
        backend.launch(combine, k, view, pair, 3.0, 1)
        np.testing.assert_array_equal(out.copy_to_host()[:k], a[:k] * 3 + b[:k] + 1)
    (cache,) = combine._fast.values()
    blocks = len(cache._blocks)
    for step, k in enumerate((7, 900, 7, 1, 1000)):  # a forwarder's inbox views: one block at every length
        view = backend.prefix(out, k)
        assert len(view) == k and view.device_ctypes_pointer.value == out.device_ctypes_pointer.value
        out.copy_to_device(np.zeros(n))
        backend.launch(combine, k, view, pair, 1, step)  # ints: a parameter block (floats have none)
        expected = np.where(np.arange(n) < k, a + b + step, 0)
        np.testing.assert_array_equal(out.copy_to_host(), expected)
    assert len(cache._blocks) == blocks + 1, "a new length of the same memory made a block of its own"
    host = np.zeros(n)  # a host array: numba-cuda copies it in and back, so no cached words
    with pytest.warns(Warning, match="Host array"):  # numba-cuda's own warning about the copies
        backend.launch(combine, n, host, pair, 1.0, 0)
    np.testing.assert_array_equal(host, a + b)
    f32 = cuda.to_device(np.zeros(n, np.float32))  # other argument types: another kernel
    backend.launch(combine, n, f32, pair, np.float32(2), np.int32(1))
    np.testing.assert_allclose(f32.copy_to_host(), a * 2 + b + 1)


class _Array:
    """Stands for numba-cuda's DeviceNDArray in the host-only test below."""

    ndim = 0  # not a flat array: its block takes no other

    def __init__(self, ptr):
        self.ptr = ptr


class _View:
    """Stands for a flat DeviceNDArray (``gpu_data``, ``shape``, ...), marshalled as numba-cuda
    does: meminfo, parent, size, itemsize, pointer, shape, strides."""

    ndim, dtype, strides = 1, np.dtype(np.float64), (8,)

    def __init__(self, memory, n):
        self.gpu_data, self.shape = memory, (n,)

    def words(self):
        return [0, 0, self.shape[0], 8, self.gpu_data.ptr, self.shape[0], 8]


class _Kernel:
    debug, extensions, cooperative, launch_config_sensitive = False, [], False, False

    def __init__(self, types):
        self.name = types
        self._codelibrary = types_namespace(get_cufunc=lambda: types_namespace(kernel=types))

    def _prepare_args(self, ty, val, stream, retr, words):
        if isinstance(val, _Array):
            words.append(("ptr", val.ptr))
        elif isinstance(val, tuple):
            for v in val:
                self._prepare_args(None, v, stream, retr, words)
        elif isinstance(val, np.ndarray):  # numba-cuda copies host arrays back after a launch
            retr.append(None)
            words.append("host")
        else:
            words.append(("number", val))


class _Dispatcher:
    def __init__(self, kernel_class=None):
        self.overloads, self.through_numba = {}, []
        self.kernel_class = kernel_class or _Kernel

    def typeof_pyval(self, v):
        if type(v) is int:
            from rafi._launch_cache import _INT64

            return _INT64  # as numba-cuda types it
        if isinstance(v, tuple):
            return (type(v).__name__, tuple(self.typeof_pyval(a) for a in v))
        return type(v).__name__

    def __getitem__(self, config):
        dispatcher = self

        class Configured:
            stream, griddim, blockdim, sharedmem = "stream", (config[0], 1, 1), (config[1], 1, 1), 0

            def __call__(self, *args):
                dispatcher.through_numba.append(args)
                types = tuple(dispatcher.typeof_pyval(a) for a in args)
                dispatcher.overloads.setdefault(types, dispatcher.kernel_class(types))

        return Configured()


def types_namespace(**fields):
    import types

    return types.SimpleNamespace(**fields)


def test_cache_logic_without_a_gpu(monkeypatch):
    """The launch cache's bookkeeping with stand-ins for numba-cuda and cuda.core: what
    launches directly, with which words, what falls back, and that nothing is kept alive."""
    import gc
    import weakref

    from rafi import _launch_cache as lc

    direct = []
    monkeypatch.setattr(lc, "DeviceNDArray", _Array)
    monkeypatch.setattr(lc, "_core_launch", lambda stream, config, kernel, *words: direct.append(words))
    monkeypatch.setattr(lc, "LaunchConfig", lambda **fields: fields)
    dispatcher = _Dispatcher()
    cache = lc.LaunchCache(dispatcher)
    a, pair = _Array(1), Pair(_Array(2), _Array(3))
    cache.launch(4, 256, (10, a, pair, 2.0))  # first: numba-cuda compiles, the kernel is learned
    assert len(dispatcher.through_numba) == 1 and not direct
    cache.launch(4, 256, (11, a, pair, 3.0))
    first, *rest = direct[-1]  # a Python int: marshalled by rafi, as numba-cuda would (int64)
    assert type(first) is ctypes.c_int64 and first.value == 11
    assert rest == [("ptr", 1), ("ptr", 2), ("ptr", 3), ("number", 3.0)]
    cache.launch(4, 256, (11, a, Pair(pair.a, _Array(9)), 3.0))  # a new tuple with a new array
    assert direct[-1][3] == ("ptr", 9)
    fresh = _Array(7)
    gone = weakref.ref(fresh)
    cache.launch(4, 256, (12, fresh, pair, 1.0))
    assert direct[-1][1] == ("ptr", 7)
    del fresh
    gc.collect()
    assert gone() is None, "the cache kept an array alive"
    for k in range(1000):  # a new array at a freed one's address is not taken for it
        other = _Array(100 + k)
        cache.launch(4, 256, (13, other, pair, 1.0))
        assert direct[-1][1] == ("ptr", 100 + k)
    launched = len(direct)
    cache.launch(4, 256, (14, np.zeros(3), pair, 1.0))  # a host array: numba-cuda launches
    assert len(direct) == launched and dispatcher.through_numba[-1][0] == 14
    cache.launch(4, 256, (np.int32(1), a, pair, 1.0))  # other types: numba-cuda, then learned
    assert len(direct) == launched and dispatcher.through_numba[-1][0] == 1
    cache.launch(4, 256, (np.int32(2), a, pair, 1.0))
    assert direct[-1][0] == ("number", 2)


class _WordKernel(_Kernel):
    """Marshals as numba-cuda does: one ctypes word per number and per array pointer."""

    def __init__(self, types):
        super().__init__(types)
        self._codelibrary = types_namespace(get_cufunc=lambda: types_namespace(handle=1234, kernel=types))

    def _prepare_args(self, ty, val, stream, retr, words):
        if isinstance(val, _View):
            words.extend(val.words())
        elif isinstance(val, _Array):
            words.append(val.ptr)  # numba-cuda passes sizes and pointers as Python ints
        elif isinstance(val, tuple):
            for v in val:
                self._prepare_args(None, v, stream, retr, words)
        else:
            words.append(ctypes.c_double(val))


def _stand_in_driver(monkeypatch, words=5, arrays=_Array):
    """The CUDA driver's launch and cuda.core's, as stand-ins that record what they are given:
    ``(launched, cored)``, each launch's ``(function, blocks, threads, its first words)`` and
    each launch through cuda.core's words; ``arrays`` stands for DeviceNDArray."""
    from rafi import _launch_cache as lc

    launched, cored = [], []

    def launch_kernel(function, gx, gy, gz, bx, by, bz, shared, stream, address, extra):
        pointers = (ctypes.c_void_p * words).from_address(address)
        launched.append((function, gx, bx, [ctypes.c_int64.from_address(p).value for p in pointers]))
        return (0,)

    driver = types_namespace(
        CUfunction=lambda handle: ("function", handle), CUstream=lambda s: s,
        CUresult=types_namespace(CUDA_SUCCESS=0), cuLaunchKernel=launch_kernel,
    )  # fmt: skip
    monkeypatch.setattr(lc, "_driver", driver)
    monkeypatch.setattr(lc, "DeviceNDArray", arrays)
    monkeypatch.setattr(lc, "_core_launch", lambda stream, config, kernel, *words: cored.append(words))
    monkeypatch.setattr(lc, "LaunchConfig", lambda **fields: fields)
    return launched, cored


def test_parameter_blocks_without_a_gpu(monkeypatch):
    """Launches of kept arrays and ints: one parameter block per signature, made once, the
    ints written in place at every launch; what the driver reads is every launch's own."""
    from rafi import _launch_cache as lc

    launched, cored = _stand_in_driver(monkeypatch)
    cache = lc.LaunchCache(_Dispatcher(_WordKernel))
    a, pair = _Array(1), Pair(_Array(2), _Array(3))
    cache.launch(4, 256, (10, a, pair, 7))  # numba-cuda compiles; the kernel is learned
    assert not launched
    for n in (11, -(2**63), 2**63 - 1):
        cache.launch(8, 128, (n, a, pair, 5))
        assert launched[-1] == (("function", 1234), 8, 128, [n, 1, 2, 3, 5])
    assert len(cache._blocks) == 1
    fresh = _Array(9)
    cache.launch(2, 64, (1, fresh, pair, 2))  # another array: a block of its own
    assert launched[-1][3] == [1, 9, 2, 3, 2] and len(cache._blocks) == 2
    signature = lc._signature((1, fresh, pair, 2))
    del fresh
    reborn = _Array(10)
    monkeypatch.setattr(lc, "_key", lambda arg: id(arg) if arg is not reborn else signature[1])
    cache.launch(2, 64, (3, reborn, pair, 4))  # a new array at a dead one's address: not taken for it
    assert launched[-1][3] == [3, 10, 2, 3, 4]
    assert not cored
    cache.launch(2, 64, (2**63, a, pair, 1))  # beyond int64: marshalled as numba-cuda does, no block
    assert len(cored) == 1 and cored[0][0].value == 2.0**63
    cache.launch(2, 64, (6, a, pair, 1))  # the block of ints is still the ints' own
    assert launched[-1][3] == [6, 1, 2, 3, 1] and len(cored) == 1


def test_a_bound_launch_writes_its_ints_and_skips_the_checks(monkeypatch):
    """``bound``: None until a launch made the arguments' parameter block; then a launch of
    that block with each call's ints, the grid it was bound with, and no checks of the arrays
    (the resident kernel's forward(), whose arrays are the engine's own)."""
    from rafi import _launch_cache as lc

    launched, _ = _stand_in_driver(monkeypatch)
    cache = lc.LaunchCache(_Dispatcher(_WordKernel))
    a, pair = _Array(1), Pair(_Array(2), _Array(3))
    assert cache.bound(8, 128, (1, a, pair, 2)) is None  # nothing launched: no block
    cache.launch(8, 128, (1, a, pair, 2))  # numba-cuda compiles
    assert cache.bound(8, 128, (1, a, pair, 2)) is None  # still no block
    cache.launch(8, 128, (3, a, pair, 4))  # the block is made
    assert cache.bound(8, 128, (1, _Array(1), pair, 2)) is None  # another array: not this block
    launch = cache.bound(8, 128, (1, a, pair, 2))
    checks = []
    monkeypatch.setattr(lc._Block, "fits", lambda self, args: checks.append(args))
    monkeypatch.setattr(lc, "_signature", lambda args: checks.append(args))
    for n, m in ((5, 6), (-(2**63), 2**63 - 1)):
        launch(n, a, pair, m)
        assert launched[-1] == (("function", 1234), 8, 128, [n, 1, 2, 3, m])
    assert not checks


def test_a_launch_like_the_last_one_is_matched_without_its_signature(monkeypatch):
    """The block launched last is tried first, by identity (``_Block.matches``): a launch
    with its arrays and new ints takes it without computing a signature; anything else (other
    arrays, a nested tuple, an int beyond int64, a dead array's successor) goes the long
    way and launches what it should."""
    from rafi import _launch_cache as lc

    launched, cored = _stand_in_driver(monkeypatch)
    cache = lc.LaunchCache(_Dispatcher(_WordKernel))
    a, b, pair = _Array(1), _Array(4), Pair(_Array(2), _Array(3))
    for n in (1, 2):  # compiled, then a block made
        cache.launch(8, 128, (n, a, pair, 0))
    signatures = []
    signature = lc._signature
    monkeypatch.setattr(lc, "_signature", lambda args: signatures.append(args) or signature(args))
    cache.launch(8, 128, (5, a, pair, 6))
    assert launched[-1][3] == [5, 1, 2, 3, 6] and not signatures
    cache.launch(8, 128, (5, b, pair, 6))  # another array: the long way, a block of its own
    assert launched[-1][3] == [5, 4, 2, 3, 6] and len(signatures) >= 1
    cache.launch(8, 128, (7, a, pair, 8))  # back to the first block, found by its signature
    assert launched[-1][3] == [7, 1, 2, 3, 8]
    count = len(signatures)
    cache.launch(8, 128, (9, a, pair, 9))  # the last one again: matched
    assert launched[-1][3] == [9, 1, 2, 3, 9] and len(signatures) == count
    cache.launch(8, 128, (9, a, Pair(pair.a, b), 9))  # a tuple with another array
    assert launched[-1][3] == [9, 1, 2, 4, 9]
    cache.launch(8, 128, (2**63, a, pair, 9))  # beyond int64: through cuda.core
    assert cored and cored[-1][0].value == 2.0**63
    nested = (1, a, (pair,), 0)
    cache.launch(8, 128, nested)
    cache.launch(8, 128, nested)  # a nested tuple's block: launched, found by its signature
    assert launched[-1][3] == [1, 1, 2, 3, 0]
    count = len(signatures)
    cache.launch(8, 128, (3, a, (pair,), 4))
    assert launched[-1][3] == [3, 1, 2, 3, 4] and len(signatures) > count


def test_a_flat_array_at_another_length_takes_the_block(monkeypatch):
    """A flat array sharing the memory object of the block's (a forwarder's inbox view at a
    new count) is launched with the block, its length written into its words; one of other
    memory goes the long way; a bound launch takes none."""
    from rafi import _launch_cache as lc

    launched, _ = _stand_in_driver(monkeypatch, words=9, arrays=_View)
    cache = lc.LaunchCache(_Dispatcher(_WordKernel))
    memory, other = _Array(1000), _Array(2000)
    views = []  # alive, so that no new view has a dead one's id (and signature)

    def view(memory, n):
        views.append(_View(memory, n))
        return views[-1]

    for n in (1, 2):  # compiled, then a block made
        cache.launch(8, 128, (n, view(memory, 10), 5))
    signatures = []
    signature = lc._signature
    monkeypatch.setattr(lc, "_signature", lambda args: signatures.append(args) or signature(args))
    for k in (3, 10, 3, 700):
        cache.launch(8, 128, (k, view(memory, k), 5))
        assert launched[-1][3] == [k, 0, 0, k, 8, 1000, k, 8, 5]
    assert not signatures and len(cache._blocks) == 1
    cache.launch(8, 128, (4, view(other, 4), 5))  # other memory: its own block
    assert launched[-1][3] == [4, 0, 0, 4, 8, 2000, 4, 8, 5] and len(cache._blocks) == 2
    six = view(memory, 6)
    cache.launch(8, 128, (6, six, 5))  # the first memory again, after another block: its words
    assert launched[-1][3] == [6, 0, 0, 6, 8, 1000, 6, 8, 5]
    assert cache.bound(8, 128, (2, views[1], 5)) is None, "a bound launch would keep another length"
    launch = cache.bound(8, 128, (6, six, 5))
    cache.launch(8, 128, (7, view(memory, 7), 5))  # the bound block is pinned: a block of its own
    assert launched[-1][3] == [7, 0, 0, 7, 8, 1000, 7, 8, 5]
    launch(6, six, 5)
    assert launched[-1][3] == [6, 0, 0, 6, 8, 1000, 6, 8, 5], "a launch changed a bound block's length"
