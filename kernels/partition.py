"""Partition an outbox by destination: a stable O(N) counting sort, the same source on every backend.

The outbox's valid slots ``[0, n)`` are cut into ``nchunks`` contiguous chunks, one thread
each, walked in order, so the sort is stable within a source. Rows of the count matrix are
destinations ``0..size-1`` plus one row for invalid destinations (sorted last, never sent):

    counts[row * nchunks + chunk]

An exclusive scan of that matrix (kernels/scan.py) gives each (row, chunk) its first output
slot; ``scatter_chunks`` then moves each record, as machine words, to its slot. Only the
segment starts and counters gathered by ``summarize`` cross to the host.
"""

from rafi._kernel import kernel

__all__ = [
    "INFO_INVALID_EXAMPLE",
    "INFO_LEN",
    "count_chunks",
    "summarize",
    "scatter_chunks",
    "gather_kept",
]

INFO_INVALID_EXAMPLE = 0
INFO_LEN = 1


@kernel
def count_chunks(c, dest, state, capacity, size, nchunks, counts, info):
    """Count, for chunk ``c``, how many of its items go to each destination row."""
    n = min(state[0], capacity)
    chunk = (n + nchunks - 1) // nchunks
    start = min(n, c * chunk)
    stop = min(n, start + chunk)
    for row in range(size + 1):
        counts[row * nchunks + c] = 0
    for k in range(start, stop):
        d = dest[k]
        row = d
        if d < 0 or d >= size:
            row = size
            info[INFO_INVALID_EXAMPLE] = d
        counts[row * nchunks + c] += 1


@kernel
def summarize(row, offsets, nchunks, size, state, count, refused, info, summary):
    """Gather what the host needs into one array, copied in one transfer.

    ``summary[0 : size + 2]``: first sorted slot of each row, then the total;
    ``summary[size + 2]``, ``[size + 3]``: the outbox's slot and refusal counters;
    ``summary[size + 4]``: an invalid destination, if any was pushed.
    """
    if row <= size:
        summary[row] = offsets[row * nchunks]
    else:
        summary[row] = offsets[(size + 1) * nchunks]
        summary[size + 2] = state[count]
        summary[size + 3] = state[refused]
        summary[size + 4] = info[INFO_INVALID_EXAMPLE]


@kernel
def scatter_chunks(c, dest, state, capacity, size, nchunks, cursors, words, width, sorted_words):
    """Move chunk ``c``'s records to their sorted slots, advancing the scanned ``cursors``."""
    n = min(state[0], capacity)
    chunk = (n + nchunks - 1) // nchunks
    start = min(n, c * chunk)
    stop = min(n, start + chunk)
    for k in range(start, stop):
        d = dest[k]
        row = d
        if d < 0 or d >= size:
            row = size
        at = row * nchunks + c
        pos = cursors[at]
        cursors[at] = pos + 1
        for w in range(width):
            sorted_words[pos * width + w] = words[k * width + w]


@kernel
def gather_kept(i, plan, size, sorted_words, width, words, dest):
    """Copy the ``i``-th kept (not granted) sorted record, and its destination, back to the
    front of the outbox.

    ``plan[0 : size + 1]`` is the exclusive scan of kept items per destination (so
    ``plan[size]`` is their number) and ``plan[size + 1 + d]`` the sorted slot of the
    first kept item of destination ``d``.
    """
    lo = 0
    hi = size
    while hi - lo > 1:  # the destination d with plan[d] <= i < plan[d + 1]
        mid = (lo + hi) // 2
        if plan[mid] <= i:
            lo = mid
        else:
            hi = mid
    src = plan[size + 1 + lo] + (i - plan[lo])
    dest[i] = lo
    for w in range(width):
        words[i * width + w] = sorted_words[src * width + w]
