"""Exclusive prefix sum on the cpu backend: ``out[k] = sum(values[:k])`` for ``k`` in ``[0, n]``."""

import numba

__all__ = ["exclusive_scan"]


@numba.njit(cache=True)
def exclusive_scan(values, n, out):
    """Write the exclusive scan of ``values[:n]`` to ``out[:n + 1]`` (``out[n]`` is the total)."""
    total = 0
    for k in range(n):
        out[k] = total
        total += values[k]
    out[n] = total
