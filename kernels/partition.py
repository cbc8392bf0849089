"""Partition an outbox by destination, and move records by the resulting order.

The partition is a stable O(N) counting sort. On the GPU (and its simulator) it runs as
the chunk kernels below; the cpu backend runs it as one compiled pass (``serial_partition``,
the same sort without the chunks, whose host side costs one call instead of five). The
outbox's valid slots ``[0, n)`` are cut into ``nchunks`` contiguous chunks, one thread
each, walked in order, so the sort is stable within a source. Rows of the count matrix are
destinations ``0..size-1``, one row for ``ANY`` (items the host assigns to ranks by load
before they move) and one for invalid destinations (sorted last, never sent):

    counts[row * nchunks + chunk]

An exclusive scan of that matrix (kernels/scan.py) gives each (row, chunk) its first
sorted slot; ``scatter_chunks`` then writes, for every sorted slot, the outbox slot it
came from (``order``) and, when an MPI transport needs contiguous segments, the record
itself (``packed``). Only the segment starts and counters gathered by ``summarize`` cross
to the host.

Records then move by ``order``, never by a second sort: ``gather_rows`` copies segments
described by a plan of rows ``(count, first sorted slot, first destination slot)``, from
this rank's outbox or from a peer's outbox mapped with CUDA IPC. The asynchronous engine's
plan is written on the device (``plan_stage``), from the summary, in the same replay. Every kernel that moves
records is grid-stride over machine words and reads its sizes from device memory, so one
launch shape serves every round and a CUDA graph can replay it.
"""

import numba

from rafi._kernel import kernel
from rafi._targets import func, inline_func
from rafi.kernels.outbox import ANY
from rafi.kernels.streaming import STREAM_BYTES, stream_fence, stream_store

__all__ = [
    "INFO_INVALID_EXAMPLE",
    "INFO_LEN",
    "ROW",
    "row_of",
    "rows",
    "assign_anywhere",
    "summary_len",
    "count_chunks",
    "summarize",
    "scatter_chunks",
    "gather_rows",
    "place_rows",
    "plan_stage",
    "serial_partition",
]

INFO_INVALID_EXAMPLE = 0
INFO_LEN = 1
ROW = 3  # words of a plan row: count, first sorted slot, first destination slot


@inline_func
def row_of(d, size):
    """The sort row of destination ``d``: itself, ``size`` for ``ANY``, ``size + 1`` if invalid."""
    if d >= 0 and d < size:
        return d
    if d == ANY:
        return size
    return size + 1


def rows(size):
    """Sort rows for ``size`` ranks: one per rank, one for ``ANY``, one for invalid destinations."""
    return size + 2


def summary_len(size):
    """Words of ``summarize``'s output."""
    return rows(size) + 4


@kernel
def count_chunks(c, dest, state, capacity, size, nchunks, counts, info):
    """Count, for chunk ``c``, how many of its items go to each destination row."""
    n = min(state[0], capacity)
    chunk = (n + nchunks - 1) // nchunks
    start = min(n, c * chunk)
    stop = min(n, start + chunk)
    for row in range(size + 2):
        counts[row * nchunks + c] = 0
    for k in range(start, stop):
        d = dest[k]
        row = row_of(d, size)
        if row == size + 1:
            info[INFO_INVALID_EXAMPLE] = d
        counts[row * nchunks + c] += 1


@kernel
def summarize(row, offsets, nchunks, size, state, count, refused, info, summary):
    """Gather what the host needs into one array, copied in one transfer.

    With ``R = size + 2`` rows: ``summary[0 : R + 1]``: first sorted slot of each row,
    then the total; ``summary[R + 1]``, ``[R + 2]``: the outbox's slot and refusal
    counters; ``summary[R + 3]``: an invalid destination, if any was pushed. Launched for
    ``row`` in ``[0, R]``.
    """
    last = size + 2
    summary[row] = offsets[row * nchunks]
    if row == last:
        summary[last + 1] = state[count]
        summary[last + 2] = state[refused]
        summary[last + 3] = info[INFO_INVALID_EXAMPLE]


@kernel
def scatter_chunks(c, dest, state, capacity, size, nchunks, cursors, order, words, width, packed, pack):
    """Give chunk ``c``'s items their sorted slots: ``order[slot] = outbox slot``; when
    ``pack`` is set, also copy each record, as machine words, to ``packed[slot]``."""
    n = min(state[0], capacity)
    chunk = (n + nchunks - 1) // nchunks
    start = min(n, c * chunk)
    stop = min(n, start + chunk)
    for k in range(start, stop):
        row = row_of(dest[k], size)
        at = row * nchunks + c
        pos = cursors[at]
        cursors[at] = pos + 1
        order[pos] = k
        if pack:
            for w in range(width):
                packed[pos * width + w] = words[k * width + w]


@func
def plain_store(array, index, value):
    """``array[index] = value``: ``stream_store``'s counterpart that keeps the line cached."""
    array[index] = value


def _whole_records(store):
    """``gather_records``'s loops, writing every word with ``store``: two copies of one
    source, since a branch between the two stores inside a loop is merged into one
    ordinary store by the compiler."""

    @func
    def of_8(t, nthreads, count, first, at, order, src, dst):
        # all eight loads before any store, at fixed offsets, which a CPU runs 1.2-2x as
        # fast as the word loop (a rank's share of 1M records from 2 to 16 sources)
        eight = numba.uint64(8)
        for j in range(t, count, nthreads):
            r = numba.uint64(order[first + j]) * eight
            w = numba.uint64(at + j) * eight
            a0 = src[r]
            a1 = src[r + numba.uint64(1)]
            a2 = src[r + numba.uint64(2)]
            a3 = src[r + numba.uint64(3)]
            a4 = src[r + numba.uint64(4)]
            a5 = src[r + numba.uint64(5)]
            a6 = src[r + numba.uint64(6)]
            a7 = src[r + numba.uint64(7)]
            store(dst, w, a0)
            store(dst, w + numba.uint64(1), a1)
            store(dst, w + numba.uint64(2), a2)
            store(dst, w + numba.uint64(3), a3)
            store(dst, w + numba.uint64(4), a4)
            store(dst, w + numba.uint64(5), a5)
            store(dst, w + numba.uint64(6), a6)
            store(dst, w + numba.uint64(7), a7)

    @func
    def of_width(t, nthreads, count, first, at, order, src, width, dst):
        if width == 8:
            of_8(t, nthreads, count, first, at, order, src, dst)
            return
        words = numba.uint64(width)
        for j in range(t, count, nthreads):
            read = numba.uint64(order[first + j]) * words
            write = numba.uint64(at + j) * words
            for word in range(width):
                w = numba.uint64(word)  # uint64 throughout (numpy 1.x makes uint64 + int a float)
                store(dst, write + w, src[read + w])

    return of_width


_gather_cached = _whole_records(plain_store)
_gather_streamed = _whole_records(stream_store)


@func
def _dense(order, first, count):
    """Whether a row's records fill at least three quarters of the outbox span they come
    from (a row is in outbox order). Streamed stores paid off only there: a row of every
    other record, as two ranks of uniform traffic gather, ran 25% slower streamed."""
    span = order[first + count - 1] - order[first] + 1
    return 4 * count >= 3 * span


@func
def gather_records(t, nthreads, count, first, at, order, src, width, dst, stream):
    """One plan row with fewer threads than words per record (the cpu backend runs one):
    each thread moves whole records; where ``stream`` allows, a dense row larger than the
    caches bypasses them (``kernels/streaming.py``). Unsigned indices leave no negative
    index to wrap, which makes the copy 2.5x faster on a CPU."""
    if stream and count * width * dst.itemsize >= STREAM_BYTES and _dense(order, first, count):
        _gather_streamed(t, nthreads, count, first, at, order, src, width, dst)
        stream_fence()
    else:
        _gather_cached(t, nthreads, count, first, at, order, src, width, dst)


@func
def gather_words(t, lanes, count, first, at, order, src, width, dst):
    """One plan row with ``lanes`` threads per word of a record: thread ``t`` moves word
    ``t % width`` of every ``lanes``-th record, four records' loads in flight at a time."""
    w = t % width
    j = t // width
    step = lanes * width
    while j + 3 * lanes < count:
        s0 = order[first + j] * width + w
        s1 = order[first + j + lanes] * width + w
        s2 = order[first + j + 2 * lanes] * width + w
        s3 = order[first + j + 3 * lanes] * width + w
        v0, v1, v2, v3 = src[s0], src[s1], src[s2], src[s3]
        d = (at + j) * width + w
        dst[d] = v0
        dst[d + step] = v1
        dst[d + 2 * step] = v2
        dst[d + 3 * step] = v3
        j += 4 * lanes
    for k in range(j, count, lanes):
        dst[(at + k) * width + w] = src[order[first + k] * width + w]


@kernel
def gather_rows(t, nthreads, plan, first_row, nrows, order, src, width, dst, stream):
    """For each plan row ``r`` in ``[first_row, first_row + nrows)``, copy its ``count``
    records: ``dst`` record ``at + j`` = ``src`` record ``order[first + j]``. ``stream``
    (0 or 1): whether a large row may bypass the cache on a CPU, for a ``dst`` that is not
    read back soon.

    With at least ``width`` threads, thread ``t`` always moves word ``t % width`` of every
    ``nthreads // width``-th record (a warp reads whole records, and no division is left in
    the loop), four records at a time: their loads are issued before any store, so a
    thread keeps four reads in flight (one at a time leaves the GPU's memory half idle);
    with fewer threads (the cpu backend's one), each thread moves whole records.
    """
    lanes = nthreads // width
    for r in range(first_row, first_row + nrows):
        count = plan[r * ROW]
        first = plan[r * ROW + 1]
        at = plan[r * ROW + 2]
        if lanes == 0:
            gather_records(t, nthreads, count, first, at, order, src, width, dst, stream)
        elif t < lanes * width:
            gather_words(t, lanes, count, first, at, order, src, width, dst)


@kernel
def place_rows(t, nthreads, plan, first_row, nrows, src, width, dst, dest, any_row):
    """Copy each plan row's records from ``src`` to the same slots of ``dst`` and set their
    destination to the row's index, ``dest[at + j] = r - first_row``, or ``ANY`` for the
    row ``any_row`` (relative; -1: none)."""
    for r in range(first_row, first_row + nrows):
        count = plan[r * ROW]
        at = plan[r * ROW + 2]
        for x in range(t, count * width, nthreads):
            dst[at * width + x] = src[at * width + x]
        d = r - first_row
        if d == any_row:
            d = ANY
        for j in range(t, count, nthreads):
            dest[at + j] = d


@kernel
def plan_stage(p, summary, credit, window, me, ipc, plan, ipc_plan):
    """Plan rows ``p`` of an asynchronous turn's sends: the first ``min(items for p,
    window)`` sorted items for destination ``p``, none without a credit (``credit[p] == 0``).
    They go to ``plan`` (the host stage, slot ``p * window``) or, for a peer reached over
    IPC (``ipc[p] == 1``), to ``ipc_plan`` (the peer's own receive slot for this rank,
    ``me * window``); the other plan's row is empty. ``summary`` is ``summarize``'s output."""
    count = summary[p + 1] - summary[p]
    if credit[p] == 0:
        count = 0
    count = min(count, window)
    host = count * (1 - ipc[p])
    plan[p * ROW] = host
    plan[p * ROW + 1] = summary[p]
    plan[p * ROW + 2] = p * window
    ipc_plan[p * ROW] = count - host
    ipc_plan[p * ROW + 1] = summary[p]
    ipc_plan[p * ROW + 2] = me * window


@numba.njit(nogil=True, cache=True)
def serial_partition(dest, state, capacity, size, order, words, width, packed, pack, summary):
    """The whole partition in one pass, for the cpu backend: ``order`` (and ``packed`` when
    ``pack``) as the chunk kernels write them with one chunk, and ``summary`` as
    ``summarize`` writes it."""
    n = min(state[0], capacity)
    last = size + 2
    counts = summary[: last + 1]
    counts[:] = 0
    example = 0
    for k in range(n):
        row = row_of(dest[k], size)
        if row == size + 1:
            example = dest[k]
        counts[row + 1] += 1
    for row in range(last):
        counts[row + 1] += counts[row]
    summary[last + 1] = state[0]
    summary[last + 2] = state[1]
    summary[last + 3] = example
    for k in range(n):
        row = row_of(dest[k], size)
        pos = counts[row]
        counts[row] = pos + 1
        order[pos] = k
        if pack:
            for w in range(width):
                packed[pos * width + w] = words[k * width + w]
    for row in range(last, 0, -1):  # the cursors ended at the next row's start: shift back
        counts[row] = counts[row - 1]
    counts[0] = 0


@kernel
def assign_anywhere(j, order, first_sorted, dest, first_global, bounds, size):
    """Give the ``j``-th ``ANY`` item (sorted slot ``first_sorted + j``) the rank whose share
    of all ``ANY`` items holds global index ``first_global + j``: the last ``r`` with
    ``bounds[r] <= first_global + j`` (``bounds`` is nondecreasing, ``bounds[0] == 0``)."""
    g = first_global + j
    lo, hi = 0, size - 1
    while lo < hi:  # binary search for the last bound at or below g
        mid = (lo + hi + 1) // 2
        if bounds[mid] <= g:
            lo = mid
        else:
            hi = mid - 1
    dest[order[first_sorted + j]] = lo
