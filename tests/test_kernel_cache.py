"""Kernels cached on disk: a second start compiles nothing; an edit anywhere a kernel
reaches (its body, a helper in its file, a helper in a module it imports) recompiles."""

import functools
import json
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import SIMULATOR

HELPER = """
import rafi

@rafi.func
def scale(x):
    return x * {factor}
"""

KERNELS = """
import rafi
import helper

OFFSET = 0

@rafi.func
def shift(x):
    return x + {shift}

@rafi.kernel
def fill(i, out):
    out[i] = helper.scale(shift(i)) + OFFSET
"""

MAIN = """
import json, os, sys
import numpy as np
from mpi4py import MPI
import rafi
import kernels

before = rafi.compile_seconds()
with rafi.Forwarder(MPI.COMM_SELF, np.int64, 1, backend=os.environ["BACKEND"]) as fwd:
    compiled_by_forwarder = rafi.compile_seconds() - before
    out = fwd.to_backend(np.zeros(4, np.int64))
    started = rafi.compile_seconds()
    fwd.launch(kernels.fill, 4, out)
    print(json.dumps({"out": rafi.asnumpy(out).tolist(), "kernel": rafi.compile_seconds() - started,
                      "forwarder": compiled_by_forwarder}))
"""


def _write(directory, factor, shift):
    for name, text in (
        ("helper.py", HELPER.format(factor=factor)),
        ("kernels.py", KERNELS.format(shift=shift)),
    ):
        with open(directory / name, "w") as f:
            f.write(textwrap.dedent(text))
    (directory / "main.py").write_text(textwrap.dedent(MAIN))


def _run(directory, cache, backend="cpu", **env):
    path = [str(directory), *filter(None, [os.environ.get("PYTHONPATH")])]  # rafi may come from there
    environ = {
        **os.environ,
        "RAFI_CACHE_DIR": str(cache),
        "PYTHONPATH": os.pathsep.join(path),
        "BACKEND": backend,
        **env,
    }
    done = subprocess.run(
        [sys.executable, str(directory / "main.py")], env=environ, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_second_start_compiles_nothing_and_edits_recompile(tmp_path, backend):
    if SIMULATOR and backend == "cuda":
        pytest.skip("the simulator compiles nothing: there is nothing to cache")
    code, cache = tmp_path / "code", tmp_path / "cache"
    code.mkdir()
    _write(code, factor=2, shift=1)
    run = functools.partial(_run, code, cache, backend)
    first = run()
    assert first["out"] == [2, 4, 6, 8] and first["kernel"] > 0
    second = run()
    assert second["out"] == first["out"]
    assert second["kernel"] == 0 and second["forwarder"] == 0  # everything came from the disk cache
    _write(code, factor=2, shift=5)  # a helper in the kernel's own file
    assert run()["out"] == [10, 12, 14, 16]
    _write(code, factor=3, shift=5)  # a helper in a module the kernel's file imports
    edited = run()
    assert edited["out"] == [15, 18, 21, 24] and edited["kernel"] > 0


def test_cache_off_writes_nothing(tmp_path):
    code, cache = tmp_path / "code", tmp_path / "cache"
    code.mkdir()
    _write(code, factor=2, shift=1)
    assert _run(code, cache, RAFI_CACHE="0")["out"] == [2, 4, 6, 8]
    assert not (cache / "kernels").exists()


RACER = """
import json, os, sys, time
import rafi
import kernels

ready, out = sys.argv[1], sys.argv[2:]
open(os.path.join(ready, str(os.getpid())), "w").close()
while len(os.listdir(ready)) < 2:  # both processes start compiling together
    time.sleep(0.001)
import numpy as np

values = np.zeros(4, np.int64)
kernels.fill.launch_cpu(4, values)
launcher = kernels.fill._compiled[("cpu", 1, False)]
print(json.dumps({"out": values.tolist(), "compiled": sum(launcher.stats.cache_misses.values()),
                  "loaded": sum(launcher.stats.cache_hits.values())}))
"""


def test_processes_sharing_a_cold_cache_compile_a_kernel_once(tmp_path):
    """Two processes launch the same kernel at once into one fresh cache directory (as the
    ranks of a node do): one compiles it, the other waits for the cache and loads it."""
    code, cache, ready = tmp_path / "code", tmp_path / "cache", tmp_path / "ready"
    code.mkdir()
    ready.mkdir()
    _write(code, factor=2, shift=1)
    (code / "racer.py").write_text(textwrap.dedent(RACER))
    path = [str(code), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "RAFI_CACHE_DIR": str(cache), "PYTHONPATH": os.pathsep.join(path)}
    racers = [
        subprocess.Popen(
            [sys.executable, str(code / "racer.py"), str(ready)], env=env, stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    said = [json.loads(r.communicate(timeout=240)[0].strip().splitlines()[-1]) for r in racers]
    assert [r.returncode for r in racers] == [0, 0]
    assert [s["out"] for s in said] == [[2, 4, 6, 8]] * 2
    assert sorted(s["compiled"] for s in said) == [0, 1], said
    assert sorted(s["loaded"] for s in said) == [0, 1], said


def test_only_rafis_disk_cached_functions_take_the_compile_lock(tmp_path):
    import numba

    from rafi import _control
    from rafi._kernel_cache import _lock_file

    helper = _control._own_words  # one of rafi's numba.njit(cache=True) helpers
    assert _lock_file(helper).endswith(".nbi.lock")
    assert os.path.dirname(_lock_file(helper)) == helper.stats.cache_path
    assert _lock_file(numba.njit(lambda x: x)) is None  # no disk cache
    (tmp_path / "user_code.py").write_text(
        "import numba\n\n@numba.njit(cache=True)\ndef f(x):\n    return x\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        import user_code
    finally:
        sys.path.remove(str(tmp_path))
    assert _lock_file(user_code.f) is None  # a user's cached function: left as numba has it


def test_a_racing_writer_keeps_the_first_launcher_file(tmp_path):
    """numba keys its cache by the launcher file's time stamp: a second writer must not
    replace the file (same text, new time) under the first one's compiled code."""
    from rafi._kernel_cache import _publish

    path = tmp_path / "rafi_launch_x.py"
    _publish(str(path), "first = 1\n")
    os.utime(path, (1, 1))
    _publish(str(path), "first = 1\n")
    assert path.stat().st_mtime == 1 and path.read_text() == "first = 1\n"
    assert [p.name for p in tmp_path.iterdir()] == ["rafi_launch_x.py"]  # no temporary left


def test_a_nested_compilation_takes_no_file_lock():
    """Inside numba's compiler lock (a kernel compiling its callees) no file lock is taken:
    one could wait on a process that waits for this one."""
    from numba.core.compiler_lock import global_compiler_lock

    from rafi._kernel_cache import _compiling_here

    assert not _compiling_here()
    with global_compiler_lock:
        assert _compiling_here()


def test_a_process_that_dies_holding_the_compile_lock_blocks_no_one(tmp_path):
    """A rank killed while compiling leaves no lock behind: the kernel releases a flock when
    its holder dies, and the next process takes it at once."""
    import fcntl
    import time

    from rafi._kernel_cache import _exclusive

    lock = str(tmp_path / "launcher.nbi.lock")
    hold = f"import fcntl, os, time; fcntl.flock(os.open({lock!r}, os.O_RDWR | os.O_CREAT), fcntl.LOCK_EX)"
    holder = subprocess.Popen(
        [sys.executable, "-c", f"{hold}; print('held', flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        fd = os.open(lock, os.O_RDWR)
        with pytest.raises(BlockingIOError):  # held while the holder lives
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.close(fd)
    finally:
        holder.kill()
        holder.communicate()
    started = time.perf_counter()
    with _exclusive(lock):
        pass
    assert time.perf_counter() - started < 5


def test_only_a_held_lock_counts_as_compilation(tmp_path, monkeypatch):
    """The disk cache's lock: waiting for another holder counts as compilation (that one
    compiles what this process needs); taking a free lock counts nothing, however long a
    busy machine makes the call."""
    import fcntl
    import threading
    import time

    import rafi
    from rafi import _kernel_cache

    path = str(tmp_path / "lock")
    rafi.compile_seconds()  # the clock runs
    before = rafi.compile_seconds()
    flock = fcntl.flock

    def descheduled(fd, how):  # a busy machine: a blocking call returns 5 ms late
        if not how & fcntl.LOCK_NB:
            time.sleep(0.005)
        return flock(fd, how)

    with monkeypatch.context() as patch:
        patch.setattr(fcntl, "flock", descheduled)
        with _kernel_cache._exclusive(path):
            pass
    assert rafi.compile_seconds() == before, "a free lock counted as compilation"
    holder = os.open(path, os.O_RDWR)
    fcntl.flock(holder, fcntl.LOCK_EX)
    entered = threading.Event()

    def take():
        with _kernel_cache._exclusive(path):
            entered.set()

    taker = threading.Thread(target=take)
    taker.start()
    time.sleep(0.3)
    assert not entered.is_set(), "the lock was taken while another held it"
    os.close(holder)
    taker.join(timeout=30)
    assert entered.is_set() and rafi.compile_seconds() - before >= 0.2
