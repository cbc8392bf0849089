"""What the MPI library can do: CUDA-awareness, the ranks of a node, the item datatype,
agreeing on a failure, and the Open MPI defaults rafi sets before MPI starts.

Which ranks share a node is decided in one place, ``node_comm``: the ranks of a
communicator that share memory (``COMM_TYPE_SHARED``), or, with ``RAFI_NODE_SIZE=k``, those
of them on the same emulated node of ``k`` consecutive ranks of ``MPI.COMM_WORLD`` (world
ranks ``0..k-1`` node 0, ``k..2k-1`` node 1, ...; a communicator's node is its ranks on that
node). Every transport, the backends' device choice, the exchange's one-node rule, the
reducer and ``python -m rafi`` ask it, so one machine can run a job whose ranks see some
peers on their node and others on "other nodes" (tests of the mixed paths).

Deadlines: the collectives here run under the ``Watch`` of the communicator they are given
when it is a rafi communicator (a forwarder's or a reducer's; ``_liveness.watch_of``), so a
rank that never arrives in a constructor is a ``CollectiveTimeout`` there, not a hang.
MPI has no nonblocking ``Comm_split_type``: ``node_comm`` agrees, under the deadline, that
every rank arrived before it calls the blocking one.
"""

import ctypes
import os

from ._errors import CollectiveTimeout, ConfigError, collective

__all__ = [
    "agree_on_failure",
    "allgather",
    "cuda_support",
    "item_datatype",
    "mpi_is_cuda_aware",
    "node_comm",
    "node_local",
    "quiet_open_mpi",
]


def _alloc_kinds(MPI):
    try:
        info = MPI.COMM_WORLD.Get_info()
        try:
            return info.Get("mpi_memory_alloc_kinds")
        finally:
            info.Free()
    except Exception:  # MPI before 4.1 has no such key, some builds refuse Get_info
        return None


def _extension_says_cuda(MPI):
    try:
        library = ctypes.CDLL(MPI.__file__)
        query = library.MPIX_Query_cuda_support
    except (OSError, AttributeError):
        return None
    query.restype = ctypes.c_int
    query.argtypes = []
    return bool(query())


def cuda_support():
    """Ask this process's MPI whether it takes CUDA device buffers (local, not collective).

    Asks the MPI 4.1 info key ``mpi_memory_alloc_kinds``, then the Open MPI / MPICH
    extension ``MPIX_Query_cuda_support``; when neither answers, the MPI is not CUDA-aware.

    Returns:
        ``(answer, how)``: the verdict, and which query gave it, with what it said.
    """
    from mpi4py import MPI

    kinds = _alloc_kinds(MPI)
    if kinds:
        answer = any(kind.strip().startswith("cuda") for kind in kinds.split(","))
        return answer, f"MPI info mpi_memory_alloc_kinds={kinds!r}"
    answer = _extension_says_cuda(MPI)
    if answer is not None:
        return answer, f"MPIX_Query_cuda_support() returned {int(answer)}"
    return False, "neither the MPI info key mpi_memory_alloc_kinds nor MPIX_Query_cuda_support answered"


def allgather(comm, value, what, watch=None):
    """Every rank's ``value`` (picklable), in rank order; collective over ``comm``. Under the
    deadline of ``watch``, else of ``comm``'s own watch when it is a rafi communicator (a
    part of the watched one, such as a node, needs ``watch`` given); else MPI's blocking call."""
    from ._liveness import watch_of

    watch = watch or watch_of(comm)
    if watch is None:
        return comm.allgather(value)
    return watch.allgather(value, what, comm=comm)


def mpi_is_cuda_aware(comm, watch=None):
    """Return True only when every rank's MPI says it takes CUDA device buffers (``cuda_support``)."""
    return all(allgather(comm, cuda_support()[0], "Forwarder() (asking MPI about device buffers)", watch))


def agree_on_failure(comm, build, what="a rafi constructor (agreeing that every rank succeeded)"):
    """Run ``build()`` on every rank; if it fails anywhere, raise on every rank, an error
    marked ``collective`` (every rank raises it at the same point). The agreement waits
    under ``comm``'s deadline where it is a rafi communicator (``allgather``)."""
    try:
        result, error = build(), None
    except CollectiveTimeout:  # the communicator is not used again: nothing to agree on
        raise
    except Exception as exc:  # re-raised below on this rank, reported on the others
        result, error = None, exc
    errors = allgather(comm, None if error is None else f"{type(error).__name__}: {error}", what)
    failed = [(r, e) for r, e in enumerate(errors) if e is not None]
    if not failed:
        return result
    if error is not None:
        raise collective(error)
    raise collective(ConfigError("; ".join(f"rank {r} failed: {e}" for r, e in failed)))


def _agreed_node_size(comm, watch):
    """``RAFI_NODE_SIZE`` as every rank of ``comm`` sees it (collective, under the deadline:
    it also tells that every rank arrived); a bad value on any rank, or values that differ,
    raise ``ConfigError`` on every rank together."""
    from ._config import env_node_size

    try:
        mine, error = env_node_size(), None
    except ConfigError as exc:
        mine, error = None, str(exc)
    said = allgather(comm, (mine, error), "a rafi constructor (finding the ranks of this node)", watch)
    errors = {e for _, e in said if e is not None}
    if len(errors) == 1 and all(e is not None for _, e in said):
        raise collective(ConfigError(errors.pop()))  # the same on every rank: say it once
    if errors:
        raise collective(ConfigError("; ".join(f"rank {r}: {e}" for r, (_, e) in enumerate(said) if e)))
    if len({k for k, _ in said}) > 1:
        seen = ", ".join(f"rank {r}: {'unset' if k is None else k}" for r, (k, _) in enumerate(said))
        raise collective(
            ConfigError(f"RAFI_NODE_SIZE differs between ranks ({seen}); set it alike on every rank")
        )
    return mine


def node_comm(comm, watch=None):
    """The ranks of ``comm`` on this rank's node, in ``comm``'s order (a new communicator;
    free it). Collective over ``comm``.

    The node is the ranks that share memory (``COMM_TYPE_SHARED``), narrowed by
    ``RAFI_NODE_SIZE=k`` to those on this rank's emulated node: world rank // k. The
    blocking split (MPI has no other) comes only after every rank arrived, agreed under
    the deadline of ``watch`` (default: ``comm``'s own, for a rafi communicator).

    Raises:
        ConfigError: on every rank together, if ``RAFI_NODE_SIZE`` is not a positive
            integer on some rank, or not the same on all.
        CollectiveTimeout: a rank did not arrive within the deadline.
    """
    from mpi4py import MPI

    k = _agreed_node_size(comm, watch)
    shared = comm.Split_type(MPI.COMM_TYPE_SHARED)
    if k is None:
        return shared
    try:
        return shared.Split(MPI.COMM_WORLD.Get_rank() // k, comm.Get_rank())
    finally:
        shared.Free()


def node_local(comm, watch=None):
    """Return ``(local_rank, local_size)`` among the ranks of ``comm`` on this node (``node_comm``)."""
    local = node_comm(comm, watch)
    try:
        return local.Get_rank(), local.Get_size()
    finally:
        local.Free()


def quiet_open_mpi(environ=None):
    """Set Open MPI defaults that keep a plain ``mpirun`` quiet; call before MPI starts.

    rafi's only MPI windows are shared memory on a node (``osc/sm``). Open MPI 5's
    ``osc/ucx`` component, asked about every new window, prints "OSC UCX component priority
    set inside component query failed" on every rank where UCX has no RDMA device (the pip
    wheel on a laptop, CI or a cloud VM). Unless the user chose ``OMPI_MCA_osc``, or the
    machine has an RDMA device (``/sys/class/infiniband``) where ``osc/ucx`` works and may
    serve the program's own windows, leave it out (``OMPI_MCA_osc=^ucx``). Open MPI reads
    it at ``MPI_Init`` (mpi4py's ``from mpi4py import MPI``): after that it changes nothing.
    """
    environ = os.environ if environ is None else environ
    if "OMPI_MCA_osc" in environ:
        return
    try:
        rdma = bool(os.listdir("/sys/class/infiniband"))
    except OSError:  # no such directory: no RDMA device, or not Linux
        rdma = False
    if not rdma:
        environ["OMPI_MCA_osc"] = "^ucx"


def item_datatype(itemsize):
    """Return a committed MPI datatype of ``itemsize`` contiguous bytes (free it when done)."""
    from mpi4py import MPI

    datatype = MPI.BYTE.Create_contiguous(itemsize)
    datatype.Commit()
    return datatype
