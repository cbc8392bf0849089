"""Monte Carlo particle transport through a distributed material grid.

    mpirun -n 4 python -m rafi.examples.transport --particles 1000000 --seed 1 --json t.json

The unit cube is a ``--grid``^3 grid of cells, split into one slab of whole cells along x
per rank; each rank holds only its slab's cross sections. Particles start in a small
source box, fly, scatter and are absorbed (tallied per cell with a ``rafi.Reducer``) or
leak out of the cube; a particle entering another rank's slab is forwarded there with its
whole state (kernels/transport.py). Every source particle ends exactly once:
``absorbed + leaked == particles``, checked before the results are written. The tallies
do not depend on the rank count (each particle's random numbers are keyed by its id);
``--check`` compares them with the one-process reference on the same backend.

Materials (cross sections per unit length, sigma_a / sigma_s): a scattering background
0.5 / 4.5, a shield slab (x in [0.35, 0.42]) 2 / 20, an absorbing sphere (center
(0.7, 0.5, 0.5), radius 0.15) 30 / 2.
"""

import json
import sys
import time

import numpy as np
from mpi4py import MPI

import rafi
from rafi._config import BACKENDS
from rafi.kernels import transport as kern

from ._cli import MOST_ITEMS, Parser, add_mode, integer, output_file
from .render_loop import forwarding, settling

__all__ = ["materials", "slab", "run", "main"]


def materials(g):
    """Cross sections of every cell: ``(g, g, g, 2)`` float64, (sigma_a, sigma_s)."""
    centers = (np.arange(g) + 0.5) / g
    x, y, z = np.meshgrid(centers, centers, centers, indexing="ij")
    mat = np.empty((g, g, g, 2))
    mat[...] = (0.5, 4.5)
    mat[(x >= 0.35) & (x < 0.42)] = (2.0, 20.0)
    mat[(x - 0.7) ** 2 + (y - 0.5) ** 2 + (z - 0.5) ** 2 < 0.15**2] = (30.0, 2.0)
    return mat


def slab(rank, size, g):
    """The cell columns ``[lo, hi)`` along x that ``rank`` owns (``kern.owner_of``'s inverse)."""
    return -(-rank * g // size), -(-(rank + 1) * g // size)


def parse(argv=None, comm=None):
    """The options (``argv``: the command line's words, default ``sys.argv``), checked: a
    usage error exits every rank of ``comm`` (default ``MPI.COMM_WORLD``), rank 0 says why."""
    p = Parser("rafi.examples.transport", __doc__, comm if comm is not None else MPI.COMM_WORLD)
    many = "source particles (a rank may hold them all at once: at most 2**31 - 1)"
    p.add_argument("--particles", type=integer(0, MOST_ITEMS), default=100_000, help=many)
    p.add_argument("--seed", type=integer(0, 2**63 - 1), default=1, help="of every particle's random numbers")
    side = "cells per side of the cube; each rank owns a slab of at least one cell along x"
    p.add_argument("--grid", type=integer(1, 1290), default=32, help=side)  # 1290**3 cells < 2**31
    p.add_argument("--backend", default="auto", choices=BACKENDS, help="where kernels run")
    add_mode(p, "particles")
    out = "write particles, absorbed, leaked, tally (per cell), timings and stats here, as JSON (rank 0)"
    p.add_argument("--json", help=out)
    p.add_argument("--check", action="store_true", help="compare with the one-process reference (rank 0)")
    opts = p.parse_args(argv)
    if opts.grid < p.ranks:
        p.error(f"--grid {opts.grid} is fewer cells along x than the {p.ranks} ranks (one slab each)")
    p.agree(root=[lambda: output_file("--json", opts.json)])
    return opts


def run(opts, comm):
    """Transport every particle on all ranks of ``comm``; return the results (tally on rank 0)
    with what the forwarder did (``render_loop.forwarding``)."""
    rank, size, g = comm.Get_rank(), comm.Get_size(), opts.grid
    lo, hi = slab(rank, size, g)
    # every particle may be on one rank at once: room for all, so no round defers any
    capacity = max(1, opts.particles)
    with settling() as settle, rafi.Reducer(comm, g**3, np.float64, backend=opts.backend) as tally:
        with rafi.Forwarder(comm, kern.Particle, capacity, backend=opts.backend, mode=opts.mode) as fwd:
            mat = fwd.to_backend(np.ascontiguousarray(materials(g)[lo:hi]))  # this rank's slab only
            counts = fwd.to_backend(np.zeros(2, np.int64))  # absorbed, leaked here
            walk = (fwd.outbox, tally, counts, mat, lo, hi, g, opts.seed, size)
            started, compiled = time.perf_counter(), rafi.compile_seconds()
            mine = len(range(rank, opts.particles, size))
            fwd.launch(kern.source, mine, fwd.outbox, rank, size, opts.seed, g, size)
            steps = 0
            if fwd.mode == "async":
                for batch in fwd.batches():
                    steps += len(batch)
                    fwd.launch(kern.transport, len(batch), batch, *walk)
                    settle(len(batch))
            elif fwd.mode == "resident":  # the rounds on the device, with no host code between them
                fwd.run(kern.transport, *walk[1:])
                steps = fwd.stats.totals()["items_received"]
            else:
                while fwd.forward().alive:
                    steps += len(fwd.inbox)
                    fwd.launch(kern.transport, len(fwd.inbox), fwd.inbox, *walk)
                    settle(len(fwd.inbox))
            tally.flush()
            seconds = time.perf_counter() - started - (rafi.compile_seconds() - compiled)
            absorbed, leaked = comm.allreduce(rafi.asnumpy(counts))
            info = {"ranks": size, "backend": fwd.backend, "transport": fwd.transport, "mode": fwd.mode}
            info.update(forwarding(comm, fwd))
        cells = tally.gather(root=0)
    info.update(
        particles=opts.particles,
        absorbed=int(absorbed),
        leaked=int(leaked),
        seconds=comm.allreduce(seconds, op=MPI.MAX),
        visits=comm.allreduce(steps),  # a particle counts once per slab it is walked in
    )
    info["particles_per_second"] = opts.particles / info["seconds"] if info["seconds"] else 0.0
    if rank == 0:
        info["tally"] = cells.astype(np.int64).tolist()
    return info


def main(argv=None):
    opts = parse(argv)
    comm = MPI.COMM_WORLD
    info = run(opts, comm)
    if info["absorbed"] + info["leaked"] != opts.particles:  # the same verdict on every rank
        print(f"rafi transport: {info['absorbed']} + {info['leaked']} != {opts.particles}", file=sys.stderr)
        return 1
    if comm.Get_rank() != 0:
        return 0
    print(
        f"{info['ranks']} ranks, backend {info['backend']}, transport {info['transport']}: "
        f"{opts.particles:,} particles, {info['absorbed']:,} absorbed, {info['leaked']:,} leaked, "
        f"in {info['seconds']:.3f} s ({info['particles_per_second']:,.0f} particles/s)"
    )
    if opts.check:
        mat = materials(opts.grid)
        expected, leaked = kern.reference(opts.particles, opts.seed, mat, opts.grid, info["backend"])
        same = leaked == info["leaked"] and expected.tolist() == info["tally"]
        print("reference: " + ("identical tallies" if same else "TALLIES DIFFER"))
        if not same:
            return 1
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(info, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
