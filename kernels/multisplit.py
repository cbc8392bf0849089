"""Block-cooperative, stable partition of an outbox by destination on the GPU (and its simulator).

The chunk kernels of ``kernels/partition.py`` give each thread a contiguous chunk to walk
alone: reads are uncoalesced and every item costs a global-memory counter update. Here a
block owns a tile of ``TILE`` consecutive outbox slots (the multisplit of Ashkiani et al.,
with a raking scan instead of warp intrinsics, so the same source runs under the simulator):

1. ``count_tiles`` reads the tile's destinations coalesced and counts them by row in
   shared memory (one histogram per warp, so fewer lanes contend for one counter), then
   writes the tile's row totals as ``counts[row * ntiles + tile]``, the layout of the
   chunk kernels' counts, so the global scan and ``summarize`` serve both;
2. ``scatter_tiles`` loads the tile's rows into shared memory; thread ``t`` then owns the
   ``PER_THREAD`` consecutive items ``t * PER_THREAD + j`` of the tile and counts them, by
   row, in its own column of a ``(row, thread)`` table (no atomics);
3. an exclusive scan of that table in row-major order gives each ``(row, thread)`` its
   first slot in the tile sorted by row: rows first, then threads, then items in order,
   so the sort is stable;
4. ``scatter_tiles`` stages the sorted outbox slots in shared memory and writes ``order``
   (and, when packing, the records) in contiguous runs.

Shared memory is kept small (rows as bytes, counts and tile slots as 16-bit integers) so
that many blocks share a multiprocessor: each block waits on memory between its barriers,
and the others run meanwhile.

Rows are destinations ``0..size-1``, one for ``ANY`` and one for invalid destinations
(``partition.row_of``); a tile holds at most ``MAX_ROWS`` of them (the table lives in
shared memory). More destinations use the chunk kernels (``tiles`` returns 0). An outbox
of at most ``SMALL`` tiles is partitioned by one block in one launch (``partition_block``).
"""

import numba
from numba import cuda

from rafi._targets import simulator
from rafi.kernels.cuda_scan import MAX_VALUES
from rafi.kernels.outbox import COUNT, REFUSED
from rafi.kernels.partition import INFO_INVALID_EXAMPLE, row_of

__all__ = [
    "THREADS", "PER_THREAD", "TILE", "MAX_ROWS", "SMALL", "tiles", "count_tiles", "scatter_tiles",
    "partition_block",
]  # fmt: skip

# the simulator runs one OS thread per CUDA thread: small tiles, so tests cross tile edges
THREADS = 8 if simulator() else 128
PER_THREAD = 2 if simulator() else 16
TILE = THREADS * PER_THREAD
MAX_ROWS = 32
SMALL = 4  # tiles up to which one block partitions the whole outbox (``partition_block``)
_STRIDE = PER_THREAD + 1  # a thread's items in shared memory, padded against bank conflicts
_WARPS = (THREADS + 31) // 32
# shared array sizes: numba-cuda takes a global constant, not an expression of them
_SLOTS = THREADS * _STRIDE
_TABLE = MAX_ROWS * THREADS
_HISTOGRAMS = _WARPS * MAX_ROWS
_NONE = -1  # a tile slot past the outbox's end


def tiles(capacity, size):
    """Tiles that cover ``capacity`` slots, or 0 when this partition cannot serve ``size``
    destinations (too many rows for the table, or too many counts for one scan)."""
    ntiles = max(1, (capacity + TILE - 1) // TILE)
    rows = size + 2
    if rows > MAX_ROWS or rows * ntiles > MAX_VALUES:
        return 0
    return ntiles


@cuda.jit(device=True)
def _load_and_rank(dest, n, base, size, rows, slots, table, sums):
    """Steps 2 and 3 for this block's tile.

    After it, ``slots[t * _STRIDE + j]`` is the row of thread ``t``'s item ``j`` (or
    ``_NONE``) and ``table[row * THREADS + t]`` the tile-sorted slot of thread ``t``'s
    first item in ``row``.
    """
    t = cuda.threadIdx.x
    for j in range(PER_THREAD):  # coalesced: consecutive threads read consecutive slots
        i = j * THREADS + t
        k = base + i
        row = _NONE
        if k < n:
            row = row_of(dest[k], size)
        slots[(i // PER_THREAD) * _STRIDE + i % PER_THREAD] = row
    for row in range(rows):
        table[row * THREADS + t] = 0
    cuda.syncthreads()
    for j in range(PER_THREAD):
        row = int(slots[t * _STRIDE + j])  # narrow in shared memory, wide in arithmetic
        if row != _NONE:
            table[row * THREADS + t] += 1
    cuda.syncthreads()
    # raking exclusive scan of table[0 : rows * THREADS]: thread t sums its run of `rows`
    total = 0
    for x in range(t * rows, t * rows + rows):
        total += int(table[x])
    sums[t] = total
    cuda.syncthreads()
    step = 1
    while step < THREADS:  # inclusive scan of the run sums
        add = sums[t - step] if t >= step else 0
        cuda.syncthreads()
        sums[t] += add
        cuda.syncthreads()
        step *= 2
    running = sums[t] - total
    for x in range(t * rows, t * rows + rows):
        count = int(table[x])
        table[x] = running
        running += count
    cuda.syncthreads()


@cuda.jit(device=True)
def _count(dest, n, start, stop, size, histograms, info):
    """Count slots ``[start, min(stop, n))`` by row into per-warp ``histograms[warp, row]``
    (zeroed first), reading coalesced; note an invalid destination in ``info``. Each thread
    counts its own items first and adds each row's count once: when most items share a
    destination, one atomic per thread and row contends far less than one per item."""
    t = cuda.threadIdx.x
    for x in range(t, _HISTOGRAMS, THREADS):
        histograms[x] = 0
    mine = cuda.local.array(MAX_ROWS, numba.int32)
    rows = size + 2
    for row in range(rows):
        mine[row] = 0
    cuda.syncthreads()
    invalid = 0
    for k in range(start + t, min(stop, n), THREADS):
        d = dest[k]
        row = row_of(d, size)
        if row == size + 1:
            invalid = d
        mine[row] += 1
    if invalid != 0:
        info[INFO_INVALID_EXAMPLE] = invalid
    warp = (t // 32) * MAX_ROWS
    for row in range(rows):
        if mine[row]:
            cuda.atomic.add(histograms, warp + row, mine[row])
    cuda.syncthreads()


@cuda.jit(device=True)
def _row_total(histograms, row):
    total = 0
    for w in range(_WARPS):
        total += histograms[w * MAX_ROWS + row]
    return total


@cuda.jit(cache=True)
def count_tiles(dest, state, capacity, size, ntiles, counts, info):
    """Write tile ``blockIdx.x``'s row totals to ``counts[row * ntiles + tile]``."""
    histograms = cuda.shared.array(_HISTOGRAMS, numba.int32)  # (warp, row)
    tile = cuda.blockIdx.x
    n = min(state[0], capacity)
    _count(dest, n, tile * TILE, (tile + 1) * TILE, size, histograms, info)
    for row in range(cuda.threadIdx.x, size + 2, THREADS):
        counts[row * ntiles + tile] = _row_total(histograms, row)


@cuda.jit(device=True)
def _scatter_tile(base, m, rows, slots, table, sorted_slots, where, order, words, width, packed, pack):
    """Step 4 for the tile at ``base`` (``m`` items), ranked by ``_load_and_rank``;
    ``where[row]``: the sorted slot of the tile's first item in ``row``, less that item's
    tile-sorted slot."""
    t = cuda.threadIdx.x
    for j in range(PER_THREAD):  # each thread places its own items, in order
        row = int(slots[t * _STRIDE + j])  # narrow in shared memory, wide in arithmetic
        if row != _NONE:
            at = int(table[row * THREADS + t])
            table[row * THREADS + t] = at + 1
            sorted_slots[at] = t * PER_THREAD + j
    cuda.syncthreads()
    for i in range(t, m, THREADS):  # contiguous runs of sorted slots
        local = int(sorted_slots[i])
        order[where[slots[(local // PER_THREAD) * _STRIDE + local % PER_THREAD]] + i] = base + local
    if pack:
        for x in range(t, m * width, THREADS):
            i = x // width
            w = x - i * width
            local = int(sorted_slots[i])
            at = where[slots[(local // PER_THREAD) * _STRIDE + local % PER_THREAD]] + i
            packed[at * width + w] = words[(base + local) * width + w]
    cuda.syncthreads()


@cuda.jit(cache=True)
def scatter_tiles(dest, state, capacity, size, ntiles, offsets, order, words, width, packed, pack):
    """Write tile ``blockIdx.x``'s sorted slots: ``order[slot] = outbox slot``, its records
    to ``packed[slot]`` when ``pack`` is set. ``offsets`` is the scan of ``count_tiles``."""
    slots = cuda.shared.array(_SLOTS, numba.int8)  # rows: at most MAX_ROWS
    table = cuda.shared.array(_TABLE, numba.int16)  # counts and slots within a tile
    sums = cuda.shared.array(THREADS, numba.int32)
    sorted_slots = cuda.shared.array(TILE, numba.int16)
    where = cuda.shared.array(MAX_ROWS, numba.int64)
    t, tile = cuda.threadIdx.x, cuda.blockIdx.x
    rows = size + 2
    base = tile * TILE
    n = min(state[0], capacity)
    _load_and_rank(dest, n, base, size, rows, slots, table, sums)
    for row in range(t, rows, THREADS):
        where[row] = offsets[row * ntiles + tile] - int(table[row * THREADS])
    cuda.syncthreads()
    m = min(TILE, max(0, n - base))
    _scatter_tile(base, m, rows, slots, table, sorted_slots, where, order, words, width, packed, pack)


@cuda.jit(cache=True)
def partition_block(dest, state, capacity, size, ntiles, order, words, width, packed, pack, info, summary):
    """The whole partition of a small outbox (``ntiles <= SMALL``) in one block: count,
    scan the row totals, then rank and scatter tile after tile, and write the summary
    ``kernels/partition.py::summarize`` would. One launch where the tiled path takes four
    or more: small rounds are bound by launches, not by memory."""
    histograms = cuda.shared.array(_HISTOGRAMS, numba.int32)
    slots = cuda.shared.array(_SLOTS, numba.int8)
    table = cuda.shared.array(_TABLE, numba.int16)
    sums = cuda.shared.array(THREADS, numba.int32)
    sorted_slots = cuda.shared.array(TILE, numba.int16)
    where = cuda.shared.array(MAX_ROWS, numba.int64)
    running = cuda.shared.array(MAX_ROWS, numba.int64)  # sorted slot of each row's next item
    in_tile = cuda.shared.array(MAX_ROWS, numba.int32)  # the current tile's items, by row
    t = cuda.threadIdx.x
    rows = size + 2
    n = min(state[0], capacity)
    if n == 0:  # an empty outbox (alike for every thread): the summary of nothing, at once
        for row in range(t, rows + 1, THREADS):
            summary[row] = 0
        if t == 0:
            summary[rows + 1] = state[COUNT]
            summary[rows + 2] = state[REFUSED]
            summary[rows + 3] = info[INFO_INVALID_EXAMPLE]
        return
    _count(dest, n, 0, ntiles * TILE, size, histograms, info)
    if t == 0:
        at = 0
        for row in range(rows):
            summary[row] = running[row] = at
            at += _row_total(histograms, row)
        summary[rows] = at
        summary[rows + 1] = state[COUNT]
        summary[rows + 2] = state[REFUSED]
        summary[rows + 3] = info[INFO_INVALID_EXAMPLE]
    cuda.syncthreads()
    for tile in range((n + TILE - 1) // TILE):  # tiles past the last item have nothing to rank
        base = tile * TILE
        m = min(TILE, max(0, n - base))
        _load_and_rank(dest, n, base, size, rows, slots, table, sums)
        for row in range(t, rows, THREADS):
            first = int(table[row * THREADS])
            in_tile[row] = (int(table[(row + 1) * THREADS]) if row + 1 < rows else m) - first
            where[row] = running[row] - first
        cuda.syncthreads()
        _scatter_tile(base, m, rows, slots, table, sorted_slots, where, order, words, width, packed, pack)
        for row in range(t, rows, THREADS):
            running[row] += in_tile[row]
        cuda.syncthreads()
