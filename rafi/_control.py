"""The count exchange of a round, and the agreement on errors that rides with it.

Every rank sends every peer one block of int64 words: how many items it holds for that
peer, plus its own totals and error flags, repeated in every block. One ``Alltoall`` thus
tells each receiver its requests and tells every rank every rank's flags, so all ranks
reach the same verdict (raise, or go on) before any payload moves.
"""

import logging

import numba
import numpy as np

from rafi.kernels import outbox as ob

from ._errors import ConfigError, InvalidDestination, OutboxOverflow, RankLeft, collective

__all__ = ["BadSends", "Block", "Exchange", "INVALID_SEND", "LEAVING", "SEND_ERRORS", "own_words", "verdict"]


class Block:
    """Word positions in a control block."""

    REQUEST = 0  # items the sender holds for this receiver
    START = 1  # where they begin in the sender's sort order (an IPC receiver reads from there)
    TOTAL = 2  # items in the sender's outbox (valid destinations)
    REFUSED = 3  # pushes its outbox refused since the last forward
    NEEDED = 4  # outbox capacity that would have held them
    INVALID = 5  # items it pushed for a rank outside [0, size)
    EXAMPLE = 6  # one such destination
    SEND_ERROR = 7  # bit ``1 << code`` for each code of SEND_ERRORS among its bad send() calls
    SEND_CALLS = 8  # how many send() calls it refused
    SEND_ITEMS = 9  # how many items they held
    PEERS = 10  # other ranks it holds items for
    ANYWHERE = 11  # items it holds for ``device.ANY`` (counted in TOTAL too)
    WORDS = 12


LEAVING = 1  # bit 0 of SEND_ERROR, which no code uses: the sender is closing (``_departure``)
SEND_ERRORS = {  # send() misuse, a ConfigError
    1: "items of the wrong dtype",
    2: "items that are not a 1-d array",
    3: "destinations that are not one integer or an integer array as long as the items",
}
# A send() call with destinations outside [0, size): InvalidDestination, as a kernel's pushes.
# Its destinations are counted in INVALID (EXAMPLE one of them), not in SEND_CALLS/ITEMS; the
# bit tells it also where only the error words travel (resident rounds, whose kernels carry
# SEND_ERROR, SEND_CALLS and SEND_ITEMS but count INVALID from their own partition: there
# the verdict asks the ranks for their counts, ``BadSends(share=...)``).
INVALID_SEND = 4
_MISUSE = sum(1 << code for code in SEND_ERRORS)


class BadSends:
    """This rank's refused ``send()`` calls since the last verdict; every one is reported.

    Args:
        share: where the control words cannot carry a ``send()``'s invalid destinations
            (resident rounds), ``share(value)`` returns every rank's ``value`` (the
            forwarder's ``Watch.allgather``); the verdict, which every rank reaches at
            the same point, then asks each rank for its count and example.
    """

    def __init__(self, share=None):
        self.calls = []  # (code, items, detail, invalid destinations, one of them)
        self._counted = 0  # how many are in a block already
        self.share = share

    def invalid(self):
        """``(destinations out of range, one of them)`` over this rank's calls."""
        counts = [(invalid, example) for code, _, _, invalid, example in self.calls if code == INVALID_SEND]
        return sum(c for c, _ in counts), (counts[0][1] if counts else 0)

    def add(self, code, items, detail, invalid=0, example=0):
        self.calls.append((code, items, detail, invalid, example))

    def put(self, words):
        """Add the calls no block has counted yet to ``words`` (a block's error words)."""
        for code, items, _, invalid, example in self.calls[self._counted :]:
            words[Block.SEND_ERROR] |= 1 << code
            if code == INVALID_SEND:
                if not words[Block.INVALID]:
                    words[Block.EXAMPLE] = example
                words[Block.INVALID] += invalid
            else:
                words[Block.SEND_CALLS] += 1
                words[Block.SEND_ITEMS] += items
        self._counted = len(self.calls)

    def describe(self, invalid=False):
        """This rank's bad calls (those with destinations out of range when ``invalid``, else
        the others), each with its number among all the calls since the last verdict."""
        return "; ".join(
            f"call {k + 1}: {detail}"
            for k, (code, _, detail, _, _) in enumerate(self.calls)
            if (code == INVALID_SEND) == invalid
        )

    def clear(self):
        self.calls, self._counted = [], 0


class Exchange:
    """The round's count exchange over ``comm`` as one ``Alltoall``, in buffers made once.

    ``run`` sends every peer its block and returns the ``(size, Block.WORDS)`` blocks
    received, under ``watch``'s deadline (``_liveness``). Then ``alive`` is the items held
    anywhere, ``pairs`` how many (sender, receiver) pairs of distinct ranks have items,
    ``anywhere`` how many items of all ranks are for ``device.ANY``,
    ``errors`` whether a block carries an error word, ``everyone`` every rank's own words
    (what ``verdict`` reads), ``grant`` swaps a flow-controlled round's grants, and
    ``messages`` counts the control messages this rank sent in the round.
    ``_sparse.SparseExchange`` does the same with messages only between ranks that talk.
    """

    name = "dense"

    def __init__(self, comm, watch):
        size = comm.Get_size()
        self._comm, self._watch, self._size, self._rank = comm, watch, size, comm.Get_rank()
        self._out = np.zeros((size, Block.WORDS), np.int64)
        self.blocks = np.zeros((size, Block.WORDS), np.int64)
        self._words = np.zeros(Block.WORDS, np.int64)
        self._sums = np.zeros(Block.WORDS, np.int64)
        self.messages = 0

    def run(self, what, summary, bad_sends):
        own_words(self._words, summary, bad_sends, self._rank)
        _fill_blocks(self._out, self._words, summary.requests, summary.starts)
        if self._size == 1:  # one rank: its block is all there is
            self.blocks[:] = self._out
        else:
            self._watch.collective("Alltoall", self._out, self.blocks, what=what)
        _column_sums(self.blocks, self._sums)
        self.messages = self._size - 1
        return self.blocks

    @property
    def alive(self):
        return int(self._sums[Block.TOTAL])

    @property
    def pairs(self):
        return int(self._sums[Block.PEERS])

    @property
    def anywhere(self):
        return int(self._sums[Block.ANYWHERE])

    def errors(self):
        """Whether any rank reported an error in the blocks last received (the error words
        are counts and bit masks, never negative)."""
        sums = self._sums
        return bool(sums[Block.REFUSED] or sums[Block.INVALID] or sums[Block.SEND_ERROR])

    def everyone(self, what):
        return self.blocks

    def grant(self, given, requests, what):
        """Send each sender its grant (``given[p]``); return what each receiver granted this
        rank (``requests[p] > 0`` marks the receivers it asked)."""
        granted = np.empty_like(given)
        self._watch.collective("Alltoall", given, granted, what=what)
        self.messages += self._size - 1
        return granted


def own_words(words, summary, bad_sends, rank):
    """This rank's own control words (totals and error flags), the same in every block."""
    s = summary
    needed = s.pushed + s.refused
    _own_words(words, s.valid, s.refused, needed, s.invalid, s.example, s.anywhere, s.requests, rank)
    if bad_sends.calls:
        bad_sends.put(words)
    return words


# A round's host path is a few microseconds of work spread over many small numpy calls,
# each of which costs a microsecond on its own: these compiled helpers do it in one call.

_REFUSED, _NEEDED, _INVALID, _EXAMPLE = Block.REFUSED, Block.NEEDED, Block.INVALID, Block.EXAMPLE
_SEND_ERROR, _PEERS, _ANYWHERE = Block.SEND_ERROR, Block.PEERS, Block.ANYWHERE


@numba.njit(nogil=True, cache=True)
def _own_words(words, valid, refused, needed, invalid, example, anywhere, requests, rank):
    """Fill ``words`` with these totals, no send error, and the other ranks this one holds
    items for."""
    words[_TOTAL], words[_REFUSED], words[_NEEDED] = valid, refused, needed
    words[_INVALID], words[_EXAMPLE] = invalid, example
    words[_SEND_ERROR:] = 0
    peers = 0
    for p in range(len(requests)):
        peers += requests[p] > 0 and p != rank
    words[_PEERS], words[_ANYWHERE] = peers, anywhere


_REQUEST, _START, _TOTAL = Block.REQUEST, Block.START, Block.TOTAL  # compiled code reads globals


@numba.njit(nogil=True, cache=True)
def _fill_blocks(out, words, requests, starts):
    """Every peer's block: its request and start, then this rank's own words."""
    for p in range(out.shape[0]):
        out[p, _REQUEST] = requests[p]
        out[p, _START] = starts[p]
        for k in range(_TOTAL, out.shape[1]):
            out[p, k] = words[k]


@numba.njit(nogil=True, cache=True)
def _column_sums(blocks, sums):
    """Every column's total over the received blocks."""
    sums[:] = 0
    for p in range(blocks.shape[0]):
        for k in range(blocks.shape[1]):
            sums[k] += blocks[p, k]


def verdict(blocks, rank, capacity, bad_sends=None):
    """Return the error every rank raises for these blocks, or None.

    Every problem is reported: the error is of the first kind found (send misuse, then
    invalid destinations, then overflow); its message also tells the others, which are in
    its ``also`` list. Every rank computes the same answer from the same words; the error is
    marked ``collective``. A rank closing the forwarder (``LEAVING``) is ``RankLeft`` instead,
    which the closing rank reports for the job (``_departure.agree_to_close``).
    """
    leaving = np.flatnonzero(blocks[:, Block.SEND_ERROR] & LEAVING).tolist()
    if leaving:
        return RankLeft(
            f"rank(s) {leaving} of the forwarder closed it while rank {rank} called forward()",
            ranks=leaving,
            printer=False,
        )
    found = [
        error
        for error in (
            _bad_sends(blocks, rank, bad_sends),
            _invalid(blocks, rank, bad_sends),
            _overflow(blocks, capacity),
        )
        if error is not None
    ]
    if not found:
        return None
    first, first.also = found[0], found[1:]
    logging.getLogger("rafi").info("rank %d: %s: %s", rank, type(first).__name__, first.args[0])
    if first.also:
        first.args = (" ".join([first.args[0], *(f"Also: {e.args[0]}" for e in first.also)]),)
    return collective(first)


def _bad_sends(blocks, rank, bad_sends):
    masks = blocks[:, Block.SEND_ERROR] & _MISUSE
    if not masks.any():
        return None
    ranks = np.flatnonzero(masks).tolist()
    parts = []
    for r in ranks:
        kinds = ", ".join(text for code, text in SEND_ERRORS.items() if masks[r] & (1 << code))
        calls, items = int(blocks[r, Block.SEND_CALLS]), int(blocks[r, Block.SEND_ITEMS])
        parts.append(f"rank {r}: {calls} call(s) with {items} item(s): {kinds}")
    message = f"send() was given bad input on rank(s) {ranks} ({'; '.join(parts)}); nothing of it was queued."
    mine = bad_sends.describe() if bad_sends is not None else ""
    if mine:
        message += f" On this rank (rank {rank}): {mine}."
    return ConfigError(message)


def _invalid(blocks, rank, bad_sends):
    invalid = blocks[:, Block.INVALID]
    by_send = (blocks[:, Block.SEND_ERROR] & (1 << INVALID_SEND)) != 0
    if not invalid.any() and not by_send.any():
        return None
    size = len(blocks)
    if by_send.any() and bad_sends is not None and bad_sends.share is not None:
        blocks = blocks.copy()  # the words carried only the kernels' own: add the sends'
        for r, (count, example) in enumerate(bad_sends.share(bad_sends.invalid())):
            if count and not blocks[r, Block.INVALID]:
                blocks[r, Block.EXAMPLE] = example
            blocks[r, Block.INVALID] += count
        invalid = blocks[:, Block.INVALID]
    ranks = np.flatnonzero((invalid > 0) | by_send).tolist()
    counted = np.flatnonzero(invalid).tolist()
    count = int(invalid.sum())
    example = int(blocks[counted[0], Block.EXAMPLE]) if counted else None
    parts = []
    if counted:
        if example == ob.WIDE:  # a kernel's destination int32 cannot hold: its value is gone
            example, shown = None, "one outside int32's range (2**31 or more, or below -2**31)"
        else:
            shown = f"destination {example}"
        parts.append(
            f"{count} item(s) were pushed for destinations outside [0, {size}) on rank(s) "
            f"{counted}, e.g. {shown} on rank {counted[0]}; they were dropped and "
            "every other item is still queued."
        )
    senders = np.flatnonzero(by_send).tolist()
    if senders:
        parts.append(f"Among them, send() calls on rank(s) {senders} queued none of their items.")
    mine = bad_sends.describe(invalid=True) if bad_sends is not None else ""
    if mine:
        parts.append(f"On this rank (rank {rank}): {mine}.")
    return InvalidDestination(" ".join(parts), count=count, example=example, ranks=ranks)


def _overflow(blocks, capacity):
    refused = blocks[:, Block.REFUSED]
    if not refused.any():
        return None
    ranks = np.flatnonzero(refused).tolist()
    count = int(refused.sum())
    needed = int(blocks[:, Block.NEEDED].max())
    return OutboxOverflow(
        f"{count} push(es) were refused because the outbox was full on rank(s) {ranks} "
        f"(capacity {capacity}); a capacity of {needed} would have held this round's pushes. "
        "The items that fit are still queued; forward() more often or raise the capacity. A "
        "loop of rounds (run()) needs room for its busiest round: what a step pushes for the "
        "items it received, on top of the items still held back for full receivers (for a step "
        "that pushes at most one item per item, twice the items one rank holds at once is always "
        "enough).",
        refused=count,
        needed=needed,
        ranks=ranks,
    )
