"""The error tree: every rafi error derives from `RafiError` and the fitting built-in."""

__all__ = [
    "RafiError",
    "ConfigError",
    "InvalidDestination",
    "OutboxOverflow",
    "CheckpointError",
]


class RafiError(Exception):
    """Base of every error rafi raises."""


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
