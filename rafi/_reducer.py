"""``Reducer``: contributions sent to the owner of an index and combined there.

Each rank owns one contiguous block of ``[0, n)`` (the first ``n % size`` ranks one entry
more). Kernels combine values into a dense per-rank partial array with
``device.contribute``; ``flush()`` combines every rank's partials into the owners'
blocks with one ``Reduce_scatter`` (staged through the host on a GPU) and resets the
partials. Out-of-range indices are counted on the device and raised at ``flush()`` as
``ConfigError`` on every rank, before anything is combined.
"""

import numpy as np

from rafi.kernels import reduce as kern

from . import _departure, _excepthook
from ._backends import choose_backend, make_backend
from ._config import as_count, describe, per_rank, size_text
from ._errors import ConfigError, collective
from ._liveness import KEPT, watched_dup
from ._mpi_support import agree_on_failure
from ._reducer_ipc import ipc_combine

__all__ = ["Reducer"]

_OPS = {"sum": kern.SUM, "max": kern.MAX, "min": kern.MIN}


def _problem(n, count, dtype, op, transport):
    """What is wrong with these settings, or None."""
    if count is None:
        return f"Reducer n (the number of entries) must be a non-negative integer, got {describe(n)}"
    if op not in _OPS:
        return f"op={op!r} is not one of {', '.join(_OPS)}"
    if dtype.kind not in "iuf":
        return f"Reducer dtype must be numeric, got {dtype}"
    if transport not in ("auto", "host", "ipc"):
        return f"transport={transport!r} is not one of auto, host, ipc"
    if count * dtype.itemsize >= 2**62:
        return f"n={count} entries of {dtype} ({size_text(count * dtype.itemsize)}) is beyond any memory"
    return None


def _identity(op, dtype):
    if op == "sum":
        return dtype.type(0)
    info = np.finfo(dtype) if dtype.kind == "f" else np.iinfo(dtype)
    return info.min if op == "max" else info.max


class Reducer:
    """A distributed array of ``n`` entries that kernels combine values into.

    Args:
        comm: an mpi4py communicator; construction is collective.
        n: number of entries, the same on all ranks.
        dtype: numeric dtype of the entries (int32/64, float32/64).
        op: ``"sum"``, ``"max"`` or ``"min"``.
        backend: ``"cuda"``, ``"cpu"`` or ``"auto"``, as for ``Forwarder``.
        device: GPU ordinal, as for ``Forwarder``.
        timeout: seconds ``flush()`` may wait for the other ranks, as for ``Forwarder``.
        transport: how ``flush()`` combines: ``"ipc"`` (on the GPUs, each owner reading
            its peers' partials over CUDA IPC; every rank on one node), ``"host"`` (a
            ``Reduce_scatter`` through host memory) or ``"auto"`` (IPC where it works).
    """

    def __init__(
        self, comm, n, dtype, op="sum", *, backend="auto", device=None, timeout=None, transport="auto"
    ):
        from mpi4py import MPI

        self._MPI = MPI
        self._comm, self._watch, refused = watched_dup(comm, "Reducer", timeout)
        self._closed = False
        self._ipc = None  # the flush's IPC combine, when it has one
        self.transport_reason = None  # why the flush combines through the host, when it does
        try:
            self._setup(n, dtype, op, backend, device, transport, refused)
            self._ipc, self.transport_reason = self._choose_ipc(transport)
        except BaseException as exc:
            if isinstance(exc, ConfigError):  # _setup raises them on every rank, after agreeing
                collective(exc)
            self.close()
            raise

    def _setup(self, n, dtype, op, backend, device, transport, refused):
        MPI = self._MPI
        self.rank, self.size = self._comm.Get_rank(), self._comm.Get_size()
        count, problem = as_count(n), refused
        try:
            self.dtype = np.dtype(dtype)
        except TypeError as exc:  # said on every rank below, not raised on this one alone
            self.dtype, problem = None, problem or f"dtype={dtype!r} is not a numpy dtype ({exc})"
        problem = problem or _problem(n, count, self.dtype, op, transport)
        kind = None if self.dtype is None else self.dtype.str
        given = (count if count is not None else repr(n), kind, op, transport)
        settings = self._watch.allgather((*given, problem), "Reducer() (agreeing on its settings)")
        problems = per_rank([s[4] for s in settings])
        if problems:
            raise ConfigError(problems)
        if any(s != settings[0] for s in settings):
            given = [s[:4] for s in settings]
            raise ConfigError(f"all ranks must pass the same n, dtype, op and transport ({given})")
        self.n, self.op = count, op
        self._mpi_op = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}[op]
        base, extra = divmod(self.n, self.size)
        self.counts = np.array([base + (r < extra) for r in range(self.size)], np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.counts)[:-1]])
        name = agree_on_failure(self._comm, lambda: choose_backend(backend))
        self._backend = agree_on_failure(self._comm, lambda: make_backend(name, self._comm, device))
        self._identity = _identity(op, self.dtype)
        agree_on_failure(self._comm, self._allocate)  # out of memory on one rank: an error on all

    def _allocate(self):
        try:
            self._allocate_here()
        except (MemoryError, ValueError) as exc:  # ValueError: numpy's "array is too big"
            raise ConfigError(
                f"Reducer(n={self.n}) of {self.dtype} cannot be allocated on rank {self.rank} "
                f"(its partial and host copy: {size_text(2 * self.n * self.dtype.itemsize)}): "
                f"{type(exc).__name__}: {exc}; use a smaller n"
            ) from exc

    def _allocate_here(self):
        b, n = self._backend, self.n
        self._view = kern.Reduction(b.zeros(n, self.dtype), b.zeros(2, np.int64), b.zeros(1, np.int64))
        b.fill(self._view.partial, self._identity)
        b.to_device(np.array([_OPS[self.op]], np.int64), self._view.op)
        self._host = b.host_buffer(n, self.dtype)
        self._block = np.empty(self.counts[self.rank], self.dtype)
        self._errors = b.host_buffer(2, np.int64)
        self.local = np.full(self.counts[self.rank], self._identity, self.dtype)

    def _choose_ipc(self, transport):
        """``(the flush's IPC combine, None)``, or ``(None, why the host)``; every rank decides
        alike (``transport`` agreed)."""
        b = self._backend
        if transport == "host":
            return None, "transport='host' was asked for"
        if transport == "auto" and self.size == 1:
            return None, "one rank: its partial is its block"
        able = b.name == "cuda" and not b.simulator and b.cupy is not None
        if not self._watch.allreduce(int(able), "Reducer() (choosing its transport)", op=self._MPI.MIN):
            needs = "the cuda backend on a GPU, with CuPy, on every rank"
            if transport == "auto":
                return None, f"IPC needs {needs}"
            raise ConfigError(f"Reducer(transport='ipc') needs {needs}")
        lo, count = self.lo, int(self.counts[self.rank])
        partial, required = self._view.partial, transport == "ipc"
        return ipc_combine(self._comm, b, partial, lo, count, self.op, self._watch, required)

    @property
    def backend(self):
        """Where contributions are made: ``"cuda"`` or ``"cpu"``, as for ``Forwarder.backend``."""
        return self._backend.name

    @property
    def transport(self):
        """How ``flush()`` combines: ``"ipc"`` (on the GPUs, over CUDA IPC) or ``"host"``;
        ``transport_reason`` says why it is the host (None over IPC)."""
        return "host" if self._ipc is None else "ipc"

    @property
    def lo(self):
        """First index this rank owns."""
        return int(self.starts[self.rank])

    @property
    def view(self):
        """What kernels receive. ``fwd.launch`` passes it for ``red``; plain
        ``@cuda.jit`` kernels take ``red.view``."""
        return self._backend.kernel_view(self._view)

    def flush(self):
        """Combine all contributions since the last flush into the owners' blocks; collective.

        Raises:
            ConfigError: on every rank, if any rank contributed to an index outside ``[0, n)``.
        """
        self._check_open()
        b = self._backend
        b.synchronize()
        b.to_host(self._view.errors, self._errors)
        everyone = np.zeros((self.size, 2), np.int64)
        self._watch.collective("Allgather", np.array(self._errors), everyone, what="Reducer.flush()")
        bad = everyone.tolist()
        if any(count for count, _ in bad):
            b.to_device(np.zeros(2, np.int64), self._view.errors)
            b.fill(self._view.partial, self._identity)
            ranks = [r for r, (count, _) in enumerate(bad) if count]
            raise collective(ConfigError(
                f"{sum(c for c, _ in bad)} contribution(s) to indices outside [0, {self.n}) on "
                f"rank(s) {ranks}, e.g. index {bad[ranks[0]][1]}; none of this flush was combined"
            ))  # fmt: skip
        block = self._ipc.combine() if self._ipc is not None else self._host_combine()
        if self.op == "sum":
            self.local += block
        else:
            np.copyto(self.local, (np.maximum if self.op == "max" else np.minimum)(self.local, block))
        b.fill(self._view.partial, self._identity)

    def _host_combine(self):
        """This rank's block over every rank's partial: a ``Reduce_scatter`` through the host."""
        self._backend.to_host(self._view.partial, self._host)
        if self.size == 1:
            return self._host
        self._comm.Reduce_scatter(self._host, self._block, list(self.counts), op=self._mpi_op)
        return self._block

    def gather(self, root=0):
        """Return the whole array on ``root`` (None elsewhere); collective."""
        self._check_open()
        out = np.empty(self.n, self.dtype) if self.rank == root else None
        self._comm.Gatherv(self.local, [out, (self.counts, self.starts)] if out is not None else None, root)
        return out

    def close(self):
        """Free the communicator; collective when the flush maps peers' partials over IPC.
        After a ``CollectiveTimeout`` it is local and keeps everything."""
        if self._closed:
            return
        if self._watch.broken is not None:
            self._abandon()
            return
        self._closed = True
        if self._ipc is not None:
            try:
                self._ipc.close()
            except BaseException:  # a peer may still map this rank's partial: keep it
                self._abandon()
                raise
        self._watch.close()
        self._comm.Free()

    def _abandon(self):
        """Close without waiting for any other rank: after an error not every rank saw, or a
        timeout. Nothing is freed (peers may still map this rank's partial, or send to its
        communicator); the job is going down."""
        self._closed = True
        self._watch.close()
        KEPT.append(self.__dict__.copy())

    def _check_open(self):
        if self._watch.broken is not None:
            raise ConfigError(f"this Reducer cannot be used after its timeout ({self._watch.broken})")
        if self._closed:
            raise ConfigError("this Reducer is closed")

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        if error is None or getattr(error, "collective", False):
            _excepthook.gather(self, error)  # one message per job, if it ends the job
            self.close()  # every rank is here
            return
        _departure.leaving(self, error)  # sys.exit(): checked at exit, on this communicator
        if self._ipc is None and not isinstance(error, SystemExit):
            self.close()  # nothing of this rank's is mapped by peers
        else:
            self._abandon()
