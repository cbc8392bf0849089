"""Shared test traffic: item types, a multi-hop routing kernel, and a driver loop."""

import numpy as np
from mpi4py import MPI

import rafi
from rafi import device

MAX_HOPS = 4


def hop_dtype(payload_bytes):
    """An item that carries its whole route and a payload checked byte for byte."""
    return np.dtype(
        [
            ("origin", "i4"),
            ("serial", "i4"),
            ("hop", "i4"),
            ("npath", "i4"),
            ("path", "i4", (MAX_HOPS,)),
            ("payload", "u1", (payload_bytes,)),
        ],
        align=True,
    )


def payload_of(origin, serial, nbytes):
    """The bytes an item must carry: a function of who made it, nothing else."""
    k = np.arange(nbytes, dtype=np.uint64)
    return ((origin * 7919 + serial * 104729 + k * 31) % 251).astype(np.uint8)


@rafi.kernel
def route(i, inbox, outbox, me, arrived, misrouted, refused):
    """Check an item reached the rank on its path; send it on, or mark it arrived."""
    it = inbox[i]
    if it.path[it.hop] != me:
        misrouted[i] = 1
    if it.hop + 1 >= it.npath:
        arrived[i] = 1
        return
    nxt = it.path[it.hop + 1]
    slot = device.push(outbox, nxt)
    if slot < 0:
        refused[i] = 1
        return
    out = outbox.items[slot]
    out.origin = it.origin
    out.serial = it.serial
    out.hop = it.hop + 1
    out.npath = it.npath
    for k in range(it.path.shape[0]):
        out.path[k] = it.path[k]
    for k in range(it.payload.shape[0]):
        out.payload[k] = it.payload[k]


@rafi.kernel
def push_to(i, outbox, dests):
    """Push item ``i`` (an int32 equal to ``i``) for ``dests[i]``."""
    slot = device.push(outbox, dests[i])
    if slot >= 0:
        outbox.items[slot] = i


def random_routes(comm, n, hops, seed):
    """Per-rank lists of ``n`` routes of 1..hops ranks, the same on every rank."""
    rng = np.random.default_rng(seed)
    size = comm.Get_size()
    return [[list(rng.integers(0, size, rng.integers(1, hops + 1))) for _ in range(n)] for _ in range(size)]


def make_items(dtype, rank, paths):
    """Items of ``rank`` with the given routes (lists of ranks, first hop first)."""
    items = np.zeros(len(paths), dtype)
    for serial, path in enumerate(paths):
        items[serial]["origin"] = rank
        items[serial]["serial"] = serial
        items[serial]["hop"] = 0
        items[serial]["npath"] = len(path)
        items[serial]["path"][: len(path)] = path
        items[serial]["payload"] = payload_of(rank, serial, dtype["payload"].shape[0])
    return items


def run_routes(fwd, items, *, max_rounds=10_000, on_round=None, arrived=None, resume=False):
    """Send ``items`` to their first hop, forward until none is alive; return arrivals.

    ``on_round(fwd, result)`` runs after each ``forward()``, before the inbox is processed.
    ``arrived`` (a list) collects arrivals as they happen, so they survive an exception;
    ``resume`` processes the inbox already there (a restored one) before forwarding.
    Returns ``(arrived, results)``: the items that ended their route here (numpy) and the
    ForwardResult of every round.
    """
    arrived = [] if arrived is None else arrived
    results = []
    if len(items):
        fwd.send(items, items["path"][:, 0].astype(np.int32))
    if resume:
        _process(fwd, arrived)
    for _ in range(max_rounds):
        result = fwd.forward()
        results.append(result)
        if on_round is not None:
            on_round(fwd, result)
        if not result.alive:
            break
        _process(fwd, arrived)
    else:
        raise AssertionError("forwarding did not terminate")
    return (np.concatenate(arrived) if arrived else np.zeros(0, fwd.item_dtype)), results


def run_backlog(fwd, items, *, check=None, max_rounds=10_000):
    """Route ``items`` hop by hop from the host, never pushing more than the outbox holds.

    Items wait in a host-side backlog and are sent as room frees up (capacity minus what
    the last round deferred); arrivals at the end of their route are collected. ``check(fwd,
    result, inbox)`` runs after each round. Returns the arrived items (numpy).
    """
    comm = fwd._comm
    backlog, arrived, deferred = items, [], 0
    for _ in range(max_rounds):
        room = fwd.capacity - deferred
        batch, backlog = backlog[:room], backlog[room:]
        if len(batch):
            fwd.send(batch, batch["path"][np.arange(len(batch)), batch["hop"]].astype(np.int32))
        result = fwd.forward()
        deferred = result.deferred
        inbox = rafi.asnumpy(fwd.inbox)
        if check is not None:
            check(fwd, result, inbox)
        done = inbox["hop"] + 1 >= inbox["npath"]
        arrived.append(inbox[done])
        onward = inbox[~done].copy()
        onward["hop"] += 1
        backlog = np.concatenate([backlog, onward])
        if not result.alive and not comm.allreduce(len(backlog)):
            return np.concatenate(arrived)
    raise AssertionError("did not terminate")


def run_async(fwd, items, *, delay=None):
    """Send ``items`` to their first hop and route batches until ``batches()`` ends.

    ``delay(rank)`` (optional) returns seconds to sleep after a batch, so that messages are
    in flight while ranks look idle. Returns the items that ended their route here (numpy).
    """
    import time

    arrived = []
    if len(items):
        fwd.send(items, items["path"][:, 0].astype(np.int32))
    for batch in fwd.batches():
        assert 0 < len(batch) <= fwd.capacity
        _process_batch(fwd, batch, arrived)
        if delay is not None:
            time.sleep(delay(fwd.rank))
    return np.concatenate(arrived) if arrived else np.zeros(0, fwd.item_dtype)


def _process(fwd, arrived):
    """Route every inbox item on (device kernel); append the ones whose route ended here."""
    if len(fwd.inbox):
        _process_batch(fwd, fwd.inbox, arrived)


def _process_batch(fwd, batch, arrived):
    n = len(batch)
    dev = to_backend(fwd.backend, np.zeros((3, n), np.int32))
    fwd.launch(route, n, batch, fwd.outbox, fwd.rank, dev[0], dev[1], dev[2])
    flags = rafi.asnumpy(dev)
    inbox = rafi.asnumpy(batch)
    assert not flags[1].any(), "an item reached a rank not on its path"
    assert not flags[2].any(), "outbox refused a push in a test sized to fit"
    arrived.append(inbox[flags[0] == 1])


def to_backend(backend, array):
    """``array`` where kernels of ``backend`` can write it (numpy on cpu, device on cuda)."""
    if backend == "cpu":
        return array
    from numba import cuda

    return cuda.to_device(array)


def check_exactly_once(comm, dtype, sent_paths, arrived):
    """Assert every item of every rank arrived once, at the end of its path, intact."""
    rank = comm.Get_rank()
    expected = {}
    for origin, paths in enumerate(sent_paths):
        for serial, path in enumerate(paths):
            if path[-1] == rank:
                expected[(origin, serial)] = path
    got = {}
    for it in arrived:
        key = (int(it["origin"]), int(it["serial"]))
        assert key not in got, f"item {key} arrived twice"
        got[key] = it
    assert set(got) == set(expected), (
        f"missing {sorted(set(expected) - set(got))[:5]}, unexpected {sorted(set(got) - set(expected))[:5]}"
    )
    for key, it in got.items():
        path = expected[key]
        assert int(it["npath"]) == len(path) and list(it["path"][: len(path)]) == list(path)
        np.testing.assert_array_equal(it["payload"], payload_of(*key, dtype["payload"].shape[0]))


def all_ranks_ok(comm, ok):
    """True on every rank when ``ok`` is True on every rank."""
    return bool(comm.allreduce(int(bool(ok)), op=MPI.MIN))


def open_close_many(comm, times=20, **config):
    """Make ``times`` forwarders one after another, each passing 8 records around a ring;
    True on every rank when every one arrived right (mapped memory is not left stale)."""
    dtype = np.dtype([("a", "i8"), ("b", "f8")])
    ok = True
    for k in range(times):
        with rafi.Forwarder(comm, dtype, 64, **config) as fwd:
            items = np.zeros(8, dtype)
            items["a"] = fwd.rank * 100 + np.arange(8) + k
            fwd.send(items, (fwd.rank + 1) % fwd.size)
            fwd.forward()
            source = (fwd.rank - 1) % fwd.size
            got = rafi.asnumpy(fwd.inbox)
            ok &= bool(np.array_equal(np.sort(got["a"]), source * 100 + np.arange(8) + k))
    return all_ranks_ok(comm, ok)
