"""The ring of ``rafi.bench.resident`` as resident ``run()`` rounds on one rank, its persistent
grid forced to one block of 256 threads, for a profiler to sample the leading block's warps
(its other blocks would only wait). It wraps rafi's internals (the launcher's grid), so it is
a measurement script, not an API. On a GPU, without MPS:

    ncu --target-processes all -k regex:launcher --launch-skip 3 --launch-count 1 \\
        --metrics 'regex:smsp__pcsamp_warps_issue_stalled_.*,smsp__inst_executed.sum' --csv \\
        python bench/resident_ncu.py [1000]      # items (default 1)

Each ``run()`` is one launch of ``ROUNDS`` rounds (unless its time slice runs out first), so
that a launch's executed instructions over ``ROUNDS`` are a round's (all the block's warps).
"""

import sys

import numpy as np
from mpi4py import MPI

import rafi
from rafi._engines import _resident
from rafi.bench.resident import ITEM, onward, seed

_size_grid = _resident._Launcher._size_grid
ROUNDS = 100  # a launch's


def _one_block(launcher, args, sharing):
    _size_grid(launcher, args, sharing)  # compiles, as the launcher expects
    return (1, _resident._THREADS)


def main(items):
    _resident._Launcher._size_grid = _one_block
    with rafi.Forwarder(MPI.COMM_WORLD, ITEM, 2 * items, backend="cuda", mode="resident") as fwd:
        args = (fwd.rank, fwd.size, fwd.to_backend(np.zeros(1, np.int64)))
        fwd.launch(seed, items, fwd.outbox, fwd.rank, fwd.size, 0)
        for _ in range(6):
            fwd.run(onward, *args, rounds=ROUNDS, rounds_per_launch=ROUNDS)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
