"""Run a ``rafi.bench`` program, printing every resident launcher's grid as it is sized:
blocks a rank, the blocks that fit the GPU at once, registers and local memory a thread.
It wraps rafi's internals (the launcher's grid), so it is a measurement script, not an API.

    launch/local.sh 4 python bench/resident_grid.py workloads --backend cuda --program transport \
        --mode resident
"""

import importlib
import sys

from mpi4py import MPI

from rafi._engines import _resident

_size_grid = _resident._Launcher._size_grid


def _printing(launcher, args, sharing):
    grid = _size_grid(launcher, args, sharing)
    kernel = launcher._kernel
    compiled = kernel.overloads[tuple(kernel.typeof_pyval(a) for a in args)]
    print(
        f"rank {MPI.COMM_WORLD.Get_rank()}: grid {grid} ({sharing} ranks share the GPU), "
        f"{compiled.max_cooperative_grid_blocks(_resident._THREADS)} blocks fit, "
        f"{compiled.regs_per_thread} registers and {compiled.local_mem_per_thread} B local memory a thread",
        flush=True,
    )
    return grid


if __name__ == "__main__":
    _resident._Launcher._size_grid = _printing
    sys.exit(importlib.import_module("rafi.bench." + sys.argv[1]).main(sys.argv[2:]))
