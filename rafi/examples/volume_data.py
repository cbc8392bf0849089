"""A bricked distributed volume: one brick of cells per rank, each read alone, with ghosts.

The volume is ``X * Y * Z`` cells; cell ``(i, j, k)`` covers ``[i, i+1) x [j, j+1) x [k, k+1)``
and its value sits at the centre. ``decompose`` splits the cells into one brick per rank
(a balanced k-d split: the longest axis of a box is cut so that each side's cells are in
proportion to the ranks it gets, recursively, for any rank count) and returns the k-d
tree that kernels/volume.py walks to find a point's owner. Each rank reads only its brick
plus a ghost layer of one cell (what trilinear interpolation and its gradient need at
the brick's faces; at the volume's faces the edge cell is repeated) from:

- a ``.raw`` file in the Open SciVis layout (x fastest, no header; ``--dims X Y Z
  --dtype uint8|uint16|float32``, little-endian), memory-mapped, so only the brick's
  pages are read;
- an HDF5 dataset ``--volume file.h5:/path`` of shape ``(Z, Y, X)`` (x fastest), of
  which only the brick's hyperslab is read;
- by default, the Marschner-Lobb test signal (Marschner and Lobb 1994, f_M = 6,
  alpha = 0.25, on [-1, 1]^3 mapped onto the cells, its axis along y; ``--dims`` sets
  its size), evaluated per brick at the cells' centres.

Values are normalized to [0, 1] by the volume's minimum and maximum (an Allreduce of the
bricks'), so every rank computes every value it holds exactly as one process would.
"""

import math
import os
from typing import NamedTuple

import numpy as np
from mpi4py import MPI

from rafi.kernels.reference import reference_image

from . import render_loop
from ._cli import input_file, integer

__all__ = [
    "DTYPES",
    "Source",
    "Brick",
    "add_options",
    "parse",
    "source",
    "decompose",
    "read_cells",
    "marschner_lobb",
    "read_ghosted",
    "load_brick",
    "describe",
    "render",
    "report",
]

DTYPES = ("uint8", "uint16", "float32")
PROCEDURAL_DIMS = (48, 48, 48)


class Source(NamedTuple):
    """Where the cells come from: ``kind`` is ``raw``, ``h5`` or ``procedural``."""

    kind: str
    path: str
    dataset: str
    dims: tuple  # (X, Y, Z)
    dtype: str


class Brick(NamedTuple):
    """This rank's cells ``[lo, hi)`` (x, y, z) with a ghost layer, normalized to [0, 1]."""

    values: np.ndarray  # float32 (hi - lo + 2) reversed: indexed [z, y, x]; [0, 0, 0] is cell lo - 1
    lo: tuple
    hi: tuple
    dims: tuple
    kd: np.ndarray  # the k-d tree of all bricks (see decompose)

    def device_args(self):
        """``(values, origin, dims, box)``: what kernels/volume.py's functions take.

        ``box`` (2, 3) bounds the points this brick owns: ``lo <= p < hi``, open to infinity
        at the volume's faces, so the owner of any point (inside or rounding just outside
        the volume) agrees with the k-d tree.
        """
        lo, hi, dims = (np.array(v, np.int64) for v in (self.lo, self.hi, self.dims))
        box = np.array([np.where(lo == 0, -np.inf, lo), np.where(hi == dims, np.inf, hi)], np.float64)
        return self.values, lo - 1, dims, box


def add_options(p):
    """Add ``--volume --dims --dtype`` to the parser ``p``."""
    p.add_argument(
        "--volume",
        help="F.raw (with --dims and --dtype) or F.h5:/dataset; without it, the Marschner-Lobb signal",
    )
    dims = f"cells per axis (of a .raw file; of the signal: default {' '.join(map(str, PROCEDURAL_DIMS))})"
    p.add_argument("--dims", type=integer(1), nargs=3, metavar=("X", "Y", "Z"), help=dims)
    p.add_argument("--dtype", choices=DTYPES, help="of a .raw file's values (little-endian)")


def parse(p, argv, options):
    """Parse ``argv`` with an image program's parser ``p`` (``render_loop.add_options`` and
    ``add_options`` on it) and check every option (collective; ``p.error`` exits every rank):
    ``(opts, Source)``. ``options``: those that make the image (``Work.options``)."""
    opts = p.parse_args(argv)
    src = source(p, opts)
    render_loop.check_options(p, opts, options)
    return opts, src


def source(p, opts, size=None):
    """The ``Source`` that ``opts`` name, checked on every rank of ``p.comm`` (collective):
    ``p.error`` exits every rank if options do not fit, the file is missing, unreadable or
    of another size or shape, or the volume has fewer cells than the ``size`` ranks
    (default: ``p.ranks``)."""
    dims = tuple(opts.dims) if opts.dims else None
    size = p.ranks if size is None else size
    if not opts.volume:
        if opts.dtype:
            p.error("--dtype is for a .raw --volume")
        src = Source("procedural", "", "", dims or PROCEDURAL_DIMS, "float64")
    else:
        found = []  # this rank's Source, if its file is fine
        p.agree(lambda: _file_problem(opts.volume, dims, opts.dtype, found))
        src = found[0]
    if math.prod(src.dims) < size:
        shown = " x ".join(map(str, src.dims))
        p.error(
            f"the volume has {shown} cells, fewer than the {size} ranks (each holds a brick of at "
            "least one): use larger --dims, or fewer ranks"
        )
    return src


HDF5 = (".h5", ".hdf5", ".he5")


def _file_problem(volume, dims, dtype, found):
    """Why ``--volume volume`` cannot be read here, or None (its ``Source`` appended to ``found``)."""
    path, colon, dataset = volume.rpartition(":") if ":" in volume else (volume, "", "")
    if colon and os.path.splitext(path)[1].lower() in HDF5:
        return _h5_problem(volume, path, dataset, dims, dtype, found)
    if os.path.splitext(volume)[1].lower() in HDF5:
        missing = input_file("--volume", volume)
        if missing:
            return f"{missing} (an HDF5 volume is named with its dataset: --volume {volume}:/path/to/dataset)"
        return (
            f"--volume {volume}: an HDF5 volume is named with its dataset, as --volume "
            f"{volume}:/path/to/dataset{_datasets(volume)}"
        )
    problem = input_file("--volume", volume)
    if problem:
        return problem
    if dims is None or dtype is None:
        return f"--volume {volume}: a .raw volume needs --dims X Y Z and --dtype {'|'.join(DTYPES)}"
    expected = math.prod(dims) * np.dtype(dtype).itemsize
    size = os.path.getsize(volume)
    if size != expected:
        return (
            f"--volume {volume} has {size:,} bytes; --dims {' '.join(map(str, dims))} --dtype {dtype} "
            f"needs {expected:,}"
        )
    found.append(Source("raw", volume, "", dims, dtype))
    return None


def _h5_problem(volume, path, dataset, dims, dtype, found):
    """``_file_problem`` of an HDF5 ``dataset`` in the file ``path``."""
    problem = input_file("--volume", path)
    if problem:
        return problem
    if dtype:
        return f"--volume {volume}: --dtype is for a .raw volume (an HDF5 dataset has its own)"
    import h5py

    try:
        with h5py.File(path, "r") as f:
            node = f.get(dataset)
            shape = node.shape if isinstance(node, h5py.Dataset) else None
    except OSError as exc:
        return f"--volume {volume}: {path} cannot be read as HDF5 ({exc})"
    if shape is None:
        return f"--volume {volume}: {path} has no dataset {dataset}{_datasets(path)}"
    if len(shape) != 3 or (dims is not None and dims != shape[::-1]):
        return f"--volume {volume} has shape {shape} (Z, Y, X); --dims, if given, must be X Y Z of it"
    found.append(Source("h5", path, dataset, shape[::-1], ""))
    return None


def _datasets(path):
    """`` (its 3-D datasets: /a, /b)``, or "" if it has none or cannot be read."""
    try:
        import h5py

        names = []
        with h5py.File(path, "r") as f:
            f.visititems(
                lambda name, node: names.append("/" + name) if getattr(node, "ndim", 0) == 3 else None
            )
    except (OSError, ImportError):
        return ""
    return f" (its 3-D datasets: {', '.join(names[:8])}{', ...' if len(names) > 8 else ''})" if names else ""


def decompose(dims, size):
    """Split ``dims`` cells into ``size`` bricks of at least one cell (a balanced k-d split).

    Returns:
        ``(bricks, kd)``: ``bricks[r] = (lo, hi)``, tuples (x, y, z) of rank ``r``'s cells
        ``[lo, hi)``; ``kd`` an int64 ``(nodes, 4)`` table, node 0 the root: an inner node
        ``(axis, cut, left, right)`` sends a point with ``p[axis] < cut`` to node ``left``,
        else to ``right``; a leaf is ``(-1, rank, 0, 0)``.

    Raises:
        ValueError: fewer cells than ranks.
    """
    if math.prod(dims) < size:
        raise ValueError(f"{size} ranks but only {math.prod(dims)} cells; use larger --dims")
    bricks, nodes = [None] * size, []

    def split(lo, hi, first, count):
        node = len(nodes)
        nodes.append([-1, first, 0, 0])
        if count == 1:
            bricks[first] = (tuple(lo), tuple(hi))
            return node
        extent = [h - low for low, h in zip(lo, hi)]
        axis = int(np.argmax(extent))
        units = min(max(round(extent[axis] * (count // 2) / count), 1), extent[axis] - 1)
        slab = math.prod(extent) // extent[axis]  # cells per unit of the cut axis
        left = min(max(count // 2, count - (extent[axis] - units) * slab), units * slab)  # a cell each
        cut = lo[axis] + units
        left_hi, right_lo = list(hi), list(lo)
        left_hi[axis] = right_lo[axis] = cut
        nodes[node] = [
            axis,
            cut,
            split(lo, left_hi, first, left),
            split(right_lo, hi, first + left, count - left),
        ]
        return node

    split([0, 0, 0], list(dims), 0, size)
    return bricks, np.array(nodes, np.int64)


def read_cells(src, lo, hi):
    """The raw values of cells ``[lo, hi)`` (x, y, z) of ``src``: float64 indexed [z, y, x]."""
    (x0, y0, z0), (x1, y1, z1) = lo, hi
    if src.kind == "raw":
        shape = src.dims[::-1]
        cells = np.memmap(src.path, dtype=np.dtype(src.dtype).newbyteorder("<"), mode="r", shape=shape)
        return np.array(cells[z0:z1, y0:y1, x0:x1], np.float64)
    if src.kind == "h5":
        import h5py

        with h5py.File(src.path, "r") as f:
            return np.array(f[src.dataset][z0:z1, y0:y1, x0:x1], np.float64)
    return marschner_lobb(lo, hi, src.dims)


def marschner_lobb(lo, hi, dims, f_m=6.0, alpha=0.25):
    """The Marschner-Lobb signal at the centres of cells ``[lo, hi)``: float64 [z, y, x], in [0, 1].

    ``rho = (1 - sin(pi a / 2) + alpha (1 + cos(2 pi f_m cos(pi r / 2)))) / (2 (1 + alpha))``
    on [-1, 1]^3, its axis ``a`` along y (up in the examples' images), ``r = sqrt(x^2 + z^2)``.
    Its sines and cosines go through ``math``, one call per value, so a cell's value does
    not depend on which brick evaluates it (numpy's vectorized loops may round differently
    from one element to the next).
    """

    def centres(axis):
        return [(c + 0.5) / dims[axis] * 2.0 - 1.0 for c in range(lo[axis], hi[axis])]

    xs, ys, zs = centres(0), centres(1), centres(2)
    ring = np.array(
        [[math.cos(2 * math.pi * f_m * math.cos(math.pi * math.hypot(x, z) / 2)) for x in xs] for z in zs]
    )
    axial = np.array([1.0 - math.sin(math.pi * y / 2) for y in ys])
    return (axial[None, :, None] + alpha * (1.0 + ring[:, None, :])) / (2.0 * (1.0 + alpha))


def read_ghosted(src, lo, hi):
    """The raw values of cells ``[lo - 1, hi + 1)`` of ``src``, the edge cells repeated
    outside the volume: float64 indexed [z, y, x]. Reads no other cell."""
    first = [max(v - 1, 0) for v in lo]  # the ghost layer, where the volume has one
    last = [min(v + 1, n) for v, n in zip(hi, src.dims)]
    pad = [(f - (a - 1), (b + 1) - t) for f, a, b, t in zip(first, lo, hi, last)][::-1]  # [z, y, x]
    return np.pad(read_cells(src, first, last), pad, mode="edge")


def load_brick(src, comm):
    """Read this rank's brick of ``src`` with its ghost layer and normalize it (collective).

    With ``MPI.COMM_SELF`` the one brick is the whole volume: what a one-process reference uses.
    """
    bricks, kd = decompose(src.dims, comm.Get_size())
    lo, hi = bricks[comm.Get_rank()]
    cells = read_ghosted(src, lo, hi)
    low = comm.allreduce(float(cells.min()), op=MPI.MIN)
    high = comm.allreduce(float(cells.max()), op=MPI.MAX)
    values = (cells - low) / (high - low) if high > low else np.zeros_like(cells)
    return Brick(values.astype(np.float32), lo, hi, tuple(src.dims), kd)


def describe(comm, brick):
    """Every rank's brick and the bytes it holds, gathered on rank 0 (collective; None elsewhere)."""
    mine = {"lo": list(brick.lo), "hi": list(brick.hi), "resident_bytes": int(brick.values.nbytes)}
    return comm.gather(mine, root=0)


def render(opts, src, work, comm):
    """Load this rank's brick of ``src`` and render the ``render_loop.Work`` that
    ``work(opts, brick)`` makes (collective).

    Returns:
        ``(image, info)`` on rank 0, ``(None, info)`` elsewhere; ``info`` also has
        ``bricks`` (rank 0: each rank's cells and resident bytes, ghosts included) and
        ``volume_bytes`` (the whole volume's cells, as the bricks store them).
    """
    brick = load_brick(src, comm)
    bricks = describe(comm, brick)
    image, info = render_loop.render(opts, comm, work(opts, brick))
    return image, dict(info, bricks=bricks, volume_bytes=math.prod(brick.dims) * brick.values.itemsize)


def report(opts, image, info, gamma=2.2):
    """On rank 0: print what every rank held, then ``render_loop.report``."""
    for rank, b in enumerate(info["bricks"]):
        cells = " x ".join(f"[{lo}, {hi})" for lo, hi in zip(b["lo"], b["hi"]))
        print(f"rank {rank}: cells {cells} and ghosts, {b['resident_bytes']:,} bytes resident")
    print(f"the whole volume would be {info['volume_bytes']:,} bytes")
    render_loop.report(opts, image, info, gamma)


def reference(opts, src, shading, backend="cpu"):
    """The image one process makes without rafi, reading the whole volume (on ``backend``):
    ``shading(opts, src)`` gives the sample function and its arguments."""
    shade, args = shading(opts, src)
    image = reference_image(shade, opts.width, opts.height, opts.samples, *args, backend=backend)
    return image / opts.samples


def main(argv, parse, work, gamma=2.2):
    """A volume program's ``main``: parse, render on ``MPI.COMM_WORLD``, report on rank 0."""
    opts, src = parse(argv)
    image, info = render(opts, src, work, MPI.COMM_WORLD)
    if image is not None:
        report(opts, image, info, gamma)
    return 0
