"""The round-cost model (rafi.bench.model) on synthetic records made by the model itself."""

import json
from pathlib import Path

import numpy as np
import pytest

from rafi.bench import model
from rafi.bench.model import EXCHANGES, Round

TRUE = {  # seconds; every coefficient some sweep record can tell apart
    "partition": [5e-6, 10e-9],
    "payload": [3e-6, 0.3e-9, 4e-6],
    "control dense": [10e-6, 3e-6, 2e-6],
    "control sparse": [30e-6, 4e-6, 12e-6],
    "host dense": [3e-6, 20e-6, 5e-6, 1e-6],
    "host sparse": [4e-6, 15e-6, 2e-6],
    "rest dense": [5e-6, 2e-6],
    "rest sparse": [8e-6, 6e-6],
}
RANKS = (2, 4, 8, 12, 16)


def record(r, rng, noise=0.01):
    """A record as rafi.bench.empty or rafi.bench writes it, timed by the model of ``TRUE``."""
    parts = model.predict(TRUE, r)
    noisy = {k: parts[k] * (1 + noise * rng.standard_normal()) for k in model.COMPONENTS}
    seconds = sum(noisy.values())
    common = {"ranks": r.ranks, "exchange": r.exchange, "control_messages": model.control_messages(r)}
    if r.pattern == "empty":
        split = {
            "partition": noisy["partition"],
            "wait": noisy["control"],
            "payload": 0.0,
            "host": noisy["host"],
        }
        return {**common, "rafi_median_s": seconds, "rafi_split_s": split}
    split = {k: noisy[k] for k in ("partition", "control", "payload", "host")}
    mine = {"pattern": r.pattern, "items_per_rank": r.items, "itemsize": r.itemsize, "rafi_s": seconds}
    return {**common, **mine, "rafi_split_s": split}


def sweep(tmp_path, ranks=RANKS, exchanges=EXCHANGES, seed=7):
    """Files laid out as bench/sweep.sh writes them; returns their paths."""
    rng, paths = np.random.default_rng(seed), []
    for P in ranks:
        for x in exchanges:
            bench = [
                record(Round(x, p, P, n, 64), rng)
                for p in ("uniform", "ring", "hot")
                for n in (100, 1000, 10000)
            ]
            for name, records in (
                (f"empty-{P}-{x}", [record(Round(x, "empty", P, 0, 0), rng)]),
                (f"bench-{P}-{x}", bench),
            ):
                paths.append(tmp_path / f"{name}.json")
                paths[-1].write_text(json.dumps(records))
    return [str(p) for p in paths]  # fmt: skip


def test_fit_recovers_the_coefficients_and_predicts_the_held_out_ranks(tmp_path):
    measured, skipped = model.load(sweep(tmp_path))
    assert skipped == 0 and len(measured) == len(RANKS) * 2 * 10
    fitted, held, notes = model.split_by_ranks(measured, None)
    assert {m.round.ranks for m in held} == {16} and len(fitted) == 4 * 2 * 10 and not notes
    coef = model.fit(fitted)
    for term, values in TRUE.items():
        # An Alltoall's tree and per-peer terms are the hardest to tell apart at 2 to 12 ranks
        rtol = 0.3 if term.endswith("dense") and not term.startswith("rest") else 0.05
        np.testing.assert_allclose(coef[term], values, rtol=rtol, err_msg=term)
    checked = model.validate(coef, held)
    assert len(checked) == len(held)
    assert max(abs(e) for _, _, e in checked) < 0.03


def test_predictions_grow_with_ranks_where_they_must(tmp_path):
    measured, _ = model.load(sweep(tmp_path))
    coef = model.fit(measured)
    ranks = range(2, 4097, 7)
    for x in EXCHANGES:
        control = [model.predict(coef, Round(x, "empty", P, 0, 0))["control"] for P in ranks]
        uniform = [model.predict(coef, Round(x, "uniform", P, 1000, 64))["total"] for P in ranks]
        hot = [model.predict(coef, Round(x, "hot", P, 1000, 64))["total"] for P in ranks]
        for series in (control, uniform, hot):
            assert np.all(np.diff(series) >= 0)
    dense = [model.predict(coef, Round("dense", "ring", P, 1000, 64))["control"] for P in ranks]
    sparse = [model.predict(coef, Round("sparse", "ring", P, 1000, 64))["control"] for P in ranks]
    assert dense[-1] > 100 * dense[0]  # an Alltoall's messages grow with P
    assert sparse[-1] <= 12 * sparse[0]  # a ring's do not: only the O(log P) collectives grow


@pytest.mark.parametrize(
    "r, messages",
    [  # fwd.stats' control messages of rank 0, seen in rafi.bench records at 3 ranks
        (Round("sparse", "uniform", 3, 100, 64), 3),
        (Round("sparse", "uniform", 3, 1000, 64), 5),  # flow-controlled: grants to its 2 senders
        (Round("sparse", "ring", 3, 1000, 64), 3),
        (Round("sparse", "hot", 3, 1000, 64), 1),
        (Round("dense", "uniform", 3, 1000, 64), 4),  # a second Alltoall for the grants
        (Round("dense", "hot", 3, 10000, 64), 2),
        (Round("dense", "empty", 3, 0, 0), 2),
        (Round("sparse", "empty", 3, 0, 0), 1),
    ],
)
def test_traffic_of_rank_zero(r, messages):
    assert model.control_messages(r) == pytest.approx(messages, abs=0.01)


def test_nonnegative_least_squares_meets_its_optimality_conditions():
    rng = np.random.default_rng(3)
    for _ in range(50):
        A = rng.standard_normal((20, 5)) * rng.uniform(1e-3, 1e3, 5)  # columns of different scales
        b = rng.standard_normal(20)
        x = model.nonnegative_lstsq(A, b)
        gradient = A.T @ (b - A @ x) / np.linalg.norm(A, axis=0)
        assert np.all(x >= 0)
        assert np.all(gradient <= 1e-8)  # no coefficient could grow to fit better
        np.testing.assert_allclose(gradient[x > 0], 0, atol=1e-8)
    x = np.array([2.0, 0.0, 0.5])
    A = rng.standard_normal((10, 3))
    np.testing.assert_allclose(model.nonnegative_lstsq(A, A @ x), x, atol=1e-12)


def test_command_line_prints_and_writes_the_plot_and_json(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    files = sweep(tmp_path)
    auto = tmp_path / "auto.json"
    auto.write_text(json.dumps([{**json.loads(Path(files[0]).read_text())[0], "exchange": "auto"}]))
    png, out = tmp_path / "model.png", tmp_path / "model.json"
    model.main([*files, str(auto), "--plot", str(png), "--json", str(out), "--max-ranks", "1024"])
    text = capsys.readouterr().out
    assert "left out 1 record" in text and "held-out error: median" in text and "crossover" in text
    result = json.loads(out.read_text())
    assert result["fit_ranks"] == [2, 4, 8, 12] and len(result["held_out"]) == 20
    assert sorted(result["crossover"]) == sorted(model.PATTERNS)
    assert max(r["ranks"] for r in result["prediction"]) == 1024
    assert png.stat().st_size > 10_000


def test_command_line_with_too_few_records_says_so(tmp_path, capsys):
    model.main(sweep(tmp_path, ranks=(2,)))
    assert "cannot hold out" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="no records of the sparse exchange"):
        model.main(sweep(tmp_path, ranks=(2, 4), exchanges=("dense",)))
