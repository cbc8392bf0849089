"""The asynchronous progress engine behind ``mode="async"`` and ``fwd.batches()``.

No global rounds. Each turn of ``batches()`` on a rank: complete what has arrived
(``_transports._channels``), partition the outbox (``_partition``), send every peer with a
credit up to ``window`` of its items, fill the inbox with up to ``capacity`` items (this
rank's own and the peers' arrived slots, the first source rotating every turn so none
starves), put what could not go back at the front of the outbox (``_delivery``), and take
part in the current termination wave (``_termination``). A non-empty inbox is yielded as a
batch; when nothing arrived and nothing is left to do, the rank backs off (sleeps with
exponential growth up to 0.1 ms) and polls again, until the waves say every rank is idle and
no message is in flight, or carry an error, which every rank then raises.
"""

import time

import numpy as np

from rafi.kernels import partition as kern

from . import _control
from ._mpi_support import item_datatype
from ._termination import Waves
from ._transports._channels import Channels

__all__ = ["AsyncEngine"]

_BACKOFF_MAX = 1e-4


class _Backoff:
    """Sleep a little longer each time nothing happened (the mpi4py.futures idiom)."""

    def __init__(self):
        self._delay = 0.0

    def reset(self):
        self._delay = 0.0

    def sleep(self):
        time.sleep(self._delay)
        self._delay = min(_BACKOFF_MAX, max(1e-6, 2 * self._delay))


class AsyncEngine:
    """Moves a forwarder's items without rounds; see the module docstring.

    ``stats`` records, per rank: ``batches``, ``items`` received in them, ``messages``
    sent, and ``waiting`` seconds spent inside ``batches()`` not yielding (the rank's
    idle time while others work).
    """

    def __init__(self, fwd):
        self._fwd = fwd
        self._b = fwd._backend
        size, capacity = fwd.size, fwd.capacity
        self.window = max(1, capacity // size)
        self._datatype = item_datatype(fwd.item_dtype.itemsize)
        self._channels = Channels(fwd._comm, self._b, self._datatype, fwd._width, fwd._word, self.window)
        self._iota = self._b.as_device(np.arange(size * self.window, dtype=np.int32))
        self._credit_host = self._b.host_buffer(size, np.int64)
        self._credit = self._b.zeros(size, np.int64)
        self._stage_plan = self._b.zeros(size * kern.ROW, np.int64)
        self._threads = self._b.threads(size * self.window * fwd._width)
        self._waves = Waves(fwd._comm, capacity)
        self._flags = np.zeros(_control.Block.WORDS, np.int64)
        self._turn = 0
        self._dirty = True  # the outbox may hold items (the user ran code since the last turn)
        self.looping = False  # a batches() loop has started and not ended
        self._detail = None
        self.stats = {"batches": 0, "items": 0, "messages": 0, "waiting": 0.0}

    def batches(self):
        """Yield inbox batches until global termination; see ``Forwarder.batches``."""
        self.looping = True
        try:
            yield from self._loop()
        finally:
            self.looping = False

    def _loop(self):
        fwd, channels = self._fwd, self._channels
        backoff = _Backoff()
        since = time.perf_counter()
        self._dirty = True
        while True:
            moved = channels.poll()
            received, busy = self._turn_once()
            moved += received
            send = _control.Block.SEND_ERROR
            self._flags[send] = self._flags[send] or fwd._send_error
            self._detail = self._detail or fwd._send_detail
            fwd._send_error, fwd._send_detail = 0, None
            try:
                state = self._waves.poll(channels.sent, channels.received, busy, self._flags, self._detail)
            except Exception:
                self._detail = None
                raise
            self.stats["messages"] = channels.sent
            if received:
                self.stats["waiting"] += time.perf_counter() - since
                self.stats["batches"] += 1
                self.stats["items"] += received
                fwd._received = received
                yield fwd._inbox_items[:received]
                self._dirty = True
                backoff.reset()
                since = time.perf_counter()
                continue
            fwd._received = 0
            if state == "terminated":
                self.stats["waiting"] += time.perf_counter() - since
                return
            if not moved:
                backoff.sleep()

    def sources(self):
        """The receive slots, as the delivery's sources: ``{peer: (records, order)}``; slot
        ``p`` starts at record ``p * window``, which the plan row of ``p`` names."""
        channels, iota = self._channels, self._iota
        return {peer: (channels.recv_stage, iota) for peer in channels.peers}

    def enqueue_stage(self, summary, order):
        """Part of the partition replay: write each outgoing segment into the send stage."""
        b, fwd, size = self._b, self._fwd, self._fwd.size
        b.to_device(self._credit_host, self._credit)
        b.launch(kern.plan_stage, size, summary, self._credit, self.window, self._stage_plan)
        t, plan, stage = self._threads, self._stage_plan, self._channels.send_stage
        b.launch(kern.gather_rows, t, t, plan, 0, size, order, fwd._outbox_words, fwd._width, stage)

    def _turn_once(self):
        """Send, fill the inbox and keep the rest; return (items in the inbox, busy)."""
        fwd, channels, size, me = self._fwd, self._channels, self._fwd.size, self._fwd.rank
        if not self._dirty and not channels.full.any():
            return 0, channels.pending  # nothing to send or deliver: no device work this turn
        credit = self._credit_host
        credit[:] = channels.credit
        summary = fwd._partitioner.run()  # sorts, stages segments for peers with a credit, waits
        channels.device_idle()
        flags = self._flags
        flags[_control.Block.REFUSED] += summary.refused
        flags[_control.Block.NEEDED] = max(flags[_control.Block.NEEDED], summary.pushed + summary.refused)
        if summary.invalid:
            flags[_control.Block.INVALID] += summary.invalid
            flags[_control.Block.EXAMPLE] = summary.example
        taken = np.minimum(summary.requests, self.window) * credit
        for peer in np.flatnonzero(taken):
            channels.send(int(peer), int(taken[peer]))
        rows = fwd._delivery.rows
        rows[:] = 0
        room, at = fwd.capacity, 0
        slots = []
        for source in np.roll(np.arange(size), -(self._turn % size)):
            if source == me and summary.requests[me] and room:
                k = min(int(summary.requests[me]), room)
                rows[me] = (k, summary.starts[me], at)
                taken[me], room, at = k, room - k, at + k
            elif source != me and channels.full[source] and channels.full[source] <= room:
                k = int(channels.full[source])
                rows[source] = (k, source * self.window, at)
                slots.append(int(source))
                room, at = room - k, at + k
        self._turn += 1
        total = fwd._delivery.plan_keep(summary.requests, summary.starts, taken)
        fwd._delivery.deliver()
        if total:
            fwd._delivery.keep()
        channels.read(slots)
        busy = total > 0 or at > 0 or bool(channels.full.any()) or channels.pending
        self._dirty = total > 0
        return at, busy

    def close(self):
        """Align and finish the waves, cancel the channels' receives; collective."""
        self._waves.close(self._fwd._comm)
        self._channels.close()
        self._datatype.Free()
