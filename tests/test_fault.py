"""Fault test: a ray-tracer run under mpirun loses a rank to SIGKILL at a random moment;
restarted from its last checkpoint it gives the image of an uninterrupted run."""

import os
import signal
import subprocess
import time

import numpy as np
import pytest

from jobs import finish, start

RENDER = ["-m", "rafi.examples.raytrace", "--width", "40", "--height", "30", "--samples", "80",
          "--bounces", "2", "--grid", "6", "--backend", "cpu", "--quiet",
          "--samples-per-pass", "2"]  # fmt: skip


def launch(args):
    return start(2, [*RENDER, *args])


def ranks_of(token):
    """PIDs of the Python ranks whose command line holds ``token``."""
    out = subprocess.run(["pgrep", "-f", f"python.*{token}"], capture_output=True, text=True).stdout
    return [int(pid) for pid in out.split()]


@pytest.mark.timeout(900)
def test_sigkill_then_resume_gives_the_uninterrupted_image(tmp_path):
    reference = tmp_path / "reference.npy"
    assert finish(launch(["--output", str(reference)])) == 0
    expected = np.load(reference)
    rng = np.random.default_rng(int(time.time()))
    for attempt, delay in enumerate(rng.uniform(0.1, 1.5, 3)):
        out, ck = tmp_path / f"out{attempt}.npy", tmp_path / f"ck{attempt}.h5"
        proc = launch(["--output", str(out), "--checkpoint", str(ck), "--checkpoint-every", "1"])
        deadline = time.time() + 120
        while not ck.exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(delay)
        victims = [pid for pid in ranks_of(out.name) if pid != proc.pid]
        assert victims and proc.poll() is None, "the run ended before it could be killed"
        os.kill(victims[rng.integers(len(victims))], signal.SIGKILL)
        assert finish(proc) != 0
        assert ck.exists()
        resumed = launch(
            ["--output", str(out), "--resume", str(ck), "--checkpoint", str(ck), "--checkpoint-every", "1"]
        )
        assert finish(resumed) == 0
        np.testing.assert_allclose(np.load(out), expected, rtol=1e-9, atol=1e-12)
