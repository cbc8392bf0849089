"""Misuse is a clear rafi error, never a wrap, a raw error or a silent miscount: destinations
of any integer type and size outside [0, size), launch() of a plain function or a bad count,
arguments a kernel cannot take, a bad Reducer n, and one forwarder used from two threads."""

import threading
import time

import numpy as np
import pytest

import rafi

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(60)]


@rafi.kernel
def double(i, values, out):
    out[i] = 2 * values[i]


def wide(size):
    """Destinations outside [0, size) that a cast to int32 would wrap (or that overflow it)."""
    return {
        "int64 2**32+1": np.full(4, 2**32 + 1, np.int64),  # wraps to 1
        "int64 2**32": np.full(4, 2**32, np.int64),  # wraps to 0
        "uint64 max": np.full(4, 2**64 - 1, np.uint64),
        "uint64 2**32+1": np.full(4, 2**32 + 1, np.uint64),
        "python 2**40": 2**40,
        "python 2**70": 2**70,
        "python -5": -5,
        "numpy int64 scalar": np.int64(2**33),
        "0-d array": np.array(2**32 + 1),
        "python size": size,
    }


@pytest.mark.parametrize(
    "case",
    ["int64 2**32+1", "int64 2**32", "uint64 max", "uint64 2**32+1", "python 2**40", "python 2**70",
     "python -5", "numpy int64 scalar", "0-d array", "python size"],
)  # fmt: skip
def test_destinations_that_would_wrap(comm, backend, rounds_mode, case):
    rank, size = comm.Get_rank(), comm.Get_size()
    dest = wide(size)[case]
    with rafi.Forwarder(comm, np.int32, 16, backend=backend, mode=rounds_mode, timeout=30) as fwd:
        fwd.send(np.arange(2, dtype=np.int32), 0)  # a good call: still queued
        if rank == 0:
            fwd.send(np.arange(4, dtype=np.int32) + 100, dest)
        with pytest.raises(rafi.InvalidDestination) as info:
            fwd.forward()
        error = info.value
        expected = int(np.asarray(dest).reshape(-1)[0])
        assert error.ranks == [0] and error.count == 4 and error.example == min(expected, 2**63 - 1)
        assert f"[0, {size})" in str(error) and "send()" in str(error)
        result = fwd.forward()  # nothing of the bad call was queued, nothing was delivered
        got = sorted(rafi.asnumpy(fwd.inbox).tolist())
        assert result.alive == 2 * size and got == (sorted([0, 1] * size) if rank == 0 else [])
        assert fwd.forward().alive == 0


def test_some_destinations_outside_queue_nothing_of_the_call(comm, backend):
    rank = comm.Get_rank()
    with rafi.Forwarder(comm, np.int32, 16, backend=backend, timeout=30) as fwd:
        if rank == 1:
            fwd.send(np.arange(3, dtype=np.int32), np.array([0, 2**40, 1], np.int64))
        with pytest.raises(rafi.InvalidDestination) as info:
            fwd.forward()
        assert (info.value.count, info.value.example, info.value.ranks) == (1, 2**40, [1])
        assert ("call 1:" in str(info.value)) == (rank == 1)
        assert fwd.forward().alive == 0


def test_any_and_every_integer_type_in_range_stay_valid(comm, backend):
    size = comm.Get_size()
    with rafi.Forwarder(comm, np.int32, 32, backend=backend, timeout=30) as fwd:
        fwd.send(np.arange(2, dtype=np.int32), rafi.device.ANY)
        fwd.send(np.arange(2, dtype=np.int32), np.full(2, size - 1, np.uint64))
        fwd.send(np.arange(2, dtype=np.int32), np.int64(0))
        fwd.send(np.arange(2, dtype=np.int32), np.array([0, rafi.device.ANY], np.int64))
        total = 0
        while (result := fwd.forward()).alive:
            total += result.received
        assert comm.allreduce(total) == 8 * size


def test_launch_refuses_what_is_not_a_kernel_or_a_count(comm):
    def plain(i, values, out):
        out[i] = values[i]

    values, out = np.arange(4.0), np.zeros(4)
    with rafi.Forwarder(comm, np.int32, 4, backend="cpu") as fwd:
        with pytest.raises(rafi.ConfigError, match="decorate the function with @rafi.kernel"):
            fwd.launch(plain, 4, values, out)
        for n in (-5, 2.7, 3.0, "4", None, True):
            with pytest.raises(rafi.ConfigError, match="non-negative integer"):
                fwd.launch(double, n, values, out)
        assert not out.any()  # none of them ran anything
        fwd.launch(double, 0, values, out)
        fwd.launch(double, np.int64(3), values, out)
        assert out.tolist() == [0.0, 2.0, 4.0, 0.0]


def test_arguments_a_kernel_cannot_take(comm, backend):
    if backend == "cuda":
        pytest.skip("the simulator runs the body in Python: it types nothing")
    with rafi.Forwarder(comm, np.int32, 4, backend=backend) as fwd:
        with pytest.raises(rafi.ConfigError) as info:
            fwd.launch(double, 3, np.arange(3.0), "not an array")
        text = str(info.value)
        assert "kernel double" in text and "out: unicode_type" in text and "numba says:" in text
        assert type(info.value.__cause__).__name__ == "TypingError"
        with pytest.raises(rafi.ConfigError, match="numba cannot pass out"):
            fwd.launch(double, 3, np.arange(3.0), object())
        arity = r"takes 2 argument\(s\) after i \(values, out\); launch passed 1"
        with pytest.raises(rafi.ConfigError, match=arity):
            fwd.launch(double, 3, np.arange(3.0))
        with pytest.raises(rafi.ConfigError, match="decorate it with @rafi.kernel"):
            fwd.run(lambda i, inbox, outbox: None)


@pytest.mark.parametrize(
    "n, message",
    [
        (10.7, "non-negative integer"),
        (-1, "non-negative integer"),
        (np.zeros((2, 2), np.int64), "non-negative integer"),
        ((3, 4), "non-negative integer"),
        (10**30, "beyond any memory"),
        (2**50, "cannot be allocated"),
    ],
    ids=["float", "negative", "2-d", "tuple", "beyond-int64", "huge"],
)
def test_reducer_n(comm, n, message):
    with pytest.raises(rafi.ConfigError, match=message):
        rafi.Reducer(comm, n, np.float64, backend="cpu", timeout=30)
    with rafi.Reducer(comm, np.int64(5), np.float64, backend="cpu") as red:  # still in step
        red.flush()
        assert red.n == 5


def test_reducer_n_bad_on_one_rank(comm):
    n = 10.7 if comm.Get_rank() == 1 else 10
    with pytest.raises(rafi.ConfigError, match=r"non-negative integer, got 10.7"):
        rafi.Reducer(comm, n, np.float64, backend="cpu", timeout=30)


def test_a_bad_timeout_on_one_rank_is_an_error_on_every_rank(comm):
    timeout = -1 if comm.Get_rank() == 1 else 30
    with pytest.raises(rafi.ConfigError, match="rank 1: timeout=-1"):
        rafi.Forwarder(comm, np.int32, 4, backend="cpu", timeout=timeout)
    with pytest.raises(rafi.ConfigError, match="rank 1: timeout=-1"):
        rafi.Reducer(comm, 4, np.float64, backend="cpu", timeout=timeout)
    with rafi.Forwarder(comm, np.int32, 4, backend="cpu") as fwd:  # still in step
        assert fwd.forward().alive == 0


def test_one_forwarder_from_two_threads(comm, backend):
    """Rank 0 waits in forward() on one thread (rank 1 comes late) while another thread calls
    into the same forwarder: a ConfigError there, and the round is counted right."""
    rank, size = comm.Get_rank(), comm.Get_size()
    with rafi.Forwarder(comm, np.int32, 16, backend=backend, timeout=30) as fwd:
        fwd.send(np.arange(5, dtype=np.int32), (rank + 1) % size)
        if rank == 0:
            results = []
            waiting = threading.Thread(target=lambda: results.append(fwd.forward()))
            waiting.start()
            time.sleep(0.5)  # it is inside forward(), waiting for rank 1
            calls = [
                lambda: fwd.forward(),
                lambda: fwd.send(np.arange(1, dtype=np.int32), 0),
                lambda: fwd.launch(double, 1, np.zeros(1), np.zeros(1)),
                lambda: fwd.checkpoint("never.h5"),
                lambda: fwd.run(double),
            ]
            for call in calls:
                with pytest.raises(rafi.ConfigError, match="one thread at a time") as info:
                    call()
                assert "inside forward()" in str(info.value)
            comm.Barrier()
            waiting.join()
            result = results[0]
        else:
            comm.Barrier()
            result = fwd.forward()
        assert result.received == 5 and result.alive == 5 * size
        assert fwd.forward().alive == 0
        fwd.send(np.arange(1, dtype=np.int32), 0)  # the guard is free again
        assert fwd.forward().alive == size


def test_batches_take_the_guard_between_their_steps(comm):
    """In async mode the loop's own thread may launch between batches; another thread may not
    call in while a step of the loop runs."""
    rank, size = comm.Get_rank(), comm.Get_size()
    with rafi.Forwarder(comm, np.int32, 16, backend="cpu", mode="async", timeout=30) as fwd:
        fwd.send(np.arange(3, dtype=np.int32), (rank + 1) % size)
        got = 0
        for batch in fwd.batches():
            out = np.zeros(len(batch), np.int32)
            fwd.launch(double, len(batch), rafi.asnumpy(batch), out)  # the same thread: allowed
            got += len(batch)
        assert got == 3
