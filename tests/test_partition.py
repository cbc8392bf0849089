"""The partition kernels against a numpy reference: stable, O(N) counting sort by destination."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rafi
from conftest import SIMULATOR
from rafi._backends import make_backend
from rafi._partition import Partitioner
from rafi.kernels import outbox as ob
from rafi.kernels import partition as kern

MAX_N = 40 if SIMULATOR else 3000
MAX_ROWS = 32  # kernels/multisplit.py's table (imported there only with numba-cuda)


def _partition(backend_name, dest, size, capacity, itemsize_words, pack=True):
    """Partition items whose words encode their original index; return summary, order, packed."""
    from mpi4py import MPI

    b = make_backend(backend_name, MPI.COMM_SELF)
    word = np.dtype(np.uint32)
    n = len(dest)
    words = np.zeros(capacity * itemsize_words, word)
    for w in range(itemsize_words):  # item k's words: k * 8 + w
        words[w : n * itemsize_words : itemsize_words] = np.arange(n) * 8 + w
    dest_full = np.zeros(capacity, np.int32)
    dest_full[:n] = dest
    state = np.array([n, 0], np.int64)
    outbox = ob.Outbox(b.zeros(capacity, np.uint32), b.zeros(capacity, np.int32), b.zeros(2, np.int64))
    b.to_device(dest_full, outbox.dest)
    b.to_device(state, outbox.state)
    dev_words = b.zeros(capacity * itemsize_words, word)
    b.to_device(words, dev_words)
    order = b.zeros(capacity, np.int32)
    part = Partitioner(b, outbox, dev_words, order, size, capacity, itemsize_words, word, pack)
    summary = part.run()
    out = np.zeros(capacity * itemsize_words, word)
    b.to_host(part.packed, out)
    return summary, rafi.asnumpy(order), out.reshape(capacity, itemsize_words)


@pytest.mark.parametrize("width", [1, 3])
@settings(max_examples=8 if SIMULATOR else 60, deadline=None)
@given(data=st.data())
def test_partition_matches_stable_reference(backend, width, data):
    # few destinations (the GPU's tile partition) and more than a tile's table holds (chunks)
    size = data.draw(st.one_of(st.integers(1, 6), st.integers(MAX_ROWS - 2, MAX_ROWS + 6)), label="size")
    n = data.draw(st.integers(0, MAX_N), label="n")
    dest = np.array(
        data.draw(st.lists(st.integers(-2, size + 1), min_size=n, max_size=n), label="dest"),
        np.int32,
    )
    capacity = n + data.draw(st.integers(1, 5), label="slack")
    pack = data.draw(st.booleans(), label="pack")
    _check_against_reference(backend, dest, size, capacity, width, pack)


def _check_against_reference(backend, dest, size, capacity, width, pack):
    """Partition ``dest`` on ``backend`` and compare with a stable numpy sort by row."""
    summary, order, out = _partition(backend, dest, size, capacity, width, pack)
    n = len(dest)
    valid = (dest >= 0) & (dest < size)
    anywhere = dest == ob.ANY
    invalid = ~valid & ~anywhere
    row = np.where(valid, dest, np.where(anywhere, size, size + 1))  # ranks, then ANY, then invalid
    expected = np.argsort(row, kind="stable")  # the reference: a stable sort by row
    np.testing.assert_array_equal(summary.requests, np.bincount(dest[valid], minlength=size))
    assert summary.valid == valid.sum() + anywhere.sum() and summary.invalid == invalid.sum()
    assert summary.anywhere == anywhere.sum() and summary.anywhere_start == valid.sum()
    assert summary.pushed == n and summary.refused == 0
    np.testing.assert_array_equal(summary.starts, np.concatenate([[0], np.cumsum(summary.requests)[:-1]]))
    np.testing.assert_array_equal(order[:n], expected)
    if pack:
        np.testing.assert_array_equal(out[:n, 0] // 8, expected)
        for w in range(width):
            np.testing.assert_array_equal(out[:n, w] % 8, w)
    else:
        assert not out.any()
    if invalid.any():
        assert summary.example in set(dest[invalid].tolist())


ADVERSARIAL = {
    "one destination": lambda rng, n, size: np.full(n, size - 1),
    "every destination in turn": lambda rng, n, size: np.arange(n) % size,
    "runs": lambda rng, n, size: np.repeat(np.arange(size), -(-n // size))[:n][::-1],
    "random, ANY and invalid mixed in": lambda rng, n, size: rng.integers(-3, size + 2, n),
}


@pytest.mark.parametrize("pattern", sorted(ADVERSARIAL))
def test_partition_paths_on_adversarial_input(backend, pattern):
    """Every partition path (one block, tiles, chunks) on empty, full and skewed outboxes.

    On the GPU an outbox of up to ``SMALL`` tiles is partitioned by one block, a larger one
    by tiles, and more destinations than a tile's table holds by chunks."""
    tile, small = 64, 1  # the cpu backend has one path: any sizes will do
    if backend == "cuda":
        from rafi.kernels import multisplit

        tile, small = multisplit.TILE, multisplit.SMALL
    rng = np.random.default_rng(7)
    paths = {1: (1, small + 1), 3: (1, small, small + 1, 2 * small + 3), MAX_ROWS + 1: (3,)}
    for size, tile_counts in paths.items():
        for tiles in tile_counts:
            capacity = tiles * tile - 1
            for n in (0, capacity // 2 + 1, capacity):  # empty, part full, full
                dest = ADVERSARIAL[pattern](rng, n, size).astype(np.int32)
                _check_against_reference(backend, dest, size, capacity, 2, pack=bool(n % 2))


@settings(max_examples=8 if SIMULATOR else 40, deadline=None)
@given(data=st.data())
def test_gather_and_place_rows(backend, data):
    """gather_rows copies plan rows by order; place_rows copies back and sets destinations."""
    from mpi4py import MPI

    b = make_backend(backend, MPI.COMM_SELF)
    n = data.draw(st.integers(1, MAX_N), label="n")
    width = data.draw(st.sampled_from([1, 2, 3, 7, 8, 9]), label="width")  # 8: its own loop on a CPU
    src = np.arange(n * width, dtype=np.uint64) * 3 + 1
    order = np.array(data.draw(st.permutations(range(n)), label="order"), np.int32)
    cuts = sorted(data.draw(st.lists(st.integers(0, n), min_size=3, max_size=3), label="cuts"))
    rows = np.array([[cuts[1] - cuts[0], cuts[0], 0], [cuts[2] - cuts[1], cuts[1], cuts[1] - cuts[0]]])
    plan = np.concatenate([[0, 0, 0], rows.ravel()]).astype(np.int64)  # row 0 unused, rows 1-2
    dev = [b.zeros(len(a), a.dtype) for a in (src, order, plan)]
    for host, d in zip((src, order, plan), dev):
        b.to_device(host, d)
    gathered = b.zeros(n * width, np.uint64)
    # a thread per word, two records' worth (the loop that moves four records at a time), one
    threads = data.draw(st.sampled_from([b.threads(n * width), 2 * width, 1]), label="threads")
    b.launch(kern.gather_rows, threads, threads, dev[2], 1, 2, dev[1], dev[0], width, gathered, 0)
    got = rafi.asnumpy(gathered).reshape(n, width)
    total = cuts[2] - cuts[0]
    np.testing.assert_array_equal(got[:total], src.reshape(n, width)[order[cuts[0] : cuts[2]]])
    assert not got[total:].any()
    placed = b.zeros(n * width, np.uint64)
    dest = b.zeros(n, np.int32)
    b.to_device(np.full(n, -7, np.int32), dest)
    b.launch(kern.place_rows, threads, threads, dev[2], 1, 2, gathered, width, placed, dest, 1)
    np.testing.assert_array_equal(rafi.asnumpy(placed), rafi.asnumpy(gathered))
    expected_dest = np.full(n, -7, np.int32)
    expected_dest[: rows[0, 0]] = 0
    expected_dest[rows[0, 0] : total] = rafi.device.ANY  # the second row is the ANY row
    np.testing.assert_array_equal(rafi.asnumpy(dest), expected_dest)


@pytest.mark.parametrize("width, word", [(3, np.uint64), (8, np.uint64), (8, np.uint32), (5, np.uint8)])
def test_gather_rows_streams_large_dense_rows_exactly(width, word):
    """Rows past ``STREAM_BYTES`` move with stores that bypass the cache when they are dense
    (kernels/streaming.py), with ordinary stores when they are not: both exact, and the
    words after the rows untouched."""
    from mpi4py import MPI

    from rafi.kernels.streaming import STREAM_BYTES

    b = make_backend("cpu", MPI.COMM_SELF)
    count = STREAM_BYTES // (np.dtype(word).itemsize * width) + 1000  # each row just past the threshold
    n = 4 * count
    src = (np.arange(n * width) * 5 + 3).astype(word)
    dense = np.arange(count, 2 * count, dtype=np.int32)  # a run of records
    sparse = np.arange(0, 2 * count, 2, dtype=np.int32) + 2 * count  # every other one
    order = np.concatenate([dense, sparse])
    plan = np.array([count, 0, 0, count, count, count], np.int64)
    dst = np.full((n * width), 7, word)
    b.launch(kern.gather_rows, 1, 1, plan, 0, 2, order, src, width, dst, 1)
    got = dst.reshape(n, width)
    np.testing.assert_array_equal(got[: 2 * count], src.reshape(n, width)[order])
    assert (got[2 * count :] == 7).all()


@given(st.data())
@settings(max_examples=10 if SIMULATOR else 40, deadline=None)
def test_plan_stage(backend, data):
    """An async turn's send plan: at most ``window`` items per peer with a credit, to the
    host stage at ``p * window`` or, for an IPC peer, to its slot for this rank."""
    from mpi4py import MPI

    b = make_backend(backend, MPI.COMM_SELF)
    size = data.draw(st.integers(1, 6), label="size")
    me = data.draw(st.integers(0, size - 1), label="me")
    window = data.draw(st.integers(1, 9), label="window")
    counts = np.array(data.draw(st.lists(st.integers(0, 20), min_size=size, max_size=size)), np.int64)
    credit = np.array(data.draw(st.lists(st.integers(0, 1), min_size=size, max_size=size)), np.int64)
    ipc = np.array(data.draw(st.lists(st.integers(0, 1), min_size=size, max_size=size)), np.int64)
    summary = np.concatenate([[0], np.cumsum(counts), [0, 0, 0, 0]])  # summarize's layout
    dev = [b.as_device(a) for a in (summary, credit, ipc)]
    plans = [b.zeros(size * kern.ROW, np.int64) for _ in range(2)]
    b.launch(kern.plan_stage, size, dev[0], dev[1], window, me, dev[2], *plans)
    host, by_ipc = (rafi.asnumpy(p).reshape(size, kern.ROW) for p in plans)
    sent = np.minimum(counts, window) * credit
    np.testing.assert_array_equal(host[:, 0], sent * (1 - ipc))
    np.testing.assert_array_equal(by_ipc[:, 0], sent * ipc)
    np.testing.assert_array_equal(host[:, 1], summary[:size])
    np.testing.assert_array_equal(by_ipc[:, 1], summary[:size])
    np.testing.assert_array_equal(host[:, 2], np.arange(size) * window)
    np.testing.assert_array_equal(by_ipc[:, 2], np.full(size, me * window))


def test_partition_chunks_are_within_scan_limits(backend):
    from mpi4py import MPI

    b = make_backend(backend, MPI.COMM_SELF)
    for size in (1, 2, 8, 100):
        for capacity in (1, 1000, 10**7):
            chunks = b.partition_chunks(capacity, size)
            assert chunks >= 1
            if backend == "cuda":
                from rafi.kernels import multisplit
                from rafi.kernels.cuda_scan import MAX_VALUES

                assert multisplit.MAX_ROWS == MAX_ROWS
                assert (size + 2) * chunks <= MAX_VALUES
                covering = -(-capacity // multisplit.TILE)  # tiles that cover the outbox
                fits = size + 2 <= MAX_ROWS and (size + 2) * covering <= MAX_VALUES
                assert multisplit.tiles(capacity, size) == (covering if fits else 0)


@pytest.mark.skipif(not SIMULATOR, reason="scan limits differ on a GPU; covered by the partition test there")
def test_cuda_scan_many_tiles():
    from numba import cuda

    from rafi.kernels.cuda_scan import MAX_VALUES, TILE, exclusive_scan

    rng = np.random.default_rng(5)
    for n in (1, TILE - 1, TILE, TILE + 1, MAX_VALUES):
        values = rng.integers(0, 9, n).astype(np.int64)
        out = cuda.to_device(np.full(n + 1, -1, np.int64))
        exclusive_scan(cuda.to_device(values), n, out, cuda.to_device(np.zeros(2 * TILE + 1, np.int64)))
        np.testing.assert_array_equal(out.copy_to_host(), np.concatenate([[0], np.cumsum(values)]))
