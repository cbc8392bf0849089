"""Configuration: RAFI_* variables, backend and transport choice (mocked topologies)."""

import subprocess
import sys
import types

import pytest

import rafi
from rafi._config import check_environment, env_choice
from rafi._transports import choose_transport


def fake_backend(name, device_arrays, simulator=False):
    return types.SimpleNamespace(name=name, device_arrays=device_arrays, simulator=simulator)


GPU = fake_backend("cuda", True)
SIM = fake_backend("cuda", True, simulator=True)
CPU = fake_backend("cpu", False)


@pytest.mark.parametrize(
    "backend, aware, expected",
    [(GPU, True, "cuda-aware"), (GPU, False, "host"), (SIM, True, "host"), (CPU, True, "host")],
)
def test_auto_transport(backend, aware, expected, monkeypatch):
    monkeypatch.delenv("RAFI_TRANSPORT", raising=False)
    assert choose_transport("auto", backend, aware) == expected


def test_cuda_aware_never_chosen_for_plain_mpi(monkeypatch):
    monkeypatch.delenv("RAFI_TRANSPORT", raising=False)
    for backend in (GPU, SIM, CPU):
        assert choose_transport("auto", backend, False) == "host"
        with pytest.raises(rafi.ConfigError, match="cuda-aware"):
            choose_transport("cuda-aware", backend, False)
    assert choose_transport("cuda-aware", GPU, True) == "cuda-aware"


def test_rafi_transport_overrides_auto_only(monkeypatch):
    monkeypatch.setenv("RAFI_TRANSPORT", "host")
    assert choose_transport("auto", GPU, True) == "host"
    assert choose_transport("cuda-aware", GPU, True) == "cuda-aware"


def test_env_checks():
    assert env_choice("BACKEND", "auto", {"RAFI_BACKEND": "cpu"}) == "cpu"
    assert env_choice("BACKEND", "cuda", {"RAFI_BACKEND": "cpu"}) == "cuda"
    with pytest.raises(rafi.ConfigError, match="RAFI_BAKCEND"):
        check_environment({"RAFI_BAKCEND": "cpu"})
    with pytest.raises(rafi.ConfigError, match="RAFI_BACKEND='gpu'"):
        check_environment({"RAFI_BACKEND": "gpu"})


def test_backend_env_override(monkeypatch):
    from rafi._backends import choose_backend

    monkeypatch.setenv("RAFI_BACKEND", "cpu")
    assert choose_backend("auto") == "cpu"


def test_cuda_awareness_detection_is_false_on_this_mpi():
    from mpi4py import MPI

    from rafi._mpi_support import mpi_is_cuda_aware

    assert mpi_is_cuda_aware(MPI.COMM_SELF) is False  # the PyPI Open MPI is not CUDA-aware


def test_import_touches_no_gpu_library():
    code = (
        "import sys, rafi; "
        "bad = [m for m in ('cupy', 'numba.cuda') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_error_tree():
    for cls in (rafi.ConfigError, rafi.InvalidDestination, rafi.OutboxOverflow, rafi.CheckpointError):
        assert issubclass(cls, rafi.RafiError)
    assert issubclass(rafi.ConfigError, ValueError)
    assert set(rafi.__all__) <= set(dir(rafi))
