"""The error tree: every rafi error derives from `RafiError` and the fitting built-in."""

__all__ = [
    "collective",
    "RafiError",
    "ConfigError",
    "InvalidDestination",
    "OutboxOverflow",
    "CheckpointError",
    "CollectiveTimeout",
    "RankLeft",
    "RafiWarning",
]


class RafiError(Exception):
    """Base of every error rafi raises.

    ``collective`` is True when every rank raised it at the same point (a verdict of a
    collective call); leaving a ``with`` block on such an error closes normally, on any
    other error without waiting for the other ranks. ``also`` lists the other errors the
    same verdict found (its message tells them too).
    """

    collective = False
    also = ()


def collective(error):
    """Mark ``error`` as raised on every rank together; return it."""
    error.collective = True
    return error


class ConfigError(RafiError, ValueError):
    """A setting, argument or environment variable is wrong (ranks disagree, bad dtype, ...)."""


class _Detailed(RafiError):
    """A rafi error whose keyword arguments become attributes (``count``, ``ranks``, ...)."""

    def __init__(self, message, **details):
        super().__init__(message)
        self.__dict__.update(details)


class InvalidDestination(_Detailed, ValueError):
    """Items were pushed for a rank outside ``[0, size)``.

    Attributes:
        count: how many such items all ranks together pushed.
        example: one offending destination.
        ranks: the ranks that pushed them.
    """


class OutboxOverflow(_Detailed, OverflowError):
    """Pushes were refused because an outbox was full.

    Attributes:
        refused: how many items all ranks together could not push.
        needed: the outbox capacity that would have held every item on every rank.
        ranks: the ranks whose outbox overflowed.
    """


class CheckpointError(RafiError, OSError):
    """A checkpoint file is truncated, corrupted or not a rafi checkpoint."""


class CollectiveTimeout(_Detailed, TimeoutError):
    """A rafi call waited longer than its ``timeout`` (``RAFI_TIMEOUT``) for other ranks.

    Raised on the ranks that waited; the communicator it happened on is not used again.

    Attributes:
        missing: the ranks that were not waiting in any rafi call when the census ran.
        waiting: ``{rank: what it waits in}`` for the ranks that answered.
        seconds: how long this rank waited.
        what: the call this rank waited in.
    """


class RankLeft(_Detailed, RuntimeError):
    """A rank closed a Forwarder while other ranks still called ``forward()`` on it.

    Raised on every rank of the forwarder: on those that closed it (by ``close()`` or the end
    of its ``with`` block) and in the ``forward()`` of the others. Uncaught, the job ends with
    one line, printed by the lowest rank that closed (``_departure``).

    Attributes:
        ranks: the (``COMM_WORLD``) ranks that closed it.
        printer: whether this rank is the one that says so for the job.
    """


class RafiWarning(UserWarning):
    """A warning of rafi's: issued alike on every rank, shown once per job (by rank 0)."""
