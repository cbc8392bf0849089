"""``@rafi.kernel``: one per-item body compiled as a CUDA kernel, an njit loop, or simulated.

A body numba cannot compile for the arguments of a launch is a ``ConfigError`` naming the
kernel, its parameters, what each argument was typed as (and any numba cannot pass at
all), and numba's own first complaint with its line; numba's error is chained.
``RAFI_BOUNDSCHECK=1`` compiles cpu bodies and launchers with numba's index checks.
"""

import functools
import inspect
import re
import sys

from ._config import env_boundscheck
from ._errors import ConfigError
from ._kernel_cache import launch_counting_compilation, load_launcher, serialize_compiles

__all__ = ["kernel", "Kernel", "typing_errors"]

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

    def _launcher(self, target, nargs, checked=False):
        checked = target == "cpu" and checked
        key = (target, nargs, checked)
        if key not in self._compiled:
            if target == "cpu":
                import numba

                namespace = {"body": numba.njit(nogil=True, boundscheck=checked)(self.py_func)}
                source = _source(_CPU_LOOP, nargs)
                launcher, cached = load_launcher(source, namespace, self.py_func, target, checked)
                self._compiled[key] = numba.njit(nogil=True, cache=cached, boundscheck=checked)(launcher)
            else:
                from numba import cuda

                serialize_compiles()  # numba-cuda's dispatcher too, now that it is imported
                namespace = {"body": cuda.jit(device=True)(self.py_func), "cuda": cuda}
                launcher, cached = load_launcher(_source(_CUDA_GRID, nargs), namespace, self.py_func, target)
                self._compiled[key] = cuda.jit(cache=cached)(launcher)
        return self._compiled[key]

    def launch_cpu(self, n, *args, checked=None):
        """Run the body for every ``i`` in ``range(n)`` as one compiled loop, with index
        checks when ``checked`` (None: as ``RAFI_BOUNDSCHECK`` says now; a cpu backend reads
        it once, when its forwarder is made, since reading the environment costs about a
        microsecond a launch).

        Raises:
            ConfigError: the body cannot be compiled for ``args`` (numba's error chained).
            IndexError: under ``RAFI_BOUNDSCHECK=1``, the body indexed an array out of its
                bounds (the kernel named).
        """
        if n > 0:
            checked = env_boundscheck() if checked is None else checked
            launcher = self._launcher("cpu", len(args), checked)
            try:
                launcher(n, *args)
            except typing_errors() as exc:
                raise ConfigError(self._cannot_compile(args, exc)) from exc
            except IndexError as exc:
                if not checked:
                    raise
                name = getattr(self.py_func, "__qualname__", repr(self.py_func))
                raise IndexError(f"kernel {name} (RAFI_BOUNDSCHECK=1): {exc}") from exc

    def launch_cuda(self, n, *args, stream=0, simulator=False):
        """Run the body as a CUDA grid of at least ``n`` threads on ``stream``.

        Raises:
            ConfigError: the body cannot be compiled for ``args`` (numba's error chained).
        """
        if n <= 0:
            return
        try:
            self._launch_cuda(n, args, stream, simulator)
        except typing_errors() as exc:
            raise ConfigError(self._cannot_compile(args, exc)) from exc

    def _cannot_compile(self, args, error):
        """The message of a launch whose body numba could not compile for ``args``."""
        name = getattr(self.py_func, "__qualname__", repr(self.py_func))
        try:
            signature = inspect.signature(self.py_func)
            params = list(signature.parameters)[1:]  # after i
            signature.bind(0, *args)
        except TypeError:  # a count that does not match (or a body inspect cannot read)
            return (
                f"kernel {name} takes {len(params)} argument(s) after i ({', '.join(params)}); "
                f"launch passed {len(args)}"
            )
        except ValueError:
            params = [f"a{k}" for k in range(len(args))]
        typed, untypable = [], []
        for param, arg in zip(params, args):
            kind = _numba_type(arg)
            typed.append(f"{param}: {kind or type(arg).__name__}")
            if kind is None:
                untypable.append(f"{param} (of type {type(arg).__name__})")
        text = f"kernel {name} cannot be compiled for the arguments it was given ({'; '.join(typed)})"
        if untypable:
            text += f"; numba cannot pass {', '.join(untypable)} to a compiled kernel"
        return f"{text}. numba says: {_first_complaint(error)}"

    def _launch_cuda(self, n, args, stream, simulator):
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
        if not fast.launch_prepared(blocks, threads, (n, *args)):
            launch_counting_compilation(launcher, lambda: fast.launch(blocks, threads, (n, *args)))

    def __call__(self, *args):
        return self.py_func(*args)


def typing_errors():
    """numba's and numba-cuda's ``TypingError`` classes (numba-cuda has its own)."""
    from numba.core.errors import TypingError

    cuda = getattr(sys.modules.get("numba.cuda.core.errors"), "TypingError", None)
    return (TypingError, cuda) if cuda is not None else (TypingError,)


def _numba_type(arg):
    """What numba types ``arg`` as (text), or None when it cannot pass it to compiled code."""
    import numba

    try:
        kind = numba.typeof(arg)
    except ValueError:
        return None
    return None if kind is None or str(kind) == "pyobject" else str(kind)


def _first_complaint(error):
    """numba's message in a line or two: its first complaint (the reason, and the call it
    could not type), and where in the body, without colours or its pipeline's steps."""
    lines = [line.strip() for line in re.sub(r"\x1b\[[0-9;]*m", "", str(error)).splitlines()]
    skipped = ("Failed in ", "During:", "There are ", "- Of which", 'File "<rafi.kernel>"', "<source missing")
    kept = [line for line in lines if line and not line.startswith(skipped)]
    reason = " ".join(kept[:2]) if len(kept) > 1 and kept[1].startswith(">>>") else (kept[:1] or [""])[0]
    where = next((line for line in lines if line.startswith("File ") and "<rafi.kernel>" not in line), "")
    return f"{reason} ({where.rstrip(':')})" if where else reason


def kernel(body):
    """Mark ``body(i, *args)`` as a rafi kernel: run with ``fwd.launch(body, n, *args)``."""
    return Kernel(body)
