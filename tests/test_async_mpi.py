"""Asynchronous mode: exactly once, flow control, termination and errors without rounds."""

import numpy as np
import pytest

import rafi
from conftest import SIMULATOR
from traffic import (
    all_ranks_ok,
    check_exactly_once,
    hop_dtype,
    make_items,
    push_to,
    random_routes,
    run_async,
    to_backend,
)

pytestmark = pytest.mark.mpi(min_size=2)

ROUTES = 6 if SIMULATOR else 60


@pytest.fixture(params=["poll", "thread"])
def progress(request):
    """Who completes the messages: the loop itself, or a progress thread."""
    return request.param


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_async_exactly_once_with_delays(comm, backend, seed, progress):
    """Random multi-hop routes; random sleeps after batches keep messages in flight while
    other ranks look idle: every item still arrives once, and the loop ends everywhere."""
    paths = random_routes(comm, ROUTES, 4, seed)
    dtype = hop_dtype(24)
    capacity = ROUTES * comm.Get_size()  # every item of the run fits any one outbox
    rng = np.random.default_rng(seed * 100 + comm.Get_rank())
    with rafi.Forwarder(comm, dtype, capacity, backend=backend, mode="async", progress=progress) as fwd:
        assert fwd.mode == "async" and fwd.transport in ("host", "ipc")  # ipc: GPU machine, auto
        assert fwd.async_stats["progress"] == progress
        items = make_items(dtype, fwd.rank, paths[fwd.rank])
        arrived = run_async(fwd, items, delay=lambda r: rng.uniform(0, 0.004))
        stats = dict(fwd._engine.stats)
        totals = fwd.stats.totals()  # one record per turn that moved items: the batches and more
        assert fwd.stats.unit == "batch" and totals["batches"] >= stats["batches"]
        assert totals["items_received"] == stats["items"]
    check_exactly_once(comm, dtype, paths, arrived)
    assert stats["items"] >= len(arrived)
    assert comm.allreduce(totals["items_sent"]) == comm.allreduce(totals["items_received"])


def test_async_termination_waits_for_a_slow_rank(comm, backend, progress):
    """One rank sleeps long before passing its items on; the others, idle meanwhile, must not
    stop: their loops end only once the slow rank's items have arrived and moved on."""
    size = comm.Get_size()
    paths = [[[(r + 1) % size, (r + 2) % size]] * 3 for r in range(size)]
    dtype = hop_dtype(8)
    with rafi.Forwarder(comm, dtype, 3 * size, backend=backend, mode="async", progress=progress) as fwd:
        arrived = run_async(fwd, make_items(dtype, fwd.rank, paths[fwd.rank]), delay=lambda r: 0.3 * (r == 1))
    check_exactly_once(comm, dtype, paths, arrived)


@pytest.mark.parametrize("capacity", [1, 2, 5])
def test_async_flood_one_receiver(comm, backend, capacity, progress):
    """Every rank sends a full outbox to rank 0: no batch exceeds the capacity, nothing is lost."""
    rank, size = comm.Get_rank(), comm.Get_size()
    values = (rank << 16) + np.arange(capacity, dtype=np.int64)
    got = []
    with rafi.Forwarder(comm, np.int64, capacity, backend=backend, mode="async", progress=progress) as fwd:
        fwd.send(values, 0)
        for batch in fwd.batches():
            assert len(batch) <= capacity
            got.append(rafi.asnumpy(batch))
    got = np.sort(np.concatenate(got)) if got else np.zeros(0, np.int64)
    if rank == 0:
        expected = np.sort(np.concatenate([(r << 16) + np.arange(capacity) for r in range(size)]))
        assert all_ranks_ok(comm, np.array_equal(got, expected))
    else:
        assert all_ranks_ok(comm, len(got) == 0)


def test_async_phases_run_again(comm, backend):
    """After the loop ends, more pushes and another batches() loop deliver again."""
    rank, size = comm.Get_rank(), comm.Get_size()
    with rafi.Forwarder(comm, np.int32, 16, backend=backend, mode="async") as fwd:
        for phase in range(3):
            fwd.send(np.full(4, rank * 10 + phase, np.int32), (rank + 1) % size)
            got = np.concatenate([rafi.asnumpy(b) for b in fwd.batches()])
            assert all_ranks_ok(comm, np.array_equal(got, np.full(4, ((rank - 1) % size) * 10 + phase)))


def test_async_a_loop_never_takes_the_next_loops_items(comm, backend, monkeypatch):
    """Ranks learn that a loop ended at different times (the root first). Delay that news on
    every other rank: the root starts its next loop and sends at once, yet each loop yields
    only the items sent in it, and every loop ends on every rank (once a hang)."""
    import time

    from rafi import _termination

    rank, size = comm.Get_rank(), comm.Get_size()
    complete = _termination.Waves._complete

    def late(self, requests, wait):  # a wave's result reaches this rank 0.2 s after it went up
        if not wait and self._sent_up and time.perf_counter() - self.since < 0.2:
            return False
        return complete(self, requests, wait)

    if rank != 0:
        monkeypatch.setattr(_termination.Waves, "_complete", late)
    with rafi.Forwarder(comm, np.int32, 64, backend=backend, mode="async") as fwd:
        got = []  # checked after the loops: a check between them would be a barrier
        for phase in range(3):
            fwd.send(np.full(5, 100 * phase + rank, np.int32), (rank + 1) % size)
            got.append(np.concatenate([rafi.asnumpy(b) for b in fwd.batches()] or [np.zeros(0, np.int32)]))
    expected = [np.full(5, 100 * phase + (rank - 1) % size) for phase in range(3)]
    assert all_ranks_ok(comm, all(np.array_equal(g, e) for g, e in zip(got, expected)))


def test_async_invalid_destination_on_every_rank(comm, backend, progress):
    rank, size = comm.Get_rank(), comm.Get_size()
    dests = np.array([0, size + 3 if rank == 1 else 0, size - 1], np.int32)
    with rafi.Forwarder(comm, np.int32, 8, backend=backend, mode="async", progress=progress) as fwd:
        fwd.launch(push_to, len(dests), fwd.outbox, to_backend(backend, dests))
        with pytest.raises(rafi.InvalidDestination) as info:
            for _ in fwd.batches():
                pass
        assert (info.value.count, info.value.example, info.value.ranks) == (1, size + 3, [1])


def test_async_after_an_error_no_message_crosses_over(comm, backend):
    """A loop left by an error may leave messages in flight; the next forwarders on the same
    communicator must never receive them (MPI must not reuse the old one's context)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    for k in range(5):
        with rafi.Forwarder(comm, np.int64, 64, backend=backend, mode="async") as fwd:
            fwd.send(np.full(20, -1, np.int64), (rank + 1) % size)  # stale if still in flight
            if rank == 1:
                fwd.launch(push_to, 1, fwd.outbox, to_backend(backend, np.array([size + 5], np.int32)))
            with pytest.raises(rafi.InvalidDestination):
                for _ in fwd.batches():
                    pass
        with rafi.Forwarder(comm, np.int64, 64, backend=backend, mode="async") as fwd:
            fwd.send(np.full(3, 100 * k + rank, np.int64), (rank + 1) % size)
            got = np.concatenate([rafi.asnumpy(b) for b in fwd.batches()])
        assert all_ranks_ok(comm, np.array_equal(got, np.full(3, 100 * k + (rank - 1) % size)))


def test_async_overflow_on_every_rank(comm, backend):
    rank = comm.Get_rank()
    with rafi.Forwarder(comm, np.int32, 4, backend=backend, mode="async") as fwd:
        fwd.send(np.arange(4 + 3 * (rank == 0), dtype=np.int32), 0)
        with pytest.raises(rafi.OutboxOverflow) as info:
            for _ in fwd.batches():
                pass
        assert info.value.refused == 3 and info.value.ranks == [0] and info.value.needed == 7


def test_async_bad_send_on_every_rank(comm, backend):
    rank = comm.Get_rank()
    with rafi.Forwarder(comm, np.int32, 4, backend=backend, mode="async") as fwd:
        if rank == 0:
            fwd.send(np.arange(3, dtype=np.int64), 0)  # wrong dtype
        with pytest.raises(rafi.ConfigError, match=r"rank\(s\) \[0\]"):
            for _ in fwd.batches():
                pass


def test_mode_misuse(comm, monkeypatch):
    with pytest.raises(rafi.ConfigError, match="mode"):
        rafi.Forwarder(comm, np.int32, 4, backend="cpu", mode="eventually")
    with rafi.Forwarder(comm, np.int32, 4, backend="cpu", mode="async") as fwd:
        with pytest.raises(rafi.ConfigError, match="batches"):
            fwd.forward()
    with rafi.Forwarder(comm, np.int32, 4, backend="cpu") as fwd:
        with pytest.raises(rafi.ConfigError, match="forward"):
            fwd.batches()
    with pytest.raises(rafi.ConfigError, match="is for mode='bsp'"):
        rafi.Forwarder(comm, np.int32, 4, backend="cpu", mode="async", transport="cuda-aware")
    with pytest.raises(rafi.ConfigError, match="progress='thread' is for mode='async'"):
        rafi.Forwarder(comm, np.int32, 4, backend="cpu", progress="thread")
    with pytest.raises(rafi.ConfigError, match="progress='soon' is not one of"):
        rafi.Forwarder(comm, np.int32, 4, backend="cpu", mode="async", progress="soon")
    monkeypatch.setenv("RAFI_TRANSPORT", "cuda-aware")  # a job-wide choice made for rounds
    with pytest.raises(rafi.ConfigError, match="RAFI_TRANSPORT=cuda-aware is for mode='bsp'"):
        rafi.Forwarder(comm, np.int32, 4, backend="cpu", mode="async")
    monkeypatch.delenv("RAFI_TRANSPORT")
    mixed = ["poll", "thread"][comm.rank % 2]
    with pytest.raises(rafi.ConfigError, match="same progress"):
        rafi.Forwarder(comm, np.int32, 4, backend="cpu", mode="async", progress=mixed)


def test_async_checkpoint_between_loops(comm, backend, tmp_path_factory):
    """Inside a loop items may be on the wire: refused on every rank; after it, saved and
    restored (into an async forwarder) with nothing lost."""
    rank, size = comm.Get_rank(), comm.Get_size()
    path = comm.bcast(str(tmp_path_factory.mktemp("ckpt") / "async.h5") if rank == 0 else None)
    with rafi.Forwarder(comm, np.int32, 8, backend=backend, mode="async") as fwd:
        fwd.send(np.full(2, rank, np.int32), (rank + 1) % size)
        for _ in fwd.batches():
            with pytest.raises(rafi.ConfigError, match="inside a batches"):
                fwd.checkpoint(path)
            break
        for _ in fwd.batches():  # finish the phase
            pass
        fwd.send(np.full(3, 100 + rank, np.int32), (rank + 1) % size)  # queued, not yet moved
        fwd.checkpoint(path)
    restored, _ = rafi.Forwarder.restore(comm, path, backend=backend, mode="async")
    with restored:
        got = np.concatenate([rafi.asnumpy(b) for b in restored.batches()])
    assert all_ranks_ok(comm, np.array_equal(np.sort(got), np.full(3, 100 + (rank - 1) % size)))
