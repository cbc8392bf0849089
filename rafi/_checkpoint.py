"""Checkpoints of in-flight work: one HDF5 file (h5py) holding every item not yet processed.

Layout: root attributes ``format`` ("rafi-checkpoint"), ``version`` (rafi's), ``size``
(ranks at checkpoint time), ``round``, ``capacity``, ``item_dtype`` (numpy descr),
``options`` (the run's settings as JSON text, "" for none) and ``complete``; one group
``rank_<r>`` per rank with datasets ``inbox`` (received, not yet processed),
``outbox_items`` and ``outbox_dest`` (queued or deferred), and ``state/<name>`` for the
user's arrays. Every dataset carries the CRC-32 of its bytes.

Writing is serial and safe without parallel HDF5: rank 0 creates ``<path>.tmp``, the
ranks append their groups in turn, and rank 0 renames the file onto ``path`` only when
it is complete, so a crash during a checkpoint leaves the previous one intact.
"""

import json
import os
import zlib

import numpy as np

from . import _departure
from ._errors import CheckpointError, ConfigError, collective

__all__ = ["write", "read_meta", "read_rank"]

FORMAT = "rafi-checkpoint"


def _crc(array):
    flat = np.ascontiguousarray(array).reshape(-1)
    return zlib.crc32(flat.view(np.uint8) if flat.size else b"") & 0xFFFFFFFF


def _put(group, name, array):
    """Store ``array`` with the CRC-32 of its bytes."""
    array = np.ascontiguousarray(array)
    ds = group.create_dataset(name, data=array)
    ds.attrs["crc32"] = _crc(array)


def _as_bytes(items):
    items = np.ascontiguousarray(items)
    return items.view(np.uint8).reshape(len(items), items.dtype.itemsize)


def _agreed(comm, fn):
    """Run ``fn()``; if it raised on any rank, raise on every rank."""
    try:
        value, error = fn(), None
    except Exception as exc:  # re-raised everywhere below
        value, error = None, f"{type(exc).__name__}: {exc}"
    errors = comm.allgather(error)
    bad = [(r, e) for r, e in enumerate(errors) if e]
    if bad:
        raise collective(CheckpointError("; ".join(f"rank {r}: {e}" for r, e in bad)))
    return value


def write(comm, path, meta, inbox, out_items, out_dest, state):
    """Write this rank's in-flight items and ``state`` into the checkpoint at ``path``; collective."""
    import h5py

    rank, size = comm.Get_rank(), comm.Get_size()
    tmp = f"{path}.tmp"
    _departure.register_temporary(tmp)  # removed if the process ends before the rename

    def create():
        with h5py.File(tmp, "w") as f:
            for key, value in meta.items():
                f.attrs[key] = value
            f.attrs["complete"] = False

    _agreed(comm, create if rank == 0 else (lambda: None))
    for turn in range(size):
        if turn == rank:

            def mine():
                with h5py.File(tmp, "a") as f:
                    g = f.create_group(f"rank_{rank}")
                    _put(g, "inbox", _as_bytes(inbox))  # raw: HDF5 compound conversion is slow
                    _put(g, "outbox_items", _as_bytes(out_items))
                    _put(g, "outbox_dest", out_dest)
                    s = g.create_group("state")
                    for name, array in (state or {}).items():
                        _put(s, name, array)

            _agreed(comm, mine)
        else:
            _agreed(comm, lambda: None)

    def finish():
        with h5py.File(tmp, "a") as f:
            f.attrs["complete"] = True
            f.flush()
        os.replace(tmp, path)

    _agreed(comm, finish if rank == 0 else (lambda: None))
    _departure.forget_temporary(tmp)


def _open(path):
    import h5py

    try:
        f = h5py.File(path, "r")
    except (OSError, ValueError) as exc:
        raise CheckpointError(
            f"{path} cannot be read as HDF5 ({exc}); truncated or not a checkpoint"
        ) from None
    if f.attrs.get("format") != FORMAT:
        f.close()
        raise CheckpointError(f"{path} is an HDF5 file but not a rafi checkpoint (no format={FORMAT!r})")
    if not f.attrs.get("complete", False):
        f.close()
        raise CheckpointError(f"{path} is an unfinished checkpoint (its writer stopped mid-way)")
    return f


def read_meta(comm, path):
    """Return the checkpoint's root attributes, checked on rank 0, on every rank."""

    def meta():
        if comm.Get_rank() != 0:
            return None
        with _open(path) as f:
            values = {k: f.attrs[k] for k in f.attrs}
            missing = [f"rank_{r}" for r in range(int(values["size"])) if f"rank_{r}" not in f]
        if missing:
            raise CheckpointError(f"{path} lacks the groups {missing}")
        return values

    return comm.bcast(_agreed(comm, meta), root=0)


def _get(group, name, path):
    ds = group[name]
    array = ds[()]
    if "crc32" not in ds.attrs or _crc(array) != int(ds.attrs["crc32"]):
        raise CheckpointError(f"{path}: dataset {ds.name} fails its checksum (corrupted)")
    return array


def read_rank(path, old_rank, dtype):
    """Return ``(inbox, outbox_items, outbox_dest, state)`` saved by ``old_rank``, checked."""

    def records(raw):
        if raw.dtype != np.uint8 or raw.ndim != 2 or raw.shape[1] != dtype.itemsize:
            raise CheckpointError(f"{path}: items of rank {old_rank} are not {dtype.itemsize}-byte records")
        return np.ascontiguousarray(raw).view(dtype).reshape(-1)

    with _open(path) as f:
        try:
            g = f[f"rank_{old_rank}"]
            state = {name: _get(g["state"], name, path) for name in g["state"]}
            inbox, items = records(_get(g, "inbox", path)), records(_get(g, "outbox_items", path))
            return inbox, items, _get(g, "outbox_dest", path), state
        except KeyError as exc:
            raise CheckpointError(f"{path}: missing {exc}") from None
        except OSError as exc:
            raise CheckpointError(f"{path}: cannot read rank {old_rank}'s data ({exc})") from None


def encode_options(options):
    """The run's options as the JSON text a checkpoint records ("" for none)."""
    return json.dumps(options, sort_keys=True) if options else ""


def check_options(meta, options, path):
    """Raise ``ConfigError`` (on every rank: all read the same ``meta``) naming each option
    whose value differs from the one the checkpoint recorded."""
    recorded = json.loads(str(meta.get("options", "")) or "{}")
    given = json.loads(json.dumps(options))  # as the record would hold them (tuples -> lists)

    def shown(values, name):
        return repr(values[name]) if name in values else "not set"

    differ = [
        f"{name}: {shown(recorded, name)} in the checkpoint, {shown(given, name)} now"
        for name in sorted(set(recorded) | set(given))
        if name not in recorded or name not in given or recorded[name] != given[name]
    ]
    if differ:
        raise collective(ConfigError(
            f"cannot resume from {path} with other options than it was written with: " + "; ".join(differ)
        ))  # fmt: skip


def check_size(meta, size, route):
    """Raise ConfigError if the rank count changed and no routing function says where items go."""
    if int(meta["size"]) != size and route is None:
        raise ConfigError(
            f"the checkpoint was written by {int(meta['size'])} ranks, this run has {size}; "
            "pass route=fn (items -> new destination ranks) to redistribute the items"
        )
