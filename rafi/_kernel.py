"""``@rafi.kernel``: one per-item body compiled as a CUDA kernel, an njit loop, or simulated."""

import functools

from ._kernel_cache import launch_counting_compilation, load_launcher, serialize_compiles

__all__ = ["kernel", "Kernel"]

_CUDA_THREADS = 256
_SIM_THREADS = 32  # the simulator starts one OS thread per CUDA thread of a block


def _arg_names(nargs):
    return [f"a{k}" for k in range(nargs)]


def _source(template, nargs):
    args = ", ".join(_arg_names(nargs))
    return template.format(args=args, comma=", " if nargs else "")


_CPU_LOOP = """
def launcher(n{comma}{args}):
    for i in range(n):
        body(i{comma}{args})
"""

_CUDA_GRID = """
def launcher(n{comma}{args}):
    i = cuda.grid(1)
    if i < n:
        body(i{comma}{args})
"""


class Kernel:
    """A per-item body ``body(i, *args)`` that runs for ``i in range(n)`` on any backend.

    Launch it with ``fwd.launch(kernel, n, *args)``; called directly, it runs the body once
    in plain Python.
    """

    def __init__(self, body):
        self.py_func = body
        self._compiled = {}
        self._fast = {}  # CUDA launcher -> its LaunchCache (launches on the default stream)
        functools.update_wrapper(self, body)

    def _launcher(self, target, nargs):
        key = (target, nargs)
        if key not in self._compiled:
            if target == "cpu":
                import numba

                namespace = {"body": numba.njit(nogil=True)(self.py_func)}
                launcher, cached = load_launcher(_source(_CPU_LOOP, nargs), namespace, self.py_func, target)
                self._compiled[key] = numba.njit(nogil=True, cache=cached)(launcher)
            else:
                from numba import cuda

                serialize_compiles()  # numba-cuda's dispatcher too, now that it is imported
                namespace = {"body": cuda.jit(device=True)(self.py_func), "cuda": cuda}
                launcher, cached = load_launcher(_source(_CUDA_GRID, nargs), namespace, self.py_func, target)
                self._compiled[key] = cuda.jit(cache=cached)(launcher)
        return self._compiled[key]

    def launch_cpu(self, n, *args):
        """Run the body for every ``i`` in ``range(n)`` as one compiled loop."""
        if n > 0:
            self._launcher("cpu", len(args))(n, *args)

    def launch_cuda(self, n, *args, stream=0, simulator=False):
        """Run the body as a CUDA grid of at least ``n`` threads on ``stream``."""
        if n <= 0:
            return
        threads = min(n, _SIM_THREADS) if simulator else _CUDA_THREADS
        blocks = (n + threads - 1) // threads
        launcher = self._launcher("cuda", len(args))
        if simulator or not (isinstance(stream, int) and stream == 0):
            launch_counting_compilation(launcher, lambda: launcher[blocks, threads, stream](n, *args))
            return
        if launcher not in self._fast:
            from ._launch_cache import LaunchCache

            self._fast[launcher] = LaunchCache(launcher)
        fast = self._fast[launcher]
        launch_counting_compilation(launcher, lambda: fast.launch(blocks, threads, (n, *args)))

    def __call__(self, *args):
        return self.py_func(*args)


def kernel(body):
    """Mark ``body(i, *args)`` as a rafi kernel: run with ``fwd.launch(body, n, *args)``."""
    return Kernel(body)
