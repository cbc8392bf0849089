"""Checkpoint targets: only a regular file is ever replaced, every rank writes the same file,
the rename waits for every rank's part, and no ``.tmp`` survives a failure."""

import errno
import os
import stat

import numpy as np
import pytest

import rafi
from rafi import _checkpoint

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(60)]


def shared_dir(comm, tmp_path_factory):
    return comm.bcast(str(tmp_path_factory.mktemp("targets")) if comm.Get_rank() == 0 else None, root=0)


def leftovers(directory):
    return sorted(name for name in os.listdir(directory) if name.endswith(".tmp"))


def forwarder(comm):
    fwd = rafi.Forwarder(comm, np.int32, 8, backend="cpu", timeout=30)
    fwd.send(np.arange(3, dtype=np.int32), 0)
    return fwd


def make(kind, directory):
    """A target of ``kind`` in ``directory`` (never a real device such as /dev/full: if the
    check regressed, a checkpoint would be renamed over it, as root)."""
    target = os.path.join(directory, kind)
    if kind == "character device":
        os.mknod(target, stat.S_IFCHR | 0o666, os.makedev(1, 7))  # what /dev/full is
    elif kind == "named pipe":
        os.mkfifo(target)
    elif kind == "directory":
        os.mkdir(target)
    else:
        open(os.path.join(directory, "real.h5"), "w").close()
        os.symlink(os.path.join(directory, "real.h5"), target)
    return target


@pytest.mark.parametrize("kind", ["character device", "named pipe", "directory", "symbolic link"])
def test_a_target_that_is_not_a_regular_file_is_refused(comm, tmp_path_factory, kind):
    if kind == "character device" and os.geteuid() != 0:
        pytest.skip("making a device node needs root (where the bug renamed files over /dev/full)")
    directory = shared_dir(comm, tmp_path_factory)
    target = comm.bcast(make(kind, directory) if comm.Get_rank() == 0 else None, root=0)
    before = os.lstat(target)
    with forwarder(comm) as fwd:
        with pytest.raises(rafi.CheckpointError, match="not a regular file") as info:
            fwd.checkpoint(target)
        assert target in str(info.value)
        assert fwd.forward().alive == 3 * comm.Get_size()  # nothing else changed
    after = os.lstat(target)
    assert (after.st_mode, after.st_ino, after.st_rdev) == (before.st_mode, before.st_ino, before.st_rdev)
    assert leftovers(directory) == [] and not os.path.exists(f"{target}.tmp")


def test_paths_that_differ_between_ranks(comm, tmp_path_factory):
    directory = shared_dir(comm, tmp_path_factory)
    path = os.path.join(directory, f"rank{comm.Get_rank()}.h5")
    with forwarder(comm) as fwd:
        with pytest.raises(rafi.CheckpointError, match="every rank must pass the same checkpoint path"):
            fwd.checkpoint(path)
        same = os.path.join(directory, "same.h5")
        fwd.checkpoint(same)
    comm.Barrier()
    assert sorted(os.listdir(directory)) == ["same.h5"]
    with pytest.raises(rafi.CheckpointError, match="every rank must pass the same checkpoint path"):
        rafi.Forwarder.restore(comm, same if comm.Get_rank() == 0 else path, backend="cpu")
    fwd, _ = rafi.Forwarder.restore(comm, same, backend="cpu")
    with fwd:
        assert fwd.forward().alive == 3 * comm.Get_size()


@pytest.mark.parametrize("where", ["last rank's part", "the rename"])
def test_a_failing_rank_leaves_no_tmp_and_the_previous_file(comm, tmp_path_factory, monkeypatch, where):
    directory = shared_dir(comm, tmp_path_factory)
    path = os.path.join(directory, "run.h5")
    last = comm.Get_size() - 1
    with forwarder(comm) as fwd:
        fwd.checkpoint(path, state={"k": np.array([1])})
        fwd.send(np.arange(2, dtype=np.int32), 0)
        if where == "the rename" and comm.Get_rank() == 0:

            def full(*args):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

            monkeypatch.setattr(_checkpoint.os, "replace", full)
        elif where != "the rename" and comm.Get_rank() == last:

            def full(*args, **kwargs):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

            monkeypatch.setattr(_checkpoint, "_put", full)
        failing = 0 if where == "the rename" else last
        with pytest.raises(rafi.CheckpointError, match=f"rank {failing}: OSError: .*No space left"):
            fwd.checkpoint(path, state={"k": np.array([2])})
        monkeypatch.undo()
        comm.Barrier()
        assert leftovers(directory) == []
    fwd, state = rafi.Forwarder.restore(comm, path, backend="cpu")
    with fwd:
        assert list(state["k"]) == [1] and fwd.forward().alive == 3 * comm.Get_size()


def test_a_stale_tmp_is_replaced(comm, tmp_path_factory):
    directory = shared_dir(comm, tmp_path_factory)
    path = os.path.join(directory, "stale.h5")
    if comm.Get_rank() == 0:
        with open(f"{path}.tmp", "w") as f:
            f.write("left by a writer that was killed")
    comm.Barrier()
    with forwarder(comm) as fwd:
        fwd.checkpoint(path)
    comm.Barrier()
    assert sorted(os.listdir(directory)) == ["stale.h5"]


def test_a_route_that_would_wrap_is_refused(comm, tmp_path_factory):
    from mpi4py import MPI

    rank = comm.Get_rank()
    path = os.path.join(shared_dir(comm, tmp_path_factory), "resize.h5")
    with forwarder(comm) as fwd:
        fwd.checkpoint(path)
    alone = comm.Split(0 if rank == 0 else MPI.UNDEFINED, rank)
    if rank == 0:
        with pytest.raises(rafi.ConfigError, match=r"outside \[0, 1\), e.g. 4294967296"):
            rafi.Forwarder.restore(alone, path, route=lambda items: np.full(len(items), 2**32), backend="cpu")
        alone.Free()
    comm.Barrier()
