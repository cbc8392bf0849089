"""``Forwarder``: the public face of rafi; it moves work items pushed by kernels between MPI ranks.

The face agrees on the settings (every rank must pass the same), owns the outbox kernels
push into and the inbox they read, takes host-side ``send()`` calls, and hands the moving
of items to the engine of its mode (``_engines``: ``bsp``, ``async``, ``resident``).
Checkpoints are written and read by ``_checkpoint``.
"""

import threading

import numpy as np

from rafi.kernels import outbox as ob

from . import _checkpoint, _control, _departure, _excepthook
from ._arrays import is_device_array
from ._backends import choose_backend, make_backend
from ._config import as_count, env_choice, per_rank, size_text
from ._dtype import describe, item_dtype, misaligned_field, word_dtype
from ._engines import MODES, make_engine
from ._engines._base import step_inbox
from ._errors import ConfigError, collective
from ._kernel import Kernel
from ._liveness import KEPT, watched_dup
from ._mpi_support import agree_on_failure
from ._progress import choose_progress
from ._reducer import Reducer
from ._stats import Stats

__all__ = ["Forwarder", "MODES"]

_DONE = object()  # the end of an engine's batches
_INBOX_VIEWS = 64  # inbox views kept by count (_inbox_view), then it starts afresh

_AGREEING = "Forwarder() (agreeing on its settings)"  # where a rank waits, as a timeout says it


def _agree(watch, value, what):
    """Raise ConfigError on every rank unless all ranks passed the same ``value``; the
    agreement waits under the forwarder's deadline."""
    values = watch.allgather(value, _AGREEING)
    if any(v != values[0] for v in values):
        detail = ", ".join(f"rank {r}: {v}" for r, v in enumerate(values))
        raise ConfigError(f"all ranks must pass the same {what} ({detail})")


def _agree_choice(watch, name, requested, variable):
    """Agree on a setting that ``RAFI_<variable>`` overrides when it is ``"auto"``: every rank
    must end with the same choice, whether from the argument or the environment (ranks that
    differ would make different collectives, and wait in them forever). Returns ``requested``.

    Raises:
        ConfigError: on every rank, naming each rank's argument and variable, when the
            choices differ or a rank's environment is refused (``check_environment``).
    """
    try:
        chosen, refused = env_choice(variable, requested), None
    except ConfigError as exc:
        chosen, refused = None, str(exc)
    said = watch.allgather((requested, chosen, refused), _AGREEING)
    refusals = per_rank([refused for _, _, refused in said])
    if refusals:
        raise ConfigError(refusals)
    if any(chosen != said[0][1] for _, chosen, _ in said):

        def told(requested, chosen):
            via = f" with RAFI_{variable}={chosen!r}" if requested != chosen else ""
            return f"{name}={requested!r}{via}"

        detail = ", ".join(f"rank {r}: {told(q, c)}" for r, (q, c, _) in enumerate(said))
        raise ConfigError(
            f"all ranks must pass the same {name} (and RAFI_{variable}, which overrides "
            f"{name}='auto'): {detail}"
        )
    return requested


def _positive_integer(value):
    return not isinstance(value, bool) and isinstance(value, (int, np.integer)) and value >= 1


class _OneThread:
    """The forwarder's guard against use from two threads at once: ``forward()``, ``run()``,
    ``batches()``, ``send()``, ``launch()`` and ``checkpoint()`` take it without waiting, and
    a thread that finds another inside gets a ``ConfigError``. The thread inside may call
    in again (``run()`` calls ``forward()`` and ``launch()``)."""

    def __init__(self, owner):
        self._lock = threading.RLock()
        self._inside = []  # the calls the owning thread is in, outermost first
        self._owner = owner
        self.last = None  # the outermost call that ended last ("forward()", "run()", ...)

    def enter(self, call):
        if not self._lock.acquire(blocking=False):
            inside = (self._inside[:1] or ["a call"])[0]  # a slice: the owner may leave meanwhile
            raise ConfigError(
                f"{call} was called while another thread is inside {inside} of this Forwarder; "
                "use a Forwarder from one thread at a time (its calls are not thread-safe: "
                "serialize them with a lock, or give each thread its own Forwarder)"
            )
        self._inside.append(call)

    def leave(self, error=None):
        """Leave the innermost call; ``error``: the exception leaving it, which is told where
        it was raised (``_departure.where``), if no inner call told it already."""
        outermost = self._inside[0]  # the call the user made (run() calls forward())
        self._inside.pop()
        if error is not None and getattr(error, "_rafi_where", None) is None:
            try:
                error._rafi_where = _departure.where(self._owner, outermost)
            except AttributeError:  # an exception type that takes no attributes
                pass
        if not self._inside:
            self.last = outermost
        self._lock.release()

    def current(self):
        """The outermost call the owning thread is in, or None."""
        return (self._inside[:1] or [None])[0]

    def __call__(self, call):
        """``with guard("launch()"):`` (a plain object, not a generator: a launch costs a
        few microseconds, and ``contextlib.contextmanager`` alone adds one)."""
        return _Inside(self, call)


class _Inside:
    """One call inside a ``_OneThread`` guard, as a context manager."""

    __slots__ = ("guard", "call")

    def __init__(self, guard, call):
        self.guard, self.call = guard, call

    def __enter__(self):
        self.guard.enter(self.call)

    def __exit__(self, kind, error, traceback):
        self.guard.leave(error)


def _length(items):
    """How many items a (possibly malformed) ``send()`` argument holds, for its error."""
    try:
        return len(items)
    except TypeError:
        return 1


class Forwarder:
    """Move work items pushed by kernels to the rank each was pushed for.

    Args:
        comm: an mpi4py communicator; construction is collective over it.
        item_dtype: the record type of an item (anything ``np.dtype()`` takes), the same on all ranks.
        capacity: the most items one rank holds in its inbox, and separately in its outbox.
        backend: ``"cuda"``, ``"cpu"`` or ``"auto"`` (``RAFI_BACKEND`` overrides auto).
        transport: ``"host"``, ``"cuda-aware"``, ``"ipc"``, ``"shm"``, ``"nccl"`` or ``"auto"``
            (``RAFI_TRANSPORT`` overrides auto); auto takes CUDA IPC to peers on this node where
            the GPUs allow it, and on the cpu backend in rounds MPI shared memory (``shm``).
        device: GPU ordinal; default is the node-local rank modulo the visible GPUs.
        mode: ``"bsp"`` (rounds of ``forward()``) or ``"async"`` (``batches()``, no rounds).
        timeout: seconds any collective call of this forwarder may wait for the other ranks
            before it raises ``CollectiveTimeout`` naming those that did not arrive; None
            (default) takes ``RAFI_TIMEOUT`` when set, else waits as long as it takes.
        progress: ``mode="async"`` only: ``"poll"`` (``batches()`` completes messages
            itself), ``"thread"`` (a progress thread completes them while kernels run;
            needs ``MPI_THREAD_MULTIPLE``) or ``"auto"`` (``RAFI_PROGRESS`` overrides auto).
        exchange: how a round's counts travel: ``"dense"`` (one ``Alltoall``), ``"sparse"``
            (messages only to the ranks a rank holds items for, and an O(log P) reduction;
            ``_sparse``) or ``"auto"`` (``RAFI_EXCHANGE`` overrides it): sparse while few
            pairs of ranks talk, except on one node of fewer than 128 ranks (dense).

    Raises:
        ConfigError: on every rank, if the ranks disagree or a setting is impossible here.
        CollectiveTimeout: a rank did not arrive within ``timeout`` (every wait of
            construction is under the deadline).

    Threads: use a forwarder from one thread at a time. ``forward()``, ``run()``,
    ``batches()``, ``send()``, ``launch()`` and ``checkpoint()`` called while another thread
    is inside one of them raise ``ConfigError`` ("one thread at a time") instead of
    corrupting the counts; serialize such calls with a lock, or give each thread its own
    forwarder (with its own communicator).
    """

    def __init__(
        self,
        comm,
        item_dtype,
        capacity,
        *,
        backend="auto",
        transport="auto",
        device=None,
        mode="bsp",
        progress="auto",
        timeout=None,
        exchange="auto",
    ):
        self._comm, self._watch, refused = watched_dup(comm, "Forwarder", timeout)
        self.rank = self._comm.Get_rank()
        self.size = self._comm.Get_size()
        self._closed = False
        self._broken = None  # why this forwarder takes no more rounds (``_break``), or None
        self._guard = _OneThread(self)
        try:
            self._setup(item_dtype, capacity, backend, transport, device, mode, progress, exchange, refused)
        except BaseException as exc:
            if isinstance(exc, ConfigError):  # _setup raises them on every rank, after agreeing
                collective(exc)
            self._watch.close()
            if self._watch.broken is None:
                self._comm.Free()
            else:  # a timed-out collective is still posted on it: freeing it may crash MPI later
                KEPT.append(self._comm)
            self._closed = True
            raise

    def _setup(self, spec, capacity, backend, transport, device, mode, progress, exchange, refused):
        """Agree on every setting, then make the backend and the engine; collective. Every
        wait is under the deadline (the agreements, ``agree_on_failure``, and the
        transports' and backends' collectives, which find this forwarder's ``Watch``).
        ``refused``: why this rank's timeout or environment was refused, or None."""
        comm, watch = self._comm, self._watch
        refusals = per_rank(watch.allgather(refused, _AGREEING))
        if refusals:
            raise ConfigError(refusals)
        # Settings the environment overrides, before any collective that depends on them
        # (auto's Split_type, the transport's shared window): ranks that differ would not
        # all make the same collective calls, and would wait in them forever.
        _agree_choice(watch, "exchange", exchange, "EXCHANGE")
        _agree_choice(watch, "transport", transport, "TRANSPORT")
        _agree(watch, mode, "mode")
        if mode not in MODES:
            raise ConfigError(f"mode={mode!r} is not one of {', '.join(MODES)}")
        _agree(watch, progress, "progress")
        _agree_choice(watch, "progress", progress, "PROGRESS")
        progress = agree_on_failure(comm, lambda: choose_progress(progress, mode))
        dtype = agree_on_failure(comm, lambda: item_dtype(spec))
        _agree(watch, describe(dtype), "item_dtype")
        if not _positive_integer(capacity):
            bad = f"capacity must be a positive integer, got {capacity!r}"
        else:
            bad = None
        _agree(watch, bad, "valid capacity")
        if bad:
            raise ConfigError(bad)
        capacity = int(capacity)
        _agree(watch, capacity, "capacity")
        self.item_dtype = dtype
        self.capacity = capacity
        name = agree_on_failure(comm, lambda: choose_backend(backend))
        _agree(watch, name, "backend (after 'auto')")
        field = misaligned_field(dtype)
        if name == "cuda" and field is not None:
            raise ConfigError(
                f"item_dtype {dtype} puts field {field!r} at a misaligned offset for the GPU "
                "(records are packed back to back); build it with np.dtype(..., align=True)"
            )
        self._backend = agree_on_failure(comm, lambda: make_backend(name, comm, device))
        b = self._backend
        self._word = word_dtype(dtype)
        self._width = dtype.itemsize // self._word.itemsize
        self._state_host = b.host_buffer(ob.STATE_LEN, np.int64)
        self._received = 0
        self._round = 0

        def share(value):  # resident rounds carry a send()'s invalid destinations as a flag
            return watch.allgather(value, "forward() (agreeing on the error)")

        self._bad_sends = _control.BadSends(share if mode == "resident" else None)
        self._engine = make_engine(self, mode, transport, progress, exchange)
        self.stats = Stats(self.size, dtype.itemsize, self.rank, self._engine.unit)

    def _allocate(self, outbox_zeros, inbox_zeros):
        """Make the outbox and the inbox, each array by ``zeros(count, dtype)`` of the engine's
        choice (node-shared memory where peers read or write them); collective: memory
        refused on one rank is a ``ConfigError`` on every rank, naming the size."""

        def allocate():
            try:
                self._allocate_here(outbox_zeros, inbox_zeros)
            except (MemoryError, ValueError) as exc:  # ValueError: numpy's "array is too big"
                nbytes = 2 * self.capacity * (self.item_dtype.itemsize + 4)
                raise ConfigError(
                    f"rank {self.rank} cannot allocate the outbox and inbox of capacity "
                    f"{self.capacity} x {self.item_dtype.itemsize}-byte items (about "
                    f"{size_text(nbytes)}): {type(exc).__name__}: {exc}; pass a smaller capacity"
                ) from exc

        agree_on_failure(self._comm, allocate, "Forwarder() (allocating the outbox and inbox)")

    def _allocate_here(self, outbox_zeros, inbox_zeros):
        b, capacity = self._backend, self.capacity
        items = outbox_zeros(capacity, self.item_dtype)
        self._outbox = ob.Outbox(items, b.zeros(capacity, np.int32), b.zeros(ob.STATE_LEN, np.int64))
        self._outbox_words = items.view(self._word)
        self._kernel_outbox = b.kernel_view(self._outbox)
        self._inbox_items = inbox_zeros(capacity, self.item_dtype)
        self._inbox_views = {}  # count -> view, of _inbox_view
        self._inbox_words = self._inbox_items.view(self._word)

    # ------------------------------------------------------------------ public face

    @property
    def backend(self):
        return self._backend.name

    @property
    def timeout(self):
        """Seconds a collective call waits for the other ranks (None: no deadline)."""
        return self._watch.timeout

    @property
    def mode(self):
        """``"bsp"``, ``"async"`` or ``"resident"``."""
        return self._engine.mode

    @property
    def transport(self):
        """How payloads travel: ``host``, ``cuda-aware``, ``ipc``, ``shm``, or ``ipc+host`` /
        ``ipc+cuda-aware`` (IPC to peers on this node, the second to the others); in
        ``mode="resident"``, ``ipc`` or ``shm`` (what the persistent kernels write through)."""
        return self._engine.transport

    @property
    def async_stats(self):
        """``mode="async"``: batches, items received in them, messages sent, seconds spent
        waiting inside ``batches()`` (this rank idle while others work), and ``progress``
        (``"poll"`` or ``"thread"``)."""
        return dict(self._engine.stats) if self._engine.mode == "async" else None

    @property
    def outbox(self):
        """The outbox kernels push into: pass it as a kernel argument."""
        self._check_open()
        return self._kernel_outbox

    @property
    def inbox(self):
        """The items received by the last ``forward()`` (device array on cuda, numpy on cpu)."""
        self._check_open()
        return self._inbox_view(self._received)

    def _inbox_view(self, n):
        """The first ``n`` inbox items: the same view for the same ``n`` (a round's loop reads
        ``fwd.inbox`` more than once, and counts often repeat), on a GPU (``n > 0``) one that
        shares the inbox's memory object, which the launch cache takes as the view it saw last with a
        new length."""
        views = self._inbox_views
        view = views.get(n)
        if view is None:
            if len(views) >= _INBOX_VIEWS:
                views.clear()
            view = views[n] = self._backend.prefix(self._inbox_items, n)
        return view

    def launch(self, kernel, n, *args):
        """Run the ``@rafi.kernel`` ``kernel`` for ``i in range(n)`` on this forwarder's backend.

        A ``rafi.Reducer`` among ``args`` is passed as its kernel view.

        Raises:
            ConfigError: ``kernel`` is not a ``@rafi.kernel``, ``n`` is not a non-negative
                integer, or the body cannot be compiled for ``args`` (the numba error chained).
        """
        guard = self._guard  # entered and left as forward() does: a launch is a round's other half
        guard.enter("launch()")
        error = None
        try:
            self._check_open()
            if not isinstance(kernel, Kernel):
                raise ConfigError(
                    f"launch() takes a @rafi.kernel body, not {kernel!r}; decorate the function "
                    "with @rafi.kernel (a per-item body def body(i, ...))"
                )
            count = n if type(n) is int and n >= 0 else as_count(n)
            if count is None:
                raise ConfigError(
                    f"launch({kernel.__name__}, n={n!r}): n must be a non-negative integer (the "
                    "items to run the body for)"
                )
            for arg in args:
                if isinstance(arg, Reducer):
                    args = [arg.view if isinstance(arg, Reducer) else arg for arg in args]
                    break
            self._backend.launch(kernel, count, *args)
        except BaseException as exc:
            error = exc
            raise
        finally:
            guard.leave(error)

    def to_backend(self, array):
        """Return ``array`` where this forwarder's kernels can read and write it: a device
        copy on the cuda backend, the (contiguous) numpy array itself on the cpu backend."""
        self._check_open()
        return self._backend.as_device(array)

    def send(self, items, dest):
        """Queue many items from the host at once, like a kernel pushing each.

        Args:
            items: 1-d array (numpy or device) of ``item_dtype``.
            dest: one destination rank for all (any integer), or an integer array as long
                as ``items`` (a device array must be int32).

        Bad arguments are reported by the next ``forward()`` (or ``batches()``) on every
        rank, with nothing of the bad call queued: a wrong dtype or shape as ``ConfigError``
        (every bad call with its item count), destinations outside ``[0, size)`` (of any
        integer type and size; ``device.ANY`` is valid) as ``InvalidDestination``, like a
        kernel's pushes. Items beyond the outbox's room are refused and reported as
        ``OutboxOverflow``. When several of these happened, the error names them all.
        """
        with self._guard("send()"):
            self._check_open(rounds=True)
            problem = self._check_send(items, dest)
            if problem:
                self._bad_sends.add(*problem)
                return
            self._queue(items, dest)

    def _queue(self, items, dest):
        b = self._backend
        n = len(items)
        dests = np.broadcast_to(np.asarray(dest, dtype=np.int32), (n,)) if np.ndim(dest) == 0 else dest
        b.to_host(self._outbox.state, self._state_host)
        used = min(int(self._state_host[ob.COUNT]), self.capacity)
        fits = min(n, self.capacity - used)
        if fits:
            self._place(items, self._outbox.items, used, fits)
            self._place(dests, self._outbox.dest, used, fits, np.int32)
        self._state_host[ob.COUNT] = used + fits
        self._state_host[ob.REFUSED] += n - fits
        b.to_device(self._state_host, self._outbox.state)

    def forward(self):
        """Deliver every queued item its destination can take this round; collective.

        Returns:
            ForwardResult(received, alive, deferred, round).

        Raises:
            ConfigError, InvalidDestination, OutboxOverflow: on every rank together; the
                items that could be queued stay queued.
            CollectiveTimeout: another rank did not arrive within ``timeout`` seconds.
        """
        guard = self._guard
        guard.enter("forward()")
        error = None
        try:
            self._check_open(rounds=True)
            return self._engine.forward()
        except BaseException as exc:
            error = exc
            raise
        finally:
            guard.leave(error)

    def run(self, step, *args, rounds=None, rounds_per_launch=None):
        """Forward, then run ``step`` over what arrived, round after round, until no item is
        alive anywhere (or ``rounds`` rounds ran); collective.

        ``step`` is a ``@rafi.kernel`` body ``step(i, inbox, outbox, *args)``, run for every
        item ``i`` that arrived in a round; what it pushes moves in the next round. Seeds
        pushed before the call (by a kernel or ``send()``) move in the first round; items a
        ``forward()`` (or a restore) left in the inbox are stepped over first. In
        ``mode="bsp"`` this is the loop users write by hand::

            while (result := fwd.forward()).alive:
                fwd.launch(step, len(fwd.inbox), fwd.inbox, fwd.outbox, *args)

        so a program switches modes by one word: in ``mode="resident"`` each rank runs
        ``rounds_per_launch`` rounds in one persistent kernel (chosen by a model of launch
        and round costs when None), with no host code between them; in ``mode="async"``
        ``step`` runs over every batch (there are no rounds to count).

        Returns:
            The last round's ``ForwardResult``: ``alive`` is 0 unless ``rounds`` ended the
            run first; ``round`` numbers it among all the forwarder's rounds. The items
            ``step`` processed are consumed: ``fwd.inbox`` is empty after ``run``.

        Raises:
            ConfigError: ``step`` is not a ``@rafi.kernel``, ``rounds`` or
                ``rounds_per_launch`` is not a positive integer (or given in async mode).
            InvalidDestination, OutboxOverflow, CollectiveTimeout: as ``forward()``.
        """
        with self._guard("run()"):
            self._check_open(rounds=True)
            if not isinstance(step, Kernel):
                raise ConfigError(
                    f"run() takes a @rafi.kernel body as step, not {step!r}; decorate it with @rafi.kernel"
                )
            for name, value in (("rounds", rounds), ("rounds_per_launch", rounds_per_launch)):
                if value is not None and not (_positive_integer(value) and value < 2**63):
                    raise ConfigError(f"run({name}={value!r}): a positive integer below 2**63, or None")
            args = tuple(arg.view if isinstance(arg, Reducer) else arg for arg in args)
            if self._received:  # left by a forward() or a restore: stepped first, not overwritten
                step_inbox(self, step, args, self.inbox, f"run() (the inbox of round {self._round - 1})")
            return self._engine.run(step, args, rounds, rounds_per_launch)

    def batches(self):
        """Yield the inbox as items arrive, until no item is left anywhere (``mode="async"``).

        Each batch is ``fwd.inbox``: at most ``capacity`` items, this rank's own and those
        that arrived from peers; process it (and push more) before asking for the next.
        Items move while ranks compute, without rounds; the iteration ends on every rank at
        the same point, once every rank is idle and no message is in flight. Collective in
        effect: every rank iterates until the end.

        Raises:
            ConfigError: in ``mode="bsp"``, or a bad ``send()`` (on every rank).
            InvalidDestination, OutboxOverflow: on every rank, as ``forward()`` does (a rank
                whose inbox took items in the turn that found the error yields them first).
            CollectiveTimeout: a rank stopped taking part for longer than ``timeout``.
        """
        with self._guard("batches()"):
            self._check_open(rounds=True)
            inner = self._engine.batches()
        return self._guarded(inner)

    def _guarded(self, inner):
        """``inner``'s batches, each step of it taken inside the thread guard (the caller's
        own calls between batches, such as ``launch()``, come from the same thread)."""
        try:
            while True:
                with self._guard("batches()"):
                    try:
                        batch = next(inner, _DONE)
                    except BaseException as exc:
                        self._interrupted(exc, "batches()", "with items on their way between ranks")
                        raise
                if batch is _DONE:
                    return
                yield batch
        finally:
            inner.close()  # a loop left early ends the engine's too (as its own generator did)

    def checkpoint(self, path, state=None, options=None):
        """Save every item in flight, the round and ``state`` to the HDF5 file ``path``; collective.

        ``options`` (a dict of JSON values, the same on every rank: the run's settings, such
        as an image's size) is recorded; ``restore(..., options=...)`` refuses to resume a
        run whose options differ, naming each that does.

        Call it between rounds (after ``forward()``, before processing the inbox): the
        inbox, the queued and deferred outbox items, and ``state`` (a dict of numpy or
        device arrays, this rank's own) are written; the file appears under ``path``
        only once every rank's part is written (``<path>.tmp`` until then, removed if any
        rank fails). Returns nothing.

        Raises:
            CheckpointError: on every rank, if writing failed anywhere, the ranks passed
                different paths, or ``path`` exists and is not a regular file (a device,
                a directory, a link).
            ConfigError: refused pushes or a bad ``send()`` are pending (call ``forward()``
                first to see them); in ``mode="async"``, inside a ``batches()`` loop (call
                it between loops: items inside one may be on the wire).
        """
        with self._guard("checkpoint()"):
            self._check_open(rounds=True)
            _checkpoint.save(self, path, state, options)

    @classmethod
    def restore(
        cls,
        comm,
        path,
        *,
        route=None,
        backend="auto",
        transport="auto",
        device=None,
        mode="bsp",
        progress="auto",
        timeout=None,
        options=None,
        exchange="auto",
    ):
        """Rebuild a forwarder from a checkpoint; collective. Returns ``(fwd, state)``.

        With as many ranks as at checkpoint time, every rank gets back its inbox, its
        queued items and its ``state`` dict, and the next round is numbered on. With a
        different number, ``route(items) -> destinations`` (numpy in, int array out) says
        where each saved item goes now; they are queued for the next ``forward()``, and
        ``state`` maps each name to the list of arrays of the old ranks this rank read
        (old ranks ``rank, rank + size, ...``).

        With ``options``, the run's settings must equal those ``checkpoint`` recorded.

        Raises:
            CheckpointError: the file is truncated, corrupted or not a rafi checkpoint, or
                the ranks passed different paths.
            ConfigError: the rank count changed and no ``route`` was given, or ``options``
                differ from the recorded ones (each differing option is named).
        """
        config = dict(
            backend=backend, transport=transport, device=device, mode=mode, progress=progress,
            timeout=timeout, exchange=exchange,
        )  # fmt: skip
        return _checkpoint.restore(cls, comm, path, route, options, config)

    def close(self):
        """Free the communicator and buffers; collective (in async mode, over IPC and shm it waits
        until no peer needs this rank's buffers). After a ``CollectiveTimeout`` it is local.

        Raises:
            RankLeft: on every rank, when some ranks close while others call ``forward()``
                (mode bsp, no deadline: ``_departure.agree_to_close``); uncaught, the job ends.
        """
        if self._closed:
            return
        if self._watch.broken is not None or (self._broken is not None and not self._broken[1]):
            self._abandon()
            return
        _departure.agree_to_close(self)  # RankLeft on every rank if others still forward
        self._closed = True
        in_flight = self._engine.close()
        self._watch.close()
        if in_flight:  # kept, not freed: see AsyncEngine.close
            KEPT.append(self._comm)
        else:
            self._comm.Free()

    def _abandon(self):
        """Close without waiting for any other rank: after an error that not every rank saw
        (a bug in the user's code on one rank, a timeout). Nothing is freed, because peers may
        still read this rank's buffers or send to its communicator; the job is going down."""
        self._closed = True
        if getattr(self, "_engine", None) is not None:
            self._engine.abandon()
        self._watch.close()
        KEPT.append(self.__dict__.copy())

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        if error is None or getattr(error, "collective", False):
            _excepthook.gather(self, error)  # one message per job, if it ends the job
            self.close()  # every rank is here, or raised the same error at the same point
        else:
            _departure.leaving(self, error)  # sys.exit(): checked at exit
            self._abandon()

    def __repr__(self):
        return (
            f"<rafi.Forwarder rank {self.rank}/{self.size} backend={self.backend} "
            f"transport={self.transport} capacity={self.capacity} item={self.item_dtype}>"
        )

    # ------------------------------------------------------------------ internals

    def _check_open(self, rounds=False):
        """Refuse a closed or timed-out forwarder; with ``rounds``, also one that was left
        where its items cannot be accounted for (``_break``)."""
        if self._watch.broken is not None:
            raise ConfigError(f"this Forwarder cannot be used after its timeout ({self._watch.broken})")
        if self._closed:
            raise ConfigError("this Forwarder is closed")
        if rounds and self._broken is not None:
            raise ConfigError(
                f"this Forwarder takes no more rounds: {self._broken[0]}. Close it (the end of its with "
                "block, or close()) and, to go on, restore a checkpoint (rafi.Forwarder.restore)"
            )

    def _interrupted(self, error, call, state):
        """``error`` left ``call`` part done, in ``state``: unless every rank raised it
        together (a rafi error, marked collective) or a deadline passed (the forwarder is
        refused already), the forwarder takes no more rounds and closes alone."""
        if getattr(error, "collective", False) or self._watch.broken is not None:
            return
        how = "Ctrl-C" if isinstance(error, KeyboardInterrupt) else type(error).__name__
        self._break(f"{how} interrupted {call} on rank {self.rank} {state}", collective_close=False)

    def _break(self, reason, collective_close=True):
        """This forwarder takes no more rounds: ``reason`` says what left its items
        unaccountable. ``collective_close``: whether ``close()`` may still meet the other
        ranks (False where this rank left a round's collective half done: then it closes
        without waiting for anyone, as after a timeout)."""
        if self._broken is None:
            self._broken = (reason, collective_close)

    def _check_send(self, items, dest):
        """What is wrong with a ``send()`` call, as ``BadSends.add``'s arguments, or None."""
        dtype = getattr(items, "dtype", None)
        n = _length(items)
        if dtype != self.item_dtype:
            return 1, n, f"send() got items of dtype {dtype}, expected {self.item_dtype}"
        if len(getattr(items, "shape", ())) != 1:
            return 2, n, f"send() got items of shape {getattr(items, 'shape', None)}, expected 1-d"
        if isinstance(dest, (int, np.integer)) and not isinstance(dest, (bool, np.bool_)):
            return self._check_range(int(dest), n)  # any size: a Python int may exceed int64
        device = is_device_array(dest)
        if device and np.dtype(dest.dtype) != np.int32 and self._backend.device_arrays:
            return 3, n, f"send() got device destinations of dtype {dest.dtype}; device arrays must be int32"
        dest_shape = tuple(dest.shape) if device else np.shape(dest)
        dest_kind = np.dtype(dest.dtype).kind if device else np.asarray(dest).dtype.kind
        if dest_kind not in "iu" or dest_shape not in ((), (n,)):
            detail = (
                f"send() got destinations of shape {dest_shape} and kind {dest_kind!r} for "
                f"{n} items; pass one int or an int array of that length"
            )
            return 3, n, detail
        if device and self._backend.device_arrays:
            return None  # int32, on the device: the partition counts those out of range, as a kernel's
        return self._check_range(dest.copy_to_host() if device else np.asarray(dest), n)

    def _check_range(self, dest, n):
        """``BadSends.add``'s arguments when destinations (an int or a host integer array,
        of any width, signed or not) lie outside ``[0, size)`` and are not ``device.ANY``."""
        size = self.size
        if isinstance(dest, int):
            bad = n if n and not (0 <= dest < size or dest == ob.ANY) else 0
            example = dest
        else:
            outside = dest >= size
            if dest.dtype.kind == "i":
                outside |= (dest < 0) & (dest != ob.ANY)
            bad = int(np.count_nonzero(outside)) * (n if dest.ndim == 0 else 1)
            if not bad:
                return None
            example = int(dest[outside][0]) if dest.ndim else int(dest)
        if not bad:
            return None
        word = min(max(example, -(2**63)), 2**63 - 1)  # what a control word can carry
        detail = f"send() got {bad} destination(s) outside [0, {size}) among {n} item(s), e.g. {example}"
        return _control.INVALID_SEND, n, detail, bad, word

    def _place(self, src, dst, at, n, dtype=None):
        """Copy ``src[:n]`` (host or device) into the backend array ``dst[at : at + n]``."""
        b = self._backend
        if is_device_array(src) and b.device_arrays:
            b.copy(dst[at : at + n], b.as_device(src)[:n])  # dtypes checked by _check_send
            return
        host = np.ascontiguousarray(src[:n] if not is_device_array(src) else src.copy_to_host()[:n])
        if dtype is not None:
            host = host.astype(dtype)
        b.to_device(host, dst[at : at + n])
