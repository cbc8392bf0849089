"""Forwarding to ``device.ANY`` by load: how even the inboxes are after one round, and its cost.

    mpirun -n 16 python -m rafi.bench.anywhere --items 10000 --skew 10 --backend cpu

Rank 0 sends ``--skew`` times as many items as every other rank, all for ``device.ANY``;
one ``forward()`` places them (rafi/_anywhere.py). Rank 0 prints each rank's inbox after
that round against the mean (the largest deviation, in percent), and the median time of
``--rounds`` such rounds beside rounds that send the same items to the sender itself
(what the round costs without placing). Every item is checked to arrive exactly once.
"""

import json
import time

import numpy as np
from mpi4py import MPI

import rafi
from rafi import device
from rafi._config import BACKENDS
from rafi._sparse import EXCHANGES
from rafi.examples._cli import MOST_ITEMS, Parser, integer, output_file


def one_round(fwd, comm, items, dest):
    """Send ``items`` to ``dest``, forward once; the seconds it took (slowest rank) and the inbox."""
    fwd.send(items, dest)
    comm.Barrier()
    started = time.perf_counter()
    result = fwd.forward()
    seconds = comm.allreduce(time.perf_counter() - started, op=MPI.MAX)
    return seconds, rafi.asnumpy(fwd.inbox).copy(), result


def measure(opts):
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    mine = opts.items * (opts.skew if rank == 0 else 1)
    items = rank * 10**9 + np.arange(mine, dtype=np.int64)
    total = comm.allreduce(mine)
    capacity = opts.items * opts.skew + total // size + 1024  # no round defers: the same on every rank
    config = dict(backend=opts.backend, exchange=opts.exchange)
    placed, directed = [], []
    with rafi.Forwarder(comm, np.int64, capacity, **config) as fwd:
        _, got, result = one_round(fwd, comm, items, device.ANY)
        counts = np.array(comm.allgather(len(got)))
        everything = np.concatenate(comm.allgather(got))
        exactly_once = len(everything) == total and len(np.unique(everything)) == total
        exactly_once = exactly_once and result.alive == total and not result.deferred
        for _ in range(opts.rounds):
            placed.append(one_round(fwd, comm, items, device.ANY)[0])
            directed.append(one_round(fwd, comm, items, rank)[0])
        backend = fwd.backend
    mean = total / size
    return {
        "ranks": size,
        "backend": backend,
        "exchange": opts.exchange,
        "items_per_rank": opts.items,
        "skew": opts.skew,
        "inbox_after_one_round": counts.tolist(),
        "max_deviation_from_mean": float(np.abs(counts - mean).max() / mean),
        "exactly_once": bool(exactly_once),
        "any_round_median_s": float(np.median(placed)),
        "directed_round_median_s": float(np.median(directed)),
    }


def main(argv=None):
    parser = Parser("rafi.bench.anywhere", __doc__)
    parser.add_argument("--items", type=integer(0), default=10000, help="items each rank but rank 0 sends")
    parser.add_argument("--skew", type=integer(1), default=10, help="rank 0 sends this many times as many")
    parser.add_argument("--backend", default="auto", choices=BACKENDS, help="where kernels run")
    parser.add_argument("--exchange", default="auto", choices=EXCHANGES, help="how a round's counts travel")
    parser.add_argument("--rounds", type=integer(1), default=20, help="timed rounds of each kind")
    parser.add_argument("--json", help="write the record here (rank 0)")
    opts = parser.parse_args(argv)
    if opts.items * (parser.ranks - 1 + opts.skew) > MOST_ITEMS:
        parser.error("--items and --skew: more items in flight than a forwarder holds (2**31 - 1)")
    parser.agree(root=[lambda: output_file("--json", opts.json)])
    record = measure(opts)
    if MPI.COMM_WORLD.Get_rank() != 0:
        return
    counts = record["inbox_after_one_round"]
    print(
        f"# ANY, {record['ranks']} ranks, skew {opts.skew}:1, backend {record['backend']}: inboxes after one "
        f"round {min(counts)}..{max(counts)} (mean {sum(counts) / len(counts):.0f}, largest deviation "
        f"{100 * record['max_deviation_from_mean']:.2f}%), exactly once: {record['exactly_once']}; "
        f"round {record['any_round_median_s'] * 1e6:.0f} us with placement, "
        f"{record['directed_round_median_s'] * 1e6:.0f} us sent to self"
    )
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
