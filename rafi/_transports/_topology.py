"""Where the GPUs of a node's ranks are: shared, peer-accessible, or one per rank.

Ranks compare PCI bus ids over the node communicator (device ordinals differ between
processes with different ``CUDA_VISIBLE_DEVICES``). Each answer is agreed by every rank of
the node; every function is collective over ``node``.
"""

__all__ = ["gpus_reachable", "own_gpus"]


def _node_buses(node, backend):
    """Return (whether this rank has a real GPU and CuPy, every node rank's GPU bus id)."""
    cp = backend.cupy
    ok = cp is not None and backend.device_arrays and not backend.simulator
    return ok, node.allgather(cp.cuda.runtime.deviceGetPCIBusId(backend.device) if ok else None)


def _agreed(node, ok):
    from mpi4py import MPI

    return bool(node.allreduce(int(bool(ok)), op=MPI.MIN))


def gpus_reachable(node, backend):
    """Return True on every node rank when every pair of node ranks can map each other's
    device memory (same GPU, or GPUs with peer access); collective over ``node``."""
    ok, buses = _node_buses(node, backend)
    if ok:
        runtime = backend.cupy.cuda.runtime
        for bus in set(buses) - {buses[node.Get_rank()]}:
            try:
                theirs = runtime.deviceGetByPCIBusId(bus)
                ok = ok and bool(runtime.deviceCanAccessPeer(backend.device, theirs))
            except Exception:  # that GPU is not visible here (CUDA_VISIBLE_DEVICES), or None
                ok = False
    return _agreed(node, ok)


def own_gpus(node, backend):
    """Return True on every node rank when no two ranks of the node share a GPU (what NCCL
    needs: it refuses two ranks on one GPU); collective over ``node``."""
    ok, buses = _node_buses(node, backend)
    return _agreed(node, ok and None not in buses and len(set(buses)) == len(buses))
