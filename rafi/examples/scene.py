"""Procedural scenes for the ray tracer, and their k-d decomposition into one domain per rank.

A scene is a ``g x g`` grid of unit cells on the ground; ``spheres`` puts a sphere of
random radius and colour in some cells, ``dense`` in every cell. Each sphere lies wholly
inside its cell's column, so a domain made of whole cells holds its geometry alone.
"""

import numpy as np

__all__ = ["SCENES", "make_scene", "decompose", "local_cells"]

SCENES = ("spheres", "dense")


def make_scene(name, g, seed):
    """Return the ``(g * g, 6)`` float64 cell table: radius (0: empty), cx, cz, albedo rgb."""
    if name not in SCENES:
        raise ValueError(f"unknown scene {name!r}; choose from {', '.join(SCENES)}")
    rng = np.random.default_rng(seed)
    cells = np.zeros((g * g, 6))
    occupied = np.ones(g * g, bool) if name == "dense" else rng.random(g * g) < 0.45
    radius = rng.uniform(0.18, 0.45, g * g)
    slack = 0.5 - radius - 0.01
    i, k = np.divmod(np.arange(g * g), g)
    cells[:, 0] = np.where(occupied, radius, 0.0)
    cells[:, 1] = i + 0.5 + rng.uniform(-1, 1, g * g) * slack
    cells[:, 2] = k + 0.5 + rng.uniform(-1, 1, g * g) * slack
    cells[:, 3:6] = rng.uniform(0.25, 0.9, (g * g, 3))
    return cells


def decompose(cells, g, size):
    """Split the grid into ``size`` rectangles of whole cells, balanced by sphere count.

    Recursive bisection (a k-d split): the longer side is cut where the spheres on each
    side are in proportion to the ranks each side gets.

    Returns:
        ``(domains, owner)``: ``domains[r] = (i0, i1, k0, k1)``; ``owner[i * g + k]`` the rank of a cell.
    """
    weight = (cells[:, 0] > 0).reshape(g, g).astype(float) + 1e-3  # empty cells weigh a little
    domains = [None] * size

    def split(i0, i1, k0, k1, first, count):
        if count == 1:
            domains[first] = (i0, i1, k0, k1)
            return
        left = count // 2
        along_i = (i1 - i0) >= (k1 - k0)
        block = weight[i0:i1, k0:k1]
        line = block.sum(axis=1 if along_i else 0)
        target = line.sum() * left / count
        cut = int(np.clip(np.searchsorted(np.cumsum(line), target) + 1, 1, len(line) - 1))
        if along_i:
            split(i0, i0 + cut, k0, k1, first, left)
            split(i0 + cut, i1, k0, k1, first + left, count - left)
        else:
            split(i0, i1, k0, k0 + cut, first, left)
            split(i0, i1, k0 + cut, k1, first + left, count - left)

    if size > g * g:
        raise ValueError(f"{size} ranks but only {g * g} cells; use a larger --grid")
    split(0, g, 0, g, 0, size)
    owner = np.zeros(g * g, np.int32)
    for rank, (i0, i1, k0, k1) in enumerate(domains):
        owner.reshape(g, g)[i0:i1, k0:k1] = rank
    return domains, owner


def local_cells(cells, g, domain):
    """The rows of ``cells`` inside ``domain``, in the order kernels/raytrace.py indexes them."""
    i0, i1, k0, k1 = domain
    return np.ascontiguousarray(cells.reshape(g, g, -1)[i0:i1, k0:k1].reshape(-1, cells.shape[1]))
