"""Where the GPUs of a node's ranks are: shared, peer-accessible, or one per rank.

Ranks compare PCI bus ids over the node communicator (device ordinals differ between
processes with different ``CUDA_VISIBLE_DEVICES``); ``node_gpus`` is collective over it
and every rank of the node gets the same answer.
"""

import collections

import numpy as np

__all__ = ["NodeGpus", "node_gpus"]

NodeGpus = collections.namedtuple("NodeGpus", ["reachable", "own"])
NodeGpus.__doc__ = """``reachable``: every pair of node ranks can map each other's device memory (same
GPU, or GPUs with peer access); ``own``: no two node ranks share a GPU (what NCCL needs)."""


def node_gpus(node, backend):
    """Return the node's ``NodeGpus``, agreed by every rank of ``node``."""
    from mpi4py import MPI

    cp = backend.cupy
    ok = cp is not None and backend.device_arrays and not backend.simulator
    buses = node.allgather(cp.cuda.runtime.deviceGetPCIBusId(backend.device) if ok else None)
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
    agreed = np.empty(2, np.int64)
    node.Allreduce(np.array([reachable, own], np.int64), agreed, op=MPI.MIN)  # elementwise
    return NodeGpus(bool(agreed[0]), bool(agreed[1]))
