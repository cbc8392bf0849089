"""Per-round forwarding statistics: items and bytes per peer, deferrals, time per step."""

import dataclasses

import numpy as np

__all__ = ["RoundStats", "Stats"]


@dataclasses.dataclass
class RoundStats:
    """What one ``forward()`` did on this rank.

    ``sent[p]`` / ``received[p]``: items to / from rank ``p`` (the self entry is the local copy).
    Seconds: ``partition`` (device sort and the counts' copy to the host), ``wait``
    (the count exchange, where a rank waits for the slowest), ``exchange`` (grants and payloads).
    """

    round: int
    sent: np.ndarray
    received: np.ndarray
    deferred: int
    alive: int
    itemsize: int
    partition: float
    wait: float
    exchange: float

    @property
    def bytes_sent(self):
        return self.sent * self.itemsize

    @property
    def bytes_received(self):
        return self.received * self.itemsize

    def as_dict(self):
        """Return the record as JSON-ready Python values."""
        return {
            "round": self.round,
            "sent": self.sent.tolist(),
            "received": self.received.tolist(),
            "bytes_sent": self.bytes_sent.tolist(),
            "bytes_received": self.bytes_received.tolist(),
            "deferred": self.deferred,
            "alive": self.alive,
            "seconds": {"partition": self.partition, "wait": self.wait, "exchange": self.exchange},
        }


class Stats:
    """The list of ``RoundStats`` of one forwarder, with totals and a printable table."""

    def __init__(self):
        self.rounds = []

    def record(self, entry):
        self.rounds.append(entry)

    def __len__(self):
        return len(self.rounds)

    def __getitem__(self, index):
        return self.rounds[index]

    def __iter__(self):
        return iter(self.rounds)

    def totals(self):
        """Return sums over all rounds: items, bytes and seconds."""
        keys = ("partition", "wait", "exchange")
        sent = sum(int(r.sent.sum()) for r in self.rounds)
        received = sum(int(r.received.sum()) for r in self.rounds)
        itemsize = self.rounds[0].itemsize if self.rounds else 0
        return {
            "rounds": len(self.rounds),
            "items_sent": sent,
            "items_received": received,
            "bytes_sent": sent * itemsize,
            "bytes_received": received * itemsize,
            "seconds": {k: sum(getattr(r, k) for r in self.rounds) for k in keys},
        }

    def as_dict(self):
        """Return ``{"rounds": [...], "totals": {...}}`` ready for ``json.dump``."""
        return {"rounds": [r.as_dict() for r in self.rounds], "totals": self.totals()}

    def summary(self):
        """Return a table, one line per round, then the totals."""
        header = (
            f"{'round':>5} {'sent':>10} {'recv':>10} {'deferred':>9} {'alive':>10} "
            f"{'MB out':>9} {'part ms':>8} {'wait ms':>8} {'xchg ms':>8}"
        )
        lines = [header, "-" * len(header)]
        for r in self.rounds:
            lines.append(
                f"{r.round:>5} {int(r.sent.sum()):>10} {int(r.received.sum()):>10} "
                f"{r.deferred:>9} {r.alive:>10} {r.bytes_sent.sum() / 1e6:>9.3f} "
                f"{r.partition * 1e3:>8.3f} {r.wait * 1e3:>8.3f} {r.exchange * 1e3:>8.3f}"
            )
        t = self.totals()
        s = t["seconds"]
        lines.append("-" * len(header))
        lines.append(
            f"{'total':>5} {t['items_sent']:>10} {t['items_received']:>10} {'':>9} {'':>10} "
            f"{t['bytes_sent'] / 1e6:>9.3f} {s['partition'] * 1e3:>8.3f} "
            f"{s['wait'] * 1e3:>8.3f} {s['exchange'] * 1e3:>8.3f}"
        )
        return "\n".join(lines)
