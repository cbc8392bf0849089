"""Skewed-cost workload: bulk-synchronous ``forward()`` rounds against ``mode="async"`` and ``"resident"``.

    mpirun -n 4 python -m rafi.bench.skew --items 20000 --hops 16 --heavy 10 --heavy-hops 2

Items hop between ranks; rank 0's items first stay on rank 0 for ``--heavy-hops`` stops
costing ``--heavy`` times more, while the other ranks' items wander among themselves
(kernels/skew.py). Every mode (``--mode``) runs the same items in the same run (after
a small warm-up of each); rank 0 prints, per mode, the time to completion (slowest rank)
and each rank's idle fraction: the share of its time spent waiting for others (in the
rounds' count exchange for bsp and resident, inside ``batches()`` with nothing to do for async).
Items finished are counted on the device (no wait in the loop) and checked against those seeded.
"""

import json
import time

import numpy as np
from mpi4py import MPI

import rafi
from rafi._config import BACKENDS, PROGRESS
from rafi._engines import MODES
from rafi.examples._cli import MOST_ITEMS, Parser, integer, output_file
from rafi.kernels import skew


def run(comm, mode, progress, opts, items):
    """Run the workload once; return (seconds, idle seconds, items finished here)."""
    capacity = items * comm.Get_size() + 64
    config = dict(backend=opts.backend, mode=mode, progress=progress)
    with rafi.Forwarder(comm, skew.Item, capacity, **config) as fwd:
        tally = fwd.to_backend(np.zeros(2, np.int64))  # items done and refused, on the device
        costs = (opts.spin, opts.heavy, opts.heavy_hops)
        comm.Barrier()
        start = time.perf_counter()
        fwd.launch(skew.seed, items, fwd.outbox, fwd.rank, fwd.size, opts.hops, opts.heavy_hops)
        if mode == "async":
            for batch in fwd.batches():
                fwd.launch(skew.step, len(batch), batch, fwd.outbox, fwd.size, *costs, tally)
            idle = fwd.async_stats["waiting"]
        elif mode == "resident":
            fwd.run(skew.step, fwd.size, *costs, tally)
            idle = sum(r.wait for r in fwd.stats)
        else:
            while fwd.forward().alive:
                fwd.launch(skew.step, len(fwd.inbox), fwd.inbox, fwd.outbox, fwd.size, *costs, tally)
            idle = sum(r.wait for r in fwd.stats)
        finished, refused = rafi.asnumpy(tally).tolist()
        seconds = time.perf_counter() - start
    if refused:
        raise RuntimeError(f"the outbox refused {refused} item(s) in a run sized to fit")
    return seconds, idle, finished


def main(argv=None):
    p = Parser("rafi.bench.skew", __doc__)
    p.add_argument("--items", type=integer(1), default=20000, help="items seeded per rank")
    p.add_argument("--hops", type=integer(1), default=16, help="stops every item makes")
    p.add_argument("--heavy", type=integer(1), default=10, help="cost factor of rank 0's items on rank 0")
    p.add_argument("--heavy-hops", type=integer(0), default=2, help="stops rank 0's items make on rank 0")
    p.add_argument("--spin", type=integer(0), default=200, help="hash rounds of one unit of work")
    p.add_argument("--backend", default="auto", choices=BACKENDS, help="where kernels run")
    p.add_argument("--mode", nargs="+", default=list(MODES), choices=MODES, help="one run each (bsp always)")
    p.add_argument("--progress", nargs="+", default=["auto"], choices=PROGRESS, help="async: one run each")
    p.add_argument("--json", help="write the figures here (rank 0)")
    opts = p.parse_args(argv)
    if opts.items * p.ranks + 64 > MOST_ITEMS:
        p.error(f"--items {opts.items} on {p.ranks} ranks: more than a forwarder holds (2**31 - 1)")
    p.agree(root=[lambda: output_file("--json", opts.json)])
    comm = MPI.COMM_WORLD
    records = {}
    variants = [("bsp", "auto")] + [("async", p) for p in opts.progress if "async" in opts.mode]
    variants += [("resident", "auto")] if "resident" in opts.mode else []
    for mode, progress in variants:
        run(comm, mode, progress, opts, 64)  # compile and warm up
        seconds, idle, finished = run(comm, mode, progress, opts, opts.items)
        if mode == "async" and len(opts.progress) > 1:
            mode = f"async/{progress}"
        total = comm.allreduce(finished)
        if total != opts.items * comm.Get_size():
            raise AssertionError(f"{mode}: {total} items finished, expected {opts.items * comm.Get_size()}")
        records[mode] = {
            "seconds": comm.allreduce(seconds, op=MPI.MAX),
            "idle_fraction": [i / s for i, s in comm.allgather((idle, seconds))],
        }
    if comm.Get_rank() == 0:
        b = records.pop("bsp")
        print(
            f"# {comm.Get_size()} ranks, {opts.items} items/rank, {opts.hops} hops, rank 0's items "
            f"x{opts.heavy} for {opts.heavy_hops} stops"
        )
        for mode, r in {"bsp": b, **records}.items():
            idle = " ".join(f"{f:.2f}" for f in r["idle_fraction"])
            print(f"{mode:>12}: {r['seconds']:.3f} s   idle fraction per rank: {idle}")
        for mode, r in records.items():
            print(f"{mode} / bsp time: {r['seconds'] / b['seconds']:.2f}")
        records["bsp"] = b
        if opts.json:
            with open(opts.json, "w") as f:
                json.dump({"options": vars(opts), "ranks": comm.Get_size(), **records}, f, indent=1)


if __name__ == "__main__":
    main()
