"""A rank that leaves while its peers are inside rafi ends the job, with one line; errors
raised on every rank are printed once. Real jobs, as a user runs them: ``launch/local.sh 3
python script.py`` (``tests/jobs.py``), on the cpu backend.

Every job prints ``SHM <path>`` for the shared-memory files its ranks map at the start; none
may be left once the job has ended.
"""

import os
import re
import textwrap
import time

import pytest

import jobs

HEADER = """
import os, signal, sys, threading, time, warnings
import numpy as np
from mpi4py import MPI
import rafi

for _line in open("/proc/self/maps"):
    if "/dev/shm/" in _line:
        print("SHM", _line.split()[-1], flush=True)


def last():
    print("LAST", time.time(), flush=True)


def forwarding(leave):
    '''Forward empty rounds on every rank until the script ends; ``leave(fwd)`` runs on rank 1
    after round 3 (the others are then in round 4).'''
    with rafi.Forwarder(MPI.COMM_WORLD, np.int32, 8, backend="cpu") as fwd:
        for i in range(10**6):
            fwd.forward()
            if fwd.rank == 1 and i == 3:
                last()
                if leave(fwd) == "break":
                    break
"""

LIMIT = 15  # seconds from the departure to the end of the job


def run_job(tmp_path, body, ranks=3, env=None, limit=120):
    """Run ``body`` on ``ranks`` ranks; return (exit code, stdout, stderr, seconds from the
    last ``LAST`` mark to the end of the job, or None)."""
    script = tmp_path / "job.py"
    script.write_text(HEADER + textwrap.dedent(body))
    code, out, err = jobs.run(ranks, [str(script)], timeout=limit, env=env, cwd=str(tmp_path))
    ended = time.time()
    marks = [float(line.split()[1]) for line in out.splitlines() if line.startswith("LAST ")]
    shm = [line.split()[1] for line in out.splitlines() if line.startswith("SHM ")]
    left = [path for path in shm if os.path.exists(path)]
    assert not left, f"shared-memory files left behind: {left}"
    return code, out, err, ended - max(marks) if marks else None


def rafi_lines(stderr):
    """rafi's lines (the launcher may put a NUL byte before a line it forwards)."""
    lines = (line.lstrip("\x00 ") for line in stderr.splitlines())
    return [line for line in lines if line.startswith("rafi: ")]


def assert_one_line(stderr, expected):
    lines = rafi_lines(stderr)
    assert len(lines) == 1 and expected in lines[0], f"expected one line with {expected!r}:\n{stderr}"
    return lines[0]


def assert_ended(code, after, stderr):
    assert code != 0, stderr
    assert after is not None and after < LIMIT, f"the job took {after} s to end:\n{stderr}"


def test_sys_exit_3_on_one_rank_ends_the_job(tmp_path):
    code, _, err, after = run_job(tmp_path, "forwarding(lambda fwd: sys.exit(3))")
    assert_ended(code, after, err)
    assert code == 3
    assert_one_line(err, "rafi: rank 1 left with sys.exit(3) after forward() round 3")
    assert "ending the job" in err and "Traceback" not in err


def test_sys_exit_0_on_one_rank_ends_the_job_non_zero(tmp_path):
    code, _, err, after = run_job(tmp_path, "forwarding(lambda fwd: sys.exit(0))")
    assert_ended(code, after, err)
    assert_one_line(err, "rafi: rank 1 left with sys.exit(0) after forward() round 3")


def test_keyboard_interrupt_on_one_rank_ends_the_job(tmp_path):
    code, _, err, after = run_job(
        tmp_path,
        """
        def interrupt(fwd):
            raise KeyboardInterrupt

        forwarding(interrupt)
        """,
    )
    assert_ended(code, after, err)
    assert_one_line(err, "rafi: rank 1 left with KeyboardInterrupt (above) after forward() round 3")
    assert err.count("Traceback") == 1


def test_sigint_on_one_rank_ends_the_job(tmp_path):
    code, _, err, after = run_job(tmp_path, "forwarding(lambda fwd: os.kill(os.getpid(), signal.SIGINT))")
    assert_ended(code, after, err)
    assert_one_line(err, "rafi: rank 1 left with KeyboardInterrupt (above) after forward() round 3")


def test_sigterm_to_a_rank_waiting_inside_rafi_ends_the_job(tmp_path):
    """Rank 1 waits in forward() (inside MPI, rank 0 being busy) when SIGTERM comes, as from
    a scheduler's time limit; Python's own handler would wait for that call to return."""
    code, _, err, after = run_job(
        tmp_path,
        """
        with rafi.Forwarder(MPI.COMM_WORLD, np.int32, 8, backend="cpu") as fwd:
            for i in range(4):
                fwd.forward()
            if fwd.rank == 0:
                time.sleep(60)  # busy in its own code
            if fwd.rank == 1:
                threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
                last()
            fwd.forward()
        """,
    )
    assert_ended(code, after, err)
    assert_one_line(err, "rafi: rank 1 left with SIGTERM during forward() round 4; ending the job")


def test_sigterm_to_every_rank_prints_one_line(tmp_path):
    """As a scheduler's time limit under srun: every rank gets SIGTERM at once."""
    code, _, err, after = run_job(
        tmp_path,
        """
        with rafi.Forwarder(MPI.COMM_WORLD, np.int32, 8, backend="cpu") as fwd:
            fwd.forward()
            MPI.COMM_WORLD.Barrier()
            threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
            last()
            while True:
                fwd.forward()
        """,
    )
    assert_ended(code, after, err)
    assert_one_line(err, "rafi: rank 0 left with SIGTERM during forward() round")


def test_sigterm_with_no_rafi_object_open_is_the_default(tmp_path):
    code, _, err, _ = run_job(
        tmp_path,
        """
        if MPI.COMM_WORLD.Get_rank() == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
        """,
        ranks=2,
    )
    assert code != 0 and not rafi_lines(err)
    assert "signal 15" in err  # the launcher's own report: the rank died of it


def test_sigkill_of_one_rank_ends_the_job(tmp_path):
    code, _, err, after = run_job(tmp_path, "forwarding(lambda fwd: os.kill(os.getpid(), signal.SIGKILL))")
    assert_ended(code, after, err)


def test_leaving_the_with_block_early_ends_the_job(tmp_path):
    code, _, err, after = run_job(tmp_path, "forwarding(lambda fwd: 'break')")
    assert_ended(code, after, err)
    assert_one_line(
        err,
        "rafi: rank 1 closed its Forwarder (close() or the end of its with block) while rank(s) "
        "[0, 2] called forward() round 4; ending the job",
    )
    assert "Traceback" not in err


@pytest.mark.parametrize("rank, status, ended", [(2, 0, 1), (1, 5, 5)])
def test_sys_exit_with_a_forwarder_never_closed_ends_the_job_with_its_status(tmp_path, rank, status, ended):
    """Outside any with block: the line says the exit and its status, which the job keeps
    (``sys.exit(0)`` while peers still forward ends it with 1)."""
    code, _, err, after = run_job(
        tmp_path,
        f"""
        fwd = rafi.Forwarder(MPI.COMM_WORLD, np.int32, 8, backend="cpu")
        for i in range(10**6):
            fwd.forward()
            if fwd.rank == {rank} and i == 5:
                last()
                sys.exit({status})
        """,
    )
    assert_ended(code, after, err)
    assert code == ended
    others = [r for r in range(3) if r != rank]
    assert_one_line(
        err,
        f"rafi: rank {rank} left with sys.exit({status}) after forward() round 5 (rank(s) {others} did "
        "not reach their exit within 5 s); ending the job",
    )


@pytest.mark.parametrize(
    "call, said",
    [
        ("fwd.launch(fails, 1, fwd.rank)", "rank 1 left with an uncaught ValueError (above) during launch()"),
        (
            "fwd.run(fails_in_step, fwd.rank)",
            "rank 1 left with an uncaught ValueError (above) during run() round",
        ),
        ("fwd.checkpoint(os.getcwd())", "raised this CheckpointError together during checkpoint()"),
    ],
    ids=["launch", "run", "checkpoint"],
)
def test_the_closing_line_names_the_call_that_raised(tmp_path, call, said):
    code, _, err, after = run_job(
        tmp_path,
        f"""
        @rafi.kernel
        def fails(i, rank):
            if rank == 1:
                raise ValueError("rank 1's kernel")

        @rafi.kernel
        def fails_in_step(i, inbox, outbox, rank):
            if rank == 1:
                raise ValueError("rank 1's step")

        with rafi.Forwarder(MPI.COMM_WORLD, np.int32, 8, backend="cpu") as fwd:
            fwd.send(np.zeros(1, np.int32), (fwd.rank + 1) % fwd.size)
            fwd.forward()
            fwd.send(np.zeros(1, np.int32), (fwd.rank + 1) % fwd.size)
            if fwd.rank == 1:
                last()
            {call}
            fwd.forward()
        """,
    )
    assert code != 0 and after is not None and after < LIMIT, err
    line = assert_one_line(err, said)
    assert "forward()" not in line, line


def test_sys_exit_out_of_a_reducer_ends_the_job(tmp_path):
    code, _, err, after = run_job(
        tmp_path,
        """
        with rafi.Reducer(MPI.COMM_WORLD, 8, np.float64, backend="cpu") as red:
            red.flush()
            if red.rank == 1:
                last()
                sys.exit(2)
            red.flush()
        """,
    )
    assert_ended(code, after, err)
    assert code == 2
    assert_one_line(err, "rafi: rank 1 left with sys.exit(2) with a Reducer open")


def test_an_error_of_every_rank_is_printed_once(tmp_path):
    code, _, err, after = run_job(
        tmp_path,
        """
        with rafi.Forwarder(MPI.COMM_WORLD, np.int32, 4, backend="cpu") as fwd:
            fwd.forward()
            fwd.send(np.zeros(9, np.int32), (fwd.rank + 1) % fwd.size)  # 5 too many on every rank
            last()
            fwd.forward()
        """,
    )
    assert_ended(code, after, err)
    assert err.count("Traceback") == 1 and err.count("OutboxOverflow: ") == 1
    expected = "raised this OutboxOverflow together during forward() round 1; ending the job"
    assert_one_line(err, f"rafi: rank(s) [0, 1, 2] {expected}")


def test_an_error_of_every_rank_while_making_a_forwarder_is_printed_once(tmp_path):
    code, _, err, _ = run_job(tmp_path, 'rafi.Forwarder(MPI.COMM_WORLD, "no such type", 8, backend="cpu")')
    assert code != 0 and err.count("Traceback") == 1, err
    assert_one_line(err, "rafi: every rank raised this ConfigError together while making a Forwarder")


@pytest.mark.parametrize(
    "body, env, said",
    [
        (
            'rafi.Forwarder(MPI.COMM_WORLD, np.int32, 8, backend="cpu")',
            {"RAFI_BACKNED": "cpu"},
            "ranks 0, 1, 2: unknown environment variable RAFI_BACKNED='cpu'",
        ),
        (
            'rafi.Reducer(MPI.COMM_WORLD, 4, np.float64, backend="cpu")',
            {"RAFI_TIMEOUT": "soon"},
            "ranks 0, 1, 2: RAFI_TIMEOUT='soon'",
        ),
        (
            'rafi.Forwarder(MPI.COMM_WORLD, np.int32, 8 + MPI.COMM_WORLD.Get_rank(), backend="cpu")',
            None,
            "all ranks must pass the same capacity (rank 0: 8, rank 1: 9, rank 2: 10)",
        ),
    ],
    ids=["misspelt-variable", "reducer-bad-timeout", "capacities-differ"],
)
def test_a_setting_refused_on_every_rank_is_printed_once(tmp_path, body, env, said):
    """Refused after every rank agreed: one traceback, its message once, one closing line."""
    code, _, err, _ = run_job(tmp_path, body, env=env)
    assert code != 0 and err.count("Traceback") == 1 and err.count(said) == 1, err
    assert_one_line(err, "rafi: every rank raised this ConfigError together while making a")


def test_an_error_of_every_rank_with_different_messages_lists_the_ranks_per_message(tmp_path):
    code, _, err, after = run_job(
        tmp_path,
        """
        with rafi.Forwarder(MPI.COMM_WORLD, np.int32, 4, backend="cpu") as fwd:
            fwd.forward()
            if fwd.rank > 0:
                fwd.send(np.zeros(2, np.float64), 0)  # each rank's message names its own call
            last()
            fwd.forward()
        """,
    )
    assert_ended(code, after, err)
    assert err.count("Traceback") == 1
    lines = rafi_lines(err)
    assert len(lines) == 3, err
    assert lines[0].startswith("rafi: rank(s) [1] raised instead: ConfigError: ") and "(rank 1)" in lines[0]
    assert lines[1].startswith("rafi: rank(s) [2] raised instead: ConfigError: ") and "(rank 2)" in lines[1]
    expected = "raised this ConfigError together during forward() round 1; ending the job"
    assert lines[2] == f"rafi: rank(s) [0, 1, 2] {expected}"


def test_a_warning_of_every_rank_is_shown_once(tmp_path):
    code, _, err, _ = run_job(
        tmp_path,
        """
        warnings.warn("rafi: the same on every rank", rafi._errors.RafiWarning)
        warnings.warn("rafi: also by its text")
        """,
    )
    assert code == 0
    assert err.count("RafiWarning: rafi: the same on every rank") == 1
    assert err.count("UserWarning: rafi: also by its text") == 1


def test_a_checkpoint_being_written_is_removed_when_the_job_is_killed(tmp_path):
    """Rank 1 dies while it writes its part: rank 0, which made the file, removes it as the
    launcher ends the job (its SIGTERM comes 0.2 s before its SIGKILL)."""
    code, _, err, after = run_job(
        tmp_path,
        """
        import rafi._checkpoint as ckpt

        with rafi.Forwarder(MPI.COMM_WORLD, np.int32, 8, backend="cpu") as fwd:
            fwd.forward()
            if fwd.rank == 1:
                def dies(group, name, array):
                    last()
                    os.kill(os.getpid(), signal.SIGKILL)

                ckpt._put = dies
            fwd.checkpoint("c.h5")
        """,
    )
    assert_ended(code, after, err)
    assert sorted(os.listdir(tmp_path)) == ["job.py"]


def test_normal_ends_print_nothing(tmp_path):
    """All ranks end together: after closing, without ever closing (rank 0 a little later), and
    by sys.exit(0) out of the with block on every rank."""
    code, _, err, _ = run_job(
        tmp_path,
        """
        with rafi.Forwarder(MPI.COMM_WORLD, np.int32, 8, backend="cpu") as fwd:
            fwd.forward()
        kept = rafi.Forwarder(MPI.COMM_WORLD, np.int32, 8, backend="cpu")
        kept.forward()
        if kept.rank == 0:
            time.sleep(2)
        """,
    )
    assert code == 0 and not rafi_lines(err) and "Traceback" not in err, err
    code, _, err, _ = run_job(
        tmp_path,
        """
        with rafi.Forwarder(MPI.COMM_WORLD, np.int32, 8, backend="cpu") as fwd:
            fwd.forward()
            sys.exit(0)
        """,
    )
    assert code == 0 and not rafi_lines(err) and "Traceback" not in err, err


def test_the_exit_wait_is_a_setting(tmp_path):
    """RAFI_EXIT_WAIT: how long a rank leaving with rafi objects open waits for the others."""
    code, _, err, after = run_job(
        tmp_path, "forwarding(lambda fwd: sys.exit(4))", env={"RAFI_EXIT_WAIT": "0.5"}
    )
    assert_ended(code, after, err)
    line = assert_one_line(err, "rafi: rank 1 left with sys.exit(4)")
    assert re.search(r"did not reach their exit within 0.5 s", line)


def test_leaving_a_resident_forwarder_early_ends_the_job(tmp_path):
    """Resident rounds: the kernels waiting for the rank that closed see its flag."""
    code, _, err, after = run_job(
        tmp_path,
        """
        with rafi.Forwarder(MPI.COMM_WORLD, np.int32, 8, backend="cpu", mode="resident") as fwd:
            for i in range(10**6):
                fwd.forward()
                if fwd.rank == 1 and i == 3:
                    last()
                    break
        """,
    )
    assert_ended(code, after, err)
    assert_one_line(
        err,
        "rafi: rank(s) [1] closed their Forwarder (close() or the end of its with block) while rank 0 "
        "called forward() round 4; ending the job",
    )
    assert "Traceback" not in err


def _node_files():
    return (
        {name for name in os.listdir("/dev/shm") if name.startswith("rafi-")}
        if os.path.isdir("/dev/shm")
        else set()
    )


@pytest.mark.parametrize("how", ["dies", "stalls"])
def test_a_rank_lost_while_a_resident_forwarder_is_made_leaves_no_file(tmp_path, how):
    """Rank 1 dies (or stalls past the deadline) between rank 0 making the node's memory
    and mapping it: the file is gone once the job has ended (rank 0 removes it as it is
    ended, or when its deadline passes; a later forwarder removes one whose maker was
    killed outright)."""
    before = _node_files()
    lose = "os._exit(3)" if how == "dies" else "time.sleep(30)"
    code, _, err, _ = run_job(
        tmp_path,
        f"""
        from rafi._transports import _mailboxes
        if MPI.COMM_WORLD.Get_rank() == 1:
            _mailboxes._map = lambda path, nbytes: {lose}
        rafi.Forwarder(MPI.COMM_WORLD, np.int32, 8, backend="cpu", mode="resident")
        """,
        env={"RAFI_TIMEOUT": "2"},
    )
    assert code != 0, err
    code, _, err, _ = run_job(
        tmp_path, 'rafi.Forwarder(MPI.COMM_WORLD, np.int32, 8, backend="cpu", mode="resident").close()'
    )
    assert code == 0, err
    assert not (_node_files() - before)
