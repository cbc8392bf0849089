"""One-process reference images: a per-sample shading function summed over pixels and samples.

The examples' references run the same device functions as their kernels, in one process
without rafi: ``shade(pixel, sample, *args)`` returns the ``(r, g, b)`` one sample adds
to its pixel, and ``reference_image`` sums them, compiled with numba njit (one loop on
the CPU) or as one CUDA kernel with a thread per pixel (on the GPU).
"""

import functools

import numba
import numpy as np

__all__ = ["reference_image", "to_backend"]


@functools.cache
def _compiled(shade):
    return numba.njit(shade)


@numba.njit
def _sum(shade, width, height, samples, args):
    image = np.zeros((height * width, 3))
    for pixel in range(width * height):
        for s in range(samples):
            r, g, b = shade(pixel, s, *args)
            image[pixel, 0] += r
            image[pixel, 1] += g
            image[pixel, 2] += b
    return image.reshape(height, width, 3)


def to_backend(args, backend):
    """``args`` as a tuple, each numpy array among them copied to the GPU if ``backend`` is "cuda"."""
    if backend != "cuda":
        return tuple(args)
    from rafi.kernels import cuda_reference

    return cuda_reference.to_device(args)


def reference_image(shade, width, height, samples, *args, backend="cpu"):
    """The ``(height, width, 3)`` float64 sum over samples of ``shade(pixel, sample, *args)``.

    With ``backend="cuda"`` one CUDA kernel computes it (kernels/cuda_reference.py; the
    simulator under ``NUMBA_ENABLE_CUDASIM=1``); numpy arrays among ``args`` are copied to
    the device first (pass them through ``to_backend`` to keep the copies out of a
    timing). Its sums equal the njit loop's up to rounding: the same device functions in
    the same order, but the GPU may fuse a multiply and an add. A first call compiles
    ``shade`` (counted in ``rafi.compile_seconds()``).
    """
    if backend == "cpu":
        return _sum(_compiled(shade), width, height, samples, args)
    from rafi.kernels import cuda_reference

    sums = cuda_reference.image(shade, width * height, samples, to_backend(args, "cuda"))
    return sums.reshape(height, width, 3)
