"""Resident mode: its rounds are bsp's rounds, ``run()`` gives the same results in every mode,
and what only resident mode has (one node, its own transport, checkpoints between launches).

The guarantees' own tests (exactly once, flow control, errors, ANY, termination, deadlines)
run in both modes of rounds through the ``rounds_mode`` fixture (tests/conftest.py).
"""

import time

import numpy as np
import pytest
from mpi4py import MPI

import rafi
from conftest import SIMULATOR
from rafi import device
from rafi.kernels.resident import PUSH_BYTES
from traffic import MAX_HOPS, all_ranks_ok, hop_dtype, make_items, random_routes, run_backlog, to_backend

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(300)]

Item = np.dtype([("key", "i8"), ("hops", "i4"), ("origin", "i4")], align=True)


@rafi.func
def next_rank(key, hops, size):
    """Where an item goes after ``hops`` hops: a hash of its key; one in five goes to ANY."""
    h = ((key % 1000003) * 7919 + hops * 40503 + 12345) % 1000003
    if h % 5 == 0:
        return -2  # device.ANY
    return h % size


@rafi.kernel
def bounce(i, inbox, outbox, size, hops, done):
    """Push the item on until it made ``hops`` hops; then count it and its key here."""
    it = inbox[i]
    if it.hops >= hops:
        device.atomic_add(done, 0, 1)
        device.atomic_add(done, 1, it.key)
        return
    slot = device.push(outbox, next_rank(it.key, it.hops + 1, size))
    if slot >= 0:
        outbox.items[slot].key = it.key
        outbox.items[slot].hops = it.hops + 1
        outbox.items[slot].origin = it.origin
    else:
        device.atomic_add(done, 2, 1)  # refused: the test sized the outbox to fit


def seeds(rank, size, n):
    items = np.zeros(n, Item)
    items["key"] = (rank << 32) + np.arange(n)
    items["origin"] = rank
    dest = np.array([next_rank(int(k), 0, size) for k in items["key"]], np.int64)
    return items, dest


def _rounds(comm, mode, program):
    """Every round of ``program(fwd, check)`` in ``mode``: (result, inbox bytes)."""
    rounds = []

    def check(fwd, result, inbox):
        rounds.append((tuple(result), inbox.tobytes()))

    program(mode, check)
    return rounds


NODES = [
    pytest.param(None, id="one-node"),
    pytest.param(1, id="nodes-of-1"),
    pytest.param(2, id="nodes-of-2"),
]


def _emulate(monkeypatch, k):
    """Ranks grouped ``k`` per emulated node (None: as the machine says)."""
    if k is not None:
        monkeypatch.setenv("RAFI_NODE_SIZE", str(k))


@pytest.mark.parametrize("k", NODES)
def test_resident_rounds_are_bsp_rounds_under_flow_control(comm, monkeypatch, k):
    """Multi-hop routes through inboxes of 3 items: every round's result and inbox, byte for
    byte and in order, are bsp's (the cpu backend runs both in push order), on one node and
    across emulated nodes (the hosts exchange what crosses them)."""
    _emulate(monkeypatch, k)
    dtype = hop_dtype(8)
    paths = random_routes(comm, 25, MAX_HOPS, seed=5)

    def program(mode, check):
        with rafi.Forwarder(comm, dtype, 3, backend="cpu", mode=mode) as fwd:
            run_backlog(fwd, make_items(dtype, fwd.rank, paths[fwd.rank]), check=check)

    bsp, resident = _rounds(comm, "bsp", program), _rounds(comm, "resident", program)
    assert all_ranks_ok(comm, bsp == resident)


# items a rank seeds: a few, or enough that a rank's items for the others outgrow
# PUSH_BYTES; with either of the node's stores (kernels/resident.py's NODE_STORES): staged
# then streamed (streaming), pushed with ordinary stores (cached)
SEEDED = [pytest.param(40, id="few"), pytest.param(4 * PUSH_BYTES // Item.itemsize, id="many")]


@pytest.mark.parametrize("stores", ["cached", "streaming"])
@pytest.mark.parametrize("n", SEEDED)
@pytest.mark.parametrize("k", NODES)
def test_resident_rounds_are_bsp_rounds_with_any_items(comm, monkeypatch, k, n, stores):
    """Items that hop by a kernel, one in five for ANY: the same rounds as bsp's."""
    _emulate(monkeypatch, k)
    monkeypatch.setenv("RAFI_NODE_STORES", stores)
    size, hops = comm.Get_size(), 4
    runs = {}
    for mode in ("bsp", "resident"):
        rounds = []
        with rafi.Forwarder(comm, Item, 2 * n * size, backend="cpu", mode=mode) as fwd:
            done = np.zeros(3, np.int64)
            fwd.send(*seeds(fwd.rank, size, n))
            while True:
                result = fwd.forward()
                rounds.append((tuple(result), rafi.asnumpy(fwd.inbox).tobytes()))
                fwd.launch(bounce, result.received, fwd.inbox, fwd.outbox, size, hops, done)
                if not result.alive:
                    break
            if mode == "resident":
                assert fwd._engine._mailboxes.stores == stores
        runs[mode] = rounds
    assert all_ranks_ok(comm, runs["bsp"] == runs["resident"])
    assert len(runs["bsp"]) == hops + 2


@pytest.mark.parametrize("mode", ["async", "resident"])
def test_run_gives_bsp_results(comm, backend, mode):
    """``run(step)`` finishes every item once, as bsp's ``run`` does (async runs ANY items
    where they were pushed, so only the totals of all ranks are compared there; so on a GPU,
    where threads push ANY items in no fixed order and the k-th of them goes to the same
    rank in both modes but is another item in each run, in bsp too)."""
    size = comm.Get_size()
    n, hops = (6, 3) if SIMULATOR else (200, 5)
    outcomes = {}
    for m in ("bsp", mode):
        with rafi.Forwarder(comm, Item, 4 * n * size, backend=backend, mode=m) as fwd:
            done = to_backend(backend, np.zeros(3, np.int64))
            fwd.send(*seeds(fwd.rank, size, n))
            result = fwd.run(bounce, size, hops, done)
            assert len(fwd.inbox) == 0  # what step processed is consumed
            outcomes[m] = (rafi.asnumpy(done), result)
    bsp, other = outcomes["bsp"][0], outcomes[mode][0]
    total = comm.allreduce(other)
    keys = sum(((r << 32) * n + n * (n - 1) // 2) for r in range(size))
    ok = total[0] == n * size and total[1] == keys and total[2] == 0
    if mode == "resident":
        same_items = np.array_equal(bsp, other) if backend == "cpu" else bsp[0] == other[0]
        ok = ok and same_items and outcomes["bsp"][1] == outcomes[mode][1]
        ok = ok and outcomes[mode][1].alive == 0
    assert all_ranks_ok(comm, ok)


def test_run_in_slices_of_rounds(comm, backend):
    """``run(rounds=k)`` stops after k rounds with items alive; the next ``run`` goes on from
    there; every round is recorded once in ``fwd.stats``, whatever the rounds per launch.
    Which ``ANY`` item a rank gets follows the outbox's order, which is the order of pushes:
    bsp's on the cpu backend, the threads' on a GPU; there each rank's count of finished
    items is the same however the rounds were launched, and the job's sum of their keys."""
    size = comm.Get_size()
    n, hops = (4, 5) if SIMULATOR else (50, 7)
    results = {}
    for per_launch in (1, 3, None):
        with rafi.Forwarder(comm, Item, 4 * n * size, backend=backend, mode="resident") as fwd:
            done = to_backend(backend, np.zeros(3, np.int64))
            items, dest = seeds(fwd.rank, size, n)
            fwd.send(items, dest)
            first = fwd.run(bounce, size, hops, done, rounds=2, rounds_per_launch=per_launch)
            assert first.round == 1 and first.alive > 0, f"rounds per launch {per_launch}: {first}"
            last = fwd.run(bounce, size, hops, done, rounds_per_launch=per_launch)
            assert last.alive == 0 and len(fwd.stats) == last.round + 1
            sent = sum(int(r.sent.sum()) for r in fwd.stats)
            received = sum(int(r.received.sum()) for r in fwd.stats)
            count, keys, refused = rafi.asnumpy(done).tolist()
            keys = keys if backend == "cpu" else comm.allreduce(keys)
            results[per_launch] = (last.round, count, keys, refused, comm.allreduce(sent - received))
    assert len(set(map(str, results.values()))) == 1  # the same rounds however they were launched
    assert all(r[-1] == 0 for r in results.values())  # every item sent was received


@pytest.mark.parametrize("info", [False, True])
def test_every_forward_is_recorded_once(comm, info, caplog):
    """More one-round launches than the engine keeps records of between reads of
    ``fwd.stats``, read part-way and at the end (and with rafi's INFO log, which records
    each launch's rounds at once): every round once, in order."""
    import logging

    from rafi._engines._resident import _RECORDS

    caplog.set_level(logging.INFO if info else logging.WARNING, logger="rafi")
    rounds = 4 * _RECORDS + 9
    with rafi.Forwarder(comm, np.int64, 4, backend="cpu", mode="resident") as fwd:
        if fwd.rank == 0:
            fwd.send(np.zeros(1, np.int64), 1)
        for r in range(rounds):
            result = fwd.forward()
            fwd.send(rafi.asnumpy(fwd.inbox), (fwd.rank + 1) % fwd.size)
            if r == rounds // 3:
                assert [s.round for s in fwd.stats] == list(range(r + 1))
        recorded = [s.round for s in fwd.stats]
        moved = sum(int(s.received.sum()) for s in fwd.stats)
    assert all_ranks_ok(comm, recorded == list(range(rounds)) and result.round == rounds - 1)
    assert comm.allreduce(moved) == rounds


@rafi.kernel
def misroute(i, inbox, outbox, size):
    """Push the item on to its own rank, and one more for a rank that does not exist."""
    slot = device.push(outbox, inbox[i] % size)
    if slot >= 0:
        outbox.items[slot] = inbox[i]
    device.push(outbox, size + 7)


def test_run_raises_a_bad_push_on_every_rank(comm, backend):
    """The error comes from every rank's run(); the valid items pushed with the bad ones
    stay queued and arrive."""
    rank, size = comm.Get_rank(), comm.Get_size()
    with rafi.Forwarder(comm, np.int32, 8, backend=backend, mode="resident") as fwd:
        fwd.send(np.array([rank, rank + size], np.int32), (rank + 1) % size)
        with pytest.raises(rafi.InvalidDestination) as info:
            fwd.run(misroute, size)
        assert info.value.example == size + 7 and info.value.ranks == list(range(size))
        result = fwd.forward()  # the bad items were dropped; the good ones go now
        assert result.alive == 2 * size and result.received == 2
        assert sorted(rafi.asnumpy(fwd.inbox).tolist()) == [rank, rank + size]  # sent on, then back


@rafi.kernel
def labour(i, inbox, outbox, size, hops, spin):
    """A slow step: ``spin`` rounds of a hash, then the item goes on for ``hops`` hops."""
    it = inbox[i]
    acc = it.key
    for _ in range(spin):
        acc = (acc * 48271 + 11) % 2147483647
    if it.hops < hops:
        slot = device.push(outbox, (it.key + it.hops + 1) % size)
        if slot >= 0:
            outbox.items[slot].key = it.key
            outbox.items[slot].origin = acc % 7  # stored, so the loop is not optimized away
            outbox.items[slot].hops = it.hops + 1


def test_a_deadline_counts_waiting_not_rounds(comm):
    """Rounds whose steps are slow, under a deadline shorter than the run, all in one launch:
    every rank makes progress, so none times out (a wait is timed from its own start, not
    the run's nor the launch's)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    with rafi.Forwarder(comm, Item, 8, backend="cpu", mode="resident") as fwd:
        fwd.run(labour, size, 0, 0)  # compiled (nodes of different sizes compile apart, one by one)
    with rafi.Forwarder(comm, Item, 8, backend="cpu", mode="resident", timeout=1.0) as fwd:
        item = np.zeros(1, Item)
        item["key"] = rank
        fwd.send(item, (rank + 1) % size)
        started = time.perf_counter()
        result = fwd.run(labour, size, 30, 12_000_000, rounds_per_launch=30)
        elapsed = comm.allreduce(time.perf_counter() - started, op=MPI.MAX)
    assert result.alive == 0 and result.round >= 30
    if elapsed < 1.5:
        pytest.skip(f"the rounds ran faster ({elapsed:.2f} s) than the deadline could matter")


@pytest.mark.parametrize("k", [1, 2])
def test_resident_runs_across_nodes(comm, backend, monkeypatch, k):
    """On emulated nodes the transport says how items cross them, and run() gives bsp's
    results; a rank that closes while the others run makes them raise RankLeft."""
    _emulate(monkeypatch, k)
    size = comm.Get_size()
    n, hops = (6, 3) if SIMULATOR else (100, 5)
    outcomes = {}
    for mode in ("bsp", "resident"):
        with rafi.Forwarder(comm, Item, 4 * n * size, backend=backend, mode=mode) as fwd:
            done = to_backend(backend, np.zeros(3, np.int64))
            fwd.send(*seeds(fwd.rank, size, n))
            outcomes[mode] = (fwd.run(bounce, size, hops, done), rafi.asnumpy(done).tolist(), fwd.transport)
    (bsp, bsp_done, _), (resident, resident_done, transport) = outcomes["bsp"], outcomes["resident"]
    assert transport == ("shm+host" if k < size else "shm") or backend == "cuda"
    ok = (
        resident == bsp
        and comm.allreduce(np.array(resident_done)).tolist() == comm.allreduce(np.array(bsp_done)).tolist()
    )
    assert all_ranks_ok(comm, ok and (backend != "cpu" or resident_done == bsp_done))


def test_a_rank_closing_across_nodes_is_rank_left(comm, monkeypatch):
    """Every rank alone on its emulated node: rank 1 closes while the others call run(); its
    close meets their exchange of counts, and every rank raises RankLeft."""
    _emulate(monkeypatch, 1)
    left = "rank\\(s\\) \\[1\\] closed their Forwarder"
    with pytest.raises(rafi.RafiError, match=left):
        with rafi.Forwarder(comm, Item, 64, backend="cpu", mode="resident") as fwd:
            fwd.send(*seeds(fwd.rank, fwd.size, 4))
            if fwd.rank != 1:
                fwd.run(bounce, fwd.size, 10**6, np.zeros(3, np.int64))
    assert fwd._closed


@pytest.mark.parametrize("transport", ["host", "ipc"])
def test_resident_refuses_other_transports(comm, transport):
    with pytest.raises(rafi.ConfigError, match="not for mode='resident'"):
        rafi.Forwarder(comm, np.int32, 8, backend="cpu", mode="resident", transport=transport)
    with rafi.Forwarder(comm, np.int32, 8, backend="cpu", mode="resident", transport="shm") as fwd:
        assert fwd.transport in ("shm", "shm+host") and fwd.mode == "resident"  # across nodes: +host


@pytest.mark.parametrize("capacity", [4096, 8])
def test_the_node_agrees_on_its_stores(comm, monkeypatch, capacity):
    """Unless RAFI_NODE_STORES says, a probe chooses the stores to the node's other ranks
    (rafi/_transports/_node_stores.py): the same on every rank of the node, the kernel's
    thresholds as chosen, and the inbox the probe wrote into left zeroed; an inbox too small
    for the choice to matter takes ``cached`` without probing."""
    from rafi._transports import node_comm
    from rafi.kernels import resident as kern

    monkeypatch.delenv("RAFI_NODE_STORES", raising=False)
    with rafi.Forwarder(comm, Item, capacity, backend="cpu", mode="resident") as fwd:
        stores = fwd._engine._mailboxes.stores
        inbox = rafi.asnumpy(fwd.inbox).tobytes()
        ctl = rafi.asnumpy(fwd._engine._ctl)
    node = node_comm(comm)
    same = len(set(node.allgather(stores))) == 1
    node.Free()
    assert all_ranks_ok(comm, same and stores in kern.NODE_STORES)
    assert all_ranks_ok(comm, (ctl[kern.G_PUSH_FROM], ctl[kern.G_STREAM_FROM]) == kern.NODE_STORES[stores])
    assert all_ranks_ok(comm, inbox == bytes(len(inbox)))
    if capacity * Item.itemsize < 4096:
        assert stores == "cached"


def test_checkpoint_between_runs(comm, tmp_path_factory):
    """A checkpoint between two runs of rounds, restored in resident and in bsp mode:
    every item finishes once either way."""
    size, rank = comm.Get_size(), comm.Get_rank()
    n, hops = 30, 6
    path = comm.bcast(str(tmp_path_factory.mktemp("resident") / "run.h5") if rank == 0 else None)
    with rafi.Forwarder(comm, Item, 4 * n * size, backend="cpu", mode="resident") as fwd:
        done = np.zeros(3, np.int64)
        items, dest = seeds(rank, size, n)
        fwd.send(items, dest)
        assert fwd.run(bounce, size, hops, done, rounds=3).alive
        fwd.checkpoint(path, state={"done": done})
    for mode in ("resident", "bsp"):
        fwd, state = rafi.Forwarder.restore(comm, path, backend="cpu", mode=mode)
        with fwd:
            done = state["done"].copy()
            assert fwd._round == 3 and len(fwd.inbox) == 0
            assert fwd.run(bounce, size, hops, done).alive == 0
        total = comm.allreduce(done)
        assert all_ranks_ok(comm, total[0] == n * size and total[2] == 0)


@pytest.mark.parametrize("mode", ["bsp", "resident"])
def test_run_steps_over_an_inbox_a_forward_left(comm, mode):
    """Items a forward() delivered before run() are stepped first, not lost to its first round."""
    size, n, hops = comm.Get_size(), 20, 3
    with rafi.Forwarder(comm, Item, 4 * n * size, backend="cpu", mode=mode) as fwd:
        done = np.zeros(3, np.int64)
        fwd.send(*seeds(fwd.rank, size, n))
        assert fwd.forward().received == len(fwd.inbox)
        assert fwd.run(bounce, size, hops, done).alive == 0
    total = comm.allreduce(done)
    assert all_ranks_ok(comm, total[0] == n * size and total[2] == 0)
