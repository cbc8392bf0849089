"""Device code of the Schlieren imager (rafi/examples/schlieren.py).

Parallel rays enter the volume's face at 0 of the view ``axis`` (0, 1, 2: x, y, z) and
travel along it, one per pixel and sample (a fixed sub-pixel pattern: no random
numbers); the image's horizontal and vertical are the other two axes, ``(z, y)``,
``(x, z)`` or ``(x, y)``. The refractive index is ``n = 1 + k * v`` (``v`` the volume's
value, trilinear); a ray bends by the ray equation ``d(n dir)/ds = grad n``, integrated
with fixed steps ``h``: the optical direction ``p = n dir`` gains ``h grad n`` and the
point moves ``h p / n`` (``grad n`` is the exact gradient of the trilinear interpolant,
which reads no cell beyond the ghost layer). A ray whose point moves into another brick
is forwarded there with its point, optical direction and step count, so its owner
continues exactly as one process would (``reference_sample``). Where the ray leaves the
volume, its deflection (the image-plane part of its unit direction) passes a filter at
the focal plane: a horizontal knife edge (grey ``0.5 + 0.5 e_v / cutoff``, clipped, for
the vertical deflection ``e_v``) or a colour filter (hue from the deflection's
direction, saturation from its size over ``cutoff``); the result goes to the ray's pixel.
"""

import math

import numpy as np

from rafi import device
from rafi._kernel import kernel
from rafi._targets import func
from rafi.kernels.raytrace import add_pixel
from rafi.kernels.volume import inside, owner_of, trilinear

__all__ = ["Ray", "camera", "trace", "reference_sample"]

Ray = np.dtype(
    [
        ("x", "f8", (3,)),
        ("p", "f8", (3,)),  # optical direction n * dir (set where the ray enters)
        ("steps", "i4"),
        ("pixel", "i4"),
    ],
    align=True,
)
EXIT, LEAVE = 0, 1
R2 = (0.7548776662466927, 0.5698402909980532)  # sub-pixel offsets: the R2 sequence


@func
def entry(pixel, sample, width, height, dims, axis):
    """Where the ray of (``pixel``, ``sample``) meets the plane at 0 of ``axis``:
    ``(on_face, x, y, z)``. The face is centred in the image, as large as fits."""
    a = 0.5 + sample * R2[0]
    b = 0.5 + sample * R2[1]
    du = dims[2] if axis == 0 else dims[0]  # the image's horizontal and vertical extent
    dv = dims[2] if axis == 1 else dims[1]
    scale = max(du / width, dv / height)  # cells per pixel
    u = 0.5 * du + ((pixel % width) + (a - math.floor(a)) - 0.5 * width) * scale
    v = 0.5 * dv - ((pixel // width) + (b - math.floor(b)) - 0.5 * height) * scale
    x = 0.0 if axis == 0 else u
    y = 0.0 if axis == 1 else v
    z = u if axis == 0 else (v if axis == 1 else 0.0)
    return 0.0 <= u <= du and 0.0 <= v <= dv, x, y, z


# fmt: off
@func
def bend(values, origin, dims, box, k, h, max_steps, x, y, z, px, py, pz, steps):
    # fmt: on
    """Integrate the ray on from ``(x, y, z)`` (in this brick) until it leaves the volume
    (``EXIT``; or after ``max_steps``) or moves into another brick (``LEAVE``).

    Returns ``(event, x, y, z, px, py, pz, steps)``.
    """
    while True:
        v, gx, gy, gz = trilinear(values, origin, dims, x, y, z)
        n = 1.0 + k * v
        if steps == 0:  # entering: p is the unit direction
            px, py, pz = px * n, py * n, pz * n
        px, py, pz = px + h * k * gx, py + h * k * gy, pz + h * k * gz
        x, y, z = x + h * px / n, y + h * py / n, z + h * pz / n
        steps += 1
        if not (0.0 <= x <= dims[0] and 0.0 <= y <= dims[1] and 0.0 <= z <= dims[2]) or steps >= max_steps:
            return EXIT, x, y, z, px, py, pz, steps
        if not inside(box, x, y, z):
            return LEAVE, x, y, z, px, py, pz, steps


@func
def hsv(hue, s, v):
    """RGB of a colour given by hue (radians), saturation and value."""
    h6 = (hue / (2.0 * math.pi) % 1.0) * 6.0
    r = v - v * s * max(0.0, min((5.0 + h6) % 6.0, 4.0 - (5.0 + h6) % 6.0, 1.0))
    g = v - v * s * max(0.0, min((3.0 + h6) % 6.0, 4.0 - (3.0 + h6) % 6.0, 1.0))
    b = v - v * s * max(0.0, min((1.0 + h6) % 6.0, 4.0 - (1.0 + h6) % 6.0, 1.0))
    return r, g, b


@func
def focal_filter(px, py, pz, axis, cutoff, color):
    """What passes the filter for a ray leaving with optical direction ``p``: ``(r, g, b)``."""
    n = math.sqrt(px * px + py * py + pz * pz)
    eu = (pz if axis == 0 else px) / n  # the deflection in the image's horizontal and vertical
    ev = (pz if axis == 1 else py) / n
    if color:
        return hsv(math.atan2(ev, eu), min(math.sqrt(eu * eu + ev * ev) / cutoff, 1.0), 1.0)
    grey = min(max(0.5 + 0.5 * ev / cutoff, 0.0), 1.0)
    return grey, grey, grey


@func
def put_ray(outbox, kd, x, y, z, px, py, pz, steps, pixel):
    """Push a ray for the owner of its point; False when the outbox is full."""
    slot = device.push(outbox, owner_of(kd, x, y, z))
    if slot < 0:
        return False
    ray = outbox.items[slot]
    ray.x[0], ray.x[1], ray.x[2] = x, y, z
    ray.p[0], ray.p[1], ray.p[2] = px, py, pz
    ray.steps, ray.pixel = steps, pixel
    return True


@func
def along(axis):
    """The unit vector of ``axis``."""
    return 1.0 if axis == 0 else 0.0, 1.0 if axis == 1 else 0.0, 1.0 if axis == 2 else 0.0


@kernel
def camera(i, outbox, red, pixel0, sample, width, height, dims, kd, axis, cutoff, color):
    """Start the ray of pixel ``pixel0 + i`` at the owner of its entry point."""
    pixel = pixel0 + i
    on_face, x, y, z = entry(pixel, sample, width, height, dims, axis)
    px, py, pz = along(axis)
    if on_face:
        put_ray(outbox, kd, x, y, z, px, py, pz, 0, pixel)
    else:  # undeflected
        r, g, b = focal_filter(px, py, pz, axis, cutoff, color)
        add_pixel(red, pixel, r, g, b)


@kernel
def trace(i, inbox, outbox, red, values, origin, dims, box, kd, axis, k, h, max_steps, cutoff, color):
    """Bend ray ``i`` of the inbox through this rank's brick; forward it or image it."""
    ray = inbox[i]
    event, x, y, z, px, py, pz, steps = bend(
        values, origin, dims, box, k, h, max_steps, ray.x[0], ray.x[1], ray.x[2],
        ray.p[0], ray.p[1], ray.p[2], ray.steps,
    )  # fmt: skip
    if event == LEAVE:
        put_ray(outbox, kd, x, y, z, px, py, pz, steps, ray.pixel)
    else:
        r, g, b = focal_filter(px, py, pz, axis, cutoff, color)
        add_pixel(red, ray.pixel, r, g, b)


# fmt: off
@func
def reference_sample(pixel, sample, width, height, values, origin, dims, box, axis, k, h, max_steps,
                     cutoff, color):
    # fmt: on
    """What one sample adds to its pixel, traced in one process (``values``: the whole volume
    as one brick); ``reference.reference_image`` sums it into the reference image."""
    on_face, x, y, z = entry(pixel, sample, width, height, dims, axis)
    px, py, pz = along(axis)
    if on_face:
        state = bend(values, origin, dims, box, k, h, max_steps, x, y, z, px, py, pz, 0)
        px, py, pz = state[4], state[5], state[6]
    return focal_filter(px, py, pz, axis, cutoff, color)
