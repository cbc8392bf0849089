"""Ray tracer benchmark: rafi on N ranks against the one-process reference renderer.

    mpirun -n 4 python -m rafi.bench.raytrace --width 256 --height 256 --samples 4 --mode bsp async

A small warm-up render compiles the kernels first; then the timed render, and on rank 0
the reference (plain numba, one process, no rafi), timed after its own warm-up. Prints
per run the paths and rays traced (the same at every rank count; rafi/examples/render_loop.py
says what each counts) and rays per second, the ray segments forwarded and the rounds, the
time ratio, and the largest difference between the two images.
"""

import argparse
import itertools
import json
import time

import numpy as np
from mpi4py import MPI

from rafi._config import BACKENDS, PROGRESS
from rafi._forwarder import MODES
from rafi.examples import raytrace
from rafi.examples._cli import MOST_ITEMS, Parser, integer, output_file
from rafi.examples.render_loop import IMAGE_FORMATS, to_png
from rafi.examples.scene import make_scene
from rafi.kernels.raytrace import reference_render


def parse(argv=None):
    """The options, checked: a usage error exits every rank, rank 0 says why."""
    p = Parser("rafi.bench.raytrace", __doc__)
    p.add_argument("--width", type=integer(1), default=256, help="image width in pixels")
    p.add_argument("--height", type=integer(1), default=256, help="image height in pixels")
    p.add_argument("--samples", type=integer(1, 2**20), default=4, help="paths per pixel")
    p.add_argument(
        "--bounces", type=integer(0), default=2, help="diffuse bounces of a path after its first hit"
    )
    p.add_argument("--grid", type=integer(1, 2**15), default=16, help="cells per side of the scene")
    p.add_argument("--backend", default="auto", choices=BACKENDS, help="where kernels run")
    p.add_argument(
        "--mode", nargs="+", default=["bsp"], choices=MODES, help="the forwarder's mode, one run each"
    )
    p.add_argument("--progress", nargs="+", default=["auto"], choices=PROGRESS, help="async: one run each")
    fit = "samples traced together, one run each (0: as many as fit in memory)"
    p.add_argument("--samples-per-pass", type=integer(0), nargs="+", default=[0], help=fit)
    p.add_argument("--output", help="the rafi image (rank 0): a .png, or .npy for raw float64 values")
    p.add_argument("--json", help="write the figures here (rank 0)")
    opts = p.parse_args(argv)
    if len(set(opts.samples_per_pass)) < len(opts.samples_per_pass):
        p.error("--samples-per-pass: distinct values, each at least 1, or 0 for as many as fit")
    if opts.grid**2 < p.ranks:
        p.error(f"--grid {opts.grid} makes fewer cells than the {p.ranks} ranks (each owns at least one)")
    if opts.width * opts.height * (opts.bounces + 2) + 64 > MOST_ITEMS:
        p.error("--width, --height, --bounces: a sample's rays are more than a forwarder holds (2**31 - 1)")
    p.agree(
        root=[
            lambda: output_file("--output", opts.output, IMAGE_FORMATS),
            lambda: output_file("--json", opts.json),
        ]
    )
    return opts


def main(argv=None):
    opts = parse(argv)
    comm = MPI.COMM_WORLD
    common = dict(
        seed=1, scene="spheres", backend=opts.backend, quiet=True, grid=opts.grid, bounces=opts.bounces
    )
    runs = {}
    modes = [(m, p) for m in opts.mode for p in (opts.progress if m == "async" else ["auto"])]
    for (mode, progress), per_pass in itertools.product(modes, opts.samples_per_pass):
        # warm-up: a render whose passes are the timed run's, so every rank compiles what the
        # timed run launches (kernels depend on the capacity) and no rank waits for another's
        # compiler
        warm_samples = min(per_pass or opts.samples, opts.samples)
        passes = dict(mode=mode, progress=progress, samples_per_pass=per_pass)
        warm = dict(width=opts.width, height=opts.height, samples=warm_samples, **passes)
        _, warmed = raytrace.render(argparse.Namespace(**warm, **common), comm)
        passes["samples_per_pass"] = warmed["samples_per_pass"]  # auto: what the warm-up chose
        size = dict(width=opts.width, height=opts.height, samples=opts.samples)
        run = argparse.Namespace(**passes, **size, **common)
        name = mode if mode == "bsp" or len(opts.progress) == 1 else f"{mode}/{progress}"
        if len(opts.samples_per_pass) > 1:
            name += f", {per_pass or 'auto'} per pass"
        runs[name] = raytrace.render(run, comm)
    if comm.Get_rank() != 0:
        return
    cells = make_scene("spheres", opts.grid, 1)
    reference_render(4, 4, 1, opts.bounces, 1, cells, opts.grid)  # compile
    t = time.perf_counter()
    ref = (
        reference_render(opts.width, opts.height, opts.samples, opts.bounces, 1, cells, opts.grid)
        / opts.samples
    )
    ref_s = time.perf_counter() - t
    out = []
    for mode, (image, info) in runs.items():
        out.append(
            {
                "mode": mode,
                "ranks": info["ranks"],
                "backend": info["backend"],
                "transport": info["transport"],
                "image": f"{opts.width}x{opts.height}x{opts.samples}spp, {opts.bounces} bounces",
                "rafi_s": info["seconds"],
                "reference_s": ref_s,
                "rafi_over_reference": info["seconds"] / ref_s,
                "paths": info["paths"],
                "rays": info["rays"],
                "Mrays_per_s": info["rays_per_second"] / 1e6,
                "segments": info["segments"],
                "segments_between_ranks": info["items_between_ranks"],
                "rounds": info["rounds"],
                "samples_per_pass": info["samples_per_pass"],
                "max_abs_diff": float(np.abs(image - ref).max()),
            }
        )
    print(json.dumps(out))
    if opts.output:
        to_png(image, opts.output)  # the last mode's
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
