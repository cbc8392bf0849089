"""Forwarding benchmark: rafi's ``forward()`` against the bare transport and a hand-written exchange.

    mpirun -n 4 python -m rafi.bench --items 1000 100000 1000000 --itemsize 16 64 256 \\
        --pattern uniform ring hot --json bench.json --plot bench.png

For every (pattern, item size, items per rank): the median of ``--rounds`` timed rounds
after two warm-up rounds, all ranks synchronized by a barrier before each round and the
device synchronized at its end (wall clock of the slowest rank); in the same run, the bare
transport rafi chose moving the same bytes already partitioned (``ipc_floor``,
``nccl_floor`` or ``host_floor``) and the exchange a user writes by hand (``hand_written``). The first
warm-up round checks every byte every rank received. Rank 0 prints a table and writes the
records (``--json``) and a plot of GB/s and round latency (``--plot``, needs matplotlib).
Run it under several ``mpirun -n`` to sweep the rank count.
"""

import json
import time

import numpy as np
from mpi4py import MPI

import rafi
from rafi._config import BACKENDS, TRANSPORTS
from rafi._sparse import EXCHANGES
from rafi.examples._cli import MOST_ITEMS, Parser, integer, output_file, real
from rafi.kernels import bench as traffic

from .baselines import destinations, hand_written, host_floor, ipc_floor, nccl_floor

PATTERNS = {"uniform": traffic.UNIFORM, "ring": traffic.RING, "hot": traffic.HOT}
_CHECK_CHUNK = 1 << 20
SPLIT = ("partition", "control", "payload", "host")  # of a round, rank 0's


def item_dtype(itemsize):
    return np.dtype([("tag", "u8"), ("body", "u1", (itemsize - 8,))])


def expected_tags(n, rank, size, pattern, seed):
    """The tags of the items every rank sends to ``rank`` (sorted)."""
    parts = []
    for source in range(size):
        mine = np.flatnonzero(destinations(n, source, size, pattern, seed) == rank)
        parts.append(np.uint64(source) * np.uint64(4294967296) + mine.astype(np.uint64))
    return np.sort(np.concatenate(parts))


def check_delivery(got, n, rank, size, pattern, seed):
    """Raise unless ``got`` holds exactly the items sent to ``rank``, every byte intact."""
    got = got[np.argsort(got["tag"], kind="stable")]
    tags = expected_tags(n, rank, size, pattern, seed)
    if len(got) != len(tags) or not np.array_equal(got["tag"], tags):
        raise AssertionError(f"rank {rank} received {len(got)} items, expected {len(tags)}, or other tags")
    width = got.dtype["body"].shape[0]
    for lo in range(0, len(got), _CHECK_CHUNK):
        part = got[lo : lo + _CHECK_CHUNK]
        body = (part["tag"][:, None] + np.arange(width, dtype=np.uint64)) % 256
        if not np.array_equal(part["body"], body.astype(np.uint8)):
            raise AssertionError(f"rank {rank} received items whose bytes differ from what was sent")


def time_rafi(fwd, n, pattern, rounds, seed):
    """Seconds of ``forward()`` delivering ``n`` items per rank (every round it takes), the
    median over ``rounds``, and the medians of its split (``fwd.stats``): ``partition``,
    ``control`` (the count exchange, with the wait for the slowest rank), ``payload``
    (moving items: transport, device copies, the wait for node peers) and ``host`` (rafi's
    own bookkeeping, the rest); then this rank's control messages (the median of the timed
    repetitions' sums) and peers (the other ranks it sent items to or received items from)."""
    comm, b = MPI.COMM_WORLD, fwd._backend
    times, splits, messages = [], [], []
    talked = np.zeros(fwd.size, bool)
    for r in range(rounds + 2):  # two warm-up rounds; the first one is checked
        fwd.launch(traffic.fill, n, fwd.outbox, fwd.rank, fwd.size, pattern, seed)
        b.synchronize()
        comm.Barrier()
        first = len(fwd.stats)
        t = time.perf_counter()
        got = []
        while True:
            result = fwd.forward()
            if r == 0:
                got.append(rafi.asnumpy(fwd.inbox))
            if result.alive <= fwd.capacity:  # all ranks know: nothing can have been held back
                break
            if not comm.allreduce(result.deferred):  # every rank takes part, every time
                break
        b.synchronize()
        if r == 0:
            check_delivery(np.concatenate(got), n, fwd.rank, fwd.size, pattern, seed)
        if r >= 2:
            times.append(time.perf_counter() - t)
            done = [fwd.stats[i] for i in range(first, len(fwd.stats))]
            split = [sum(getattr(s, k) for s in done) for k in ("partition", "wait", "payload", "host")]
            splits.append(split)
            messages.append(sum(s.control_messages for s in done))
            for s in done:
                talked |= (s.sent > 0) | (s.received > 0)
    split = np.median(np.array(splits), axis=0)
    talked[fwd.rank] = False
    traffic_seen = {"control_messages": float(np.median(messages)), "peers": int(talked.sum())}
    return float(np.median(times)), dict(zip(SPLIT, split.tolist())), traffic_seen


def measure(opts, n, itemsize, pattern_name):
    """One point: rafi, the bare transport and the hand-written exchange; the slowest rank's."""
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    pattern = PATTERNS[pattern_name]
    capacity = n * size if pattern_name == "hot" else int(1.3 * n) + 1024
    dest = destinations(n, rank, size, pattern, opts.seed)
    words = itemsize // 8
    config = dict(backend=opts.backend, transport=opts.transport, exchange=opts.exchange, mode=opts.mode)
    with rafi.Forwarder(comm, item_dtype(itemsize), capacity, **config) as fwd:
        seconds, split, seen = time_rafi(fwd, n, pattern, opts.rounds, opts.seed)
        backend, transport = fwd.backend, fwd.transport
        gpu = backend == "cuda" and not fwd._backend.simulator
    xp = np
    if gpu:
        import cupy as xp
    if transport == "ipc":
        floor, floor_name = ipc_floor(comm, words, dest, opts.rounds), "ipc copy"
    elif transport == "nccl":
        floor, floor_name = nccl_floor(comm, words, dest, opts.rounds), "nccl send/recv"
    else:
        floor, floor_name = host_floor(comm, xp, words, dest, opts.rounds), "host Alltoallv"
    hand = hand_written(comm, xp, words, dest, opts.rounds)
    worst = np.empty(3)
    comm.Allreduce(np.array([seconds, floor, hand]), worst, op=MPI.MAX)
    payload = comm.allreduce(n * itemsize)
    return {
        "items_per_rank": n,
        "itemsize": itemsize,
        "ranks": size,
        "pattern": pattern_name,
        "backend": backend,
        "transport": transport,
        "floor": floor_name,
        "rafi_s": worst[0],
        "raw_floor_s": worst[1],
        "hand_written_s": worst[2],
        "rafi_GBps": payload / worst[0] / 1e9,
        "raw_floor_GBps": payload / worst[1] / 1e9,
        "hand_written_GBps": payload / worst[2] / 1e9,
        "rafi_split_s": split,
        "exchange": opts.exchange,
        "mode": opts.mode,
        **seen,
    }


def run(opts):
    """Measure every point of the sweep; return the records (the same on every rank)."""
    records = []
    for pattern in opts.pattern:
        for itemsize in opts.itemsize:
            for n in opts.items:
                if n * itemsize <= opts.max_bytes:
                    records.append(measure(opts, n, itemsize, pattern))
    return records


def table(records):
    head = (
        f"{'pattern':>8} {'items/rank':>11} {'B':>4} {'rafi ms':>9} {'floor ms':>9} {'hand ms':>9} "
        f"{'rafi GB/s':>10} {'floor GB/s':>10} {'hand GB/s':>10} {'of floor':>8} {'vs hand':>8}"
        + "".join(f" {k[:7] + ' us':>10}" for k in SPLIT)
    )
    lines = [head, "-" * len(head)]
    for r in records:
        lines.append(
            f"{r['pattern']:>8} {r['items_per_rank']:>11} {r['itemsize']:>4} {r['rafi_s'] * 1e3:>9.3f} "
            f"{r['raw_floor_s'] * 1e3:>9.3f} {r['hand_written_s'] * 1e3:>9.3f} "
            f"{r['rafi_GBps']:>10.2f} {r['raw_floor_GBps']:>10.2f} {r['hand_written_GBps']:>10.2f} "
            f"{r['raw_floor_s'] / r['rafi_s']:>7.0%} {r['hand_written_s'] / r['rafi_s']:>7.2f}x"
            + "".join(f" {r['rafi_split_s'][k] * 1e6:>10.1f}" for k in SPLIT)
        )
    return "\n".join(lines)


def parse(argv=None):
    """The benchmark's options (``argv``: the command line's words, default ``sys.argv``)."""
    parser = Parser("rafi.bench", __doc__)
    parser.add_argument("--backend", default="auto", choices=BACKENDS, help="where kernels run")
    parser.add_argument("--transport", default="auto", choices=TRANSPORTS, help="how payloads travel")
    parser.add_argument("--exchange", default="auto", choices=EXCHANGES, help="how a round's counts travel")
    parser.add_argument(
        "--mode",
        default="bsp",
        choices=("bsp", "resident"),
        help="rounds driven by the host, or on the device",
    )
    many = "items each rank sends in a point, one point each"
    sizes = [1000, 10000, 100000, 1000000]
    parser.add_argument("--items", type=integer(1, MOST_ITEMS), nargs="+", default=sizes, help=many)
    wide = "bytes per item, one point each"
    parser.add_argument("--itemsize", type=int, nargs="+", default=[64], choices=[16, 64, 256], help=wide)
    where = "where items go, one point each"
    parser.add_argument("--pattern", nargs="+", default=["uniform"], choices=sorted(PATTERNS), help=where)
    parser.add_argument(
        "--rounds", type=integer(1), default=10, help="timed rounds per point (after 2 warm-ups)"
    )
    parser.add_argument("--seed", type=integer(0, 2**32 - 1), default=1, help="of the destinations")
    most = "skip points above this many bytes per rank"
    parser.add_argument("--max-bytes", type=real(above=0), default=2**30, help=most)
    parser.add_argument("--json", help="write the records here (rank 0)")
    parser.add_argument("--plot", help="draw GB/s and round latency to this PNG (rank 0; needs matplotlib)")
    opts = parser.parse_args(argv)
    most = max(opts.items)
    needed = most * parser.ranks if "hot" in opts.pattern else int(1.3 * most) + 1024  # see measure()
    if needed > MOST_ITEMS:
        parser.error(
            f"--items {most}: a forwarder of {needed:,} items would be needed (on {parser.ranks} ranks"
            f"{', pattern hot' if 'hot' in opts.pattern else ''}), more than one holds (2**31 - 1)"
        )
    parser.agree(
        root=[lambda: output_file("--json", opts.json), lambda: output_file("--plot", opts.plot, (".png",))]
    )
    return opts


def main(argv=None):
    opts = parse(argv)
    records = run(opts)
    if MPI.COMM_WORLD.Get_rank() != 0 or not records:
        return
    r = records[0]
    print(
        f"# {r['ranks']} ranks, backend {r['backend']}, transport {r['transport']}, "
        f"exchange {r['exchange']}, floor: {r['floor']}"
    )
    print(table(records))
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(records, f, indent=1)
    if opts.plot:
        from .plot import plot

        plot(records, opts.plot)


if __name__ == "__main__":
    main()
