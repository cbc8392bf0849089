"""Data-parallel Schlieren imaging: parallel rays bend through a bricked volume; rafi forwards them.

    mpirun -n 4 python -m rafi.examples.schlieren --output s.png
    mpirun -n 4 python -m rafi.examples.schlieren --volume F.raw --dims X Y Z --dtype uint8 --output s.png
    mpirun -n 4 python -m rafi.examples.schlieren --volume F.h5:/path --filter color --output s.png

Each rank reads only its brick (rafi/examples/volume_data.py). Rays enter the volume's
face at 0 of ``--axis`` and travel along it (default y, the axis of the Marschner-Lobb
signal, whose rings then bend them); the refractive index is ``n = 1 + k * value``, and
the rays bend by its gradient in fixed steps (kernels/schlieren.py), forwarded to the
owner of the brick they move into with their whole state. Where they leave the volume, a
knife edge (or a colour filter) at the focal plane turns each ray's deflection into its
pixel's brightness (or colour). No random numbers: the image equals the one-process
reference to rounding, at any rank count; ``--samples`` rays per pixel on a fixed
sub-pixel pattern are averaged.
"""

import math
import sys

from mpi4py import MPI

from rafi.kernels import schlieren as sk

from . import render_loop, volume_data
from ._cli import Parser, real

OPTIONS = ("width", "height", "samples", "volume", "dims", "dtype", "axis", "k", "step", "cutoff", "filter")


def parse(argv=None, comm=None):
    """The options and the volume's ``Source``, checked: a usage error exits every rank of
    ``comm`` (default ``MPI.COMM_WORLD``), rank 0 says why."""
    p = Parser("rafi.examples.schlieren", __doc__, comm if comm is not None else MPI.COMM_WORLD)
    render_loop.add_options(p, width=160, height=160, samples=1)
    volume_data.add_options(p)
    p.add_argument("--axis", default="y", choices=("x", "y", "z"), help="the rays travel along it")
    p.add_argument("--k", type=real(), default=0.002, help="n = 1 + k * value (value in [0, 1])")
    p.add_argument("--step", type=real(above=0), default=0.5, help="integration step, in cells")
    saturates = "deflection (radians) at which the filter saturates"
    p.add_argument("--cutoff", type=real(above=0), default=0.015, help=saturates)
    p.add_argument("--filter", default="knife", choices=("knife", "color"), help="at the focal plane")
    return volume_data.parse(p, argv, OPTIONS)


def optics(opts, dims):
    """``(axis, k, step, max_steps, cutoff, color)`` as the kernels take them."""
    max_steps = math.ceil(4 * sum(dims) / opts.step)  # ends a ray that the field would trap
    return "xyz".index(opts.axis), opts.k, opts.step, max_steps, opts.cutoff, opts.filter == "color"


def work(opts, brick):
    """What this rank traces: its brick, the camera and trace kernels."""
    values, origin, dims, box = brick.device_args()
    axis, k, step, max_steps, cutoff, color = optics(opts, brick.dims)
    return render_loop.Work(
        item=sk.Ray,
        capacity=opts.width * opts.height + 64,  # a pixel has one ray in flight
        camera=sk.camera,
        camera_args=(opts.width, opts.height, dims, brick.kd, axis, cutoff, color),
        trace=sk.trace,
        trace_args=(values, origin, dims, box, brick.kd, axis, k, step, max_steps, cutoff, color),
        options=OPTIONS,
    )


def shading(opts, src):
    """What the one-process reference sums: ``(shade, args)`` for ``reference_image``, with
    the whole volume read as one brick."""
    values, origin, dims, box = volume_data.load_brick(src, MPI.COMM_SELF).device_args()
    return sk.reference_sample, (opts.width, opts.height, values, origin, dims, box, *optics(opts, src.dims))


def reference(opts, src, backend="cpu"):
    """The image one process makes without rafi, reading the whole volume (on ``backend``)."""
    return volume_data.reference(opts, src, shading, backend)


def main(argv=None):
    return volume_data.main(argv, parse, work, gamma=1.0)


if __name__ == "__main__":
    sys.exit(main())
