"""Forwarding benchmark: rafi's ``forward()`` against the raw transport and a hand-written exchange.

    mpirun -n 2 python -m rafi.bench --items 1000 100000 1000000 --itemsize 64 --pattern uniform

Each point: the median of ``--rounds`` timed rounds after warm-up, all ranks synchronized
by a barrier before each round; a table on rank 0, and ``--json`` for the records.
Correctness is checked on every point: every rank receives exactly the items sent to it.
"""

import argparse
import json
import time

import numpy as np
from mpi4py import MPI

import rafi
from rafi.kernels import bench as traffic

from .baselines import destinations, hand_written, raw_floor

PATTERNS = {"uniform": traffic.UNIFORM, "ring": traffic.RING, "hot": traffic.HOT}


def item_dtype(itemsize):
    return np.dtype([("tag", "u8"), ("body", "u1", (itemsize - 8,))])


def time_rafi(fwd, n, pattern, rounds, seed):
    """Median seconds of one ``forward()`` delivering ``n`` items per rank; checks delivery."""
    comm = MPI.COMM_WORLD
    times, total = [], 0
    for r in range(rounds + 2):  # two warm-up rounds
        fwd.launch(traffic.fill, n, fwd.outbox, fwd.rank, fwd.size, pattern, seed)
        fwd._backend.synchronize()
        comm.Barrier()
        t = time.perf_counter()
        got = 0
        while True:
            result = fwd.forward()
            got += result.received
            if result.alive <= fwd.capacity:  # all ranks know: nothing can have been held back
                break
            if not comm.allreduce(result.deferred):  # every rank takes part, every time
                break
        fwd._backend.synchronize()
        if r >= 2:
            times.append(time.perf_counter() - t)
        total = got
    return float(np.median(times)), total


def run(opts):
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    dtype = item_dtype(opts.itemsize)
    words = opts.itemsize // 8
    pattern = PATTERNS[opts.pattern]
    records = []
    for n in opts.items:
        capacity = n * size if opts.pattern == "hot" else int(1.3 * n) + 1024
        with rafi.Forwarder(comm, dtype, capacity, backend=opts.backend) as fwd:
            xp = np
            if fwd.backend == "cuda" and not fwd._backend.simulator:
                import cupy as xp
            seconds, got = time_rafi(fwd, n, pattern, opts.rounds, opts.seed)
            expected = sum(
                int((destinations(n, s, size, pattern, opts.seed) == rank).sum()) for s in range(size)
            )
            assert got == expected, f"rank {rank} received {got} items, expected {expected}"
            dest = destinations(n, rank, size, pattern, opts.seed)
            floor = raw_floor(comm, xp, words, dest, opts.rounds)
            hand = hand_written(comm, xp, words, dest, opts.rounds)
            backend, transport = fwd.backend, fwd.transport
        worst = np.empty(3)
        comm.Allreduce(np.array([seconds, floor, hand]), worst, op=MPI.MAX)
        payload = comm.allreduce(n * opts.itemsize)
        records.append(
            {
                "items_per_rank": n,
                "itemsize": opts.itemsize,
                "ranks": size,
                "pattern": opts.pattern,
                "backend": backend,
                "transport": transport,
                "rafi_s": worst[0],
                "raw_floor_s": worst[1],
                "hand_written_s": worst[2],
                "rafi_GBps": payload / worst[0] / 1e9,
                "raw_floor_GBps": payload / worst[1] / 1e9,
                "hand_written_GBps": payload / worst[2] / 1e9,
            }
        )
    return records


def table(records):
    head = (
        f"{'items/rank':>11} {'B':>4} {'rafi ms':>9} {'floor ms':>9} {'hand ms':>9} "
        f"{'rafi GB/s':>10} {'floor GB/s':>10} {'hand GB/s':>10} {'vs hand':>8}"
    )
    lines = [head, "-" * len(head)]
    for r in records:
        lines.append(
            f"{r['items_per_rank']:>11} {r['itemsize']:>4} {r['rafi_s'] * 1e3:>9.3f} "
            f"{r['raw_floor_s'] * 1e3:>9.3f} {r['hand_written_s'] * 1e3:>9.3f} "
            f"{r['rafi_GBps']:>10.2f} {r['raw_floor_GBps']:>10.2f} {r['hand_written_GBps']:>10.2f} "
            f"{r['hand_written_s'] / r['rafi_s']:>7.2f}x"
        )
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="auto", choices=["auto", "cuda", "cpu"])
    parser.add_argument("--items", type=int, nargs="+", default=[1000, 10000, 100000, 1000000])
    parser.add_argument("--itemsize", type=int, default=64, choices=[16, 64, 256])
    parser.add_argument("--pattern", default="uniform", choices=sorted(PATTERNS))
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", help="write the records here (rank 0)")
    opts = parser.parse_args(argv)
    records = run(opts)
    if MPI.COMM_WORLD.Get_rank() == 0:
        r = records[0]
        print(
            f"# {r['ranks']} ranks, backend {r['backend']}, transport {r['transport']}, "
            f"pattern {r['pattern']}"
        )
        print(table(records))
        if opts.json:
            with open(opts.json, "w") as f:
                json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
