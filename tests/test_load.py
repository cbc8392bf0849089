"""Under CPU load, as on a busy node: two busy processes beside a 2-rank job on this
machine's cores. The asynchronous ray tracer, one batches() loop per sample, must end
every time with the reference image. Before loops ended together, a rank could take the
next loop's rays into a loop that had ended: this very run hung in 2 of 3 tries."""

import subprocess
import sys

import numpy as np
import pytest

from jobs import finish, start
from rafi.examples.scene import make_scene
from rafi.kernels.raytrace import reference_render

SIZE = dict(width=24, height=16, samples=16, bounces=2, grid=6, seed=5)


@pytest.fixture
def busy_machine():
    """Two processes that each keep a core busy while the test runs."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    yield
    for hog in hogs:
        hog.kill()
        hog.wait()


@pytest.mark.timeout(900)
def test_async_ray_tracer_ends_under_cpu_load(tmp_path, busy_machine):
    out = tmp_path / "image.npy"
    args = [f"--{name}={value}" for name, value in SIZE.items()]
    command = ["-m", "rafi.examples.raytrace", *args, "--mode", "async", "--backend", "cpu", "--quiet"]
    try:
        assert finish(start(2, [*command, "--output", str(out)]), timeout=600) == 0
    except subprocess.TimeoutExpired:
        pytest.fail("the asynchronous ray tracer hung under CPU load")
    cells = make_scene("spheres", SIZE["grid"], SIZE["seed"])
    s = SIZE
    ref = reference_render(s["width"], s["height"], s["samples"], s["bounces"], s["seed"], cells, s["grid"])
    np.testing.assert_allclose(np.load(out), ref / s["samples"], rtol=1e-9, atol=1e-12)
