"""The device transport of resident rounds: every rank's inbox and mailbox, writable by every rank.

The persistent kernels of ``mode="resident"`` (kernels/resident.py) push items straight into
their receivers' inboxes and post counts and stamps into every rank's mailbox; they address
the memory of the ``k``-th rank of their node as ``boxes[k]`` and ``mail[k]`` (a tuple of
arrays, this rank's own included). Two transports make those tuples, with one lifecycle
(made collectively over the communicator, ``close`` collectively):

- ``ShmMailboxes``: memory every rank of the node maps (the cpu backend, and the CUDA
  simulator, whose "device" memory is host memory): one file in its shared-memory
  directory, unlinked once mapped;
- ``IpcMailboxes``: device memory of each rank, exported over CUDA IPC and mapped by every
  other rank (ranks sharing one GPU under MPS, or GPUs with peer access over NVLink).

The tuples hold the ranks of this rank's node (``members``, in ascending order); ranks on
other nodes are reached through the hosts (rafi/_engines/_proxy.py). A transport that
reaches across nodes (NVSHMEM's symmetric heap, GPU-initiated) would be a third.
"""

import mmap
import os
import tempfile
import uuid

import numpy as np

from .._errors import ConfigError
from .._mpi_support import allgather
from . import node_comm
from ._node_stores import node_stores

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


def _members(comm, node, watch):
    """The forwarder ranks on this node, in ascending order (the order of the tuples), and
    the node rank of each."""
    ranks = allgather(node, comm.Get_rank(), "Forwarder() (the node's ranks)", watch)
    order = sorted(range(len(ranks)), key=ranks.__getitem__)
    return [ranks[n] for n in order], order


class _NodeFile:
    """Memory every rank of the node maps: one file in its shared-memory directory (where MPI
    backs its windows, /dev/shm), unlinked as soon as every rank has mapped it, so nothing of
    it outlives the job; its memory lasts while any array over it does (a view of
    ``fwd.inbox`` kept past ``close()`` stays readable, where an MPI window's is unmapped).
    Collective over ``node``; ``segment(r)`` is node rank ``r``'s ``nbytes``."""

    def __init__(self, node, nbytes, watch):
        from ._shm import _RESIDENT_FIX, _RESIDENT_WHAT, _room, shm_free

        _room(node, nbytes, watch, _RESIDENT_FIX, _RESIDENT_WHAT)
        self._stride = (int(nbytes) + _ALIGN - 1) // _ALIGN * _ALIGN
        total = max(self._stride * node.Get_size(), 1)
        made = None
        if node.Get_rank() == 0:
            directory = (shm_free() or (tempfile.gettempdir(), 0))[0]
            _sweep(directory)
            name = f"{_PREFIX}{os.getpid()}-{uuid.uuid4().hex}"
            made = _attempt(lambda: _create(os.path.join(directory, name), total))
        try:
            path, error = allgather(node, made, "Forwarder() (making the node's memory)", watch)[0]
            mapped = _attempt(lambda: _map(path, total)) if error is None else (None, error)
            errors = allgather(node, mapped[1], "Forwarder() (mapping the node's memory)", watch)
        finally:  # every rank has mapped it, or failed to, or stopped answering: its name goes
            if made is not None and made[0] is not None:
                _unlink(made[0])
        failed = [f"node rank {r}: {e}" for r, e in enumerate(errors) if e]
        if failed:
            raise ConfigError(f"the node's shared memory for mode='resident' failed ({'; '.join(failed)})")
        self._map = mapped[0]

    def segment(self, node_rank):
        return np.frombuffer(self._map, np.uint8, self._stride, node_rank * self._stride)


_ALIGN = 64  # bytes: every array starts on a cache line


def _attempt(make):
    """``(make(), None)``, or ``(None, what failed)``: a failure on one rank, for all to hear."""
    try:
        return make(), None
    except Exception as error:
        return None, f"{type(error).__name__}: {error}"


_PREFIX = "rafi-"  # then the creating process's id, then a random name


def _unlink(path):
    from .._departure import forget_temporary

    forget_temporary(path)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _sweep(directory):
    """Remove what a killed job left: files of this module whose creating process is gone
    (a process killed between making the file and the unlink that follows every rank's
    mapping of it; mappings still held keep their memory)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        pid = name[len(_PREFIX) :].split("-", 1)[0]
        if name.startswith(_PREFIX) and pid.isdecimal() and not _alive(int(pid)):
            _unlink(os.path.join(directory, name))


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _create(path, nbytes):
    from .._departure import register_temporary

    register_temporary(path)  # removed should this process be ended before its unlink
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(descriptor, nbytes)
    finally:
        os.close(descriptor)
    return path


def _map(path, nbytes):
    descriptor = os.open(path, os.O_RDWR)
    try:
        return mmap.mmap(descriptor, nbytes)
    finally:
        os.close(descriptor)


class ShmMailboxes:
    """Inboxes and mailboxes in the node's shared memory (cpu backend, simulator).

    Args:
        comm: the forwarder's communicator (every rank on this node).
        backend: the forwarder's backend.
        item_dtype, capacity, word: the inbox's records, and the word they move as.
        mail_words: int64 words of one mailbox.
        watch: the forwarder's deadline, under which every collective here waits.
    """

    name = "shm"

    def __init__(self, comm, backend, item_dtype, capacity, word, mail_words, watch):
        self._watch = watch
        self._node = node_comm(comm)
        try:
            inbox = (capacity * item_dtype.itemsize + _ALIGN - 1) // _ALIGN * _ALIGN
            memory = _NodeFile(self._node, 2 * inbox + 8 * mail_words, watch)
            self.members, by_rank = _members(comm, self._node, watch)
            segments = [memory.segment(n) for n in by_rank]
            nbytes = capacity * item_dtype.itemsize
            slot = self.members.index(comm.Get_rank())
            self.stores = "cached"  # how the cpu backend's rounds write into the node's other inboxes
            if not backend.device_arrays:  # (the simulator's threads push as a GPU's do)
                self.stores = node_stores(self._node, [seg[:nbytes] for seg in segments], slot, watch)
        except BaseException:
            self._node.Free()
            raise
        self.boxes = tuple(seg[:nbytes].view(word) for seg in segments)
        self.stages = tuple(seg[inbox : inbox + nbytes].view(word) for seg in segments)
        self.mail = tuple(seg[2 * inbox : 2 * inbox + 8 * mail_words].view(np.int64) for seg in segments)
        items = memory.segment(self._node.Get_rank())[: capacity * item_dtype.itemsize].view(item_dtype)
        self.inbox = backend.in_place(items)
        self.sharing = 1  # ranks whose kernels share this rank's GPU
        self.first_on_gpu = True
        self._flags = self.mail[slot][-comm.Get_size() :]  # mail_len's tail

    def leave_flags(self):
        """The leaving flag of every rank of this node, in this rank's mailbox (0: not left)."""
        flags = self._flags.tolist()
        return [flags[r] for r in self.members]

    def close(self):
        """Let go of the node's memory (freed with the last array over it); collective."""
        self.boxes = self.stages = self.mail = self.inbox = None
        self._watch.collective("Barrier", what="close()", comm=self._node)
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
            self.members = _members(comm, self._node, watch)[0]
            if not node_gpus(self._node, backend, watch).reachable:
                raise ConfigError(
                    "mode='resident' on GPUs needs every rank's GPU to map every other's memory "
                    "(one GPU shared under MPS, or GPUs with peer access, and CuPy); use mode='bsp'"
                )
            made, error = _attempt(lambda: _device_boxes(backend, item_dtype, capacity, word, mail_words))
            errors = allgather(self._node, error, "Forwarder() (allocating the mailboxes)", watch)
            if any(errors):  # one rank's refusal, told to every rank before the mappings
                failed = "; ".join(f"node rank {r}: {e}" for r, e in enumerate(errors) if e)
                raise ConfigError(f"allocating mode='resident''s inboxes and mailboxes failed ({failed})")
            items, words, mail = made
            self._peers = IpcPeers(comm, self._node, backend, (words, mail), watch, what="close()")
        except BaseException:
            self._node.Free()
            raise
        me = comm.Get_rank()
        mapped = {**self._peers.sources, me: (words, mail)}
        self.boxes = tuple(mapped[r][0] for r in self.members)
        self.stages = self.boxes  # GPUs push into the inboxes; nothing is staged
        self.stores = "cached"
        self.mail = tuple(mapped[r][1] for r in self.members)
        self.inbox = items
        bus = backend.cupy.cuda.runtime.deviceGetPCIBusId(backend.device)
        buses = allgather(self._node, bus, "Forwarder() (the node's GPUs)", watch)
        mine = buses[self._node.Get_rank()]
        self.sharing = buses.count(mine)  # ranks on this rank's GPU
        self.first_on_gpu = buses.index(mine) == self._node.Get_rank()
        self._backend, self._size = backend, comm.Get_size()
        self._own = mail
        self._read = np.zeros(self._size, np.int64)

    def leave_flags(self):
        """The leaving flag of every rank of this node, in this rank's mailbox (0: not left)."""
        self._backend.to_host(self._own[-self._size :], self._read)
        flags = self._read.tolist()
        return [flags[r] for r in self.members]

    def close(self):
        """Unmap the peers' memory; collective over the node, so none is freed while mapped."""
        self.boxes = self.stages = self.mail = None
        self._peers.close()
        self._node.Free()


def _device_boxes(backend, item_dtype, capacity, word, mail_words):
    items = backend.zeros(capacity, item_dtype)
    return items, items.view(word), backend.zeros(mail_words, np.int64)


def make_mailboxes(comm, backend, item_dtype, capacity, word, mail_words, watch):
    """The mailboxes of this backend (``mailbox_transport``); collective over ``comm``."""
    if backend.device_arrays and not backend.simulator:
        return IpcMailboxes(comm, backend, item_dtype, capacity, word, mail_words, watch)
    return ShmMailboxes(comm, backend, item_dtype, capacity, word, mail_words, watch)
