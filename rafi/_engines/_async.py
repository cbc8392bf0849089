"""The asynchronous progress engine behind ``mode="async"`` and ``fwd.batches()``.

No global rounds. Each turn of ``batches()`` on a rank: complete what has arrived
(``_progress``: the loop polls, or a thread does), partition the outbox (``_partition``),
whose replay also writes up to ``window`` items for every peer with a credit where they
travel from (``_transports._channels``: a node peer's device slot over IPC, else mapped
host memory), send them, fill the inbox with up to ``capacity`` items (every peer's arrived
slot first, which returns its sender's credit soonest, then this rank's own; the first
source rotates when the capacity is below the rank count), put what
could not go back at the front of the outbox (``_delivery``), and take part in the current
termination wave (``_termination``). One device wait per turn. A non-empty inbox is yielded
as a batch (after a short wait for peers that usually send together, ``Coalescer``); when
nothing arrived and nothing is left to do, the rank backs off and polls again, until the
waves say every rank is idle and no message is in flight, or carry an error, which every
rank then raises.
"""

import time

import numpy as np

from rafi.kernels import partition as kern

from .. import _control
from .._errors import ConfigError, RafiError
from .._liveness import service
from .._mpi_support import item_datatype
from .._progress import make_progress
from .._result import ForwardResult
from .._termination import Waves
from .._transports._channels import Channels
from ._base import PartitionedEngine, step_inbox

__all__ = ["AsyncEngine", "Coalescer", "window"]


class Coalescer:
    """Whether a turn should wait for more arrivals before it fills the inbox.

    Every batch costs a turn (partition, a device wait, delivery) and the user's launch, so
    two arrivals delivered together cost less than apart. A rank with nothing of its own to
    send, whose arrived slots lack a peer that sent in its last batch, waits for that peer,
    but never longer than its own delivering turns take (a moving average): waiting costs
    at most what merging saves. A rank with its own items never waits.
    """

    def __init__(self, size):
        self.expected = np.zeros(size, bool)  # peers that sent in the last batch
        self.cost = 0.0  # seconds, moving average of a delivering turn
        self._since = None

    def waits(self, full, dirty):
        if dirty or not full.any() or not (self.expected & (full == 0)).any():
            self._since = None
            return False
        now = time.perf_counter()
        self._since = self._since or now
        if now - self._since < self.cost:
            return True
        self._since = None
        return False

    def delivered(self, sources, seconds):
        self.expected[:] = False
        self.expected[sources] = True
        self.cost = 0.8 * self.cost + 0.2 * seconds


def window(capacity, size):
    """The most items in flight from one rank to another: an equal share of the inbox."""
    return max(1, capacity // size)


class AsyncEngine(PartitionedEngine):
    """Moves a forwarder's items without rounds; see the module docstring.

    On a GPU, node peers reached over IPC write into this rank's device receive slots
    (``size * window`` records as words), which it exports instead of its outbox.

    ``stats`` records, per rank: ``batches``, ``items`` received in them, ``messages``
    sent, and ``waiting`` seconds spent inside ``batches()`` not yielding (the rank's
    idle time while others work).
    """

    mode = "async"
    unit = "batch"

    def __init__(self, fwd, transport, progress):
        self._fwd = fwd
        self._b = fwd._backend
        self._progress_name = progress
        self.window = window(fwd.capacity, fwd.size)
        self._slots = None
        super().__init__(fwd, transport, rounds=False)

    def exported(self, fwd, order):
        b = self._b
        if b.device_arrays and not b.simulator:  # what IPC peers write into
            self._slots = b.zeros(fwd.size * self.window * fwd._width, fwd._word)
            return (self._slots,)
        return super().exported(fwd, order)

    def connected(self, ipc):
        """Make the channels (``ipc``: ``{peer: (their slots,)}``, mapped here); return the
        delivery's sources (``sources``)."""
        fwd, progress = self._fwd, self._progress_name
        size, capacity = fwd.size, fwd.capacity
        self._datatype = item_datatype(fwd.item_dtype.itemsize)
        self._ipc = {peer: arrays[0] for peer, arrays in ipc.items()} if self._slots is not None else {}
        channels = (fwd._comm, self._b, self._datatype, fwd._width, fwd._word, self.window, self._ipc)
        self._channels = Channels(*channels)
        ipc_mask = np.zeros(size, np.int64)
        ipc_mask[list(self._ipc)] = 1
        self._ipc_mask = self._b.as_device(ipc_mask)
        self._ipc_plan = self._b.zeros(size * kern.ROW, np.int64)
        self._iota = self._b.as_device(np.arange(size * self.window, dtype=np.int32))
        self._credit_host = self._b.host_buffer(size, np.int64)
        self._credit = self._b.zeros(size, np.int64)
        self._stage_plan = self._b.zeros(size * kern.ROW, np.int64)
        self._threads = self._b.threads(size * self.window * fwd._width)
        self._waves = Waves(fwd._comm, capacity, fwd._watch)
        self._progress = make_progress(progress, self._channels)
        self._flags = np.zeros(_control.Block.WORDS, np.int64)
        self._turn = 0
        self._dirty = True  # the outbox may hold items (the user ran code since the last turn)
        self._coalescer = Coalescer(size)
        self._held = np.zeros(fwd.size, bool)  # destinations with items kept in the outbox
        self.stats = {"batches": 0, "items": 0, "messages": 0, "waiting": 0.0, "progress": progress}
        self._idle, self._recorded = 0.0, 0.0  # for fwd.stats: idle seconds since the last record
        return self.sources()

    def run(self, step, args, rounds, rounds_per_launch):
        """``step`` over every batch until global termination (there are no rounds to count)."""
        if rounds is not None or rounds_per_launch is not None:
            raise ConfigError("run(rounds=..., rounds_per_launch=...) counts rounds: mode='async' has none")
        fwd, result = self._fwd, ForwardResult(0, 0, 0, 0)
        for batch in self.batches():
            result = ForwardResult(len(batch), 0, 0, self.stats["batches"] - 1)
            step_inbox(fwd, step, args, batch, f"run() batch {result.round}")
        return result

    def batches(self):
        """Yield inbox batches until global termination; see ``Forwarder.batches``."""
        self.looping = True
        try:
            yield from self._loop()
        finally:
            self.looping = False

    def _loop(self):
        fwd, channels, progress = self._fwd, self._channels, self._progress
        since = time.perf_counter()
        self._dirty = True
        error = None
        while True:
            if error is not None:
                raise error
            began = time.perf_counter()
            moved = progress.poll()
            with progress.lock:
                received, busy = self._turn_once()
                sent, got = channels.sent, channels.received
            moved += received
            fwd._bad_sends.put(self._flags)
            try:
                state = self._waves.poll(sent, got, busy, self._flags, fwd._bad_sends)
            except RafiError as found:
                fwd._bad_sends.clear()  # reported
                if not received:
                    raise
                error, state = found, "running"  # raised once this turn's batch is yielded
            self.stats["messages"] = sent
            if state == "terminated":
                if received:  # the waves' proof excludes it (_termination); never yield it here
                    raise RuntimeError(f"rafi internal error: {received} items arrived after termination")
                self.stats["waiting"] += time.perf_counter() - since
                return
            if received:
                self.stats["waiting"] += time.perf_counter() - since
                self.stats["batches"] += 1
                self.stats["items"] += received
                fwd._received = received
                yield fwd._inbox_view(received)
                self._dirty = True
                since = time.perf_counter()
                continue
            fwd._received = 0
            if not moved:
                service(self._waves.what())  # answer census questions (_liveness)
                progress.idle()
            self._idle += time.perf_counter() - max(began, self._recorded)

    def sources(self):
        """The receive slots, as the delivery's sources: ``{peer: (records, order)}``; slot
        ``p`` starts at record ``p * window`` (device slots for IPC peers, else the host stage),
        which the plan row of ``p`` names."""
        channels, iota = self._channels, self._iota
        return {p: (self._slots if p in self._ipc else channels.recv_stage, iota) for p in channels.peers}

    def enqueue_stage(self, summary, order):
        """Part of the partition replay: write each outgoing segment where it travels from:
        the host send stage, or an IPC peer's receive slot for this rank."""
        b, fwd, size = self._b, self._fwd, self._fwd.size
        b.to_device(self._credit_host, self._credit)
        rows = (self._stage_plan, self._ipc_plan)
        b.launch(kern.plan_stage, size, summary, self._credit, self.window, fwd.rank, self._ipc_mask, *rows)
        t, words, w, stage = self._threads, fwd._outbox_words, fwd._width, self._channels.send_stage
        b.launch(kern.gather_rows, t, t, self._stage_plan, 0, size, order, words, w, stage, 0)
        for peer, slots in sorted(self._ipc.items()):
            b.launch(kern.gather_rows, t, t, self._ipc_plan, peer, 1, order, words, w, slots, 0)

    def _turn_once(self):
        """Send, fill the inbox and keep the rest; return (items in the inbox, busy)."""
        fwd, channels, size, me = self._fwd, self._channels, self._fwd.size, self._fwd.rank
        if self._coalescer.waits(channels.full, self._dirty):
            return 0, True
        if not (self._dirty or channels.full.any() or (self._held & channels.credit).any()):
            # nothing new arrived or was pushed, and every kept item still waits for a credit
            return 0, channels.pending or self._held.any()
        started = time.perf_counter()
        credit = self._credit_host
        credit[:] = channels.credit
        summary = self.partitioner.run()  # sorts, stages segments for peers with a credit, waits
        if summary.anywhere:  # no rounds to balance by: ANY items run here
            self.anywhere.keep_here(summary)
            summary = self.partitioner.run()
        partitioned = time.perf_counter()
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
        rows = self.delivery.rows
        rows[:] = 0
        room, at = fwd.capacity, 0
        slots = []
        # Arrived slots first: reading one returns its sender's credit soonest, and they all
        # fit, (size - 1) windows leaving a window for this rank's own items. Below a window
        # of one per rank they may not: then every source, own included, takes its turn first.
        sources = [*np.flatnonzero(channels.full), me]
        if fwd.capacity < size:
            sources = np.roll(np.arange(size), -(self._turn % size))
        for source in sources:
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
        total = self.delivery.plan_keep(summary.requests, summary.starts, taken)
        moving = time.perf_counter()
        self.delivery.deliver()
        if total:
            self.delivery.keep()
        channels.read(slots)
        ended = time.perf_counter()
        if at:
            self._coalescer.delivered(slots, ended - started)
        if at or taken.any():
            self._record(taken, rows[:size, 0], total, at, (started, partitioned, moving, ended))
        busy = total > 0 or at > 0 or bool(channels.full.any()) or channels.pending
        self._held = summary.requests > taken
        self._dirty = bool(self._held[me])
        return at, busy

    def _record(self, sent, received, kept, taken, times):
        """Add a turn that moved items to ``fwd.stats`` (a "batch"): ``alive`` is what this
        rank held after it (its inbox and the items it kept), ``wait`` its idle time before."""
        started, partitioned, moving, ended = times
        partition, exchange, payload = partitioned - started, ended - partitioned, ended - moving
        self._fwd.stats.record(self._turn - 1, sent, received, kept, kept + taken, partition, self._idle,
                               exchange, payload)  # fmt: skip
        self._idle, self._recorded = 0.0, ended

    def abandon(self):
        """Stop the progress thread; leave messages and buffers as they are (``Forwarder._abandon``)."""
        self._progress.close()

    def close(self):
        """Align and finish the waves, cancel the channels' receives; collective.

        Returns True when messages are still in flight (a loop left by an error or a break):
        then the forwarder's communicator must not be freed, or MPI could give its context
        to a new communicator whose receives would match them.
        """
        from mpi4py import MPI

        comm, channels = self._fwd._comm, self._channels
        self._progress.close()
        self._waves.close(comm)
        counts = np.array([channels.sent, channels.received], np.int64)
        self._fwd._watch.wait([comm.Iallreduce(MPI.IN_PLACE, counts)], "close()")
        channels.close()
        self._datatype.Free()
        super().close()
        return bool(counts[0] != counts[1])
