"""Checkpoints of in-flight work: one HDF5 file (h5py) holding every item not yet processed.

Layout: root attributes ``format`` ("rafi-checkpoint"), ``version`` (rafi's), ``size``
(ranks at checkpoint time), ``round``, ``capacity``, ``item_dtype`` (numpy descr),
``options`` (the run's settings as JSON text, "" for none) and ``complete``; one group
``rank_<r>`` per rank with datasets ``inbox`` (received, not yet processed),
``outbox_items`` and ``outbox_dest`` (queued or deferred), and ``state/<name>`` for the
user's arrays. Every dataset carries the CRC-32 of its bytes.

Writing is serial and safe without parallel HDF5: the ranks agree on the path (the same
file on every rank) and rank 0 that it may be replaced (absent, or a regular file: never
a device, a directory or a link); rank 0 creates ``<path>.tmp``, the ranks append their
groups in turn, each turn agreed by every rank, and rank 0 renames the file onto ``path``
only once every rank's part is written, so a crash during a checkpoint leaves the
previous one intact. On any failure (a full file system, a rank that cannot write) every
rank raises ``CheckpointError`` and rank 0 removes the ``.tmp``; a process that ends
meanwhile removes it at its exit (``_departure.register_temporary``).

``save`` and ``restore`` are ``Forwarder.checkpoint`` and ``Forwarder.restore``.
"""

import ast
import json
import os
import stat
import zlib

import numpy as np

from rafi.kernels import outbox as ob

from . import _departure
from ._arrays import asnumpy
from ._errors import CheckpointError, CollectiveTimeout, ConfigError, collective
from ._mpi_support import agree_on_failure, allgather

__all__ = ["load", "read_meta", "read_rank", "restore", "save", "write"]

FORMAT = "rafi-checkpoint"
_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISSOCK, "a socket"),
)


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


def _agreed(comm, fn, what="a checkpoint (agreeing that every rank succeeded)"):
    """Run ``fn()``; if it raised on any rank, raise on every rank. The agreement waits under
    ``comm``'s deadline where it is a forwarder's (``_mpi_support.allgather``)."""
    try:
        value, error = fn(), None
    except CollectiveTimeout:  # the communicator is not used again: nothing to agree on
        raise
    except CheckpointError as exc:  # re-raised everywhere below; its name is the error's own
        value, error = None, str(exc)
    except Exception as exc:
        value, error = None, f"{type(exc).__name__}: {exc}"
    errors = allgather(comm, error, what)
    bad = [(r, e) for r, e in enumerate(errors) if e]
    if bad:
        raise collective(CheckpointError("; ".join(f"rank {r}: {e}" for r, e in bad)))
    return value


def _nothing():
    return None


def agreed_path(comm, path, call):
    """``path`` as an absolute path, the same on every rank of ``comm``; collective.

    Raises:
        CheckpointError: on every rank, when the ranks passed different paths (each would
            write or read another file) or a rank's ``path`` is not a path.
    """
    try:
        mine, refused = os.path.abspath(os.fsdecode(path)), None
    except TypeError:
        mine, refused = None, f"rank {comm.Get_rank()}: {path!r} is not a path"
    said = allgather(comm, (mine, refused), f"{call} (agreeing on the path)")
    refusals = [refused for _, refused in said if refused]
    if refusals:
        raise collective(CheckpointError(f"{call}: " + "; ".join(refusals)))
    if any(p != said[0][0] for p, _ in said):
        each = ", ".join(f"rank {r}: {p}" for r, (p, _) in enumerate(said))
        raise collective(CheckpointError(
            f"{call}: every rank must pass the same checkpoint path (one file holds every rank's "
            f"part): {each}"
        ))  # fmt: skip
    return mine


def _kind(mode):
    return next((kind for test, kind in _KINDS if test(mode)), "not a regular file")


def _check_target(path, tmp):
    """Refuse a ``path`` (or ``tmp``) that exists and is not a regular file; remove a ``tmp``
    an earlier checkpoint left (its writer was killed)."""
    for name in (path, tmp):
        try:
            mode = os.lstat(name).st_mode
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(mode):
            raise CheckpointError(
                f"{name} exists and is {_kind(mode)}, not a regular file; a checkpoint only ever "
                "replaces a regular file: pass the path of a file"
            )
    if os.path.lexists(tmp):
        os.unlink(tmp)


def write(comm, path, meta, inbox, out_items, out_dest, state):
    """Write this rank's in-flight items and ``state`` into the checkpoint at ``path``
    (every rank the same path, agreed); collective. The file appears under ``path`` only
    once every rank's part is written; on any failure no ``<path>.tmp`` is left.

    Raises:
        CheckpointError: on every rank, naming each rank that failed and why.
    """
    import h5py

    rank, size = comm.Get_rank(), comm.Get_size()
    tmp = f"{path}.tmp"
    _agreed(comm, (lambda: _check_target(path, tmp)) if rank == 0 else _nothing)
    _departure.register_temporary(tmp)  # removed if the process ends before the rename

    def create():
        with h5py.File(tmp, "w-") as f:  # w-: never through a file made meanwhile
            for key, value in meta.items():
                f.attrs[key] = value
            f.attrs["complete"] = False

    def mine():
        with h5py.File(tmp, "a") as f:
            g = f.create_group(f"rank_{rank}")
            _put(g, "inbox", _as_bytes(inbox))  # raw: HDF5 compound conversion is slow
            _put(g, "outbox_items", _as_bytes(out_items))
            _put(g, "outbox_dest", out_dest)
            s = g.create_group("state")
            for name, array in (state or {}).items():
                _put(s, name, array)

    def finish():
        with h5py.File(tmp, "a") as f:
            f.attrs["complete"] = True
            f.flush()
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())  # every part on disk before the name says it is complete
        os.replace(tmp, path)

    try:
        _agreed(comm, create if rank == 0 else _nothing)
        for turn in range(size):
            _agreed(comm, mine if turn == rank else _nothing)  # every part written, agreed
        _agreed(comm, finish if rank == 0 else _nothing)
    except BaseException:
        if rank == 0:
            try:
                os.unlink(tmp)
            except OSError:  # never made, or renamed already
                pass
        raise
    finally:
        _departure.forget_temporary(tmp)


def save(fwd, path, state=None, options=None):
    """``fwd.checkpoint(path, state, options)``: write every item in flight, the round and
    ``state`` of the forwarder ``fwd``; collective (see ``Forwarder.checkpoint``)."""
    import rafi

    watch, comm, b = fwd._watch, fwd._comm, fwd._backend
    busy = fwd._engine.busy()
    if watch.allreduce(int(busy is not None), "checkpoint()"):
        raise collective(ConfigError(
            f"cannot checkpoint {busy or 'while a round is under way on another rank'}: items may be in "
            "flight; checkpoint once every rank is between rounds"
        ))  # fmt: skip
    b.to_host(fwd._outbox.state, fwd._state_host)
    pending = int(fwd._state_host[ob.REFUSED]) or fwd._bad_sends.calls
    if watch.allreduce(int(bool(pending)), "checkpoint()"):
        raise collective(ConfigError(
            "cannot checkpoint: refused pushes or a bad send() are pending; forward() first"
        ))  # fmt: skip
    path = agreed_path(comm, path, "checkpoint()")
    queued = min(int(fwd._state_host[ob.COUNT]), fwd.capacity)
    meta = {
        "format": FORMAT,
        "version": rafi.__version__,
        "size": fwd.size,
        "round": fwd._round,
        "capacity": fwd.capacity,
        "item_dtype": repr(np.lib.format.dtype_to_descr(fwd.item_dtype)),
        "options": encode_options(options),
    }

    def parts():  # on the host, on every rank, before the file is made
        items, dest = fwd._outbox.items[:queued], fwd._outbox.dest[:queued]
        arrays = {k: asnumpy(v) for k, v in (state or {}).items()}
        return asnumpy(fwd.inbox), asnumpy(items), asnumpy(dest), arrays

    write(comm, path, meta, *_agreed(comm, parts))


def restore(cls, comm, path, route, options, config):
    """``Forwarder.restore``: rebuild a forwarder of class ``cls`` with the keyword
    arguments ``config`` from the checkpoint at ``path``; collective. Returns ``(fwd, state)``."""
    path = agreed_path(comm, path, "restore()")
    meta = read_meta(comm, path)
    check_size(meta, comm.Get_size(), route)
    if options is not None:
        check_options(meta, options, path)
    dtype = np.lib.format.descr_to_dtype(ast.literal_eval(str(meta["item_dtype"])))
    fwd = cls(comm, dtype, int(meta["capacity"]), **config)
    try:
        return fwd, _fill(fwd, comm, path, meta, dtype, route)
    except BaseException as error:  # the forwarder is the caller's only once restored
        if getattr(error, "collective", False):
            fwd.close()  # every rank raised it at the same point
        else:
            fwd._abandon()
        raise


def _fill(fwd, comm, path, meta, dtype, route):
    """Load the saved items into the new forwarder ``fwd``; return the restored ``state``."""
    fwd._round = int(meta["round"])
    if int(meta["size"]) == fwd.size:
        inbox, items, dest, state = _agreed(comm, lambda: read_rank(path, fwd.rank, dtype))
        agree_on_failure(comm, lambda: load(fwd, inbox, items, dest))
        return state
    olds = range(fwd.rank, int(meta["size"]), fwd.size)
    parts = _agreed(comm, lambda: [read_rank(path, r, dtype) for r in olds])
    items = np.concatenate(
        [np.concatenate([p[0], p[1]]).astype(dtype) for p in parts] or [np.zeros(0, dtype)]
    )

    def routed():
        dest = _routed(route, items, fwd.size) if len(items) else np.zeros(0, np.int32)
        load(fwd, np.zeros(0, dtype), items, dest)

    agree_on_failure(comm, routed)
    names = {name for p in parts for name in p[3]}
    return {name: [p[3][name] for p in parts if name in p[3]] for name in names}


def _routed(route, items, size):
    """``route(items)`` as int32 destinations, checked: whole numbers, one per item, each in
    ``[0, size)`` or ``device.ANY`` (a wider integer would wrap when cast)."""
    dest = np.asarray(route(items))
    whole = dest.dtype.kind in "iu" or (dest.dtype.kind == "f" and bool(np.all(np.mod(dest, 1) == 0)))
    if not whole or dest.shape != (len(items),):
        raise ConfigError(
            f"route() must return an integer array of one destination per item ({len(items)}), "
            f"got shape {dest.shape} and dtype {dest.dtype}"
        )
    outside = dest >= size
    if dest.dtype.kind != "u":
        outside |= (dest < 0) & (dest != ob.ANY)
    if outside.any():
        raise ConfigError(
            f"route() returned {int(outside.sum())} destination(s) outside [0, {size}), "
            f"e.g. {int(dest[outside][0])}"
        )
    return dest.astype(np.int32)


def load(fwd, inbox, items, dest):
    """Put restored items into ``fwd``'s inbox and outbox (they must fit)."""
    b = fwd._backend
    if len(inbox) > fwd.capacity or len(items) > fwd.capacity:
        raise ConfigError(
            f"restored items ({len(inbox)} inbox, {len(items)} outbox) exceed capacity {fwd.capacity}"
        )
    if len(inbox):
        b.to_device(np.ascontiguousarray(inbox, fwd.item_dtype), fwd._inbox_items[: len(inbox)])
    fwd._received = len(inbox)
    if len(items):
        b.to_device(np.ascontiguousarray(items, fwd.item_dtype), fwd._outbox.items[: len(items)])
        b.to_device(np.ascontiguousarray(dest, np.int32), fwd._outbox.dest[: len(items)])
    fwd._state_host[ob.COUNT] = len(items)
    fwd._state_host[ob.REFUSED] = 0
    b.to_device(fwd._state_host, fwd._outbox.state)


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
