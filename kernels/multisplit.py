"""Block-cooperative, stable partition of an outbox by destination on the GPU (and its simulator).

The chunk kernels of ``kernels/partition.py`` give each thread a contiguous chunk to walk
alone: reads are uncoalesced and every item costs a global-memory counter update. Here a
block owns a tile of ``TILE`` consecutive outbox slots (the multisplit of Ashkiani et al.,
with a raking scan instead of warp intrinsics, so the same source runs under the simulator):

1. the block loads the tile's destinations coalesced into shared memory; thread ``t``
   then owns the ``PER_THREAD`` consecutive items ``t * PER_THREAD + j`` of the tile and
   counts them, by row, in its own column of a ``(row, thread)`` table (no atomics);
2. an exclusive scan of that table in row-major order gives each ``(row, thread)`` its
   first slot in the tile sorted by row: rows first, then threads, then items in order,
   so the sort is stable;
3. ``count_tiles`` writes each tile's row totals as ``counts[row * ntiles + tile]``, the
   layout of the chunk kernels' counts, so the global scan and ``summarize`` serve both;
4. ``scatter_tiles`` ranks the tile again, stages the sorted outbox slots in shared
   memory and writes ``order`` (and, when packing, the records) in contiguous runs.

Rows are destinations ``0..size-1``, one for ``ANY`` and one for invalid destinations
(``partition.row_of``); a tile holds at most ``MAX_ROWS`` of them (the table lives in
shared memory). More destinations use the chunk kernels (``tiles`` returns 0).
"""

import numba
from numba import cuda

from rafi._targets import simulator
from rafi.kernels.cuda_scan import MAX_VALUES
from rafi.kernels.partition import INFO_INVALID_EXAMPLE, row_of

__all__ = ["THREADS", "PER_THREAD", "TILE", "MAX_ROWS", "tiles", "count_tiles", "scatter_tiles"]

# the simulator runs one OS thread per CUDA thread: small tiles, so tests cross tile edges
THREADS = 8 if simulator() else 128
PER_THREAD = 2 if simulator() else 16
TILE = THREADS * PER_THREAD
MAX_ROWS = 32
_STRIDE = PER_THREAD + 1  # a thread's items in shared memory, padded against bank conflicts
# shared array sizes: numba-cuda takes a global constant, not an expression of them
_SLOTS = THREADS * _STRIDE
_TABLE = MAX_ROWS * THREADS
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
    """Steps 1 and 2 for this block's tile; return an invalid destination seen, or 0.

    After it, ``slots[t * _STRIDE + j]`` is the row of thread ``t``'s item ``j`` (or
    ``_NONE``) and ``table[row * THREADS + t]`` the tile-sorted slot of thread ``t``'s
    first item in ``row``.
    """
    t = cuda.threadIdx.x
    invalid = 0
    for j in range(PER_THREAD):  # coalesced: consecutive threads read consecutive slots
        i = j * THREADS + t
        k = base + i
        row = _NONE
        if k < n:
            d = dest[k]
            row = row_of(d, size)
            if row == size + 1:
                invalid = d
        slots[(i // PER_THREAD) * _STRIDE + i % PER_THREAD] = row
    for row in range(rows):
        table[row * THREADS + t] = 0
    cuda.syncthreads()
    for j in range(PER_THREAD):
        row = slots[t * _STRIDE + j]
        if row != _NONE:
            table[row * THREADS + t] += 1
    cuda.syncthreads()
    # raking exclusive scan of table[0 : rows * THREADS]: thread t sums its run of `rows`
    total = 0
    for x in range(t * rows, t * rows + rows):
        total += table[x]
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
        count = table[x]
        table[x] = running
        running += count
    cuda.syncthreads()
    return invalid


@cuda.jit(cache=True)
def count_tiles(dest, state, capacity, size, ntiles, counts, info):
    """Write tile ``blockIdx.x``'s row totals to ``counts[row * ntiles + tile]``."""
    slots = cuda.shared.array(_SLOTS, numba.int32)
    table = cuda.shared.array(_TABLE, numba.int32)
    sums = cuda.shared.array(THREADS, numba.int32)
    t, tile = cuda.threadIdx.x, cuda.blockIdx.x
    rows = size + 2
    n = min(state[0], capacity)
    invalid = _load_and_rank(dest, n, tile * TILE, size, rows, slots, table, sums)
    if invalid != 0:
        info[INFO_INVALID_EXAMPLE] = invalid
    for row in range(t, rows, THREADS):
        end = table[(row + 1) * THREADS] if row + 1 < rows else min(TILE, max(0, n - tile * TILE))
        counts[row * ntiles + tile] = end - table[row * THREADS]


@cuda.jit(cache=True)
def scatter_tiles(dest, state, capacity, size, ntiles, offsets, order, words, width, packed, pack):
    """Write tile ``blockIdx.x``'s sorted slots: ``order[slot] = outbox slot``, its records
    to ``packed[slot]`` when ``pack`` is set. ``offsets`` is the scan of ``count_tiles``."""
    slots = cuda.shared.array(_SLOTS, numba.int32)
    table = cuda.shared.array(_TABLE, numba.int32)
    sums = cuda.shared.array(THREADS, numba.int32)
    sorted_slots = cuda.shared.array(TILE, numba.int32)
    where = cuda.shared.array(MAX_ROWS, numba.int64)  # sorted slot of tile-sorted slot 0, by row
    t, tile = cuda.threadIdx.x, cuda.blockIdx.x
    rows = size + 2
    base = tile * TILE
    n = min(state[0], capacity)
    _load_and_rank(dest, n, base, size, rows, slots, table, sums)
    for row in range(t, rows, THREADS):
        where[row] = offsets[row * ntiles + tile] - table[row * THREADS]
    cuda.syncthreads()
    for j in range(PER_THREAD):  # each thread places its own items, in order
        row = slots[t * _STRIDE + j]
        if row != _NONE:
            at = table[row * THREADS + t]
            table[row * THREADS + t] = at + 1
            sorted_slots[at] = t * PER_THREAD + j
    cuda.syncthreads()
    m = min(TILE, max(0, n - base))
    for i in range(t, m, THREADS):  # contiguous runs of sorted slots
        local = sorted_slots[i]
        order[where[slots[(local // PER_THREAD) * _STRIDE + local % PER_THREAD]] + i] = base + local
    if pack:
        for x in range(t, m * width, THREADS):
            i = x // width
            w = x - i * width
            local = sorted_slots[i]
            at = where[slots[(local // PER_THREAD) * _STRIDE + local % PER_THREAD]] + i
            packed[at * width + w] = words[(base + local) * width + w]
