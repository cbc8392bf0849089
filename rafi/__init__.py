"""rafi: forward work items (rays, photons, particles) between MPI ranks from GPU kernels.

``import rafi`` imports neither CuPy nor numba-cuda and does not touch a GPU.
"""

import os as _os

from . import _mpi_support

_mpi_support.quiet_open_mpi()  # before MPI starts: Open MPI reads its settings at MPI_Init
# Numba colours its compiler's messages through colorama where that is installed, and
# colorama's exit hook then writes a colour reset into every rank's stdout: plain messages,
# unless the user chose (numba reads this when first imported).
_os.environ.setdefault("NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING", "1")

# A source checkout keeps the device code in ../kernels (installed as rafi.kernels by
# setup.cfg's package_dir); let `import rafi.kernels` find it there too, uninstalled.
_checkout_kernels = _os.path.join(_os.path.dirname(__path__[0]), "kernels", "outbox.py")
if not _os.path.isdir(_os.path.join(__path__[0], "kernels")) and _os.path.exists(_checkout_kernels):
    __path__.append(_os.path.dirname(__path__[0]))

from . import _excepthook, device
from ._arrays import asnumpy
from ._errors import (
    CheckpointError,
    CollectiveTimeout,
    ConfigError,
    InvalidDestination,
    OutboxOverflow,
    RafiError,
)
from ._forwarder import Forwarder
from ._kernel import Kernel, kernel
from ._kernel_cache import compile_seconds, serialize_compiles
from ._reducer import Reducer
from ._result import ForwardResult
from ._targets import func

__version__ = "0.1.0"

_excepthook.install()
compile_seconds()  # starts counting numba's compilations
serialize_compiles()  # one process per cache entry compiles it; the others load it

__all__ = [
    "CheckpointError",
    "CollectiveTimeout",
    "ConfigError",
    "ForwardResult",
    "Forwarder",
    "InvalidDestination",
    "Kernel",
    "OutboxOverflow",
    "RafiError",
    "Reducer",
    "asnumpy",
    "compile_seconds",
    "device",
    "func",
    "kernel",
]
