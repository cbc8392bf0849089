"""Data-parallel volume path tracer: each rank holds one brick of the volume; rays are forwarded by rafi.

    mpirun -n 4 python -m rafi.examples.volume --output v.png
    mpirun -n 4 python -m rafi.examples.volume --volume F.raw --dims X Y Z --dtype uint8 --output v.png
    mpirun -n 4 python -m rafi.examples.volume --volume F.h5:/path --output v.png

Each rank reads only its brick (rafi/examples/volume_data.py). Camera rays are delta
tracked through the bricks with a global majorant and scatter once toward a directional
light, whose shadow rays are ratio tracked (kernels/volume_render.py); a ray whose next
tentative point lies in another brick is forwarded to that brick's owner with its whole
state, and pixel samples are summed at the pixel's owner by a ``rafi.Reducer``. The
transfer function maps a value ``v`` in [0, 1] to a colour (``--colormap``) and an
extinction ``density * clip((v - threshold) / (1 - threshold), 0, 1)``. The image does not
depend on the number of ranks (random numbers are keyed by pixel, sample and a counter
the ray carries).
"""

import sys

import numpy as np
from mpi4py import MPI

from rafi.kernels import volume_render as vr

from . import render_loop, volume_data
from ._cli import Parser, integer, real

COLORMAPS = {  # control points at evenly spaced values
    "viridis": [(0.267, 0.005, 0.329), (0.229, 0.322, 0.546), (0.128, 0.567, 0.551), (0.369, 0.789, 0.383),
                (0.993, 0.906, 0.144)],
    "coolwarm": [(0.23, 0.299, 0.754), (0.865, 0.865, 0.865), (0.706, 0.016, 0.15)],
}  # fmt: skip
OPTIONS = (
    "width",
    "height",
    "samples",
    "seed",
    "volume",
    "dims",
    "dtype",
    "density",
    "threshold",
    "colormap",
    "g",
)


def parse(argv=None, comm=None):
    """The options and the volume's ``Source``, checked: a usage error exits every rank of
    ``comm`` (default ``MPI.COMM_WORLD``), rank 0 says why."""
    p = Parser("rafi.examples.volume", __doc__, comm if comm is not None else MPI.COMM_WORLD)
    render_loop.add_options(p, samples=8)
    p.add_argument("--seed", type=integer(0, 2**63 - 1), default=1, help="of every path's random numbers")
    volume_data.add_options(p)
    dense = "extinction per cell at full opacity"
    p.add_argument("--density", type=real(above=0), default=4.0, help=dense)
    clear = "values up to this one are transparent"
    p.add_argument("--threshold", type=real(low=0, below=1), default=0.5, help=clear)
    p.add_argument("--colormap", default="viridis", choices=sorted(COLORMAPS), help="colour of a value")
    hg = "Henyey-Greenstein anisotropy of scattering (0: isotropic)"
    p.add_argument("--g", type=real(above=-1, below=1), default=0.0, help=hg)
    return volume_data.parse(p, argv, OPTIONS)


def transfer_function(colormap, threshold, entries=64):
    """The table kernels/volume_render.py interpolates: ``(entries, 4)`` rgb and opacity."""
    v = np.linspace(0.0, 1.0, entries)
    points = np.array(COLORMAPS[colormap])
    at = np.linspace(0.0, 1.0, len(points))
    rgb = [np.interp(v, at, points[:, c]) for c in range(3)]
    return np.stack([*rgb, np.clip((v - threshold) / (1.0 - threshold), 0.0, 1.0)], axis=1)


def medium(opts):
    """The transfer function table and the global majorant (no value is denser)."""
    tf = transfer_function(opts.colormap, opts.threshold)
    return tf, opts.density * tf[:, 3].max()


def work(opts, brick):
    """What this rank traces: its brick, the camera and trace kernels."""
    values, origin, dims, box = brick.device_args()
    tf, mu = medium(opts)
    return render_loop.Work(
        item=vr.Ray,
        capacity=opts.width * opts.height + 64,  # a pixel has one ray in flight
        camera=vr.camera,
        camera_args=(opts.width, opts.height, opts.seed, dims, brick.kd, mu),
        trace=vr.trace,
        trace_args=(
            values,
            origin,
            dims,
            box,
            brick.kd,
            tf,
            opts.seed,
            opts.density,
            mu,
            opts.g,
            np.zeros(1, np.int64),
        ),
        options=OPTIONS,
        counter=10,  # trace counts the shadow rays there
    )


def shading(opts, src):
    """What the one-process reference sums: ``(shade, args)`` for ``reference_image``, with
    the whole volume read as one brick."""
    values, origin, dims, box = volume_data.load_brick(src, MPI.COMM_SELF).device_args()
    tf, mu = medium(opts)
    args = (opts.width, opts.height, opts.seed, values, origin, dims, box, tf, opts.density, mu, opts.g)
    return vr.reference_sample, args


def reference(opts, src, backend="cpu"):
    """The image one process renders without rafi, reading the whole volume (on ``backend``)."""
    return volume_data.reference(opts, src, shading, backend)


def main(argv=None):
    return volume_data.main(argv, parse, work)


if __name__ == "__main__":
    sys.exit(main())
