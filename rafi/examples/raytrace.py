"""Data-parallel path tracer: each rank owns one spatial domain; rays are forwarded by rafi.

    mpirun -n 4 python -m rafi.examples.raytrace --width 256 --height 256 --samples 4 --output image.png

A ray that leaves a rank's cells goes to the rank owning the next cell; hits send a
shadow ray toward the light and a bounce ray; pixel contributions are summed at the
pixel's owner by a ``rafi.Reducer``; rank 0 writes the PNG. The image does not depend
on the number of ranks (random numbers hash seed, pixel, sample and bounce).
"""

import math
import sys

import numpy as np
from mpi4py import MPI

from rafi.kernels import raytrace as rt

from . import render_loop
from ._cli import Parser, integer
from .scene import SCENES, decompose, local_cells, make_scene

OPTIONS = ("width", "height", "samples", "bounces", "seed", "scene", "grid")  # those that make the image


def parse(argv=None, comm=None):
    """The options (``argv``: the command line's words, default ``sys.argv``), checked: a
    usage error exits every rank of ``comm`` (default ``MPI.COMM_WORLD``), rank 0 says why."""
    comm = comm if comm is not None else MPI.COMM_WORLD
    p = Parser("rafi.examples.raytrace", __doc__, comm)
    render_loop.add_options(p)
    p.add_argument("--seed", type=integer(0, 2**63 - 1), default=1, help="of the scene and of every path")
    p.add_argument(
        "--bounces", type=integer(0), default=2, help="diffuse bounces of a path after its first hit"
    )
    p.add_argument("--scene", default="spheres", choices=SCENES, help="spheres in some cells, or in all")
    grid = "cells per side of the scene; each rank owns a rectangle of them, so at least one per rank"
    p.add_argument("--grid", type=integer(1, 2**15), default=16, help=grid)
    opts = p.parse_args(argv)
    size = comm.Get_size()
    if opts.grid**2 < size:
        p.error(
            f"--grid {opts.grid} makes {opts.grid**2} cell{'s' * (opts.grid > 1)}, fewer than the "
            f"{size} ranks (each owns at least one): use --grid {math.isqrt(size - 1) + 1} or more"
        )
    render_loop.check_options(p, opts, OPTIONS, rays_per_pixel=opts.bounces + 2)  # see work()
    return opts


def work(opts, rank, size):
    """What ``rank`` traces: its domain's geometry, the camera and trace kernels."""
    g = opts.grid
    cells = make_scene(opts.scene, g, opts.seed)
    domains, owner = decompose(cells, g, size)
    pixels = opts.width * opts.height
    sph = local_cells(cells, g, domains[rank])  # this rank's geometry only
    dom = np.array(domains[rank], np.int64)
    return render_loop.Work(
        item=rt.Ray,
        capacity=pixels * (opts.bounces + 2) + 64,  # every ray of a sample pass can be in flight
        camera=rt.camera,
        camera_args=(opts.width, opts.height, opts.seed, g, owner),
        trace=rt.trace,
        trace_args=(sph, dom, owner, g, opts.seed, opts.bounces, np.zeros(1, np.int64)),
        options=OPTIONS,
        counter=6,  # trace counts the rays it starts there
    )


def render(opts, comm):
    """Render on all ranks of ``comm``; return ``(image or None, info)`` (image on rank 0)."""
    return render_loop.render(opts, comm, work(opts, comm.Get_rank(), comm.Get_size()))


def main(argv=None):
    opts = parse(argv)
    comm = MPI.COMM_WORLD
    image, info = render(opts, comm)
    if comm.Get_rank() == 0:
        render_loop.report(opts, image, info)
    return 0


if __name__ == "__main__":
    sys.exit(main())
