"""The partition kernels against a numpy reference: stable, O(N) counting sort by destination."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import SIMULATOR
from rafi._backends import make_backend
from rafi._partition import Partitioner
from rafi.kernels import outbox as ob

MAX_N = 40 if SIMULATOR else 3000


def _partition(backend_name, dest, size, capacity, itemsize_words):
    """Partition items whose words encode their original index; return summary and order."""
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
    part = Partitioner(b, size, capacity, itemsize_words, word)
    summary = part.run(outbox, dev_words)
    out = np.zeros(capacity * itemsize_words, word)
    b.to_host(part.sorted_words, out)
    return summary, out.reshape(capacity, itemsize_words)


@pytest.mark.parametrize("width", [1, 3])
@settings(max_examples=8 if SIMULATOR else 60, deadline=None)
@given(data=st.data())
def test_partition_matches_stable_reference(backend, width, data):
    size = data.draw(st.integers(1, 6), label="size")
    n = data.draw(st.integers(0, MAX_N), label="n")
    dest = np.array(
        data.draw(st.lists(st.integers(-2, size + 1), min_size=n, max_size=n), label="dest"),
        np.int32,
    )
    capacity = n + data.draw(st.integers(1, 5), label="slack")
    summary, out = _partition(backend, dest, size, capacity, width)

    valid = (dest >= 0) & (dest < size)
    row = np.where(valid, dest, size)
    order = np.argsort(row, kind="stable")  # the reference: a stable sort by row
    np.testing.assert_array_equal(summary.requests, np.bincount(dest[valid], minlength=size))
    assert summary.valid == valid.sum() and summary.invalid == (~valid).sum()
    assert summary.pushed == n and summary.refused == 0
    np.testing.assert_array_equal(summary.starts, np.concatenate([[0], np.cumsum(summary.requests)[:-1]]))
    np.testing.assert_array_equal(out[:n, 0] // 8, order)
    for w in range(width):
        np.testing.assert_array_equal(out[:n, w] % 8, w)
    if (~valid).any():
        assert summary.example in set(dest[~valid].tolist())


def test_partition_chunks_are_within_scan_limits(backend):
    from mpi4py import MPI

    b = make_backend(backend, MPI.COMM_SELF)
    for size in (1, 2, 8, 100):
        for capacity in (1, 1000, 10**7):
            chunks = b.partition_chunks(capacity, size)
            assert chunks >= 1
            if backend == "cuda":
                from rafi.kernels.cuda_scan import MAX_VALUES

                assert (size + 1) * chunks <= MAX_VALUES


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
