"""Particles drifting through a periodic box split into one slab per rank.

    mpirun -n 2 python examples/particles.py

Each step a kernel moves every particle and forwards it to the rank that owns its new
position, with its payload (id, velocity, mass). At the end every rank checks that it
holds exactly the particles inside its slab and that none was lost or duplicated.
"""

import numpy as np
from mpi4py import MPI

import rafi
from rafi import device

Particle = np.dtype([("id", "i8"), ("x", "f8"), ("v", "f8"), ("mass", "f4")], align=True)


@rafi.kernel
def drift(i, inbox, outbox, dt, size):
    p = inbox[i]
    x = (p.x + p.v * dt) % 1.0
    slot = device.push(outbox, min(int(x * size), size - 1))  # the slab's owner
    if slot >= 0:
        q = outbox.items[slot]
        q.id, q.x, q.v, q.mass = p.id, x, p.v, p.mass


def main(n=5000, steps=20, dt=0.03):
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    rng = np.random.default_rng(rank)
    start = np.zeros(n, Particle)
    start["id"] = rank * n + np.arange(n)
    start["x"] = (rank + rng.random(n)) / size
    start["v"] = rng.normal(0, 1, n)
    start["mass"] = 1.0
    with rafi.Forwarder(comm, Particle, n * size) as fwd:
        fwd.send(start, rank)
        for step in range(steps + 1):
            fwd.forward()
            here = rafi.asnumpy(fwd.inbox)
            if step == steps:
                break
            fwd.launch(drift, len(fwd.inbox), fwd.inbox, fwd.outbox, dt, size)
    assert ((here["x"] * size).astype(int).clip(0, size - 1) == rank).all()
    ids = np.sort(np.concatenate(comm.allgather(here["id"])))
    assert (ids == np.arange(n * size)).all(), "a particle was lost or duplicated"
    if rank == 0:
        print(f"{n * size} particles, {steps} steps on {size} ranks: all accounted for")


if __name__ == "__main__":
    main()
