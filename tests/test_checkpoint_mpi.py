"""Checkpoints: restore mid-run and finish exactly once; bad files and rank counts are errors."""

import pathlib
import re

import numpy as np
import pytest

import rafi
from conftest import SIMULATOR
from traffic import check_exactly_once, hop_dtype, make_items, run_routes

pytestmark = pytest.mark.mpi(min_size=2)


def paths_for(size, n):
    rng = np.random.default_rng(11)
    return [[list(rng.integers(0, size, rng.integers(2, 5))) for _ in range(n)] for _ in range(size)]


def shared_path(comm, tmp_path_factory, name):
    return comm.bcast(str(tmp_path_factory.mktemp("ckpt") / name) if comm.Get_rank() == 0 else None, root=0)


def test_checkpoint_mid_run_then_finish(comm, backend, tmp_path_factory):
    """Checkpoint after round 1 of a multi-hop run, 'die', restore, finish: exactly once."""
    size, rank = comm.Get_size(), comm.Get_rank()
    paths = paths_for(size, 4 if SIMULATOR else 40)
    dtype = hop_dtype(24)
    path = shared_path(comm, tmp_path_factory, "run.h5")
    capacity = sum(len(p) for p in paths)
    arrived = []

    def die_after_checkpoint(fwd, result):
        if result.round == 1:
            fwd.checkpoint(path, state={"seen": np.array([rank, result.round])})
            raise KeyboardInterrupt

    with rafi.Forwarder(comm, dtype, capacity, backend=backend) as fwd:
        with pytest.raises(KeyboardInterrupt):
            run_routes(
                fwd, make_items(dtype, rank, paths[rank]), arrived=arrived, on_round=die_after_checkpoint
            )
    fwd, state = rafi.Forwarder.restore(comm, path, backend=backend)
    with fwd:
        assert list(state["seen"]) == [rank, 1]
        _, results = run_routes(fwd, np.zeros(0, dtype), arrived=arrived, resume=True)
    assert results[0].round == 2
    check_exactly_once(comm, dtype, paths, np.concatenate(arrived))


def test_restore_on_another_rank_count_needs_route(comm, tmp_path_factory):
    """Written by all ranks, restored by rank 0 alone: an error without route, all items with it."""
    from mpi4py import MPI

    rank, size = comm.Get_rank(), comm.Get_size()
    path = shared_path(comm, tmp_path_factory, "resize.h5")
    with rafi.Forwarder(comm, np.int64, 16, backend="cpu") as fwd:
        fwd.send(np.arange(4, dtype=np.int64) + 100 * rank, (rank + 1) % size)
        fwd.checkpoint(path)
    alone = comm.Split(0 if rank == 0 else MPI.UNDEFINED, rank)
    if rank == 0:
        with pytest.raises(rafi.ConfigError, match="route="):
            rafi.Forwarder.restore(alone, path, backend="cpu")
        fwd, state = rafi.Forwarder.restore(
            alone, path, route=lambda items: np.zeros(len(items)), backend="cpu"
        )
        with fwd:
            result = fwd.forward()
            got = np.sort(rafi.asnumpy(fwd.inbox))
        expected = np.sort(np.concatenate([np.arange(4) + 100 * r for r in range(size)]))
        np.testing.assert_array_equal(got, expected)
        assert result.alive == 4 * size and state == {}
        alone.Free()
    comm.Barrier()


def test_bad_files_raise_checkpoint_error(comm, tmp_path_factory):
    import h5py

    rank = comm.Get_rank()
    good = shared_path(comm, tmp_path_factory, "good.h5")
    with rafi.Forwarder(comm, np.int32, 8, backend="cpu") as fwd:
        fwd.send(np.arange(5, dtype=np.int32), 0)
        fwd.checkpoint(good)
    base = good[: -len("good.h5")]
    if rank == 0:
        data = pathlib.Path(good).read_bytes()
        pathlib.Path(base + "truncated.h5").write_bytes(data[: len(data) // 2])
        pathlib.Path(base + "foreign.h5").write_bytes(b"not an hdf5 file at all")
        with h5py.File(base + "other.h5", "w") as f:
            f["x"] = np.arange(3)
        pathlib.Path(base + "corrupt.h5").write_bytes(data)
        with h5py.File(base + "corrupt.h5", "r+") as f:  # flip the values, keep the checksum
            ds = f["rank_0/outbox_items"]
            ds[...] = ds[()] + 1
    comm.Barrier()
    for name, message in [
        ("truncated.h5", "cannot be read"),
        ("foreign.h5", "cannot be read"),
        ("other.h5", "not a rafi checkpoint"),
        ("missing.h5", "cannot be read"),
    ]:
        with pytest.raises(rafi.CheckpointError, match=message):
            rafi.Forwarder.restore(comm, base + name, backend="cpu")
    # corruption is found by the rank whose data it is, and raised on all
    with pytest.raises(rafi.CheckpointError, match="checksum"):
        rafi.Forwarder.restore(comm, base + "corrupt.h5", backend="cpu")
    fwd, _ = rafi.Forwarder.restore(comm, good, backend="cpu")
    with fwd:
        assert fwd.forward().alive == 5 * comm.Get_size()


def test_interrupted_checkpoint_leaves_previous_intact(comm, tmp_path_factory, monkeypatch):
    from rafi import _checkpoint

    path = shared_path(comm, tmp_path_factory, "keep.h5")
    with rafi.Forwarder(comm, np.int32, 8, backend="cpu") as fwd:
        fwd.send(np.arange(3, dtype=np.int32), 0)
        fwd.checkpoint(path, state={"k": np.array([1])})
        fwd.send(np.arange(2, dtype=np.int32), 0)

        def crash(*args, **kwargs):
            raise OSError("disk full")

        monkeypatch.setattr(_checkpoint, "_put", crash)  # every rank fails mid-write
        with pytest.raises(rafi.CheckpointError, match="disk full"):
            fwd.checkpoint(path, state={"k": np.array([2])})
        monkeypatch.undo()
    fwd, state = rafi.Forwarder.restore(comm, path, backend="cpu")
    with fwd:
        assert list(state["k"]) == [1] and fwd.forward().alive == 3 * comm.Get_size()


def test_resume_with_other_options_names_them(comm, tmp_path_factory):
    """A checkpoint records the run's options; restoring with others is a ConfigError on
    every rank that names each differing option; the same options restore."""
    path = shared_path(comm, tmp_path_factory, "options.h5")
    options = {"width": 64, "scene": "spheres", "size": (2, 3)}
    with rafi.Forwarder(comm, np.int64, 8, backend="cpu") as fwd:
        fwd.send(np.arange(3, dtype=np.int64), comm.Get_rank())
        fwd.checkpoint(path, options=options)
    other = {"width": 128, "scene": "spheres", "seed": 2, "size": [2, 3]}
    with pytest.raises(rafi.ConfigError) as error:
        rafi.Forwarder.restore(comm, path, backend="cpu", options=other)
    message = str(error.value)
    assert (
        "width: 64 in the checkpoint, 128 now" in message
        and "seed: not set in the checkpoint, 2 now" in message
    )
    assert "scene" not in message and "size" not in message and error.value.collective
    fwd, _ = rafi.Forwarder.restore(comm, path, backend="cpu", options=dict(options))
    with fwd:
        assert fwd.forward().received == 3


def refused(comm, capsys, run):
    """What rank 0 printed when ``run()`` exited with a usage error on every rank."""
    with pytest.raises(SystemExit) as exit:
        run()
    assert exit.value.code == 2
    return comm.bcast(capsys.readouterr().err if comm.Get_rank() == 0 else None, root=0)


def test_ray_tracer_refuses_a_resume_at_another_size(comm, tmp_path_factory, capsys):
    from rafi.examples import raytrace

    path = shared_path(comm, tmp_path_factory, "render.h5")
    common = ["--height", "8", "--samples", "1", "--backend", "cpu", "--quiet", "--checkpoint-every", "1"]
    raytrace.main(["--width", "8", *common, "--checkpoint", path, "--output", path + ".png"])
    again = ["--width", "12", *common, "--resume", path, "--output", path + ".png"]
    assert "width: 8 in the checkpoint, 12 now" in refused(comm, capsys, lambda: raytrace.main(again))


def test_ray_tracer_resumes_a_pass_of_several_samples(comm, tmp_path_factory, monkeypatch, capsys):
    """A checkpoint taken while the first of two passes traces two samples together resumes
    into the image of the uninterrupted run, through the second pass (the pass's first
    sample and size are part of the saved state)."""
    import h5py

    from rafi.examples import raytrace

    real = rafi.Forwarder.checkpoint

    def first_pass_only(self, path, state=None, options=None):
        if state["sample"][0] == 0:
            real(self, path, state=state, options=options)

    path = shared_path(comm, tmp_path_factory, "passes.h5")
    common = ["--width", "12", "--height", "8", "--samples", "4", "--samples-per-pass", "2"]
    common += ["--backend", "cpu", "--quiet", "--checkpoint-every", "1"]
    raytrace.main([*common, "--output", path + ".whole.npy"])
    said_whole = capsys.readouterr().out
    monkeypatch.setattr(rafi.Forwarder, "checkpoint", first_pass_only)
    raytrace.main([*common, "--checkpoint", path, "--output", path + ".checkpointed.npy"])
    monkeypatch.undo()
    with h5py.File(path, "r") as f:  # the last checkpoint: a round of the first pass
        assert f["rank_0/state/sample"][0] == 0 and f["rank_0/state/samples_per_pass"][0] == 2
    other = [*common, "--samples-per-pass", "3", "--resume", path, "--output", path + ".x.npy"]
    assert "the checkpoint traces 2 samples per pass, not 3" in refused(
        comm, capsys, lambda: raytrace.main(other)
    )
    capsys.readouterr()
    raytrace.main([*common, "--resume", path, "--output", path + ".resumed.npy"])
    if comm.Get_rank() == 0:  # the whole render's rays, and the part traced after resuming
        said = capsys.readouterr().out
        rays = re.search(r"([\d,]+) rays traced in", said_whole).group(1)
        after = re.search(rf"{rays} rays traced, ([\d,]+) of them after resuming, in", said)
        assert after and 0 < int(after.group(1).replace(",", "")) < int(rays.replace(",", "")), said
        assert "\nafter resuming, forwarded " in said, said
        whole, resumed = np.load(path + ".whole.npy"), np.load(path + ".resumed.npy")
        np.testing.assert_allclose(resumed, whole, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(np.load(path + ".checkpointed.npy"), whole, rtol=1e-9, atol=1e-12)
