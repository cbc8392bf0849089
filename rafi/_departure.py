"""A rank that leaves while its peers are inside rafi ends the whole job, with one line.

MPI cannot tell a rank waiting in a collective that a peer has gone: without this module a
rank that leaves early leaves the others waiting forever. What counts as leaving early, and
what each prints (one line on stderr, from the rank that left; then ``MPI_Abort``, so the
launcher ends every rank with a non-zero status):

- an uncaught exception, ``KeyboardInterrupt`` included (``_excepthook``): its traceback,
  then ``rafi: rank 1 left with an uncaught ValueError (above) during forward() round 4;
  ending the job``;
- ``sys.exit()`` with any code, 0 included, out of a forwarder's or reducer's ``with``
  block, or the end of the script (or ``sys.exit()``) while a Forwarder or Reducer is open
  (never closed): at exit the rank tells the other ranks of each such object's
  communicator that it has reached its exit, and waits up to ``RAFI_EXIT_WAIT`` seconds
  (default 5) for each of them to say the same. If they all do, the job ends as its ranks
  asked (a script that never closed its forwarder, ending on every rank alike); if not,
  ``rafi: rank 1 left with sys.exit(3) during forward() round 4 (rank(s) [0, 2] did not
  reach their exit within 5 s); ending the job``;
- ``SIGTERM`` (a scheduler's time limit, ``kill``) while a rafi object is open, also while
  the rank waits inside MPI: ``rafi: rank 1 left with SIGTERM during forward() round 4;
  ending the job``, after a grace of a second, and 0.5 s more per rank up to 3 s (the
  launcher ends a failed or cancelled job with SIGTERM and, 0.2 s later, SIGKILL: a rank
  it ends that way says nothing; where a scheduler sends SIGTERM to every rank, the lowest
  speaks first and its abort ends the others). With no rafi object open, SIGTERM does what
  it does without rafi;
- closing a Forwarder (``close()``, or the end of its ``with`` block) while another rank
  calls ``forward()``: ``close()`` agrees with the others as a round would, saying that it
  closes (a flag in the round's control words, ``_control.LEAVING``); a rank in
  ``forward()`` sees the flag, the closing rank sees that they forward, and every rank
  raises ``RankLeft``: ``rafi: rank 1 closed its Forwarder (close() or the end of its with
  block) while rank(s) [0, 2] called forward() round 4; ending the job``. Where every rank
  closes, the agreement finds nothing and costs one exchange of control words. Where a
  rank of the forwarder has a deadline (``RAFI_TIMEOUT``) there is no agreement: the ranks
  left in ``forward()`` name the closed one (``CollectiveTimeout``) and the job ends;
- death (SIGKILL, a crash): the launcher ends the job and says which rank died.

A rank whose rafi objects are all closed ends as it likes: a normal end costs nothing.

The job's exit status: ``n`` for ``sys.exit(n)`` (1 for ``sys.exit(0)``, ``sys.exit()`` or
a text), 130 for ``KeyboardInterrupt``, 143 for SIGTERM, 1 otherwise.

Nothing of rafi's is left behind: checkpoint files being written (``register_temporary``)
are removed at any exit, on SIGTERM and before an abort; MPI frees its shared-memory
windows and segments when the launcher ends the job, and the CUDA driver a process's IPC
mappings when it ends.

Not covered: a rank that closes a Reducer, or a Forwarder in ``mode="async"`` or
``"resident"`` (no host-driven rounds to agree in), while others still use theirs (they
wait, as they would for any rank that does not arrive; a deadline, ``RAFI_TIMEOUT``, names
it); a rank blocked inside MPI when SIGINT arrives (Python raises ``KeyboardInterrupt``
only once that call returns; ``mpirun`` ends the job on Ctrl-C).

``RAFI_ABORT_ON_EXCEPTION=0`` turns every abort off: ranks then end on their own, and the
others may wait forever.
"""

import atexit
import gc
import os
import signal
import sys
import threading
import time

import numpy as np

from ._errors import RankLeft

__all__ = [
    "aborts",
    "agree_to_close",
    "end_job",
    "forget_temporary",
    "how_left",
    "install",
    "leaving",
    "open_objects",
    "rafi_types",
    "register_temporary",
    "wait_to_be_ended",
    "where",
    "where_now",
    "world",
    "world_ranks",
]

_EXIT = 27  # tag on a rafi communicator: "this rank has reached its exit"
_EXIT_WAIT = 5.0  # seconds, RAFI_EXIT_WAIT
_SIGTERM_GRACE = 1.0  # seconds before a rank that got SIGTERM ends the job (see the docstring)
# and more per rank above 0: the time rank 0's abort has to end the others before rank 1
# speaks too (0.1 s was too short on a loaded machine: both printed)
_SIGTERM_STAGGER = 0.5


class _State:
    left = None  # the SystemExit that took this rank out of a rafi object's with block
    exited = None  # the last sys.exit() called anywhere, as its SystemExit (``_recording_exit``)
    comms = []  # the communicators of the objects it left that way
    temporaries = set()  # files to remove at any exit (checkpoints being written)
    ending = threading.Lock()  # held by the thread that ends the job
    helper_fd = None  # the wakeup fd the SIGTERM helper thread reads


def aborts():
    """Whether rafi ends the job when a rank leaves (``RAFI_ABORT_ON_EXCEPTION`` is not 0)."""
    return os.environ.get("RAFI_ABORT_ON_EXCEPTION", "1") != "0"


def world():
    """``mpi4py.MPI`` when MPI runs with more than one rank in ``COMM_WORLD``, else None."""
    MPI = sys.modules.get("mpi4py.MPI")
    if MPI is None or not MPI.Is_initialized() or MPI.Is_finalized():
        return None
    return MPI if MPI.COMM_WORLD.Get_size() > 1 else None


def world_ranks(comm, ranks):
    """The ``COMM_WORLD`` ranks of ``comm``'s ``ranks``."""
    from mpi4py import MPI

    group, everyone = comm.Get_group(), MPI.COMM_WORLD.Get_group()
    try:
        return [int(r) for r in MPI.Group.Translate_ranks(group, list(ranks), everyone)]
    finally:
        group.Free()
        everyone.Free()


def how_left(error):
    """How ``error`` took a rank out: ``sys.exit(3)``, ``KeyboardInterrupt``, ``an uncaught ValueError``."""
    if isinstance(error, SystemExit):
        return "sys.exit()" if error.code is None else f"sys.exit({error.code!r})"
    if isinstance(error, KeyboardInterrupt):
        return "KeyboardInterrupt"
    return f"an uncaught {type(error).__name__}"


def exit_status(error):
    """The job's exit status for a rank that left with ``error`` (never 0)."""
    if isinstance(error, SystemExit):
        code = error.code
        return code if isinstance(code, int) and 0 < code < 256 else 1
    return 130 if isinstance(error, KeyboardInterrupt) else 1


def where(obj, call=None):
    """Where a rafi object was (in ``call``, if given, else in the call it is in now):
    ``during run() round 4``, ``during checkpoint()``, ``after forward() round 3``, ``while
    making a Forwarder``, ``with a Reducer open``."""
    if obj is None:
        return ""
    name = type(obj).__name__
    if not hasattr(obj, "_view" if name == "Reducer" else "_round"):  # set once its settings agree
        return f"while making a {name}"
    if name == "Reducer":
        return "with a Reducer open"
    guard = getattr(obj, "_guard", None)
    call = call or (guard.current() if guard is not None else None)
    if call is not None:
        counted = call in ("forward()", "run()") and getattr(obj, "mode", None) != "async"
        return f"during {call} round {obj._round}" if counted else f"during {call}"
    last = guard.last if guard is not None else None
    if last is None:
        return "with a Forwarder open, before its first call"
    counted = last in ("forward()", "run()") and obj._round > 0 and getattr(obj, "mode", None) != "async"
    return f"after {last} round {obj._round - 1}" if counted else f"after {last}"


def rafi_types():
    """The classes of rafi's objects that hold communicators, as far as they are imported."""
    types = []
    for name, attr in (("rafi._forwarder", "Forwarder"), ("rafi._reducer", "Reducer")):
        module = sys.modules.get(name)
        if module is not None:
            types.append(getattr(module, attr))
    return tuple(types)


def open_objects(collect=False):
    """This process's Forwarders and Reducers that are neither closed nor abandoned, Forwarders
    first; with ``collect``, unreachable ones are collected first (and so not counted).
    Called only as the process ends: it unfreezes the heap (``gc.freeze``) to see them all."""
    types = rafi_types()
    if not types:
        return []
    gc.unfreeze()  # frozen objects are not in gc.get_objects(); the process is ending
    if collect:
        gc.collect()
    found = [o for o in gc.get_objects() if isinstance(o, types) and getattr(o, "_closed", True) is False]
    return sorted(found, key=lambda o: type(o).__name__ != "Forwarder")


def _may_be_open():
    """Whether a rafi object may still be open: every open one has a live ``Watch`` (a cheap
    test before ``open_objects`` walks the heap, at every exit)."""
    from . import _liveness

    watches = getattr(_liveness, "_watches", None)
    return watches is None or len(watches) > 0


def where_now():
    """Where this process's first open rafi object is (``where``), or ""."""
    objects = open_objects()
    return where(objects[0]) if objects else ""


def leaving(obj, error):
    """``obj``'s ``with`` block is left by ``error``, which not every rank raised: note where
    (for the line that ends the job); after ``sys.exit()``, keep its communicator for the
    check at exit."""
    if getattr(error, "_rafi_where", None) is None:
        try:
            error._rafi_where = where(obj)
        except AttributeError:  # an exception type that takes no attributes
            pass
    if isinstance(error, SystemExit):
        _State.left = error
        if not obj._closed and obj._comm.Get_size() > 1:
            _State.comms.append(obj._comm)


def register_temporary(path):
    """Remove the file ``path`` if the process ends (normally, by an abort, on SIGTERM) before
    ``forget_temporary(path)``."""
    _State.temporaries.add(os.path.abspath(path))


def forget_temporary(path):
    _State.temporaries.discard(os.path.abspath(path))


def _remove_temporaries():
    for path in list(_State.temporaries):
        try:
            os.unlink(path)
        except OSError:
            pass
        _State.temporaries.discard(path)


def end_job(line, status=1):
    """Print ``rafi: <line>`` and end the whole job with ``status`` (``MPI_Abort``).

    Only the first thread to call it prints; a second one waits for the end. Without MPI (or
    with one rank) it only prints and returns."""
    _remove_temporaries()
    if not _State.ending.acquire(blocking=False):
        wait_to_be_ended(60)
        os._exit(status)
    sys.stdout.flush()
    sys.stderr.write(f"rafi: {line}\n")
    sys.stderr.flush()
    MPI = world()
    if MPI is not None:
        MPI.COMM_WORLD.Abort(status)


def wait_to_be_ended(seconds):
    """Sleep up to ``seconds`` while another rank ends the job (its abort ends this process)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.05)


# ---------------------------------------------------------------- closing while others forward


class _Closing:
    """Stands in for the forwarder's ``BadSends`` in the closing agreement: no bad call, and
    the ``LEAVING`` flag in this rank's control words."""

    calls = (None,)  # "something to put": own_words then calls put()

    def put(self, words):
        from ._control import LEAVING, Block

        words[Block.SEND_ERROR] |= LEAVING


def agree_to_close(fwd):
    """Before ``fwd`` frees anything: agree with the other ranks that they close it too.

    Runs the exchange of control words a round runs (the same collective calls, so it meets
    a peer's ``forward()``), with ``LEAVING`` set. Returns when every rank closes; otherwise
    every rank raises ``RankLeft``: here (after ``fwd`` is abandoned) and in the peers'
    ``forward()`` (``_control.verdict``). Only the engine with host-driven rounds (``bsp``)
    agrees, and only where no rank of the forwarder has a deadline: with one, a peer left
    in ``forward()`` names the closed rank itself (``CollectiveTimeout``), and a rank that
    timed out leaves its round's nonblocking collective posted, which the agreement would
    meet (it is a blocking call only where no rank has a deadline: ``Watch.collective``).
    """
    engine = getattr(fwd, "_engine", None)
    exchanges = getattr(engine, "_exchanges", None)
    if exchanges is None or fwd.size == 1 or fwd._watch.asked:
        return
    from ._control import LEAVING, Block

    what = f"close() (after forward() round {fwd._round - 1})"
    summary = engine.partitioner.run()
    exchange = exchanges.pick()
    blocks = exchange.run(what, summary, _Closing())
    everyone = exchange.everyone(what)  # errors() is true: this rank's own flag
    closing = (everyone[:, Block.SEND_ERROR] & LEAVING) != 0
    if closing.all():
        return
    zeros = np.zeros(fwd.size, np.int64)
    engine._finish(summary, zeros, zeros, blocks)  # as the peers' round does, moving nothing
    fwd._abandon()
    leavers = world_ranks(fwd._comm, np.flatnonzero(closing).tolist())
    others = world_ranks(fwd._comm, np.flatnonzero(~closing).tolist())
    me = world_ranks(fwd._comm, [fwd.rank])[0]
    who = f"rank {me}" if leavers == [me] else f"ranks {leavers}"
    raise RankLeft(
        f"{who} closed {'its' if len(leavers) == 1 else 'their'} Forwarder (close() or the end of "
        f"its with block) while rank(s) {others} called forward() round {fwd._round}",
        ranks=leavers,
        printer=me == leavers[0],
    )


# ---------------------------------------------------------------- the check at exit


def _exit_wait_setting():
    """``RAFI_EXIT_WAIT`` in seconds (checked where rafi reads its settings: ``_config``)."""
    from ._config import _seconds

    value = os.environ.get("RAFI_EXIT_WAIT")
    try:
        return _seconds(value, "RAFI_EXIT_WAIT") if value else _EXIT_WAIT
    except ValueError:  # ConfigError: said at construction already (check_environment)
        return _EXIT_WAIT


def _exit_wait(objects):
    wait = _exit_wait_setting()
    deadlines = [o._watch.timeout for o in objects if getattr(o, "_watch", None) is not None]
    deadlines = [d for d in deadlines if d is not None]
    return min([wait, *deadlines])  # a peer with a deadline would otherwise time out first


def _peers_at_exit(comms, seconds, what):
    """Tell every peer of ``comms`` that this rank has reached its exit; return the world ranks
    that did not say the same within ``seconds``."""
    from mpi4py import MPI

    from ._liveness import Backoff, service

    mark, sends, pending = np.ones(1, np.int8), [], []
    for comm in comms:
        me, size = comm.Get_rank(), comm.Get_size()
        for r in range(size):
            if r != me:
                sends.append(comm.Isend(mark, dest=r, tag=_EXIT))
                pending.append((comm, r, comm.Irecv(np.zeros(1, np.int8), source=r, tag=_EXIT)))
    end, backoff = time.monotonic() + seconds, Backoff(longest=0.01)
    while pending and time.monotonic() < end:
        service(what)
        pending = [(c, r, q) for c, r, q in pending if not q.Test()]
        backoff.sleep()
    MPI.Request.Waitall(sends)  # small messages: sent eagerly, complete at once
    return sorted({world_ranks(c, [r])[0] for c, r, _ in pending})


def _at_exit():
    try:
        MPI = world()
        if MPI is None or not aborts():
            return
        left = _State.left or _State.exited
        objects = open_objects(collect=True) if _may_be_open() else []
        comms = [o._comm for o in objects if o._comm.Get_size() > 1] + _State.comms
        if not comms:
            return
        if left is not None:
            place = getattr(left, "_rafi_where", None) or (where(objects[0]) if objects else "")
            how = f"with {how_left(left)} {place}".rstrip()
        else:
            names = " and ".join(sorted({type(o).__name__ for o in objects}))
            how = f"(the end of its script, or sys.exit()) with its {names} still open {where(objects[0])}"
        seconds = _exit_wait(objects)
        missing = _peers_at_exit(comms, seconds, f"its exit: it left {how}")
        if missing:
            end_job(
                f"rank {MPI.COMM_WORLD.Get_rank()} left {how} (rank(s) {missing} did not reach "
                f"their exit within {seconds:g} s); ending the job",
                exit_status(left) if left is not None else 1,
            )
    finally:
        _remove_temporaries()


# ---------------------------------------------------------------- SIGTERM


def _on_sigterm(read_fd=None):
    """SIGTERM while rafi objects are open: end the job after the grace (see the docstring).

    With ``read_fd`` (the helper thread's), a second SIGTERM during the grace means the
    launcher is ending the job already: the rank then dies of it without a word."""
    _remove_temporaries()
    MPI = world()
    place = where_now()
    if MPI is None or not aborts() or not (place or _State.comms):
        _die_of(signal.SIGTERM)  # what it does without rafi
    rank = MPI.COMM_WORLD.Get_rank()
    grace = _SIGTERM_GRACE + _SIGTERM_STAGGER * min(rank, 6)  # of several ranks, the lowest speaks
    if read_fd is None:
        wait_to_be_ended(grace)
    elif _another(read_fd, signal.SIGTERM, grace):
        _die_of(signal.SIGTERM)
    end_job(_line(f"rank {rank} left with SIGTERM", place) + "; ending the job", 143)


def _line(text, place):
    return f"{text} {place}".rstrip()


def _another(read_fd, signum, seconds):
    """Whether ``signum`` arrives again on the wakeup fd within ``seconds``."""
    import select

    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        if select.select([read_fd], [], [], left)[0] and signum in os.read(read_fd, 64):
            return True
    return False


def _die_of(signum):
    """End this process by ``signum``'s default action (from any thread: Python's
    ``signal.signal`` works only in the main thread, libc's anywhere)."""
    import ctypes

    ctypes.CDLL(None).signal(signum, ctypes.c_void_p(0))  # SIG_DFL
    os.kill(os.getpid(), signum)
    time.sleep(5)
    os._exit(128 + signum)


def _sigterm_handler(signum, frame):
    """The Python-level handler: the helper thread does the work, unless it cannot hear; the
    main thread runs none of the user's code meanwhile (as a process killed at once would)."""
    if _State.helper_fd is None or not _helper_hears():
        _on_sigterm()
    else:
        wait_to_be_ended(60)


def _helper_hears():
    try:
        current = signal.set_wakeup_fd(-1)
        signal.set_wakeup_fd(current)
    except ValueError:  # not the main thread
        return True
    return current == _State.helper_fd


def _helper(read_fd):
    """Read the signal numbers Python's C-level handler writes (from any thread, also while
    the main thread waits inside MPI with the GIL released)."""
    while True:
        try:
            data = os.read(read_fd, 64)
        except OSError:
            return
        if signal.SIGTERM in data and signal.getsignal(signal.SIGTERM) is _sigterm_handler:
            _on_sigterm(read_fd)


def _install_sigterm():
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return  # the user's own handler, or rafi's already
    try:
        signal.signal(signal.SIGTERM, _sigterm_handler)
    except ValueError:  # rafi imported outside the main thread: no signal handling
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    try:
        previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    except ValueError:
        previous = None
    if previous != -1:  # someone else reads the wakeup fd: the Python-level handler does it all
        if previous is not None:
            signal.set_wakeup_fd(previous)
        os.close(read_fd)
        os.close(write_fd)
        return
    _State.helper_fd = write_fd
    threading.Thread(target=_helper, args=(read_fd,), name="rafi-sigterm", daemon=True).start()


_sys_exit = sys.exit


def _recording_exit(*status):
    """``sys.exit``, noting its status: a rank that ends with rafi objects open, outside
    their ``with`` blocks, ends the job with that status (at exit Python no longer says it).
    ``raise SystemExit(n)`` and the ``exit()`` builtin are not seen: they end it with 1."""
    _State.exited = SystemExit(*status)
    _sys_exit(*status)


def install():
    """Register the check at exit and the SIGTERM handler (once; ``import rafi`` calls it)."""
    if getattr(install, "done", False):
        return
    install.done = True
    atexit.register(_at_exit)  # mpi4py finalizes MPI after every atexit handler (Py_AtExit)
    _install_sigterm()
    if sys.exit is _sys_exit:
        sys.exit = _recording_exit
