"""The one-process references on the GPU path, and the workloads benchmark (rafi/bench/workloads.py):
its records have their fields, their byte totals are the forwarders' stats, each rank held
only its brick (the timings are not asserted)."""

import json

import numpy as np
import pytest

from rafi.bench import workloads
from rafi.examples import schlieren, transport, volume
from rafi.kernels import transport as kern

CUDA = pytest.mark.parametrize("backend", ["cuda"], indirect=True)  # the GPU, or the simulator
LAUNCH = pytest.mark.parametrize(
    "launch", ["one-rank", pytest.param("mpirun", marks=pytest.mark.mpi(min_size=2))]
)
TINY = ["--width", "8", "--height", "6", "--samples", "2", "--dims", "5", "4", "6"]


@CUDA
@pytest.mark.parametrize(
    "program, options, rtol",
    [
        (volume, ["--density", "0.8", "--g", "0.3"], 1e-9),
        (schlieren, ["--k", "0.02", "--axis", "z"], 1e-12),
        (schlieren, ["--k", "0.05", "--axis", "x", "--filter", "color"], 1e-12),
    ],
)
def test_the_gpu_reference_image_equals_the_njit_one(backend, program, options, rtol):
    opts, src = program.parse([*TINY, *options])
    expected = program.reference(opts, src)
    assert expected.shape == (6, 8, 3) and expected.std() > 0.01
    np.testing.assert_allclose(program.reference(opts, src, backend=backend), expected, rtol=rtol, atol=1e-12)


@CUDA
def test_the_gpu_transport_reference_equals_the_njit_one(backend):
    mat = transport.materials(6)
    tally, leaked = kern.reference(40, 3, mat, 6, backend=backend)
    expected, expected_leaked = kern.reference(40, 3, mat, 6)
    assert tally.tolist() == expected.tolist() and leaked == expected_leaked
    assert 0 < leaked < 40 and tally.sum() == 40 - leaked


FIELDS = {
    "program", "mode", "ranks", "backend", "transport", "rounds", "unit", "items", "seconds",
    "items_per_second", "bytes_forwarded", "bytes_between_ranks", "bytes_forwarded_per_second",
    "bytes_between_ranks_per_second", "per_rank_stats", "visits", "reference_seconds",
    "reference_items_per_second", "speed_ratio",
}  # fmt: skip
IMAGE_FIELDS = {"size", "dims", "resident_bytes", "volume_bytes", "reference_max_abs_diff", "rays"}
TRANSPORT_FIELDS = {"particles", "grid", "seed", "absorbed", "leaked", "reference_equal"}


@LAUNCH
def test_the_workloads_benchmark_records(comm, launch, tmp_path_factory):
    """Every program, both modes, with the reference, serially and under mpirun (cpu backend)."""
    if launch == "one-rank" and comm.Get_size() > 1:
        pytest.skip("the one-rank case runs without mpirun")
    path = comm.bcast(str(tmp_path_factory.mktemp("workloads") / "w.json"), root=0)
    sizes = ["--width", "8", "--height", "6", "--samples", "1", "--dims", "16", "16", "16"]
    argv = [*sizes, "--particles", "200", "--grid", "8", "--backend", "cpu", "--mode", "bsp", "async"]
    assert workloads.main([*argv, "--reference", "--json", path]) == 0
    if comm.Get_rank() != 0:
        return
    with open(path) as f:
        records = json.load(f)["records"]
    assert [(r["program"], r["mode"]) for r in records] == [
        (p, m) for p in ("volume", "schlieren", "transport") for m in ("bsp", "async")
    ]
    size = comm.Get_size()
    for r in records:
        extra = TRANSPORT_FIELDS if r["program"] == "transport" else IMAGE_FIELDS
        assert set(r) == FIELDS | extra
        assert r["ranks"] == size == len(r["per_rank_stats"]) and r["backend"] == "cpu"
        assert r["items"] == (200 if r["program"] == "transport" else 48) and r["items_per_second"] > 0
        stats = r["per_rank_stats"]
        totals = [s["totals"]["bytes_sent"] for s in stats]
        between = [s["totals"]["bytes_sent"] - s["peers"]["bytes_sent"][k] for k, s in enumerate(stats)]
        assert r["bytes_forwarded"] == sum(totals) > 0
        assert r["bytes_between_ranks"] == sum(between) and (r["bytes_between_ranks"] > 0) == (size > 1)
        assert r["bytes_forwarded_per_second"] == pytest.approx(r["bytes_forwarded"] / r["seconds"])
        assert r["speed_ratio"] > 0
        if r["program"] == "transport":
            assert r["reference_equal"] and r["absorbed"] + r["leaked"] == 200
        else:
            assert r["reference_max_abs_diff"] < 1e-9
            assert len(r["resident_bytes"]) == size and r["volume_bytes"] == 4 * 16**3
            assert size == 1 or max(r["resident_bytes"]) < r["volume_bytes"]


def test_the_workloads_sizes(comm, tmp_path_factory):
    """``--small`` and the H200 defaults, each size option overriding them; a file's volume keeps its dims."""
    import h5py

    assert workloads.parse([]).particles == 4_000_000 and workloads.parse([]).dims == [256, 256, 256]
    small = workloads.parse(["--small", "--width", "10"])
    assert (small.width, small.height, small.dims) == (10, 36, [24, 24, 24])
    path = None
    if comm.Get_rank() == 0:
        path = tmp_path_factory.mktemp("volume") / "v.h5"
        with h5py.File(path, "w") as f:
            f["density"] = np.zeros((4, 3, 2), np.float32)
    path = comm.bcast(path, root=0)
    assert workloads.parse(["--volume", f"{path}:/density"]).dims is None
