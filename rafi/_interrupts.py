"""Ctrl-C held back while rafi does something that must not be cut in two.

``fwd.run()`` launches its step over the inbox and then marks the inbox consumed; a
``KeyboardInterrupt`` between the two would leave items stepped but not consumed, and the
next ``run()`` would step them again. ``deferred()`` blocks ``SIGINT`` in the main thread
for the duration of its block (two ``pthread_sigmask`` calls, a microsecond); a Ctrl-C
that came meanwhile is delivered when the block ends, and Python raises its
``KeyboardInterrupt`` right after. Elsewhere (another thread, a system without
``pthread_sigmask``) it does nothing.
"""

import signal
import threading

__all__ = ["deferred"]

_HOLD = {signal.SIGINT}


class deferred:
    """``with deferred():`` holds ``SIGINT`` back until the block ends."""

    __slots__ = ("_held",)

    def __enter__(self):
        self._held = None
        if threading.current_thread() is threading.main_thread() and hasattr(signal, "pthread_sigmask"):
            self._held = signal.pthread_sigmask(signal.SIG_BLOCK, _HOLD)
        return self

    def __exit__(self, *exc):
        if self._held is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, self._held)
        return False
