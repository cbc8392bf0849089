"""CUDA launches that skip numba-cuda's argument work for objects it has seen (rafi/_launch_cache.py)."""

import collections

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
    host = np.zeros(n)  # a host array: numba-cuda copies it in and back, so no cached words
    with pytest.warns(Warning, match="Host array"):  # numba-cuda's own warning about the copies
        backend.launch(combine, n, host, pair, 1.0, 0)
    np.testing.assert_array_equal(host, a + b)
    f32 = cuda.to_device(np.zeros(n, np.float32))  # other argument types: another kernel
    backend.launch(combine, n, f32, pair, np.float32(2), np.int32(1))
    np.testing.assert_allclose(f32.copy_to_host(), a * 2 + b + 1)


class _Array:
    """Stands for numba-cuda's DeviceNDArray in the host-only test below."""

    def __init__(self, ptr):
        self.ptr = ptr


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
    def __init__(self):
        self.overloads, self.through_numba = {}, []

    def typeof_pyval(self, v):
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
                dispatcher.overloads.setdefault(types, _Kernel(types))

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
    assert direct[-1] == (("number", 11), ("ptr", 1), ("ptr", 2), ("ptr", 3), ("number", 3.0))
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
