"""The volume path tracer and the Schlieren imager: the distributed image equals the one-process
reference on any rank count, each rank holding only its brick."""

import numpy as np
import pytest

from conftest import SIMULATOR
from rafi.examples import schlieren, volume, volume_data

SMALL = (  # the simulator runs a Python thread per ray: tiny volumes and images there
    ["--width", "6", "--height", "5", "--samples", "1", "--dims", "5", "4", "6"]
    if SIMULATOR
    else ["--width", "24", "--height", "18", "--samples", "2", "--dims", "12", "10", "14"]
)
LAUNCH = pytest.mark.parametrize(
    "launch", ["one-rank", pytest.param("mpirun", marks=pytest.mark.mpi(min_size=2))]
)


def render(comm, program, argv):
    """Render with ``program`` on ``comm``; on rank 0 also the reference: ``(image, info, ref)``.
    Checks first that each rank held only its brick."""
    opts, src = program.parse(argv)
    image, info = volume_data.render(opts, src, program.work, comm)
    if comm.Get_rank() != 0:
        return None, info, None
    assert len(info["bricks"]) == comm.Get_size()
    whole = 4 * np.prod(np.add(src.dims, 2))  # float32 cells and ghosts
    for b in info["bricks"]:
        assert b["resident_bytes"] == 4 * np.prod(np.subtract(b["hi"], b["lo"]) + 2)
        assert comm.Get_size() == 1 or b["resident_bytes"] < whole
    return image, info, program.reference(opts, src)


@LAUNCH
@pytest.mark.parametrize("mode", ["bsp", "async", "resident"])
def test_volume_image_matches_reference_on_any_rank_count(comm, backend, launch, mode):
    """Serially (1 rank) and under mpirun -n 2 and -n 3, in rounds or asynchronously."""
    if launch == "one-rank" and comm.Get_size() > 1:
        pytest.skip("the one-rank case runs without mpirun")
    argv = [*SMALL, "--backend", backend, "--mode", mode, "--quiet", "--density", "0.8", "--g", "0.3"]
    image, info, ref = render(comm, volume, argv)
    if comm.Get_rank() == 0:
        assert image.shape == ref.shape and ref.max() > 0.1
        np.testing.assert_allclose(image, ref, rtol=1e-9, atol=1e-12)  # summation order only
        assert info["rays"] > info["paths"] == image.shape[0] * image.shape[1] * int(SMALL[5])


@LAUNCH
@pytest.mark.parametrize("mode", ["bsp", "async", "resident"])
def test_schlieren_image_matches_reference_on_any_rank_count(comm, backend, launch, mode):
    """The same for the Schlieren imager: rays along z through a knife edge in rounds, along x
    through the colour filter asynchronously."""
    if launch == "one-rank" and comm.Get_size() > 1:
        pytest.skip("the one-rank case runs without mpirun")
    view = ["--axis", "z", "--filter", "knife"] if mode == "bsp" else ["--axis", "x", "--filter", "color"]
    argv = [*SMALL, "--backend", backend, "--mode", mode, "--quiet", "--k", "0.02", *view]
    image, info, ref = render(comm, schlieren, argv)
    if comm.Get_rank() == 0:
        assert image.shape == ref.shape and ref.std() > 0.01  # the rays did bend
        np.testing.assert_allclose(image, ref, rtol=1e-12, atol=1e-12)
        if mode == "bsp":  # the first cut of the bricks is across z: rays along z cross it
            paths = image.shape[0] * image.shape[1] * int(SMALL[5])
            assert info["paths"] == info["rays"] == paths  # a Schlieren path is one ray
            assert info["segments"] > paths if comm.Get_size() > 1 else info["segments"] <= paths


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("kind", ["raw", "h5"])
def test_images_of_a_volume_read_from_a_file(comm, backend, kind, tmp_path_factory):
    """Each rank reads its brick of a .raw file or an HDF5 dataset; both images equal the reference."""
    path = None
    if comm.Get_rank() == 0:
        cells = np.random.default_rng(4).random((6, 5, 7), dtype=np.float32)  # [z, y, x]
        path = tmp_path_factory.mktemp("volume") / f"v.{kind}"
        if kind == "raw":
            cells.tofile(path)
        else:
            import h5py

            with h5py.File(path, "w") as f:
                f["density"] = cells
    path = comm.bcast(str(path), root=0)
    size = ["--width", "5", "--height", "4"] if SIMULATOR else ["--width", "16", "--height", "12"]
    source = ["--dims", "7", "5", "6", "--dtype", "float32"] if kind == "raw" else []
    volume_option = ["--volume", path if kind == "raw" else f"{path}:/density", *source]
    common = [*size, "--samples", "1", "--backend", backend, "--quiet", *volume_option]
    for program, extra in ((schlieren, ["--k", "0.05"]), (volume, [])):
        image, info, ref = render(comm, program, [*common, *extra])
        if comm.Get_rank() == 0:
            np.testing.assert_allclose(image, ref, rtol=1e-9, atol=1e-12)


@pytest.mark.mpi(min_size=2)
def test_the_programs_write_an_image_and_stats(comm, backend, tmp_path_factory):
    import json

    from PIL import Image

    folder = comm.bcast(str(tmp_path_factory.mktemp("out")) if comm.Get_rank() == 0 else None, root=0)
    for program in (volume, schlieren):
        png, stats = f"{folder}/{program.__name__}.png", f"{folder}/{program.__name__}.json"
        assert program.main([*SMALL, "--backend", backend, "--quiet", "--output", png, "--stats", stats]) == 0
        if comm.Get_rank() == 0:
            with Image.open(png) as im, open(stats) as f:
                assert im.size == (int(SMALL[1]), int(SMALL[3]))
                assert len(json.load(f)["bricks"]) == comm.Get_size()
