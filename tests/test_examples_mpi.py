"""The shipped examples run and check themselves under mpirun."""

import os
import runpy

import pytest

from conftest import SIMULATOR
from rafi.examples import forward

pytestmark = pytest.mark.mpi(min_size=2)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_forward_example(backend, tmp_path_factory, comm):
    walkers = "6" if SIMULATOR else "2000"
    path = comm.bcast(str(tmp_path_factory.mktemp("stats") / "stats.json"), root=0)
    argv = ["--walkers", walkers, "--steps", "3", "--backend", backend, "--stats", path]
    assert forward.main(argv) == 0
    if comm.Get_rank() == 0:
        assert os.path.getsize(path) > 0


def test_minimal_example(comm):
    runpy.run_path(os.path.join(ROOT, "examples", "minimal.py"), run_name="__main__")


def test_particles_example(comm):
    runpy.run_path(os.path.join(ROOT, "examples", "particles.py"), run_name="__main__")


def test_walk_example_matches_one_process(backend, comm):
    """examples/walk.py: the totals equal a plain-Python walk of the same walkers."""
    from rafi import device

    walk = runpy.run_path(os.path.join(ROOT, "examples", "walk.py"))
    walkers = 12 if SIMULATOR else 3000
    arrivals, stopped = walk["main"](backend, walkers)
    expected = 0
    for w in range(walkers):
        steps = 0
        while device.random(walk["SEED"], w, steps) >= walk["STOP"]:
            steps += 1
        expected += steps + 1
    assert (arrivals, stopped) == (expected, walkers)
