"""Random walkers hopping between ranks: a small forwarding workload that prints its stats.

    mpirun -n 4 python -m rafi.examples.forward --walkers 100000 --steps 8

Every rank seeds walkers; each round a kernel moves every walker in its inbox to a
pseudo-random rank until it has taken ``--steps`` steps. At the end each rank checks that
every walker arrived exactly once, and rank 0 prints the per-round statistics.
"""

import json
import sys

import numpy as np
from mpi4py import MPI

import rafi
from rafi._config import BACKENDS
from rafi.kernels import walkers as walk

from ._cli import MOST_ITEMS, Parser, integer, output_file


def parse(argv=None, comm=None):
    """The options, checked: a usage error exits every rank of ``comm`` (default
    ``MPI.COMM_WORLD``), rank 0 says why."""
    p = Parser("rafi.examples.forward", __doc__, comm if comm is not None else MPI.COMM_WORLD)
    walkers = "walkers per rank (a rank holds at most twice its share, and 1024 more)"
    p.add_argument("--walkers", type=integer(0, (MOST_ITEMS - 1024) // 2), default=20000, help=walkers)
    p.add_argument("--steps", type=integer(1), default=6, help="hops each walker takes")
    p.add_argument("--backend", default="auto", choices=BACKENDS, help="where kernels run")
    p.add_argument("--stats", help="write per-round stats here, as JSON (rank 0)")
    opts = p.parse_args(argv)
    p.agree(root=[lambda: output_file("--stats", opts.stats)])
    return opts


def main(argv=None):
    opts = parse(argv)
    comm = MPI.COMM_WORLD
    capacity = 2 * opts.walkers + 1024  # room for an unlucky rank getting more than its share
    with rafi.Forwarder(comm, walk.Walker, capacity, backend=opts.backend) as fwd:
        fwd.launch(walk.seed, opts.walkers, fwd.outbox, fwd.rank, fwd.size)
        finished = 0
        checksum = 0
        while True:
            result = fwd.forward()
            if not result.alive:
                break
            inbox = fwd.inbox
            flags = fwd.to_backend(np.zeros(max(len(inbox), 1), np.int32))
            fwd.launch(walk.step, len(inbox), inbox, fwd.outbox, fwd.rank, fwd.size, opts.steps, flags)
            arrived = rafi.asnumpy(inbox)[rafi.asnumpy(flags) == 1]
            finished += len(arrived)
            checksum += int(arrived["id"].sum(dtype=np.int64))
        total = comm.allreduce(finished)
        checks = comm.allreduce(checksum)
        n = opts.walkers * comm.Get_size()
        expected = n * (n - 1) // 2
        if fwd.rank == 0:
            print(f"{fwd.size} ranks, backend {fwd.backend}, transport {fwd.transport}")
            print(fwd.stats.summary())
            print(
                f"{total} of {n} walkers finished after {opts.steps} steps each; id checksum "
                f"{'ok' if checks == expected else 'WRONG'}"
            )
            if opts.stats:
                with open(opts.stats, "w") as f:
                    json.dump(fwd.stats.as_dict(), f, indent=1)
    return 0 if total == n and checks == expected else 1


if __name__ == "__main__":
    sys.exit(main())
