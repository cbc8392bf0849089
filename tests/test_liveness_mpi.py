"""Deadlines: a rank that stops taking part is named by the ranks that wait for it.

Each test makes one rank stay away (asleep in its own code, or in another rafi call) longer
than the timeout; the others must raise ``CollectiveTimeout`` naming it, and every rank
then meets again in a barrier of the test's own.
"""

import time

import numpy as np
import pytest
from mpi4py import MPI

import rafi
from traffic import all_ranks_ok

pytestmark = pytest.mark.mpi(min_size=2)

TIMEOUT = 1.5
AWAY = TIMEOUT + 3.0  # longer than the timeout plus the census's grace


def expect_timeout(call):
    with pytest.raises(rafi.CollectiveTimeout) as info:
        call()
    return info.value


def test_forward_names_the_rank_that_stopped(comm, backend, rounds_mode):
    rank, size = comm.Get_rank(), comm.Get_size()
    fwd = rafi.Forwarder(comm, np.int32, 8, backend=backend, timeout=TIMEOUT, mode=rounds_mode)
    fwd.forward()  # kernels compiled or loaded: a rank's compilation is not the wait timed below
    if rank == 1:
        time.sleep(AWAY)  # busy in its own code; then it comes, and finds the others gone
        gone = sorted(set(range(size)) - {1})
        try:
            fwd.forward()  # an empty round may complete: the others' collectives are still posted
            ok = True
        except rafi.CollectiveTimeout as error:  # else it waits for them, in vain
            ok = error.missing == gone
        try:
            fwd.close()  # local after a timeout, or with nothing shared
        except rafi.CollectiveTimeout as error:  # a node barrier (shm) the others never join
            ok = ok and error.missing == gone
        if rounds_mode == "resident":  # it saw the others' abandoned flags: kept, not freed, as
            # their timed-out collectives may still send on it (a freed communicator's context
            # goes to the next one made: the teardown's, here)
            ok = ok and fwd._comm != MPI.COMM_NULL
    else:
        error = expect_timeout(fwd.forward)
        others = sorted(set(range(size)) - {rank, 1})
        ok = (
            error.missing == [1]
            and sorted(error.waiting) == others
            and all("forward() round 1" in text for text in error.waiting.values())
            and "rank(s) [1]" in str(error)
            and error.seconds >= TIMEOUT
        )
        with pytest.raises(rafi.ConfigError, match="after its timeout"):
            fwd.forward()
        fwd.close()  # local: nothing waits for the others
    comm.Barrier()
    assert all_ranks_ok(comm, ok)


def test_batches_name_the_rank_that_stays_in_its_batch(comm, backend):
    rank, size = comm.Get_rank(), comm.Get_size()
    with pytest.raises(rafi.CollectiveTimeout) as info:
        with rafi.Forwarder(comm, np.int32, 8, backend=backend, mode="async", timeout=TIMEOUT) as fwd:
            fwd.send(np.arange(2, dtype=np.int32), 1)
            for _ in fwd.batches():
                if rank == 1:
                    time.sleep(AWAY)  # the others idle in batches(), then time out
    error = info.value
    others = sorted(set(range(size)) - {1})
    ok = error.missing == ([1] if rank != 1 else others)  # rank 1 finds the others gone
    comm.Barrier()
    assert all_ranks_ok(comm, ok)


def test_flush_against_forward_shows_where_each_rank_waits(comm):
    """A mismatch: rank 1 calls forward() while the others flush a Reducer. Nobody is
    missing (every rank waits in rafi); each error says where the others are."""
    rank = comm.Get_rank()
    red = rafi.Reducer(comm, 10, np.float64, backend="cpu", timeout=TIMEOUT)
    fwd = rafi.Forwarder(comm, np.int32, 8, backend="cpu", transport="host", timeout=TIMEOUT)  # local close
    error = expect_timeout(fwd.forward if rank == 1 else red.flush)
    expected = "Reducer.flush()" if rank == 1 else "forward() round 0"
    ok = error.missing == [] and expected in error.waiting.get(1 if rank != 1 else 0, "")
    fwd.close()
    red.close()
    comm.Barrier()
    assert all_ranks_ok(comm, ok)


def test_a_rank_without_a_deadline_answers_the_ranks_with_one(comm):
    """Rank 1 sets no timeout and waits in forward() while the others, with one, flush a
    Reducer. A rank with no deadline of its own may wait inside MPI, deaf to questions,
    only where no rank could ask it; here its peers can, so it must answer where it waits.
    Then the others join its round."""
    rank = comm.Get_rank()
    timeout = None if rank == 1 else TIMEOUT
    red = rafi.Reducer(comm, 10, np.float64, backend="cpu", timeout=timeout)
    fwd = rafi.Forwarder(comm, np.int32, 8, backend="cpu", transport="host", timeout=timeout)
    if rank == 1:
        ok = fwd.forward().alive == 0
    else:
        error = expect_timeout(red.flush)
        ok = error.missing == [] and "forward() round 0" in error.waiting.get(1, "")
        fwd.forward()
    fwd.close()
    red.close()
    comm.Barrier()
    assert all_ranks_ok(comm, ok)


def test_construction_times_out_when_a_rank_never_comes(comm):
    """The communicator is not made, so nobody can be named; the error still comes. (MPI
    cannot cancel the pending duplication: until the late rank joins it, this process can
    make no other communicator. Here it joins, as a late rank would; in a real job the
    uncaught error ends the job.)"""
    rank = comm.Get_rank()
    scratch = comm.Dup()
    if rank == 1:
        time.sleep(AWAY)
        late, made = scratch.Idup()
        made.Wait()
        late.Free()
        ok = True
    else:
        error = expect_timeout(lambda: rafi.Forwarder(scratch, np.int32, 8, backend="cpu", timeout=TIMEOUT))
        ok = error.missing is None and "Forwarder()" in str(error)
    comm.Barrier()
    assert all_ranks_ok(comm, ok)


def test_timeout_comes_from_the_environment(comm, monkeypatch):
    monkeypatch.setenv("RAFI_TIMEOUT", "2.5")
    with rafi.Forwarder(comm, np.int32, 8, backend="cpu") as fwd:
        assert fwd.timeout == 2.5
    with rafi.Forwarder(comm, np.int32, 8, backend="cpu", timeout=4) as fwd:
        assert fwd.timeout == 4.0
    monkeypatch.setenv("RAFI_TIMEOUT", "soon")
    with pytest.raises(rafi.ConfigError, match="RAFI_TIMEOUT='soon'"):
        rafi.Forwarder(comm, np.int32, 8, backend="cpu")
