"""The bricked volume: decomposition, ghost layers, reading .raw and HDF5, sampling at brick faces."""

import numpy as np
import pytest
from mpi4py import MPI

from rafi.examples import volume_data
from rafi.examples._cli import Parser
from rafi.kernels.volume import inside, owner_of, trilinear


def parse(argv):
    p = Parser("rafi.examples.volume", "test", MPI.COMM_SELF)
    volume_data.add_options(p)
    return volume_data.source(p, p.parse_args(argv))


@pytest.mark.parametrize("dims", [(8, 8, 8), (13, 5, 7), (3, 3, 1), (1, 1, 9)])
def test_every_cell_is_owned_once_and_the_tree_agrees(dims):
    for size in range(1, min(10, int(np.prod(dims))) + 1):
        bricks, kd = volume_data.decompose(dims, size)
        owner = -np.ones(dims[::-1], int)
        for rank, (lo, hi) in enumerate(bricks):
            cells = owner[lo[2] : hi[2], lo[1] : hi[1], lo[0] : hi[0]]
            assert cells.size > 0 and (cells == -1).all()
            cells[...] = rank
        assert (owner >= 0).all()
        z, y, x = np.indices(dims[::-1]) + 0.5
        found = [owner_of(kd, a, b, c) for a, b, c in zip(x.ravel(), y.ravel(), z.ravel())]
        assert found == owner.ravel().tolist()


def test_bricks_are_balanced():
    for size in (2, 3, 4, 5, 7, 8):
        bricks, _ = volume_data.decompose((48, 40, 32), size)
        cells = [np.prod(np.subtract(hi, lo)) for lo, hi in bricks]
        assert max(cells) <= 1.1 * min(cells)


def test_too_many_ranks():
    with pytest.raises(ValueError, match="9 ranks but only 8 cells"):
        volume_data.decompose((2, 2, 2), 9)


def test_a_point_is_inside_the_box_of_its_owner_even_just_outside_the_volume():
    dims = (6, 5, 4)
    bricks, kd = volume_data.decompose(dims, 5)
    boxes = [volume_data.Brick(None, lo, hi, dims, kd).device_args()[3] for lo, hi in bricks]
    rng = np.random.default_rng(1)
    for x, y, z in rng.uniform(-0.01, 1.01, (500, 3)) * dims:
        rank = owner_of(kd, x, y, z)
        assert [inside(box, x, y, z) for box in boxes] == [r == rank for r in range(5)]


@pytest.fixture
def stored(tmp_path):
    """A (5, 4, 6) uint16 volume, the same cells written as .raw and as HDF5: its paths and cells."""
    cells = np.random.default_rng(2).integers(0, 60000, (5, 4, 6), dtype=np.uint16)  # [z, y, x]
    raw = tmp_path / "v.raw"
    cells.astype("<u2").tofile(raw)
    import h5py

    with h5py.File(tmp_path / "v.h5", "w") as f:
        f["/fields/density"] = cells
    return raw, tmp_path / "v.h5", cells


@pytest.mark.parametrize("kind", ["raw", "h5"])
def test_a_brick_read_from_a_file_is_its_cells_with_ghosts(stored, kind):
    raw, h5, cells = stored
    args = ["--volume", str(raw), "--dims", "6", "4", "5", "--dtype", "uint16"]
    src = parse(args if kind == "raw" else ["--volume", f"{h5}:/fields/density"])
    assert src.kind == kind and src.dims == (6, 4, 5)
    padded = np.pad(cells.astype(np.float64), 1, mode="edge")  # the ghosts outside the volume
    bricks, _ = volume_data.decompose(src.dims, 3)
    for lo, hi in bricks:
        got = volume_data.read_ghosted(src, lo, hi)
        np.testing.assert_array_equal(got, padded[lo[2] : hi[2] + 2, lo[1] : hi[1] + 2, lo[0] : hi[0] + 2])


def test_the_whole_volume_normalized(stored):
    raw, _, cells = stored
    src = parse(["--volume", str(raw), "--dims", "6", "4", "5", "--dtype", "uint16"])
    brick = volume_data.load_brick(src, MPI.COMM_SELF)
    expected = (cells - cells.min()) / (cells.max() - cells.min())
    np.testing.assert_allclose(brick.values[1:-1, 1:-1, 1:-1], expected, rtol=1e-6)
    assert brick.values.dtype == np.float32 and brick.values.shape == (7, 6, 8)


def test_a_raw_file_of_the_wrong_size_is_refused(stored):
    raw = stored[0]
    with pytest.raises(SystemExit):
        parse(["--volume", str(raw), "--dims", "6", "4", "6", "--dtype", "uint16"])


def test_procedural_bricks_equal_the_whole_signal():
    """Each brick evaluates the Marschner-Lobb signal itself, bit for bit as the whole volume."""
    src = parse(["--dims", "9", "7", "8"])
    whole = volume_data.read_ghosted(src, (0, 0, 0), src.dims)
    assert 0.0 <= whole.min() and whole.max() <= 1.0
    for lo, hi in volume_data.decompose(src.dims, 4)[0]:
        got = volume_data.read_ghosted(src, lo, hi)
        np.testing.assert_array_equal(got, whole[lo[2] : hi[2] + 2, lo[1] : hi[1] + 2, lo[0] : hi[0] + 2])


def test_sampling_at_brick_faces_reads_the_ghosts():
    """Values and gradients a brick computes anywhere it owns equal the whole volume's."""
    src = parse(["--dims", "9", "7", "8"])
    whole = volume_data.Brick(
        volume_data.read_ghosted(src, (0, 0, 0), src.dims).astype(np.float32),
        (0, 0, 0),
        src.dims,
        src.dims,
        None,
    ).device_args()
    bricks, kd = volume_data.decompose(src.dims, 4)
    rng = np.random.default_rng(3)
    for lo, hi in bricks:
        values, origin, dims, box = volume_data.Brick(
            volume_data.read_ghosted(src, lo, hi).astype(np.float32), lo, hi, src.dims, kd
        ).device_args()
        faces = np.array([lo, np.subtract(hi, 1e-9)], float)
        points = np.concatenate([rng.uniform(lo, hi, (50, 3)), faces])
        for x, y, z in points:
            assert inside(box, x, y, z)
            assert trilinear(values, origin, dims, x, y, z) == trilinear(*whole[:3], x, y, z)
