"""Host-side rules of the asynchronous engine: the window, coalescing, the termination tree."""

import numpy as np

import rafi
from rafi._engines._async import Coalescer, window
from rafi._termination import tree


def test_window_is_an_equal_share_of_the_inbox():
    assert window(100, 4) == 25
    assert window(3, 4) == 1  # never zero: every pair can always move an item
    assert all(window(c, s) * s <= max(c, s) for c in range(1, 50) for s in range(1, 9))


def test_coalescer_waits_only_for_expected_peers():
    c = Coalescer(4)
    arrived = np.array([0, 5, 0, 0])
    assert not c.waits(arrived, dirty=False)  # nobody expected yet
    c.delivered([1, 2], seconds=10.0)  # peers 1 and 2 sent together; a turn costs seconds
    assert c.waits(arrived, dirty=False)  # 2 is missing: wait for it
    assert not c.waits(arrived, dirty=True)  # own items to send: never wait
    assert not c.waits(np.array([0, 5, 3, 0]), dirty=False)  # every expected peer is in
    assert not c.waits(np.zeros(4, np.int64), dirty=False)  # nothing to deliver at all


def test_coalescer_waits_no_longer_than_a_turn():
    c = Coalescer(3)
    c.delivered([1, 2], seconds=0.0)  # turns cost nothing: waiting could save nothing
    assert not c.waits(np.array([0, 4, 0]), dirty=False)


def test_termination_tree_covers_every_rank_once():
    """Every rank but the root has one parent, which lists it among its children; depth is
    logarithmic."""
    for size in range(1, 70):
        links = {r: tree(r, size) for r in range(size)}
        assert links[0][0] is None
        for r in range(1, size):
            parent = links[r][0]
            assert 0 <= parent < r and r in links[parent][1]
        assert sorted(c for r in range(size) for c in links[r][1]) == list(range(1, size))
        for r in range(size):
            depth, at = 0, r
            while at:
                at, depth = links[at][0], depth + 1
            assert depth <= max(1, size - 1).bit_length()


@rafi.kernel
def _double_into_next(i, words):
    words[i + 1] = 2 * words[i]


def test_mapped_buffers_are_shared_with_kernels(backend):
    """The async stages: what the host writes, kernels read, and what kernels write, the host
    sees, with no copy in between (a copy written back whole would undo MPI's arrivals)."""
    from mpi4py import MPI

    from rafi._arrays import is_device_array
    from rafi._backends import make_backend

    b = make_backend(backend, MPI.COMM_SELF)
    host, dev = b.mapped_buffer(4, np.int64)
    host[0] = 21
    b.launch(_double_into_next, 1, dev)
    b.synchronize()
    host[3] = 7
    assert host.tolist() == [21, 42, 0, 7]
    if backend == "cuda":  # a device array (mapped, or the simulator's): not copied per launch
        assert is_device_array(dev)
