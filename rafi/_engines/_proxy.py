"""Resident rounds across nodes: the host between its node's persistent kernels and MPI.

On a communicator that spans nodes, the ranks of each node run the device protocol of
kernels/resident.py among themselves: items for ranks of the node move through node-shared
memory, as on one node. What must cross nodes goes through each rank's host, to which its
kernel returns (and is launched again to go on where it stopped):

- ``PROXY_POSTS``, every round: every rank's posted words (its requests to every rank, its
  totals, error flags and pause) are exchanged by one ``Allgather`` and written into the
  kernel's ``plan``; every kernel then reaches the same job-wide agreement (verdict,
  ``alive``, ``ANY`` placement, grants) as one node's kernels do from their mailboxes, so
  the rounds are bsp's rounds;
- ``PROXY_ITEMS``, in a round where this rank sends items to another node or takes some
  from one: the kernel has staged those it sends in ``remote`` (a segment per receiver, in
  rank order); they go by nonblocking MPI point to point, and what other nodes send lands
  straight in the inbox at its sender's place (bsp's order). On a GPU they pass through
  host memory, unless every rank's MPI is CUDA-aware.

The host never holds the GIL while it waits: mpi4py releases it inside MPI, and rafi's
``Watch`` backs off between its tests (and keeps deadlines and census answers). A rank that
closes its forwarder takes part in the next exchange of words with ``LEAVING`` set, as a
bsp round would (``_departure.agree_to_close``): the others raise ``RankLeft``.
"""

import itertools

import numpy as np

from rafi.kernels import resident as kern

from .. import _control
from .._errors import RankLeft

__all__ = ["Proxy"]

_ITEMS = 41  # tag of the items one rank sends another in a round (on the forwarder's own communicator)


class Proxy:
    """The host's part of resident rounds across nodes, for the forwarder ``fwd``.

    Args:
        fwd: the forwarder.
        plan, report: the kernel's working words and its report (host view).
        remote: the staged items for other nodes (the backend's array of words).
        slots: for every rank, its place among this node's ranks, or -1.
        cuda_aware: every rank's MPI takes device buffers (else a GPU's items go through
            host memory).
    """

    def __init__(self, fwd, plan, report, remote, slots, cuda_aware):
        self._fwd, self._plan, self._report, self._remote = fwd, plan, report, remote
        size = fwd.size
        self._far = [r for r in range(size) if slots[r] < 0]  # ranks on other nodes
        layout = kern._plan_at(size)
        self._grant, self._frm, self._stage = layout[0], layout[2], layout[9]
        self._seen, self._requests = layout[6], layout[7]
        self._posts = kern.R_MISSING + size
        self._everyone = np.zeros((size, kern.OWN + size), np.int64)
        agreed = np.zeros(size * (kern.OWN + size), np.int64)  # plan's seen, then requests
        self._agreed = agreed, agreed[: size * kern.OWN].reshape(size, kern.OWN), agreed[size * kern.OWN :]
        self._told = False  # this rank's leaving is known to every rank
        self._requests_pending, self._finish = None, None  # a wait Ctrl-C cut short, and what follows it
        self._words = np.zeros(4 * size, np.int64)  # grant, offset, frm, stage: host copies
        b = fwd._backend
        self._direct = not b.device_arrays or cuda_aware
        self._out = None if self._direct else b.host_buffer(remote.shape[0], remote.dtype)
        self._in = None if self._direct else b.host_buffer(remote.shape[0], remote.dtype)

    # ------------------------------------------------------------------ every round

    def serve(self, status, what):
        """Do what the kernel returned for (``PROXY_POSTS`` or ``PROXY_ITEMS``). Resumable:
        interrupted in its wait (Ctrl-C), it keeps its requests, and the next call waits
        for them again instead of posting others."""
        if self._requests_pending is None:
            post = self._post_counts if status == kern.PROXY_POSTS else self._post_items
            self._requests_pending, self._finish = post(), status
        self._fwd._watch.wait(self._requests_pending, f"{what} ({_WHAT[self._finish]})")
        self._requests_pending = None
        if self._finish == kern.PROXY_POSTS:
            self._counts_arrived(what)
        else:
            self._items_arrived()

    def _post_counts(self):
        """Every rank's posted words into ``self._everyone`` (one nonblocking ``Allgather``)."""
        size, own = self._fwd.size, kern.OWN
        self._mine = np.ascontiguousarray(self._report[self._posts : self._posts + own + size])
        return [self._fwd._comm.Iallgather(self._mine, self._everyone)]

    def _counts_arrived(self, what):
        """Give every rank's words to the kernel (``plan``), unless some rank left."""
        self._check_leaving(what)
        size, own = self._fwd.size, kern.OWN
        agreed, seen, requests = self._agreed
        seen[...] = self._everyone[:, :own]
        requests.reshape(size, size)[...] = self._everyone[:, own:]
        self._fwd._backend.to_device(agreed, self._plan[self._seen : self._requests + size * size])

    def _check_leaving(self, what):
        """``RankLeft`` on every rank when some ranks closed their forwarder (``leave``)."""
        if not any(m & _control.LEAVING for m in self._everyone[:, kern.M_SEND_MASK].tolist()):
            return  # (numpy's any() of a few words costs a microsecond more, every round)
        leaving = (self._everyone[:, kern.M_SEND_MASK] & _control.LEAVING) != 0
        from .._departure import world_ranks

        fwd = self._fwd
        self._told = True  # every rank knows who leaves: abandoning says nothing more
        fwd._abandon()
        leavers = world_ranks(fwd._comm, np.flatnonzero(leaving).tolist())
        others = world_ranks(fwd._comm, np.flatnonzero(~leaving).tolist())
        raise RankLeft(
            f"rank(s) {leavers} closed their Forwarder (close() or the end of its with block) while "
            f"rank(s) {others} called {what}",
            ranks=leavers,
            printer=world_ranks(fwd._comm, [fwd.rank])[0] == others[0],
        )

    def _exchange(self, mine, what, seconds=None):
        """Every rank's words into ``self._everyone``: a nonblocking ``Allgather`` (one that
        a rank that stopped can post and leave behind, ``abandon``), waited for under the
        deadline, or up to ``seconds``; returns whether it completed."""
        from mpi4py import MPI

        from .._liveness import until

        requests = self._requests_pending or []  # a round's exchange Ctrl-C cut short comes first
        requests = requests + [self._fwd._comm.Iallgather(mine, self._everyone)]
        if seconds is None:
            self._fwd._watch.wait(requests, what)
            return True
        try:
            until(lambda: MPI.Request.Testall(requests), what, seconds)
        except Exception:  # no rank came in time: the requests stay posted, kept with their buffers
            return False
        return True

    def _leaving_words(self):
        mine = np.zeros(kern.OWN + self._fwd.size, np.int64)
        mine[kern.M_SEND_MASK] = _control.LEAVING
        return mine

    def leave(self):
        """This rank closes: take part in the round's exchange of words with ``LEAVING`` set.
        Returns when every rank closes; otherwise every rank raises ``RankLeft`` (here, after
        the forwarder is abandoned)."""
        fwd = self._fwd
        self._exchange(self._leaving_words(), "close()")
        leaving = (self._everyone[:, kern.M_SEND_MASK] & _control.LEAVING) != 0
        if not leaving.all():
            self._check_leaving(f"run() or forward() round {fwd._round}")

    def abandon(self, seconds=1.0):
        """This rank stopped (an error it did not share): say so in the next exchange of words,
        which the other ranks' rounds or closes meet (they raise ``RankLeft``, or close
        without it); waits for them up to ``seconds``, then leaves it posted."""
        if self._told:
            return
        self._told = True
        self._mine = self._leaving_words()  # lives as long as the request may
        self._exchange(self._mine, "stopping after an error (telling the other ranks)", seconds)

    # ------------------------------------------------------------------ rounds with items across nodes

    def _post_items(self):
        """Send the items staged for other nodes, and receive theirs (straight into the
        inbox, or into host memory on a GPU whose MPI is not CUDA-aware)."""
        fwd, b = self._fwd, self._fwd._backend
        size, width = fwd.size, fwd._width
        words, plan = self._words, self._plan
        b.to_host(plan[self._grant : self._frm + size], words[: 3 * size])  # grant, offset, frm
        b.to_host(plan[self._stage : self._stage + size], words[3 * size :])
        values = words.tolist()  # a round's few numbers: Python's ints beat numpy's calls here
        grant, frm, stage = values[:size], values[2 * size : 3 * size], values[3 * size :]
        firsts = list(itertools.accumulate(frm, initial=0))  # each sender's first inbox slot
        sending = [d for d in self._far if grant[d] > 0]
        self._taking = [(firsts[s] * width, firsts[s + 1] * width, s) for s in self._far if frm[s] > 0]
        out = self._remote
        if not self._direct and sending:
            last = max(stage[d] + grant[d] for d in sending) * width
            b.to_host(out[:last], self._out[:last])
            out = self._out
        landing = fwd._inbox_words if self._direct else self._in
        comm = fwd._comm
        requests = [
            comm.Isend(out[stage[d] * width : (stage[d] + grant[d]) * width], dest=d, tag=_ITEMS)
            for d in sending
        ]
        return requests + [
            comm.Irecv(landing[first:last], source=s, tag=_ITEMS) for first, last, s in self._taking
        ]

    def _items_arrived(self):
        """On a GPU whose MPI is not CUDA-aware: what came, from host memory into the inbox."""
        if self._direct:
            return
        b, inbox = self._fwd._backend, self._fwd._inbox_words
        for first, last, _ in self._taking:
            b.to_device(self._in[first:last], inbox[first:last])


_WHAT = {kern.PROXY_POSTS: "every rank's counts", kern.PROXY_ITEMS: "items between nodes"}
