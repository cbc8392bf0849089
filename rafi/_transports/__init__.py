"""How payloads travel: ``choose_links`` picks, per peer class, a transport that is safe here.

Peers on this rank's node (``node_comm``: ``COMM_TYPE_SHARED``, narrowed by ``RAFI_NODE_SIZE``)
are reached over CUDA IPC when every GPU of the node can map the others' memory, or, on
the cpu backend in rounds, through an MPI shared-memory window (``shm``); other peers over
a transport that moves packed segments: ``cuda-aware`` (device buffers straight to MPI)
only when the MPI says it takes them, else ``host`` (staged through pinned host memory).
A device pointer is never handed
to an MPI that is not CUDA-aware. ``nccl`` (every peer over NCCL) is taken only when asked
for, and only where every rank has a GPU of its own.
"""

import collections

from .._config import TRANSPORTS, env_choice
from .._errors import ConfigError
from .._mpi_support import allgather, mpi_is_cuda_aware, node_comm  # node_comm: which ranks share a node
from ._base import Transport

__all__ = [
    "ASYNC_TRANSPORTS",
    "LinkFacts",
    "Links",
    "Transport",
    "choose_links",
    "link_facts",
    "link_name",
    "node_comm",
]

ASYNC_TRANSPORTS = ("auto", "host", "ipc")  # what mode="async" channels can use
_WHAT = "Forwarder() (choosing its transport)"  # where a rank waits here, as a timeout says it

LinkFacts = collections.namedtuple("LinkFacts", ["cuda_aware", "ipc_ok", "nccl_ok"])
LinkFacts.__doc__ = """What ``choose_links`` needs to know besides the request and the backend."""


def choose_links(requested, backend, cuda_aware, ipc_ok, nccl_ok=False, rounds=True):
    """Resolve a transport request to ``(node, remote)``: names for same-node and other peers.

    Args:
        requested: ``"auto"``, ``"host"``, ``"cuda-aware"``, ``"ipc"``, ``"shm"`` or ``"nccl"``
            (``RAFI_TRANSPORT`` overrides auto).
        backend: the backend object (its ``device_arrays`` and ``simulator`` flags matter).
        cuda_aware: whether every rank's MPI takes CUDA device buffers.
        ipc_ok: whether the GPUs of this node can map each other's memory (CuPy present).
        nccl_ok: whether every rank has a GPU of its own and CuPy has NCCL. ``auto`` does
            not pick NCCL yet: it has not run on a machine with several GPUs.
        rounds: a round-based forwarder (``shm`` serves rounds only).

    Raises:
        ConfigError: the name is unknown, or names a transport that is unsafe here.
    """
    if requested not in TRANSPORTS:
        raise ConfigError(f"transport={requested!r} is not one of {', '.join(TRANSPORTS)}")
    name = env_choice("TRANSPORT", requested)
    device_direct = backend.device_arrays and not backend.simulator
    if name in ("cuda-aware", "ipc", "nccl") and not device_direct:
        raise ConfigError(
            f"transport={name!r} needs the cuda backend on a GPU (backend is {backend.name!r}"
            f"{', simulated' if backend.simulator else ''}); use 'host'"
        )
    if name == "cuda-aware" and not cuda_aware:
        raise ConfigError(
            "transport='cuda-aware' but this MPI is not CUDA-aware on every rank "
            "(handing it device buffers would crash); use 'host', 'ipc' or a CUDA-aware MPI"
        )
    if name == "ipc" and not ipc_ok:
        raise ConfigError(
            "transport='ipc' but the GPUs of this node cannot map each other's memory "
            "(CuPy missing, a GPU not visible to every rank, or no peer access); use 'host'"
        )
    if name == "shm" and (backend.name != "cpu" or not rounds):
        raise ConfigError(
            f"transport='shm' is for the cpu backend in mode='bsp' (backend is {backend.name!r}"
            f"{'' if rounds else ', mode async'}); use 'auto'"
        )
    if name == "nccl" and not nccl_ok:
        raise ConfigError(
            "transport='nccl' needs a GPU of its own for every rank (NCCL refuses two ranks on "
            "one GPU) and CuPy built with NCCL; use 'ipc' or 'host'"
        )
    remote = "cuda-aware" if device_direct and cuda_aware else "host"
    if name in ("host", "cuda-aware", "nccl"):
        return name, name
    if name == "ipc" or ipc_ok:
        return "ipc", remote
    if name == "shm" or (backend.name == "cpu" and rounds):
        return "shm", remote
    return remote, remote


def link_facts(comm, node, backend, explicit, rounds=True, watch=None):
    """Collective over ``comm``: the ``LinkFacts`` of this rank, agreed where they must be.

    Args:
        node: ``node_comm(comm)``.
        backend: the backend object (or anything with its ``name``, ``device_arrays``,
            ``simulator``, ``cupy`` and ``device``).
        explicit: ``ipc`` or ``shm`` was asked for by name: IPC must then work on every node,
            where ``auto`` takes it node by node.
        rounds: a round-based forwarder (only rounds ask the MPI about device buffers).
        watch: the forwarder's ``Watch``: every wait here is under its deadline.
    """
    from ._nccl import nccl_available
    from ._topology import node_gpus

    device_direct = backend.device_arrays and not backend.simulator
    aware = mpi_is_cuda_aware(comm, watch) if device_direct and rounds else False
    gpus = node_gpus(node, backend, watch)
    here = gpus.reachable
    said = allgather(comm, (here, gpus.own and nccl_available(backend)), _WHAT, watch)
    everywhere = all(h for h, _ in said)
    nccl_ok = rounds and all(n for _, n in said)
    return LinkFacts(aware, everywhere if explicit else here, nccl_ok)


def link_name(node, remote, node_size, size):
    """What ``fwd.transport`` says: one name, or ``node+remote`` when both peer classes exist."""
    if node == remote or node_size == 1:
        return remote
    if node_size == size:
        return node
    return f"{node}+{remote}"


class Links:
    """This rank's ways to its peers: IPC or shared memory to node peers, MPI to the rest.

    Made in two steps, both collective over ``comm``: the constructor chooses (and, for
    ``shm``, makes the node's shared window, for arrays of the ``shared`` ``(count, dtype)``);
    the forwarder then
    allocates the arrays node peers read (or write) with ``zeros`` and passes them to
    ``connect``, which maps the peers' ones. After that, ``peers`` is the mapped node peers
    (``IpcPeers``, ``ShmPeers`` or None), ``bulk`` the transport of packed segments (MPI or
    NCCL; None when no rank of ``comm`` sends any), ``pack`` whether this rank's partition
    must pack records for it, ``name`` what ``fwd.transport`` says. With ``rounds=False``
    (the asynchronous engine) there is no bulk transport: its channels reach node peers over
    IPC where ``peers`` is set, the others through host memory.
    """

    def __init__(self, comm, backend, item_dtype, capacity, requested, rounds=True, watch=None, shared=()):
        from ._shm import ShmArena

        self._comm, self._backend, self._watch = comm, backend, watch
        self._item_dtype, self._capacity, self._rounds = item_dtype, capacity, rounds
        self._node = self._arena = None
        self.peers = self.bulk = None
        if not rounds and requested not in ASYNC_TRANSPORTS:
            raise ConfigError(
                f"transport={requested!r} is for mode='bsp'; mode='async' moves items over IPC "
                "on a node and through host memory otherwise (transport='ipc', 'host' or 'auto')"
            )
        self._node = node_comm(comm, watch)
        try:
            wanted = env_choice("TRANSPORT", requested)
            if not rounds and wanted not in ASYNC_TRANSPORTS:
                raise ConfigError(f"RAFI_TRANSPORT={wanted} is for mode='bsp' (mode='async' is running)")
            self._explicit = wanted in ("ipc", "shm")
            facts = link_facts(comm, self._node, backend, self._explicit, rounds, watch)
            self._kind, self._remote = choose_links(requested, backend, *facts, rounds)
            if self._kind == "shm" and self._node.Get_size() > 1:
                fix = "pass a smaller capacity, or transport='host'"
                what = f"the shared-memory window of the outboxes (capacity {capacity})"
                self._arena = ShmArena(self._node, ShmArena.size_of(shared), watch, fix, what)
        except BaseException:
            self.close()
            raise

    def zeros(self, count, dtype):
        """A zeroed array node peers can map: in the shared window for ``shm``, else the backend's."""
        if self._arena is not None:
            return self._arena.zeros(count, dtype)
        return self._backend.zeros(count, dtype)

    def connect(self, exported):
        """Map the node peers' ``exported`` arrays (this rank's own, made by ``zeros``)."""
        from ._ipc import IpcPeers
        from ._shm import ShmPeers

        comm, node = self._comm, self._node
        try:
            failed = None
            if self._arena is not None:
                self.peers = ShmPeers(comm, node, self._arena, exported, self._watch)
            elif self._kind == "ipc" and node.Get_size() > 1:
                try:
                    self.peers = IpcPeers(comm, node, self._backend, exported, self._watch)
                except ConfigError as exc:  # under auto, this node's ranks fall back together
                    failed = exc
            if self._explicit and any(allgather(comm, failed is not None, _WHAT, self._watch)):
                raise failed or ConfigError("transport='ipc' failed on another node")
            size, node_size = comm.Get_size(), node.Get_size()
            self.node_peers = frozenset(self.peers.sources) if self.peers else frozenset()
            self.pack = self._rounds and len(self.node_peers) < size - 1
            if any(allgather(comm, self.pack, _WHAT, self._watch)):
                self.bulk = _bulk_transport(
                    self._remote, comm, self._backend, self._item_dtype, self._capacity, self._watch
                )
            kind = self._kind if self.peers else self._remote
            self.name = link_name(kind, self._remote, node_size, size)
        except BaseException:
            self.close()
            raise

    def release(self):
        """End a round: wait until no node peer reads this rank's outbox any more."""
        if self.peers is not None:
            self.peers.release()

    def close(self):
        """Free what was made; collective over the node. After a timeout (the forwarder's
        ``Watch`` broken) it is local and frees nothing: a peer may never come to free it."""
        if self._watch is not None and self._watch.broken is not None:
            from .._liveness import KEPT

            KEPT.append(dict(self.__dict__))
            self.peers = self._arena = self.bulk = self._node = None
            return
        if self.peers is not None:
            self.peers.close()
            self.peers = None
        elif self._arena is not None:
            self._arena.free()
        self._arena = None
        if self.bulk is not None:
            self.bulk.close()
            self.bulk = None
        if self._node is not None:
            self._node.Free()
            self._node = None


def _bulk_transport(name, comm, backend, item_dtype, capacity, watch):
    if name == "nccl":
        from ._nccl import NcclTransport

        return NcclTransport(comm, backend, item_dtype, capacity, watch)
    if name == "cuda-aware":
        from ._cuda_aware import CudaAwareTransport

        return CudaAwareTransport(comm, backend, item_dtype, capacity, watch)
    from ._host import HostTransport

    return HostTransport(comm, backend, item_dtype, capacity, watch)
