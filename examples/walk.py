"""Reading the inbox in a kernel: walkers hop between ranks at random until they stop.

    launch/local.sh 3 python examples/walk.py [cpu|cuda]

Each walker carries its id and step count. A kernel reads the inbox, counts arrivals
with ``device.atomic_add`` (correct on every backend), and sends each walker on to a
random rank, or stops it, with ``device.random`` keyed by the walker's id and step: the
same numbers on every backend and at every rank count, so the totals (the walkers are
dealt to the ranks) do not depend on either.
"""

import sys

import numpy as np
from mpi4py import MPI

import rafi
from rafi import device

Walker = np.dtype([("id", "i8"), ("steps", "i4")], align=True)
SEED, WALKERS, STOP = 5, 3000, 0.1  # a walker stops with probability STOP at each step


@rafi.kernel
def start(i, outbox, rank, size):
    slot = device.push(outbox, rank)
    if slot >= 0:
        outbox.items[slot].id = rank + i * size  # walkers 0, 1, ... dealt to the ranks
        outbox.items[slot].steps = 0


@rafi.kernel
def hop(i, inbox, outbox, size, counts):
    w = inbox[i]  # the i-th item that arrived here
    device.atomic_add(counts, 0, 1)  # arrivals on this rank
    if device.random(SEED, w.id, w.steps) < STOP:
        device.atomic_add(counts, 1, 1)  # walkers that stopped here
        return
    dest = int(device.random(SEED + 1, w.id, w.steps) * size)
    slot = device.push(outbox, dest)
    if slot >= 0:
        outbox.items[slot].id = w.id
        outbox.items[slot].steps = w.steps + 1


def main(backend="auto", walkers=WALKERS):
    comm = MPI.COMM_WORLD
    with rafi.Forwarder(comm, Walker, capacity=walkers, backend=backend) as fwd:
        counts = fwd.to_backend(np.zeros(2, np.int64))
        fwd.launch(start, len(range(fwd.rank, walkers, fwd.size)), fwd.outbox, fwd.rank, fwd.size)
        while fwd.forward().alive:
            fwd.launch(hop, len(fwd.inbox), fwd.inbox, fwd.outbox, fwd.size, counts)
        arrivals, stopped = comm.allreduce(rafi.asnumpy(counts))
    if comm.Get_rank() == 0:
        print(f"{stopped} walkers stopped after {arrivals} arrivals in all")
    return arrivals, stopped


if __name__ == "__main__":
    main(*sys.argv[1:2])
