"""``ForwardResult``: what one ``forward()`` reports."""

import collections

__all__ = ["ForwardResult"]

ForwardResult = collections.namedtuple("ForwardResult", ["received", "alive", "deferred", "round"])
ForwardResult.__doc__ = """What one collective ``forward()`` did.

Attributes:
    received: items now in this rank's inbox.
    alive: items in flight on all ranks together (delivered this round plus held back).
    deferred: items this rank still holds because a receiver was full.
    round: 0-based count of completed forward rounds.
"""
