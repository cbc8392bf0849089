"""The one-process references on the GPU (kernels/reference.py, kernels/transport.py).

Imported on the cuda path alone (it needs numba-cuda). ``image`` runs a per-sample shading
function as one CUDA kernel with a thread per pixel; ``launch`` runs a ``@rafi.kernel``
without a forwarder. Under ``NUMBA_ENABLE_CUDASIM=1`` both run in the simulator, which
finds ``cuda`` among this module's globals (a kernel must not reach it by a closure).
"""

import functools

import numpy as np
from numba import cuda

from rafi._backends._cuda import grid_size_is_ours
from rafi._kernel_cache import launch_counting_compilation
from rafi._targets import enable_cuda, simulator

__all__ = ["to_device", "image", "launch"]

_THREADS = 128  # per block on a GPU
_SIM_THREADS = 32  # the simulator starts one OS thread per CUDA thread of a block


def to_device(args):
    """``args`` as a tuple, each numpy array among them copied to the GPU."""
    return tuple(cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in args)


@functools.cache
def _pixels(shade):
    """The kernel in which thread ``pixel`` sums its samples of ``shade`` into ``image[pixel]``,
    in the order of reference.py's njit loop. Compiled in memory: rafi's kernel cache keys a
    kernel by its source, which cannot tell one ``shade`` from another."""
    enable_cuda()
    device_shade = cuda.jit(device=True)(shade)

    @cuda.jit
    def pixels(image, samples, args):
        pixel = cuda.grid(1)
        if pixel < image.shape[0]:
            r = g = b = 0.0
            for s in range(samples):
                dr, dg, db = device_shade(pixel, s, *args)
                r += dr
                g += dg
                b += db
            image[pixel, 0] = r
            image[pixel, 1] = g
            image[pixel, 2] = b

    return pixels


def image(shade, pixels, samples, args):
    """The ``(pixels, 3)`` float64 sums over samples of ``shade(pixel, sample, *args)``, on
    the host; ``args`` as ``to_device`` gives them. A first call per ``shade`` compiles it
    (counted in ``rafi.compile_seconds()``)."""
    kernel = _pixels(shade)
    out = cuda.device_array((pixels, 3), np.float64)
    threads = _SIM_THREADS if simulator() else _THREADS
    blocks = (pixels + threads - 1) // threads
    with grid_size_is_ours():
        launch_counting_compilation(kernel, lambda: kernel[blocks, threads](out, samples, args))
    return out.copy_to_host()


def launch(kernel, n, *args):
    """Run the ``@rafi.kernel`` ``kernel`` for ``i in range(n)`` on the GPU (default stream)."""
    enable_cuda()
    with grid_size_is_ours():
        kernel.launch_cuda(n, *args, simulator=simulator())
