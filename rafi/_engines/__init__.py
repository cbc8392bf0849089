"""Engines: how a forwarder moves its items, one module per mode behind one interface.

``Forwarder`` (rafi/_forwarder.py) is the public face: it agrees on the settings, owns the
outbox and the inbox, and hands ``forward()``, ``batches()`` and ``run()`` to the engine of
its mode (mpi4py's futures split the same way: ``_core.py`` the engine, ``pool.py`` the face):

- ``bsp`` (``_bsp``): rounds driven by the host, their counts and payloads over MPI, CUDA
  IPC or shared memory;
- ``async`` (``_async``): no rounds; items flow while kernels run;
- ``resident`` (``_resident``): rounds run on the device, in persistent kernels that signal
  each other through node-shared memory, with no host code between rounds.
"""

from ._base import Engine

__all__ = ["Engine", "MODES", "make_engine"]

MODES = ("bsp", "async", "resident")


def make_engine(fwd, mode, transport, progress, exchange):
    """The engine of ``mode`` for the forwarder ``fwd`` (collective over its communicator)."""
    if mode == "bsp":
        from ._bsp import BspEngine

        return BspEngine(fwd, transport, exchange)
    if mode == "async":
        from ._async import AsyncEngine

        return AsyncEngine(fwd, transport, progress)
    from ._resident import ResidentEngine

    return ResidentEngine(fwd, transport)
