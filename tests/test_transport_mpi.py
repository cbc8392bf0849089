"""Monte Carlo transport (rafi/examples/transport.py): every particle ends once, and the
tallies equal the one-process reference at every rank count, in rounds and async mode."""

import json

import pytest

from conftest import SIMULATOR
from rafi.examples import transport
from rafi.kernels import transport as kern

PARTICLES, GRID = (24, 6) if SIMULATOR else (3000, 16)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("mode", ["bsp", "async", "resident"])
def test_tallies_equal_the_reference(comm, backend, mode):
    _check_against_reference(comm, backend, mode)


def test_tallies_equal_the_reference_on_one_rank(backend):
    from mpi4py import MPI

    _check_against_reference(MPI.COMM_SELF, backend, "bsp")


def _check_against_reference(comm, backend, mode):
    argv = [
        "--particles",
        str(PARTICLES),
        "--grid",
        str(GRID),
        "--seed",
        "3",
        "--backend",
        backend,
        "--mode",
        mode,
    ]
    info = transport.run(transport.parse(argv), comm)
    assert info["absorbed"] + info["leaked"] == PARTICLES
    assert info["visits"] >= PARTICLES  # each particle is walked at least once
    if comm.Get_rank() == 0:
        tally, leaked = kern.reference(PARTICLES, 3, transport.materials(GRID), GRID)
        assert info["tally"] == tally.tolist() and info["leaked"] == leaked
        assert 0 < info["absorbed"] < PARTICLES  # the scene both absorbs and leaks


@pytest.mark.mpi(min_size=2)
def test_json_output(comm, tmp_path_factory):
    path = comm.bcast(str(tmp_path_factory.mktemp("transport") / "t.json"), root=0)
    argv = ["--particles", "50", "--grid", "4", "--backend", "cpu", "--json", path, "--check"]
    assert transport.main(argv) == 0
    if comm.Get_rank() == 0:
        with open(path) as f:
            info = json.load(f)
        assert info["absorbed"] + info["leaked"] == 50 == info["particles"]
        assert len(info["tally"]) == 4**3 and sum(info["tally"]) == info["absorbed"]


def test_slabs_cover_the_grid_once():
    for size in range(1, 9):
        for g in (1, 5, 16):
            columns = [x for r in range(size) for x in range(*transport.slab(r, size, g))]
            assert columns == list(range(g))
            assert all(
                kern.owner_of(x, g, size) == r
                for r in range(size)
                for x in range(*transport.slab(r, size, g))
            )
