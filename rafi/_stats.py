"""Per-round forwarding statistics: items and bytes per peer, deferrals, time per step."""

import dataclasses

import numpy as np

__all__ = ["RoundStats", "Stats"]


@dataclasses.dataclass
class RoundStats:
    """What one ``forward()`` did on this rank.

    ``sent[p]`` / ``received[p]``: items to / from rank ``p`` (the self entry is the local copy).
    Seconds: ``partition`` (device sort and the counts' copy to the host), ``wait``
    (the count exchange, where a rank waits for the slowest), ``exchange`` (grants and
    payloads), of which ``payload`` moved the items (transport, device copies, the wait for
    node peers); ``host`` is what the round spent in rafi's own bookkeeping (the rest).
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
    payload: float = 0.0

    @property
    def host(self):
        return self.exchange - self.payload

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
            "seconds": {
                "partition": self.partition,
                "wait": self.wait,
                "exchange": self.exchange,
                "payload": self.payload,
            },
        }


class Stats:
    """Per-round records of one forwarder, with totals and a printable table.

    Rounds are written into preallocated arrays that double when full, so recording a
    round allocates nothing; ``stats[i]`` (and iteration) gives ``RoundStats`` views.
    """

    _FIELDS = ("round", "deferred", "alive", "partition", "wait", "exchange", "payload")
    _SECONDS = ("partition", "wait", "exchange", "payload")

    def __init__(self, size=1, itemsize=0):
        self._size, self._itemsize = size, itemsize
        self._n = 0
        self._grow(64)

    def _grow(self, rows):
        old, n = getattr(self, "_sent", None), self._n
        sent, received = np.zeros((rows, self._size), np.int64), np.zeros((rows, self._size), np.int64)
        columns = {f: np.zeros(rows, np.float64 if f in self._SECONDS else np.int64) for f in self._FIELDS}
        if old is not None:
            sent[:n], received[:n] = self._sent[:n], self._received[:n]
            for f in self._FIELDS:
                columns[f][:n] = self._columns[f][:n]
        self._sent, self._received, self._columns = sent, received, columns

    def record(self, round, sent, received, deferred, alive, partition, wait, exchange, payload):
        """Add one round: its number, items sent to and received from each rank, step times."""
        n = self._n
        if n == len(self._sent):
            self._grow(2 * n)
        self._sent[n] = sent
        self._received[n] = received
        c = self._columns
        c["round"][n], c["deferred"][n], c["alive"][n] = round, deferred, alive
        c["partition"][n], c["wait"][n], c["exchange"][n], c["payload"][n] = (
            partition,
            wait,
            exchange,
            payload,
        )
        self._n = n + 1

    @property
    def rounds(self):
        return [self[i] for i in range(self._n)]

    def __len__(self):
        return self._n

    def __getitem__(self, index):
        index = range(self._n)[index]
        c = {f: self._columns[f][index].item() for f in self._FIELDS}
        return RoundStats(
            sent=self._sent[index].copy(), received=self._received[index].copy(), itemsize=self._itemsize, **c
        )

    def __iter__(self):
        return (self[i] for i in range(self._n))

    def totals(self):
        """Return sums over all rounds: items, bytes and seconds."""
        n, keys = self._n, self._SECONDS
        sent, received = int(self._sent[:n].sum()), int(self._received[:n].sum())
        return {
            "rounds": n,
            "items_sent": sent,
            "items_received": received,
            "bytes_sent": sent * self._itemsize,
            "bytes_received": received * self._itemsize,
            "seconds": {k: float(self._columns[k][:n].sum()) for k in keys},
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
