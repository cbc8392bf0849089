"""rafi: forward work items (rays, photons, particles) between MPI ranks from GPU kernels.

``import rafi`` imports neither CuPy nor numba-cuda and does not touch a GPU.
"""

from . import device
from ._arrays import asnumpy
from ._errors import CheckpointError
from ._errors import ConfigError
from ._errors import InvalidDestination
from ._errors import OutboxOverflow
from ._errors import RafiError
from ._forwarder import Forwarder
from ._kernel import Kernel
from ._kernel import kernel
from ._result import ForwardResult
from ._targets import func

__version__ = "0.1.0"

__all__ = [
    "CheckpointError",
    "ConfigError",
    "ForwardResult",
    "Forwarder",
    "InvalidDestination",
    "Kernel",
    "OutboxOverflow",
    "RafiError",
    "asnumpy",
    "device",
    "func",
    "kernel",
]
