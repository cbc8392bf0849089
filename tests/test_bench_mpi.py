"""The benchmark's own delivery check, on small rounds (the timings are not asserted)."""

import argparse

import pytest

from conftest import SIMULATOR
from rafi.bench.__main__ import run

pytestmark = pytest.mark.mpi(min_size=2)


@pytest.mark.parametrize("pattern", ["uniform", "ring", "hot"])
def test_bench_delivers_every_item(comm, backend, pattern):
    opts = argparse.Namespace(
        backend=backend,
        items=[20] if SIMULATOR else [500, 3000],
        itemsize=64,
        pattern=pattern,
        rounds=1,
        seed=3,
    )
    records = run(opts)  # raises on any rank that received other than what was sent to it
    assert [r["items_per_rank"] for r in records] == opts.items
    assert all(r["rafi_s"] > 0 and r["ranks"] == comm.Get_size() for r in records)
