"""Forwarding statistics: totals, percentiles and traffic per peer, the text report, the log."""

import json
import logging

import numpy as np

from rafi._stats import Stats


def _recorded(size=3, rounds=7, itemsize=16, seed=0):
    """A Stats with ``rounds`` random rounds; also the arrays recorded, for reference."""
    rng = np.random.default_rng(seed)
    stats = Stats(size, itemsize, rank=1)
    sent = rng.integers(0, 100, (rounds, size))
    received = rng.integers(0, 100, (rounds, size))
    deferred = rng.integers(0, 3, rounds) * rng.integers(0, 2, rounds)
    alive = rng.integers(0, 1000, rounds)
    seconds = rng.uniform(1e-6, 1e-3, (rounds, 4))  # partition, wait, exchange, payload
    seconds[:, 3] = np.minimum(seconds[:, 3], seconds[:, 2])  # payload is part of the exchange
    for r in range(rounds):
        stats.record(r, sent[r], received[r], deferred[r], alive[r], *seconds[r])
    return stats, sent, received, deferred, alive, seconds


def test_totals_steps_and_peers():
    stats, sent, received, deferred, alive, seconds = _recorded()
    t = stats.totals()
    assert (t["rounds"], t["items_sent"], t["items_received"]) == (7, sent.sum(), received.sum())
    assert t["bytes_sent"] == 16 * sent.sum() and t["deferred"] == deferred.sum()
    assert t["peak_alive"] == alive.max()
    host = seconds[:, 2] - seconds[:, 3]
    expected = {"partition": seconds[:, 0], "wait": seconds[:, 1], "payload": seconds[:, 3], "host": host}
    expected["round"] = seconds[:, 0] + seconds[:, 1] + seconds[:, 2]
    steps = stats.steps()
    assert list(steps) == list(expected)
    for step, values in expected.items():
        s = steps[step]
        reference = [values.sum(), values.mean(), values.max()]
        np.testing.assert_allclose([s["total"], s["mean"], s["max"]], reference)
        np.testing.assert_allclose([s["p50"], s["p90"], s["p99"]], np.percentile(values, [50, 90, 99]))
        assert t["seconds"][step] == s["total"]
    peers = stats.peers()
    assert peers["items_sent"] == sent.sum(axis=0).tolist()
    assert peers["bytes_received"] == (16 * received.sum(axis=0)).tolist()


def test_as_dict_is_json_and_has_rounds_only_on_request():
    stats = _recorded()[0]
    compact = json.loads(json.dumps(stats.as_dict()))
    assert set(compact) == {"unit", "totals", "steps", "peers"} and compact["unit"] == "round"
    full = json.loads(json.dumps(stats.as_dict(rounds=True)))
    assert len(full["rounds"]) == 7 and full["rounds"][3]["round"] == 3


def test_summary_is_short_unless_rounds_are_asked_for():
    stats, sent = _recorded(rounds=500)[:2]
    text = stats.summary()
    assert text.startswith("rank 1: 500 rounds") and f"{sent.sum()} items sent" in text
    for step in ("partition", "wait", "payload", "host", "round"):
        assert f"\n{step} " in text
    assert len(text.splitlines()) < 30  # not one line per round
    assert len(stats.summary(rounds=True).splitlines()) > 500


def test_summary_lists_the_busiest_peers_of_many():
    size = 40
    stats = Stats(size, 8)
    sent = np.zeros(size, np.int64)
    sent[[3, 17, 39]] = [5, 7, 9]
    stats.record(0, sent, np.zeros(size, np.int64), 0, 21, 0.0, 0.0, 0.0, 0.0)
    lines = stats.summary().splitlines()
    table = lines[[line.split()[:1] for line in lines].index(["peer"]) + 2 :]
    shown = [int(line.split()[0]) for line in table if line.strip() and line.split()[0].isdigit()]
    assert {3, 17, 39} <= set(shown) and len(shown) == 16
    assert any("24 quieter peers" in line for line in lines)


def test_log_reports_rounds_at_debug_and_flow_control_at_info(caplog):
    stats = Stats(2, 8, rank=0)
    zeros, some = np.zeros(2, np.int64), np.array([1, 2])
    with caplog.at_level(logging.INFO, logger="rafi"):
        for r, deferred in enumerate([0, 4, 3, 0, 0]):
            stats.record(r, some, zeros, deferred, 10, 0.0, 0.0, 0.0, 0.0)
    info = [rec.getMessage() for rec in caplog.records]
    assert info == [
        "rank 0 round 1: flow control engaged: 4 items held back for full inboxes",
        "rank 0 round 3: flow control released: every item went",
    ]
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="rafi"):
        stats.record(5, some, zeros, 0, 10, 1e-6, 0.0, 0.0, 0.0)
    assert caplog.records[0].levelno == logging.DEBUG and "round 5: sent 3, received 0" in caplog.messages[0]
