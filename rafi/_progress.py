"""Who completes the asynchronous engine's messages: the loop itself, or a progress thread.

``poll``: ``batches()`` tests its channels once per turn and, when nothing happened, sleeps
a little longer each time (the mpi4py.futures idiom). Messages move only while the rank is
inside ``batches()``; while the user's kernel runs, arrivals wait in MPI.

``thread``: a daemon thread tests the channels all the time, so payloads and
acknowledgements complete while the user's kernel runs (and MPI's rendezvous protocol of
larger messages advances), and an idle loop wakes as soon as something arrives instead of
sleeping. Needs ``MPI_THREAD_MULTIPLE`` (the user's thread may call MPI meanwhile); every
use of the channels holds one lock. A kernel releases Python's lock while it runs (cpu
kernels are compiled ``nogil``, a GPU wait releases it), which is when the thread works.
"""

import threading

from ._config import PROGRESS, env_choice
from ._errors import ConfigError
from ._liveness import Backoff

__all__ = ["choose_progress", "make_progress"]

# What "auto" means (bench/RESULTS.md, "Asynchronous mode"): polling measured faster or equal
# on both backends but for the GPU's most unbalanced workload (the thread 1.16x faster there);
# the thread contends for Python's lock with a loop that launches kernels.
DEFAULT = "poll"
_BACKOFF_MAX = 1e-4


class _Poll:
    """Progress by the loop: ``poll`` tests the channels; ``idle`` backs off."""

    name = "poll"

    def __init__(self, channels):
        self._channels = channels
        self._backoff = Backoff(_BACKOFF_MAX)
        self.lock = threading.Lock()  # uncontended: only the loop's thread takes it

    def poll(self):
        with self.lock:
            moved = self._channels.poll()
        if moved:
            self._backoff.reset()
        return moved

    def idle(self):
        self._backoff.sleep()

    def close(self):
        pass


class _Thread:
    """Progress by a daemon thread; ``poll`` reports (and clears) what it completed."""

    name = "thread"

    def __init__(self, channels):
        self._channels = channels
        self.lock = threading.Lock()
        self._arrived = threading.Event()
        self._stop = threading.Event()
        self._moved = 0
        self._error = None
        self._thread = threading.Thread(target=self._run, name="rafi-progress", daemon=True)
        self._thread.start()

    def _run(self):
        backoff = Backoff(_BACKOFF_MAX)
        try:
            while not self._stop.is_set():
                with self.lock:
                    moved = self._channels.poll()
                    self._moved += moved
                if moved:
                    self._arrived.set()
                    backoff.reset()
                else:
                    backoff.sleep()
        except BaseException as exc:  # handed to the loop's thread, raised by its next poll
            self._error = exc
            self._arrived.set()

    def poll(self):
        if self._error is not None:
            raise self._error
        with self.lock:
            moved, self._moved = self._moved, 0
        self._arrived.clear()
        return moved

    def idle(self):
        self._arrived.wait(_BACKOFF_MAX)

    def close(self):
        self._stop.set()
        self._thread.join()


def choose_progress(requested, mode):
    """Resolve ``progress`` (and ``RAFI_PROGRESS``) to ``"poll"`` or ``"thread"`` for ``mode``;
    ``None`` for ``mode="bsp"``.

    Raises:
        ConfigError: an unknown name, a progress engine asked of ``mode="bsp"``, or
            ``"thread"`` where MPI did not grant ``MPI_THREAD_MULTIPLE``.
    """
    if requested not in PROGRESS:
        raise ConfigError(f"progress={requested!r} is not one of {', '.join(PROGRESS)}")
    if mode != "async":
        if requested != "auto":
            raise ConfigError(f"progress={requested!r} is for mode='async'; rounds make their own progress")
        return None
    name = env_choice("PROGRESS", requested)
    if name == "auto":
        name = DEFAULT
    if name == "thread":
        from mpi4py import MPI

        if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
            raise ConfigError(
                "progress='thread' needs MPI_THREAD_MULTIPLE, which this MPI did not grant "
                "(mpi4py.rc.thread_level); use progress='poll'"
            )
    return name


def make_progress(name, channels):
    """The progress engine ``name`` (``"poll"`` or ``"thread"``) over ``channels``."""
    return (_Thread if name == "thread" else _Poll)(channels)
