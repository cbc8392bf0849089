"""Kernels cached on disk: a second start of a program compiles nothing it compiled before.

Numba caches a compiled function next to its source file and checks only that file's
time stamp, so a change in a function it calls goes unseen. A ``@rafi.kernel`` launcher
is generated source; here it is written to a file named by a hash of everything its
machine code depends on: the launcher's own source, the source files of the kernel body
and of the functions and modules it reaches by name (followed through their globals),
rafi's own sources, the versions of numba, numba-cuda and Python, and, for the cpu,
whether ``RAFI_BOUNDSCHECK`` checks indices (numba's own cache index keys no compile
flags). Any edit among them names a new file, which compiles afresh; stale files are
never read again.

The cache lives in ``RAFI_CACHE_DIR`` (default ``$XDG_CACHE_HOME/rafi`` or
``~/.cache/rafi``); ``RAFI_CACHE=0`` turns it off, and an unwritable directory falls back
to compiling in memory, as do kernels under the CUDA simulator (which compiles nothing)
and kernels whose module cannot be imported by name (code run by ``runpy.run_path``).

One compilation per cache entry, however many processes start at once: the ranks of a
node share the cache directory, and on a cold cache each would compile every kernel
itself (N ranks on fewer cores: N times the work). ``serialize_compiles`` makes the
compilation of a disk-cached rafi function (a launcher here, and rafi's own
``cache=True`` helpers) take an exclusive ``flock`` on a lock file beside the entry's
numba index: the first process compiles and writes the cache; the others, blocked on the
lock, then find the entry and load it. No MPI is involved, so it also serves processes of
different jobs. The kernel releases a lock when its holder dies, so a rank that crashes
while compiling blocks no one; where ``flock`` is refused (some network file systems),
each process compiles as before. A wait counts in ``compile_seconds``: it is a peer's
compilation.
"""

import contextlib
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

from ._config import env_boundscheck
from ._targets import simulator

__all__ = [
    "cache_dir",
    "compile_seconds",
    "launch_counting_compilation",
    "load_launcher",
    "loading_counts_as_compilation",
    "serialize_compiles",
]

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


def load_launcher(source, namespace, body, target, checked=None):
    """Run ``source`` (defining ``launcher``) with ``namespace`` as its globals; return
    ``(launcher, cached)``: ``cached`` when it lives in a file numba may cache beside.
    ``checked``: compiled with index checks (cpu; None: as ``RAFI_BOUNDSCHECK`` says now)."""
    importable = body.__module__ in sys.modules  # cached code finds the body's globals by module name
    directory = cache_dir() if importable and not (target == "cuda" and simulator()) else None
    if directory is None:
        exec(compile(source, "<rafi.kernel>", "exec"), namespace)
        return namespace["launcher"], False
    source = f"# rafi.kernel launcher of {body.__module__}.{body.__qualname__}\n{source}"  # one per kernel
    checked = env_boundscheck() if checked is None else checked
    checked = f"boundscheck={int(target == 'cpu' and checked)}"  # numba's cache keys no flags
    name = "rafi_launch_" + hashlib.sha256((source + _stamp(body) + checked).encode()).hexdigest()[:24]
    path = os.path.join(directory, name + ".py")
    if not os.path.exists(path):
        _publish(path, source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    module.__dict__.update(namespace)
    spec.loader.exec_module(module)
    sys.modules[name] = module  # numba's cached code finds its globals by the module's name
    return module.launcher, True


def _publish(path, source):
    """Write ``source`` to ``path`` unless a racing process already did: the first file stays.

    numba keys its cache index by the source file's time stamp; a second process replacing
    the file (same text, new time) would make the first one's compiled code stale."""
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "w") as f:
        f.write(source)
    try:
        os.link(tmp, path)  # atomic, and refuses to replace
    except FileExistsError:
        pass
    except OSError:  # a file system without hard links: replace, as a last resort
        os.replace(tmp, path)
        return
    os.unlink(tmp)


def _owned(filename):
    """Whether a function defined in ``filename`` is rafi's: a generated launcher, or a
    function in rafi's sources (``_RAFI_ROOTS``)."""
    if os.path.basename(filename).startswith("rafi_launch_"):
        return True
    try:
        path = pathlib.Path(filename).resolve()
    except (OSError, RuntimeError):
        return False
    return any(path.is_relative_to(root.resolve()) for root in _RAFI_ROOTS)


def _lock_file(dispatcher):
    """The lock file of ``dispatcher``'s disk cache entry, or None: not rafi's, or no disk
    cache (numba's ``NullCache``: ``cache=False``, or an unwritable directory)."""
    known = dispatcher.__dict__.get("_rafi_lock_file", False)
    if known is not False:
        return known
    index = getattr(getattr(getattr(dispatcher, "_cache", None), "_cache_file", None), "_index_path", None)
    code = getattr(getattr(dispatcher, "py_func", None), "__code__", None)
    lock = f"{index}.lock" if index and code is not None and _owned(code.co_filename) else None
    dispatcher.__dict__["_rafi_lock_file"] = lock
    return lock


def _compiling_here():
    """Whether this thread already holds a numba compiler lock (a nested compilation: a
    file lock taken now could wait on a process that waits on this one's compiler).
    numba-cuda's global lock takes numba's too; its own is checked where numba is absent."""
    for module, name in (
        ("numba.core.compiler_lock", "global_compiler_lock"),
        ("numba.cuda.core.compiler_lock", "_numba_cuda_compiler_lock"),
    ):
        lock = getattr(sys.modules.get(module), name, None)
        owned = getattr(getattr(lock, "_lock", None), "_is_owned", None)  # an RLock's
        if callable(owned) and owned():
            return True
    return False


@contextlib.contextmanager
def _exclusive(path):
    """Hold an exclusive ``flock`` on ``path`` (created if missing); count a wait for
    another process that holds it as compilation (not an uncontended lock's call, which a
    busy machine can stretch past a millisecond). Where the lock cannot be had, go on
    without it."""
    try:
        import fcntl

        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except (ImportError, OSError):  # not POSIX, or an unwritable directory
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another process holds it: it compiles what this one needs
            started = time.perf_counter()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError:
                pass
            if _clock is not None:
                with _clock._lock:
                    _clock.seconds += time.perf_counter() - started
        except OSError:  # ENOLCK, EOPNOTSUPP: a file system without locks
            pass
        yield
    finally:
        os.close(fd)  # releases the lock


def _serialized(compile):
    @functools.wraps(compile)
    def serialized_compile(self, sig):
        lock = _lock_file(self)
        if lock is None or _compiling_here():
            return compile(self, sig)
        with _exclusive(lock):
            return compile(self, sig)  # loads what a process that held the lock wrote, else compiles

    serialized_compile.rafi_serialized = True
    return serialized_compile


def serialize_compiles():
    """Make compilations of rafi's disk-cached functions one per cache entry across the
    processes sharing the cache (module docstring); idempotent. Wraps ``compile`` of
    numba's CPU dispatcher, and of numba-cuda's once ``numba.cuda`` has been imported; it
    acts only on rafi's functions that have a disk cache, and leaves others untouched."""
    from numba.core.dispatcher import Dispatcher

    cuda = getattr(sys.modules.get("numba.cuda.dispatcher"), "CUDADispatcher", None)
    for cls in filter(None, (Dispatcher, cuda)):
        compile = getattr(cls, "compile", None)  # None: the simulator's, which compiles nothing
        if compile is not None and not getattr(compile, "rafi_serialized", False):
            cls.compile = _serialized(cls.compile)


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


def loading_counts_as_compilation(load):
    """Run ``load()`` (a kernel compiled, or loaded from the disk cache, before its first
    launch) and count its whole time as compilation: loading a large kernel from the cache
    takes a noticeable part of a second, once per process, which no run should count."""
    counted, started = compile_seconds(), time.perf_counter()
    result = load()
    _clock.seconds += (time.perf_counter() - started) - (compile_seconds() - counted)
    return result


def _compiled(dispatcher):
    """How many kernels ``dispatcher`` has compiled (not loaded from the disk cache):
    numba-cuda's cache misses, which count every compilation, cache or not."""
    misses = getattr(dispatcher, "_cache_misses", None)
    if misses is not None:
        return sum(misses.values())
    return len(getattr(dispatcher, "overloads", ()))


def compile_seconds():
    """Seconds this process has spent compiling kernels with numba since ``import rafi``
    (rafi's, the user's and any other njit or CUDA function), and waiting for another
    process that compiled one of rafi's into the shared cache. Time a program's work
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
