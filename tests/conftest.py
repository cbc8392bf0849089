"""Test configuration: backends as a parameter, the simulator's GIL tuning, MPI output."""

import os
import shutil
import sys
import tempfile

import pytest

SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")

if SIMULATOR:
    # The simulator's block manager polls its threads; a short GIL switch interval lets the
    # simulated threads run instead of the poll (about 4x faster rounds).
    sys.setswitchinterval(5e-4)


def _cuda_usable():
    try:
        from numba import cuda

        return bool(cuda.is_available())
    except Exception:
        return False


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda_path: runs the cuda backend (GPU or simulator)")
    try:
        from mpi4py import MPI
    except ImportError:
        return
    world = MPI.COMM_WORLD
    if world.Get_rank() != 0:  # one junit report per run, written by rank 0
        config.option.xmlpath = None
    if world.Get_size() > 1 and not config.option.basetemp:
        # pytest prunes older temporary roots when a session starts, which would delete the
        # directories of the other ranks' sessions: give every rank its own root.
        root = world.bcast(tempfile.mkdtemp(prefix="rafi-pytest-") if world.Get_rank() == 0 else None)
        config.option.basetemp = os.path.join(root, f"rank{world.Get_rank()}")
        config._rafi_temp_root = root


def pytest_collection_modifyitems(config, items):
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("backend") == "cuda":
            item.add_marker(pytest.mark.cuda_path)


@pytest.fixture(scope="session", params=["cpu", "cuda"])
def backend(request):
    """Each backend rafi has; cuda needs a GPU or ``NUMBA_ENABLE_CUDASIM=1``."""
    if request.param == "cuda" and not _cuda_usable():
        pytest.skip("no GPU here; the cuda path runs under NUMBA_ENABLE_CUDASIM=1")
    return request.param


@pytest.fixture(scope="session", params=["bsp", "resident"])
def rounds_mode(request):
    """Each mode of rounds: ``bsp`` (driven by the host) and ``resident`` (on the device;
    across the emulated nodes of ``RAFI_NODE_SIZE``, through the hosts)."""
    return request.param


@pytest.fixture(scope="session")
def comm():
    from mpi4py import MPI

    return MPI.COMM_WORLD


_FAILED = []


def pytest_sessionfinish(session, exitstatus):
    _FAILED.append(exitstatus not in (0, 5))


def pytest_unconfigure(config):
    """Under mpirun, a rank that failed aborts the job: its peers may wait in a collective."""
    try:
        from mpi4py import MPI
    except ImportError:
        return
    world = MPI.COMM_WORLD
    if world.Get_size() > 1 and any(_FAILED):
        sys.stdout.flush()
        sys.stderr.flush()
        world.Abort(1)
    root = getattr(config, "_rafi_temp_root", None)
    if root is not None:  # each rank's own temporary root, then (once all are gone) the shared one
        shutil.rmtree(config.option.basetemp, ignore_errors=True)
        world.Barrier()
        if world.Get_rank() == 0:
            shutil.rmtree(root, ignore_errors=True)


def pytest_runtest_teardown(item, nextitem):
    """After each test, a new communicator on every rank: a message a peer still sends on a
    communicator that rafi freed too early would match it (Open MPI gives a freed
    communicator's context to the next one) and end the job here, at the test that left it."""
    MPI = sys.modules.get("mpi4py.MPI")
    if MPI is not None and MPI.Is_initialized() and not MPI.Is_finalized():
        MPI.COMM_SELF.Dup().Free()
