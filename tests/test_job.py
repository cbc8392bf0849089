"""Job-level liveness, as a user runs a script: ``launch/local.sh N python script.py``.

One rank's uncaught exception, or one rank that stops calling rafi while the others wait
under a deadline, must end the whole job within seconds, non-zero, saying why.
"""

import textwrap
import time

import jobs

HEADER = """
import sys, time
import numpy as np
from mpi4py import MPI
import rafi
"""


def run_job(tmp_path, body, ranks=2, env=None, limit=120):
    """Run ``body`` as a script on ``ranks`` ranks; return (exit code, stderr, seconds after
    the script printed ``LAST``, the moment the failure began)."""
    script = tmp_path / "job.py"
    script.write_text(HEADER + textwrap.dedent(body))
    code, out, err = jobs.run(ranks, [str(script)], timeout=limit, env=env, cwd=str(tmp_path))
    ended = time.time()
    marks = [float(line.split()[1]) for line in out.splitlines() if line.startswith("LAST ")]
    return code, err, ended - max(marks) if marks else None


def test_an_uncaught_exception_on_one_rank_ends_the_job(tmp_path):
    code, stderr, after = run_job(
        tmp_path,
        """
        with rafi.Forwarder(MPI.COMM_WORLD, np.int32, 8, backend="cpu") as fwd:
            fwd.forward()  # kernels compiled: what follows takes no time of its own
            if fwd.rank == 1:
                print("LAST", time.time(), flush=True)
                raise ValueError("a bug on rank 1")
            fwd.forward()  # rank 0 waits here for a rank that will never come
        """,
    )
    assert code != 0
    assert "ValueError: a bug on rank 1" in stderr
    expected = "left with an uncaught ValueError (above) after forward() round 0; ending the job"
    assert f"rafi: rank 1 {expected}" in stderr
    assert after is not None and after < 15, f"the job took {after} s to end"


def test_a_rank_that_stops_calling_rafi_is_named_and_the_job_ends(tmp_path):
    code, stderr, after = run_job(
        tmp_path,
        """
        with rafi.Forwarder(MPI.COMM_WORLD, np.int32, 8, backend="cpu") as fwd:
            fwd.forward()
            if fwd.rank == 1:
                print("LAST", time.time(), flush=True)
                while True:  # stuck in its own code
                    time.sleep(0.1)
            fwd.forward()
        """,
        env={"RAFI_TIMEOUT": "2"},
    )
    assert code != 0
    assert "CollectiveTimeout" in stderr and "rank(s) [1]" in stderr and "forward() round 1" in stderr
    assert after is not None and after < 20, f"the job took {after} s to end"


def test_the_abort_can_be_turned_off(tmp_path):
    """With RAFI_ABORT_ON_EXCEPTION=0 the other rank goes on (here: it finishes on its own)."""
    code, stderr, _ = run_job(
        tmp_path,
        """
        if MPI.COMM_WORLD.Get_rank() == 1:
            raise ValueError("only rank 1 fails")
        print("rank 0 finished", flush=True)
        """,
        env={"RAFI_ABORT_ON_EXCEPTION": "0"},
    )
    assert "ValueError: only rank 1 fails" in stderr and "ending the job" not in stderr
