"""The least a resident round on the cpu backend can cost: the raw exchange of its bytes.

Every rank of the job (one node) writes ``items`` 64-byte records into the next rank's
buffer in node-shared memory (an MPI shared window), raises a flag, waits for the previous
rank's flag, reads its own buffer (a sum: what a step's read of its inbox costs at least),
and raises a second flag so that its buffer may be written again: the ring of
``rafi.bench.resident``, with nothing of rafi in it (no counts, no grants, no step). Once
with ordinary stores (``cached``), once with non-temporal ones (``streaming``), the two
kinds of rafi/_transports/_node_stores.py. Rank 0's clock, the median of five runs of
``--rounds`` rounds.

    launch/local.sh 2 python bench/node_floor.py --items 1000 --rounds 2000
"""

import argparse
import time

import numba
import numpy as np
from mpi4py import MPI

from rafi.kernels.signals import load_relaxed, now_ns, store_relaxed
from rafi.kernels.streaming import stream_fence, stream_store

WORDS = 8  # int64 words of a 64-byte record
HEAD = 128  # int64 words before the buffers: two flags a rank, a cache line each (8 ranks at most)
PATIENCE_NS = 10_000_000_000  # a rank waits this long for a flag, then the run fails


@numba.njit(nogil=True)
def _until(memory, at, r):
    """Wait until ``memory[at]`` reaches ``r``; False if it did not within ``PATIENCE_NS``."""
    since = now_ns()
    while load_relaxed(memory, at) < r:
        if now_ns() - since > PATIENCE_NS:
            return False
    return True


@numba.njit(nogil=True)
def ring(memory, me, size, words, rounds, first, streaming, spent):
    """``rounds`` rounds numbered from ``first``; ``spent``: ns writing, reading, waiting.
    Returns the sum of what it read, or -1 if a peer's flag did not come (``_until``)."""
    mine, onward = HEAD + me * words, HEAD + (me + 1) % size * words
    previous, total = (me + size - 1) % size, 0
    for r in range(first, first + rounds):
        t0 = now_ns()
        if streaming:
            for w in range(words):
                stream_store(memory, onward + w, r + w)
            stream_fence()
        else:
            for w in range(words):
                memory[onward + w] = r + w
        t1 = now_ns()
        store_relaxed(memory, me * 16, r)  # written
        if not _until(memory, previous * 16, r):
            return -1
        t2 = now_ns()
        for w in range(words):
            total += memory[mine + w]
        t3 = now_ns()
        store_relaxed(memory, me * 16 + 8, r)  # read: the previous rank may write again
        if not _until(memory, (me + 1) % size * 16 + 8, r):
            return -1
        spent[0] += t1 - t0
        spent[1] += t3 - t2
        spent[2] += (t2 - t1) + (now_ns() - t3)
    return total


def _ring(comm, *args):
    """``ring(*args)`` on every rank; a rank whose peer's flag never came ends the job."""
    if ring(*args) < 0:
        waited = PATIENCE_NS / 1e9
        print(f"node_floor: rank {comm.Get_rank()} waited {waited:.0f} s for a peer's flag", flush=True)
        comm.Abort(1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=1000, help="64-byte records a rank sends a round")
    parser.add_argument("--rounds", type=int, default=2000, help="rounds a timed run")
    opts = parser.parse_args()
    comm = MPI.COMM_WORLD
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    size, me = node.Get_size(), node.Get_rank()
    if size != comm.Get_size() or not 2 <= size <= 8:
        raise SystemExit("node_floor: 2 to 8 ranks, all on one node")
    words = opts.items * WORDS
    nbytes = (HEAD + size * words) * 8 if me == 0 else 0
    window = MPI.Win.Allocate_shared(nbytes, 8, comm=node)
    buffer, _ = window.Shared_query(0)
    memory = np.frombuffer(buffer, np.int64)
    if me == 0:
        memory[:] = 0
    node.Barrier()
    first = 1
    if me == 0:
        print(f"# {size} ranks, {opts.items} x 64 B a rank a round: microseconds a round (rank 0)")
        print(f"{'stores':>10} {'round':>8} {'write':>8} {'read':>8} {'wait':>8}")
    for streaming in (False, True):
        runs = []
        _ring(comm, memory, me, size, words, 10, first, streaming, np.zeros(3, np.int64))  # compile, warm
        first += 10
        for _ in range(5):
            spent = np.zeros(3, np.int64)
            node.Barrier()
            started = time.perf_counter()
            _ring(comm, memory, me, size, words, opts.rounds, first, streaming, spent)
            runs.append((time.perf_counter() - started, *(spent * 1e-9)))
            first += opts.rounds
        median = np.median(np.array(runs), axis=0) / opts.rounds * 1e6
        if me == 0:
            name = "streaming" if streaming else "cached"
            print(f"{name:>10} " + " ".join(f"{v:8.2f}" for v in median))
    window.Free()
    node.Free()


if __name__ == "__main__":
    main()
