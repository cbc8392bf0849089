"""Kernels cached on disk: a second start of a program compiles nothing it compiled before.

Numba caches a compiled function next to its source file and checks only that file's
time stamp, so a change in a function it calls goes unseen. A ``@rafi.kernel`` launcher
is generated source; here it is written to a file named by a hash of everything its
machine code depends on: the launcher's own source, the source files of the kernel body
and of the functions and modules it reaches by name (followed through their globals),
rafi's own sources, and the versions of numba, numba-cuda and Python. Any edit among
them names a new file, which compiles afresh; stale files are never read again.

The cache lives in ``RAFI_CACHE_DIR`` (default ``$XDG_CACHE_HOME/rafi`` or
``~/.cache/rafi``); ``RAFI_CACHE=0`` turns it off, and an unwritable directory falls back
to compiling in memory, as do kernels under the CUDA simulator (which compiles nothing)
and kernels whose module cannot be imported by name (code run by ``runpy.run_path``).
"""

import functools
import hashlib
import importlib.util
import inspect
import os
import pathlib
import sys
import threading
import time
import types

from ._targets import simulator

__all__ = ["cache_dir", "load_launcher", "compile_seconds", "launch_counting_compilation"]

_RAFI_ROOTS = [pathlib.Path(__file__).parent, pathlib.Path(__file__).parent.parent / "kernels"]
_SKIP = ("numba", "numpy", "llvmlite", "mpi4py", "cupy")  # libraries: their versions key the cache


def cache_dir():
    """Where launchers and their machine code are cached, or None to compile in memory."""
    if os.environ.get("RAFI_CACHE", "1") == "0":
        return None
    base = os.environ.get("RAFI_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "rafi"
    )
    path = os.path.join(base, "kernels")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        return None
    return path if os.access(path, os.W_OK) else None


@functools.cache
def _library_stamp():
    import numba

    try:
        from importlib.metadata import version

        cuda = version("numba-cuda")
    except Exception:
        cuda = "none"
    sources = sorted(p for root in _RAFI_ROOTS if root.is_dir() for p in root.rglob("*.py"))
    digest = hashlib.sha256(f"{sys.version}|{numba.__version__}|{cuda}".encode())
    for path in sources:
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _source_files(fn, seen):
    """Source files of ``fn`` and of the functions and modules it names, followed through
    their globals (rafi's own and libraries' are keyed as a whole instead)."""
    fn = getattr(fn, "py_func", fn)
    if isinstance(fn, types.ModuleType):
        owner, names = fn, ()
    elif isinstance(fn, types.FunctionType):
        owner, names = inspect.getmodule(fn), fn.__code__.co_names
    else:
        return
    path = getattr(owner, "__file__", None)
    if path is None or path in seen or any(part in _SKIP for part in pathlib.Path(path).parts):
        return
    if any(pathlib.Path(path).resolve().is_relative_to(root.resolve()) for root in _RAFI_ROOTS):
        return
    seen.add(path)
    for name in names:
        _source_files(getattr(owner, name, None), seen)


def _stamp(body):
    """What a launcher's code depends on beyond its own source."""
    files = set()
    _source_files(body, files)
    digest = hashlib.sha256(_library_stamp().encode())
    for path in sorted(files):
        digest.update(path.encode())
        digest.update(pathlib.Path(path).read_bytes())
    return digest.hexdigest()


def load_launcher(source, namespace, body, target):
    """Run ``source`` (defining ``launcher``) with ``namespace`` as its globals; return
    ``(launcher, cached)``: ``cached`` when it lives in a file numba may cache beside."""
    importable = body.__module__ in sys.modules  # cached code finds the body's globals by module name
    directory = cache_dir() if importable and not (target == "cuda" and simulator()) else None
    if directory is None:
        exec(compile(source, "<rafi.kernel>", "exec"), namespace)
        return namespace["launcher"], False
    source = f"# rafi.kernel launcher of {body.__module__}.{body.__qualname__}\n{source}"  # one per kernel
    name = "rafi_launch_" + hashlib.sha256((source + _stamp(body)).encode()).hexdigest()[:24]
    path = os.path.join(directory, name + ".py")
    if not os.path.exists(path):  # ranks may race here: each writes the same text, then renames
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(source)
        os.replace(tmp, path)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    module.__dict__.update(namespace)
    spec.loader.exec_module(module)
    sys.modules[name] = module  # numba's cached code finds its globals by the module's name
    return module.launcher, True


class _CompileClock:
    """Seconds spent in numba compilations (outermost ones: a kernel's callees compile
    inside it), from numba's ``numba:compile`` events; loads from the disk cache are none."""

    def __init__(self):
        self.seconds = 0.0
        self._depth, self._started = 0, 0.0
        self._lock = threading.Lock()

    def on_start(self, event):
        with self._lock:
            if self._depth == 0:
                self._started = time.perf_counter()
            self._depth += 1

    def on_end(self, event):
        with self._lock:
            self._depth -= 1
            if self._depth == 0:
                self.seconds += time.perf_counter() - self._started


_clock = None


def launch_counting_compilation(dispatcher, launch):
    """Run ``launch()``; if it compiled ``dispatcher`` (numba-cuda compiles a kernel at its
    first launch for new argument types, without numba's compile events), count its time as
    compilation, less the events counted inside it (the device functions it compiled). A
    kernel loaded from the disk cache was not compiled."""
    before = _compiled(dispatcher)
    counted, started = compile_seconds(), time.perf_counter()
    launch()
    if _compiled(dispatcher) != before:
        _clock.seconds += (time.perf_counter() - started) - (compile_seconds() - counted)


def _compiled(dispatcher):
    """How many kernels ``dispatcher`` has compiled (not loaded from the disk cache):
    numba-cuda's cache misses, which count every compilation, cache or not."""
    misses = getattr(dispatcher, "_cache_misses", None)
    if misses is not None:
        return sum(misses.values())
    return len(getattr(dispatcher, "overloads", ()))


def compile_seconds():
    """Seconds this process has spent compiling kernels with numba since ``import rafi``
    (rafi's, the user's and any other njit or CUDA function). Time a program's work
    without compilation as elapsed time less the growth of this figure."""
    global _clock
    if _clock is None:
        from numba.core import event

        _clock = _CompileClock()
        listener = type(
            "_Listener", (event.Listener,), {"on_start": _clock.on_start, "on_end": _clock.on_end}
        )
        event.register("numba:compile", listener())
    return _clock.seconds
