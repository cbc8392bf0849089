"""Ctrl-C held back while rafi does something that must not be cut in two.

``fwd.run()`` launches its step over the inbox and then marks the inbox consumed; a
``KeyboardInterrupt`` between the two would leave items stepped but not consumed, and the
next ``run()`` would step them again. ``import rafi`` puts its own ``SIGINT`` handler in
place of Python's default one (``install``; a handler of the user's stays): it raises
``KeyboardInterrupt`` as the default does, except inside a ``deferred()`` block, where it
only notes the signal, and the block raises it as it ends. Entering and leaving a block
costs a counter's update, so it guards every round.

Neither a signal mask (the operating system gives a signal sent to the process to any
thread that does not block it, and Python then raises it in the main thread at once) nor
setting a handler around each block (10 us a block) would do.
"""

import signal
import threading

__all__ = ["deferred", "install"]


class _State:
    depth = 0  # deferred() blocks the main thread is in
    pending = False  # a SIGINT came inside one


def _handler(signum, frame):
    if _State.depth:
        _State.pending = True
        return
    raise KeyboardInterrupt


class deferred:
    """``with deferred():`` holds ``SIGINT`` back until the block ends (in the main thread,
    where Python runs signal handlers; elsewhere, and under a user's own handler, nothing)."""

    __slots__ = ("_main",)

    def __enter__(self):
        self._main = threading.current_thread() is threading.main_thread()
        if self._main:
            _State.depth += 1
        return self

    def __exit__(self, *exc):
        if self._main:
            _State.depth -= 1
            if _State.pending and not _State.depth:
                _State.pending = False
                raise KeyboardInterrupt
        return False


def install():
    """Put rafi's handler on ``SIGINT`` where Python's default is (once; ``import rafi``)."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _handler)
