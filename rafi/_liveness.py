"""Deadlines for rafi's collectives, and the census that names the ranks that did not arrive.

Every wait of a rafi call on other ranks goes through a ``Watch`` (one per rafi
communicator: a forwarder's, a reducer's): it tests the requests, backs off while nothing
happens (so a waiting rank does not burn a core), answers other ranks' census questions,
and, when the deadline (``timeout`` seconds, ``RAFI_TIMEOUT``) passes, runs a census and
raises ``CollectiveTimeout``. Where no rank of the communicator has a deadline, nobody
asks there, and ``Watch.collective`` runs MPI's blocking collective instead.

The census: the rank that timed out asks every other rank of the communicator what it is
doing; a rank answers while it waits inside any rafi call (any ``Watch`` of its process
answers for all of them, with what the process waits in), so the ranks that do not answer
within a grace period are those that never arrived: busy in their own code, blocked
elsewhere, or dead. Before it raises, a rank goes on answering until every rank that
answered it has asked in turn (or the grace period ends): those wait too and will time
out a moment later, and must not find it gone. The answers say where the others wait,
which shows a mismatch (one rank in ``Reducer.flush()``, the others in ``forward()``). A
communicator whose watch timed out is not used again: its owner refuses further calls.
"""

import os
import threading
import time
import weakref

import numpy as np

from ._config import env_timeout
from ._errors import CollectiveTimeout, ConfigError

__all__ = ["Backoff", "KEPT", "Watch", "activity", "service", "until", "wait", "watch_of", "watched_dup"]

_ASK, _ANSWER = 31, 32  # tags on the watched communicator (rafi's own duplicate)
_TEXT = 160  # bytes of an answer
_GRACE = 1.0  # seconds a census waits for answers
_SPIN = 5e-5  # seconds a wait tests without sleeping (most rounds complete within it)
_YIELD = 5e-3  # seconds it then tests between yields of the core, before it sleeps

_watches = weakref.WeakSet()
# What closing must not free, kept for the life of the process: communicators with messages
# in flight, and the state of forwarders and reducers left by an error or a timeout (peers
# may still read their buffers or send to their communicators).
KEPT = []
_doing = threading.local()  # what this thread waits in, for census answers


class Backoff:
    """Test without pause for a moment, then yield the core to any process that wants it for
    a few milliseconds more, then sleep a little longer each time, up to ``longest`` seconds
    (the mpi4py.futures idiom): fast when the answer is near, idle when it is not. Yielding
    first matters with many ranks: the last of 16 arrives some 100 us after the first, and a
    sleep, which the kernel rounds up to tens of microseconds or more, would add to every
    round what a yield (which returns at once on an idle core) does not."""

    def __init__(self, longest=1e-3):
        self._longest = longest
        self.reset()

    def reset(self):
        self._delay = 0.0
        self._spin_until = None

    def sleep(self):
        now = time.perf_counter()
        if self._spin_until is None:
            self._spin_until = now + _SPIN
        if now < self._spin_until:
            return
        if now < self._spin_until + _YIELD:
            os.sched_yield()
            return
        time.sleep(self._delay)
        self._delay = min(self._longest, max(1e-5, 2 * self._delay))


def service(what=None):
    """Answer the census questions of every rafi communicator of this process, saying that
    it waits in ``what`` (default: the wait it is in)."""
    for watch in list(_watches):
        watch.answer(what)


def watch_of(comm):
    """The ``Watch`` of the rafi communicator ``comm`` (a forwarder's or a reducer's own
    duplicate, the very object), or None: helpers given only a communicator (``node_comm``,
    ``agree_on_failure``) then wait under its owner's deadline."""
    for watch in list(_watches):
        if watch._comm is comm:
            return watch
    return None


def activity():
    """What this process waits in right now, as a census answer says it."""
    return getattr(_doing, "what", None) or "rafi, between calls"


def wait(requests, what, timeout=None, census=None):
    """Complete ``requests`` (a list of MPI requests), answering census questions meanwhile.

    Args:
        what: the call that waits, as messages and census answers say it.
        timeout: seconds before ``CollectiveTimeout``; None waits as long as it takes.
        census: ``census(what, seconds)`` returns the error that names the absent ranks;
            without one (no rafi communicator exists yet) the error cannot name them.
    """
    from mpi4py import MPI

    until(lambda: MPI.Request.Testall(requests), what, timeout, census)


def until(done, what, timeout=None, census=None):
    """Call ``done()`` until it returns True, answering census questions and backing off
    in between; the deadline and ``census`` as for ``wait``."""
    if done():
        return
    started, backoff = time.perf_counter(), Backoff()
    outer, _doing.what = getattr(_doing, "what", None), what
    try:
        while not done():
            service()
            waited = time.perf_counter() - started
            if timeout is not None and waited > timeout:
                raise census(what, waited) if census else _unnamed(what, waited, timeout)
            backoff.sleep()
    finally:
        _doing.what = outer


def _unnamed(what, waited, timeout):
    return CollectiveTimeout(
        f"waited {waited:.1f} s (timeout {timeout:g} s) in {what}: not every rank arrived (rafi "
        "cannot name them here: the communicator is being made)",
        missing=None,
        waiting={},
        seconds=waited,
        what=what,
    )


def watched_dup(comm, owner, timeout):
    """``owner``'s own duplicate of ``comm`` and its ``Watch`` (collective; the duplication
    itself waits under the deadline): ``(dup, watch, refused)``. ``refused`` says why this
    rank's ``timeout`` (the argument or ``RAFI_TIMEOUT``) was refused, or is None: the owner's
    setup tells every rank (raised here, on this rank alone, the others would wait); the watch
    then has no deadline on this rank."""
    try:
        timeout, refused = env_timeout(timeout), None
    except ConfigError as exc:
        timeout, refused = None, str(exc)
    dup, made = comm.Idup()
    wait([made], f"{owner}() (making its communicator)", timeout)
    return dup, Watch(dup, timeout, resolved=True), refused


class Watch:
    """Deadline and census for the rafi communicator ``comm``; collective: its ranks learn
    whether any of them has a deadline (``asked``, as only such a rank asks a census).

    Args:
        comm: the owner's own duplicate communicator (census questions use tags 31 and 32).
        timeout: seconds a wait may last, ``None`` for no deadline (``RAFI_TIMEOUT`` then
            applies when set).
        resolved: ``timeout`` is final (``env_timeout`` already read the environment, or
            refused it on this rank, which the owner then tells every rank).
    """

    def __init__(self, comm, timeout=None, resolved=False):
        from mpi4py import MPI

        self._MPI = MPI
        self._comm = comm
        self.timeout = timeout if resolved else env_timeout(timeout)
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        deadlines = np.array([self.timeout is not None], np.int64)
        made = comm.Iallreduce(MPI.IN_PLACE, deadlines, op=MPI.MAX)
        wait([made], "making a rafi communicator", self.timeout)
        self.asked = bool(deadlines[0])  # whether any rank of ``comm`` may ask this one
        self._question = np.zeros(1, np.int64)  # received (its content does not matter)
        self._ask = np.zeros(1, np.int64)  # sent
        self._asked = comm.Irecv(self._question, source=MPI.ANY_SOURCE, tag=_ASK)
        self._replies = []  # answers sent, kept until complete
        self._askers = set()  # ranks whose census this watch answered
        self.broken = None  # the CollectiveTimeout that ended this communicator's use
        _watches.add(self)

    def wait(self, requests, what):
        """Complete ``requests`` (a list of MPI requests) or raise ``CollectiveTimeout``."""
        wait(requests, what, self.timeout, self._census)

    def until(self, done, what):
        """Call ``done()`` until it returns True, or raise ``CollectiveTimeout``."""
        until(done, what, self.timeout, self._census)

    def collective(self, name, *args, what, comm=None):
        """Run the MPI collective ``name`` (``"Alltoall"``, ``"Barrier"``, ...) with ``args`` on
        ``comm`` (the watched communicator, or a part of it), under the deadline.

        Where no rank of the watched communicator has a deadline (``asked`` is false on all
        of them alike), none can ask a census, and the blocking collective runs: MPI's tuned
        algorithm, where the nonblocking one advances a step per test (an ``Alltoall`` of
        16 ranks on the GPU machine: 10.7 us, its ``Ialltoall`` 19-20 us however it waits).
        A wait there cannot answer another communicator's census (its error then names
        this rank as absent), which a deadline on this one restores.
        """
        comm = self._comm if comm is None else comm
        if self.broken is not None:  # timed out: its requests are left pending, a new one would meet them
            raise self.broken
        if not self.asked:
            getattr(comm, name)(*args)
        else:
            self.wait([getattr(comm, "I" + name.lower())(*args)], what)

    def allreduce(self, value, what, op=None):
        """The sum (or ``op``) of the integer ``value`` over all ranks, under the deadline."""
        MPI = self._MPI
        total = np.array([value], np.int64)
        self.collective("Allreduce", MPI.IN_PLACE, total, op or MPI.SUM, what=what)
        return int(total[0])

    def allgather(self, value, what, comm=None):
        """Every rank's ``value`` (any picklable object), in rank order, from every rank of
        ``comm`` (the watched communicator, or a part of it), under the deadline: the
        lowercase ``comm.allgather``, whose blocking wait no deadline reaches, as two
        collectives (the sizes, then the pickled bytes)."""
        import pickle

        comm = self._comm if comm is None else comm
        if not self.asked:
            return comm.allgather(value)
        MPI = self._MPI
        mine = np.frombuffer(pickle.dumps(value), np.uint8)
        sizes = np.zeros(comm.Get_size(), np.int64)
        self.collective("Allgather", np.array([mine.size], np.int64), sizes, what=what, comm=comm)
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        everyone = np.empty(int(sizes.sum()), np.uint8)
        received = [everyone, (sizes.tolist(), starts.tolist()), MPI.BYTE]
        self.collective("Allgatherv", [mine, MPI.BYTE], received, what=what, comm=comm)
        return [pickle.loads(everyone[s : s + n].tobytes()) for s, n in zip(starts, sizes)]

    def check(self, since, what):
        """Raise ``CollectiveTimeout`` if a wait that began at ``since`` has outlasted the deadline."""
        waited = time.perf_counter() - since
        if self.timeout is not None and waited > self.timeout:
            raise self._census(what, waited)

    def answer(self, what=None):
        """Answer the census questions that have arrived: this process waits in ``what``."""
        MPI = self._MPI
        status = MPI.Status()
        while self._asked != MPI.REQUEST_NULL and self._asked.Test(status):
            self._askers.add(status.Get_source())
            text = (what or activity()).encode()[:_TEXT].ljust(_TEXT)
            text = np.frombuffer(text, np.uint8).copy()
            self._replies.append((text, self._comm.Isend(text, dest=status.Get_source(), tag=_ANSWER)))
            self._asked = self._comm.Irecv(self._question, source=MPI.ANY_SOURCE, tag=_ASK)
        self._replies = [(t, r) for t, r in self._replies if not r.Test()]

    def _census(self, what, waited):
        """Ask every other rank where it waits; return the error naming those that did not answer."""
        MPI, comm = self._MPI, self._comm
        others = [r for r in range(self.size) if r != self.rank]
        answers = np.zeros((self.size, _TEXT), np.uint8)
        asks = [comm.Isend(self._ask, dest=r, tag=_ASK) for r in others]
        pending = {r: comm.Irecv(answers[r], source=r, tag=_ANSWER) for r in others}
        present, backoff = {}, Backoff()
        end = time.perf_counter() + min(_GRACE, max(self.timeout, 0.1))
        while pending and time.perf_counter() < end:
            service(f"{what} (timed out)")
            for r, request in list(pending.items()):
                if request.Test():
                    present[r] = bytes(answers[r]).decode(errors="replace").rstrip()
                    del pending[r]
            backoff.sleep()
        end = time.perf_counter() + _GRACE
        while not set(present) <= self._askers and time.perf_counter() < end:
            service(f"{what} (timed out)")  # the ranks still waiting will ask soon: answer them
            backoff.sleep()
        for request in asks + list(pending.values()):  # left to MPI: the communicator is not used again
            if request != MPI.REQUEST_NULL:
                request.Free()
        missing = sorted(pending)
        where = "; ".join(f"rank {r} in {text}" for r, text in sorted(present.items()))
        self.broken = CollectiveTimeout(
            f"rank {self.rank} waited {waited:.1f} s (timeout {self.timeout:g} s) in {what} for "
            f"rank(s) {missing or '(none: every rank answered)'}, which "
            f"{'is' if len(missing) == 1 else 'are'} not waiting in any rafi call"
            + (f"; the others wait: {where}" if where else "")
            + ". Set a larger timeout (Forwarder(timeout=...), RAFI_TIMEOUT) if they are only slow",
            missing=missing,
            waiting=present,
            seconds=waited,
            what=what,
        )
        return self.broken

    def close(self):
        """Stop answering (local); called before the owner frees ``comm``."""
        _watches.discard(self)
        MPI = self._MPI
        if self._asked != MPI.REQUEST_NULL:
            self._asked.Cancel()
            self._asked.Wait()
        for _, request in self._replies:
            request.Wait()
        self._replies = []
