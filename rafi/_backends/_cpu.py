"""The cpu backend: numpy arrays, kernels compiled by numba njit and run as one loop."""

import numpy as np

from rafi.kernels.scan import exclusive_scan

from .._config import env_boundscheck
from . import PassedEvent

__all__ = ["CpuBackend"]


class CpuBackend:
    """Items in numpy arrays; ``launch`` runs a ``@rafi.kernel`` body as a compiled loop."""

    name = "cpu"
    device_arrays = False  # MPI can take these arrays as they are
    simulator = False
    cupy = None

    def __init__(self):
        self.boundscheck = env_boundscheck()  # RAFI_BOUNDSCHECK, read once (see launch)

    def zeros(self, shape, dtype):
        return np.zeros(shape, dtype)

    def host_buffer(self, shape, dtype):
        """A zeroed host array."""
        return np.zeros(shape, dtype)

    def mapped_buffer(self, size, dtype):
        """A zeroed flat array: ``(host view, array for kernels)``, one and the same here."""
        buffer = np.zeros(size, dtype)
        return buffer, buffer

    def in_place(self, array):
        """``array`` (host memory) as kernels take it, read and written in place: itself."""
        return array

    def event(self):
        """Work is done when enqueued: an event that has always passed."""
        return PassedEvent()

    def launch(self, kernel, n, *args):
        kernel.launch_cpu(n, *args, checked=self.boundscheck)

    def threads(self, work):
        """Threads for a grid-stride kernel over ``work`` elements: one loop does it all."""
        return 1

    def graph(self, build):
        """Return a replay of ``build``'s work: here ``build`` itself, run once now (it must
        be harmless), so that its kernels compile here and not in the first round."""
        build()
        return build

    def scan(self, values, n, out):
        exclusive_scan(values, n, out)

    def to_host(self, src, dst):
        np.copyto(dst, src)

    def to_device(self, src, dst):
        np.copyto(dst, src)

    def fill(self, array, value):
        array.fill(value)

    def copy(self, dst, src):
        np.copyto(dst, src)

    def prefix(self, array, n):
        """The first ``n`` items of the flat ``array`` (a view)."""
        return array[:n]

    def as_device(self, array):
        return np.ascontiguousarray(array)

    def synchronize(self):
        pass

    def kernel_view(self, outbox):
        return outbox

    def partition_chunks(self, capacity, size):
        return 1  # one compiled loop is the fastest serial counting sort
