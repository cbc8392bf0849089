"""A peer's allocation is mapped once per process, however many forwarders map it."""

from rafi._transports import _ipc


class _Runtime:
    """Stands in for CuPy's runtime: maps a handle to an address, refuses a second mapping."""

    def __init__(self):
        self.mapped, self.closed = {}, []

    def getDevice(self):
        return 0

    def ipcOpenMemHandle(self, handle):
        if handle in self.mapped:
            raise RuntimeError("cudaErrorAlreadyMapped: resource already mapped")
        self.mapped[handle] = 0x1000 * (len(self.mapped) + len(self.closed) + 1)
        return self.mapped[handle]

    def ipcCloseMemHandle(self, address):
        handle = next(h for h, a in self.mapped.items() if a == address)
        del self.mapped[handle]
        self.closed.append(handle)


def test_two_users_share_one_mapping_until_the_last_closes():
    runtime = _Runtime()
    first, key = _ipc._open(runtime, b"block")
    second, _ = _ipc._open(runtime, b"block")  # a second forwarder sees the same allocation
    assert first == second and list(runtime.mapped) == [b"block"]
    _ipc._close(runtime, key)
    assert runtime.mapped and not runtime.closed  # the other forwarder still reads it
    _ipc._close(runtime, key)
    assert not runtime.mapped and runtime.closed == [b"block"]
    again, key = _ipc._open(runtime, b"block")
    assert again != first  # mapped afresh
    _ipc._close(runtime, key)
    assert not _ipc._mapped
