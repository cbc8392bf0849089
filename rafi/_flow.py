"""The flow-control rule: how much of its inbox a receiver grants each sender in a round.

A receiver takes at most ``capacity`` items per round. When senders ask for more, it
splits the capacity max-min fairly (water-filling: nobody gets more than they asked, and
no sender who asked for more gets less than any other sender), and hands the few
indivisible leftover items one each to consecutive senders from a start that advances by
the number of leftovers every round, so that even with ``capacity < senders`` every
sender that keeps asking is served within ``ceil(senders / capacity)`` rounds.
Nothing is dropped: what is not granted stays in the sender's outbox.
"""

import numpy as np

__all__ = ["grant"]


def grant(requests, capacity, round_number):
    """Return how many items each sender may send this round.

    Args:
        requests: items each sender holds for this receiver (int array, one per rank).
        capacity: the most items the receiver takes this round.
        round_number: the forward round, which rotates who gets the leftovers.

    Returns:
        int64 array ``g`` with ``0 <= g <= requests`` and ``g.sum() == min(requests.sum(), capacity)``.
    """
    requests = np.asarray(requests, dtype=np.int64)
    if requests.sum() <= capacity:
        return requests.copy()
    granted = np.zeros_like(requests)
    left = capacity
    hungry = requests > 0
    while left > 0 and hungry.any():
        share = left // int(hungry.sum())
        if share == 0:
            break
        give = np.where(hungry, np.minimum(requests - granted, share), 0)
        granted += give
        left -= int(give.sum())
        hungry = granted < requests
    if left > 0:  # fewer items left than hungry senders: rotate who gets one
        size = len(requests)
        order = (np.arange(size) + round_number * left) % size
        for sender in order[hungry[order]][:left]:
            granted[sender] += 1
    return granted
