"""Device code of Monte Carlo particle transport (rafi/examples/transport.py).

Particles fly through a ``g x g x g`` grid of cells over the unit cube, each cell with an
absorption and a scattering cross section (per unit length). The grid is split into slabs
of whole cells along x, one per rank; a rank holds only its slab's cross sections. Analog
transport: in each cell a particle samples the distance to its next collision (the
exponential is memoryless, so a new sample at every cell face is exact); a collision
absorbs it (tallied in its cell) with probability sigma_a / sigma_t, else scatters it
isotropically; a particle that leaves the cube has leaked; one that enters another
rank's slab is forwarded there with its whole state. Random numbers are
``device.random(seed, particle id, counter)``, the counter carried by the particle, so a
particle draws the same numbers on whichever rank it is: tallies do not depend on the
rank count. ``reference`` runs the same walk in one process, without rafi.
"""

import math

import numpy as np

from rafi import device
from rafi._kernel import kernel
from rafi._targets import func

__all__ = ["Particle", "ABSORBED", "LEAKED", "MOVED", "owner_of", "walk", "source", "transport", "reference"]

Particle = np.dtype(
    [
        ("p", "f8", (3,)),  # position in the unit cube
        ("d", "f8", (3,)),  # unit direction
        ("id", "i8"),  # the source particle's number: its random stream
        ("cell", "i4", (3,)),  # the cell it is in
        ("draws", "i4"),  # random numbers drawn so far: the stream's counter
    ],
    align=True,
)
ABSORBED, LEAKED, MOVED = 0, 1, 2  # how a walk on one rank ends
SOURCE_CENTER, SOURCE_HALF = (0.2, 0.5, 0.5), 0.05  # an isotropic source filling a small box
STARTING = 5  # random numbers a source particle's start takes
_HUGE = 1e300


@func
def owner_of(x, g, size):
    """The rank whose slab holds cell column ``x``."""
    return x * size // g


@func
def isotropic(u1, u2):
    """A unit direction, uniform on the sphere."""
    z = 1.0 - 2.0 * u1
    r = math.sqrt(max(0.0, 1.0 - z * z))
    phi = 2.0 * math.pi * u2
    return r * math.cos(phi), r * math.sin(phi), z


@func
def _to_face(p, d, cell, g):
    """Distance along ``d`` to the first face of ``cell``, and the axis and step it crosses."""
    best, axis, step = _HUGE, 0, 0
    for a in range(3):
        if d[a] > 0.0:
            t = ((cell[a] + 1) / g - p[a]) / d[a]
            s = 1
        elif d[a] < 0.0:
            t = (cell[a] / g - p[a]) / d[a]
            s = -1
        else:
            continue
        if t < best:
            best, axis, step = t, a, s
    return max(best, 0.0), axis, step


@func
def walk(p, d, cell, draws, pid, mat, lo, hi, g, seed):
    """Move a particle until it is absorbed, leaks, or enters a cell column outside
    ``[lo, hi)``; ``p``, ``d``, ``cell`` (arrays) are updated in place; ``mat[x - lo, y,
    z]`` holds (sigma_a, sigma_s). Returns ``(how, draws)``."""
    while True:
        sa = mat[cell[0] - lo, cell[1], cell[2], 0]
        ss = mat[cell[0] - lo, cell[1], cell[2], 1]
        st = sa + ss
        u = device.random(seed, pid, draws)
        draws += 1
        s = -math.log(1.0 - u) / st if st > 0.0 else _HUGE
        face, axis, step = _to_face(p, d, cell, g)
        if s < face:  # a collision in this cell
            for a in range(3):
                p[a] += s * d[a]
            u = device.random(seed, pid, draws)
            draws += 1
            if u * st < sa:
                return ABSORBED, draws
            d0, d1, d2 = isotropic(device.random(seed, pid, draws), device.random(seed, pid, draws + 1))
            draws += 2
            d[0], d[1], d[2] = d0, d1, d2
            continue
        for a in range(3):
            p[a] += face * d[a]
        cell[axis] += step
        if cell[axis] < 0 or cell[axis] >= g:
            return LEAKED, draws
        if cell[0] < lo or cell[0] >= hi:
            return MOVED, draws


@func
def start(pid, seed):
    """Where source particle ``pid`` starts and where it flies: its first ``STARTING`` draws."""
    px = SOURCE_CENTER[0] + SOURCE_HALF * (2.0 * device.random(seed, pid, 0) - 1.0)
    py = SOURCE_CENTER[1] + SOURCE_HALF * (2.0 * device.random(seed, pid, 1) - 1.0)
    pz = SOURCE_CENTER[2] + SOURCE_HALF * (2.0 * device.random(seed, pid, 2) - 1.0)
    dx, dy, dz = isotropic(device.random(seed, pid, 3), device.random(seed, pid, 4))
    return px, py, pz, dx, dy, dz


@func
def put(items, slot, pid, p, d, cell, draws):
    """Fill ``items[slot]`` with particle ``pid`` at ``p`` flying along ``d`` in ``cell`` (triples)."""
    q = items[slot]
    q.p[0], q.p[1], q.p[2] = p
    q.d[0], q.d[1], q.d[2] = d
    q.cell[0], q.cell[1], q.cell[2] = cell
    q.id = pid
    q.draws = draws


@kernel
def source(i, outbox, first, stride, seed, g, size):
    """Emit source particle ``first + i * stride`` to the rank owning the cell it starts in."""
    pid = first + i * stride
    px, py, pz, dx, dy, dz = start(pid, seed)
    slot = device.push(outbox, owner_of(int(px * g), g, size))
    if slot >= 0:
        cell = (int(px * g), int(py * g), int(pz * g))
        put(outbox.items, slot, pid, (px, py, pz), (dx, dy, dz), cell, STARTING)


@kernel
def transport(i, inbox, outbox, tally, counts, mat, lo, hi, g, seed, size):
    """Walk inbox particle ``i`` through this rank's slab: tally its absorption (a
    ``rafi.Reducer`` over cells), count a leak (``counts[1]``), or forward it on."""
    q = inbox[i]
    how, draws = walk(q.p, q.d, q.cell, q.draws, q.id, mat, lo, hi, g, seed)
    if how == ABSORBED:
        device.contribute(tally, (q.cell[0] * g + q.cell[1]) * g + q.cell[2], 1.0)
        device.atomic_add(counts, 0, 1)
    elif how == LEAKED:
        device.atomic_add(counts, 1, 1)
    else:
        slot = device.push(outbox, owner_of(q.cell[0], g, size))
        if slot >= 0:
            p, d, c = q.p, q.d, q.cell
            put(outbox.items, slot, q.id, (p[0], p[1], p[2]), (d[0], d[1], d[2]), (c[0], c[1], c[2]), draws)


@kernel
def _reference_walk(i, scratch, tally, leaked, mat, g, seed):
    """Source particle ``i`` from its start to its end, the whole grid in this process:
    ``scratch[i]`` holds it on its way; its absorption goes to ``tally``, a leak to ``leaked[0]``."""
    px, py, pz, dx, dy, dz = start(i, seed)
    put(scratch, i, i, (px, py, pz), (dx, dy, dz), (int(px * g), int(py * g), int(pz * g)), STARTING)
    q = scratch[i]
    how, _ = walk(q.p, q.d, q.cell, q.draws, q.id, mat, 0, g, g, seed)
    if how == ABSORBED:
        device.atomic_add(tally, (q.cell[0] * g + q.cell[1]) * g + q.cell[2], 1)
    else:
        device.atomic_add(leaked, 0, 1)


def reference(particles, seed, mat, g, backend="cpu"):
    """The same transport in one process without rafi: ``(tally over cells, leaked)``.

    One thread per source particle walks it through the whole grid (``mat``, every cell's
    cross sections) and tallies by atomics: a compiled loop on the cpu ``backend``, one
    CUDA kernel on "cuda" (the simulator under ``NUMBA_ENABLE_CUDASIM=1``).
    """
    tally, leaked = np.zeros(g**3, np.int64), np.zeros(1, np.int64)
    if backend == "cpu":
        _reference_walk.launch_cpu(particles, np.empty(particles, Particle), tally, leaked, mat, g, seed)
        return tally, int(leaked[0])
    from numba import cuda

    from rafi.kernels import cuda_reference

    tally, leaked, mat = cuda_reference.to_device((tally, leaked, mat))
    scratch = cuda.device_array(particles, Particle)
    cuda_reference.launch(_reference_walk, particles, scratch, tally, leaked, mat, g, seed)
    return tally.copy_to_host(), int(leaked.copy_to_host()[0])
