"""The cuda backend: numba-cuda device arrays and kernels; also runs under the CUDA simulator.

Everything rafi does on the GPU goes to the legacy default stream, in order with the
user's kernels. With CuPy present, a fixed sequence of launches and copies is captured
once into a CUDA graph (``graph``) and replayed each round, and small copies go through
the CUDA runtime directly (a numba-cuda launch of a ten-argument kernel costs about 0.1 ms
of Python on the H200 machine; a graph replay of the whole sequence costs one launch).
"""

import contextlib
import warnings

import numpy as np

from .._errors import ConfigError
from .._kernel_cache import launch_counting_compilation
from .._targets import enable_cuda, simulator
from . import PassedEvent

__all__ = ["CudaBackend"]

_MIN_CHUNK = 16  # items one partition thread walks, at the least
_THREADS_PER_SM = 2048
_SIM_THREADS = 4  # grid-stride kernels under the simulator: one OS thread each


@contextlib.contextmanager
def grid_size_is_ours():
    """Silence numba-cuda's low-occupancy warning: rafi, not the user, sized the grid."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Grid size", category=Warning)
        yield


def _import_cupy():
    try:
        import cupy
    except ImportError:
        return None
    return cupy


def pointer(array):
    """The address of ``array``'s first element: device arrays and (pinned) numpy arrays."""
    if isinstance(array, np.ndarray):
        return array.ctypes.data
    return array.__cuda_array_interface__["data"][0]


class CudaBackend:
    """Items in device memory; ``launch`` runs a ``@rafi.kernel`` body as a CUDA grid."""

    name = "cuda"
    device_arrays = True

    def __init__(self, local_rank, device=None):
        from numba import cuda

        from rafi.kernels import cuda_scan, multisplit

        self._cuda = cuda
        self._scan = cuda_scan
        self.multisplit = multisplit  # the partition's tile kernels
        self.simulator = simulator()
        enable_cuda()
        if not self.simulator:
            count = len(cuda.gpus)
            if count == 0:
                raise ConfigError("backend='cuda' but no GPU is visible (CUDA_VISIBLE_DEVICES?)")
            if device is None:
                device = local_rank % count  # the node's ranks spread over its GPUs
            if not 0 <= device < count:
                raise ConfigError(f"device={device} but this node shows {count} GPU(s)")
            cuda.select_device(device)
        self.device = 0 if device is None else device
        self.cupy = None if self.simulator else _import_cupy()
        if self.cupy is not None:
            self.cupy.cuda.Device(self.device).use()
        self._stream = 0  # where launches and copies go; a capturing stream while a graph is built
        self._stream_ptr = 0
        self._sm_count = 1 if self.simulator else cuda.get_current_device().MULTIPROCESSOR_COUNT
        self._scratch = cuda.device_array(2 * cuda_scan.TILE + 1, np.int64)

    def zeros(self, shape, dtype):
        return self._cuda.to_device(np.zeros(shape, dtype))

    def host_buffer(self, shape, dtype):
        """A zeroed host array, pinned on a GPU (``pinned_array`` alone is uninitialized)."""
        if self.simulator:
            return np.zeros(shape, dtype)
        buffer = self._cuda.pinned_array(shape, dtype)
        buffer[...] = 0
        return buffer

    def mapped_buffer(self, size, dtype):
        """A zeroed flat host array that kernels read and write in place (zero-copy
        mapped memory on a GPU): ``(host view for numpy and MPI, array for kernels)``."""
        if self.simulator:  # a numpy argument would be copied in and written back whole
            from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

            buffer = np.zeros(size, dtype)
            return buffer, FakeCUDAArray(buffer)
        mapped = self._cuda.mapped_array(size, dtype)
        host = np.asarray(mapped)
        host[...] = 0
        return host, mapped

    def in_place(self, array):
        """The host ``array`` as simulated kernels take it, read and written in place (a
        numpy argument would be copied in and written back whole); on a GPU, kernels
        cannot take host memory this way: use ``mapped_buffer``."""
        if not self.simulator:
            raise TypeError("a GPU's kernels take host memory only when it is mapped (mapped_buffer)")
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

        return FakeCUDAArray(array)

    def event(self):
        """A reusable marker in the device's work: ``record()`` it after enqueued work,
        ``query()`` is True once the device has done everything enqueued before it."""
        if self.simulator:
            return PassedEvent()
        return self._cuda.event(timing=False)

    def launch(self, kernel, n, *args):
        with grid_size_is_ours():
            kernel.launch_cuda(n, *args, stream=self._stream, simulator=self.simulator)

    def launch_blocks(self, kernel, blocks, threads, *args):
        """Launch a plain ``cuda.jit`` kernel as ``blocks`` blocks of ``threads`` on rafi's stream."""
        with grid_size_is_ours():
            launch_counting_compilation(kernel, lambda: kernel[blocks, threads, self._stream](*args))

    def threads(self, work):
        """Threads for a grid-stride kernel over ``work`` elements: enough to fill the GPU."""
        if self.simulator:
            return max(1, min(work, _SIM_THREADS))
        return max(1, min(work, self._sm_count * _THREADS_PER_SM))

    def graph(self, build):
        """Capture ``build()``'s launches and copies into a CUDA graph; return its replay.

        ``build`` runs once outside the capture (it compiles the kernels, so it must be
        harmless to run) and once captured. Without CuPy, or under the simulator, or if the
        capture fails, the replay is ``build`` itself.
        """
        if self.cupy is None:
            return build
        build()
        self.synchronize()
        cp = self.cupy
        stream = cp.cuda.Stream(non_blocking=True)
        self._stream, self._stream_ptr = self._cuda.external_stream(stream.ptr), stream.ptr
        graph = None
        try:
            stream.begin_capture(cp.cuda.runtime.streamCaptureModeRelaxed)
            try:
                build()
            finally:
                graph = stream.end_capture()
        except Exception as exc:  # a driver that cannot capture these launches: run them eagerly
            message = f"rafi: CUDA graph capture failed ({exc}); launching kernels one by one"
            warnings.warn(message, stacklevel=2)
            return build
        finally:
            self._stream, self._stream_ptr = 0, 0
        null = cp.cuda.Stream.null

        def replay():
            graph.launch(null)

        replay.graph, replay.stream = graph, stream  # keep both alive with the replay
        return replay

    def scan(self, values, n, out):
        with grid_size_is_ours():
            self._scan.exclusive_scan(values, n, out, self._scratch, stream=self._stream)

    def _memcpy(self, dst, src, nbytes):
        cp = self.cupy
        runtime = cp.cuda.runtime
        runtime.memcpyAsync(pointer(dst), pointer(src), nbytes, runtime.memcpyDefault, self._stream_ptr)

    def _copied(self):
        """Finish a copy before returning, unless it is being captured into a graph."""
        if self._stream_ptr == 0:
            self.synchronize()

    def to_host(self, src, dst):
        """Copy device ``src`` to host ``dst`` (in a graph being built: only enqueue it)."""
        if self.cupy is None or not dst.flags.c_contiguous:
            src.copy_to_host(dst)
            return
        self._memcpy(dst, src, dst.nbytes)
        self._copied()

    def to_device(self, src, dst):
        """Copy host ``src`` to device ``dst`` (in a graph being built: only enqueue it)."""
        if self.cupy is None or not isinstance(src, np.ndarray) or not src.flags.c_contiguous:
            dst.copy_to_device(src)
            return
        self._memcpy(dst, src, src.nbytes)
        self._copied()

    def fill(self, array, value):
        """Set every entry of the device ``array`` to ``value``, on the device when CuPy is here."""
        if self.cupy is not None:
            with self.cupy.cuda.Stream.null:  # where rafi's kernels run
                self.cupy.asarray(array).fill(value)
            return
        array.copy_to_device(np.full(array.shape, value, array.dtype))

    def copy(self, dst, src):
        dst.copy_to_device(src)

    def prefix(self, array, n):
        """The first ``n`` items of the flat device ``array``, as a view that shares its
        memory object where ``n > 0`` (numba-cuda's slicing costs some 40 us and makes a new
        one each time: a launch cache then meets the view as an array it has never seen;
        an empty array has a null pointer of its own)."""
        if self.simulator:
            return array[:n]
        from numba.cuda.cudadrv.devicearray import DeviceNDArray

        if type(array) is not DeviceNDArray:  # mapped memory: numba's slice
            return array[:n]
        dtype = array.dtype
        return DeviceNDArray((n,), (dtype.itemsize,), dtype, gpu_data=array.gpu_data)

    def as_device(self, array):
        cuda = self._cuda
        if hasattr(array, "copy_to_host"):  # numba-cuda's own (or the simulator's) arrays
            return array
        if hasattr(array, "__cuda_array_interface__"):  # CuPy and friends, without a copy
            return cuda.as_cuda_array(array)
        return cuda.to_device(np.ascontiguousarray(array))

    def synchronize(self):
        if self.cupy is not None:
            self.cupy.cuda.runtime.deviceSynchronize()
        else:
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
        rows = size + 2  # kernels/partition.py::rows
        if self.simulator:
            return max(1, min(4, self._scan.MAX_VALUES // rows))
        wanted = max(1, (capacity + _MIN_CHUNK - 1) // _MIN_CHUNK)
        return max(1, min(wanted, self._scan.MAX_VALUES // rows))
