"""Checkpoint cost: seconds and GB/s to write and read the in-flight state.

    mpirun -n 2 python -m rafi.bench.checkpoint --items 1000000 10000000 --path /tmp/ck.h5

Each rank queues ``items`` items of ``--itemsize`` bytes, checkpoints them, and restores
them; the table gives the slowest rank's seconds and the aggregate bytes per second.
"""

import os
import time

import numpy as np
from mpi4py import MPI

import rafi
from rafi._config import BACKENDS
from rafi.examples._cli import MOST_ITEMS, Parser, integer, output_file


def main(argv=None):
    p = Parser("rafi.bench.checkpoint", __doc__)
    many = "items each rank queues, one checkpoint each"
    p.add_argument(
        "--items", type=integer(1, MOST_ITEMS), nargs="+", default=[1_000_000, 10_000_000], help=many
    )
    p.add_argument(
        "--itemsize", type=integer(8), default=64, help="bytes per item (an 8-byte tag and a body)"
    )
    p.add_argument("--backend", default="auto", choices=BACKENDS, help="where kernels run")
    p.add_argument(
        "--path", default="rafi-bench-checkpoint.h5", help="the checkpoint file (removed at the end)"
    )
    opts = p.parse_args(argv)
    p.agree(lambda: output_file("--path", opts.path))  # every rank writes its part
    comm = MPI.COMM_WORLD
    dtype = np.dtype([("tag", "u8"), ("body", "u1", (opts.itemsize - 8,))])
    rows = []
    for n in opts.items:
        with rafi.Forwarder(comm, dtype, n, backend=opts.backend) as fwd:
            items = np.zeros(n, dtype)
            items["tag"] = np.arange(n)
            fwd.send(items, comm.Get_rank())
            comm.Barrier()
            t = time.perf_counter()
            fwd.checkpoint(opts.path)
            write = comm.allreduce(time.perf_counter() - t, op=MPI.MAX)
            backend = fwd.backend
        comm.Barrier()
        t = time.perf_counter()
        fwd, _ = rafi.Forwarder.restore(comm, opts.path, backend=opts.backend)
        read = comm.allreduce(time.perf_counter() - t, op=MPI.MAX)
        fwd.close()
        total = comm.allreduce(n * opts.itemsize)
        rows.append((n, backend, write, total / write / 1e9, read, total / read / 1e9))
    if comm.Get_rank() == 0:
        os.remove(opts.path)
        print(f"# {comm.Get_size()} ranks, {opts.itemsize}-byte items")
        print(f"{'items/rank':>11} {'backend':>8} {'write s':>9} {'write GB/s':>11} ", end="")
        print(f"{'read s':>9} {'read GB/s':>10}")
        for n, backend, w, wg, r, rg in rows:
            print(f"{n:>11} {backend:>8} {w:>9.3f} {wg:>11.2f} {r:>9.3f} {rg:>10.2f}")


if __name__ == "__main__":
    main()
