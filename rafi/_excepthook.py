"""One rank's uncaught exception ends the whole MPI job, instead of hanging it.

Without this, a rank that dies of an exception prints its traceback and then waits in
``MPI_Finalize`` (or has already left), while the others wait forever in their next
collective. ``import rafi`` chains a hook to ``sys.excepthook``: it prints the traceback as
before, then calls ``MPI_Abort`` on ``COMM_WORLD`` when MPI is running with more than one
rank, so ``mpirun`` or ``srun`` ends every rank at once with a non-zero status (what
``python -m mpi4py`` does, for scripts run as plain ``python script.py``).
``RAFI_ABORT_ON_EXCEPTION=0`` turns it off.
"""

import os
import sys

__all__ = ["install"]


def install():
    """Chain rafi's hook to ``sys.excepthook`` (once)."""
    previous = sys.excepthook
    if getattr(previous, "rafi", False):
        return

    def hook(kind, value, traceback):
        previous(kind, value, traceback)
        _abort_job()

    hook.rafi = True
    sys.excepthook = hook


def _abort_job():
    if os.environ.get("RAFI_ABORT_ON_EXCEPTION", "1") == "0":
        return
    MPI = sys.modules.get("mpi4py.MPI")
    if MPI is None or not MPI.Is_initialized() or MPI.Is_finalized():
        return
    world = MPI.COMM_WORLD
    if world.Get_size() < 2:
        return
    sys.stdout.flush()
    sys.stderr.write(
        f"rafi: rank {world.Get_rank()} of {world.Get_size()} ends the MPI job: uncaught exception above "
        "(RAFI_ABORT_ON_EXCEPTION=0 leaves the other ranks running)\n"
    )
    sys.stderr.flush()
    world.Abort(1)
