"""Device code of the volume path tracer (rafi/examples/volume.py).

A camera ray crosses the volume by delta tracking against the global majorant ``mu``
(the largest extinction the transfer function gives, times the density scale): a
tentative collision every ``-ln(1 - u) / mu``, real with probability ``sigma / mu``.
At a real collision the ray scatters once toward the directional light (single
scattering; Henyey-Greenstein phase function, isotropic for ``g = 0``), weighted by the
transfer function's colour there, and becomes a shadow ray whose transmittance is
estimated by ratio tracking (each tentative point multiplies it by ``1 - sigma / mu``; it
stops when below ``CUTOFF``). A ray that escapes adds the background (a camera ray) or
its weight (a shadow ray) to its pixel.

Every tentative point is tested by the rank that owns it: a ray whose next point is in
another brick is forwarded there with its whole state (origin, direction, ``t`` of the
point, where it leaves the volume, weight, pixel, sample, kind and the counter of its
random stream, one stream per (pixel, sample)), so the owner continues exactly the path
one process computes (``reference_sample``).
"""

import math

import numpy as np

from rafi import device
from rafi._kernel import kernel
from rafi._targets import func
from rafi.kernels.raytrace import add_pixel
from rafi.kernels.volume import box_span, inside, owner_of, trilinear

__all__ = ["Ray", "PATH", "SHADOW", "camera", "trace", "reference_sample"]

Ray = np.dtype(
    [
        ("o", "f8", (3,)),
        ("d", "f8", (3,)),
        ("t", "f8"),  # the tentative collision point the owner tests next
        ("t_exit", "f8"),  # where the ray leaves the volume
        ("c", "f8", (3,)),  # a shadow ray's weight times its transmittance so far
        ("pixel", "i4"),
        ("sample", "i4"),
        ("counter", "i4"),  # the next number of the (pixel, sample) random stream
        ("kind", "i4"),
    ],
    align=True,
)
PATH, SHADOW = 0, 1
DONE, LEAVE = 0, 1
LIGHT = (0.48, 0.75, -0.456)  # unit vector toward the light
LIGHT_POWER = 9.0
VIEW = (-0.5, -0.36, 0.787)  # unit vector from the camera toward the volume's centre
DISTANCE = 2.2  # from the centre, in radii of the volume's bounding sphere
CUTOFF = 1e-7  # a shadow ray with less weight stops (deterministically) as absorbed


@func
def draw(seed, pixel, sample, counter):
    """The ``counter``-th number of the random stream of (``pixel``, ``sample``)."""
    return device.random(seed, int(pixel) * 1048576 + int(sample), counter)


@func
def transfer(tf, v):
    """Colour and opacity ``(r, g, b, a)`` at value ``v`` in [0, 1]: the table ``tf``, linearly."""
    s = min(max(v, 0.0), 1.0) * (tf.shape[0] - 1)
    k = min(int(s), tf.shape[0] - 2)
    f = s - k
    return (
        tf[k, 0] + f * (tf[k + 1, 0] - tf[k, 0]),
        tf[k, 1] + f * (tf[k + 1, 1] - tf[k, 1]),
        tf[k, 2] + f * (tf[k + 1, 2] - tf[k, 2]),
        tf[k, 3] + f * (tf[k + 1, 3] - tf[k, 3]),
    )


@func
def phase(g, cos_theta):
    """The Henyey-Greenstein phase function (isotropic for ``g = 0``)."""
    denom = 1.0 + g * g - 2.0 * g * cos_theta
    return (1.0 - g * g) / (4.0 * math.pi * denom * math.sqrt(denom))


@func
def background(dy):
    s = 0.5 + 0.5 * dy
    return 0.02 + 0.05 * s, 0.025 + 0.06 * s, 0.04 + 0.1 * s


@func
def camera_ray(pixel, sample, width, height, seed, dims):
    """Origin and direction of the camera ray through a jittered point of ``pixel``."""
    u = ((pixel % width) + draw(seed, pixel, sample, 0)) / width * 2.0 - 1.0
    v = 1.0 - ((pixel // width) + draw(seed, pixel, sample, 1)) / height * 2.0
    radius = 0.5 * math.sqrt(float(dims[0] * dims[0] + dims[1] * dims[1] + dims[2] * dims[2]))
    fx, fy, fz = VIEW
    ox, oy, oz = (
        0.5 * dims[0] - fx * DISTANCE * radius,
        0.5 * dims[1] - fy * DISTANCE * radius,
        0.5 * dims[2] - fz * DISTANCE * radius,
    )
    n = math.sqrt(fx * fx + fz * fz)
    rx, rz = -fz / n, fx / n  # right: forward x (0, 1, 0)
    ux, uy, uz = -fy * rz, fx * rz - fz * rx, fy * rx  # up: right x forward
    scale = 0.8 / math.sqrt(DISTANCE * DISTANCE - 1.0)  # the volume fills most of the height
    a, b = u * scale * width / height, v * scale
    dx, dy, dz = fx + a * rx + b * ux, fy + b * uy, fz + a * rz + b * uz
    n = math.sqrt(dx * dx + dy * dy + dz * dz)
    return ox, oy, oz, dx / n, dy / n, dz / n


@func
def step(seed, pixel, sample, counter, t, mu):
    """The next tentative collision after ``t``: ``(t, counter)``."""
    return t - math.log(1.0 - draw(seed, pixel, sample, counter)) / mu, counter + 1


@func
def start(pixel, sample, width, height, seed, dims, mu):
    """A camera ray's first tentative point: ``(hit, ox, oy, oz, dx, dy, dz, t, t_exit, counter)``;
    ``hit`` is False when the ray passes the volume (it sees the background)."""
    ox, oy, oz, dx, dy, dz = camera_ray(pixel, sample, width, height, seed, dims)
    t0, t_exit = box_span(ox, oy, oz, dx, dy, dz, dims)
    t, counter = step(seed, pixel, sample, 2, t0, mu)
    return t0 < t_exit and t < t_exit, ox, oy, oz, dx, dy, dz, t, t_exit, counter


# fmt: off
@func
def walk(values, origin, dims, box, tf, seed, scale, mu, g,
         ox, oy, oz, dx, dy, dz, t, t_exit, cr, cg, cb, pixel, sample, counter, kind):
    # fmt: on
    """Track a ray on from its tentative point ``t`` (in this brick) until it is done or its
    next point is in another brick.

    Returns ``(event, ox, oy, oz, dx, dy, dz, t, t_exit, cr, cg, cb, counter, kind)``: with
    ``DONE``, ``(cr, cg, cb)`` is what the path adds to its pixel; with ``LEAVE``, the state
    to forward to the owner of the point at ``t``.
    """
    while True:
        x, y, z = ox + t * dx, oy + t * dy, oz + t * dz
        r, gg, b, a = transfer(tf, trilinear(values, origin, dims, x, y, z)[0])
        if kind == PATH:
            counter += 1
            if draw(seed, pixel, sample, counter - 1) * mu < scale * a:  # scatter toward the light
                w = LIGHT_POWER * phase(g, dx * LIGHT[0] + dy * LIGHT[1] + dz * LIGHT[2])
                cr, cg, cb, kind = r * w, gg * w, b * w, SHADOW
                ox, oy, oz, t = x, y, z, 0.0
                dx, dy, dz = LIGHT
                t_exit = box_span(ox, oy, oz, dx, dy, dz, dims)[1]
        else:
            keep = 1.0 - scale * a / mu
            cr, cg, cb = cr * keep, cg * keep, cb * keep
            if cr + cg + cb < CUTOFF:
                return DONE, ox, oy, oz, dx, dy, dz, t, t_exit, 0.0, 0.0, 0.0, counter, kind
        t, counter = step(seed, pixel, sample, counter, t, mu)
        if t >= t_exit:
            if kind == PATH:
                cr, cg, cb = background(dy)
            return DONE, ox, oy, oz, dx, dy, dz, t, t_exit, cr, cg, cb, counter, kind
        if not inside(box, ox + t * dx, oy + t * dy, oz + t * dz):
            return LEAVE, ox, oy, oz, dx, dy, dz, t, t_exit, cr, cg, cb, counter, kind


# fmt: off
@func
def put_ray(outbox, kd, ox, oy, oz, dx, dy, dz, t, t_exit, cr, cg, cb, pixel, sample, counter, kind):
    # fmt: on
    """Push a ray for the owner of its tentative point; False when the outbox is full."""
    slot = device.push(outbox, owner_of(kd, ox + t * dx, oy + t * dy, oz + t * dz))
    if slot < 0:
        return False
    ray = outbox.items[slot]
    ray.o[0], ray.o[1], ray.o[2] = ox, oy, oz
    ray.d[0], ray.d[1], ray.d[2] = dx, dy, dz
    ray.t, ray.t_exit = t, t_exit
    ray.c[0], ray.c[1], ray.c[2] = cr, cg, cb
    ray.pixel, ray.sample, ray.counter, ray.kind = pixel, sample, counter, kind
    return True


@kernel
def camera(i, outbox, red, pixel0, sample, width, height, seed, dims, kd, mu):
    """Start the camera ray of pixel ``pixel0 + i`` at the owner of its first tentative point."""
    pixel = pixel0 + i
    hit, ox, oy, oz, dx, dy, dz, t, t_exit, counter = start(pixel, sample, width, height, seed, dims, mu)
    if not hit:
        r, g, b = background(dy)
        add_pixel(red, pixel, r, g, b)
        return
    put_ray(outbox, kd, ox, oy, oz, dx, dy, dz, t, t_exit, 0.0, 0.0, 0.0, pixel, sample, counter, PATH)


@kernel
def trace(i, inbox, outbox, red, values, origin, dims, box, kd, tf, seed, scale, mu, g, started):
    """Track ray ``i`` of the inbox through this rank's brick; forward it or add its result.
    Count each shadow ray that starts here (the path scattered) in ``started[0]``."""
    ray = inbox[i]
    event, ox, oy, oz, dx, dy, dz, t, t_exit, cr, cg, cb, counter, kind = walk(
        values, origin, dims, box, tf, seed, scale, mu, g, ray.o[0], ray.o[1], ray.o[2],
        ray.d[0], ray.d[1], ray.d[2], ray.t, ray.t_exit, ray.c[0], ray.c[1], ray.c[2],
        ray.pixel, ray.sample, ray.counter, ray.kind,
    )  # fmt: skip
    if ray.kind == PATH and kind == SHADOW:
        device.atomic_add(started, 0, 1)
    if event == LEAVE:
        put_ray(
            outbox, kd, ox, oy, oz, dx, dy, dz, t, t_exit, cr, cg, cb, ray.pixel, ray.sample, counter, kind
        )
    else:
        add_pixel(red, ray.pixel, cr, cg, cb)


@func
def reference_sample(pixel, sample, width, height, seed, values, origin, dims, box, tf, scale, mu, g):
    """What one sample adds to its pixel, traced in one process (``values``: the whole volume
    as one brick); ``reference.reference_image`` sums it into the reference image."""
    hit, ox, oy, oz, dx, dy, dz, t, t_exit, counter = start(pixel, sample, width, height, seed, dims, mu)
    if not hit:
        return background(dy)
    state = walk(
        values, origin, dims, box, tf, seed, scale, mu, g,
        ox, oy, oz, dx, dy, dz, t, t_exit, 0.0, 0.0, 0.0, pixel, sample, counter, PATH,
    )  # fmt: skip
    return state[9], state[10], state[11]
