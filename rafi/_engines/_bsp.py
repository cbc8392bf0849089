"""The bulk-synchronous engine behind ``mode="bsp"``: rounds of ``forward()``, driven by the host.

A round, collective over the forwarder's own duplicate communicator:

1. partition the outbox by destination on the device (``_partition``: one replay, one
   small copy of the per-destination counts to the host);
2. one ``Alltoall`` of control blocks (``_control``): requests, sorted starts, totals,
   error flags; every rank reaches the same verdict, so errors are raised everywhere
   before data moves;
3. receivers grant inbox space (``_flow``), sent back in a second ``Alltoall`` unless all
   items alive fit in one inbox anyway;
4. the granted items move (``_delivery``, ``_transports``): packed segments over MPI to
   peers on other nodes, pulled over CUDA IPC from peers on this node, copied locally
   for the self-send; IPC rounds end when no peer reads this rank's outbox any more;
5. what was not granted goes back to the front of the outbox, in order, for the next round.

Items pushed for ``device.ANY`` are given ranks by load between steps 2 and 3
(``_anywhere``), after which the round partitions and counts again.
"""

import time

import numpy as np

from .. import _control, _flow
from .._interrupts import deferred
from .._result import ForwardResult
from .._sparse import Exchanges
from ._base import PartitionedEngine, loop

__all__ = ["BspEngine"]


class BspEngine(PartitionedEngine):
    """Rounds of ``forward()`` for the forwarder ``fwd``; see the module docstring."""

    mode = "bsp"

    def __init__(self, fwd, transport, exchange):
        self._fwd = fwd
        self._exchanges = Exchanges(fwd._comm, fwd._watch, exchange)
        super().__init__(fwd, transport, rounds=True)
        self._payload_seconds = 0.0  # of the last round's _finish
        self._no_items = np.zeros(fwd.size, np.int64)

    def run(self, step, args, rounds, rounds_per_launch):
        return loop(self._fwd, step, args, rounds)

    def forward(self):
        """One round. Once its exchange is posted a round must end on every rank: where MPI's
        blocking collectives run (no rank has a deadline), a Ctrl-C, which Python could not
        raise inside them anyway, waits for the round's end (``_interrupts``), so a program
        that catches it may go on; where the waits are rafi's own (a deadline), Ctrl-C is
        raised at once, and this rank's forwarder then takes no more rounds (its peers name
        it when their deadline passes)."""
        fwd = self._fwd
        t0 = time.perf_counter()
        summary = self.partitioner.run()  # this rank's own work: an interruption here costs nothing
        try:
            if not fwd._watch.asked:
                with deferred():
                    return self._round(t0, summary)
            return self._round(t0, summary)
        except BaseException as exc:
            fwd._interrupted(exc, f"forward() round {fwd._round}", "after it had begun to exchange")
            raise

    def _round(self, t0, summary):
        """The round's exchanges, once this rank's outbox is partitioned (``forward``)."""
        fwd = self._fwd
        t1 = time.perf_counter()
        what = f"forward() round {fwd._round}"
        exchange = self._exchanges.pick()
        blocks = exchange.run(what, summary, fwd._bad_sends)
        t2 = time.perf_counter()
        if exchange.errors():
            error = _control.verdict(exchange.everyone(what), fwd.rank, fwd.capacity, fwd._bad_sends)
            fwd._bad_sends.clear()
            fwd._received = 0
            self._finish(summary, np.zeros(fwd.size, np.int64), np.zeros(fwd.size, np.int64), blocks)
            raise error
        if exchange.anywhere:  # ANY items: give them ranks by load, then count again
            incoming = int(blocks[:, _control.Block.REQUEST].sum())
            self.anywhere.place(summary, incoming, fwd._watch, fwd._comm, what + " (placing ANY items)")
            summary = self.partitioner.run()
            blocks = exchange.run(what, summary, fwd._bad_sends)
        requests_in = blocks[:, _control.Block.REQUEST]
        alive = exchange.alive
        self._exchanges.learn(exchange.pairs)
        if alive == 0:  # every rank knows nothing moves: no copies, no node barrier
            return self._empty_round(t0, t1, t2, exchange.messages)
        if alive <= fwd.capacity:  # no inbox can overflow: everyone knows all is granted
            given, granted = requests_in, summary.requests  # read within this round only
        else:
            given = _flow.grant(requests_in, fwd.capacity, fwd._round)
            granted = exchange.grant(given, summary.requests, what + " (grants)")
        deferred = self._finish(summary, granted, given, blocks)
        t3 = time.perf_counter()
        result = ForwardResult(fwd._received, alive, deferred, fwd._round)
        seconds = (t1 - t0, t2 - t1, t3 - t2, self._payload_seconds)
        fwd.stats.record(fwd._round, granted, given, deferred, alive, *seconds, exchange.messages)
        fwd._round += 1
        return result

    def _empty_round(self, t0, t1, t2, messages):
        """End a round in which no rank holds an item (the outboxes are empty already)."""
        fwd = self._fwd
        fwd._received = 0
        none = self._no_items
        seconds = (t1 - t0, t2 - t1, time.perf_counter() - t2, 0.0)
        fwd.stats.record(fwd._round, none, none, 0, 0, *seconds, messages)
        fwd._round += 1
        return ForwardResult(0, 0, 0, fwd._round - 1)

    def _finish(self, summary, granted, given, blocks):
        """Move the granted items and keep the rest; return how many this rank kept.

        ``granted[p]``: items this rank sends peer ``p``; ``given[p]``: items it takes from
        ``p``; ``blocks``: the round's control blocks (the peers' sorted starts for IPC).
        """
        fwd, links, delivery = self._fwd, self.links, self.delivery
        starts = blocks[:, _control.Block.START]
        received, total = delivery.plan_round(given, granted, summary, starts, self.copied)
        started = time.perf_counter()
        if links.bulk is not None:
            links.bulk.exchange(
                self.partitioner.packed, granted * self.by_bulk, summary.starts,
                fwd._inbox_words, given * self.by_bulk, delivery.displs,
            )  # fmt: skip
        delivery.deliver()
        links.release()
        if total:
            delivery.keep()
        self._payload_seconds = time.perf_counter() - started
        fwd._received = received
        return total
