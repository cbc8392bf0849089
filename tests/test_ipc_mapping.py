"""A peer's allocation is mapped once per process, however many forwarders map it; a mapping
of an allocation its owner has freed and replaced is given up before the new one is mapped."""

from rafi._transports import _ipc


class _Runtime:
    """Stands in for CuPy's runtime: maps a handle to an address, refuses a second mapping
    of one handle, and of a new allocation where a mapped one of its owner lay (handles
    here are ``pid@base:name``; an allocator gives a freed address out again)."""

    def __init__(self):
        self.mapped, self.closed = {}, []

    def getDevice(self):
        return 0

    def ipcOpenMemHandle(self, handle):
        place = handle.split(b":")[0]
        if handle in self.mapped or any(h.split(b":")[0] == place for h in self.mapped):
            raise RuntimeError("cudaErrorAlreadyMapped: resource already mapped")
        self.mapped[handle] = 0x1000 * (len(self.mapped) + len(self.closed) + 1)
        return self.mapped[handle]

    def ipcCloseMemHandle(self, address):
        handle = next(h for h, a in self.mapped.items() if a == address)
        del self.mapped[handle]
        self.closed.append(handle)


def test_two_users_share_one_mapping_until_the_last_closes():
    runtime = _Runtime()
    first, key = _ipc._open(runtime, b"7@100:block", (7, 0x100))
    second, _ = _ipc._open(runtime, b"7@100:block", (7, 0x100))  # a second forwarder sees the same allocation
    assert first == second and list(runtime.mapped) == [b"7@100:block"]
    _ipc._close(runtime, key)
    assert runtime.mapped and not runtime.closed  # the other forwarder still reads it
    _ipc._close(runtime, key)
    assert not runtime.mapped and runtime.closed == [b"7@100:block"]
    again, key = _ipc._open(runtime, b"7@100:block", (7, 0x100))
    assert again != first  # mapped afresh
    _ipc._close(runtime, key)
    assert not _ipc._mapped and not _ipc._owners


def test_a_freed_and_replaced_allocation_is_mapped_afresh():
    """A forwarder left without its collective close keeps its mapping; the peer frees the
    allocation and gets its address again for a new one, with a new handle: the new
    forwarder maps it (the stale mapping goes first), and the old one's late close is
    harmless."""
    runtime = _Runtime()
    _, dropped = _ipc._open(runtime, b"7@100:old", (7, 0x100))
    other, kept = _ipc._open(runtime, b"8@100:old", (8, 0x100))  # another peer, the same address
    address, key = _ipc._open(runtime, b"7@100:new", (7, 0x100))
    assert runtime.closed == [b"7@100:old"] and set(runtime.mapped) == {b"8@100:old", b"7@100:new"}
    _ipc._close(runtime, dropped)
    assert set(runtime.mapped) == {b"8@100:old", b"7@100:new"}
    _ipc._close(runtime, key)
    _ipc._close(runtime, kept)
    assert not runtime.mapped and not _ipc._mapped and not _ipc._owners
