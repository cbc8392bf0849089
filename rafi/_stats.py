"""Per-round forwarding statistics: items and bytes per peer, deferrals, time per step."""

import dataclasses
import logging

import numpy as np

from . import _stats_text as _text

__all__ = ["RoundStats", "Stats", "log"]

log = logging.getLogger("rafi")  # rounds at DEBUG; flow control and errors at INFO


@dataclasses.dataclass
class RoundStats:
    """What one ``forward()`` did on this rank.

    ``sent[p]`` / ``received[p]``: items to / from rank ``p`` (the self entry is the local copy).
    Seconds: ``partition`` (device sort and the counts' copy to the host), ``wait``
    (the count exchange, where a rank waits for the slowest), ``exchange`` (grants and
    payloads), of which ``payload`` moved the items (transport, device copies, the wait for
    node peers); ``host`` is what the round spent in rafi's own bookkeeping (the rest).
    ``control_messages``: messages this rank sent for counts and grants, each collective it
    joined counted once (a dense round: ``size - 1``; a sparse one: one per peer it holds
    items for, plus one).
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
    control_messages: int = 0

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
            "control_messages": self.control_messages,
            "seconds": {
                "partition": self.partition,
                "wait": self.wait,
                "exchange": self.exchange,
                "payload": self.payload,
            },
        }


class Stats:
    """Per-round records of one forwarder, with totals, percentiles, traffic per peer.

    Rounds are written into preallocated arrays that double when full, so recording a
    round allocates nothing; ``stats[i]`` (and iteration) gives ``RoundStats`` views.
    """

    _FIELDS = ("round", "deferred", "alive", "partition", "wait", "exchange", "payload", "control_messages")
    _SECONDS = ("partition", "wait", "exchange", "payload")

    def __init__(self, size=1, itemsize=0, rank=None, unit="round"):
        self._size, self._itemsize = size, itemsize
        self.rank = rank
        self.unit = unit  # "round" (bsp) or "batch" (async: a turn that moved items)
        self.units = {"round": "rounds", "batch": "batches"}[unit]
        self._deferring = False  # the last round deferred items (logged when it changes)
        self._n = 0
        self._pending = []  # converters of rounds recorded but not yet read (``defer``)
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

    def defer(self, convert):
        """Add rounds that ``convert(stats)`` records (``record_many``) when the stats are
        next read: resident rounds run faster than numpy can take their records apart, one
        launch at a time. With rafi's INFO log on, at once."""
        self._pending.append(convert)
        if log.isEnabledFor(logging.INFO):
            self.settle()

    def settle(self):
        """Record every round ``defer`` holds, now."""
        if self._pending:
            pending, self._pending = self._pending, []
            for convert in pending:
                convert(self)

    def record(self, round, sent, received, deferred, alive, partition, wait, exchange, payload, messages=0):
        """Add one round: its number, items sent to and received from each rank, step times,
        and the control messages this rank sent (counts, grants, its part of collectives)."""
        self.settle()
        n = self._n
        if n == len(self._sent):
            self._grow(2 * n)
        self._sent[n] = sent
        self._received[n] = received
        c = self._columns
        c["round"][n], c["deferred"][n], c["alive"][n] = round, deferred, alive
        c["control_messages"][n] = messages
        c["partition"][n], c["wait"][n], c["exchange"][n], c["payload"][n] = (
            partition,
            wait,
            exchange,
            payload,
        )
        self._n = n + 1
        if log.isEnabledFor(logging.INFO):
            self._log(round, sent, received, deferred, alive, partition + wait + exchange)

    def record_many(self, rounds, sent, received, deferred, alive, seconds, messages):
        """Add ``len(rounds)`` rounds at once (resident mode's launches): arrays with one row
        per round; ``seconds`` has the columns partition, wait, exchange, payload."""
        self.settle()
        k, n = len(rounds), self._n
        while n + k > len(self._sent):
            self._grow(2 * len(self._sent))
        self._sent[n : n + k], self._received[n : n + k] = sent, received
        c = self._columns
        c["round"][n : n + k], c["deferred"][n : n + k], c["alive"][n : n + k] = rounds, deferred, alive
        c["control_messages"][n : n + k] = messages
        for column, name in enumerate(self._SECONDS):
            c[name][n : n + k] = seconds[:, column]
        self._n = n + k
        if log.isEnabledFor(logging.INFO):
            for j in range(k):
                self._log(rounds[j], sent[j], received[j], deferred[j], alive[j], seconds[j, :3].sum())

    def _log(self, round, sent, received, deferred, alive, seconds):
        where = f"rank {self.rank} {self.unit} {round}"
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "%s: sent %d, received %d, deferred %d, alive %d, %.1f us",
                where, sent.sum(), received.sum(), deferred, alive, seconds * 1e6,
            )  # fmt: skip
        if bool(deferred) != self._deferring:
            self._deferring = bool(deferred)
            if deferred:
                log.info("%s: flow control engaged: %d items held back for full inboxes", where, deferred)
            else:
                log.info("%s: flow control released: every item went", where)

    @property
    def rounds(self):
        self.settle()
        return [self[i] for i in range(self._n)]

    def __len__(self):
        self.settle()
        return self._n

    def __getitem__(self, index):
        self.settle()
        index = range(self._n)[index]
        c = {f: self._columns[f][index].item() for f in self._FIELDS}
        return RoundStats(
            sent=self._sent[index].copy(), received=self._received[index].copy(), itemsize=self._itemsize, **c
        )

    def __iter__(self):
        self.settle()
        return (self[i] for i in range(self._n))

    def totals(self):
        """Return sums over all rounds: items, bytes, deferrals, the peak of ``alive``, seconds."""
        self.settle()
        n = self._n
        sent, received = int(self._sent[:n].sum()), int(self._received[:n].sum())
        return {
            self.units: n,
            "items_sent": sent,
            "items_received": received,
            "bytes_sent": sent * self._itemsize,
            "bytes_received": received * self._itemsize,
            "deferred": int(self._columns["deferred"][:n].sum()),
            "control_messages": int(self._columns["control_messages"][:n].sum()),
            "peak_alive": int(self._columns["alive"][:n].max(initial=0)),
            "seconds": {k: float(v.sum()) for k, v in self._steps().items()},
        }

    def _steps(self):
        """Seconds per round of each step: ``host`` is the exchange less the payload."""
        self.settle()
        c, n = self._columns, self._n
        exchange, payload = c["exchange"][:n], c["payload"][:n]
        return {
            "partition": c["partition"][:n],
            "wait": c["wait"][:n],
            "payload": payload,
            "host": exchange - payload,
            self.unit: c["partition"][:n] + c["wait"][:n] + exchange,
        }

    def steps(self):
        """Per step: total, mean, median, 90th and 99th percentile and largest, in seconds."""
        out = {}
        for step, seconds in self._steps().items():
            if not len(seconds):
                seconds = np.zeros(1)
            p50, p90, p99 = np.percentile(seconds, [50, 90, 99]).tolist()
            out[step] = {"total": float(seconds.sum()), "mean": float(seconds.mean())}
            out[step].update(p50=p50, p90=p90, p99=p99, max=float(seconds.max()))
        return out

    def peers(self):
        """Traffic with each rank (this rank's own entry is the local copy): items and bytes."""
        self.settle()
        sent, received = self._sent[: self._n].sum(axis=0), self._received[: self._n].sum(axis=0)
        return {
            "items_sent": sent.tolist(),
            "items_received": received.tolist(),
            "bytes_sent": (sent * self._itemsize).tolist(),
            "bytes_received": (received * self._itemsize).tolist(),
        }

    def as_dict(self, rounds=False):
        """Return totals, steps and peers (and with ``rounds``, every record) for ``json.dump``."""
        out = {"unit": self.unit, "totals": self.totals(), "steps": self.steps(), "peers": self.peers()}
        if rounds:
            out[self.units] = [r.as_dict() for r in self.rounds]
        return out

    def summary(self, rounds=False):
        """Return a readable report: totals, time per step, traffic per peer; with ``rounds``,
        the per-round table after it."""
        return _text.summary(self, rounds)
