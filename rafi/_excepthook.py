"""One rank's uncaught exception ends the whole MPI job, and the job says so once.

Without this, a rank that dies of an exception prints its traceback and then waits in
``MPI_Finalize`` (or has already left), while the others wait forever in their next
collective. ``import rafi`` chains a hook to ``sys.excepthook``: it prints the traceback as
before, then one line naming the rank, how it left and where (``rafi: rank 1 left with an
uncaught ValueError (above) during forward() round 4; ending the job``), then calls
``MPI_Abort`` on ``COMM_WORLD`` when MPI runs with more than one rank, so ``mpirun`` or
``srun`` ends every rank at once with a non-zero status (what ``python -m mpi4py`` does,
for scripts run as plain ``python script.py``). ``RAFI_ABORT_ON_EXCEPTION=0`` turns it off
(every rank then prints its own traceback and ends on its own).

One message per job: a rafi error raised on every rank together (marked ``collective``)
would print one traceback per rank. Before such an error leaves a Forwarder's or Reducer's
``with`` block (``gather``, before the collective close), every rank sends its message to
rank 0 of the object's communicator; uncaught, that rank prints its traceback, one line per
other message (``rafi: rank(s) [1, 2] raised instead: ConfigError: ...``) and the line that
ends the job (``rafi: rank(s) [0, 1, 2] raised this OutboxOverflow together during
forward() round 3; ending the job``); the others print nothing and are ended by its abort
(after 5 s without it, each prints its own). ``RankLeft`` (``_departure``) is told by the
rank that closed, as one line with no traceback.

rafi's warnings are issued alike on every rank; only ``COMM_WORLD`` rank 0 shows them
(warnings of category ``RafiWarning``, or whose text starts with ``rafi:``).
"""

import os
import sys
import time
import warnings

from . import _departure, _interrupts
from ._errors import RafiWarning, RankLeft

__all__ = ["gather", "install"]

_REPORT = 28  # tag on a rafi communicator: a rank's message, sent to its rank 0
_GATHER_WAIT = 2.0  # seconds rank 0 waits for the others' messages
_LEADER_WAIT = 5.0  # seconds a rank waits for the abort of the rank that speaks for the job
_TEXT = 2000  # characters of a message sent


class Report:
    """What a collective error's ranks said, as rank 0 of its communicator gathered it.

    Attributes:
        printer: whether this rank speaks for the job.
        groups: ``{message: [world ranks]}`` (on the printer), by their lowest rank.
        where: where the error was raised (``during forward() round 3``).
    """

    def __init__(self, printer, groups=None, where=""):
        self.printer, self.groups, self.where = printer, groups or {}, where


_sent = []  # this rank's messages in flight (their buffers must live until delivered)


def _message(error):
    return f"{type(error).__name__}: {error}"[:_TEXT]


def gather(obj, error):
    """Before a collective ``error`` leaves ``obj`` (a Forwarder or Reducer) and ``obj``
    closes: rank 0 of ``obj``'s communicator learns every rank's message (for ``hook``)."""
    if error is None or getattr(error, "_rafi_report", None) is not None or obj._closed:
        return
    if not _departure.aborts() or _departure.world() is None:
        return
    try:
        error._rafi_report = _gather(obj._comm, error, _where(error, obj))
    except AttributeError:  # an exception type that takes no attributes
        pass


def _gather(comm, error, where):
    from mpi4py import MPI

    me, size = comm.Get_rank(), comm.Get_size()
    mine = (_departure.world_ranks(comm, [me])[0], _message(error))
    if size == 1:
        return Report(True, {mine[1]: [mine[0]]}, where)
    if me != 0:
        _sent.append(comm.isend(mine, dest=0, tag=_REPORT))
        return Report(False, where=where)
    groups, heard = {mine[1]: [mine[0]]}, 1
    status, end = MPI.Status(), time.monotonic() + _GATHER_WAIT
    while heard < size and time.monotonic() < end:
        message = comm.improbe(source=MPI.ANY_SOURCE, tag=_REPORT, status=status)
        if message is None:
            time.sleep(0.001)
            continue
        rank, text = message.recv()
        groups.setdefault(text, []).append(rank)
        heard += 1
    ordered = sorted(groups.items(), key=lambda group: min(group[1]))  # not in arrival order
    return Report(True, {text: sorted(ranks) for text, ranks in ordered}, where)


def _report_from_traceback(error, traceback):
    """For a collective error that left no ``with`` block: gather over the rafi object whose
    method raised it, if it is still open; else rank 0 of it speaks, with what it has."""
    types = _departure.rafi_types()
    found = None
    while traceback is not None:
        candidate = traceback.tb_frame.f_locals.get("self")
        if types and isinstance(candidate, types):
            found = candidate
        traceback = traceback.tb_next
    if found is None:
        return None
    if getattr(found, "_closed", True) is False:
        return _gather(found._comm, error, _where(error, found))
    return Report(getattr(found, "rank", 0) == 0, where=_where(error, found))


def _where(error, obj):
    """Where ``error`` was raised: the call it left (``_forwarder._OneThread``), else where
    ``obj`` is now."""
    return getattr(error, "_rafi_where", None) or _departure.where(obj)


def _line(text, where):
    return f"{text} {where}".rstrip()


def _speak_and_end(kind, value, traceback, previous):
    """What the hook does where MPI runs with several ranks and aborts are on."""
    if isinstance(value, RankLeft):  # one line, from the lowest rank that closed
        if not value.printer:
            _departure.wait_to_be_ended(_LEADER_WAIT)
        _departure.end_job(f"{value}; ending the job")
        return
    report = getattr(value, "_rafi_report", None)
    if report is None and getattr(value, "collective", False):
        report = _report_from_traceback(value, traceback)
    if report is not None and not report.printer:
        _departure.wait_to_be_ended(_LEADER_WAIT)  # the rank that speaks ends the job...
        report = None  # ...or, after this long without it, this one does
    previous(kind, value, traceback)
    status = _departure.exit_status(value)
    if report is None:
        me = _departure.world().COMM_WORLD.Get_rank()
        where = getattr(value, "_rafi_where", None)
        where = _departure.where_now() if where is None else where
        line = _line(f"rank {me} left with {_departure.how_left(value)} (above)", where)
        _departure.end_job(
            f"{line}; ending the job (RAFI_ABORT_ON_EXCEPTION=0 leaves the other ranks running)", status
        )
        return
    mine = _message(value)
    for text, ranks in report.groups.items():
        if text != mine:
            sys.stderr.write(f"rafi: rank(s) {ranks} raised instead: {text}\n")
    ranks = sorted(r for group in report.groups.values() for r in group)
    who = f"rank(s) {ranks}" if ranks else "every rank"  # unknown where the object is gone
    line = _line(f"{who} raised this {type(value).__name__} together", report.where)
    _departure.end_job(f"{line}; ending the job", status)


def install():
    """Chain rafi's hook to ``sys.excepthook`` and ``warnings.showwarning``, and install
    ``_departure``'s check at exit and SIGTERM handler and ``_interrupts``' SIGINT handler
    (once)."""
    _departure.install()
    _interrupts.install()
    _install_warnings()
    previous = sys.excepthook
    if getattr(previous, "rafi", False):
        return

    def hook(kind, value, traceback):
        if not _departure.aborts() or _departure.world() is None:
            previous(kind, value, traceback)
            return
        _speak_and_end(kind, value, traceback, previous)

    hook.rafi = True
    sys.excepthook = hook


def _first_rank():
    """Whether this process is ``COMM_WORLD`` rank 0 (or runs without MPI)."""
    MPI = sys.modules.get("mpi4py.MPI")
    if MPI is not None and MPI.Is_initialized() and not MPI.Is_finalized():
        return MPI.COMM_WORLD.Get_rank() == 0
    for name in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"):
        if name in os.environ:
            return os.environ[name] == "0"
    return True


def _install_warnings():
    previous = warnings.showwarning
    if getattr(previous, "rafi", False):
        return

    def show(message, category, filename, lineno, file=None, line=None):
        ours = issubclass(category, RafiWarning) or str(message).startswith("rafi:")
        if ours and not _first_rank():
            return
        previous(message, category, filename, lineno, file, line)

    show.rafi = True
    warnings.showwarning = show
