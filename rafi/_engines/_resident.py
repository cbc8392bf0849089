"""The resident engine behind ``mode="resident"``: rounds on the device, no host code between them.

Each rank runs the persistent kernel of kernels/resident.py (the protocol, its layouts and
why it is safe are described there); this module sets up its memory, launches it and
reads what it reports:

- the device transport (``_transports._mailboxes``) gives every rank's inbox and mailbox,
  writable by every rank of the node;
- ``run(step, ...)`` launches the kernel for ``rounds_per_launch`` rounds at a time
  (``LaunchModel``), with the user's ``step`` compiled into it; ``forward()`` launches it
  for one round without a step (one launch and one wait, no MPI);
- between launches the host records the rounds in ``fwd.stats``, raises a verdict's error
  on every rank (each kernel found the same one), and, when a launch returned because it
  waited out its time slice, checks the deadline, answers census questions (``_liveness``)
  and lets Python run its signal handlers (Ctrl-C), then launches again to resume the wait.

On a GPU the grid is sized so that the kernels of every rank sharing it are resident at
once (a kernel may only spin on peers that run too): the blocks that fit on the GPU
(occupancy), divided among the ranks using it, times MPS's active-thread share.
"""

import os
import time
import warnings

import numpy as np

from rafi.kernels import resident as kern

from .. import _control
from .._errors import ConfigError, RafiError, RankLeft
from .._kernel_cache import launch_counting_compilation, load_launcher, loading_counts_as_compilation
from .._liveness import KEPT, service
from .._mpi_support import agree_on_failure, mpi_is_cuda_aware, node_local
from .._result import ForwardResult
from .._transports._mailboxes import mailbox_transport, make_mailboxes
from ._base import Engine
from ._proxy import Proxy

__all__ = ["LaunchModel", "ResidentEngine"]

_RECORDS = 256  # the most rounds one launch runs (the records its report holds)
_SLICE = 0.1  # seconds a launch waits for peers before it returns to the host
_SLICE_NS = int(_SLICE * 1e9)
_NO_BAD_SENDS = (0, 0, 0)
_CLOSING, _ABANDONED = 1, 2  # a rank's leaving flag in every mailbox: it closed, or it stopped
_THREADS = 256  # threads per block of the persistent grid on a GPU
_BLOCKS_PER_SM = 2  # at least, for the persistent grid's compiler (``launch_bounds``)
_SIM_THREADS = 4  # one block of the simulator: its threads take the leading block's parallel paths
_WIDE_AT = 4 * _THREADS  # items from which a phase runs on the whole grid, not its first block


class LaunchModel:
    """How many rounds one launch runs (``rounds_per_launch``), from measured costs.

    A launch costs ``L`` seconds of host and driver time beyond the rounds it runs (launch,
    wait, reading the report), and a round ``R`` seconds on the device. With ``K`` rounds
    per launch, launches take ``L / (L + K R)`` of the time: the model takes the smallest
    ``K`` that keeps this within ``overhead`` (``K >= L (1 - o) / (o R)``), and no more
    than lets a launch return within ``responsive`` seconds (``K R <= responsive``: stats,
    deadlines and Ctrl-C are seen between launches), within ``[1, most]``. ``L`` and ``R``
    are moving averages of what launches measured; until one did, ``K`` is ``first``.
    """

    def __init__(self, overhead=0.05, responsive=0.1, most=_RECORDS, first=16):
        self.overhead, self.responsive, self.most, self.first = overhead, responsive, most, first
        self.launch = self.round = None

    def learn(self, wall, device, rounds):
        """A launch took ``wall`` seconds on the host, of which ``device`` ran ``rounds`` rounds."""
        if rounds < 1:
            return
        launch, per_round = max(wall - device, 0.0), device / rounds
        if self.launch is None:
            self.launch, self.round = launch, per_round
        else:
            self.launch = 0.8 * self.launch + 0.2 * launch
            self.round = 0.8 * self.round + 0.2 * per_round

    def rounds_per_launch(self):
        if self.launch is None:
            return self.first
        o, per_round = self.overhead, max(self.round, 1e-9)
        wanted = int(np.ceil(self.launch * (1 - o) / (o * per_round)))
        bound = max(1, int(self.responsive / per_round * (1 + 1e-9)))
        return max(1, min(wanted, bound, self.most))


_LAUNCHERS = {}  # (backend kind, step, argument count, ranks, checks) -> _Launcher, for the process


def _launcher(backend, step, nargs, size, width):
    checked = getattr(backend, "boundscheck", False)  # RAFI_BOUNDSCHECK, as the forwarder read it
    key = (backend.name, backend.simulator, step, nargs, kern.shared_len(size), width, checked)
    if key not in _LAUNCHERS:
        _LAUNCHERS[key] = _Launcher(backend, step, nargs, size, width, checked)
    return _LAUNCHERS[key]


class _Launcher:
    """The persistent kernel made for one step body, argument count, number of ranks (the
    length of its blocks' scratch) and item width in words, on one backend."""

    def __init__(self, backend, body, nargs, size, width, checked):
        self._b = backend
        args = ", ".join(f"a{k}" for k in range(nargs))
        comma = ", " if nargs else ""
        shared = kern.shared_len(size)
        namespace = {name: getattr(kern, name) for name in kern.NAMES}
        namespace["run_phase"] = kern.phase_runner(width, serial=backend.name == "cpu")
        py_func = body.py_func
        if backend.name == "cpu":
            import numba

            # the step as bsp launches it, one compiled loop over the round's items: there
            # the body is inlined, its arrays' references not counted per item
            namespace["steps"] = body._launcher("cpu", nargs + 2, checked)
            source = kern.CPU_LAUNCHER.format(comma=comma, args=args, shared=shared)
            launcher, cached = load_launcher(source, namespace, py_func, "cpu", checked)
            # no reference counts (a locked instruction per array and call): it allocates nothing
            self._kernel = numba.njit(nogil=True, cache=cached, boundscheck=checked, _nrt=False)(launcher)
        else:
            import numba
            from numba import cuda

            namespace.update(body=cuda.jit(device=True)(py_func), cuda=cuda, numba=numba)
            threads = _SIM_THREADS if backend.simulator else _THREADS
            source = kern.CUDA_LAUNCHER.format(comma=comma, args=args, shared=shared, threads=threads)
            launcher, cached = load_launcher(source, namespace, py_func, "cuda")
            # two blocks a multiprocessor: the step, run by the grid, at twice the occupancy
            # (the protocol's 141 registers a thread fit 128 without a spill, sm_90)
            bounds = {} if backend.simulator else {"launch_bounds": (_THREADS, _BLOCKS_PER_SM)}
            self._kernel = cuda.jit(cache=cached, **bounds)(launcher)
        self._grids = {}  # (ranks sharing the GPU, argument types) -> (blocks, threads)
        self._typed = {}  # the arguments' fingerprints -> their numba types (cpu backend)
        self._fast = None

    def prepare(self, args, sharing):
        """Compile (or load) the kernel for these arguments' types, and size its grid;
        return the grid, ``(blocks, threads)``, to launch with."""
        if self._b.name == "cpu":
            types = self._types(args)
            if types not in self._kernel.overloads:
                loading_counts_as_compilation(lambda: self._kernel.compile(types))
            return (1, 1)
        if self._b.simulator:  # one block: the simulator runs blocks one after another
            return (1, _SIM_THREADS)
        key = (sharing, tuple(self._kernel.typeof_pyval(a) for a in args))
        if key not in self._grids:  # another compiled version may fit fewer blocks
            self._grids[key] = self._size_grid(args, sharing)
        if self._fast is None:
            from .._launch_cache import LaunchCache

            self._fast = LaunchCache(self._kernel)
        return self._grids[key]

    def direct(self, args, grid):
        """The kernel for these arguments as a plain call, ``f(*args)``, or None. On the cpu
        backend the entry point compiled for their types, without numba's dispatch (half of
        the 3 us of a launch of some 20 arguments): only for arguments whose types cannot
        change. On a GPU the launch of the parameter block that an earlier launch made for
        these arrays (None before one): only for arrays that stay the same objects. Nothing
        checks either."""
        if self._b.name == "cpu":
            return self._kernel.overloads[self._types(args)].entry_point
        if self._fast is None:  # the simulator's
            return None
        return self._fast.bound(*grid, args)

    def _types(self, args):
        """numba's types of ``args`` (cpu backend), looked up by the dispatcher's fingerprint
        of each: ``numba.typeof`` costs 7 to 70 us an array, which each new forwarder's
        first run() of a step would pay for some 25 arguments (a fingerprint: 0.1 to 1 us)."""
        import numba
        from numba._dispatcher import compute_fingerprint

        try:
            key = tuple(compute_fingerprint(a) for a in args)
        except (TypeError, ValueError, NotImplementedError):  # a value numba fingerprints not
            return tuple(numba.typeof(a) for a in args)
        if key not in self._typed:
            self._typed[key] = tuple(numba.typeof(a) for a in args)
        return self._typed[key]

    def __call__(self, args, grid):
        blocks, threads = grid
        if self._b.name == "cpu":
            self._kernel(*args)
        elif self._b.simulator:
            self._kernel[blocks, threads](*args)
        elif not self._fast.launch_prepared(blocks, threads, args):
            from .._backends._cuda import grid_size_is_ours  # the grid is sized for co-residency

            with grid_size_is_ours():
                launch_counting_compilation(self._kernel, lambda: self._fast.launch(blocks, threads, args))

    def _size_grid(self, args, sharing):
        """Blocks that fit on the GPU at once, this rank's share of them (every rank
        sharing the GPU runs its kernel at the same time, within MPS's active threads)."""
        kernel = self._kernel
        types = tuple(kernel.typeof_pyval(a) for a in args)
        launch_counting_compilation(kernel, lambda: kernel.compile(types))
        fits = kernel.overloads[types].max_cooperative_grid_blocks(_THREADS)
        share = float(os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", 100)) / 100
        return max(1, int(fits * min(share, 1.0) / sharing)), _THREADS


class ResidentEngine(Engine):
    """Rounds in persistent kernels for the forwarder ``fwd``; see the module docstring."""

    mode = "resident"

    def __init__(self, fwd, transport):
        self._fwd = fwd
        comm, b, size = fwd._comm, fwd._backend, fwd.size
        self.transport = agree_on_failure(comm, lambda: mailbox_transport(transport, b))
        nodes = fwd._watch.allreduce(
            int(node_local(comm, fwd._watch)[0] == 0), "Forwarder() (counting nodes)"
        )
        self._proxied = nodes > 1  # a job across nodes: the hosts exchange what crosses them
        cuda_aware = self._proxied and b.device_arrays and mpi_is_cuda_aware(comm, fwd._watch)
        mail = kern.mail_len(size, self._proxied)
        self._mailboxes = agree_on_failure(
            comm, lambda: make_mailboxes(comm, b, fwd.item_dtype, fwd.capacity, fwd._word, mail, fwd._watch)
        )
        try:
            agree_on_failure(comm, lambda: self._allocate(fwd))  # a refusal anywhere, told everywhere
        except BaseException:
            self._mailboxes.close()
            raise
        self._proxy = None
        if self._proxied:
            self._proxy = Proxy(fwd, self._plan, self._report, self._remote, self._slots, cuda_aware)
            self.transport = f"{self.transport}+{'cuda-aware' if cuda_aware else 'host'}"
        self._last_result = None  # of the last round a launch recorded
        self._phase = kern.PH_START  # where the last launch left the rounds (kernels/resident.py)
        self._owed = None  # PROXY_POSTS or PROXY_ITEMS: the host's part of the round, not yet done
        self._prepared = {}  # (step, argument count) -> (launcher, its grid, its direct call or None)
        self._model = LaunchModel()
        self._launches = 0
        self._bad = np.zeros(_control.Block.WORDS, np.int64)
        self._fixed = (
            self._ctl, self._plan, self._draft, self._report_kernel, self._mailboxes.mail,
            self._mailboxes.boxes, self._mailboxes.stages, self._remote, fwd._inbox_items,
            fwd._kernel_outbox, fwd._outbox_words, self._kept, self._kept_dest,
        )  # fmt: skip
        try:  # forward()'s kernel made now, as bsp makes its kernels: numba's start-up (half a
            # second on the cpu) and a compilation are not spent inside the first rounds, where
            # the peers would wait for them
            agree_on_failure(comm, lambda: self._ready(kern.idle, self._arguments(0, 0, False, ())))
        except BaseException:
            self._mailboxes.close()
            raise
        self._warn_if_time_sliced()

    def _allocate(self, fwd):
        """The outbox and inbox (in the mailboxes), and the kernel's own words and scratch."""
        b, size = fwd._backend, fwd.size
        fwd._allocate(b.zeros, lambda count, dtype: self._mailboxes.inbox)
        ctl = np.zeros(kern.ctl_len(size), np.int64)
        ctl[kern.C_ME], ctl[kern.C_WIDE_AT] = fwd.rank, _WIDE_AT
        ctl[kern.G_PUSH_FROM], ctl[kern.G_STREAM_FROM] = kern.NODE_STORES[self._mailboxes.stores]
        ctl[kern.C_SIZE], ctl[kern.C_PROXY] = size, int(self._proxied)
        self._ctl = b.as_device(ctl)
        members = self._mailboxes.members
        self._slots = [members.index(r) if r in members else -1 for r in range(size)]
        plan = np.zeros(kern.plan_len(size), np.int64)
        node = kern._plan_at(size)[10]
        plan[node : node + size] = self._slots
        self._plan = b.as_device(plan)
        self._remote = b.zeros(fwd.capacity * fwd._width if self._proxied else 1, fwd._word)
        self._report, self._report_kernel = b.mapped_buffer(kern.report_len(size, _RECORDS), np.int64)
        self._said = self._report[: kern.R_MISSING]  # status, records, round ... phase
        self._rows = self._report[kern.records_at(size) :].reshape(_RECORDS, kern.record_words(size))
        self._unread = np.zeros((4 * _RECORDS, kern.record_words(size)), np.int64)  # (_keep_records)
        self._kept_records = 0
        self._draft = b.zeros(kern.report_len(size, _RECORDS), np.int64)
        self._kept = b.zeros(fwd.capacity * fwd._width, fwd._word)
        self._kept_dest = b.zeros(fwd.capacity, np.int32)

    # ------------------------------------------------------------------ rounds

    def forward(self):
        fwd = self._fwd
        self._launch(kern.idle, (), rounds=1, stepping=False)
        result = self._last_result
        fwd._received = result.received
        return result

    def run(self, step, args, rounds, rounds_per_launch):
        fwd, done = self._fwd, 0
        self._last_result = None
        while rounds is None or done < rounds:
            k = min(rounds_per_launch or self._rounds_per_launch(), _RECORDS)
            k = k if rounds is None else min(k, rounds - done)
            before = fwd._round
            status = self._launch(step, args, rounds=k, stepping=True)
            done += fwd._round - before
            fwd._received = 0  # what step processed is consumed
            if status == kern.DONE:
                break
        return self._last_result or ForwardResult(0, 0, 0, max(fwd._round - 1, 0))

    def _rounds_per_launch(self):
        """The model's, on one node. Across nodes a kernel returns to its host in every round
        (the proxy), where deadlines, census questions and Ctrl-C are seen: a launch runs
        as many rounds as its report holds (a round's launches measure no launch cost the
        model could learn: the host's exchanges fall between them)."""
        return _RECORDS if self._proxied else self._model.rounds_per_launch()

    def _launch(self, step, args, rounds, stepping):
        """Launch the persistent kernel (again, while it returns inside a wait) until it
        ends for another reason; record its rounds; raise a verdict. Returns the status.
        A launch of rounds that run on their own costs the host a few microseconds: the
        arguments but the round's numbers are made once, and the rounds' records are taken
        apart when ``fwd.stats`` is read."""
        fwd = self._fwd
        waiting, since = None, None  # where the kernel last waited (epoch, phase), and since when
        if self._owed is not None:  # the host's part of a round, which Ctrl-C cut short
            self._proxy.serve(self._owed, f"{'run()' if stepping else 'forward()'} round {fwd._round}")
            self._owed = None
        first = fwd._round  # the rounds of this call: those a launch that returned early ran count
        relaunch = None  # a plain call of the kernel (``_Launcher.direct``) once it returned to the proxy
        while True:
            self._launches += 1
            call = self._arguments(self._launches, rounds - (fwd._round - first), stepping, args)
            launcher, grid, direct = self._ready(step, call)
            direct = direct or relaunch
            self._report[kern.R_STATUS] = kern.RUNNING  # until a launch ends (it may never start)
            started = time.perf_counter()
            try:
                if direct is not None:
                    direct(*call)
                else:
                    launcher(call, grid)
                    if len(call) == kern.LAUNCH_ARGS:  # the engine's own arrays: on a GPU, their
                        # parameter block (made by a launch) is launched as it is from now on
                        self._prepared[step, len(call)] = (launcher, grid, launcher.direct(call, grid))
            except BaseException as exc:
                self._failed(exc, step, what=f"{'run()' if stepping else 'forward()'} round {fwd._round}")
                raise
            finally:  # the rounds it ran count, whatever interrupts the host afterwards
                fwd._backend.synchronize()
                status = self._consume(time.perf_counter() - started, stepping)
            if status == kern.PAUSED or status == kern.DONE:
                return status
            what = f"{'run()' if stepping else 'forward()'} round {fwd._round}"
            if status == kern.PROXY_POSTS or status == kern.PROXY_ITEMS:
                self._proxy.serve(status, what)
                self._owed = None
                relaunch = relaunch or direct or launcher.direct(call, grid)  # this call's arguments
                continue
            if status == kern.WAITING:
                where = (int(self._report[kern.R_EPOCH]), int(self._report[kern.R_PHASE]))
                if where != waiting:  # a new wait, which began a time slice before the kernel
                    waiting, since = where, time.perf_counter() - _SLICE  # returned (not the launch)
                self._waited(since, what)
                continue
            if status == kern.ERROR:
                self._raise_verdict()
            if status == kern.LEFT:
                self._raise_left(what)
            raise RafiError(
                f"rank {fwd.rank}: a block of its persistent grid stopped answering in {what} ({grid[0]} "
                "blocks; every block must be resident at once); the forwarder cannot go on. Run fewer "
                "ranks per GPU, or start MPS"
            )

    def _arguments(self, launch, rounds, stepping, args):
        """The persistent kernel's arguments for a launch (kernels/resident.py's ``launcher``)."""
        bad = self._bad_words()
        return (
            *self._fixed, launch, rounds, int(stepping), self._fwd._round, _SLICE_NS, bad[0], bad[1], bad[2],
            *args,
        )  # fmt: skip

    def _failed(self, error, step, what):
        """A launch raised ``error``. Ctrl-C on the cpu backend or a GPU comes after the
        kernel returned (its state saved, its rounds reported): run() or forward() resumes
        it. Anything else left its rounds where the host cannot see (a step that raised
        part-way through the inbox, the simulator stopped mid-kernel): the forwarder takes
        no more rounds. A bounds check (``RAFI_BOUNDSCHECK=1``) names the step."""
        fwd = self._fwd
        if isinstance(error, KeyboardInterrupt) and not fwd._backend.simulator:
            return
        name = getattr(step, "__name__", repr(step))
        fwd._break(
            f"{type(error).__name__} was raised inside the persistent kernel ({name} as the step) in "
            f"{what} on rank {fwd.rank}, part-way through a round"
        )
        if isinstance(error, IndexError) and getattr(fwd._backend, "boundscheck", False):
            error.args = (f"kernel {name} (RAFI_BOUNDSCHECK=1, in a resident round): {error}",)

    def busy(self):
        if self._phase != kern.PH_START:
            return (
                f"while round {self._fwd._round} is under way (a run() or forward() interrupted in it "
                "returned before its end; call forward() to end it)"
            )
        return None

    def _bad_words(self):
        """The send() errors no launch has carried yet: (mask, calls, items)."""
        sends = self._fwd._bad_sends
        if len(sends.calls) == sends._counted:
            return _NO_BAD_SENDS
        self._bad[:] = 0
        sends.put(self._bad)
        B = _control.Block
        return int(self._bad[B.SEND_ERROR]), int(self._bad[B.SEND_CALLS]), int(self._bad[B.SEND_ITEMS])

    def _ready(self, step, call):
        """The launcher of ``step`` for these arguments, compiled (or loaded) and its grid
        sized before a launch is timed (a rank's own compilation is not time spent waiting
        for its peers): ``(launcher, grid, direct)``; ``direct`` calls it without dispatch
        where the arguments are all the engine's own (``forward()``), else None."""
        key = (step, len(call))
        ready = self._prepared.get(key)
        if ready is None:
            fwd = self._fwd
            nargs = len(call) - kern.LAUNCH_ARGS
            launcher = _launcher(fwd._backend, step, nargs, fwd.size, fwd._width)
            try:
                grid = launcher.prepare(call, self._mailboxes.sharing)
            except RafiError:
                raise
            except Exception as exc:  # as a launch of the step says it (rafi/_kernel.py); numba-cuda
                # raises more than TypingError for arguments it cannot pass (AttributeError for a str)
                user = (fwd._inbox_items, fwd._kernel_outbox, *call[kern.LAUNCH_ARGS :])
                raise ConfigError(step._cannot_compile(user, exc)) from exc
            ready = self._prepared[key] = (launcher, grid, None if nargs else launcher.direct(call, grid))
        return ready

    def _waited(self, since, what):
        """Between launches that waited for peers: the deadline, census answers, signals."""
        fwd = self._fwd
        missing = [r for r in range(fwd.size) if self._report[kern.R_MISSING + r]]
        fwd._watch.check(since, f"{what} (waiting on the device for rank(s) {missing})")
        service(f"{what} (its kernel waits for rank(s) {missing})")

    def _consume(self, wall, stepping):
        """Set ``fwd._round`` and the last result from the launch's report; hand its rounds'
        records to ``fwd.stats`` (taken apart when read: ``_records``). Returns the status."""
        fwd = self._fwd
        status, count, after, received, alive, deferred, _, phase = self._said.tolist()
        if status == kern.RUNNING:  # the launch did not run: nothing to take
            return status
        fwd._round, self._phase = after, phase
        self._owed = status if status in (kern.PROXY_POSTS, kern.PROXY_ITEMS) else None
        if count:
            self._keep_records(count)
            self._last_result = ForwardResult(received, alive, deferred, after - 1)
            if stepping and (status == kern.PAUSED or status == kern.DONE):  # not mid-round (proxy)
                rows = self._rows
                self._model.learn(wall, (rows[count - 1, kern.REC_END] - rows[0, kern.REC_T0]) * 1e-9, count)
        return status

    def _keep_records(self, count):
        """The launch's ``count`` records, after those of earlier launches that ``fwd.stats``
        has not taken yet: it takes them all when read (``_records``), so that a launch of
        one round (a ``forward()``) costs a copy of one row, not a deferral of its own."""
        kept = self._kept_records
        if kept + count > len(self._unread):
            self._fwd.stats.settle()  # takes them now (``_records``); the buffer is empty again
            kept = 0
        self._unread[kept : kept + count] = self._rows[:count]
        self._kept_records = kept + count
        if kept == 0:
            self._fwd.stats.defer(self._records)

    def _records(self, stats):
        """Record the rounds kept since ``stats`` last read them (one row per round)."""
        records, self._kept_records = self._unread[: self._kept_records], 0
        size, rank = self._fwd.size, self._fwd.rank
        times = records[:, kern.REC_T0 : kern.REC_END + 1]
        seconds = np.diff(times, axis=1) * 1e-9  # posted, agreed, delivered, ended
        seconds[:, 2] += seconds[:, 3]  # exchange: delivery and the stamps
        seconds[:, 3] = seconds[:, 2] - seconds[:, 3]  # payload: the delivery
        sent, received = records[:, kern.REC_HEAD : kern.REC_HEAD + size], records[:, kern.REC_HEAD + size :]
        messages = (size - 1) + np.count_nonzero(sent, axis=1) - (sent[:, rank] != 0)
        stats.record_many(
            records[:, kern.REC_ROUND], sent, received, records[:, kern.REC_DEFERRED],
            records[:, kern.REC_ALIVE], seconds, messages,
        )  # fmt: skip

    def _raise_left(self, what):
        """Peers closed their forwarder while this rank waited for them in a round."""
        from .._departure import world_ranks

        fwd = self._fwd
        left = [r for r in range(fwd.size) if self._report[kern.R_MISSING + r] == 2]
        fwd._abandon()
        leavers, me = world_ranks(fwd._comm, left), world_ranks(fwd._comm, [fwd.rank])[0]
        raise RankLeft(
            f"rank(s) {leavers} closed their Forwarder (close() or the end of its with block) while "
            f"rank {me} called {what}",
            ranks=leavers,
            printer=fwd.rank == min(set(range(fwd.size)) - set(left)),
        )

    def _raise_verdict(self):
        """The error every rank's kernel found in the same round, raised here as bsp raises it."""
        fwd, size = self._fwd, self._fwd.size
        plan = np.empty(kern.plan_len(size), np.int64)
        fwd._backend.to_host(self._plan, plan)
        seen = kern.plan_seen(plan, size)
        blocks = np.zeros((size, _control.Block.WORDS), np.int64)
        B = _control.Block
        for column, word in ((B.TOTAL, kern.M_VALID), (B.REFUSED, kern.M_REFUSED), (B.NEEDED, kern.M_NEEDED),
                             (B.INVALID, kern.M_INVALID), (B.EXAMPLE, kern.M_EXAMPLE),
                             (B.SEND_ERROR, kern.M_SEND_MASK), (B.SEND_CALLS, kern.M_SEND_CALLS),
                             (B.SEND_ITEMS, kern.M_SEND_ITEMS), (B.ANYWHERE, kern.M_ANY)):  # fmt: skip
            blocks[:, column] = seen[:, word - kern.M_VALID]
        error = _control.verdict(blocks, fwd.rank, fwd.capacity, fwd._bad_sends)
        fwd._bad_sends.clear()
        fwd._received = 0
        raise error

    # ------------------------------------------------------------------ lifecycle

    def _warn_if_time_sliced(self):
        """Ranks sharing a GPU without MPS take turns on it: rounds then cost milliseconds."""
        if self._mailboxes.sharing < 2 or self._fwd._backend.simulator:
            return
        from .._report import mps

        if not mps().startswith("on") and self._mailboxes.first_on_gpu:
            warnings.warn(
                f"rafi: {self._mailboxes.sharing} ranks share a GPU without NVIDIA MPS: their "
                "persistent kernels take turns on it and a resident round costs milliseconds. "
                "Start MPS before the job (nvidia-cuda-mps-control -d; `python -m rafi` reports it)",
                stacklevel=4,
            )

    def close(self):
        """Tell every rank that this one leaves (a kernel waiting for it raises ``RankLeft``
        there), wait until every rank has said the same, then free the mailboxes
        (collectively). A rank that was abandoned (``abandon``: its program went on after an
        error) never frees its memory: this rank then keeps its own too, and its communicator
        (that rank's timed-out collectives may still send on it), and closes alone."""
        fwd = self._fwd
        if self._proxy is not None:
            self._proxy.leave()  # meets a round's exchange of words on the other nodes
        self._tell_peers(_CLOSING)
        flags = []

        def everyone_left():
            flags[:] = self._mailboxes.leave_flags()
            return all(flags)

        fwd._watch.until(everyone_left, "close() (waiting for the other ranks to close too)")
        if _ABANDONED in flags:  # the peers that stopped may still send on the communicator
            KEPT.append(self._mailboxes)
            return True
        self._mailboxes.close()
        return False

    def abandon(self):
        """Tell every rank that this one stopped (kernels waiting for it raise ``RankLeft``;
        a ``close()`` waiting for it goes on alone); the mappings stay, since peers may
        still write into this rank's memory. Across nodes the other nodes hear it in their
        next exchange of counts (``Proxy.abandon``)."""
        self._tell_peers(_ABANDONED)
        if self._proxy is not None and self._fwd._watch.broken is None:
            self._proxy.abandon()

    def _tell_peers(self, flag):
        fwd = self._fwd
        word, at = np.full(1, flag, np.int64), kern.leave_at(fwd.size, int(self._proxied)) + fwd.rank
        for box in self._mailboxes.mail:
            if isinstance(box, np.ndarray):  # node-shared host memory (cpu, simulator)
                box[at] = flag
            else:
                fwd._backend.to_device(word, box[at : at + 1])
