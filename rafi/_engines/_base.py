"""The interface every engine has, and what the host-driven engines (bsp, async) share.

An engine is made by ``make_engine`` once the forwarder has agreed on its settings; it
allocates the outbox and the inbox where its mode needs them (``fwd._allocate``), moves
items (``forward``, ``batches``, ``run``) and frees what it made (``close``). A method its
mode does not offer raises ``ConfigError`` naming the one to use.
"""

import abc

import numpy as np

from .._anywhere import Anywhere
from .._delivery import Delivery
from .._errors import ConfigError
from .._interrupts import deferred
from .._mpi_support import agree_on_failure
from .._partition import Partitioner
from .._transports import Links

__all__ = ["Engine", "PartitionedEngine", "loop", "step_inbox"]


class Engine(abc.ABC):
    """How a forwarder moves items in one mode.

    Attributes:
        mode: the mode's name (``fwd.mode``).
        transport: what ``fwd.transport`` says.
        looping: a ``batches()`` loop is under way.
        unit: what ``fwd.stats`` records: ``"round"`` or ``"batch"``.
    """

    mode = "?"
    transport = "?"
    looping = False
    unit = "round"

    def busy(self):
        """Why items may be in flight now, when they may (a checkpoint must wait), or None."""
        if self.looping:
            return "inside a batches() loop"
        return None

    def forward(self):
        """One round; see ``Forwarder.forward``."""
        raise ConfigError(
            f"forward() is for mode='bsp' or 'resident'; in mode={self.mode!r} iterate fwd.batches()"
        )

    def batches(self):
        """Inbox batches until global termination; see ``Forwarder.batches``."""
        raise ConfigError(
            f"batches() is for mode='async'; in mode={self.mode!r} call fwd.forward() or fwd.run()"
        )

    @abc.abstractmethod
    def run(self, step, args, rounds, rounds_per_launch):
        """Rounds of ``step`` until nothing is alive (or ``rounds``); see ``Forwarder.run``."""

    @abc.abstractmethod
    def close(self):
        """Free what the engine made; collective. Returns True when messages are still in
        flight (the forwarder's communicator must then not be freed)."""

    def abandon(self):
        """Stop without waiting for any other rank (``Forwarder._abandon``); free nothing."""


def loop(fwd, step, args, rounds):
    """``run`` as a user writes it by hand: ``forward()``, then ``step`` over what arrived,
    until nothing is alive anywhere or ``rounds`` rounds ran. Returns the last result."""
    done, result = 0, None
    while rounds is None or done < rounds:
        result = fwd.forward()
        done += 1
        if not result.alive:
            break
        step_inbox(fwd, step, args, fwd.inbox, f"run() round {result.round}")
    return result


def step_inbox(fwd, step, args, inbox, where):
    """Run ``step`` over ``inbox`` (what the last round brought) and mark it consumed, as one
    unit: a Ctrl-C meanwhile is raised once both are done (``_interrupts``), so a ``run()``
    called again neither steps these items twice nor loses them. A step that raises (after
    stepping an unknown part of the inbox) leaves the forwarder refusing further rounds; one
    that does not compile stepped nothing (``ConfigError``, the forwarder unharmed)."""
    with deferred():
        try:
            fwd.launch(step, len(inbox), inbox, fwd.outbox, *args)
        except ConfigError:
            raise
        except BaseException as exc:
            fwd._break(
                f"its step {getattr(step, '__name__', step)} raised {type(exc).__name__} in {where} on "
                f"rank {fwd.rank}, after stepping an unknown part of the {len(inbox)} item(s) of its "
                "inbox, so a later round would step some of them twice or lose them"
            )
            raise
        fwd._received = 0  # processed: a checkpoint now saves the items step pushed, not these


class PartitionedEngine(Engine):
    """What ``bsp`` and ``async`` share: links to every peer (``_transports``), the partition
    of the outbox by destination (``_partition``), the plans that move records
    (``_delivery``) and the placement of ``ANY`` items (``_anywhere``).

    A subclass may define ``connected(sources)`` (given the node peers' mapped arrays;
    returns the sources the delivery copies from) and ``enqueue_stage`` (more work for the
    partition's replay; see ``Partitioner``).
    """

    def __init__(self, fwd, transport, rounds):
        comm, b, capacity, dtype = fwd._comm, fwd._backend, fwd.capacity, fwd.item_dtype
        shared = [(capacity, dtype), (capacity, np.int32)]  # what node peers read in rounds
        self.links = agree_on_failure(
            comm, lambda: Links(comm, b, dtype, capacity, transport, rounds, fwd._watch, shared)
        )
        try:
            fwd._allocate(self.links.zeros, b.zeros)
            order = self.links.zeros(capacity, np.int32)
            exported = self.exported(fwd, order)
            agree_on_failure(comm, lambda: self.links.connect(exported))
        except BaseException:
            self.links.close()
            raise
        self.transport = self.links.name
        sources = self.links.peers.sources if self.links.peers else {}
        self.copied = np.zeros(fwd.size, np.int64)  # sources copied by kernels: self, node peers
        self.copied[[fwd.rank, *sources]] = 1
        self.by_bulk = 1 - self.copied  # the others: the bulk transport (MPI or NCCL)
        sources = self.connected(sources)

        def kernels():  # compiled or loaded from the disk cache: 0.4-0.9 s a process
            self.partitioner = Partitioner(
                b, fwd._outbox, fwd._outbox_words, order, fwd.size, capacity, fwd._width, fwd._word,
                self.links.pack, then=getattr(self, "enqueue_stage", None),
            )  # fmt: skip
            self.delivery = Delivery(
                b, fwd.rank, fwd.size, fwd._outbox, fwd._outbox_words, fwd._width, order,
                fwd._inbox_words, self.partitioner.packed, sources,
            )  # fmt: skip
            self.anywhere = Anywhere(b, fwd._outbox, order, fwd.rank, fwd.size)

        try:  # ready on every rank before any returns: no rank's first round waits for a peer's loading
            agree_on_failure(comm, kernels)
        except BaseException:
            self.links.close()
            raise

    def exported(self, fwd, order):
        """The arrays node peers map: the outbox's records and its sort order (what they read)."""
        return (fwd._outbox_words, order)

    def connected(self, sources):
        """The delivery's sources (``{peer: (words, order)}``) given the mapped node peers."""
        return sources

    def close(self):
        self.links.close()
        return False
