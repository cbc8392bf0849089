"""The README's example: every rank sends items to its right neighbour, which checks them.

mpirun -n 2 python examples/minimal.py
"""

import numpy as np
from mpi4py import MPI

import rafi
from rafi import device

Item = np.dtype([("origin", "i4"), ("value", "f4")], align=True)


@rafi.kernel
def produce(i, outbox, rank, size):
    slot = device.push(outbox, (rank + 1) % size)  # reserve a slot for the right neighbour
    if slot >= 0:
        outbox.items[slot].origin = rank
        outbox.items[slot].value = i * 0.5


with rafi.Forwarder(MPI.COMM_WORLD, Item, capacity=1000) as fwd:
    fwd.launch(produce, 1000, fwd.outbox, fwd.rank, fwd.size)
    while fwd.forward().alive:  # ends exactly when no item is left anywhere
        got = rafi.asnumpy(fwd.inbox)
        assert (got["origin"] == (fwd.rank - 1) % fwd.size).all()
        print(f"rank {fwd.rank}: {len(got)} items, sum of values {got['value'].sum()}")
