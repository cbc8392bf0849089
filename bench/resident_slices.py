"""Resident ``run()`` in slices of rounds, every launch logged: for the GPU case where
``run(rounds=2)`` once ended at round 3 (an H100 under MPS, 4 ranks; green at 2 ranks, on
the cpu backend and under the simulator). It repeats what
``tests/test_resident_mpi.py::test_run_in_slices_of_rounds`` does and, when a slice ends
at another round on any rank, prints every rank's launches: the arguments the host gave
(rounds, first round) and what each launch reported (status, records, round, alive, epoch,
phase) beside the leader's words it left in ``ctl`` (pause, rounds left, round). It wraps
rafi's internals (the engine's report and arguments), so it is a diagnosis script, not an API.

    launch/local.sh 4 python bench/resident_slices.py 3 cuda     # trials, backend
"""

import sys

import numpy as np
from mpi4py import MPI

sys.path.insert(0, "tests")
import rafi  # noqa: E402
from rafi._engines import _resident  # noqa: E402
from rafi.kernels import resident as kern  # noqa: E402
from test_resident_mpi import Item, bounce, seeds  # noqa: E402
from traffic import to_backend  # noqa: E402

LOG = []
_consume = _resident.ResidentEngine._consume
_arguments = _resident.ResidentEngine._arguments


def _host(array):
    return array.copy_to_host() if hasattr(array, "copy_to_host") else np.asarray(array)


def consume(engine, wall, stepping):
    r, ctl = engine._report[: kern.R_MISSING].tolist(), _host(engine._ctl)
    status = _consume(engine, wall, stepping)
    LOG.append(
        f"  launch {engine._launches}: status {r[0]} records {r[1]} round {r[2]} alive {r[4]} "
        f"epoch {r[6]} phase {r[7]} | ctl pause {ctl[kern.C_PAUSE]} left {ctl[kern.C_ROUNDS_LEFT]} "
        f"round {ctl[kern.C_ROUND]}"
    )
    return status


def arguments(engine, launch, rounds, stepping, args):
    LOG.append(f"  launch {launch}: rounds {rounds} stepping {stepping} first round {engine._fwd._round}")
    return _arguments(engine, launch, rounds, stepping, args)


def sliced(comm, backend, per_launch, n=50, hops=7):
    """``run(rounds=2)`` then ``run()`` to the end; return the first slice's result."""
    size = comm.Get_size()
    with rafi.Forwarder(comm, Item, 4 * n * size, backend=backend, mode="resident") as fwd:
        done = to_backend(backend, np.zeros(3, np.int64))
        fwd.send(*seeds(fwd.rank, size, n))
        first = fwd.run(bounce, size, hops, done, rounds=2, rounds_per_launch=per_launch)
        LOG.append(f" run(rounds=2) returned {first}")
        fwd.run(bounce, size, hops, done, rounds_per_launch=per_launch)
    return first


def main():
    _resident.ResidentEngine._consume = consume
    _resident.ResidentEngine._arguments = arguments
    comm = MPI.COMM_WORLD
    trials, backend, wrong = int(sys.argv[1]), sys.argv[2], 0
    for trial in range(trials):
        for per_launch in (1, 3, None):
            LOG.clear()
            first = sliced(comm, backend, per_launch)
            if not comm.allreduce(int(first.round != 1 or first.alive <= 0)):
                continue
            wrong += 1
            logs = comm.gather("\n".join(LOG))
            for rank, text in enumerate(logs or ()):
                print(f"trial {trial}, rounds per launch {per_launch}, rank {rank}:\n{text}", flush=True)
    if comm.Get_rank() == 0:
        print(f"{comm.Get_size()} ranks, {trials} trials x 3 slicings: {wrong} ended at another round")


if __name__ == "__main__":
    main()
