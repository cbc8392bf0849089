"""Transports move partitioned payloads between ranks; ``choose_transport`` picks a safe one."""

from .._config import TRANSPORTS, env_choice
from .._errors import ConfigError
from .._mpi_support import mpi_is_cuda_aware
from ._base import Transport

__all__ = ["Transport", "choose_transport", "make_transport"]


def choose_transport(requested, backend, cuda_aware):
    """Resolve a transport name for ``backend``; never device pointers to a plain MPI.

    Args:
        requested: ``"auto"``, ``"host"`` or ``"cuda-aware"`` (``RAFI_TRANSPORT`` overrides auto).
        backend: the backend object (its ``device_arrays`` and ``simulator`` flags matter).
        cuda_aware: whether every rank's MPI takes CUDA device buffers.

    Raises:
        ConfigError: the name is unknown, or ``cuda-aware`` was asked for where it is unsafe.
    """
    if requested not in TRANSPORTS:
        raise ConfigError(f"transport={requested!r} is not one of {', '.join(TRANSPORTS)}")
    name = env_choice("TRANSPORT", requested)
    device_direct = backend.device_arrays and not backend.simulator
    if name == "auto":
        return "cuda-aware" if device_direct and cuda_aware else "host"
    if name == "cuda-aware":
        if not device_direct:
            raise ConfigError(
                f"transport='cuda-aware' needs the cuda backend on a GPU (backend is {backend.name!r}"
                f"{', simulated' if backend.simulator else ''}); use 'host'"
            )
        if not cuda_aware:
            raise ConfigError(
                "transport='cuda-aware' but this MPI is not CUDA-aware on every rank "
                "(handing it device buffers would crash); use 'host' or a CUDA-aware MPI"
            )
    return name


def make_transport(requested, comm, backend, item_dtype, capacity):
    """Build the transport chosen by ``choose_transport`` for this forwarder."""
    aware = mpi_is_cuda_aware(comm) if backend.device_arrays and not backend.simulator else False
    name = choose_transport(requested, backend, aware)
    if name == "cuda-aware":
        from ._cuda_aware import CudaAwareTransport

        return CudaAwareTransport(comm, backend, item_dtype, capacity)
    from ._host import HostTransport

    return HostTransport(comm, backend, item_dtype, capacity)
