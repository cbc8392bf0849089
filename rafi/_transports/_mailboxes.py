"""The device transport of resident rounds: every rank's inbox and mailbox, writable by every rank.

The persistent kernels of ``mode="resident"`` (kernels/resident.py) push items straight into
their receivers' inboxes and post counts and stamps into every rank's mailbox; they address
peer ``r``'s memory as ``boxes[r]`` and ``mail[r]`` (a tuple of arrays, this rank's own
included). Two transports make those tuples, with one lifecycle (made collectively over the
communicator, ``close`` collectively):

- ``ShmMailboxes``: one MPI shared-memory window of the node (the cpu backend, and the CUDA
  simulator, whose "device" memory is host memory);
- ``IpcMailboxes``: device memory of each rank, exported over CUDA IPC and mapped by every
  other rank (ranks sharing one GPU under MPS, or GPUs with peer access over NVLink).

A transport that reaches across nodes (NVSHMEM's symmetric heap, GPU-initiated) would be a
third, giving the same tuples. Every rank of the communicator must be on one node.
"""

import numpy as np

from .._errors import ConfigError
from . import node_comm

__all__ = ["IpcMailboxes", "ShmMailboxes", "make_mailboxes", "mailbox_transport"]


def mailbox_transport(requested, backend):
    """The transport resident rounds use on ``backend``: ``shm`` (cpu backend, simulator) or
    ``ipc`` (a GPU); ``requested`` must be ``auto`` or that name."""
    name = "ipc" if backend.device_arrays and not backend.simulator else "shm"
    if requested not in ("auto", name):
        raise ConfigError(
            f"transport={requested!r} is not for mode='resident' on the {backend.name} backend"
            f"{' (simulated)' if backend.simulator else ''}: its rounds write through {name!r} "
            "(transport='auto' takes it); bsp and async offer the other transports"
        )
    return name


def _one_node(comm, node):
    from mpi4py import MPI

    sizes = comm.allreduce(node.Get_size(), op=MPI.MIN)
    if sizes != comm.Get_size():
        raise ConfigError(
            f"mode='resident' runs its rounds on one node, but these {comm.Get_size()} ranks span "
            f"several (a node holds as few as {sizes} of them); across nodes use mode='bsp' or 'async'"
        )


class ShmMailboxes:
    """Inboxes and mailboxes in one shared-memory window of the node (cpu backend, simulator).

    Args:
        comm: the forwarder's communicator (every rank on this node).
        backend: the forwarder's backend.
        item_dtype, capacity, word: the inbox's records, and the word they move as.
        mail_words: int64 words of one mailbox.
        watch: the forwarder's deadline, under which ``close``'s barrier waits.
    """

    name = "shm"

    def __init__(self, comm, backend, item_dtype, capacity, word, mail_words, watch):
        from ._shm import ShmArena

        self._watch = watch
        self._node = node_comm(comm)
        try:
            _one_node(comm, self._node)
            sizes = [(capacity, item_dtype), (mail_words, np.int64)]
            self._arena = ShmArena(self._node, ShmArena.size_of(sizes))
        except BaseException:
            self._node.Free()
            raise
        arena = self._arena
        items = arena.zeros(capacity, item_dtype)
        mail = arena.zeros(mail_words, np.int64)
        ranks = self._node.allgather(comm.Get_rank())  # node rank -> forwarder rank
        by_rank = sorted(range(len(ranks)), key=ranks.__getitem__)
        words = items.view(word)
        self.boxes = tuple(arena.peer_view(n, words) for n in by_rank)
        self.mail = tuple(arena.peer_view(n, mail) for n in by_rank)
        self.inbox = backend.in_place(items)
        self.sharing = 1  # ranks whose kernels share this rank's GPU
        self.first_on_gpu = True

    def close(self):
        """Free the window; collective over the node."""
        self.boxes = self.mail = self.inbox = None
        self._watch.collective("Barrier", what="close()", comm=self._node)
        self._arena.free()
        self._node.Free()


class IpcMailboxes:
    """Inboxes and mailboxes in each rank's device memory, mapped by every other rank (CUDA IPC).

    Arguments as ``ShmMailboxes``'s; ``watch``: the forwarder's deadline, under which the
    node's barriers of ``close`` wait.
    """

    name = "ipc"

    def __init__(self, comm, backend, item_dtype, capacity, word, mail_words, watch):
        from ._ipc import IpcPeers
        from ._topology import node_gpus

        self._node = node_comm(comm)
        self._peers = None
        try:
            _one_node(comm, self._node)
            if not node_gpus(self._node, backend).reachable:
                raise ConfigError(
                    "mode='resident' on GPUs needs every rank's GPU to map every other's memory "
                    "(one GPU shared under MPS, or GPUs with peer access, and CuPy); use mode='bsp'"
                )
            items = backend.zeros(capacity, item_dtype)
            mail = backend.zeros(mail_words, np.int64)
            words = items.view(word)
            self._peers = IpcPeers(comm, self._node, backend, (words, mail), watch, what="close()")
        except BaseException:
            self._node.Free()
            raise
        me = comm.Get_rank()
        mapped = {**self._peers.sources, me: (words, mail)}
        self.boxes = tuple(mapped[r][0] for r in range(comm.Get_size()))
        self.mail = tuple(mapped[r][1] for r in range(comm.Get_size()))
        self.inbox = items
        buses = self._node.allgather(backend.cupy.cuda.runtime.deviceGetPCIBusId(backend.device))
        mine = buses[self._node.Get_rank()]
        self.sharing = buses.count(mine)  # ranks on this rank's GPU
        self.first_on_gpu = buses.index(mine) == self._node.Get_rank()

    def close(self):
        """Unmap the peers' memory; collective over the node, so none is freed while mapped."""
        self.boxes = self.mail = None
        self._peers.close()
        self._node.Free()


def make_mailboxes(comm, backend, item_dtype, capacity, word, mail_words, watch):
    """The mailboxes of this backend (``mailbox_transport``); collective over ``comm``."""
    if backend.device_arrays and not backend.simulator:
        return IpcMailboxes(comm, backend, item_dtype, capacity, word, mail_words, watch)
    return ShmMailboxes(comm, backend, item_dtype, capacity, word, mail_words, watch)
