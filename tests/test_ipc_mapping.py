"""A peer's allocation is mapped once per process, however many forwarders map it; a mapping
of an allocation its owner has freed and replaced is given up before the new one is mapped."""

import pytest

from rafi._transports import _ipc

# handle -> (owner process, start, end): what a peer exports with it
RANGES = {
    b"block": (7, 0x100, 0x200),
    b"old": (7, 0x100, 0x300),
    b"new": (7, 0x200, 0x280),  # inside the freed b"old"
    b"apart": (7, 0x300, 0x400),  # next to it
    b"elsewhere": (8, 0x100, 0x300),  # another process, the same addresses
}


class _Runtime:
    """Stands in for CuPy's runtime: maps a handle to an address, refuses a second mapping
    of one handle, and one of a new allocation whose range overlaps a mapped, since freed,
    one of its owner (an allocator gives freed addresses out again)."""

    def __init__(self):
        self.mapped, self.closed, self.synchronized = {}, [], []

    def deviceSynchronize(self):
        self.synchronized.append(len(self.closed))  # how many were closed before it

    def getDevice(self):
        return 0

    def ipcOpenMemHandle(self, handle):
        pid, start, end = RANGES[handle]
        overlaps = (RANGES[h][0] == pid and start < RANGES[h][2] and RANGES[h][1] < end for h in self.mapped)
        if handle in self.mapped or any(overlaps):
            raise RuntimeError("cudaErrorAlreadyMapped: resource already mapped")
        self.mapped[handle] = 0x1000 * (len(self.mapped) + len(self.closed) + 1)
        return self.mapped[handle]

    def ipcCloseMemHandle(self, address):
        handle = next(h for h, a in self.mapped.items() if a == address)
        del self.mapped[handle]
        self.closed.append(handle)


def test_two_users_share_one_mapping_until_the_last_closes():
    runtime = _Runtime()
    first, key = _ipc._open(runtime, b"block", RANGES[b"block"])
    second, _ = _ipc._open(runtime, b"block", RANGES[b"block"])  # a second forwarder sees the same allocation
    assert first == second and list(runtime.mapped) == [b"block"]
    _ipc._close(runtime, key)
    assert runtime.mapped and not runtime.closed  # the other forwarder still reads it
    _ipc._close(runtime, key)
    assert not runtime.mapped and runtime.closed == [b"block"]
    again, key = _ipc._open(runtime, b"block", RANGES[b"block"])
    assert again != first  # mapped afresh
    _ipc._close(runtime, key)
    assert not _ipc._mapped


def test_a_freed_and_replaced_allocation_is_mapped_afresh():
    """A forwarder left without its collective close keeps its mapping; the peer frees the
    allocation and gets some of its addresses again for a new one, with a new handle: the
    new forwarder maps it (the stale mapping goes first; others of the same owner and
    other owners' stay), and the old one's late close is harmless."""
    runtime = _Runtime()
    _, dropped = _ipc._open(runtime, b"old", RANGES[b"old"])
    _, other = _ipc._open(runtime, b"elsewhere", RANGES[b"elsewhere"])
    _, new = _ipc._open(runtime, b"new", RANGES[b"new"])
    assert runtime.closed == [b"old"] and set(runtime.mapped) == {b"elsewhere", b"new"}
    assert runtime.synchronized == [0]  # the device finished with it first
    _, apart = _ipc._open(runtime, b"apart", RANGES[b"apart"])
    assert set(runtime.mapped) == {b"elsewhere", b"new", b"apart"}
    _ipc._close(runtime, dropped)
    assert set(runtime.mapped) == {b"elsewhere", b"new", b"apart"}
    for key in (new, other, apart):
        _ipc._close(runtime, key)
    assert not runtime.mapped and not _ipc._mapped


def test_a_refusal_with_nothing_stale_is_raised():
    """The driver's refusal reaches the caller when no mapping here explains it."""
    runtime = _Runtime()
    runtime.mapped[b"block"] = 0x9000  # mapped behind rafi's back
    with pytest.raises(RuntimeError, match="AlreadyMapped"):
        _ipc._open(runtime, b"block", RANGES[b"block"])
    assert not _ipc._mapped and not runtime.synchronized
