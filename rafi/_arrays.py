"""``asnumpy``: a numpy copy of any array rafi hands out, on the host or on a device."""

import numpy as np

__all__ = ["asnumpy", "is_device_array"]


def is_device_array(array):
    """Return True for arrays that live in GPU memory (or the simulator's stand-ins)."""
    return hasattr(array, "__cuda_array_interface__") or hasattr(array, "copy_to_host")


def asnumpy(array):
    """Return a numpy copy of ``array`` (numpy, numba-cuda, CuPy or any CUDA array interface)."""
    if isinstance(array, np.ndarray):
        return array.copy()
    if hasattr(array, "copy_to_host"):  # numba-cuda device arrays and the simulator's
        return array.copy_to_host()
    if hasattr(array, "get"):  # CuPy
        return array.get()
    if hasattr(array, "__cuda_array_interface__"):
        from numba import cuda

        return cuda.as_cuda_array(array).copy_to_host()
    return np.array(array)
