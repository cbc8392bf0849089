"""device.atomic_add/max/min and device.random: the same results on every backend."""

import numpy as np
import pytest

import rafi
from conftest import SIMULATOR
from rafi import device

N = 64 if SIMULATOR else 200_000  # threads that collide on a few entries


@rafi.kernel
def _collide(i, counts, weights, high, low, old_sum):
    device.atomic_add(counts, i % 3, 1)
    device.atomic_add(weights, i % 2, 0.5)
    device.atomic_max(high, 0, i)
    device.atomic_min(low, 0, -i)
    device.atomic_add(old_sum, 0, device.atomic_add(old_sum, 1, 1))  # old values are returned


@rafi.kernel
def _draw(i, out, seed, per_stream):
    out[i] = device.random(seed, i // per_stream, i % per_stream)


def _forwarder(backend):
    from mpi4py import MPI

    return rafi.Forwarder(MPI.COMM_SELF, np.dtype([("x", "f8")]), 1, backend=backend)


def test_atomics_count_every_update(backend):
    with _forwarder(backend) as fwd:
        arrays = [
            np.zeros(3, np.int64),
            np.zeros(2),
            np.zeros(1, np.int64),
            np.zeros(1, np.int32),
            np.zeros(2, np.int64),
        ]
        dev = [fwd.to_backend(a) for a in arrays]
        fwd.launch(_collide, N, *dev)
        counts, weights, high, low, old_sum = (rafi.asnumpy(d) for d in dev)
    np.testing.assert_array_equal(counts, np.bincount(np.arange(N) % 3))
    np.testing.assert_array_equal(weights, 0.5 * np.bincount(np.arange(N) % 2))
    assert high[0] == N - 1 and low[0] == -(N - 1)
    assert old_sum[1] == N and old_sum[0] == N * (N - 1) // 2  # each thread saw a distinct old value


@pytest.mark.parametrize("seed", [0, 7, 2**40 + 3])
def test_random_is_the_same_stream_everywhere(backend, seed):
    per_stream = 16
    n = 4 * per_stream if SIMULATOR else 1 << 16
    with _forwarder(backend) as fwd:
        out = fwd.to_backend(np.zeros(n))
        fwd.launch(_draw, n, out, seed, per_stream)
        got = rafi.asnumpy(out)
    plain = [device.random(seed, i // per_stream, i % per_stream) for i in range(min(n, 256))]
    np.testing.assert_array_equal(got[: len(plain)], plain)  # the Python function itself, bit for bit
    assert ((got >= 0) & (got < 1)).all() and len(np.unique(got)) == n


def test_random_is_uniform_and_streams_are_independent():
    draws = np.array([[device.random(3, s, c) for c in range(64)] for s in range(400)])
    histogram = np.histogram(draws, bins=16, range=(0, 1))[0]
    expected = draws.size / 16
    chi2 = ((histogram - expected) ** 2 / expected).sum()
    assert chi2 < 37.7  # 15 degrees of freedom, p = 0.001
    neighbours = np.corrcoef(draws[:-1].ravel(), draws[1:].ravel())[0, 1]  # stream s against s + 1
    assert abs(neighbours) < 0.02
    assert device.random(3, -1, 0) != device.random(3, 2**32 - 1, 0)  # negative keys are their own streams
