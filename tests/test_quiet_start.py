"""A plain ``mpirun`` of a rafi program prints nothing of the MPI library's own.

Open MPI 5's ``osc/ucx`` component prints "OSC UCX component priority set inside component
query failed" on every rank at every shared-memory window where UCX has no RDMA device;
``import rafi`` leaves it out before MPI starts (``_mpi_support.quiet_open_mpi``).
"""

import os
import subprocess
import sys

import pytest

import jobs
from rafi._mpi_support import quiet_open_mpi

SCRIPT = """
import numpy as np
import rafi
from mpi4py import MPI

with rafi.Forwarder(MPI.COMM_WORLD, np.int32, 8, backend="cpu", transport="shm") as fwd:
    fwd.forward()
    print("transport", fwd.transport, flush=True)
"""


def _open_mpi_launcher():
    try:
        said = subprocess.run(["mpirun", "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if "open mpi" not in (said.stdout + said.stderr).lower():
        return None
    return ["mpirun", "--oversubscribe", *(["--allow-run-as-root"] if os.geteuid() == 0 else [])]


def test_rafi_leaves_out_osc_ucx_unless_told_or_rdma_is_there(monkeypatch):
    env = {}
    quiet_open_mpi(env)
    rdma = os.path.isdir("/sys/class/infiniband") and bool(os.listdir("/sys/class/infiniband"))
    assert env == ({} if rdma else {"OMPI_MCA_osc": "^ucx"})
    mine = {"OMPI_MCA_osc": "sm,rdma"}
    quiet_open_mpi(mine)
    assert mine == {"OMPI_MCA_osc": "sm,rdma"}  # the user's choice stands


def test_plain_mpirun_prints_no_osc_ucx_line(tmp_path):
    """The job makes shared-memory windows (transport shm) under a plain ``mpirun`` with only
    the flags a root, oversubscribed run needs: no line of Open MPI's on any rank."""
    launcher = _open_mpi_launcher()
    if launcher is None:
        pytest.skip("needs Open MPI's mpirun")
    (tmp_path / "job.py").write_text(SCRIPT)
    env = jobs.clean_environment({k: v for k, v in os.environ.items() if k != "OMPI_MCA_osc"})
    done = subprocess.run(
        [*launcher, "-n", "2", sys.executable, "job.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("transport shm") == 2
    assert "OSC UCX" not in done.stdout + done.stderr
    assert not done.stderr.strip(), done.stderr[-3000:]


def test_a_job_writes_no_terminal_codes_to_stdout(tmp_path):
    """Where colorama is installed, numba colours its compiler's messages through it, and
    colorama's exit hook wrote a colour reset into every rank's stdout (logs and pipes got
    ``\\x1b[0m`` per rank); ``import rafi`` turns numba's highlighting off."""
    pytest.importorskip("colorama", reason="the stray codes came from colorama's exit hook")
    args = ["-m", "rafi.examples.raytrace", "--width", "32", "--height", "24", "--samples", "1"]
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING"}
    proc = jobs.start(
        2, [*args, "--quiet", "--output", str(tmp_path / "x.png")], env=env, cwd=tmp_path, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err[-3000:]
    assert "wrote" in out and "\x1b" not in out
