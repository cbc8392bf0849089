"""Exactly once across forwarder lifetimes: forwarders made and closed one after another on
one communicator, some left by an error with items still in flight, never see a record of
another, and every record of a clean lifetime arrives once, intact."""

import numpy as np
import pytest

import rafi
from conftest import SIMULATOR
from traffic import all_ranks_ok

pytestmark = pytest.mark.mpi(min_size=2)

LIVES = 6 if SIMULATOR else 16
ITEMS = 10 if SIMULATOR else 40
Record = np.dtype([("life", "i4"), ("origin", "i4"), ("serial", "i4"), ("dest", "i4"), ("value", "f8")])


def records(life, rank, size):
    rng = np.random.default_rng(1000 * life + rank)
    out = np.zeros(ITEMS, Record)
    out["life"], out["origin"], out["serial"] = life, rank, np.arange(ITEMS)
    out["dest"] = rng.integers(0, size, ITEMS)
    out["value"] = life * 1e6 + rank * 1e3 + out["serial"] + 0.25
    return out


def deliver(fwd, mode):
    """Every record that reaches this rank, as forward() rounds or batches() bring them;
    what came before an error is kept in ``got`` for the caller."""
    got = []
    try:
        if mode == "bsp":
            while fwd.forward().alive:
                got.append(rafi.asnumpy(fwd.inbox))
        else:
            for batch in fwd.batches():
                got.append(rafi.asnumpy(batch))
    except rafi.InvalidDestination:
        return got, True
    return got, False


@pytest.mark.parametrize("mode", ["bsp", "async"])
def test_forwarders_one_after_another_never_see_each_others_records(comm, backend, mode):
    rank, size = comm.Get_rank(), comm.Get_size()
    plan = np.random.default_rng(7)  # the same on every rank: which lives fail, and where
    ok = True
    for life in range(LIVES):
        failing, culprit = plan.random() < 0.5, int(plan.integers(size))
        mine = records(life, rank, size)
        with rafi.Forwarder(comm, Record, size * ITEMS, backend=backend, mode=mode) as fwd:
            fwd.send(mine, mine["dest"])
            if failing and rank == culprit:
                fwd.send(mine[:1], size + 2)  # its records stay queued or in flight when it closes
            got, raised = deliver(fwd, mode)
        got = np.concatenate(got) if got else np.zeros(0, Record)
        keys = got["origin"] * ITEMS + got["serial"]
        ok &= raised == failing
        ok &= bool((got["life"] == life).all() and (got["dest"] == rank).all())
        ok &= len(np.unique(keys)) == len(keys)
        ok &= bool((got["value"] == life * 1e6 + got["origin"] * 1e3 + got["serial"] + 0.25).all())
        if not failing:
            expected = np.concatenate([records(life, r, size) for r in range(size)])
            expected = expected[expected["dest"] == rank]
            ok &= np.array_equal(np.sort(keys), np.sort(expected["origin"] * ITEMS + expected["serial"]))
    assert all_ranks_ok(comm, ok)
