"""Where the GPUs of a node's ranks are: shared, peer-accessible, or one per rank.

Ranks compare PCI bus ids over the node communicator (device ordinals differ between
processes with different ``CUDA_VISIBLE_DEVICES``); ``node_gpus`` is collective over it
and every rank of the node gets the same answer.
"""

import collections

import numpy as np

from .._mpi_support import allgather

__all__ = ["NodeGpus", "node_gpus"]

_WHAT = "Forwarder() (finding the node's GPUs)"  # where a rank waits here, as a timeout says it

NodeGpus = collections.namedtuple("NodeGpus", ["reachable", "own"])
NodeGpus.__doc__ = """``reachable``: every pair of node ranks can map each other's device memory (same
GPU, or GPUs with peer access); ``own``: no two node ranks share a GPU (what NCCL needs)."""


def node_gpus(node, backend, watch=None):
    """Return the node's ``NodeGpus``, agreed by every rank of ``node`` (under the deadline of
    ``watch``, the forwarder's, when given)."""
    from mpi4py import MPI

    cp = backend.cupy
    ok = cp is not None and backend.device_arrays and not backend.simulator
    bus = cp.cuda.runtime.deviceGetPCIBusId(backend.device) if ok else None
    buses = allgather(node, bus, _WHAT, watch)
    reachable = ok
    if ok:
        runtime = cp.cuda.runtime
        for bus in set(buses) - {buses[node.Get_rank()]}:
            try:
                theirs = runtime.deviceGetByPCIBusId(bus)
                reachable = reachable and bool(runtime.deviceCanAccessPeer(backend.device, theirs))
            except Exception:  # that GPU is not visible here (CUDA_VISIBLE_DEVICES), or None
                reachable = False
    own = ok and None not in buses and len(set(buses)) == len(buses)
    mine, agreed = np.array([reachable, own], np.int64), np.empty(2, np.int64)
    if watch is None:
        node.Allreduce(mine, agreed, op=MPI.MIN)  # elementwise
    else:
        watch.collective("Allreduce", mine, agreed, MPI.MIN, what=_WHAT, comm=node)
    return NodeGpus(bool(agreed[0]), bool(agreed[1]))
