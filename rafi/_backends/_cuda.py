"""The cuda backend: numba-cuda device arrays and kernels; also runs under the CUDA simulator."""

import contextlib
import warnings

import numpy as np

from .._errors import ConfigError
from .._mpi_support import node_local
from .._targets import enable_cuda, simulator

__all__ = ["CudaBackend"]

_MIN_CHUNK = 16  # items one partition thread walks, at the least


@contextlib.contextmanager
def _grid_size_is_ours():
    """Silence numba-cuda's low-occupancy warning: rafi, not the user, sized the grid."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Grid size", category=Warning)
        yield


class CudaBackend:
    """Items in device memory; ``launch`` runs a ``@rafi.kernel`` body as a CUDA grid."""

    name = "cuda"
    device_arrays = True

    def __init__(self, comm, device=None):
        from numba import cuda

        from rafi.kernels import cuda_scan

        self._cuda = cuda
        self._scan = cuda_scan
        self.simulator = simulator()
        enable_cuda()
        if not self.simulator:
            count = len(cuda.gpus)
            if count == 0:
                raise ConfigError("backend='cuda' but no GPU is visible (CUDA_VISIBLE_DEVICES?)")
            if device is None:
                device = node_local(comm)[0] % count
            if not 0 <= device < count:
                raise ConfigError(f"device={device} but this node shows {count} GPU(s)")
            cuda.select_device(device)
        self.device = 0 if device is None else device
        self._scratch = cuda.device_array(2 * cuda_scan.TILE + 1, np.int64)

    def zeros(self, shape, dtype):
        return self._cuda.to_device(np.zeros(shape, dtype))

    def host_buffer(self, shape, dtype):
        if self.simulator:
            return np.zeros(shape, dtype)
        return self._cuda.pinned_array(shape, dtype)

    def launch(self, kernel, n, *args):
        with _grid_size_is_ours():
            kernel.launch_cuda(n, *args, simulator=self.simulator)

    def scan(self, values, n, out):
        with _grid_size_is_ours():
            self._scan.exclusive_scan(values, n, out, self._scratch)

    def to_host(self, src, dst):
        src.copy_to_host(dst)

    def to_device(self, src, dst):
        dst.copy_to_device(src)

    def copy(self, dst, src):
        dst.copy_to_device(src)

    def as_device(self, array):
        cuda = self._cuda
        if hasattr(array, "copy_to_host"):  # numba-cuda's own (or the simulator's) arrays
            return array
        if hasattr(array, "__cuda_array_interface__"):  # CuPy and friends, without a copy
            return cuda.as_cuda_array(array)
        return cuda.to_device(np.ascontiguousarray(array))

    def synchronize(self):
        self._cuda.synchronize()

    def kernel_view(self, outbox):
        """The outbox as kernels see it; the simulator needs its arrays pre-wrapped.

        The simulator wraps top-level array arguments for record attribute access but not
        arrays inside a tuple argument, so writes through ``outbox.items[slot].x`` would go
        nowhere; wrapping them here gives simulated kernels the same semantics as a GPU.
        """
        if not self.simulator:
            return outbox
        from numba.cuda.simulator.cudadrv.devicearray import FakeWithinKernelCUDAArray

        return type(outbox)(*(FakeWithinKernelCUDAArray(array) for array in outbox))

    def partition_chunks(self, capacity, size):
        rows = size + 1
        if self.simulator:
            return max(1, min(4, self._scan.MAX_VALUES // rows))
        wanted = max(1, (capacity + _MIN_CHUNK - 1) // _MIN_CHUNK)
        return max(1, min(wanted, 65536, self._scan.MAX_VALUES // rows))
