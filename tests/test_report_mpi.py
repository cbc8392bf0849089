"""Under mpirun, the report gathers every rank and predicts what a Forwarder chooses."""

import numpy as np
import pytest

import rafi
from rafi._report import collect

pytestmark = pytest.mark.mpi(min_size=2)


def test_report_predicts_the_forwarders_choice(comm):
    report = collect()
    with rafi.Forwarder(comm, np.int32, 8) as fwd:  # backend and transport "auto"
        chosen = comm.gather((fwd.backend, fwd.transport))
    if comm.Get_rank() != 0:
        assert report is None
        return
    ranks = [(node, record) for node in report["nodes"] for record in node["ranks"]]
    assert [record["rank"] for _, record in ranks] == list(range(comm.Get_size()))
    predicted = [(record["backend"]["name"], node["transport"]["name"]) for node, record in ranks]
    assert predicted == chosen
    assert report["choice"]["backend"]["name"] == fwd.backend
