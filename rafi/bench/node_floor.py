"""The least a resident round on the cpu backend can cost: the raw exchange of its bytes.

Every rank of the job (one node) writes ``items`` 64-byte records into the next rank's
buffer in node-shared memory (an MPI shared window), raises a flag, waits for the previous
rank's flag, reads its own buffer (a sum: what a step's read of its inbox costs at least),
and raises a second flag so that its buffer may be written again: the ring of
``rafi.bench.resident``, with nothing of rafi in it (no counts, no grants, no step). Once
with ordinary stores (``cached``), once with non-temporal ones (``streaming``), the two
kinds of rafi/_transports/_node_stores.py. Rank 0's clock, the median of five runs of
``--rounds`` rounds. ``rafi.bench.resident`` prints the ``cached`` ring beside its rounds.

    mpirun -n 2 python -m rafi.bench.node_floor --items 1000 --rounds 2000
"""

import numba
import numpy as np
from mpi4py import MPI

from rafi.examples._cli import Parser, integer
from rafi.kernels.signals import fence_acquire, fence_release, load_relaxed, now_ns, pause, store_relaxed
from rafi.kernels.streaming import stream_fence, stream_store

WORDS = 8  # int64 words of a 64-byte record
FLAGS = 16  # int64 words of flags a rank: two, a cache line each
PATIENCE_NS = 10_000_000_000  # a rank waits this long for a flag, then the run fails
KINDS = ("cached", "streaming")
ONE_NODE = "2 or more ranks, all on one node"  # where the raw exchange runs


@numba.njit(nogil=True)
def _until(memory, at, r):
    """Wait until ``memory[at]`` reaches ``r``, backing off as rafi's waits do (``pause``:
    more ranks than cores take turns); False if it did not within ``PATIENCE_NS``."""
    since, k = now_ns(), 0
    while load_relaxed(memory, at) < r:
        if now_ns() - since > PATIENCE_NS:
            return False
        pause(k)
        k += 1
    return True


@numba.njit(nogil=True)
def ring(memory, me, size, words, rounds, first, streaming, spent):
    """``rounds`` rounds numbered from ``first``; ``spent``: ns writing, reading, waiting.
    Round ``r``'s words are ``(r + w) * size + me``, so that what a rank reads names its
    writer. Returns the sum of what it read, or -1 if a peer's flag did not come (``_until``)."""
    head = FLAGS * size
    mine, onward = head + me * words, head + (me + 1) % size * words
    previous, total = (me + size - 1) % size, 0
    for r in range(first, first + rounds):
        t0 = now_ns()
        if streaming:
            for w in range(words):
                stream_store(memory, onward + w, (r + w) * size + me)
            stream_fence()
        else:
            for w in range(words):
                memory[onward + w] = (r + w) * size + me
        t1 = now_ns()
        fence_release()
        store_relaxed(memory, me * FLAGS, r)  # written
        if not _until(memory, previous * FLAGS, r):
            return -1
        fence_acquire()
        t2 = now_ns()
        for w in range(words):
            total += memory[mine + w]
        t3 = now_ns()
        store_relaxed(memory, me * FLAGS + 8, r)  # read: the previous rank may write again
        if not _until(memory, (me + 1) % size * FLAGS + 8, r):
            return -1
        spent[0] += t1 - t0
        spent[1] += t3 - t2
        spent[2] += (t2 - t1) + (now_ns() - t3)
    return total


def _expected(words, rounds, first, size, previous):
    """What ``ring`` reads in all from rank ``previous``: every round ``r``, the words
    ``(r + w) * size + previous``."""
    plain = words * sum(range(first, first + rounds)) + rounds * words * (words - 1) // 2
    return plain * size + rounds * words * previous


def on_one_node(comm):
    """Whether the ranks of ``comm`` are ``ONE_NODE`` (the raw exchange's case)."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    size = node.Get_size()
    node.Free()
    return size == comm.Get_size() >= 2


class Ring:
    """The raw exchange of ``items`` records a rank on the ranks of ``comm`` (one node, at
    least 2); ``run`` times it. A context manager: it frees its window on exit."""

    def __init__(self, comm, items):
        if not on_one_node(comm):
            raise ValueError(f"the raw exchange needs {ONE_NODE}")
        self.node = comm.Split_type(MPI.COMM_TYPE_SHARED)
        self.size, self.me = self.node.Get_size(), self.node.Get_rank()
        self.words = items * WORDS
        nbytes = (FLAGS + self.words) * self.size * 8 if self.me == 0 else 0
        self.window = MPI.Win.Allocate_shared(nbytes, 8, comm=self.node)
        self.memory = np.frombuffer(self.window.Shared_query(0)[0], np.int64)
        if self.me == 0:
            self.memory[:] = 0
        ring(self.memory, self.me, self.size, self.words, 0, 1, False, np.zeros(3, np.int64))  # compiles
        self.node.Barrier()  # before any rank waits for a flag
        self.first = 1

    def _rounds(self, rounds, streaming, spent):
        total = ring(self.memory, self.me, self.size, self.words, rounds, self.first, streaming, spent)
        if total < 0:
            waited = PATIENCE_NS / 1e9
            print(f"node_floor: rank {self.me} waited {waited:.0f} s for a peer's flag", flush=True)
            self.node.Abort(1)
        previous = (self.me + self.size - 1) % self.size
        ok = total == _expected(self.words, rounds, self.first, self.size, previous)
        self.first += rounds
        if not self.node.allreduce(int(ok), op=MPI.MIN):
            raise AssertionError("node_floor: a rank read what was not written for it")

    def run(self, rounds, kind="cached", runs=5):
        """Microseconds a round (rank 0's clock, the median of ``runs`` runs after a warm-up):
        the round, and its writing, reading and waiting."""
        streaming = KINDS.index(kind) == 1
        self._rounds(10, streaming, np.zeros(3, np.int64))  # compiles, warms
        times = []
        for _ in range(runs):
            spent = np.zeros(3, np.int64)
            self.node.Barrier()
            started = now_ns()
            self._rounds(rounds, streaming, spent)
            times.append((now_ns() - started, *spent))
        return self.node.bcast(np.median(np.array(times), axis=0) / rounds * 1e-3)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.window.Free()
        self.node.Free()


def main(argv=None):
    parser = Parser("rafi.bench.node_floor", __doc__)
    parser.add_argument("--items", type=integer(1), default=1000, help="64-byte records a rank sends a round")
    parser.add_argument("--rounds", type=integer(1), default=2000, help="rounds a timed run")
    opts = parser.parse_args(argv)
    comm = MPI.COMM_WORLD
    parser.agree(lambda: None if on_one_node(comm) else ONE_NODE)
    with Ring(comm, opts.items) as raw:
        figures = {kind: raw.run(opts.rounds, kind) for kind in KINDS}
    if comm.Get_rank() == 0:
        print(f"# {comm.Get_size()} ranks, {opts.items} x 64 B a rank a round: microseconds a round (rank 0)")
        print(f"{'stores':>10} {'round':>8} {'write':>8} {'read':>8} {'wait':>8}")
        for kind, median in figures.items():
            print(f"{kind:>10} " + " ".join(f"{v:8.2f}" for v in median))


if __name__ == "__main__":
    main()
