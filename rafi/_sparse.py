"""The count exchange with messages only between ranks that talk, and how a round picks it.

``SparseExchange`` has the interface of ``_control.Exchange`` (the dense ``Alltoall``):

- counts travel by the dynamic sparse data exchange (NBX, Hoefler, Siebert and Lumsdaine,
  PPoPP 2010): a rank sends each peer it holds items for a synchronous ``Issend`` of
  (items, first sorted slot), receives whatever arrives, and once its own sends are
  matched enters a nonblocking barrier; when the barrier completes, every message of the
  round has been received. Rounds alternate two tags, so a fast rank's next round cannot
  be taken for this one (it cannot start the round after that before everyone has left
  this one's barrier);
- the barrier is an ``Iallreduce`` (O(log P)) that also carries the liveness total,
  whether any rank has an error, the number of talking pairs and of ``device.ANY`` items:
  like a barrier, it completes on no rank before every rank has entered it;
- only when some rank has an error does every rank gather every rank's own words, so the
  verdict (``_control.verdict``) is the one the dense exchange would give, on every rank;
- grants of a flow-controlled round go point to point: a receiver sends each rank that
  asked it, a sender receives from each rank it asked.

``Exchanges`` picks, per round, between the two: ``exchange="dense"`` or ``"sparse"``
always, ``"auto"`` (``RAFI_EXCHANGE`` overrides it) by the last round's traffic, known
alike on every rank: sparse while at most a quarter of the ordered pairs of distinct ranks
have items (and more than two ranks), dense otherwise and in the first round. On one node
``auto`` stays dense below ``ONE_NODE_SPARSE_FROM`` ranks: there one ``Alltoall`` goes
through shared memory, and the round-cost model fitted on the GPU machine's 16 cores puts
sparse ahead only from about 110 ranks for empty rounds (and dense measured 56 us against
sparse's 75 for an empty round at 16 ranks; bench/RESULTS.md).
"""

import numpy as np

from ._config import env_choice
from ._control import Block, Exchange, own_words
from ._errors import ConfigError
from ._mpi_support import node_local

__all__ = ["EXCHANGES", "Exchanges", "SparseExchange"]

EXCHANGES = ("auto", "dense", "sparse")
ONE_NODE_SPARSE_FROM = 128  # ranks: on one node, auto goes sparse from this many on
_COUNTS, _GRANTS = 40, 42  # tags on the forwarder's communicator: counts (+ parity), grants (+ parity)
_SUMMED = 4  # words of the reduction: items alive, ranks with an error, talking pairs, ANY items


class SparseExchange:
    """See the module docstring; ``run`` returns blocks whose rows carry the requests and
    sorted starts of the ranks that sent to this one (zero for the others)."""

    name = "sparse"

    def __init__(self, comm, watch):
        from mpi4py import MPI

        self._MPI, self._comm, self._watch = MPI, comm, watch
        self._rank, self._size = comm.Get_rank(), comm.Get_size()
        self.blocks = np.zeros((self._size, Block.WORDS), np.int64)
        self._out = np.zeros((self._size, 2), np.int64)  # per peer: request, start
        self._inbound = np.zeros(2, np.int64)
        self._words = np.zeros(Block.WORDS, np.int64)
        self._sums = np.zeros(_SUMMED, np.int64)
        self._round = 0
        self.messages = 0

    def run(self, what, summary, bad_sends):
        comm, me = self._comm, self._rank
        words = own_words(self._words, summary, bad_sends, me)
        error = bool(words[Block.REFUSED] or words[Block.INVALID] or words[Block.SEND_ERROR])
        self._sums[:] = (words[Block.TOTAL], error, words[Block.PEERS], words[Block.ANYWHERE])
        blocks, out = self.blocks, self._out
        blocks[:, : Block.START + 1] = 0
        out[:, 0], out[:, 1] = summary.requests, summary.starts
        blocks[me, Block.REQUEST], blocks[me, Block.START] = out[me]
        tag = _COUNTS + self._round % 2
        self._round += 1
        peers = [p for p in np.flatnonzero(summary.requests).tolist() if p != me]
        sends = [comm.Issend(out[p], dest=p, tag=tag) for p in peers]
        self.messages = len(peers) + 1  # and this rank's part of the reduction
        self._nbx(tag, sends, what)
        return blocks

    def _nbx(self, tag, sends, what):
        """Receive counts until the reduction that follows this rank's matched sends completes.

        The reduction is NBX's barrier: no rank can finish it before every rank has entered
        it, and a rank enters only once every count it sent has been received."""
        MPI, comm = self._MPI, self._comm
        status, barrier = MPI.Status(), []

        def done():
            while (message := comm.improbe(source=MPI.ANY_SOURCE, tag=tag, status=status)) is not None:
                message.Recv(self._inbound)
                self.blocks[status.Get_source(), Block.REQUEST : Block.START + 1] = self._inbound
            if not barrier:
                if MPI.Request.Testall(sends):
                    barrier.append(comm.Iallreduce(MPI.IN_PLACE, self._sums, op=MPI.SUM))
                return False
            return barrier[0].Test()

        self._watch.until(done, what)

    @property
    def alive(self):
        return int(self._sums[0])

    @property
    def pairs(self):
        return int(self._sums[2])

    @property
    def anywhere(self):
        return int(self._sums[3])

    def errors(self):
        return bool(self._sums[1])

    def everyone(self, what):
        """Every rank's own words, gathered (only when some rank has an error)."""
        everyone = np.zeros((self._size, Block.WORDS), np.int64)
        self._watch.collective("Allgather", self._words, everyone, what=what)
        return everyone

    def grant(self, given, requests, what):
        """Send each rank that asked this one its grant; return what the asked ranks granted."""
        comm, me = self._comm, self._rank
        tag = _GRANTS + self._round % 2
        granted = np.zeros_like(given)
        granted[me] = given[me]
        asked = [p for p in np.flatnonzero(requests).tolist() if p != me]
        askers = [p for p in np.flatnonzero(self.blocks[:, Block.REQUEST]).tolist() if p != me]
        recvs = [comm.Irecv(granted[p : p + 1], source=p, tag=tag) for p in asked]
        sends = [comm.Isend(given[p : p + 1], dest=p, tag=tag) for p in askers]
        self._watch.wait(recvs + sends, what)
        self.messages += len(askers)
        return granted


class Exchanges:
    """The count exchange of each round: dense, sparse, or chosen by traffic (``auto``)."""

    def __init__(self, comm, watch, requested):
        choice = env_choice("EXCHANGE", requested)
        if choice not in EXCHANGES:
            raise ConfigError(f"exchange={requested!r} is not one of {', '.join(EXCHANGES)}")
        self._size = comm.Get_size()
        if choice == "auto" and self._size < ONE_NODE_SPARSE_FROM and node_local(comm)[1] == self._size:
            choice = "dense"  # one node, where dense wins (module docstring)
        self._auto = choice == "auto"
        self._dense = Exchange(comm, watch) if choice != "sparse" else None
        self._sparse = SparseExchange(comm, watch) if choice != "dense" else None
        self._next = self._sparse if choice == "sparse" else self._dense

    def pick(self):
        return self._next

    def learn(self, pairs):
        """Choose the next round's exchange from this round's talking pairs (the same on
        every rank, so every rank chooses alike)."""
        if self._auto:
            few = self._size > 2 and 4 * pairs <= self._size * (self._size - 1)
            self._next = self._sparse if few else self._dense
