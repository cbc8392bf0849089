"""``device.random``: a counter-based random number generator, the same stream on every backend.

``random(seed, stream, counter)`` is a pure function of its three integers: the
``counter``-th number of stream ``stream`` under ``seed``, uniform in [0, 1) with 53 random
bits. Nothing is stored, so a work item that moves to another rank keeps its stream: key
the stream by the item (a pixel and sample, a particle's id) and the counter by its step,
never by the rank or the thread, and results do not depend on the rank count. The hash is
Wellons' ``lowbias32`` on 32-bit words (arithmetic modulo 2**32 written so that 64-bit
integer math gives the same bits in njit, CUDA and plain Python under the simulator).
"""

from rafi._targets import func

__all__ = ["random"]

_WORD = 4294967296  # 2**32


@func
def _mix32(x):
    """Wellons' lowbias32 on ``x`` in [0, 2**32)."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) % _WORD
    x ^= x >> 15
    x = (x * 0x846CA68B) % _WORD
    x ^= x >> 16
    return x


@func
def _absorb(h, value):
    """Hash the 64-bit integer ``value`` into the state ``h``, low word then high word."""
    value = int(value)
    h = _mix32(h ^ (value % _WORD))
    return _mix32(h ^ ((value // _WORD) % _WORD))


@func
def random(seed, stream, counter):
    """The ``counter``-th uniform number in [0, 1) of stream ``stream`` under ``seed``."""
    h = _absorb(_absorb(_absorb(0x9E3779B9, seed), stream), counter)
    low = _mix32(h ^ 0x5BD1E995)
    return ((h >> 5) * 67108864.0 + (low >> 6)) / 9007199254740992.0
