"""Item dtypes: normalisation, agreement across ranks, and the word view used to move records."""

import numpy as np

from ._errors import ConfigError

__all__ = ["item_dtype", "word_dtype", "describe", "misaligned_field"]


def item_dtype(spec):
    """Return ``np.dtype(spec)`` as a rafi item dtype.

    Raises:
        ConfigError: ``spec`` is not a dtype, or holds Python objects.
    """
    try:
        dtype = np.dtype(spec)
    except TypeError as exc:
        raise ConfigError(f"item_dtype {spec!r} is not a numpy dtype: {exc}") from None
    if dtype.hasobject:
        raise ConfigError(f"item_dtype {dtype} holds Python objects; items must be plain bytes")
    if dtype.itemsize == 0:
        raise ConfigError(f"item_dtype {dtype} has no bytes")
    return dtype


def word_dtype(dtype):
    """Return the widest unsigned integer type whose size divides the item size."""
    for word in (np.uint64, np.uint32, np.uint16):
        if dtype.itemsize % np.dtype(word).itemsize == 0:
            return np.dtype(word)
    return np.dtype(np.uint8)


def describe(dtype):
    """Return a string that is equal on two ranks exactly when their dtypes are equal."""
    return repr(np.lib.format.dtype_to_descr(dtype)) + f"/{dtype.itemsize}"


def misaligned_field(dtype, base=0):
    """Return the name of a field a GPU cannot load in place (offset or item size not a
    multiple of its alignment, in any record of an array), or None when all are aligned."""
    if dtype.fields is None:
        return None if base % dtype.base.alignment == 0 else "(item)"
    for name, (sub, offset, *_) in dtype.fields.items():
        where = base + offset
        if where % sub.base.alignment or dtype.itemsize % sub.base.alignment:
            return name
        inner = misaligned_field(sub.base, where)
        if inner is not None:
            return f"{name}.{inner}"
    return None
