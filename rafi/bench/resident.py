"""Resident rounds beside bsp's, in one run: what a small round costs, and a large one's bandwidth.

    mpirun -n 4 python -m rafi.bench.resident --backend cuda --rounds 2000

Every case circulates 64-byte items around the ranks' ring: each round, every item moves
to the next rank, where ``step`` pushes it on (``device.emit``). Timed per round, from
rank 0's clock over ``--rounds`` back-to-back rounds after a warm-up (so the slowest rank
sets the pace), each way a program can run them:

- ``resident run``: ``fwd.run(step, rounds=R)`` with ``mode="resident"`` (``K`` rounds per
  persistent launch, chosen by the model, or ``--rounds-per-launch``);
- ``resident forward``: ``mode="resident"``, one ``forward()`` and one ``fwd.launch(step)``
  per round (one launch and one wait per round, no MPI);
- ``bsp run``: ``fwd.run(step, rounds=R)`` with ``mode="bsp"`` (the loop users write by hand);
- ``raw exchange`` (cpu backend, ranks on one node): the same bytes written into the next
  rank's buffer in node-shared memory and read there, flagged, with nothing of rafi
  (``rafi.bench.node_floor``): the least any round of ``N items`` can cost on the machine.

Cases: ``1 item`` (one item in the whole job: the cost of signalling), ``N items`` per rank
(``--items``, 1000 by default), and ``--large`` items per rank in one round (one
``forward()``; on a GPU beside the copy floor: a device-to-device copy of the same bytes,
what push delivery must do at least). Every case checks that every item arrived.
"""

import time

import numpy as np
from mpi4py import MPI

import rafi
from rafi import device
from rafi._config import BACKENDS
from rafi.bench import _records as records
from rafi.bench import node_floor
from rafi.examples._cli import Parser, integer, output_file

ITEM = np.dtype([("key", "i8"), ("hops", "i8"), ("pad", "f8", (6,))], align=True)  # 64 bytes


@rafi.kernel
def seed(i, outbox, rank, size, first):
    slot = device.push(outbox, (rank + 1) % size)
    if slot >= 0:
        outbox.items[slot].key = first + i
        outbox.items[slot].hops = 0


@rafi.kernel
def onward(i, inbox, outbox, rank, size, seen):
    """Count the item and push it on to the next rank."""
    device.atomic_add(seen, 0, 1)
    device.emit(outbox, inbox[i], (rank + 1) % size)


def _forwarder(comm, opts, mode, capacity):
    return rafi.Forwarder(comm, ITEM, capacity, backend=opts.backend, mode=mode)


def circulate(comm, opts, mode, way, per_rank, rounds):
    """Seconds per round (rank 0's clock) of ``rounds`` rounds of ``per_rank`` items a rank
    (rank 0 alone when ``per_rank`` is 0: one item in the job), after a warm-up, and the
    backend that ran them."""
    seeded = per_rank if per_rank else int(comm.Get_rank() == 0)
    with _forwarder(comm, opts, mode, max(per_rank, 1) * 2) as fwd:
        seen = fwd.to_backend(np.zeros(1, np.int64))
        args = (fwd.rank, fwd.size, seen)

        def rounds_of(count):
            if way == "run":
                fwd.run(onward, *args, rounds=count, rounds_per_launch=opts.rounds_per_launch)
                return
            for _ in range(count):
                result = fwd.forward()
                fwd.launch(onward, result.received, fwd.inbox, fwd.outbox, *args)

        fwd.launch(seed, seeded, fwd.outbox, fwd.rank, fwd.size, 0)
        rounds_of(max(10, rounds // 10))  # warm-up: compiles, settles the model
        comm.Barrier()
        started = time.perf_counter()
        rounds_of(rounds)
        seconds = time.perf_counter() - started
        counted = int(rafi.asnumpy(seen)[0])
        backend = fwd.backend
    warm = max(10, rounds // 10)
    expected = seeded * (warm + rounds) if per_rank else None
    total = comm.allreduce(counted)
    ok = (counted == expected) if per_rank else (total == warm + rounds)
    if not comm.allreduce(int(ok), op=MPI.MIN):
        raise AssertionError(
            f"{mode} {way}: items were lost or doubled ({counted} counted on rank {comm.Get_rank()})"
        )
    return comm.bcast(seconds / rounds), backend


@rafi.kernel
def seed_many(i, outbox, rank, size):
    slot = device.push(outbox, (rank + 1) % size)
    if slot >= 0:
        outbox.items[slot].key = i
        outbox.items[slot].hops = rank


def large(comm, opts, mode):
    """Seconds of one ``forward()`` of ``--large`` items a rank (the median of ``--repeat``)."""
    n = opts.large
    times = []
    with _forwarder(comm, opts, mode, n) as fwd:
        for _ in range(opts.repeat + 1):
            fwd.launch(seed_many, n, fwd.outbox, fwd.rank, fwd.size)
            fwd._backend.synchronize()
            comm.Barrier()
            started = time.perf_counter()
            result = fwd.forward()
            times.append(time.perf_counter() - started)
            keys = rafi.asnumpy(fwd.inbox)["key"]
            ok = result.received == n and np.array_equal(np.sort(keys), np.arange(n))
            if not comm.allreduce(int(ok), op=MPI.MIN):
                raise AssertionError(f"{mode}: a large round lost or doubled items")
    return comm.allreduce(float(np.median(times[1:])), op=MPI.MAX)


def copy_floor(opts):
    """Seconds of a device-to-device copy of ``--large`` 64-byte items (CuPy), or None."""
    try:
        import cupy
    except ImportError:
        return None
    src = cupy.ones(opts.large * ITEM.itemsize, cupy.uint8)
    dst = cupy.empty_like(src)
    times = []
    for _ in range(opts.repeat + 1):
        cupy.cuda.runtime.deviceSynchronize()
        started = time.perf_counter()
        dst[...] = src
        cupy.cuda.runtime.deviceSynchronize()
        times.append(time.perf_counter() - started)
    return float(np.median(times[1:]))


WAYS = (("resident", "run"), ("resident", "forward"), ("bsp", "run"))


def main(argv=None):
    parser = Parser("rafi.bench.resident", __doc__)
    parser.add_argument("--backend", default="auto", choices=BACKENDS, help="where kernels run")
    parser.add_argument("--rounds", type=integer(1), default=2000, help="timed rounds per case")
    parser.add_argument("--items", type=integer(1), default=1000, help="items per rank in the small case")
    many = "items per rank in one large round (0: skip)"
    parser.add_argument("--large", type=integer(0), default=0, help=many)
    parser.add_argument("--repeat", type=integer(1), default=5, help="large rounds timed (the median)")
    parser.add_argument(
        "--rounds-per-launch", type=integer(1), help="resident run(): rounds per launch (default: the model)"
    )
    parser.add_argument("--json", help="append the record to this JSON list (rank 0)")
    opts = parser.parse_args(argv)
    parser.agree(root=[lambda: output_file("--json", opts.json)])
    comm = MPI.COMM_WORLD
    record = {"ranks": comm.Get_size(), "backend": opts.backend, "items": opts.items, "rounds": opts.rounds}
    for label, per_rank in (("1 item", 0), (f"{opts.items} items", opts.items)):
        for mode, way in WAYS:
            seconds, backend = circulate(comm, opts, mode, way, per_rank, opts.rounds)
            record[f"{label}, {mode} {way}"] = seconds
    if backend == "cpu" and node_floor.on_one_node(comm):
        with node_floor.Ring(comm, opts.items) as raw:
            record[f"{opts.items} items, raw exchange"] = raw.run(opts.rounds)[0] * 1e-6
    if opts.large:
        record["large items"] = opts.large
        for mode in ("resident", "bsp"):
            record[f"large, {mode} forward"] = large(comm, opts, mode)
        if opts.backend != "cpu" and comm.Get_rank() == 0:
            record["large, device copy floor"] = copy_floor(opts)
    if comm.Get_rank() != 0:
        return
    print(
        f"# {record['ranks']} ranks, backend {opts.backend}: seconds per round (us), "
        "slowest rank sets the pace"
    )
    for key, value in record.items():
        if isinstance(value, float):
            print(f"{key:>40}: {value * 1e6:10.1f} us")
    if opts.json:
        records.append(opts.json, record)


if __name__ == "__main__":
    main()
