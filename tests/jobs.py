"""Run MPI jobs the way a user does (``launch/local.sh N COMMAND``), from serial tests."""

import os
import signal
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOCAL = os.path.join(ROOT, "launch", "local.sh")


_LAUNCHER_STATE = ("PMIX_", "OPAL_", "OMPI_MCA_orte_", "OMPI_MCA_ess", "OMPI_MCA_pmix", "OMPI_MCA_initial_")


def clean_environment(environ):
    """``environ`` without what an MPI launcher or singleton put there for this process.

    The test process has initialized MPI (a singleton); Open MPI 4 then exports its
    launcher's state, and an ``mpirun`` started with it exits at once with status 1 and no
    message (seen on the GPU machine's Debian Open MPI 4.1.6). MCA settings of the user's
    own (``OMPI_MCA_btl``, ...) are kept."""

    def launcher_state(name):
        if name.startswith("OMPI_") and not name.startswith("OMPI_MCA_"):
            return True
        return name.startswith(_LAUNCHER_STATE)

    return {k: v for k, v in environ.items() if not launcher_state(k)}


def start(ranks, args, **kwargs):
    """Start ``python ARGS`` on ``ranks`` ranks in a process group of its own."""
    kwargs.setdefault("cwd", ROOT)
    kwargs["env"] = clean_environment(kwargs.get("env") or os.environ)
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
