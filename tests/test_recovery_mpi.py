"""A program that recovers from an error: nothing lost, nothing stepped twice, nothing hung.

After an exception or a Ctrl-C caught on every rank, ``run()`` (or ``forward()``) called
again either goes on with every item exactly once, or is refused with a ``ConfigError``
that says what to do; ranks whose calls differ complete their rounds; a rank that leaves
or stops makes no peer wait forever.
"""

import os
import re
import signal
import time

import numpy as np
import pytest

import rafi
from conftest import SIMULATOR
from rafi import device
from traffic import all_ranks_ok, to_backend

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(300)]

Item = np.dtype([("key", "i8"), ("hops", "i8")], align=True)


@rafi.kernel
def hop(i, inbox, outbox, size, hops, seen):
    """Count the item here, then send it on to the next rank until it made ``hops`` hops."""
    it = inbox[i]
    device.atomic_add(seen, 0, 1)
    device.atomic_add(seen, 1, it.key)
    if it.hops < hops:
        slot = device.push(outbox, (it.key + it.hops + 1) % size)
        if slot >= 0:
            outbox.items[slot].key = it.key
            outbox.items[slot].hops = it.hops + 1


@rafi.kernel
def hop_or_fail(i, inbox, outbox, size, hops, seen, fail_at):
    """``hop``, but the ``fail_at``-th item this rank steps raises."""
    if device.atomic_add(seen, 2, 1) == fail_at:
        raise ValueError("a bug in the step")
    it = inbox[i]
    device.atomic_add(seen, 0, 1)
    if it.hops < hops:
        slot = device.push(outbox, (it.key + it.hops + 1) % size)
        if slot >= 0:
            outbox.items[slot].key = it.key
            outbox.items[slot].hops = it.hops + 1


def workload():
    """Items a rank, and hops each makes (small under the simulator)."""
    return (4, 3) if SIMULATOR else (60, 6)


def forwarder(comm, backend, mode, n):
    fwd = rafi.Forwarder(comm, Item, 8 * n * comm.Get_size(), backend=backend, mode=mode)
    items = np.zeros(n, Item)
    items["key"] = fwd.rank * n + np.arange(n)
    fwd.send(items, (items["key"] + 1) % fwd.size)
    return fwd


def exactly_once(comm, seen, n, hops):
    """Every item of every rank was stepped once per hop: none twice, none lost."""
    everyone = n * comm.Get_size()
    total = comm.allreduce(rafi.asnumpy(seen)[:2].astype(np.int64))
    return total[0] == everyone * (hops + 1) and total[1] == everyone * (everyone - 1) // 2 * (hops + 1)


def no_gpu_raise(backend):
    if backend == "cuda":  # numba-cuda drops it; its simulator stalls the block's other threads
        pytest.skip("a raise in a CUDA kernel does not reach the host whole")


@pytest.mark.parametrize("mode", ["bsp", "async", "resident"])
def test_a_step_that_raises_refuses_further_rounds(comm, backend, mode):
    """A step raises part-way through its inbox on every rank: which items it stepped is
    unknown, so rounds are refused, saying what to do; the forwarder still closes."""
    no_gpu_raise(backend)
    n, hops = workload()
    with forwarder(comm, backend, mode, n) as fwd:
        seen = to_backend(backend, np.zeros(3, np.int64))
        with pytest.raises(ValueError, match="a bug in the step"):
            fwd.run(hop_or_fail, fwd.size, hops, seen, n + 1)
        refusals = [lambda: fwd.run(hop, fwd.size, hops, seen), lambda: fwd.checkpoint("never.h5")]
        if mode != "async":
            refusals.append(fwd.forward)
        for call in refusals:
            with pytest.raises(
                rafi.ConfigError, match="takes no more rounds: ValueError was raised|its step"
            ) as info:
                call()
            assert "restore a checkpoint" in str(info.value)
    assert fwd._closed  # the with block closed it on every rank, waiting for no one


def interrupt_at(monkeypatch, fwd, mode, count):
    """SIGINT to this process once, as the ``count``-th launch of the step returns (bsp: the
    step's own launch, before run() marked its inbox consumed; resident: the persistent
    kernel's, once the host read its report)."""
    launches = [0]

    def tick():
        launches[0] += 1
        if launches[0] == count:
            os.kill(os.getpid(), signal.SIGINT)

    if mode == "resident":
        engine, original = fwd._engine, fwd._engine._consume

        def consume(*args):
            status = original(*args)
            tick()
            return status

        monkeypatch.setattr(engine, "_consume", consume)
        return
    backend, launch = fwd._backend, fwd._backend.launch

    def launch_then_tick(kernel, n, *args):
        launch(kernel, n, *args)
        if kernel is hop:
            tick()

    monkeypatch.setattr(backend, "launch", launch_then_tick)


@pytest.mark.parametrize("mode", ["bsp", "resident"])
def test_ctrl_c_caught_then_run_again_steps_every_item_once(comm, backend, mode, monkeypatch):
    """Ctrl-C on every rank as a step's launch returns, caught, then run() again: every
    item is stepped exactly once (bsp stepped four items twice before run() held Ctrl-C
    until its inbox was marked consumed)."""
    n, hops = workload()
    with forwarder(comm, backend, mode, n) as fwd:
        seen = to_backend(backend, np.zeros(3, np.int64))
        interrupt_at(monkeypatch, fwd, mode, count=2)
        caught = 0
        while True:
            try:
                result = fwd.run(
                    hop, fwd.size, hops, seen, rounds_per_launch=1 if mode == "resident" else None
                )
                break
            except KeyboardInterrupt:
                caught += 1
        assert caught == 1 and result.alive == 0
        assert all_ranks_ok(comm, exactly_once(comm, seen, n, hops))


def interrupt_while_waiting(monkeypatch):
    """Ctrl-C, once, the first time this rank's host waits for others in a round: its kernel
    back from a wait on the device (one node), or the host inside the exchange between
    nodes; both answer census questions meanwhile (``service``)."""
    from rafi import _liveness
    from rafi._engines import _resident

    original = _liveness.service

    def service(what=None):
        monkeypatch.setattr(_liveness, "service", original)
        monkeypatch.setattr(_resident, "service", original)
        raise KeyboardInterrupt

    monkeypatch.setattr(_liveness, "service", service)
    monkeypatch.setattr(_resident, "service", service)


def test_a_resident_round_interrupted_while_waiting_ends_by_forward_or_run(
    comm, backend, monkeypatch, tmp_path
):
    """Ctrl-C comes while each rank's kernel is back on its host inside a wait (rank 0 is
    late, then rank 1 is): the round is under way, so a checkpoint is refused until forward()
    ends it, which leaves its items in the inbox, and run() steps them first: every item
    once."""
    n, hops = workload()
    rank = comm.Get_rank()
    with forwarder(comm, backend, "resident", n) as fwd:
        seen = to_backend(backend, np.zeros(3, np.int64))
        interrupt_while_waiting(monkeypatch)
        if rank == 0:
            time.sleep(0.5)  # longer than a kernel's time slice
        with pytest.raises(KeyboardInterrupt):
            fwd.run(hop, fwd.size, hops, seen)
        if rank != 0:
            time.sleep(0.5)  # now rank 0 waits for this one, and is interrupted too
        with pytest.raises(rafi.ConfigError, match="round 0 is under way"):
            fwd.checkpoint(str(tmp_path / "mid-round.h5"))
        result = fwd.forward()  # ends the round, stepping nothing
        assert result.round == 0 and len(fwd.inbox) == result.received
        result = fwd.run(hop, fwd.size, hops, seen)
        assert result.alive == 0
        assert all_ranks_ok(comm, exactly_once(comm, seen, n, hops))


@pytest.mark.parametrize("mode", ["bsp", "resident"])
def test_ranks_whose_calls_differ_complete(comm, backend, mode):
    """Rank 0 runs 2 rounds, then forward()s one, then runs to the end; the others run 3
    rounds, then to the end: the same rounds on every rank, every item once, no rank waiting
    in a collective another never joins (resident rounds have none on the host)."""
    n, hops = workload()
    with forwarder(comm, backend, mode, n) as fwd:
        seen = to_backend(backend, np.zeros(3, np.int64))
        if fwd.rank == 0:
            fwd.run(hop, fwd.size, hops, seen, rounds=2)
            fwd.forward()
        else:
            fwd.run(hop, fwd.size, hops, seen, rounds=3)
        result = fwd.run(hop, fwd.size, hops, seen)
        assert result.alive == 0
        assert all_ranks_ok(comm, exactly_once(comm, seen, n, hops))


def test_a_rank_closing_while_the_others_run_is_rank_left(comm, backend):
    """Resident: rank 1 leaves its with block while the others call run(): they raise
    RankLeft; rank 1's close() waits for no one that stopped."""
    n, hops = workload()
    left = "rank\\(s\\) \\[1\\] closed their Forwarder"
    try:
        with forwarder(comm, backend, "resident", n) as fwd:
            seen = to_backend(backend, np.zeros(3, np.int64))
            if fwd.rank != 1:
                with pytest.raises(rafi.RafiError, match=left):
                    fwd.run(hop, fwd.size, hops, seen)
    except rafi.RafiError as error:  # across nodes rank 1's close meets their round: it hears it too
        assert fwd.rank == 1 and re.search(left, str(error))
    assert fwd._closed


def test_a_rank_that_goes_on_after_an_error_hangs_no_close(comm, backend):
    """Resident: rank 1 leaves its with block by an exception it catches outside and goes
    on; the others' close() at the end of their with block does not wait for it forever."""
    n, hops = workload()
    try:
        with forwarder(comm, backend, "resident", n) as fwd:
            seen = to_backend(backend, np.zeros(3, np.int64))
            fwd.run(hop, fwd.size, hops, seen, rounds=1)
            if fwd.rank == 1:
                raise LookupError("rank 1 gives up")
    except LookupError:
        pass
    assert fwd._closed


def test_a_resident_step_that_does_not_compile_is_named(comm, backend):
    """As in bsp: a ConfigError naming the kernel and its arguments, without colours."""
    if backend == "cuda" and SIMULATOR:
        pytest.skip("the simulator runs the body in Python: it types nothing")
    with rafi.Forwarder(comm, Item, 8, backend=backend, mode="resident") as fwd:
        with pytest.raises(rafi.ConfigError, match="kernel hop cannot be compiled") as info:
            fwd.run(hop, fwd.size, 3, "not an array")
        assert "\x1b[" not in str(info.value)


@pytest.mark.parametrize("name", ["rounds", "rounds_per_launch"])
def test_run_refuses_counts_beyond_int64(comm, name):
    with rafi.Forwarder(comm, Item, 8, backend="cpu", mode="resident") as fwd:
        with pytest.raises(rafi.ConfigError, match=f"run\\({name}=9223372036854775808\\)"):
            fwd.run(hop, fwd.size, 3, np.zeros(3, np.int64), **{name: 2**63})
