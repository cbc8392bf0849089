"""The NCCL transport: one rank per GPU (needs a machine with several GPUs).

NCCL refuses two ranks on one GPU, so on CI (no GPU) and on a one-GPU machine these
skip with the reason; on a multi-GPU machine run ``tests/run.py --gpu --ranks 2 4``.
"""

import numpy as np
import pytest
from mpi4py import MPI

import rafi
from traffic import check_exactly_once, hop_dtype, make_items, random_routes, run_backlog, run_routes

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.cuda_path]


def _one_gpu_per_rank(comm):
    from rafi._targets import simulator

    if simulator():
        return False
    try:
        from numba import cuda

        gpus = len(cuda.gpus) if cuda.is_available() else 0
    except Exception:
        gpus = 0
    from rafi._transports import node_comm

    node = node_comm(comm)
    try:
        enough = node.allreduce(int(gpus >= node.Get_size()), op=MPI.MIN)
    finally:
        node.Free()
    return bool(comm.allreduce(enough, op=MPI.MIN))


@pytest.fixture
def nccl_comm(comm):
    if not _one_gpu_per_rank(comm):
        pytest.skip("NCCL needs a GPU of its own for every rank (a machine with several GPUs)")
    return comm


def test_nccl_exactly_once(nccl_comm):
    comm = nccl_comm
    paths = random_routes(comm, 200, 4, seed=7)
    dtype = hop_dtype(40)
    with rafi.Forwarder(comm, dtype, 200 * comm.Get_size(), backend="cuda", transport="nccl") as fwd:
        assert fwd.transport == "nccl"
        arrived, _ = run_routes(fwd, make_items(dtype, fwd.rank, paths[fwd.rank]))
    check_exactly_once(comm, dtype, paths, arrived)


def test_nccl_flow_control(nccl_comm):
    comm = nccl_comm
    paths = random_routes(comm, 150, 3, seed=8)
    dtype = hop_dtype(8)
    with rafi.Forwarder(comm, dtype, 7, backend="cuda", transport="nccl") as fwd:
        arrived = run_backlog(fwd, make_items(dtype, fwd.rank, paths[fwd.rank]))
    check_exactly_once(comm, dtype, paths, arrived)


def test_nccl_benchmark_against_its_floor(nccl_comm):
    """The forwarding benchmark over NCCL: every byte checked, the bare NCCL floor measured."""
    import argparse

    from rafi.bench.__main__ import run

    opts = argparse.Namespace(
        backend="cuda", transport="nccl", items=[500], itemsize=[64], pattern=["uniform"],
        rounds=1, seed=3, max_bytes=2**30,
    )  # fmt: skip
    (record,) = run(opts)
    assert record["transport"] == "nccl" and record["floor"] == "nccl send/recv"
    assert record["raw_floor_s"] > 0


def test_nccl_refused_on_a_shared_gpu(comm):
    """Where ranks share a GPU (or there is none), asking for NCCL is a ConfigError everywhere."""
    if _one_gpu_per_rank(comm):
        pytest.skip("every rank has its own GPU here")
    with pytest.raises(rafi.ConfigError, match="nccl"):
        rafi.Forwarder(comm, np.int32, 4, backend="cuda", transport="nccl")
