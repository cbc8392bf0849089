"""rafi.Reducer: contributions from every rank combined at the index owners."""

import numpy as np
import pytest

import rafi
from conftest import SIMULATOR
from rafi import device
from traffic import to_backend

pytestmark = pytest.mark.mpi(min_size=2)


@rafi.kernel
def add_all(i, red, index, value):
    device.contribute(red, index[i], value[i])


def _gpu_with_cupy(backend):
    if backend != "cuda" or SIMULATOR:
        return False
    try:
        import cupy  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.parametrize("transport", ["auto", "host"])
@pytest.mark.parametrize(
    "op, dtype", [("sum", np.float64), ("sum", np.int64), ("max", np.float32), ("min", np.int32)]
)
def test_reduce_random_indices(comm, backend, op, dtype, transport):
    rank = comm.Get_rank()
    n, k = 37, (12 if SIMULATOR else 2000)
    rng = np.random.default_rng(7 + rank)
    index = rng.integers(0, n, k).astype(np.int64)
    value = rng.integers(-50, 50, k).astype(dtype)
    with (
        rafi.Reducer(comm, n, dtype, op, backend=backend, transport=transport) as red,
        rafi.Forwarder(comm, np.int32, 4, backend=backend) as fwd,
    ):
        # one node's GPUs combine over IPC (the test launcher keeps every rank on one node)
        ipc = transport == "auto" and _gpu_with_cupy(backend)
        assert red.transport == ("ipc" if ipc else "host"), red.transport_reason
        assert (red.transport_reason is None) == ipc
        for _ in range(2):  # two flushes accumulate (sum) or keep the extreme (max/min)
            fwd.launch(add_all, k, red, to_backend(backend, index), to_backend(backend, value))
            red.flush()
        whole = red.gather(root=0)
        lo, hi = red.lo, red.lo + len(red.local)
    every = comm.allgather((index, value))
    ref = np.full(n, {"sum": 0, "max": np.iinfo(np.int64).min, "min": np.iinfo(np.int64).max}[op], np.float64)
    for idx, val in every:
        ufunc = {"sum": np.add, "max": np.maximum, "min": np.minimum}[op]
        for _ in range(2 if op == "sum" else 1):
            ufunc.at(ref, idx, val.astype(np.float64))
    touched = np.zeros(n, bool)
    for idx, _ in every:
        touched[idx] = True
    got_local = red.local.astype(np.float64)
    np.testing.assert_allclose(got_local[touched[lo:hi]], ref[lo:hi][touched[lo:hi]], rtol=1e-6)
    if rank == 0:
        np.testing.assert_allclose(whole.astype(np.float64)[touched], ref[touched], rtol=1e-6)
    assert comm.allreduce(len(red.local)) == n


@pytest.mark.parametrize("transport", ["auto", "host"])
def test_bad_index_raises_everywhere(comm, backend, transport):
    rank = comm.Get_rank()
    index = np.array([0, 5 if rank == 0 else 1], np.int64)
    with (
        rafi.Reducer(comm, 4, np.float64, backend=backend, transport=transport) as red,
        rafi.Forwarder(comm, np.int32, 4, backend=backend) as fwd,
    ):
        fwd.launch(add_all, 2, red, to_backend(backend, index), to_backend(backend, np.ones(2)))
        with pytest.raises(rafi.ConfigError, match=r"outside \[0, 4\).*rank\(s\) \[0\].*index 5"):
            red.flush()
        red.flush()  # nothing of the failed flush was combined
        assert red.local.sum() == 0


def test_ipc_needs_gpus(comm, backend):
    """transport='ipc' where IPC cannot work is an error on every rank, never a silent host path."""
    if _gpu_with_cupy(backend):
        with rafi.Reducer(comm, 8, np.float64, backend=backend, transport="ipc") as red:
            assert red.transport == "ipc"
        return
    with pytest.raises(rafi.ConfigError, match="transport='ipc'"):
        rafi.Reducer(comm, 8, np.float64, backend=backend, transport="ipc")
    with pytest.raises(rafi.ConfigError, match="transport='bogus' is not one of"):
        rafi.Reducer(comm, 8, np.float64, backend=backend, transport="bogus")


def test_ranks_on_different_backends_combine_through_the_host(comm, backend):
    """A cpu rank beside cuda ranks: every rank takes the host path, none waits for IPC."""
    mine = "cpu" if comm.Get_rank() == 0 else backend  # (a Forwarder would refuse this mix)
    with rafi.Reducer(comm, 6, np.float64, backend=mine) as red:
        assert red.transport == "host" and "cuda backend on a GPU" in red.transport_reason
        red.flush()
        red.flush()
        whole = red.gather(root=0)
        assert whole is None if comm.Get_rank() else np.array_equal(whole, np.zeros(6))


def test_a_backend_failing_on_one_rank_fails_every_rank(comm):
    """One rank asks for a backend that does not exist: every rank raises, none waits."""
    with pytest.raises(rafi.ConfigError, match="nonsense"):
        rafi.Reducer(comm, 4, np.float64, backend="nonsense" if comm.Get_rank() == 1 else "cpu")
    with rafi.Reducer(comm, 4, np.float64, backend="cpu") as red:  # and the ranks are still in step
        red.flush()


def test_out_of_memory_on_one_rank_fails_every_rank(comm, monkeypatch):
    """One rank cannot allocate its partial: every rank raises a ConfigError naming it (and,
    there, the size and the MemoryError, chained), and none waits for it."""
    from rafi._backends._cpu import CpuBackend

    if comm.Get_rank() == 1:

        def refuse(self, shape, dtype):
            raise MemoryError("no room for the partial")

        monkeypatch.setattr(CpuBackend, "zeros", refuse)
    with pytest.raises(rafi.ConfigError, match="no room for the partial") as info:
        rafi.Reducer(comm, 4, np.float64, backend="cpu")
    if comm.Get_rank() == 1:
        assert "cannot be allocated on rank 1" in str(info.value)
        assert isinstance(info.value.__cause__, MemoryError)
    monkeypatch.undo()
    with rafi.Reducer(comm, 4, np.float64, backend="cpu") as red:
        red.flush()


def test_reducer_disagreement(comm):
    with pytest.raises(rafi.ConfigError, match="same n"):
        rafi.Reducer(comm, 4 + comm.Get_rank(), np.float64, backend="cpu")
    with pytest.raises(rafi.ConfigError, match="same n, dtype, op and transport"):
        rafi.Reducer(comm, 4, np.float64, backend="cpu", transport="host" if comm.Get_rank() else "auto")
    with pytest.raises(rafi.ConfigError, match="op"):
        rafi.Reducer(comm, 4, np.float64, op="mean", backend="cpu")
