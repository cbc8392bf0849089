"""CUDA IPC between the ranks of one node: each rank maps its node peers' outboxes.

Pull model. Every rank exports, once, the two device arrays a peer needs to fetch what it
was granted: the outbox's records (as machine words) and the partition's sort ``order``.
In a round, a receiver copies each node peer's granted segment straight from that peer's
outbox into its own inbox with a kernel (kernels/partition.py::gather_rows), at the
sorted start the peer sent in its control block. No host memory and no MPI payload.

Completion: a receiver synchronizes its stream, then all node ranks meet in a barrier
(``release``) before ``forward()`` returns, so no rank's next kernel overwrites an outbox
a peer is still reading. Reads happen only inside ``forward()``, between the count
exchange and that barrier, where every rank takes part.

Handles name whole allocations (a CuPy pool block would share one with its neighbours),
so the allocation's address and the array's offset in it travel with the handle; each
distinct allocation is opened once per process and shared, counted, by the forwarders
that map it (the driver refuses a second mapping). ``close`` waits until no peer reads,
closes the handles, and waits again until every peer has closed its handles to this
rank's memory, so no exported buffer is freed while mapped.
"""

import uuid

from .._errors import ConfigError
from .._mpi_support import allgather

__all__ = ["IpcPeers"]


_mapped = {}  # (device, handle) -> [address, users, (process, start, end) of the owner's allocation]
PROCESS = uuid.uuid4().hex  # names this process to its peers (pids may repeat across containers)


def _open(runtime, handle, owner):
    """Map a peer's allocation on the current device, or count one more user of its mapping
    (the driver refuses to map one allocation twice in a process, and two forwarders of a
    process may both see one: the GPU suite met cudaErrorAlreadyMapped). ``owner``: the
    exporting process (``PROCESS`` there) and the allocation's address range in it,
    ``(process, start, end)``. Returns ``(address, key)``; ``_close(runtime, key)`` gives
    the mapping up.

    If the driver refuses a new allocation as already mapped, a mapping here of an earlier
    allocation of the same owner overlaps it: that allocation was freed (the new one got
    some of its addresses, with a new handle) while this process still mapped it, which
    happens when a forwarder is left without its collective close (a peer timed out or
    raised alone, or the program dropped it). Those stale mappings are unmapped, once the
    device has finished any work of such a forwarder, and the mapping is tried again (as
    UCX's CUDA IPC cache does)."""
    device = runtime.getDevice()
    key = (device, handle)
    if key not in _mapped:
        try:
            address = runtime.ipcOpenMemHandle(handle)
        except Exception as refused:
            if "AlreadyMapped" not in str(refused) or not _unmap_stale(runtime, device, owner):
                raise
            address = runtime.ipcOpenMemHandle(handle)
        _mapped[key] = [address, 0, owner]
    _mapped[key][1] += 1
    return _mapped[key][0], key


def _unmap_stale(runtime, device, owner):
    """Unmap this device's mappings of ``owner``'s allocations that overlap its new one;
    return whether there were any."""
    process, start, end = owner
    stale = [
        key
        for key, (_, _, (their_process, their_start, their_end)) in _mapped.items()
        if key[0] == device and their_process == process and start < their_end and their_start < end
    ]
    if stale:
        runtime.deviceSynchronize()
    for key in stale:
        runtime.ipcCloseMemHandle(_mapped.pop(key)[0])
    return bool(stale)


def _close(runtime, key):
    """One user fewer of the mapping ``key``; unmap it when it was the last (or nothing, if
    it was unmapped as stale)."""
    entry = _mapped.get(key)
    if entry is None:
        return
    entry[1] -= 1
    if entry[1] == 0:
        del _mapped[key]
        runtime.ipcCloseMemHandle(entry[0])


class _Mapped:
    """A peer's device array, mapped into this process: what numba-cuda kernels take."""

    def __init__(self, address, like):
        self.__cuda_array_interface__ = {
            "data": (address, False),
            "shape": tuple(like.shape),
            "typestr": like.dtype.str,
            "version": 3,
        }


class IpcPeers:
    """The node peers' exported arrays, mapped here: ``sources[peer] = (array, ...)``.

    Args:
        comm: the forwarder's communicator; ``node`` (its ranks on this node) is derived.
        backend: the cuda backend (needs CuPy).
        arrays: this rank's device arrays to export, the same kinds on every rank.
        watch: the forwarder's ``Watch``, under whose deadline the barriers wait.
        what: the call a peer waits in while this rank reads, as a timeout names it.

    Raises:
        ConfigError: on every node rank, if any of them could not export or map.
    """

    def __init__(self, comm, node, backend, arrays, watch, what="forward() (node peers reading)"):
        from numba import cuda
        from numba.cuda.cudadrv.driver import device_extents

        self._cp = backend.cupy
        self._backend = backend
        self._node = node
        self._watch, self._what = watch, what
        self._opened = {}
        runtime = self._cp.cuda.runtime
        error = None
        try:
            exports = []
            for array in arrays:
                base, end = device_extents(array)
                address = array.__cuda_array_interface__["data"][0]
                owner = (PROCESS, base, end)
                exports.append((bytes(runtime.ipcGetMemHandle(base)), base, address - base, owner))
        except Exception as exc:
            exports, error = None, exc
        waiting = "Forwarder() (mapping node peers' memory over CUDA IPC)"
        everyone = allgather(node, exports, waiting, watch)
        ranks = allgather(node, comm.Get_rank(), waiting, watch)
        self.sources = {}
        if error is None and all(e is not None for e in everyone):
            try:
                for peer, theirs in zip(ranks, everyone):
                    if peer != comm.Get_rank():
                        self.sources[peer] = tuple(
                            cuda.as_cuda_array(_Mapped(self._map(peer, base, handle, owner) + offset, like))
                            for (handle, base, offset, owner), like in zip(theirs, arrays)
                        )
            except Exception as exc:
                error = exc
        failure = None if error is None else f"{type(error).__name__}: {error}"
        failures = allgather(node, failure, waiting, watch)
        if any(failures) or not all(e is not None for e in everyone):
            self._close_handles()
            reasons = "; ".join(f"node rank {r}: {f}" for r, f in enumerate(failures) if f) or "export failed"
            raise ConfigError(f"CUDA IPC between the ranks of this node failed ({reasons})")

    def _map(self, peer, base, handle, owner):
        """The address of the allocation at ``base`` in ``peer`` (``owner``: its process and
        the allocation's range), mapped once per forwarder."""
        if (peer, base) not in self._opened:
            self._opened[peer, base] = _open(self._cp.cuda.runtime, handle, owner)
        return self._opened[peer, base][0]

    def release(self):
        """Return once every node peer has finished reading this rank's exported arrays."""
        self._backend.synchronize()
        self._watch.collective("Barrier", what=self._what, comm=self._node)

    def _close_handles(self):
        self.sources = {}
        while self._opened:  # each entry leaves before its handle closes: a failure closes none twice
            _, (_, key) = self._opened.popitem()
            _close(self._cp.cuda.runtime, key)

    def close(self):
        """Unmap the peers' memory; collective over the node, so nothing is freed while mapped."""
        self.release()
        self._close_handles()
        self._watch.collective("Barrier", what="close()", comm=self._node)
