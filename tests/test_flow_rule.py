"""The grant rule (rafi/_flow.py): bounded, work-conserving, max-min fair, no starvation."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from rafi._flow import grant

requests = st.lists(st.integers(0, 50), min_size=1, max_size=9)


@given(requests, st.integers(1, 100), st.integers(0, 1000))
def test_grants_are_bounded_and_work_conserving(req, capacity, round_number):
    g = grant(req, capacity, round_number)
    req = np.array(req)
    assert (g >= 0).all() and (g <= req).all()
    assert g.sum() == min(req.sum(), capacity)


@given(requests, st.integers(1, 100), st.integers(0, 1000))
def test_grants_are_max_min_fair(req, capacity, round_number):
    g = grant(req, capacity, round_number)
    req = np.array(req)
    unsatisfied = g < req
    if unsatisfied.any():  # nobody got more than an unsatisfied sender plus one leftover item
        assert g.max() <= g[unsatisfied].min() + 1


@given(st.integers(2, 9), st.integers(1, 8))
def test_no_sender_starves(senders, capacity):
    """Every sender that keeps asking is served within ``ceil(senders / capacity)`` rounds."""
    req = np.full(senders, 1000)
    served_at = np.full(senders, -1)
    for r in range(senders):
        g = grant(req, capacity, r)
        served_at[(served_at < 0) & (g > 0)] = r
    assert (served_at >= 0).all()
    assert served_at.max() < -(-senders // capacity)
