"""What the MPI library can do: CUDA-awareness, node-local ranks, the item datatype, and
agreeing on a failure."""

import ctypes

from ._errors import ConfigError, collective

__all__ = ["agree_on_failure", "cuda_support", "mpi_is_cuda_aware", "node_local", "item_datatype"]


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


def mpi_is_cuda_aware(comm):
    """Return True only when every rank's MPI says it takes CUDA device buffers (``cuda_support``)."""
    from mpi4py import MPI

    return bool(comm.allreduce(int(cuda_support()[0]), op=MPI.MIN))


def agree_on_failure(comm, build):
    """Run ``build()`` on every rank; if it fails anywhere, raise on every rank, an error
    marked ``collective`` (every rank raises it at the same point)."""
    try:
        result, error = build(), None
    except Exception as exc:  # re-raised below on this rank, reported on the others
        result, error = None, exc
    errors = comm.allgather(None if error is None else f"{type(error).__name__}: {error}")
    failed = [(r, e) for r, e in enumerate(errors) if e is not None]
    if not failed:
        return result
    if error is not None:
        raise collective(error)
    raise collective(ConfigError("; ".join(f"rank {r} failed: {e}" for r, e in failed)))


def node_local(comm):
    """Return ``(local_rank, local_size)`` among the ranks of ``comm`` sharing this node."""
    from mpi4py import MPI

    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return local.Get_rank(), local.Get_size()
    finally:
        local.Free()


def item_datatype(itemsize):
    """Return a committed MPI datatype of ``itemsize`` contiguous bytes (free it when done)."""
    from mpi4py import MPI

    datatype = MPI.BYTE.Create_contiguous(itemsize)
    datatype.Commit()
    return datatype
