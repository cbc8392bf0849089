"""Reference workloads: rays or particles per second with rafi, against the one-process reference.

    launch/local.sh 4 python -m rafi.bench.workloads --program volume schlieren transport \\
        --reference --json workloads.json
    launch/local.sh 2 python -m rafi.bench.workloads --small --backend cpu --reference

For each ``--program`` and ``--mode``: a tiny warm-up run (kernels compiled, memory pools
and libraries loaded), then the timed run (the median of ``--repeat``) through the
program's own functions (``volume_data.render`` for the volume path tracer and the
Schlieren imager, ``transport.run``), whose seconds leave out compilation and the loading
of the data and are the slowest rank's. With ``--reference``, rank 0 then times the one-process reference
on the same backend (its arguments already on the device, its compilation left out by
``rafi.compile_seconds()``) and compares its result with rafi's. The rate counts paths:
one ray per pixel sample, one particle per source particle (``visits`` counts each time
a rank traced one). Bytes forwarded are every rank's ``fwd.stats`` total of bytes sent,
summed (a rank's items to itself included; ``between ranks`` without them).

Sizes default to a run for one H200 (512x512 pixels, 8 samples, a 256^3 volume; 4M
particles on a 64^3 grid); ``--small`` picks sizes for a CPU, and each size option
overrides either. Rank 0 prints a table; ``--json`` writes the records, with the bricks'
resident bytes and each rank's forwarding stats.
"""

import json
import operator
import time

from mpi4py import MPI

import rafi
from rafi._config import BACKENDS
from rafi._forwarder import MODES
from rafi.examples import schlieren, transport, volume, volume_data
from rafi.examples._cli import MOST_ITEMS, Parser, integer, output_file
from rafi.kernels import transport as kern
from rafi.kernels.reference import reference_image, to_backend

__all__ = ["parse", "run", "table", "main"]

IMAGES = {"volume": volume, "schlieren": schlieren}
PROGRAMS = (*IMAGES, "transport")
SIZES = {
    "h200": dict(width=512, height=512, samples=8, dims=[256, 256, 256], particles=4_000_000, grid=64),
    "small": dict(width=48, height=36, samples=2, dims=[24, 24, 24], particles=20_000, grid=16),
}
WARM_UP_IMAGE = (8, 8, 1, ["--dims", 8, 8, 8])  # width, height, samples, volume options
WARM_UP_PARTICLES = 64
SEED = 1  # of the transport's particles (the volume tracer takes its own default)


def parse(argv=None):
    """The options, each size filled in from ``SIZES`` where not given, checked: a usage
    error exits every rank, rank 0 says why."""
    p = Parser("rafi.bench.workloads", __doc__)
    p.add_argument("--program", nargs="+", default=list(PROGRAMS), choices=PROGRAMS, help="one run each")
    p.add_argument("--backend", default="auto", choices=BACKENDS, help="where kernels run")
    p.add_argument(
        "--mode", nargs="+", default=["bsp"], choices=MODES, help="the forwarder's mode, one run each"
    )
    p.add_argument("--small", action="store_true", help="sizes for a CPU run")
    sized = "(default: --small's or the H200's, see SIZES)"
    p.add_argument("--width", type=integer(1), help=f"image width in pixels {sized}")
    p.add_argument("--height", type=integer(1), help=f"image height in pixels {sized}")
    p.add_argument("--samples", type=integer(1, 2**20), help=f"paths per pixel {sized}")
    volume_data.add_options(p)
    p.add_argument("--particles", type=integer(0, MOST_ITEMS), help=f"transport: source particles {sized}")
    p.add_argument("--grid", type=integer(1, 1290), help=f"transport: cells per side of the cube {sized}")
    p.add_argument("--reference", action="store_true", help="rank 0 also times the one-process reference")
    p.add_argument(
        "--repeat", type=integer(1), default=1, help="timed runs of each program and mode (the median)"
    )
    p.add_argument("--json", help="write the records here (rank 0)")
    opts = p.parse_args(argv)
    for name, value in SIZES["small" if opts.small else "h200"].items():
        if getattr(opts, name) is None and not (name == "dims" and opts.volume):
            setattr(opts, name, value)
    if set(opts.program) & set(IMAGES):
        if opts.width * opts.height + 64 > MOST_ITEMS:
            p.error(f"--width {opts.width} --height {opts.height}: more pixels than a forwarder holds")
        volume_data.source(p, opts)  # the file is there, of its size, and every rank gets a brick
    if "transport" in opts.program and opts.grid < p.ranks:
        p.error(f"--grid {opts.grid} is fewer cells along x than the {p.ranks} ranks (one slab each)")
    p.agree(root=[lambda: output_file("--json", opts.json)])
    return opts


def _image_argv(opts, mode, width, height, samples, volume_options):
    argv = ["--width", width, "--height", height, "--samples", samples, *volume_options]
    return [str(a) for a in argv + ["--backend", opts.backend, "--mode", mode, "--quiet"]]


def _volume_options(opts):
    """The volume options as the image programs take them."""
    given = ["--volume", opts.volume] if opts.volume else []
    given += ["--dims", *opts.dims] if opts.dims else []
    return given + (["--dtype", opts.dtype] if opts.dtype else [])


def _timed(compute, sizes, tiny):
    """``(compute(*sizes), seconds)`` after a warm-up ``compute(*tiny)`` (which compiles the
    kernels or loads them from the disk cache), the seconds less any time numba spent compiling."""
    compute(*tiny)
    compiled, started = rafi.compile_seconds(), time.perf_counter()
    out = compute(*sizes)
    return out, time.perf_counter() - started - (rafi.compile_seconds() - compiled)


def _median_run(run_once, repeat, seconds_of):
    """The output of the run of median seconds among ``repeat`` calls of ``run_once()``
    (``seconds_of(output)``: the same on every rank, the slowest rank's)."""
    outputs = [run_once() for _ in range(repeat)]
    seconds = [seconds_of(output) for output in outputs]
    return outputs[sorted(range(repeat), key=seconds.__getitem__)[repeat // 2]]


def _rate(count, seconds):
    return count / seconds if seconds > 0 else 0.0


def _record(program, info, items, seconds):
    """What every program's record has (``info`` as the program returned it on rank 0)."""
    moved = {k: info[k] for k in ("bytes_forwarded", "bytes_between_ranks")}
    return {
        "program": program,
        **{k: info[k] for k in ("mode", "ranks", "backend", "transport", "rounds")},
        "unit": "particles" if program == "transport" else "rays",
        "items": items,
        "seconds": seconds,
        "items_per_second": _rate(items, seconds),
        **moved,
        **{f"{k}_per_second": _rate(v, seconds) for k, v in moved.items()},
        "per_rank_stats": info["per_rank_stats"],
    }


def _image_run(name, opts, mode, comm):
    """Render with image program ``name``; return ``(record, image, program options, source)``
    on rank 0 (``(None, None, ...)`` elsewhere)."""
    program = IMAGES[name]
    volume_data.render(*program.parse(_image_argv(opts, mode, *WARM_UP_IMAGE)), program.work, comm)
    argv = _image_argv(opts, mode, opts.width, opts.height, opts.samples, _volume_options(opts))
    popts, src = program.parse(argv)
    image, info = _median_run(
        lambda: volume_data.render(popts, src, program.work, comm),
        opts.repeat,
        lambda out: comm.allreduce(out[1]["seconds"], op=MPI.MAX),
    )
    seconds = comm.allreduce(info["seconds"], op=MPI.MAX)
    if comm.Get_rank() != 0:
        return None, None, popts, src
    record = _record(name, info, opts.width * opts.height * opts.samples, seconds)
    record.update(
        size=f"{opts.width}x{opts.height}x{opts.samples}",
        dims=list(src.dims),
        visits=info["segments"],
        rays=info["rays"],
        resident_bytes=[b["resident_bytes"] for b in info["bricks"]],
        volume_bytes=info["volume_bytes"],
    )
    return record, image, popts, src


def _image_reference(name, popts, src, backend, images):
    """Time the one-process reference image on ``backend``; compare it with rafi's ``images``."""
    shade, args = IMAGES[name].shading(popts, src)
    args = to_backend(args, backend)  # outside the timing, as rafi's bricks are
    sizes = popts.width, popts.height, popts.samples
    ref, seconds = _timed(
        lambda w, h, s: reference_image(shade, w, h, s, *args, backend=backend), sizes, (1, 1, 1)
    )
    ref = ref / popts.samples
    return seconds, {"reference_max_abs_diff": max(float(abs(image - ref).max()) for image in images)}


def _transport_run(opts, mode, comm):
    """Transport with rafi; return ``(record, tally)`` on rank 0 (``(None, None)`` elsewhere)."""
    seconds_of = operator.itemgetter("seconds")  # the slowest rank's, on every rank

    def argv(particles):
        sizes = ["--particles", particles, "--grid", opts.grid, "--seed", SEED]
        return [str(a) for a in [*sizes, "--backend", opts.backend, "--mode", mode]]

    transport.run(transport.parse(argv(WARM_UP_PARTICLES)), comm)
    info = _median_run(
        lambda: transport.run(transport.parse(argv(opts.particles)), comm), opts.repeat, seconds_of
    )
    if comm.Get_rank() != 0:
        return None, None
    record = _record("transport", info, opts.particles, info["seconds"])
    record.update(
        {k: info[k] for k in ("particles", "absorbed", "leaked", "visits")}, grid=opts.grid, seed=SEED
    )
    return record, (info["tally"], info["leaked"])


def _transport_reference(opts, backend, results):
    """Time the one-process transport on ``backend``; compare its tallies with rafi's ``results``."""
    g = opts.grid
    mat = to_backend([transport.materials(g)], backend)[0]
    (tally, leaked), seconds = _timed(
        lambda n: kern.reference(n, SEED, mat, g, backend), [opts.particles], [1]
    )
    same = all(t == tally.tolist() and n == leaked for t, n in results)
    return seconds, {"reference_equal": same}


def run(opts, comm=MPI.COMM_WORLD):
    """Run every program and mode of ``opts`` (collective); return the records on rank 0."""
    records = []
    for name in opts.program:
        mine, outputs = [], []
        for mode in opts.mode:
            if name == "transport":
                record, output = _transport_run(opts, mode, comm)
            else:
                record, output, popts, src = _image_run(name, opts, mode, comm)
            mine.append(record)
            outputs.append(output)
        if comm.Get_rank() != 0:
            continue
        if opts.reference:
            backend = mine[0]["backend"]
            if name == "transport":
                seconds, check = _transport_reference(opts, backend, outputs)
            else:
                seconds, check = _image_reference(name, popts, src, backend, outputs)
            for record in mine:
                rate = _rate(record["items"], seconds)
                record.update(check, reference_seconds=seconds, reference_items_per_second=rate)
                record["speed_ratio"] = _rate(record["items_per_second"], rate)
        records += mine
    return records if comm.Get_rank() == 0 else None


def _scaled(key, scale=1e6):
    """The cell of ``record[key] / scale`` ("-" where the record has none)."""
    return lambda r: f"{r[key] / scale:.3f}" if key in r else "-"


COLUMNS = (  # header, and the cell of a record
    ("program", lambda r: r["program"]),
    ("mode", lambda r: r["mode"]),
    ("ranks", lambda r: str(r["ranks"])),
    ("backend", lambda r: r["backend"]),
    ("transport", lambda r: r["transport"]),
    ("items", lambda r: str(r["items"])),
    ("seconds", lambda r: f"{r['seconds']:.3f}"),
    ("M/s", _scaled("items_per_second")),
    ("fwd GB/s", _scaled("bytes_forwarded_per_second", 1e9)),
    ("between GB/s", _scaled("bytes_between_ranks_per_second", 1e9)),
    ("rounds", lambda r: str(r["rounds"])),
    ("brick MB", lambda r: f"{max(r['resident_bytes']) / 1e6:.3f}" if "resident_bytes" in r else "-"),
    ("volume MB", _scaled("volume_bytes")),
    ("ref M/s", _scaled("reference_items_per_second")),
    ("rafi/ref", lambda r: f"{r['speed_ratio']:.2f}" if "speed_ratio" in r else "-"),
)


def table(records):
    """The records as a text table: rates in millions per second, bytes per second in GB."""
    rows = [[header for header, _ in COLUMNS]] + [[cell(r) for _, cell in COLUMNS] for r in records]
    widths = [max(len(row[k]) for row in rows) for k in range(len(COLUMNS))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows)


def main(argv=None):
    opts = parse(argv)
    records = run(opts)
    if records is None:
        return 0
    print(table(records))
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump({"options": vars(opts), "records": records}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
