"""What rafi finds where it runs, for bug reports: ``python -m rafi`` (also under mpirun).

``collect`` probes versions, the MPI library, the GPUs of each node and what
``backend="auto"`` and ``transport="auto"`` would choose, through rafi's own choosing
functions and without allocating on a GPU. Every probe is guarded: one that fails
reports ``{"error": "Type: message"}`` in place of its answer. Under mpirun every rank
probes and rank 0 receives the whole report, its ranks grouped per node.
"""

import collections
import importlib
import os
import platform
import re
import socket
import sys

from ._mpi_support import node_comm
from ._targets import simulator

__all__ = ["collect"]

# (label, module): each one's version is the imported module's own __version__
MODULES = (
    ("rafi", "rafi"),
    ("numpy", "numpy"),
    ("numba", "numba"),
    ("numba-cuda", "numba_cuda"),
    ("CuPy", "cupy"),
    ("mpi4py", "mpi4py"),
    ("h5py", "h5py"),
)
# Variables that change what rafi (or the MPI and CUDA under it) does; a trailing _ is a prefix.
ENVIRONMENT = (
    "RAFI_",
    "NUMBA_ENABLE_CUDASIM",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_MPS_PIPE_DIRECTORY",
    "MPICH_GPU_SUPPORT_ENABLED",
    "OMPI_MCA_",
)
# What Open MPI's launchers export for their own bookkeeping (4.1 and 5.0), left out of ENVIRONMENT.
_LAUNCHER_STATE = (
    "OMPI_MCA_orte_",
    "OMPI_MCA_ess",
    "OMPI_MCA_pmix",
    "OMPI_MCA_initial_wdir",
    "OMPI_MCA_PREFIXES",
    "OMPI_MCA_num_procs",
    "OMPI_MCA_cpu_type",
)
_THREAD_LEVELS = ("THREAD_SINGLE", "THREAD_FUNNELED", "THREAD_SERIALIZED", "THREAD_MULTIPLE")
_MPS_PIPE = "/tmp/nvidia-mps"  # the MPS control pipe's directory unless CUDA_MPS_PIPE_DIRECTORY says

# What a transport choice reads of a backend: its facts, without making it (that allocates).
_BackendFacts = collections.namedtuple(
    "_BackendFacts", ["name", "device_arrays", "simulator", "cupy", "device"]
)


def _error(exc):
    return {"error": f"{type(exc).__name__}: {' '.join(str(exc).split())}"}


def _guard(probe, *args):
    """``probe(*args)``, or ``{"error": ...}`` saying why it failed."""
    try:
        return probe(*args)
    except Exception as exc:  # a probe must never end the report
        return _error(exc)


def failed(value):
    """True when ``value`` is a failed probe's ``{"error": ...}``."""
    return isinstance(value, dict) and set(value) == {"error"}


def _version(module):
    try:
        return importlib.import_module(module).__version__
    except ModuleNotFoundError as exc:
        if exc.name != module:  # present, but something it needs is missing
            raise
        return "not installed"


def versions():
    """The versions of Python, the OS and the packages rafi uses ("not installed" when absent)."""
    found = {"Python": f"{platform.python_version()} ({sys.executable})", "OS": platform.platform()}
    for label, module in MODULES:
        found[label] = _guard(_version, module)
    return found


def environment():
    """The variables of ``ENVIRONMENT`` that are set, with their values (less launcher state)."""
    return {
        name: value
        for name, value in sorted(os.environ.items())
        if any(name.startswith(key) if key.endswith("_") else name == key for key in ENVIRONMENT)
        and not name.startswith(_LAUNCHER_STATE)
    }


def mpi(MPI):
    """The MPI library, its version, thread level and whether it takes CUDA device buffers."""
    from ._mpi_support import cuda_support

    def vendor():
        name, version = MPI.get_vendor()
        return f"{name} {'.'.join(map(str, version))}"

    def cuda_aware():
        answer, how = cuda_support()
        return {"answer": answer, "how": how}

    levels = {getattr(MPI, level): f"MPI_{level}" for level in _THREAD_LEVELS}
    return {
        "library": _guard(lambda: MPI.Get_library_version().strip("\x00 \n")),
        "vendor": _guard(vendor),
        "standard": _guard(lambda: "MPI {}.{}".format(*MPI.Get_version())),
        "thread level": _guard(lambda: levels[MPI.Query_thread()]),
        "cuda-aware": _guard(cuda_aware),
    }


def _no_gpu_reason():
    try:
        from numba import cuda
    except ImportError as exc:
        return f"numba-cuda cannot be imported ({exc})"
    reason = cuda.cuda_error()
    return " ".join(str(reason).split()) if reason else "numba.cuda.is_available() is False"


def backend_choice():
    """What ``backend="auto"`` gives on this rank (``choose_backend``), and why."""
    from ._backends import choose_backend

    name = choose_backend("auto")
    if os.environ.get("RAFI_BACKEND"):
        why = f"RAFI_BACKEND={os.environ['RAFI_BACKEND']}"
    elif name == "cuda" and simulator():
        why = "NUMBA_ENABLE_CUDASIM is set: numba-cuda's simulator runs the kernels on the CPU"
    elif name == "cuda":
        why = "numba.cuda.is_available(): a GPU is usable"
    else:
        why = f"no usable GPU: {_no_gpu_reason()}"
    return {"name": name, "why": why}


def _describe(gpu):
    from numba.cuda.cudadrv.driver import driver

    bus = f"{gpu.PCI_DOMAIN_ID:04x}:{gpu.PCI_BUS_ID:02x}:{gpu.PCI_DEVICE_ID:02x}.0".upper()
    return {
        "device": gpu.id,
        "name": gpu.name.decode() if isinstance(gpu.name, bytes) else str(gpu.name),
        "compute capability": "{}.{}".format(*gpu.compute_capability),
        "memory GiB": round(driver.cuDeviceTotalMem(gpu.id) / 2**30, 1),
        "pci bus": bus,
    }


def chosen_gpu(backend, local_rank):
    """The GPU a cuda backend made without ``device=`` takes: the node-local rank modulo the
    visible GPUs (as ``CudaBackend`` does); None on the cpu backend."""
    if backend != "cuda":
        return None
    if simulator():
        return "simulated GPU"
    from numba import cuda

    return _describe(cuda.gpus[local_rank % len(cuda.gpus)])


def _driver(driver):
    """The NVIDIA kernel driver's version (where /proc shows it) and the CUDA version it serves."""
    cuda = "CUDA {}.{}".format(*driver.get_version())
    try:
        with open("/proc/driver/nvidia/version") as lines:
            found = re.search(r"\s(\d+\.\d+(\.\d+)?)\s", lines.readline())
    except OSError:  # not in every container
        found = None
    return f"{found.group(1)} ({cuda})" if found else cuda


def mps():
    """Whether NVIDIA MPS serves this node: its control pipe, and a control daemon seen here."""
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or _MPS_PIPE
    control = os.path.exists(os.path.join(pipe, "control"))
    daemons = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/comm") as comm:
                if comm.read().strip() == "nvidia-cuda-mps-control":
                    daemons.append(int(pid))
        except OSError:  # gone, or not ours to read
            continue
    seen = f"nvidia-cuda-mps-control pid {', '.join(map(str, daemons))}" if daemons else "no daemon seen"
    if control:
        return f"on (control pipe in {pipe}; {seen})"
    return f"off (no control pipe in {pipe}; {seen})"


def node_gpus():
    """This node's GPUs, CUDA driver and runtime versions and MPS, as numba-cuda and CuPy see them."""
    if simulator():
        return {"gpus": "none probed: NUMBA_ENABLE_CUDASIM is set (numba-cuda's CUDA simulator)"}
    from numba import cuda
    from numba.cuda.cudadrv import driver, runtime

    if not cuda.is_available():
        found = {"gpus": f"none usable: {_no_gpu_reason()}"}
    else:
        found = {"gpus": [_guard(_describe, gpu) for gpu in cuda.gpus]}
        found["driver"] = _guard(_driver, driver)
        found["NVRTC"] = _guard(lambda: "{}.{} (numba-cuda)".format(*runtime.get_version()))
        found["CUDA runtime"] = _guard(_cupy_runtime)
    found["MPS"] = _guard(mps)
    return found


def _cupy_runtime():
    try:
        import cupy
    except ModuleNotFoundError:
        return "CuPy not installed"
    version = cupy.cuda.runtime.runtimeGetVersion()
    return f"{version // 1000}.{version % 1000 // 10} (CuPy)"


def _backend_facts(name, gpu):
    device = gpu["device"] if isinstance(gpu, dict) and "device" in gpu else 0
    if name == "cpu" or simulator():
        return _BackendFacts(name, name == "cuda", simulator(), None, device)
    try:
        import cupy

        cupy.cuda.runtime.deviceGetPCIBusId(device)  # node_gpus asks first; no rank may fail there alone
    except Exception:  # CuPy missing or unable: the backend would have none (no IPC)
        cupy = None
    return _BackendFacts(name, True, False, cupy, device)


def _reasons(facts, backend):
    reasons = [f"backend {backend.name}{' (simulated)' if backend.simulator else ''}"]
    if os.environ.get("RAFI_TRANSPORT"):
        reasons.append(f"RAFI_TRANSPORT={os.environ['RAFI_TRANSPORT']}")
    if backend.device_arrays and not backend.simulator:
        said = {True: "yes", False: "no"}
        reasons.append(f"MPI takes device buffers on every rank: {said[facts.cuda_aware]}")
        reasons.append(f"the node's GPUs map each other's memory: {said[facts.ipc_ok]}")
    return "; ".join(reasons)


def transport_choice(comm, node, backend, gpu):
    """Collective: what ``transport="auto"`` gives in ``mode="bsp"`` on this rank's node
    (``link_facts``, ``choose_links``, ``link_name``), and why; made only where every rank
    chose the same backend, as a Forwarder demands."""
    from ._config import env_choice
    from ._transports import choose_links, link_facts, link_name

    names = comm.allgather(None if failed(backend) else backend["name"])
    if None in names or len(set(names)) > 1:
        detail = ", ".join(f"rank {r}: {n or 'failed'}" for r, n in enumerate(names))
        return {"error": f"not chosen: the ranks' backends differ or failed ({detail})"}
    facts = _backend_facts(names[0], gpu)
    explicit = env_choice("TRANSPORT", "auto") in ("ipc", "shm")  # as Links does
    link = link_facts(comm, node, facts, explicit)
    near, far = choose_links("auto", facts, *link)
    node_size, size = node.Get_size(), comm.Get_size()
    return {
        "name": link_name(near, far, node_size, size),
        "node peers": near if node_size > 1 else None,  # None: there are none
        "other nodes": far if node_size < size else None,
        "why": _reasons(link, facts),
    }


def _rank(comm, node):
    """This rank's part of the report; collective over ``comm`` and ``node`` (None without MPI)."""
    if comm is None:
        rank, first, local, size = 0, 0, 0, 1
    else:
        rank, local, size = comm.Get_rank(), node.Get_rank(), node.Get_size()
        first = node.bcast(rank)  # the world rank of the node's first rank: the node's name
    record = {
        "rank": rank,
        "host": socket.gethostname(),
        "node": first,
        "local rank": local,
        "local size": size,
        "environment": environment(),
        "backend": _guard(backend_choice),
    }
    record["gpu"] = _guard(chosen_gpu, record["backend"].get("name"), local)
    if comm is None:
        record["transport"] = {"error": "not chosen: a Forwarder needs mpi4py"}
    else:
        try:
            record["transport"] = transport_choice(comm, node, record["backend"], record["gpu"])
        except Exception as exc:  # after the collectives: what failed was this rank's own
            record["transport"] = _error(exc)
    if local == 0:
        record["cuda"] = _guard(node_gpus)
    return record


def _nodes(records, env):
    """The records grouped per node, each node with its first rank's GPUs and transport, each
    rank with the variables it sees otherwise than ``env`` (None: unset there)."""
    nodes = {}
    for record in records:
        theirs = record.pop("environment")
        names = sorted(set(theirs) | set(env))
        record["environment differs"] = {k: theirs.get(k) for k in names if theirs.get(k) != env.get(k)}
        nodes.setdefault(record.pop("node"), []).append(record)
    return [
        {
            "host": ranks[0]["host"],
            "cuda": ranks[0].pop("cuda"),
            "transport": ranks[0]["transport"],
            "ranks": ranks,
        }
        for ranks in nodes.values()
    ]


def _agreed_backend(records):
    choices = [record["backend"] for record in records]
    if all(choice == choices[0] for choice in choices):
        return choices[0]
    detail = ", ".join(f"rank {r['rank']}: {r['backend'].get('name', 'failed')}" for r in records)
    return {"error": f"the ranks chose differently, which a Forwarder refuses ({detail})"}


def collect():
    """Probe everything; collective over ``COMM_WORLD`` when mpi4py works.

    Returns:
        The report (a dict of plain values) on rank 0, None on the other ranks.
    """
    try:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
    except Exception as exc:  # no mpi4py, or an MPI that cannot start: this process alone
        library, records = _error(exc), [_rank(None, None)]
    else:
        node = node_comm(comm)  # the node as rafi sees it (RAFI_NODE_SIZE included)
        try:
            records = comm.gather(_rank(comm, node), root=0)
        finally:
            node.Free()
        if comm.Get_rank() != 0:
            return None
        library = mpi(MPI)
    env = records[0]["environment"]
    return {
        "versions": versions(),
        "mpi": library,
        "choice": {"backend": _agreed_backend(records)},
        "environment": env,
        "nodes": _nodes(records, env),
    }
