"""Device code of the bricked volume (rafi/examples/volume_data.py): sampling and ownership.

Points are in cell units: cell ``(i, j, k)`` covers ``[i, i+1) x [j, j+1) x [k, k+1)``, its
value at the centre. A brick's ``values`` are indexed ``[z, y, x]`` from the cell
``origin`` (its first cell minus the ghost layer), ``dims`` is the whole volume's size,
``box`` (2, 3) the points the brick owns and ``kd`` the k-d tree of all bricks. A value
depends only on the point and the cells around it, never on which brick holds them, so a
ray computes the same numbers on whichever rank it is.
"""

import math

import numpy as np

from rafi._targets import func

__all__ = ["trilinear", "owner_of", "inside", "box_span"]


@func
def trilinear(values, origin, dims, x, y, z):
    """The trilinear interpolant of the cell values at ``(x, y, z)`` and its gradient.

    The point is clamped to the volume first, so a point that rounding put just outside
    still reads cells of the ghost layer. Cells are read as float64 (``float()`` of a
    float32 stays float32 in numba). Returns ``(value, d/dx, d/dy, d/dz)``.
    """
    u = min(max(x, 0.0), float(dims[0])) - 0.5
    v = min(max(y, 0.0), float(dims[1])) - 0.5
    w = min(max(z, 0.0), float(dims[2])) - 0.5
    i, j, k = int(math.floor(u)), int(math.floor(v)), int(math.floor(w))  # CUDA's floor is a float
    fx, fy, fz = u - i, v - j, w - k
    i, j, k = i - origin[0], j - origin[1], k - origin[2]
    c000, c100 = np.float64(values[k, j, i]), np.float64(values[k, j, i + 1])
    c010, c110 = np.float64(values[k, j + 1, i]), np.float64(values[k, j + 1, i + 1])
    c001, c101 = np.float64(values[k + 1, j, i]), np.float64(values[k + 1, j, i + 1])
    c011, c111 = np.float64(values[k + 1, j + 1, i]), np.float64(values[k + 1, j + 1, i + 1])
    c00, c10 = c000 + fx * (c100 - c000), c010 + fx * (c110 - c010)  # along x
    c01, c11 = c001 + fx * (c101 - c001), c011 + fx * (c111 - c011)
    c0, c1 = c00 + fy * (c10 - c00), c01 + fy * (c11 - c01)  # along y
    dx0 = (c100 - c000) + fy * ((c110 - c010) - (c100 - c000))
    dx1 = (c101 - c001) + fy * ((c111 - c011) - (c101 - c001))
    return (
        c0 + fz * (c1 - c0),
        dx0 + fz * (dx1 - dx0),
        (c10 - c00) + fz * ((c11 - c01) - (c10 - c00)),
        c1 - c0,
    )


@func
def owner_of(kd, x, y, z):
    """The rank whose brick holds the point: a walk down the k-d tree."""
    node = 0
    while kd[node, 0] >= 0:
        axis = kd[node, 0]
        p = x if axis == 0 else (y if axis == 1 else z)
        node = kd[node, 2] if p < kd[node, 1] else kd[node, 3]
    return kd[node, 1]


@func
def inside(box, x, y, z):
    """True when the brick with ``box`` owns the point (``owner_of`` would name it)."""
    return (
        box[0, 0] <= x < box[1, 0]
        and box[0, 1] <= y < box[1, 1]
        and box[0, 2] <= z < box[1, 2]
    )  # fmt: skip


@func
def box_span(ox, oy, oz, dx, dy, dz, dims):
    """The parameters ``(t0, t1)`` where the ray is inside the volume; ``t0 >= t1`` if never."""
    t0, t1 = 0.0, 1e300
    for a in range(3):
        o = ox if a == 0 else (oy if a == 1 else oz)
        d = dx if a == 0 else (dy if a == 1 else dz)
        if d != 0.0:
            near, far = (0.0 - o) / d, (dims[a] - o) / d
            t0, t1 = max(t0, min(near, far)), min(t1, max(near, far))
        elif o < 0.0 or o > dims[a]:
            return 0.0, -1.0
    return t0, t1
