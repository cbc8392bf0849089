"""``python -m rafi``: the system report, as a user runs it (one process, and under mpirun)."""

import importlib
import json
import os
import platform
import subprocess
import sys

import pytest

import jobs
from rafi import __main__ as cli
from rafi import _report

SECTIONS = ("Versions", "MPI", "Choice", "Environment", "Node ")


def report(*args, env=None, python=("-m", "rafi")):
    """Run ``python -m rafi ARGS`` (or ``python PYTHON ARGS``) in a process of its own; return its stdout."""
    done = subprocess.run(
        [sys.executable, *python, *args],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=jobs.ROOT,
        env=jobs.clean_environment({**os.environ, **(env or {})}),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def imported_version(module):
    try:
        return importlib.import_module(module).__version__
    except ModuleNotFoundError:
        return "not installed"


def test_text_report_has_every_section():
    lines = report().splitlines()
    assert lines[0].startswith("rafi ") and "system report" in lines[0]
    for section in SECTIONS:
        assert any(line.startswith(section) for line in lines), section
    assert any(line.strip().startswith("rank 0 ") for line in lines)


def test_json_versions_match_the_imported_modules():
    found = json.loads(report("--json"))
    assert set(found) == {"versions", "mpi", "choice", "environment", "nodes"}
    assert found["versions"]["Python"].startswith(platform.python_version())
    for label, module in _report.MODULES:
        assert found["versions"][label] == imported_version(module), label
    from mpi4py import MPI

    assert found["mpi"]["library"] == MPI.Get_library_version().strip("\x00 \n")
    assert found["mpi"]["cuda-aware"]["answer"] is False  # the PyPI Open MPI is not CUDA-aware


def test_no_gpu_is_said_so():
    from numba import cuda

    if cuda.is_available():
        pytest.skip("a GPU (or the simulator) is usable here")
    found = json.loads(report("--json", env={"NUMBA_ENABLE_CUDASIM": "0"}))
    assert found["choice"]["backend"]["name"] == "cpu"
    assert found["choice"]["backend"]["why"].startswith("no usable GPU")
    assert found["nodes"][0]["cuda"]["gpus"].startswith("none usable")


def test_under_the_simulator():
    found = json.loads(report("--json", env={"NUMBA_ENABLE_CUDASIM": "1"}))
    assert found["choice"]["backend"]["name"] == "cuda"
    assert found["environment"]["NUMBA_ENABLE_CUDASIM"] == "1"
    assert found["nodes"][0]["ranks"][0]["gpu"] == "simulated GPU"
    assert found["nodes"][0]["transport"]["name"] == "host"  # one rank


def test_a_failing_probe_reports_its_error_and_the_rest_goes_on():
    text = report(env={"RAFI_BACKEND": "gpu"})
    assert "backend        error: ConfigError: RAFI_BACKEND='gpu' is not one of cuda, cpu" in text
    assert "transport      error: not chosen" in text
    assert "RAFI_BACKEND=gpu" in text and "numba-cuda" in text


def test_without_mpi4py_the_report_still_comes():
    hide = "import sys; sys.modules['mpi4py'] = None; from rafi.__main__ import main; sys.exit(main())"
    text = report(python=("-c", hide))
    assert "mpi4py         not installed" in text and "mpi4py         error: ModuleNotFoundError" in text
    assert "transport      error: not chosen: a Forwarder needs mpi4py" in text and "rank 0 " in text


def test_gpus_and_several_nodes_render(monkeypatch):
    """The text of a GPU node and of a second node (the GPU probes stand in: no GPU here)."""
    h200 = {"device": 0, "name": "NVIDIA H200", "compute capability": "9.0", "memory GiB": 139.8}
    h200["pci bus"] = "0000:1B:00.0"
    cuda = {"gpus": [h200, {"error": "CudaAPIError: boom"}], "driver": "580.1 (CUDA 13.0)", "MPS": "off"}
    monkeypatch.setattr(_report, "node_gpus", lambda: dict(cuda))
    monkeypatch.setattr(_report, "chosen_gpu", lambda backend, local: h200)
    found = _report.collect()
    first = found["nodes"][0]
    failure = {"error": "ConfigError: x"}
    second = {"host": "other", "cuda": {"error": "RuntimeError: no driver"}, "transport": failure}
    differs = {"CUDA_VISIBLE_DEVICES": "1", "RAFI_TIMEOUT": None}
    second["ranks"] = [{**first["ranks"][0], "rank": 1, "transport": failure, "environment differs": differs}]
    text = cli.render({**found, "nodes": [first, second]})
    assert "GPU 0          NVIDIA H200, compute capability 9.0, 139.8 GiB, PCI 0000:1B:00.0" in text
    assert "GPU 1          error: CudaAPIError: boom" in text
    assert "local 0/1, backend" in text and "GPU 0 (NVIDIA H200, 0000:1B:00.0)" in text
    assert f"transport      node {first['host']}: host: no peers" in text
    assert "transport      node other: error: ConfigError: x" in text
    assert "CUDA_VISIBLE_DEVICES=1, RAFI_TIMEOUT unset" in text
    assert "Node other: 1 rank" in text and "CUDA           error: RuntimeError: no driver" in text


@pytest.mark.parametrize("ranks", [2, 3])
def test_under_mpirun_rank_0_reports_every_rank(ranks):
    code, out, err = jobs.run(ranks, ["-m", "rafi", "--json"], env={"NUMBA_ENABLE_CUDASIM": "1"})
    assert code == 0, out + err
    found = json.loads(out)  # printed once, by rank 0
    assert [r["rank"] for node in found["nodes"] for r in node["ranks"]] == list(range(ranks))
    node = found["nodes"][0]
    assert [r["local rank"] for r in node["ranks"]] == list(range(ranks))
    assert node["transport"]["name"] == "host"  # the simulator's items live in host memory
    assert found["choice"]["backend"]["name"] == "cuda"
    text = jobs.run(ranks, ["-m", "rafi"])[1]
    assert f"Node {node['host']}: {ranks} ranks" in text and f"rank {ranks - 1} " in text


def test_the_report_says_whether_resident_rounds_can_run_here():
    from rafi.__main__ import _resident

    gpu = {"device": 0, "name": "H200", "pci bus": "0000:01:00.0"}
    cuda = {"name": "cuda"}

    def node(ranks, mps):
        return {"ranks": [{"gpu": dict(gpu)} for _ in range(ranks)], "cuda": {"MPS": mps}}

    assert _resident({"name": "cpu"}, [node(2, "off")]).startswith(
        "yes, through a file in the node's shared memory"
    )
    assert _resident(cuda, [node(1, "off"), node(1, "off")]) == (
        "yes, over ipc (1 rank per GPU); across the 2 nodes through each rank's host (MPI)"
    )
    assert "without MPS" in _resident(cuda, [node(4, "off (no control pipe)")])
    assert (
        _resident(cuda, [node(4, "on (control pipe in /tmp)")]) == "yes, over ipc (4 ranks per GPU, MPS on)"
    )
    assert _resident(cuda, [node(1, "off")]) == "yes, over ipc (1 rank per GPU)"
