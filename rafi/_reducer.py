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

from ._backends import choose_backend, make_backend
from ._config import env_timeout
from ._errors import ConfigError, collective
from ._liveness import Watch, wait

__all__ = ["Reducer"]

_OPS = {"sum": kern.SUM, "max": kern.MAX, "min": kern.MIN}


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
    """

    def __init__(self, comm, n, dtype, op="sum", *, backend="auto", device=None, timeout=None):
        from mpi4py import MPI

        self._MPI = MPI
        timeout = env_timeout(timeout)
        self._comm, made = comm.Idup()
        wait([made], "Reducer() (making its communicator)", timeout)
        self._watch = Watch(self._comm, timeout)
        self._closed = False
        try:
            self._setup(n, dtype, op, backend, device)
        except BaseException:
            self.close()
            raise

    def _setup(self, n, dtype, op, backend, device):
        MPI = self._MPI
        self.rank, self.size = self._comm.Get_rank(), self._comm.Get_size()
        self.dtype = np.dtype(dtype)
        problem = None
        if op not in _OPS:
            problem = f"op={op!r} is not one of {', '.join(_OPS)}"
        elif self.dtype.kind not in "iuf":
            problem = f"Reducer dtype must be numeric, got {self.dtype}"
        settings = self._comm.allgather((int(n), self.dtype.str, op, problem))
        problems = sorted({s[3] for s in settings if s[3]})
        if problems:
            raise ConfigError("; ".join(problems))
        if any(s != settings[0] for s in settings):
            raise ConfigError(f"all ranks must pass the same n, dtype and op ({[s[:3] for s in settings]})")
        self.n, self.op = int(n), op
        self._mpi_op = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}[op]
        base, extra = divmod(self.n, self.size)
        self.counts = np.array([base + (r < extra) for r in range(self.size)], np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.counts)[:-1]])
        self._backend = make_backend(choose_backend(backend), self._comm, device)
        b = self._backend
        self._identity = _identity(op, self.dtype)
        self._fresh = np.full(self.n, self._identity, self.dtype)
        self._view = kern.Reduction(b.zeros(self.n, self.dtype), b.zeros(2, np.int64), b.zeros(1, np.int64))
        b.to_device(self._fresh, self._view.partial)
        b.to_device(np.array([_OPS[op]], np.int64), self._view.op)
        self._host = b.host_buffer(self.n, self.dtype)
        self._errors = b.host_buffer(2, np.int64)
        self.local = np.full(self.counts[self.rank], self._identity, self.dtype)

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
        self._watch.wait([self._comm.Iallgather(np.array(self._errors), everyone)], "Reducer.flush()")
        bad = everyone.tolist()
        if any(count for count, _ in bad):
            b.to_device(np.zeros(2, np.int64), self._view.errors)
            b.to_device(self._fresh, self._view.partial)
            ranks = [r for r, (count, _) in enumerate(bad) if count]
            raise collective(ConfigError(
                f"{sum(c for c, _ in bad)} contribution(s) to indices outside [0, {self.n}) on "
                f"rank(s) {ranks}, e.g. index {bad[ranks[0]][1]}; none of this flush was combined"
            ))  # fmt: skip
        b.to_host(self._view.partial, self._host)
        block = np.empty(self.counts[self.rank], self.dtype)
        self._comm.Reduce_scatter(self._host, block, list(self.counts), op=self._mpi_op)
        if self.op == "sum":
            self.local += block
        else:
            np.copyto(self.local, (np.maximum if self.op == "max" else np.minimum)(self.local, block))
        b.to_device(self._fresh, self._view.partial)

    def gather(self, root=0):
        """Return the whole array on ``root`` (None elsewhere); collective."""
        self._check_open()
        out = np.empty(self.n, self.dtype) if self.rank == root else None
        self._comm.Gatherv(self.local, [out, (self.counts, self.starts)] if out is not None else None, root)
        return out

    def close(self):
        """Free the communicator (after a ``CollectiveTimeout``: keep it, messages may be pending)."""
        if self._closed:
            return
        self._closed = True
        self._watch.close()
        if self._watch.broken is None:
            self._comm.Free()

    def _check_open(self):
        if self._watch.broken is not None:
            raise ConfigError(f"this Reducer cannot be used after its timeout ({self._watch.broken})")
        if self._closed:
            raise ConfigError("this Reducer is closed")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()  # local: nothing of a reducer's is mapped by peers
