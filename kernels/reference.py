"""One-process reference images: a per-sample shading function summed over pixels and samples.

The examples' references run the same device functions as their kernels, in one loop
without rafi: ``shade(pixel, sample, *args)`` returns the ``(r, g, b)`` one sample adds
to its pixel, and ``reference_image`` sums them (compiled with numba).
"""

import functools

import numba
import numpy as np

__all__ = ["reference_image"]


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


def reference_image(shade, width, height, samples, *args):
    """The ``(height, width, 3)`` float64 sum over samples of ``shade(pixel, sample, *args)``."""
    return _sum(_compiled(shade), width, height, samples, args)
