"""The benchmark's own delivery check, on small rounds (the timings are not asserted)."""

import argparse

import numpy as np
import pytest

from conftest import SIMULATOR
from rafi.bench.__main__ import parse, run

pytestmark = pytest.mark.mpi(min_size=2)


@pytest.mark.parametrize("pattern", ["uniform", "ring", "hot"])
def test_bench_delivers_every_item(comm, backend, pattern):
    items = ["20"] if SIMULATOR else ["500", "3000"]
    argv = ["--backend", backend, "--items", *items, "--itemsize", "16", "64", "--pattern", pattern]
    opts = parse([*argv, "--rounds", "1", "--seed", "3"])
    records = run(opts)  # raises on any rank that received other than what was sent to it
    assert [(r["itemsize"], r["items_per_rank"]) for r in records] == [
        (b, n) for b in opts.itemsize for n in opts.items
    ]
    assert all(r["rafi_s"] > 0 and r["ranks"] == comm.Get_size() for r in records)
    split = records[0]["rafi_split_s"]
    assert sorted(split) == sorted(("partition", "control", "payload", "host"))
    assert min(split.values()) >= 0 and sum(split.values()) > 0


def test_bench_check_catches_a_changed_byte(comm):
    """The delivery check itself: a flipped body byte or a missing item is an error."""
    from rafi.bench.__main__ import check_delivery, expected_tags, item_dtype

    rank, size = comm.Get_rank(), comm.Get_size()
    tags = expected_tags(50, rank, size, 0, 3)
    got = np.zeros(len(tags), item_dtype(64))
    got["tag"] = tags
    got["body"] = ((tags[:, None] + np.arange(56, dtype=np.uint64)) % 256).astype(np.uint8)
    check_delivery(got[::-1].copy(), 50, rank, size, 0, 3)  # any order is fine
    bad = got.copy()
    bad["body"][len(bad) // 2, 7] ^= 1
    with pytest.raises(AssertionError, match="bytes differ"):
        check_delivery(bad, 50, rank, size, 0, 3)
    with pytest.raises(AssertionError, match="received"):
        check_delivery(got[1:], 50, rank, size, 0, 3)


def test_bench_plot(tmp_path, comm):
    """The plot is written from records (skipped where matplotlib is not installed)."""
    pytest.importorskip("matplotlib")
    from rafi.bench.plot import plot

    records = [
        {"items_per_rank": n, "itemsize": b, "ranks": 2, "pattern": p, "backend": "cpu", "transport": "host",
         "floor": "host Alltoallv", "rafi_s": 1e-3 * n, "raw_floor_s": 5e-4 * n, "hand_written_s": 2e-3 * n,
         "rafi_GBps": 1.0, "raw_floor_GBps": 2.0, "hand_written_GBps": 0.5}
        for p in ("uniform", "hot") for b in (16, 64) for n in (10, 100)
    ]  # fmt: skip
    path = tmp_path / f"bench{comm.Get_rank()}.png"
    plot(records, str(path))
    assert path.stat().st_size > 10_000


def test_resident_bench_times_every_way_and_the_raw_exchange(comm, backend, tmp_path):
    """Each way of running rounds is timed (its check that every item arrived passed), and
    on the cpu backend the raw exchange of the same bytes beside them."""
    import json

    from rafi.bench import node_floor, resident

    path = comm.bcast(str(tmp_path / "resident.json"))
    items = 5 if SIMULATOR else 50
    resident.main(["--backend", backend, "--rounds", "12", "--items", str(items), "--json", path])
    one_node = node_floor.on_one_node(comm)
    if comm.Get_rank() != 0:
        return
    with open(path) as f:
        (record,) = json.load(f)
    ways = [f"{case}, {way}" for case in ("1 item", f"{items} items") for way in
            ("resident run", "resident forward", "bsp run")]  # fmt: skip
    assert all(record[way] > 0 for way in ways)
    raw = f"{items} items, raw exchange"
    assert (raw in record) == (backend == "cpu" and one_node)
    assert record.get(raw, 1) > 0


def test_the_raw_exchange_reads_what_was_written(comm, monkeypatch):
    """``rafi.bench.node_floor``'s ring: every rank reads each round's words from its
    neighbour (the sum it checks: the words name their writer), in both kinds of store; a
    wrong sum is an error on every rank."""
    from rafi.bench import node_floor

    if not node_floor.on_one_node(comm):
        pytest.skip("the raw exchange is for ranks on one node")
    with node_floor.Ring(comm, 3) as raw:
        for kind in node_floor.KINDS:
            round_us, write, read, wait = raw.run(4, kind, runs=2)
            assert round_us > 0 and min(write, read, wait) >= 0
        if comm.Get_rank() == 0:  # rank 0 expects other words than its neighbour writes
            expected = node_floor._expected
            monkeypatch.setattr(node_floor, "_expected", lambda *args: expected(*args) + 1)
        with pytest.raises(AssertionError, match="read what was not written"):
            raw._rounds(1, False, np.zeros(3, np.int64))


def test_skew_bench_finishes_every_item(comm, backend):
    """The bsp-against-async benchmark runs both modes and checks every item finished once."""
    from rafi.bench import skew

    skew.main(["--backend", backend, "--items", "10" if SIMULATOR else "300", "--spin", "3", "--hops", "4"])


def test_raytrace_bench_compares_passes_against_the_reference(comm, tmp_path_factory):
    """One run per pass size: each image equals the one-process reference; a pass of every
    sample takes fewer rounds than a sample per pass."""
    import json

    from rafi.bench import raytrace

    path = comm.bcast(str(tmp_path_factory.mktemp("rt") / "rt.json") if comm.Get_rank() == 0 else None)
    size = ["--width", "16", "--height", "12", "--samples", "3", "--grid", "6"]
    raytrace.main([*size, "--backend", "cpu", "--samples-per-pass", "1", "0", "--json", path])
    if comm.Get_rank() == 0:
        with open(path) as f:
            one, every = json.load(f)
        assert (one["samples_per_pass"], every["samples_per_pass"]) == (1, 3)
        assert every["rounds"] < one["rounds"] and every["rays"] == one["rays"]
        assert max(one["max_abs_diff"], every["max_abs_diff"]) < 1e-9


@pytest.mark.parametrize("exchange", ["dense", "sparse"])
def test_anywhere_bench_balances_a_skewed_source(comm, backend, exchange):
    """The ANY benchmark's record: inboxes within 10% of the mean, every item once."""
    from rafi.bench import anywhere

    items = 5 if SIMULATOR else 200
    opts = argparse.Namespace(items=items, skew=10, backend=backend, exchange=exchange, rounds=2)
    record = anywhere.measure(opts)
    assert record["exactly_once"] and record["max_deviation_from_mean"] <= 0.1
    assert sum(record["inbox_after_one_round"]) == items * (comm.Get_size() - 1 + opts.skew)
