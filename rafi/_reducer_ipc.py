"""``Reducer.flush()`` over CUDA IPC: each owner combines its block from every rank's partial.

When every rank of a reducer's communicator is on one node and their GPUs can map each
other's memory, a flush moves no partial through the host or MPI. Each rank maps its
peers' partial arrays once (``_transports._ipc.IpcPeers``); at a flush it combines the
entries it owns from every rank's partial, in rank order, on its own GPU (CuPy's add,
maximum or minimum), and copies only its block to the host. The host path instead copies
the whole partial to the host and runs a ``Reduce_scatter`` over it (25 MB for a
1024x1024 RGB image in float64: tens of milliseconds on the H200 machine).

Order: a rank enters flush's error agreement only after its device has finished, so when
that agreement completes every partial is complete; after the reads, the ranks meet in a
barrier (``IpcPeers.release``) before any of them resets its partial.
"""

from ._errors import ConfigError

__all__ = ["IpcCombine", "ipc_combine"]


def ipc_combine(comm, backend, partial, lo, count, op, watch, required):
    """``(IpcCombine, None)`` when the whole of ``comm`` is one node whose GPUs map each
    other's memory, else ``(None, why not)``, the same on every rank; ``required``: raise
    instead. Every rank of ``comm`` calls it, with the cuda backend and CuPy."""
    from ._transports import node_comm

    node = node_comm(comm)
    if comm.allreduce(int(node.Get_size() != comm.Get_size())):
        why = "the ranks are on more than one node"
    else:
        try:
            return IpcCombine(comm, node, backend, partial, lo, count, op, watch), None
        except ConfigError as error:  # raised on every rank together
            why = str(error)
    node.Free()
    if required:
        raise ConfigError(f"Reducer(transport='ipc') cannot be used: {why}")
    return None, why


class IpcCombine:
    """This rank's view of every rank's partial, for the entries ``[lo, lo + count)`` it owns.

    Raises:
        ConfigError: on every rank together, if any could not allocate or map.
    """

    def __init__(self, comm, node, backend, partial, lo, count, op, watch):
        from ._transports._ipc import IpcPeers

        cp = self._cp = backend.cupy
        self._node = node
        failed = None
        try:  # everything that can fail alone, before any rank maps another's memory
            self._combine = {"sum": cp.add, "max": cp.maximum, "min": cp.minimum}[op]
            self._block = cp.empty(count, partial.dtype)
            self._host = backend.host_buffer(max(count, 1), partial.dtype)[:count]  # no empty pinning
        except Exception as error:
            failed = f"rank {comm.Get_rank()}: {type(error).__name__}: {error}"
        failures = [f for f in comm.allgather(failed) if f]
        if failures:
            raise ConfigError("; ".join(failures))
        self._peers = IpcPeers(comm, node, backend, [partial], watch, "Reducer.flush()")
        mine = {comm.Get_rank(): partial, **{peer: arrays[0] for peer, arrays in self._peers.sources.items()}}
        self._sources = [cp.asarray(array)[lo : lo + count] for _, array in sorted(mine.items())]

    def combine(self):
        """This rank's block, combined over every rank's partial, in host memory (the same
        buffer each time); on return no peer reads this rank's partial any more."""
        first, *others = self._sources
        with self._cp.cuda.Stream.null:  # where rafi's kernels contributed
            self._block[...] = first
            for other in others:
                self._combine(self._block, other, out=self._block)
            self._block.get(out=self._host)
        self._peers.release()
        return self._host

    def close(self):
        """Unmap the peers' partials; collective, so no partial is freed while mapped."""
        self._peers.close()
        self._node.Free()
