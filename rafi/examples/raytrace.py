"""Data-parallel path tracer: each rank owns one spatial domain; rays are forwarded by rafi.

    mpirun -n 4 python -m rafi.examples.raytrace --width 256 --height 256 --samples 4 --output image.png

A ray that leaves a rank's cells goes to the rank owning the next cell; hits send a
shadow ray toward the light and a bounce ray; pixel contributions are summed at the
pixel's owner by a ``rafi.Reducer``; rank 0 writes the PNG. The image does not depend
on the number of ranks (random numbers hash seed, pixel, sample and bounce).
"""

import argparse
import sys

import numpy as np
from mpi4py import MPI

from rafi.kernels import raytrace as rt

from . import render_loop
from .scene import SCENES, decompose, local_cells, make_scene

OPTIONS = ("width", "height", "samples", "bounces", "seed", "scene", "grid")  # those that make the image


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    render_loop.add_options(p)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--bounces", type=int, default=2)
    p.add_argument("--scene", default="spheres", choices=SCENES)
    p.add_argument("--grid", type=int, default=16, help="cells per side of the scene")
    opts = p.parse_args(argv)
    render_loop.check_options(p, opts)
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
        trace_args=(sph, dom, owner, g, opts.seed, opts.bounces),
        options=OPTIONS,
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
