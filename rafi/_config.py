"""All of rafi's configuration: the ``RAFI_*`` environment variables, read in one place."""

import operator
import os

import numpy as np

from ._errors import ConfigError

__all__ = [
    "BACKENDS",
    "PROGRESS",
    "TRANSPORTS",
    "as_count",
    "per_rank",
    "size_text",
    "check_environment",
    "env_boundscheck",
    "env_choice",
    "env_node_size",
    "env_node_stores",
    "env_timeout",
]

BACKENDS = ("auto", "cuda", "cpu")
TRANSPORTS = ("auto", "host", "cuda-aware", "ipc", "shm", "nccl")
PROGRESS = ("auto", "poll", "thread")  # who completes mode="async" messages (_progress)

# Every variable rafi reads, with its allowed values (None: any value).
_KNOWN = {
    "RAFI_BACKEND": BACKENDS[1:],
    "RAFI_TRANSPORT": TRANSPORTS[1:],
    "RAFI_PROGRESS": PROGRESS[1:],
    "RAFI_EXCHANGE": ("dense", "sparse"),
    "RAFI_TIMEOUT": None,  # seconds, checked by env_timeout
    "RAFI_ABORT_ON_EXCEPTION": ("0", "1"),  # read by _excepthook and _departure
    "RAFI_EXIT_WAIT": None,  # seconds a rank leaving with rafi objects open waits for the others (_departure)
    "RAFI_CACHE": ("0", "1"),  # read by _kernel_cache
    "RAFI_CACHE_DIR": None,
    "RAFI_NODE_SIZE": None,  # ranks per emulated node, checked by env_node_size
    "RAFI_BOUNDSCHECK": ("0", "1"),  # index checks in cpu kernels (_kernel), read by env_boundscheck
    "RAFI_NODE_STORES": ("cached", "streaming"),  # resident stores to node peers (cpu): env_node_stores
}


def as_count(value):
    """``value`` as a count (an ``int``: items, entries), or None when it is not a
    non-negative integer. Python and numpy integers (and 0-d integer arrays) are; ``bool``,
    floats (even 3.0), strings, sequences and arrays of more elements are not."""
    if isinstance(value, (bool, np.bool_)):
        return None
    try:
        count = operator.index(value)
    except TypeError:
        return None
    return count if count >= 0 else None


def size_text(nbytes):
    """``nbytes`` as a message says it: bytes, KiB, MiB, GiB, TiB or PiB."""
    value, unit = float(nbytes), "bytes"
    for bigger in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{int(value)} bytes" if unit == "bytes" else f"{value:.1f} {unit}"


def describe(value):
    """``value`` for a message about a bad argument: its repr, or an array's shape and dtype."""
    if np.ndim(value) > 0 and hasattr(value, "dtype"):
        return f"an array of shape {np.shape(value)} and dtype {value.dtype}"
    return repr(value)


def check_environment(environ=None):
    """Reject misspelt ``RAFI_*`` variables and bad values, naming them.

    Raises:
        ConfigError: a ``RAFI_`` variable is unknown or has a value rafi does not accept.
    """
    environ = os.environ if environ is None else environ
    for name, value in environ.items():
        if not name.startswith("RAFI_"):
            continue
        if name not in _KNOWN:
            raise ConfigError(
                f"unknown environment variable {name}={value!r}; rafi reads {', '.join(sorted(_KNOWN))}"
            )
        allowed = _KNOWN[name]
        if allowed is not None and value not in allowed:
            raise ConfigError(f"{name}={value!r} is not one of {', '.join(allowed)}")


def env_choice(name, requested, environ=None):
    """Return ``requested``, or the value of ``RAFI_<name>`` when ``requested`` is ``"auto"``.

    Args:
        name: the variable's suffix, e.g. ``"BACKEND"``.
        requested: what the caller asked for.
    """
    environ = os.environ if environ is None else environ
    check_environment(environ)
    if requested == "auto":
        return environ.get(f"RAFI_{name}", "auto")
    return requested


def _seconds(value, what):
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = float("nan")
    if isinstance(value, bool) or not seconds > 0:
        raise ConfigError(f"{what}={value!r} is not a positive number of seconds (or None for no deadline)")
    return seconds


def env_timeout(timeout, environ=None):
    """Return the deadline in seconds for rafi's collectives: ``timeout``, else ``RAFI_TIMEOUT``,
    else None (wait as long as it takes).

    Raises:
        ConfigError: either is not a positive number.
    """
    environ = os.environ if environ is None else environ
    check_environment(environ)
    if timeout is not None:
        return _seconds(timeout, "timeout")
    if environ.get("RAFI_TIMEOUT"):
        return _seconds(environ["RAFI_TIMEOUT"], "RAFI_TIMEOUT")
    return None


def env_boundscheck(environ=None):
    """Return whether ``RAFI_BOUNDSCHECK=1`` asks for checked indexing in the cpu backend's
    kernels: numba's ``boundscheck`` for every ``@rafi.kernel`` body and its launcher, so
    that an index out of bounds raises ``IndexError`` instead of writing past an array
    (which may crash the rank). Slower; for finding such a bug. Checks this variable only.

    Raises:
        ConfigError: it is set to something else than 0 or 1.
    """
    environ = os.environ if environ is None else environ
    value = environ.get("RAFI_BOUNDSCHECK", "0")
    if value not in _KNOWN["RAFI_BOUNDSCHECK"]:
        raise ConfigError(f"RAFI_BOUNDSCHECK={value!r} is not one of 0, 1")
    return value == "1"


def env_node_size(environ=None):
    """Return ``RAFI_NODE_SIZE`` (ranks per emulated node, for tests of mixed intra- and
    inter-node paths on one machine) as an int, or None when it is unset or empty.

    Checks this variable only (``node_comm`` asks it where the others may not matter, as in
    ``python -m rafi``'s report).

    Raises:
        ConfigError: it is not a positive integer.
    """
    environ = os.environ if environ is None else environ
    value = environ.get("RAFI_NODE_SIZE", "").strip()
    if not value:
        return None
    if not value.isdecimal() or int(value) < 1:
        raise ConfigError(
            f"RAFI_NODE_SIZE={environ['RAFI_NODE_SIZE']!r} is not a positive integer (ranks per emulated "
            "node); unset it to group ranks by their real node"
        )
    return int(value)


def env_node_stores(environ=None):
    """Return ``RAFI_NODE_STORES`` (``cached`` or ``streaming``: the stores that carry resident
    rounds' items to the node's other ranks on the cpu backend), or ``"auto"`` when unset
    (a probe chooses: rafi/_transports/_node_stores.py). Checks this variable only.

    Raises:
        ConfigError: it is set to something else.
    """
    environ = os.environ if environ is None else environ
    value = environ.get("RAFI_NODE_STORES", "").strip() or "auto"
    if value != "auto" and value not in _KNOWN["RAFI_NODE_STORES"]:
        raise ConfigError(f"RAFI_NODE_STORES={environ['RAFI_NODE_STORES']!r} is not one of cached, streaming")
    return value


def per_rank(said):
    """``said`` (one message or None per rank) as one text, each message once with the
    ranks that said it: ``rank 1: X`` or ``ranks 0, 1: X``, joined by ``; ``."""
    ranks = {}
    for rank, message in enumerate(said):
        if message:
            ranks.setdefault(message, []).append(rank)
    return "; ".join(f"rank{'s' * (len(rs) > 1)} {', '.join(map(str, rs))}: {m}" for m, rs in ranks.items())
