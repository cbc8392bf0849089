"""``Stats.summary()``: the forwarding statistics of one rank as text people read.

Three parts, then optionally a fourth: a line of totals, a table of time per step
(total, mean and percentiles), a table of traffic per peer (the busiest ``_PEERS``
peers when there are more), and with ``rounds=True`` one line per round.
"""

__all__ = ["summary"]

_PEERS = 16  # peers listed at most: the busiest by bytes


def _mb(nbytes):
    return f"{nbytes / 1e6:.3f} MB"


def _totals(stats):
    t = stats.totals()
    who = f"rank {stats.rank}: " if stats.rank is not None else ""
    return (
        f"{who}{t[stats.units]} {stats.units}, {t['items_sent']} items sent ({_mb(t['bytes_sent'])}), "
        f"{t['items_received']} received ({_mb(t['bytes_received'])}), {t['deferred']} deferred, "
        f"at most {t['peak_alive']} alive"
    )


def _steps(stats):
    columns = ("mean", "p50", "p90", "p99", "max")
    head = f"{'step':<10} {'total ms':>10}" + "".join(f" {k + ' us':>10}" for k in columns)
    lines = [head, "-" * len(head)]
    for step, s in stats.steps().items():
        micro = (s[k] * 1e6 for k in ("mean", "p50", "p90", "p99", "max"))
        lines.append(f"{step:<10} {s['total'] * 1e3:>10.3f}" + "".join(f" {v:>10.1f}" for v in micro))
    return lines


def _peers(stats):
    p = stats.peers()
    traffic = [out + into for out, into in zip(p["bytes_sent"], p["bytes_received"])]
    busiest = sorted(range(len(traffic)), key=lambda r: -traffic[r])
    shown = sorted(busiest[:_PEERS])
    head = f"{'peer':>6} {'items out':>12} {'MB out':>10} {'items in':>12} {'MB in':>10}"
    lines = [head, "-" * len(head)]
    for r in shown:
        lines.append(
            f"{r:>6} {p['items_sent'][r]:>12} {p['bytes_sent'][r] / 1e6:>10.3f} "
            f"{p['items_received'][r]:>12} {p['bytes_received'][r] / 1e6:>10.3f}"
        )
    if len(shown) < len(busiest):
        lines.append(f"({len(busiest) - len(shown)} quieter peers not shown; as_dict() has them all)")
    return lines


def _rounds(stats):
    head = (
        f"{stats.unit:>6} {'sent':>10} {'recv':>10} {'deferred':>9} {'alive':>10} "
        f"{'MB out':>9} {'part ms':>8} {'wait ms':>8} {'xchg ms':>8}"
    )
    lines = [head, "-" * len(head)]
    for r in stats.rounds:
        lines.append(
            f"{r.round:>6} {int(r.sent.sum()):>10} {int(r.received.sum()):>10} "
            f"{r.deferred:>9} {r.alive:>10} {r.bytes_sent.sum() / 1e6:>9.3f} "
            f"{r.partition * 1e3:>8.3f} {r.wait * 1e3:>8.3f} {r.exchange * 1e3:>8.3f}"
        )
    return lines


def summary(stats, rounds=False):
    """The report ``Stats.summary`` returns."""
    parts = [[_totals(stats)], _steps(stats), _peers(stats)]
    if rounds:
        parts.append(_rounds(stats))
    else:
        parts.append([f"(summary(rounds=True) adds one line per {stats.unit})"])
    return "\n\n".join("\n".join(part) for part in parts)
