"""Device code of the data-parallel ray tracer (rafi/examples/raytrace.py).

The scene is a G x G grid of unit cells on the ground plane y = 0, each holding at most
one sphere that lies wholly inside the cell's column. A rank owns a rectangle of cells
and traverses rays through it with a 2-d DDA (the grid is the acceleration structure);
a ray that leaves the rectangle is forwarded to the owner of the cell it enters.
Random numbers come from ``device.random``, one stream per (pixel, sample), and a
forwarded ray carries the whole state of its walk (its start ``t0``, the cell it enters,
the parameters where it leaves that cell along x and z), so its owner continues exactly
the walk one process would make: images do not depend on the number of ranks beyond summation order.
``reference_render`` is the same tracer in one process, no rafi.
"""

import math

import numba
import numpy as np

from rafi import device
from rafi._kernel import kernel
from rafi._targets import func

__all__ = ["Ray", "PATH", "SHADOW", "camera", "trace", "reference_render", "walk_start", "trace_domain"]

Ray = np.dtype(
    [
        ("o", "f8", (3,)),
        ("d", "f8", (3,)),
        ("t0", "f8"),  # where the ray starts: only hits beyond t0 + EPS count
        ("next", "f8", (2,)),  # where the walk leaves its cell along x and along z
        ("c", "f8", (3,)),  # path throughput, or the radiance a shadow ray carries
        ("cell", "i4", (2,)),  # the grid cell (i, k) the walk is in
        ("pixel", "i4"),
        ("sample", "i4"),
        ("depth", "i4"),
        ("kind", "i4"),
    ],
    align=True,
)
PATH, SHADOW = 0, 1
NONE, SPHERE, GROUND = 0, 1, 2
EPS = 1e-6
LIGHT = (-0.48, 0.8, -0.36)  # unit vector toward the light
LIGHT_POWER = 1.3


@func
def rand01(seed, pixel, sample, bounce, k):
    """The ``k``-th uniform number of a path's ``bounce``: ``device.random`` with one stream
    per (pixel, sample), so a ray draws the same numbers on whichever rank it is."""
    stream = int(pixel) * 1048576 + int(sample)  # at most 2**20 samples per pixel
    return device.random(seed, stream, int(bounce) * 4 + int(k))


@func
def camera_ray(pixel, sample, width, height, seed, g):
    """Origin and direction of the camera ray through a jittered point of ``pixel``."""
    px = pixel % width
    py = pixel // width
    u = (px + rand01(seed, pixel, sample, 0, 0)) / width * 2.0 - 1.0
    v = 1.0 - (py + rand01(seed, pixel, sample, 0, 1)) / height * 2.0
    aspect = width / height
    ox, oy, oz = 0.5 * g, 0.55 * g, -0.35 * g
    fx, fy, fz = 0.0, -0.52, 0.85  # forward, up = (0, cos, sin) of the tilt
    n = math.sqrt(fx * fx + fy * fy + fz * fz)
    fx, fy, fz = fx / n, fy / n, fz / n
    uy, uz = fz, -fy  # up: perpendicular to forward; right is +x
    scale = 0.45
    dx = fx + u * aspect * scale
    dy = fy + v * scale * uy
    dz = fz + v * scale * uz
    n = math.sqrt(dx * dx + dy * dy + dz * dz)
    return ox, oy, oz, dx / n, dy / n, dz / n


@func
def grid_entry(ox, oz, dx, dz, g):
    """Ray parameter where the ray enters the grid's footprint [0, g]^2, or -1 if never."""
    t_lo, t_hi = 0.0, 1e30
    if dx != 0.0:
        a, b = (0.0 - ox) / dx, (g - ox) / dx
        t_lo, t_hi = max(t_lo, min(a, b)), min(t_hi, max(a, b))
    elif ox < 0.0 or ox > g:
        return -1.0
    if dz != 0.0:
        a, b = (0.0 - oz) / dz, (g - oz) / dz
        t_lo, t_hi = max(t_lo, min(a, b)), min(t_hi, max(a, b))
    elif oz < 0.0 or oz > g:
        return -1.0
    if t_lo > t_hi:
        return -1.0
    return t_lo


@func
def cell_at(x, g):
    return min(max(int(math.floor(x)), 0), g - 1)


@func
def sphere_hit(ox, oy, oz, dx, dy, dz, cx, cy, cz, r, t_min):
    lx, ly, lz = ox - cx, oy - cy, oz - cz
    b = lx * dx + ly * dy + lz * dz
    c = lx * lx + ly * ly + lz * lz - r * r
    disc = b * b - c
    if disc < 0.0:
        return -1.0
    s = math.sqrt(disc)
    t = -b - s
    if t > t_min:
        return t
    t = -b + s
    if t > t_min:
        return t
    return -1.0


@func
def walk_start(ox, oz, dx, dz, t0, g):
    """Where the walk of a ray starting at ``t0`` begins: its cell ``(i, k)`` (inside the
    grid) and the parameters ``(t_next_i, t_next_k)`` where it leaves that cell."""
    x, z = ox + dx * (t0 + EPS), oz + dz * (t0 + EPS)
    i, k = cell_at(x, g), cell_at(z, g)
    inf = 1e30
    t_next_i = ((i + (1 if dx > 0.0 else 0)) - ox) / dx if dx != 0.0 else inf
    t_next_k = ((k + (1 if dz > 0.0 else 0)) - oz) / dz if dz != 0.0 else inf
    return i, k, t_next_i, t_next_k


@func
def trace_domain(ox, oy, oz, dx, dy, dz, t0, i, k, t_next_i, t_next_k, sph, i0, i1, k0, k1):
    """Walk the ray through cells [i0, i1) x [k0, k1) from cell ``(i, k)`` (a 2-d DDA),
    counting hits beyond ``t0 + EPS``.

    Returns ``(what, t, cell, i, k, t_next_i, t_next_k)``: what was hit (NONE, SPHERE,
    GROUND) at ``t`` in local ``cell``; else the cell ``(i, k)`` the walk moves into
    (outside the rectangle; ``i = -1`` when the ray can no longer hit anything) and where
    it leaves that one: a ray forwarded with these goes on exactly as it would have here.
    """
    inf = 1e30
    step_i = 1 if dx > 0.0 else -1
    step_k = 1 if dz > 0.0 else -1
    dt_i = abs(1.0 / dx) if dx != 0.0 else inf
    dt_k = abs(1.0 / dz) if dz != 0.0 else inf
    t_min = t0 + EPS
    while True:
        cell = (i - i0) * (k1 - k0) + (k - k0)
        best, what = inf, NONE
        r = sph[cell, 0]
        if r > 0.0:
            t = sphere_hit(ox, oy, oz, dx, dy, dz, sph[cell, 1], r, sph[cell, 2], r, t_min)
            if t > 0.0:
                best, what = t, SPHERE
        if dy < 0.0:
            t = -oy / dy
            if t > t_min and t < best:
                gx, gz = ox + dx * t, oz + dz * t
                if gx >= i and gx <= i + 1 and gz >= k and gz <= k + 1:
                    best, what = t, GROUND
        if what != NONE:
            return what, best, cell, i, k, t_next_i, t_next_k
        t_out = min(t_next_i, t_next_k)
        if dy >= 0.0 and oy + dy * t_out > 1.0:  # above every sphere and rising
            return NONE, 0.0, -1, -1, -1, t_next_i, t_next_k
        if t_next_i < t_next_k:
            i += step_i
            t_next_i += dt_i
        else:
            k += step_k
            t_next_k += dt_k
        if i < i0 or i >= i1 or k < k0 or k >= k1:
            return NONE, 0.0, -1, i, k, t_next_i, t_next_k


@func
def sky(dy):
    s = 0.5 + 0.5 * max(dy, 0.0)
    return 0.85 - 0.35 * s, 0.9 - 0.2 * s, 1.0


@func
def surface(what, px, py, pz, cell, sph):
    """Normal and albedo at a hit point."""
    if what == SPHERE:
        r = sph[cell, 0]
        return (
            (px - sph[cell, 1]) / r,
            (py - r) / r,
            (pz - sph[cell, 2]) / r,
            sph[cell, 3],
            sph[cell, 4],
            sph[cell, 5],
        )
    shade = 0.75 if (int(math.floor(px)) + int(math.floor(pz))) % 2 == 0 else 0.45
    return 0.0, 1.0, 0.0, shade, shade, shade


@func
def hit_frame(what, t, ox, oy, oz, dx, dy, dz, cell, sph):
    """At a hit: the point just off the surface, the normal, the albedo and cos(normal, light)."""
    px, py, pz = ox + dx * t, oy + dy * t, oz + dz * t
    nx, ny, nz, ar, ag, ab = surface(what, px, py, pz, cell, sph)
    cos_l = nx * LIGHT[0] + ny * LIGHT[1] + nz * LIGHT[2]
    return px + nx * 1e-5, py + ny * 1e-5, pz + nz * 1e-5, nx, ny, nz, ar, ag, ab, cos_l


@func
def bounce_dir(nx, ny, nz, u1, u2):
    """A cosine-weighted direction around the normal."""
    phi = 2.0 * math.pi * u1
    s = math.sqrt(u2)
    lx, ly, lz = math.cos(phi) * s, math.sin(phi) * s, math.sqrt(max(0.0, 1.0 - u2))
    if abs(nx) > 0.9:
        ax, ay, az = 0.0, 1.0, 0.0
    else:
        ax, ay, az = 1.0, 0.0, 0.0
    tx, ty, tz = ay * nz - az * ny, az * nx - ax * nz, ax * ny - ay * nx
    n = math.sqrt(tx * tx + ty * ty + tz * tz)
    tx, ty, tz = tx / n, ty / n, tz / n
    bx, by, bz = ny * tz - nz * ty, nz * tx - nx * tz, nx * ty - ny * tx
    return (
        lx * tx + ly * bx + lz * nx,
        lx * ty + ly * by + lz * ny,
        lx * tz + ly * bz + lz * nz,
    )


# fmt: off
@func
def put_ray(outbox, owner, g, ox, oy, oz, dx, dy, dz, t0, i, k, t_next_i, t_next_k,
            cr, cg, cb, pixel, sample, depth, kind):
    # fmt: on
    """Push one ray for the owner of cell ``(i, k)``, where its walk goes on; False when the
    outbox is full (forward() will say so)."""
    slot = device.push(outbox, owner[i * g + k])
    if slot < 0:
        return False
    ray = outbox.items[slot]
    ray.o[0], ray.o[1], ray.o[2] = ox, oy, oz
    ray.d[0], ray.d[1], ray.d[2] = dx, dy, dz
    ray.t0 = t0
    ray.cell[0], ray.cell[1] = i, k
    ray.next[0], ray.next[1] = t_next_i, t_next_k
    ray.c[0], ray.c[1], ray.c[2] = cr, cg, cb
    ray.pixel, ray.sample, ray.depth, ray.kind = pixel, sample, depth, kind
    return True


@func
def start_ray(outbox, owner, g, ox, oy, oz, dx, dy, dz, t0, cr, cg, cb, pixel, sample, depth, kind):
    """Push a new ray for the owner of the cell its walk starts in."""
    i, k, t_next_i, t_next_k = walk_start(ox, oz, dx, dz, t0, g)
    return put_ray(
        outbox, owner, g, ox, oy, oz, dx, dy, dz, t0, i, k, t_next_i, t_next_k,
        cr, cg, cb, pixel, sample, depth, kind,
    )  # fmt: skip


@func
def add_pixel(red, pixel, r, g, b):
    device.contribute(red, 3 * pixel, r)
    device.contribute(red, 3 * pixel + 1, g)
    device.contribute(red, 3 * pixel + 2, b)


@kernel
def camera(i, outbox, red, pixel0, sample, width, height, seed, g, owner):
    """Start the camera ray of pixel ``pixel0 + i`` in the first domain it enters."""
    pixel = pixel0 + i
    ox, oy, oz, dx, dy, dz = camera_ray(pixel, sample, width, height, seed, g)
    t = grid_entry(ox, oz, dx, dz, g)
    if t < 0.0:
        r, gg, b = sky(dy)
        add_pixel(red, pixel, r, gg, b)
        return
    start_ray(outbox, owner, g, ox, oy, oz, dx, dy, dz, t, 1.0, 1.0, 1.0, pixel, sample, 0, PATH)


@kernel
def trace(i, inbox, outbox, red, sph, dom, owner, g, seed, bounces, started):
    """Walk ray ``i`` of the inbox on through this rank's cells and act on what it meets;
    count each ray it starts (a shadow ray, a bounce) in ``started[0]``: with the camera
    rays, the rays traced, which do not depend on the rank count (a forwarded ray is not
    a new one)."""
    ray = inbox[i]
    ox, oy, oz = ray.o[0], ray.o[1], ray.o[2]
    dx, dy, dz = ray.d[0], ray.d[1], ray.d[2]
    what, t, cell, ci, ck, t_next_i, t_next_k = trace_domain(
        ox, oy, oz, dx, dy, dz, ray.t0, ray.cell[0], ray.cell[1], ray.next[0], ray.next[1],
        sph, dom[0], dom[1], dom[2], dom[3],
    )  # fmt: skip
    leaving = what == NONE and ci >= 0 and ci < g and ck >= 0 and ck < g
    if leaving:  # on to the rank that owns the next cell, where the walk goes on
        put_ray(
            outbox, owner, g, ox, oy, oz, dx, dy, dz, ray.t0, ci, ck, t_next_i, t_next_k,
            ray.c[0], ray.c[1], ray.c[2], ray.pixel, ray.sample, ray.depth, ray.kind,
        )  # fmt: skip
        return
    if ray.kind == SHADOW:
        if what == NONE:  # reached the light
            add_pixel(red, ray.pixel, ray.c[0], ray.c[1], ray.c[2])
        return
    if what == NONE:
        r, gg, b = sky(dy)
        add_pixel(red, ray.pixel, ray.c[0] * r, ray.c[1] * gg, ray.c[2] * b)
        return
    qx, qy, qz, nx, ny, nz, ar, ag, ab, cos_l = hit_frame(what, t, ox, oy, oz, dx, dy, dz, cell, sph)
    if cos_l > 0.0:
        w = cos_l * LIGHT_POWER
        if start_ray(
            outbox, owner, g, qx, qy, qz, LIGHT[0], LIGHT[1], LIGHT[2], 0.0, ray.c[0] * ar * w,
            ray.c[1] * ag * w, ray.c[2] * ab * w, ray.pixel, ray.sample, ray.depth, SHADOW,
        ):  # fmt: skip
            device.atomic_add(started, 0, 1)
    if ray.depth < bounces:
        u1 = rand01(seed, ray.pixel, ray.sample, ray.depth + 1, 0)
        u2 = rand01(seed, ray.pixel, ray.sample, ray.depth + 1, 1)
        bx, by, bz = bounce_dir(nx, ny, nz, u1, u2)
        if start_ray(
            outbox, owner, g, qx, qy, qz, bx, by, bz, 0.0, ray.c[0] * ar, ray.c[1] * ag, ray.c[2] * ab,
            ray.pixel, ray.sample, ray.depth + 1, PATH,
        ):  # fmt: skip
            device.atomic_add(started, 0, 1)


@numba.njit
def _trace_full(ox, oy, oz, dx, dy, dz, t0, sph, g):
    """The whole walk of a ray in one process: ``(what, t, cell)``."""
    i, k, t_next_i, t_next_k = walk_start(ox, oz, dx, dz, t0, g)
    what, t, cell, _, _, _, _ = trace_domain(
        ox, oy, oz, dx, dy, dz, t0, i, k, t_next_i, t_next_k, sph, 0, g, 0, g
    )
    return what, t, cell


@numba.njit
def reference_render(width, height, samples, bounces, seed, sph, g):
    """The same image in one process without rafi: an (h, w, 3) float64 sum over samples."""
    image = np.zeros((height * width, 3))
    for pixel in range(width * height):
        for sample in range(samples):
            ox, oy, oz, dx, dy, dz = camera_ray(pixel, sample, width, height, seed, g)
            t0 = grid_entry(ox, oz, dx, dz, g)
            if t0 < 0.0:
                r, gg, b = sky(dy)
                image[pixel, 0] += r
                image[pixel, 1] += gg
                image[pixel, 2] += b
                continue
            cr, cg, cb = 1.0, 1.0, 1.0
            for depth in range(bounces + 1):
                what, t, cell = _trace_full(ox, oy, oz, dx, dy, dz, t0, sph, g)
                if what == NONE:
                    r, gg, b = sky(dy)
                    image[pixel, 0] += cr * r
                    image[pixel, 1] += cg * gg
                    image[pixel, 2] += cb * b
                    break
                qx, qy, qz, nx, ny, nz, ar, ag, ab, cos_l = hit_frame(
                    what, t, ox, oy, oz, dx, dy, dz, cell, sph
                )
                if cos_l > 0.0:
                    s = _trace_full(qx, qy, qz, LIGHT[0], LIGHT[1], LIGHT[2], 0.0, sph, g)
                    if s[0] == NONE:
                        w = cos_l * LIGHT_POWER
                        image[pixel, 0] += cr * ar * w
                        image[pixel, 1] += cg * ag * w
                        image[pixel, 2] += cb * ab * w
                cr, cg, cb = cr * ar, cg * ag, cb * ab
                if depth == bounces:
                    break
                u1 = rand01(seed, pixel, sample, depth + 1, 0)
                u2 = rand01(seed, pixel, sample, depth + 1, 1)
                dx, dy, dz = bounce_dir(nx, ny, nz, u1, u2)
                ox, oy, oz, t0 = qx, qy, qz, 0.0
    return image.reshape(height, width, 3)
