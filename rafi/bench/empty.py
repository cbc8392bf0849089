"""Empty rounds: what ``forward()`` costs when nothing is queued, against one MPI ``Alltoall``.

    mpirun -n 16 python -m rafi.bench.empty --backend cpu --rounds 2000

An empty round still partitions the (empty) outbox, exchanges control blocks and agrees
on liveness: it is the fixed cost every round pays, all host path and control exchange.
Rank 0 prints, for rafi and for one ``Alltoall`` of one int per peer on a communicator
of the same ranks, the median and 90th percentile over ``--rounds`` rounds of the
slowest rank, and the round's split (``fwd.stats``, rank 0's medians). No barrier
between rounds: back-to-back rounds are what a loop of rounds costs.
"""

import time

import numpy as np
from mpi4py import MPI

import rafi
from rafi._config import BACKENDS, TRANSPORTS
from rafi._sparse import EXCHANGES
from rafi.bench import _records as records
from rafi.examples._cli import Parser, integer, output_file

SPLIT = ("partition", "wait", "payload", "host")


def _slowest(comm, seconds):
    """Per round, the slowest rank's time."""
    worst = np.empty_like(seconds)
    comm.Allreduce(seconds, worst, op=MPI.MAX)
    return worst


def time_rounds(comm, rounds, one_round):
    """``rounds`` timed calls of ``one_round`` after a tenth as many warm-ups."""
    for _ in range(max(10, rounds // 10)):
        one_round()
    comm.Barrier()
    seconds = np.empty(rounds)
    for r in range(rounds):
        t = time.perf_counter()
        one_round()
        seconds[r] = time.perf_counter() - t
    return _slowest(comm, seconds)


def measure(opts):
    comm = MPI.COMM_WORLD
    dtype = np.dtype([("x", "f8")])
    config = dict(backend=opts.backend, transport=opts.transport, exchange=opts.exchange)
    with rafi.Forwarder(comm, dtype, 1024, **config) as fwd:
        empty = time_rounds(comm, opts.rounds, fwd.forward)
        stats = [fwd.stats[i] for i in range(len(fwd.stats) - opts.rounds, len(fwd.stats))]
        split = {k: float(np.median([getattr(s, k) for s in stats])) for k in SPLIT}
        backend, transport = fwd.backend, fwd.transport
        messages = float(np.median([s.control_messages for s in stats]))
    mpi = comm.Dup()
    send, recv = np.zeros(mpi.Get_size(), np.int64), np.zeros(mpi.Get_size(), np.int64)
    alltoall = time_rounds(mpi, opts.rounds, lambda: mpi.Alltoall(send, recv))
    mpi.Free()
    return {
        "ranks": comm.Get_size(),
        "backend": backend,
        "transport": transport,
        "rounds": opts.rounds,
        "rafi_median_s": float(np.median(empty)),
        "rafi_p90_s": float(np.percentile(empty, 90)),
        "alltoall_median_s": float(np.median(alltoall)),
        "alltoall_p90_s": float(np.percentile(alltoall, 90)),
        "rafi_split_s": split,
        "exchange": opts.exchange,
        "control_messages": messages,
    }


def main(argv=None):
    parser = Parser("rafi.bench.empty", __doc__)
    parser.add_argument("--backend", default="auto", choices=BACKENDS, help="where kernels run")
    parser.add_argument("--transport", default="auto", choices=TRANSPORTS, help="how payloads travel")
    parser.add_argument("--exchange", default="auto", choices=EXCHANGES, help="how a round's counts travel")
    parser.add_argument("--rounds", type=integer(1), default=2000, help="timed rounds of each kind")
    parser.add_argument("--json", help="append the record to this JSON list (rank 0)")
    opts = parser.parse_args(argv)
    parser.agree(root=[lambda: output_file("--json", opts.json)])
    record = measure(opts)
    if MPI.COMM_WORLD.Get_rank() != 0:
        return
    us = {k: v * 1e6 for k, v in record.items() if k.endswith(("median_s", "p90_s"))}
    split = " / ".join(f"{record['rafi_split_s'][k] * 1e6:.1f}" for k in SPLIT)
    print(
        f"# empty rounds, {record['ranks']} ranks, backend {record['backend']}, "
        f"transport {record['transport']}, exchange {record['exchange']} "
        f"({record['control_messages']:.0f} control messages): rafi {us['rafi_median_s']:.1f} us "
        f"(p90 {us['rafi_p90_s']:.1f}), Alltoall {us['alltoall_median_s']:.1f} us "
        f"(p90 {us['alltoall_p90_s']:.1f}); split partition / wait / payload / host: {split} us"
    )
    if opts.json:
        records.append(opts.json, record)


if __name__ == "__main__":
    main()
