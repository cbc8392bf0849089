"""Configuration: RAFI_* variables, backend and transport choice (mocked topologies)."""

import re
import subprocess
import sys
import types

import pytest

import rafi
from rafi._config import check_environment, env_choice, env_node_size, env_node_stores
from rafi._transports import choose_links, link_name
from rafi._transports._topology import node_gpus


def fake_backend(name, device_arrays, simulator=False, cupy=None, device=0):
    return types.SimpleNamespace(
        name=name, device_arrays=device_arrays, simulator=simulator, cupy=cupy, device=device
    )


GPU = fake_backend("cuda", True)
SIM = fake_backend("cuda", True, simulator=True)
CPU = fake_backend("cpu", False)


@pytest.mark.parametrize(
    "backend, aware, ipc_ok, expected",
    [
        (GPU, True, True, ("ipc", "cuda-aware")),
        (GPU, False, True, ("ipc", "host")),
        (GPU, True, False, ("cuda-aware", "cuda-aware")),
        (GPU, False, False, ("host", "host")),
        (SIM, True, True, ("host", "host")),
        (CPU, True, True, ("shm", "host")),
    ],
)
def test_auto_links(backend, aware, ipc_ok, expected, monkeypatch):
    monkeypatch.delenv("RAFI_TRANSPORT", raising=False)
    assert choose_links("auto", backend, aware, ipc_ok if backend is GPU else False) == expected


def test_device_pointers_never_reach_plain_mpi(monkeypatch):
    monkeypatch.delenv("RAFI_TRANSPORT", raising=False)
    for backend in (GPU, SIM, CPU):
        for ipc_ok in (False, True):
            assert "cuda-aware" not in choose_links("auto", backend, False, ipc_ok)
            assert "cuda-aware" not in choose_links("ipc", GPU, False, True)
        with pytest.raises(rafi.ConfigError, match="cuda-aware"):
            choose_links("cuda-aware", backend, False, True)
    assert choose_links("cuda-aware", GPU, True, True) == ("cuda-aware", "cuda-aware")


def test_ipc_needs_a_real_gpu_and_reachable_peers(monkeypatch):
    monkeypatch.delenv("RAFI_TRANSPORT", raising=False)
    for backend in (SIM, CPU):
        with pytest.raises(rafi.ConfigError, match="cuda backend on a GPU"):
            choose_links("ipc", backend, False, True)
    with pytest.raises(rafi.ConfigError, match="cannot map each other"):
        choose_links("ipc", GPU, False, False)
    assert choose_links("ipc", GPU, False, True) == ("ipc", "host")
    assert choose_links("host", GPU, True, True) == ("host", "host")


def test_nccl_only_when_asked_and_every_rank_has_its_own_gpu(monkeypatch):
    monkeypatch.delenv("RAFI_TRANSPORT", raising=False)
    assert choose_links("nccl", GPU, False, True, nccl_ok=True) == ("nccl", "nccl")
    assert "nccl" not in choose_links("auto", GPU, False, True, nccl_ok=True)  # not yet run on several GPUs
    with pytest.raises(rafi.ConfigError, match="GPU of its own"):
        choose_links("nccl", GPU, True, True, nccl_ok=False)
    for backend in (SIM, CPU):
        with pytest.raises(rafi.ConfigError, match="cuda backend on a GPU"):
            choose_links("nccl", backend, False, False, nccl_ok=True)


def test_shm_is_for_cpu_rounds(monkeypatch):
    monkeypatch.delenv("RAFI_TRANSPORT", raising=False)
    assert choose_links("shm", CPU, False, False) == ("shm", "host")
    assert choose_links("auto", CPU, False, False, rounds=False) == ("host", "host")  # async: channels
    for backend in (GPU, SIM):
        with pytest.raises(rafi.ConfigError, match="cpu backend"):
            choose_links("shm", backend, False, True)
    with pytest.raises(rafi.ConfigError, match="mode async"):
        choose_links("shm", CPU, False, False, rounds=False)
    monkeypatch.setenv("RAFI_TRANSPORT", "host")
    assert choose_links("auto", CPU, False, False) == ("host", "host")


def test_rafi_transport_overrides_auto_only(monkeypatch):
    monkeypatch.setenv("RAFI_TRANSPORT", "host")
    assert choose_links("auto", GPU, True, True) == ("host", "host")
    assert choose_links("cuda-aware", GPU, True, True) == ("cuda-aware", "cuda-aware")
    monkeypatch.setenv("RAFI_TRANSPORT", "ipc")
    assert choose_links("auto", GPU, False, True) == ("ipc", "host")


@pytest.mark.parametrize(
    "node, remote, node_size, size, expected",
    [
        ("ipc", "host", 4, 4, "ipc"),  # one node
        ("ipc", "host", 2, 8, "ipc+host"),  # 4 nodes of 2 ranks
        ("ipc", "cuda-aware", 4, 8, "ipc+cuda-aware"),
        ("ipc", "host", 1, 8, "host"),  # one rank per node: nobody to map
        ("ipc", "host", 1, 1, "host"),
        ("host", "host", 4, 4, "host"),
        ("cuda-aware", "cuda-aware", 2, 8, "cuda-aware"),
        ("shm", "host", 2, 2, "shm"),
        ("shm", "host", 2, 4, "shm+host"),
    ],
)
def test_link_names_per_peer_class(node, remote, node_size, size, expected):
    assert link_name(node, remote, node_size, size) == expected


class FakeNode:
    """One rank's view of a node communicator whose ranks hold the given values."""

    def __init__(self, rank, values):
        self.rank, self.values = rank, values

    def Get_rank(self):
        return self.rank

    def allgather(self, value):
        assert value == self.values[self.rank]
        return list(self.values)

    def Allreduce(self, send, recv, op=None):
        recv[...] = send  # this rank's own verdict; the real MIN is MPI's


class FakeRuntime:
    """The CuPy runtime calls node_gpus makes, over a table of GPUs and peer links."""

    def __init__(self, visible, links):
        self.visible, self.links = visible, links  # visible: bus id per local ordinal

    def deviceGetPCIBusId(self, device):
        return self.visible[device]

    def deviceGetByPCIBusId(self, bus):
        if bus not in self.visible:
            raise RuntimeError("invalid device")
        return self.visible.index(bus)

    def deviceCanAccessPeer(self, mine, theirs):
        return int((self.visible[mine], self.visible[theirs]) in self.links)


def reachable(rank, devices, visible, links):
    """What ``node_gpus`` says of reachability on ``rank`` (node rank r uses GPU ``devices[r]``)."""
    runtime = FakeRuntime(visible, links)
    cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=runtime))
    backend = fake_backend("cuda", True, cupy=cupy, device=devices[rank])
    return node_gpus(FakeNode(rank, [visible[d] for d in devices]), backend).reachable


def test_gpu_topologies():
    both = {("A", "B"), ("B", "A")}
    # several ranks on one GPU: always mappable
    assert all(reachable(r, [0, 0, 0], ["A"], set()) for r in range(3))
    # two GPUs with peer access, two ranks each
    assert all(reachable(r, [0, 0, 1, 1], ["A", "B"], both) for r in range(4))
    # two GPUs without peer access
    assert not any(reachable(r, [0, 1], ["A", "B"], set()) for r in range(2))
    # one-way peer access is not enough for the side that lacks it
    assert not reachable(1, [0, 1], ["A", "B"], {("A", "B")})


def own(rank, devices, visible):
    """What ``node_gpus`` says of GPUs of their own on ``rank`` (node rank r uses ``devices[r]``)."""
    cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=FakeRuntime(visible, set())))
    backend = fake_backend("cuda", True, cupy=cupy, device=devices[rank])
    return node_gpus(FakeNode(rank, [visible[d] for d in devices]), backend).own


def test_own_gpus_per_rank():
    assert all(own(r, [0, 1, 2, 3], ["A", "B", "C", "D"]) for r in range(4))
    assert not any(own(r, [0, 0, 1], ["A", "B"]) for r in range(3))  # two ranks on GPU A
    assert own(0, [0], ["A"])
    assert not node_gpus(FakeNode(0, [None, None]), fake_backend("cuda", True, cupy=None)).own


def test_gpu_not_visible_to_a_rank_is_unreachable():
    class Hidden(FakeRuntime):
        def deviceGetByPCIBusId(self, bus):
            raise RuntimeError("invalid device")  # CUDA_VISIBLE_DEVICES hides the peer's GPU

    cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=Hidden(["A", "B"], set())))
    backend = fake_backend("cuda", True, cupy=cupy, device=0)
    assert not node_gpus(FakeNode(0, ["A", "B"]), backend).reachable


def test_no_cupy_no_ipc():
    assert not node_gpus(FakeNode(0, [None, None]), fake_backend("cuda", True, cupy=None)).reachable


def test_progress_choice(monkeypatch):
    """auto means polling (measured the faster, bench/RESULTS.md); RAFI_PROGRESS overrides
    auto only; a thread needs MPI_THREAD_MULTIPLE; rounds take no progress engine."""
    from mpi4py import MPI

    from rafi._progress import choose_progress

    assert choose_progress("auto", "async") == "poll"
    assert choose_progress("thread", "async") == "thread"
    assert choose_progress("auto", "bsp") is None
    monkeypatch.setenv("RAFI_PROGRESS", "thread")
    assert choose_progress("auto", "async") == "thread"
    assert choose_progress("poll", "async") == "poll"
    monkeypatch.setattr(MPI, "Query_thread", lambda: MPI.THREAD_SERIALIZED)
    with pytest.raises(rafi.ConfigError, match="MPI_THREAD_MULTIPLE"):
        choose_progress("auto", "async")
    with pytest.raises(rafi.ConfigError, match="is for mode='async'"):
        choose_progress("poll", "bsp")


def test_env_checks():
    assert env_choice("BACKEND", "auto", {"RAFI_BACKEND": "cpu"}) == "cpu"
    assert env_choice("BACKEND", "cuda", {"RAFI_BACKEND": "cpu"}) == "cuda"
    with pytest.raises(rafi.ConfigError, match="RAFI_BAKCEND"):
        check_environment({"RAFI_BAKCEND": "cpu"})
    with pytest.raises(rafi.ConfigError, match="RAFI_BACKEND='gpu'"):
        check_environment({"RAFI_BACKEND": "gpu"})


def test_node_size_env():
    assert env_node_size({}) is None and env_node_size({"RAFI_NODE_SIZE": ""}) is None
    assert env_node_size({"RAFI_NODE_SIZE": "2"}) == 2 and env_node_size({"RAFI_NODE_SIZE": " 3 "}) == 3
    for bad in ("0", "-1", "1.5", "2x", "+2"):
        with pytest.raises(rafi.ConfigError, match=re.escape(f"RAFI_NODE_SIZE={bad!r} is not a positive")):
            env_node_size({"RAFI_NODE_SIZE": bad})


def test_node_stores_env():
    assert env_node_stores({}) == "auto" and env_node_stores({"RAFI_NODE_STORES": ""}) == "auto"
    assert env_node_stores({"RAFI_NODE_STORES": "cached"}) == "cached"
    assert env_node_stores({"RAFI_NODE_STORES": "streaming"}) == "streaming"
    with pytest.raises(rafi.ConfigError, match="RAFI_NODE_STORES='nt' is not one of cached, streaming"):
        env_node_stores({"RAFI_NODE_STORES": "nt"})
    with pytest.raises(rafi.ConfigError, match="RAFI_NODE_STORES='nt'"):
        check_environment({"RAFI_NODE_STORES": "nt"})


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


@pytest.mark.parametrize("backend", ["cpu", "cuda"])  # this test's own parameter, no fixture
def test_cuda_variants_are_marked_for_the_runner(request, backend):
    """tests/run.py selects the cuda path by the ``cuda_path`` mark that conftest gives every
    test run with ``backend="cuda"``: without it, the simulator steps would skip them all."""
    assert (request.node.get_closest_marker("cuda_path") is not None) == (backend == "cuda")
