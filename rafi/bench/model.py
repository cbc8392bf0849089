"""A round-cost model of ``forward()``, fitted to measured rounds: dense against sparse counts.

    bench/sweep.sh out 2 4 8 12 16
    python -m rafi.bench.model out/*.json --plot bench/results/model.png [--json model.json]

Reads the records of ``rafi.bench.empty`` (nothing queued) and ``rafi.bench`` (uniform,
ring and hot traffic), each run with ``--exchange dense`` or ``sparse`` (``bench/sweep.sh``
makes them), fits the model below to the records of fewer ranks than ``--holdout-ranks``
(default: the most measured), prints its error on the records held out, and predicts the
round time of both exchanges up to ``--max-ranks`` (4,096), with the rank count from which
sparse counts are faster.

The model (LogGP-style, seconds of one round, from rank 0's view: rank 0 is the hot
receiver, and in ring and uniform traffic no rank is busier than rank 0). With ``P``
ranks, ``n`` items per rank of ``s`` bytes; rank 0 sends items to ``out`` other ranks and
receives from ``in`` others (ring: 1 and 1; uniform: the expected ``(P - 1) (1 - (1 -
1/P)^n)`` each; hot: 0 and ``P - 1``), ``k = out + in`` sparse count messages, ``B``
bytes land in its inbox (ring and uniform ``n s``, hot ``P n s``), and
``g = 1`` when the round is flow-controlled (the items alive on all ranks exceed one
inbox's capacity, ``rafi.bench``'s ``capacity``: then grants travel too; at thousands of
ranks nearly every round is). Control, host and rest have coefficients per exchange::

    T = partition + control + payload + host + rest
    partition      = p0 + p1 n                     a round's fixed cost; per item partitioned
    payload        = l in + b B + o log2 P         per source rank; per byte received (the
                                                   shm copy); the node barrier (0 if nothing moves)
    control dense  = a + c log2 P + m (P - 1)      one Alltoall: a tree term and a per-peer message
    control sparse = a + m k + c log2 P            NBX: per Issend or receive; its Iallreduce
    host dense     = h + g (h' + c' log2 P + m' (P - 1))    bookkeeping; the grants' Alltoall
    host sparse    = h + g (h' + m' k)                       bookkeeping; point-to-point grants
    rest           = r + r' log2 P                 the slowest rank's round beyond rank 0's split

Every coefficient is fitted, non-negative, to its own column of the measured split
(``rafi_split_s``: partition, control, payload, host; ``rest`` is the round time minus
their sum), each record weighted by 1 / its round time so the fit minimises relative
error. Limits: fitted on one node (shared-memory payloads, no network, no
contention between nodes; beyond 16 ranks the log and per-peer terms are extrapolated, and
over 2 to 16 ranks ``log2 P`` and ``P - 1`` are nearly collinear, so the dense terms' split
between them, which decides the extrapolation, is the least certain part of the fit);
the per-byte cost is measured at one item size (per item and per byte cannot be told
apart); per-destination work of the partition (O(P) counts) is not modelled; rank 0's
split is medians and the round time the slowest rank's, which ``rest`` absorbs.
"""

import json
import math
from collections import namedtuple

import numpy as np

from rafi.examples._cli import Parser, input_file, integer, output_file

EXCHANGES = ("dense", "sparse")
PATTERNS = ("empty", "ring", "uniform", "hot")
COMPONENTS = ("partition", "control", "payload", "host", "rest")
TERMS = {  # a model term: the names of its coefficients, in feature order
    "partition": ("per round", "per item"),
    "payload": ("per source rank", "per byte", "per log2 P"),
    "control dense": ("per round", "per log2 P", "per peer (P - 1)"),
    "control sparse": ("per round", "per count message", "per log2 P"),
    "host dense": ("per round", "grants: per round", "grants: per log2 P", "grants: per peer (P - 1)"),
    "host sparse": ("per round", "grants: per round", "grants: per message"),
    "rest dense": ("per round", "per log2 P"),
    "rest sparse": ("per round", "per log2 P"),
}

Round = namedtuple("Round", "exchange pattern ranks items itemsize")
Measured = namedtuple("Measured", "round seconds split control_messages")


def capacity(pattern, items, ranks):
    """The inbox capacity ``rafi.bench`` gives a point (its ``measure``)."""
    return items * ranks if pattern == "hot" else int(1.3 * items) + 1024


def shape(r):
    """Rank 0's share of round ``r``: (other ranks it sends items to, other ranks it receives
    items from, bytes its inbox receives, whether the round is flow-controlled)."""
    P, n = r.ranks, r.items
    if r.pattern == "empty" or n == 0:
        return 0.0, 0.0, 0.0, False
    if r.pattern == "ring":
        out = inn = float(min(1, P - 1))
    elif r.pattern == "uniform":
        out = inn = (P - 1) * (1 - (1 - 1 / P) ** n)
    else:  # hot: every rank's items go to rank 0
        out, inn = 0.0, float(P - 1)
    nbytes = float(n * r.itemsize * (P if r.pattern == "hot" else 1))
    return out, inn, nbytes, P * n > capacity(r.pattern, n, P)


def terms(exchange):
    """The model terms a round of this exchange pays."""
    return ("partition", "payload", f"control {exchange}", f"host {exchange}", f"rest {exchange}")


def features(term, r):
    """What multiplies each coefficient of ``term`` in round ``r`` (see the module docstring)."""
    P, log = r.ranks, math.log2(r.ranks)
    out, inn, nbytes, flow = shape(r)
    k, g = out + inn, float(flow)
    return {
        "partition": (1.0, r.items),
        "payload": (inn, nbytes, log if nbytes else 0.0),
        "control dense": (1.0, log, P - 1.0),
        "control sparse": (1.0, k, log),
        "host dense": (1.0, g, g * log, g * (P - 1.0)),
        "host sparse": (1.0, g, g * k),
        "rest dense": (1.0, log),
        "rest sparse": (1.0, log),
    }[term]


def control_messages(r):
    """The control messages rank 0 sends in round ``r`` (``fwd.stats``' count)."""
    out, inn, _, flow = shape(r)
    if r.exchange == "dense":
        return (r.ranks - 1) * (1 + flow)
    return out + 1 + flow * inn


def predict(coef, r):
    """Seconds of each component of round ``r`` and their sum, ``total``."""
    parts = {t.split()[0]: float(np.dot(coef[t], features(t, r))) for t in terms(r.exchange)}
    parts["total"] = sum(parts.values())
    return parts


def nonnegative_lstsq(A, b):
    """The ``x >= 0`` minimising ``|A x - b|`` (Lawson and Hanson's active-set method)."""
    scale = np.linalg.norm(A, axis=0)
    scale[scale == 0] = 1.0
    A = A / scale
    x, free = np.zeros(A.shape[1]), np.zeros(A.shape[1], bool)
    tol = 1e-10 * max(1.0, float(np.abs(A.T @ b).max(initial=0)))
    for _ in range(3 * A.shape[1]):
        gradient = A.T @ (b - A @ x)
        if free.all() or gradient[~free].max() <= tol:
            break
        free[np.argmax(np.where(free, -np.inf, gradient))] = True
        while True:
            z = np.zeros_like(x)
            z[free] = np.linalg.lstsq(A[:, free], b, rcond=None)[0]
            if z[free].min() > 0:
                break
            bad = free & (z <= 0)
            x += np.min(x[bad] / (x[bad] - z[bad])) * (z - x)
            free &= x > tol
        x = z
    return x / scale


def fit(measured):
    """Coefficients of every term some record pays, fitted as the module docstring says."""
    coef = {}
    for term in TERMS:
        rows = [m for m in measured if term in terms(m.round.exchange)]
        if rows:
            A = np.array([features(term, m.round) for m in rows])
            y = np.array([m.split[term.split()[0]] for m in rows])
            weight = 1 / np.array([m.seconds for m in rows])
            coef[term] = nonnegative_lstsq(A * weight[:, None], y * weight)
    return coef


def load(paths):
    """The dense and sparse records in these JSON files (of ``rafi.bench.empty`` and
    ``rafi.bench``), and how many records of another exchange (``auto``) were left out."""
    measured, skipped = [], 0
    for path in paths:
        with open(path) as f:
            records = json.load(f)
        for rec in records:
            if rec.get("exchange") not in EXCHANGES:
                skipped += 1
                continue
            empty = "pattern" not in rec
            r = Round(
                rec["exchange"],
                "empty" if empty else rec["pattern"],
                rec["ranks"],
                0 if empty else rec["items_per_rank"],
                0 if empty else rec["itemsize"],
            )
            seconds = rec["rafi_median_s" if empty else "rafi_s"]
            s = rec["rafi_split_s"]
            split = {k: s["wait" if k == "control" and empty else k] for k in COMPONENTS[:-1]}
            split["rest"] = seconds - sum(split.values())
            measured.append(Measured(r, seconds, split, rec["control_messages"]))
    return measured, skipped


def validate(coef, held):
    """Per held-out record: the record, the predicted seconds and the relative error."""
    return [(m, t, t / m.seconds - 1) for m in held for t in [predict(coef, m.round)["total"]]]


def crossover(coef, pattern, items, itemsize, max_ranks):
    """The least rank count from which, up to ``max_ranks``, sparse rounds are predicted
    faster than dense ones (None if they are not at ``max_ranks``)."""
    first = None
    for P in range(max_ranks, 1, -1):
        dense, sparse = (predict(coef, Round(x, pattern, P, items, itemsize))["total"] for x in EXCHANGES)
        if sparse >= dense:
            break
        first = P
    return first


def prediction(coef, items, itemsize, max_ranks):
    """Predicted rounds at powers of two up to ``max_ranks``, both exchanges, every pattern."""
    rows = []
    for P in (2**e for e in range(1, int(math.log2(max_ranks)) + 1)):
        for pattern in PATTERNS:
            for x in EXCHANGES:
                r = Round(x, pattern, P, items, itemsize)
                rows.append(
                    {**r._asdict(), "seconds": predict(coef, r), "control_messages": control_messages(r)}
                )
    return rows


def split_by_ranks(measured, holdout):
    """(records to fit, records held out, notes on what the fit cannot tell)."""
    ranks = sorted({m.round.ranks for m in measured})
    holdout = ranks[-1] if holdout is None else holdout
    fitted = [m for m in measured if m.round.ranks < holdout]
    held = [m for m in measured if m.round.ranks >= holdout]
    if not fitted or not held:
        notes = [f"cannot hold out ranks >= {holdout} of rank counts {ranks}: fitted on all, not validated"]
        return measured, [], notes + unseen(measured)
    seen = sorted({m.round.ranks for m in fitted})
    notes = [f"the fit sees rank counts {seen} only: its P terms are guesses"] if len(seen) < 3 else []
    return fitted, held, notes + unseen(fitted)


def unseen(measured):
    """A note on the patterns no record shows (their predictions lack the costs they add)."""
    missing = [p for p in PATTERNS if not any(m.round.pattern == p for m in measured)]
    return [f"no records of {', '.join(missing)} traffic: their predictions are guesses"] if missing else []


def report(coef, fitted, checked, rows, crossings, items, itemsize):
    """The printed summary: coefficients, held-out errors, predictions, crossovers."""
    lines = [f"# fit: {len(fitted)} records at ranks {sorted({m.round.ranks for m in fitted})}"]
    lines += ["coefficients, us per unit:"]
    for term, values in coef.items():
        lines.append(f"  {term:<15}" + "".join(f"  {n} {v * 1e6:.3g}" for n, v in zip(TERMS[term], values)))
    if checked:
        errors = np.abs([e for _, _, e in checked])
        lines.append(f"held out ({len(checked)} records): measured / predicted us, error, control messages")
        for m, t, e in checked:
            r = m.round
            lines.append(
                f"  {r.exchange:>6} {r.pattern:>7} {r.items:>6} x {r.itemsize:>3} B at {r.ranks:>3} ranks: "
                f"{m.seconds * 1e6:9.1f} / {t * 1e6:9.1f} {e:+7.1%}   {m.control_messages:.0f} / "
                f"{control_messages(r):.0f}"
            )
        lines.append(f"held-out error: median {np.median(errors):.1%}, max {errors.max():.1%} (target 20%)")
    lines.append(f"predicted round, us, dense / sparse, {items} items of {itemsize} B per rank:")
    lines.append(f"{'ranks':>6}" + "".join(f"{p:>20}" for p in PATTERNS))
    for k in range(0, len(rows), 2 * len(PATTERNS)):
        group = rows[k : k + 2 * len(PATTERNS)]
        cells = [
            f"{d['seconds']['total'] * 1e6:.0f} / {s['seconds']['total'] * 1e6:.0f}"
            for d, s in zip(group[::2], group[1::2])
        ]
        lines.append(f"{group[0]['ranks']:>6}" + "".join(f"{c:>20}" for c in cells))
    said = ", ".join(f"{p}: {'never' if c is None else c}" for p, c in crossings.items())
    lines.append(f"crossover (sparse faster from this rank count on): {said}")
    return "\n".join(lines)


def _drawn(r, exchange, pattern, items, itemsize):
    """Whether a measured round belongs on the plot of this prediction (empty rounds: all)."""
    same = (r.exchange, r.pattern) == (exchange, pattern)
    return same and (pattern == "empty" or (r.items, r.itemsize) == (items, itemsize))


def plot(coef, fitted, held, items, itemsize, max_ranks, path):
    """Predicted round time against ranks per pattern, dense and sparse, measured points on top."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = np.unique(np.geomspace(2, max_ranks, 200).astype(int))
    fig, axes = plt.subplots(2, 2, figsize=(10, 7.5))
    for ax, pattern in zip(axes.flat, PATTERNS):
        for x, color in zip(EXCHANGES, ("C0", "C3")):
            t = [predict(coef, Round(x, pattern, P, items, itemsize))["total"] * 1e6 for P in ranks]
            ax.plot(ranks, t, color=color, label=f"{x}, model")
            for group, marker, label in ((fitted, "o", "fitted"), (held, "s", "held out")):
                points = [m for m in group if _drawn(m.round, x, pattern, items, itemsize)]
                ax.scatter(
                    [m.round.ranks for m in points],
                    [m.seconds * 1e6 for m in points],
                    marker=marker,
                    facecolors=color if marker == "o" else "none",
                    edgecolors=color,
                    label=f"{x}, {label}" if points else None,
                )
        what = "empty rounds" if pattern == "empty" else f"{pattern}, {items} x {itemsize} B per rank"
        ax.set(xscale="log", yscale="log", xlabel="ranks", ylabel="us per round", title=what)
        ax.set_xscale("log", base=2)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("rafi forward(): round-cost model, dense against sparse counts")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    parser = Parser("rafi.bench.model", __doc__)
    parser.add_argument("records", nargs="+", help="JSON files of rafi.bench.empty and rafi.bench")
    parser.add_argument(
        "--holdout-ranks", type=integer(2), help="fit below this rank count, validate at and above it"
    )
    parser.add_argument("--items", type=integer(0), default=1000, help="items per rank of the prediction")
    parser.add_argument("--itemsize", type=integer(1), default=64, help="bytes per item of the prediction")
    parser.add_argument(
        "--max-ranks", type=integer(2), default=4096, help="the prediction's largest rank count"
    )
    parser.add_argument("--plot", help="draw the prediction and the measurements to this PNG")
    parser.add_argument("--json", help="write coefficients, held-out errors and predictions here")
    opts = parser.parse_args(argv)
    parser.agree(
        *(lambda path=path: input_file("records:", path) for path in opts.records),
        lambda: output_file("--plot", opts.plot, (".png",)),
        lambda: output_file("--json", opts.json),
    )
    measured, skipped = load(opts.records)
    if skipped:
        print(f"# left out {skipped} record(s) of neither the dense nor the sparse exchange")
    missing = [x for x in EXCHANGES if not any(m.round.exchange == x for m in measured)]
    if missing:
        raise SystemExit(f"no records of the {' or '.join(missing)} exchange: nothing to compare")
    fitted, held, notes = split_by_ranks(measured, opts.holdout_ranks)
    for note in notes:
        print(f"# {note}")
    coef = fit(fitted)
    checked = validate(coef, held)
    rows = prediction(coef, opts.items, opts.itemsize, opts.max_ranks)
    crossings = {p: crossover(coef, p, opts.items, opts.itemsize, opts.max_ranks) for p in PATTERNS}
    print(report(coef, fitted, checked, rows, crossings, opts.items, opts.itemsize))
    if opts.plot:
        plot(coef, fitted, held, opts.items, opts.itemsize, opts.max_ranks, opts.plot)
    if opts.json:
        result = {
            "coefficients_s": {t: dict(zip(TERMS[t], v.tolist())) for t, v in coef.items()},
            "fit_ranks": sorted({m.round.ranks for m in fitted}),
            "held_out": [
                {**m.round._asdict(), "measured_s": m.seconds, "predicted_s": t, "error": e}
                for m, t, e in checked
            ],
            "prediction": rows,
            "crossover": crossings,
        }
        with open(opts.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
