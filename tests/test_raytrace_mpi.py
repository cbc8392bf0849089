"""The ray tracer: the distributed image equals the one-process reference on any rank count."""

import argparse

import numpy as np
import pytest

from conftest import SIMULATOR
from rafi.examples import raytrace
from rafi.examples.scene import decompose, make_scene
from rafi.kernels.raytrace import reference_render

SMALL = (
    dict(width=8, height=6, samples=1, bounces=1, grid=4)
    if SIMULATOR
    else dict(width=40, height=30, samples=2, bounces=2, grid=8)
)


def options(backend, scene="spheres", mode="bsp"):
    return argparse.Namespace(seed=3, scene=scene, backend=backend, quiet=True, mode=mode, **SMALL)


def reference(opts):
    cells = make_scene(opts.scene, opts.grid, opts.seed)
    total = reference_render(opts.width, opts.height, opts.samples, opts.bounces, opts.seed, cells, opts.grid)
    return total / opts.samples


@pytest.mark.parametrize("launch", ["one-rank", pytest.param("mpirun", marks=pytest.mark.mpi(min_size=2))])
@pytest.mark.parametrize("scene", ["spheres", "dense"])
@pytest.mark.parametrize("mode", ["bsp", "async"])
def test_image_matches_reference_on_any_rank_count(comm, backend, scene, launch, mode):
    """Run serially (1 rank) and under mpirun -n 2 and -n 3, in rounds or asynchronously:
    every rank count and both modes give the reference image."""
    if launch == "one-rank" and comm.Get_size() > 1:
        pytest.skip("the one-rank case runs without mpirun")
    opts = options(backend, scene, mode)
    image, info = raytrace.render(opts, comm)
    if comm.Get_rank() == 0:
        ref = reference(opts)
        assert image.shape == ref.shape and ref.max() > 0.1
        np.testing.assert_allclose(image, ref, rtol=1e-9, atol=1e-12)  # summation order only
        assert info["rays"] > opts.width * opts.height


def test_decomposition_covers_every_cell_once():
    cells = make_scene("spheres", 16, 1)
    for size in (1, 2, 3, 4, 7, 8):
        domains, owner = decompose(cells, 16, size)
        area = sum((i1 - i0) * (k1 - k0) for i0, i1, k0, k1 in domains)
        assert area == 256 and sorted(set(owner.tolist())) == list(range(size))
        spheres = [(cells[owner == r, 0] > 0).sum() for r in range(size)]
        assert max(spheres) - min(spheres) <= 256 // size  # roughly balanced


def test_spheres_stay_inside_their_cells():
    cells = make_scene("dense", 8, 2)
    i, k = np.divmod(np.arange(64), 8)
    r = cells[:, 0]
    assert ((cells[:, 1] - r >= i) & (cells[:, 1] + r <= i + 1)).all()
    assert ((cells[:, 2] - r >= k) & (cells[:, 2] + r <= k + 1)).all()


def test_png_written(tmp_path):
    path = tmp_path / "x.png"
    raytrace.to_png(np.full((4, 5, 3), 0.5), path)
    from PIL import Image

    with Image.open(path) as im:
        assert im.size == (5, 4)
