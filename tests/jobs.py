"""Run MPI jobs the way a user does (``launch/local.sh N COMMAND``), from serial tests."""

import os
import signal
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOCAL = os.path.join(ROOT, "launch", "local.sh")


def start(ranks, args, **kwargs):
    """Start ``python ARGS`` on ``ranks`` ranks in a process group of its own."""
    kwargs.setdefault("cwd", ROOT)
    return subprocess.Popen([LOCAL, str(ranks), sys.executable, *args], start_new_session=True, **kwargs)


def finish(proc, timeout=180):
    """Wait for the job; on timeout kill its whole process group and raise ``TimeoutExpired``."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise


def run(ranks, args, timeout=180, env=None, cwd=None):
    """Run a job to its end; return ``(exit code, stdout, stderr)`` (text)."""
    env = {**os.environ, **(env or {})}
    proc = start(
        ranks, args, env=env, cwd=cwd or ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return proc.returncode, out, err
