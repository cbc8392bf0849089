"""The host's cost of a CUDA launch of a kernel of 13 device arrays and 8 ints (the
persistent resident kernel's shape), on one GPU: numba-cuda's own launch, rafi's launch
cache through ``cuda.core``, and through a parameter block (rafi/_launch_cache.py), then
the block's parts. Launches back to back, then one synchronize: microseconds a launch.

    python bench/launch_cost.py
"""

import time

import numpy as np
from numba import cuda

from rafi import _launch_cache

LAUNCHES = 2000


@cuda.jit
def empty(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, n0, n1, n2, n3, n4, n5, n6, n7):
    pass


def per_launch(label, launch, count=LAUNCHES):
    cuda.synchronize()
    started = time.perf_counter()
    for _ in range(count):
        launch()
    cuda.synchronize()
    print(f"{label:>36}: {(time.perf_counter() - started) / count * 1e6:6.1f} us", flush=True)


def main():
    args = (*[cuda.device_array(10, np.int64) for _ in range(13)], *range(8))
    blocks, threads = 66, 256
    per_launch("numba-cuda", lambda: empty[blocks, threads](*args), 500)
    driver = _launch_cache._driver
    _launch_cache._driver = None  # no parameter blocks: every launch through cuda.core
    through_core = _launch_cache.LaunchCache(empty)
    for _ in range(3):
        through_core.launch(blocks, threads, args)
    _launch_cache._driver = driver
    per_launch("launch cache, cuda.core", lambda: through_core.launch(blocks, threads, args))
    cache = _launch_cache.LaunchCache(empty)
    for _ in range(3):
        cache.launch(blocks, threads, args)
    per_launch("launch cache, parameter block", lambda: cache.launch(blocks, threads, args))
    block = next(iter(cache._blocks.values()))
    per_launch("the block's cuLaunchKernel", lambda: block.launch(blocks, threads, args))
    per_launch("the arguments' signature", lambda: _launch_cache._signature(args), 20000)
    per_launch("the block's check of the arguments", lambda: block.fits(args), 20000)


if __name__ == "__main__":
    main()
