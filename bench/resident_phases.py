"""Where a resident round's time goes, for the ring of ``rafi.bench.resident`` (1 item in
the whole job, then 1000 a rank): each round's phases from the rounds' own records (count
and post, wait and agree, deliver, stamps, then step and loop until the next round), the
host's time per launch of the persistent kernel (the launch call, its wait, the whole
call) and the rounds a launch runs, for ``run()``, ``run()`` at one round a launch, and
``forward()`` with a step launch. It wraps rafi's internals (the engine's report and
launch), so it is a measurement script, not an API.

    launch/local.sh 2 python bench/resident_phases.py cuda      # or cpu
"""

import sys
import time

import numpy as np
from mpi4py import MPI

import rafi
from rafi._engines import _resident
from rafi.bench.resident import ITEM, onward, seed
from rafi.kernels import resident as kern

COMM = MPI.COMM_WORLD
LAUNCHES = []  # (host seconds, the launch's records' times T0 .. END in ns)
HOST = {"call": [], "wait": [], "launch": []}  # seconds of each part of each launch


def _timed(part, function):
    def timed(*args, **kwargs):
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            HOST[part].append(time.perf_counter() - started)

    return timed


def _recording(consume):
    def recorded(engine, wall, stepping):
        status = consume(engine, wall, stepping)
        count = int(engine._report[kern.R_RECORDS])
        if count and status != kern.RUNNING:
            records = engine._rows[:count]  # the report's records, a row per round
            LAUNCHES.append((wall, records[:, kern.REC_T0 : kern.REC_END + 1].copy()))
        return status

    return recorded


def report(label):
    """Rank 0 prints the medians of what the launches since the last report recorded (None:
    forgets them)."""
    if label is not None and COMM.Get_rank() == 0 and LAUNCHES:
        times = np.concatenate([records for _, records in LAUNCHES])
        phases = np.median(np.diff(times, axis=1), axis=0) * 1e-3
        gaps = [(r[1:, 0] - r[:-1, -1]) * 1e-3 for _, r in LAUNCHES if len(r) > 1]
        step = np.median(np.concatenate(gaps)) if gaps else 0.0
        per_launch = np.median([len(records) for _, records in LAUNCHES])
        print(
            f"{label}: us a round: count+post {phases[0]:.1f}, wait+agree {phases[1]:.1f}, deliver "
            f"{phases[2]:.1f}, stamps {phases[3]:.1f}, step+loop {step:.1f}; {per_launch:.0f} rounds a "
            f"launch; host us a launch: call {_us(HOST['call'])}, wait {_us(HOST['wait'])}, whole "
            f"{_us(HOST['launch'])}",
            flush=True,
        )
    LAUNCHES.clear()
    for seconds in HOST.values():
        seconds.clear()


def _us(seconds):
    """The median of ``seconds`` in microseconds, or "-" (the cpu backend's ``forward()`` calls
    its kernel's entry point directly, past ``_Launcher``)."""
    return f"{np.median(seconds) * 1e6:.1f}" if seconds else "-"


def timed_rounds(label, rounds, do):
    COMM.Barrier()
    report(None)  # what came before (warm-up) is not counted
    started = time.perf_counter()
    do()
    seconds = COMM.bcast(time.perf_counter() - started)
    if COMM.Get_rank() == 0:
        print(f"{label}: {seconds / rounds * 1e6:.1f} us a round", flush=True)
    report(label)


def main(backend):
    _resident.ResidentEngine._consume = _recording(_resident.ResidentEngine._consume)
    _resident.ResidentEngine._launch = _timed("launch", _resident.ResidentEngine._launch)
    _resident._Launcher.__call__ = _timed("call", _resident._Launcher.__call__)
    for per_rank, label in ((0, "1 item"), (1000, "1000 items")):
        with rafi.Forwarder(COMM, ITEM, max(per_rank, 1) * 2, backend=backend, mode="resident") as fwd:
            fwd._backend.synchronize = _timed("wait", fwd._backend.synchronize)
            args = (fwd.rank, fwd.size, fwd.to_backend(np.zeros(1, np.int64)))
            seeded = per_rank or int(fwd.rank == 0)
            fwd.launch(seed, seeded, fwd.outbox, fwd.rank, fwd.size, 0)

            def forwards(count):
                for _ in range(count):
                    result = fwd.forward()
                    fwd.launch(onward, result.received, fwd.inbox, fwd.outbox, *args)

            fwd.run(onward, *args, rounds=50)  # warm-up: compiles, settles the launch model
            forwards(5)
            timed_rounds(f"{label}, run()", 512, lambda: fwd.run(onward, *args, rounds=512))
            one = lambda: fwd.run(onward, *args, rounds=512, rounds_per_launch=1)  # noqa: E731
            timed_rounds(f"{label}, run() one round a launch", 512, one)
            timed_rounds(f"{label}, forward() + step", 200, lambda: forwards(200))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "auto")
