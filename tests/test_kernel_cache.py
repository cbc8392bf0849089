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
