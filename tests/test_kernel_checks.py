"""RAFI_BOUNDSCHECK: cpu kernels with numba's index checks, an IndexError instead of a write
past an array (which may crash the rank); its own cache entries; a bad value is refused."""

import numpy as np
import pytest

import rafi
from rafi import _config, _kernel_cache


@rafi.kernel
def write_past(i, out, offset):
    out[i + offset] = 1.0


def test_an_index_out_of_bounds_is_an_index_error(monkeypatch, tmp_path):
    monkeypatch.setenv("RAFI_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("RAFI_BOUNDSCHECK", "1")
    room = np.zeros(16)
    out = room[:4]  # past its end lies more of room: unchecked, the writes would land there
    write_past.launch_cpu(4, out, 0)  # in bounds: runs
    assert out.tolist() == [1.0] * 4
    with pytest.raises(IndexError, match=r"kernel write_past \(RAFI_BOUNDSCHECK=1\): index is out of bounds"):
        write_past.launch_cpu(4, out, 4)
    assert not room[4:].any()
    monkeypatch.setenv("RAFI_BOUNDSCHECK", "0")
    write_past.launch_cpu(2, out, 1)  # unchecked again (in bounds here): another compilation
    assert {key[2] for key in write_past._compiled} == {False, True}


def test_checked_launchers_have_their_own_cache_entries(monkeypatch, tmp_path):
    monkeypatch.setenv("RAFI_CACHE_DIR", str(tmp_path))
    names = set()
    for checked in ("0", "1"):
        monkeypatch.setenv("RAFI_BOUNDSCHECK", checked)
        launcher, cached = _kernel_cache.load_launcher(
            "def launcher(n):\n    pass\n", {}, write_past.py_func, "cpu"
        )
        assert cached
        names.add(launcher.__module__)
    assert len(names) == 2


def test_bad_values_are_refused(monkeypatch):
    monkeypatch.setenv("RAFI_BOUNDSCHECK", "yes")
    with pytest.raises(rafi.ConfigError, match="RAFI_BOUNDSCHECK='yes'"):
        _config.check_environment()
    with pytest.raises(rafi.ConfigError, match="RAFI_BOUNDSCHECK='yes'"):
        _config.env_boundscheck()


def test_a_forwarder_reads_the_variable_when_it_is_made(monkeypatch, tmp_path):
    """Its launches check indices as RAFI_BOUNDSCHECK said then (read once: reading the
    environment at every launch cost about a microsecond of a few)."""
    from mpi4py import MPI

    monkeypatch.setenv("RAFI_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("RAFI_BOUNDSCHECK", "1")
    room = np.zeros(16)
    with rafi.Forwarder(MPI.COMM_SELF, np.int32, 4, backend="cpu") as fwd:
        monkeypatch.setenv("RAFI_BOUNDSCHECK", "0")
        with pytest.raises(IndexError, match=r"kernel write_past \(RAFI_BOUNDSCHECK=1\)"):
            fwd.launch(write_past, 4, room[:4], 4)
    assert not room[4:].any()


@rafi.kernel
def step_writing_past(i, inbox, outbox, out, offset):
    out[i + offset] = 1.0


def test_resident_steps_are_checked_as_launches_are(monkeypatch, tmp_path):
    """A resident round's step body is compiled with the checks its forwarder was made with."""
    from mpi4py import MPI

    monkeypatch.setenv("RAFI_CACHE_DIR", str(tmp_path))
    room = np.zeros(16)
    for checked in ("0", "1"):  # unchecked first: its launcher must not serve the checked run
        monkeypatch.setenv("RAFI_BOUNDSCHECK", checked)
        with rafi.Forwarder(MPI.COMM_SELF, np.int32, 4, backend="cpu", mode="resident") as fwd:
            fwd.send(np.zeros(1, np.int32), 0)
            offset = 0 if checked == "0" else 4  # in bounds, then past the view
            if checked == "1":
                with pytest.raises(IndexError, match="index is out of bounds"):
                    fwd.run(step_writing_past, room[:4], offset, rounds=1)
            else:
                fwd.run(step_writing_past, room[:4], offset, rounds=1)
    assert not room[4:].any()
