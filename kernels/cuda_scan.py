"""Exclusive prefix sum on the GPU in three launches (tile scans, scan of tile sums, add back),
or one when the values fit one tile.

Handles up to ``TILE * TILE`` values; ``out[n]`` receives the total. The simulator gets a
small tile because it runs one OS thread per CUDA thread.
"""

import numba
from numba import cuda

from rafi._targets import simulator

__all__ = ["TILE", "MAX_VALUES", "exclusive_scan"]

TILE = 16 if simulator() else 1024
MAX_VALUES = TILE * TILE


@cuda.jit(cache=True)
def _tile_scan(values, n, out, tile_sums):
    tile = cuda.shared.array(TILE, numba.int64)
    t = cuda.threadIdx.x
    i = cuda.blockIdx.x * TILE + t
    v = values[i] if i < n else 0
    tile[t] = v
    cuda.syncthreads()
    step = 1
    while step < TILE:
        x = tile[t - step] if t >= step else 0
        cuda.syncthreads()
        tile[t] += x
        cuda.syncthreads()
        step *= 2
    if i < n:
        out[i] = tile[t] - v
    if t == TILE - 1:
        tile_sums[cuda.blockIdx.x] = tile[t]


@cuda.jit(cache=True)
def _add_tile_offsets(out, n, tile_offsets, tile_totals):
    i = cuda.grid(1)
    if i < n:
        out[i] += tile_offsets[i // TILE]
    if i == 0:
        out[n] = tile_totals[0]


def exclusive_scan(values, n, out, scratch, stream=0):
    """Scan ``values[:n]`` into ``out[:n + 1]``; ``scratch`` holds at least ``2 * TILE + 1`` int64."""
    tiles = max(1, (n + TILE - 1) // TILE)
    if tiles > TILE:
        raise ValueError(f"cannot scan {n} values (at most {MAX_VALUES})")
    if tiles == 1:  # one launch: the tile's sum is the total, out[n]
        _tile_scan[1, TILE, stream](values, n, out, out[n:])
        return
    sums = scratch[:TILE]
    sum_offsets = scratch[TILE : 2 * TILE]
    total = scratch[2 * TILE :]
    _tile_scan[tiles, TILE, stream](values, n, out, sums)
    _tile_scan[1, TILE, stream](sums, tiles, sum_offsets, total)
    _add_tile_offsets[tiles, TILE, stream](out, n, sum_offsets, total)
