"""The count exchange of a round, and the agreement on errors that rides with it.

Every rank sends every peer one block of int64 words: how many items it holds for that
peer, plus its own totals and error flags, repeated in every block. One ``Alltoall`` thus
tells each receiver its requests and tells every rank every rank's flags, so all ranks
reach the same verdict (raise, or go on) before any payload moves.
"""

import numpy as np

from ._errors import ConfigError, InvalidDestination, OutboxOverflow

__all__ = ["Block", "SEND_ERRORS", "exchange_counts", "verdict"]


class Block:
    """Word positions in a control block."""

    REQUEST = 0  # items the sender holds for this receiver
    START = 1  # where they begin in the sender's sort order (an IPC receiver reads from there)
    TOTAL = 2  # items in the sender's outbox (valid destinations)
    REFUSED = 3  # pushes its outbox refused since the last forward
    NEEDED = 4  # outbox capacity that would have held them
    INVALID = 5  # items it pushed for a rank outside [0, size)
    EXAMPLE = 6  # one such destination
    SEND_ERROR = 7  # a code from SEND_ERRORS, 0 when send() was called right
    WORDS = 8


SEND_ERRORS = {
    1: "items of the wrong dtype",
    2: "items that are not a 1-d array",
    3: "destinations that are not one integer or an integer array as long as the items",
}


def exchange_counts(comm, requests, starts, total, refused, needed, invalid, example, send_error):
    """Run the round's ``Alltoall``; return the ``(size, Block.WORDS)`` blocks received."""
    size = comm.Get_size()
    out = np.empty((size, Block.WORDS), np.int64)
    out[:, Block.REQUEST] = requests
    out[:, Block.START] = starts
    out[:, Block.TOTAL] = total
    out[:, Block.REFUSED] = refused
    out[:, Block.NEEDED] = needed
    out[:, Block.INVALID] = invalid
    out[:, Block.EXAMPLE] = example
    out[:, Block.SEND_ERROR] = send_error
    blocks = np.empty_like(out)
    comm.Alltoall(out, blocks)
    return blocks


def verdict(blocks, rank, capacity, local_send_detail=None):
    """Return the error every rank raises for these blocks, or None.

    Send misuse comes first, then invalid destinations, then overflow; every rank
    computes the same answer from the same words.
    """
    size = len(blocks)
    codes = blocks[:, Block.SEND_ERROR]
    if codes.any():
        ranks = np.flatnonzero(codes).tolist()
        what = "; ".join(f"rank {r}: {SEND_ERRORS.get(int(codes[r]), 'bad input')}" for r in ranks)
        message = f"send() was given bad input on rank(s) {ranks} ({what}); nothing of it was queued"
        if local_send_detail:
            message += f". On this rank (rank {rank}): {local_send_detail}"
        return ConfigError(message)
    invalid = blocks[:, Block.INVALID]
    if invalid.any():
        ranks = np.flatnonzero(invalid).tolist()
        example = int(blocks[ranks[0], Block.EXAMPLE])
        count = int(invalid.sum())
        return InvalidDestination(
            f"{count} item(s) were pushed for destinations outside [0, {size}) on rank(s) "
            f"{ranks}, e.g. destination {example} on rank {ranks[0]}; they were dropped and "
            "every other item is still queued",
            count=count,
            example=example,
            ranks=ranks,
        )
    refused = blocks[:, Block.REFUSED]
    if refused.any():
        ranks = np.flatnonzero(refused).tolist()
        count = int(refused.sum())
        needed = int(blocks[:, Block.NEEDED].max())
        return OutboxOverflow(
            f"{count} push(es) were refused because the outbox was full on rank(s) {ranks} "
            f"(capacity {capacity}); a capacity of {needed} would have held them. The items "
            "that fit are still queued; forward() more often or raise the capacity",
            refused=count,
            needed=needed,
            ranks=ranks,
        )
    return None
