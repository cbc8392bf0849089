"""Backends: where items live and kernels run. ``cpu`` (numba njit) and ``cuda`` (numba-cuda)."""

from .._config import BACKENDS, env_choice
from .._errors import ConfigError
from .._mpi_support import node_local

__all__ = ["PassedEvent", "choose_backend", "make_backend"]


class PassedEvent:
    """The event of a backend whose work is done when enqueued (cpu, the CUDA simulator)."""

    def record(self):
        pass

    def query(self):
        return True


def _cuda_usable():
    try:
        from numba import cuda
    except ImportError:
        return False
    try:
        return bool(cuda.is_available())
    except Exception:
        return False


def choose_backend(requested):
    """Resolve ``"auto"`` (and ``RAFI_BACKEND``) to ``"cuda"`` or ``"cpu"`` on this rank."""
    if requested not in BACKENDS:
        raise ConfigError(f"backend={requested!r} is not one of {', '.join(BACKENDS)}")
    name = env_choice("BACKEND", requested)
    if name == "auto":
        name = "cuda" if _cuda_usable() else "cpu"
    return name


def make_backend(name, comm, device=None):
    """Return the backend object called ``name`` (``"cpu"`` or ``"cuda"``); collective.

    Every rank takes part in finding its place on its node, whatever its backend, so ranks
    that chose different backends (a Reducer may) or fail to start one still all return."""
    local_rank = node_local(comm)[0]
    if name == "cpu":
        from ._cpu import CpuBackend

        return CpuBackend()
    from ._cuda import CudaBackend

    return CudaBackend(local_rank, device)
