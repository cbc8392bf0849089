"""Settings that must match are agreed, every wait of construction is under the deadline, and
a shared window /dev/shm cannot back is refused: ConfigError (or CollectiveTimeout) on every
rank, never a hang."""

import time

import numpy as np
import pytest

import rafi
from rafi._transports import _shm

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.timeout(60)]


def everyone(comm, ok):
    """Whether ``ok`` holds on every rank (so that one rank's failure fails all)."""
    return all(comm.allgather(bool(ok)))


@pytest.mark.parametrize("first, others", [("shm", "host"), ("auto", "host"), ("host", "auto")])
def test_ranks_passing_different_transports(comm, first, others):
    transport = first if comm.Get_rank() == 0 else others
    with pytest.raises(rafi.ConfigError, match="same transport") as info:
        rafi.Forwarder(comm, np.int32, 8, backend="cpu", transport=transport, timeout=10)
    assert f"rank 0: transport={first!r}" in str(info.value)
    assert f"rank 1: transport={others!r}" in str(info.value)
    with rafi.Forwarder(comm, np.int32, 8, backend="cpu", timeout=10) as fwd:  # still in step
        assert fwd.forward().alive == 0


def test_rafi_transport_set_differently(comm, monkeypatch):
    monkeypatch.setenv("RAFI_TRANSPORT", "shm" if comm.Get_rank() == 0 else "host")
    with pytest.raises(rafi.ConfigError, match="RAFI_TRANSPORT='shm'"):
        rafi.Forwarder(comm, np.int32, 8, backend="cpu")
    # an explicit transport on one rank and the same one through the variable on another agree
    if comm.Get_rank() == 1:
        monkeypatch.delenv("RAFI_TRANSPORT")
    else:
        monkeypatch.setenv("RAFI_TRANSPORT", "host")
    transport = "host" if comm.Get_rank() == 1 else "auto"
    with rafi.Forwarder(comm, np.int32, 8, backend="cpu", transport=transport) as fwd:
        assert fwd.transport == "host"


def test_a_bad_environment_on_one_rank(comm, monkeypatch):
    if comm.Get_rank() == 1:
        monkeypatch.setenv("RAFI_TRANSPORT", "carrier-pigeon")
    with pytest.raises(rafi.ConfigError, match="rank 1: RAFI_TRANSPORT='carrier-pigeon'"):
        rafi.Forwarder(comm, np.int32, 8, backend="cpu")


@pytest.mark.parametrize(
    "setting",
    [
        ("mode", "bsp", "async"),
        ("exchange", "dense", "sparse"),
        ("capacity", 8, 9),
        ("item_dtype", np.int32, np.float32),
        ("progress", "poll", "thread"),
    ],
    ids=lambda s: s[0],
)
def test_what_held_still_holds(comm, setting):
    """Mismatched mode, exchange, capacity, item type and progress: ConfigError on every rank."""
    name, mine, theirs = setting
    given = {"item_dtype": np.int32, "capacity": 8, "backend": "cpu", "timeout": 10}
    if name == "progress":
        given["mode"] = "async"
    given[name] = mine if comm.Get_rank() == 0 else theirs
    dtype, capacity = given.pop("item_dtype"), given.pop("capacity")
    with pytest.raises(rafi.ConfigError, match=f"same {name}"):
        rafi.Forwarder(comm, dtype, capacity, **given)


def test_every_wait_of_construction_is_under_the_deadline(comm, monkeypatch):
    """Rank 1 stops inside construction, after the communicator is made: rank 0 times out in
    the next collective (finding the node's ranks), which blocked forever before."""
    from rafi import _forwarder

    if comm.Get_rank() == 1:
        made = _forwarder.make_backend

        def late(*args, **kwargs):
            time.sleep(4.0)
            return made(*args, **kwargs)

        monkeypatch.setattr(_forwarder, "make_backend", late)
    with pytest.raises(rafi.CollectiveTimeout) as info:
        rafi.Forwarder(comm, np.int32, 8, backend="cpu", timeout=1.5)
    if comm.Get_rank() == 0:
        assert info.value.missing == [1] and "finding the ranks of this node" in str(info.value)
    comm.Barrier()


@pytest.fixture
def small_dev_shm(comm, monkeypatch):
    """/dev/shm with 1 MiB free, as rank 1 alone sees it (a container's small /dev/shm)."""
    if comm.Get_rank() == 1:
        monkeypatch.setattr(_shm, "shm_free", lambda: ("/dev/shm", 1 << 20))


def test_a_window_dev_shm_cannot_back_is_refused_on_every_rank(comm, small_dev_shm):
    capacity = 1 << 16
    with pytest.raises(rafi.ConfigError, match="cannot be backed") as info:
        rafi.Forwarder(comm, np.int64, capacity, backend="cpu", timeout=10)
    text = str(info.value)
    assert f"capacity {capacity}" in text and "/dev/shm has 1.0 MiB free" in text
    assert "smaller capacity" in text and "transport='host'" in text
    assert " MiB together" in text
    with rafi.Forwarder(comm, np.int64, capacity, backend="cpu", transport="host") as fwd:
        fwd.send(np.arange(4, dtype=np.int64), 0)  # the fix works, and the ranks are in step
        assert fwd.forward().alive == 4 * comm.Get_size()


def test_resident_mailboxes_are_checked_too(comm, small_dev_shm):
    with pytest.raises(rafi.ConfigError, match="cannot be backed") as info:
        rafi.Forwarder(comm, np.int64, 1 << 16, backend="cpu", mode="resident", timeout=10)
    assert "mode='bsp' with transport='host'" in str(info.value)


def test_a_window_that_fits_is_made(comm, monkeypatch):
    monkeypatch.setattr(_shm, "shm_free", lambda: ("/dev/shm", 1 << 30))
    with rafi.Forwarder(comm, np.int64, 1 << 10, backend="cpu", transport="shm") as fwd:
        fwd.send(np.arange(3, dtype=np.int64), 0)
        assert fwd.forward().alive == 3 * comm.Get_size()


@pytest.mark.parametrize("mode", ["bsp", "async"])
def test_every_rank_has_its_kernels_when_construction_returns(comm, monkeypatch, mode):
    """The outbox's kernels are loaded (or compiled) inside ``Forwarder()`` on every rank
    before any rank returns: a rank that loads slowly delays the constructor everywhere, not
    the first round (a program timing its rounds timed a peer's loading); one that fails
    fails construction on every rank."""
    from rafi._engines import _base

    made = _base.Partitioner
    if comm.Get_rank() == 1:

        def slow(*args, **kwargs):
            time.sleep(1.0)
            return made(*args, **kwargs)

        monkeypatch.setattr(_base, "Partitioner", slow)
    started = time.perf_counter()
    rafi.Forwarder(comm, np.int32, 8, backend="cpu", mode=mode).close()
    assert everyone(comm, time.perf_counter() - started >= 1.0)

    def broken(*args, **kwargs):
        raise RuntimeError("no kernels here")

    monkeypatch.setattr(_base, "Partitioner", broken if comm.Get_rank() == 1 else made)
    with pytest.raises(Exception) as info:
        rafi.Forwarder(comm, np.int32, 8, backend="cpu", mode=mode)
    assert everyone(comm, "no kernels here" in str(info.value))
