"""Resident rounds: forwarding on the device, with no host code between rounds.

Every rank of a node runs one persistent kernel (the cpu backend: one compiled loop) that
forwards round after round, and between rounds runs the user's ``step`` over what arrived.
Ranks signal each other through node-shared memory (kernels/signals.py): every rank's
**inbox** and **mailbox** can be written by every other rank (CUDA-IPC-mapped device
memory on GPUs, a file in /dev/shm mapped by every rank on the CPU:
``rafi/_transports/_mailboxes.py``).

A round (``leader``), as every rank runs it:

1. **count**: the outbox's items per destination (rows as in kernels/partition.py: one per
   rank, one for ``ANY``, one for invalid destinations);
2. **post** this rank's words into every rank's mailbox: its requests to each rank, its
   totals and error flags (as ``rafi/_control.py``'s control block). Each value travels as
   two *stamped words* (32 bits of the value, 32 bits of the epoch's tag, written by one
   8-byte store, as NCCL's LL protocol does): a reader spins on the word itself until its
   tag is the epoch's, so no fence and no separate stamp is needed;
3. **agree**: once every rank's words are in, every rank holds the same matrix of
   requests, so each computes the same verdict (errors), the same ``alive``, the same
   placement of ``ANY`` items (``rafi/_anywhere.py``'s rule) and the same grants
   (``rafi/_flow.py``'s rule, per receiver), and from them where in each receiver's inbox
   its own items go (after those of every lower rank: the inbox bsp fills);
4. **deliver** (push): each granted item is written once, straight into its receiver's
   inbox, at a slot known without a per-item atomic (the cpu backend walks the outbox in
   order with one cursor per receiver; a GPU block reserves a range per receiver for its
   tile of items, then places each item by its rank within the tile); the rest, in order
   on the cpu backend, goes to scratch and back to the front of the outbox;
5. **stamp** every receiver it wrote to (one release fence per delivering thread, then the
   stamp), and wait for the stamps of every sender that wrote to it; then ``step`` runs
   over the inbox, and the next round begins.

Mailboxes are double-buffered by the parity of an **epoch** (one per exchange attempt,
the same count on every rank; a round that raised an error is retried in the next epoch
under the same round number). A rank can be at most one epoch ahead of any other, since
it needs every rank's post of the epoch before, so parity is enough; an inbox needs no
second buffer, since a sender writes into it only after the receiver posted the counts
it made by stepping over the inbox before (the step's reads are performed before the
block's barrier that precedes the post). A round whose ``alive`` is 0 ends after step 3,
on every rank alike; an error ends it after step 4, with nothing moved.

A rank that closes its forwarder sets its flag in every rank's mailbox: a kernel waiting
for it returns with status ``LEFT`` (the host raises ``RankLeft``). Every wait is bounded:
after a time slice of waiting the kernel returns with status ``WAITING`` (the host checks
the deadline, signals and census questions, then launches again to resume where it
waited: ``ctl[C_PHASE]`` remembers). A launch also returns after ``rounds`` rounds
(``PAUSED``), when nothing is alive (``DONE``) or on an error (``ERROR``); ``report``
tells the host which, and one record per round for ``fwd.stats`` (the rounds write them
into ``draft``, in device memory, and the launch's end copies them).

The leader's own words and the command's (``ctl[: MIRROR_LEN]``) live in ``cs`` during a
launch (block 0's shared memory on a GPU) and in ``ctl`` between launches. On CUDA, block 0
runs the protocol (its threads work in parallel over peers, words and items); a phase with
many items is run by the whole grid (``CUDA_LAUNCHER``): block 0 writes the command's words
to ``ctl``, the other blocks wait for a command word, run it, and arrive at a counter
(``ctl``'s last words, ``G_GEN`` ...), and block 0 reads back what they wrote. The grid is
sized so that every rank's kernel is resident at once (``rafi/_engines/_resident.py``).
"""

import functools

import numba

from rafi._kernel import kernel
from rafi._targets import inline_func, uncounted_func
from rafi.kernels.atomics import atomic_add
from rafi.kernels.outbox import ANY, COUNT, REFUSED
from rafi.kernels.partition import row_of
from rafi.kernels.signals import (
    block_sync,
    fence_acquire,
    fence_release,
    load_relaxed,
    now_ns,
    pause,
    store_relaxed,
)
from rafi.kernels.streaming import STREAM_BYTES, stream_fence, stream_store
from rafi.kernels.warps import warp_group, warp_shuffle

__all__ = [
    "CPU_LAUNCHER",
    "CTL_LEN",
    "ctl_len",
    "CUDA_LAUNCHER",
    "mail_len",
    "plan_len",
    "record_words",
    "report_len",
    "shared_len",
]

# ----------------------------------------------------------------------------- layouts

# ctl[: STATE_LEN]: the leader's words (in ``cs`` during a launch)
C_PHASE, C_EPOCH, C_ROUND, C_ROUNDS_LEFT, C_STEP, C_BEGAN, C_SLICE, C_LAUNCH = range(8)
C_ME, C_WIDE_AT, C_RECORDS, C_SEND_MASK, C_SEND_CALLS, C_SEND_ITEMS, C_ALIVE, C_RECEIVED = range(8, 16)
C_DEFERRED, C_MISSING, C_LEFT, C_T0, C_T1, C_T2, C_T3, C_WAIT_BEGAN = range(16, 24)
C_ANYWHERE, C_MINE_ANY, C_KEPT, C_PAUSE, C_SIZE, C_PROXY = range(24, 30)
STATE_LEN = 30
# ctl[STATE_LEN : MIRROR_LEN]: the words of a command, which the grid's blocks read and write
G_CMD, G_N, G_WIDE, G_ERROR, G_KEPT, G_ANY_FIRST, G_ANY_CURSOR = range(STATE_LEN, STATE_LEN + 7)
G_STAGED = STATE_LEN + 7  # items this rank sends to the other ranks of its node this round
# the cpu backend's stores to the node's other ranks (set once: ``node_stores``): bytes a
# round from which a sender pushes into their inboxes (below, it stages and they pull), and
# from which it pushes with streaming stores
G_PUSH_FROM, G_STREAM_FROM = STATE_LEN + 8, STATE_LEN + 9
MIRROR_LEN = STATE_LEN + 10  # ctl[: MIRROR_LEN] is in ``cs`` during a launch
# ctl[MIRROR_LEN : CTL_LEN]: where the grid's blocks meet (global memory only)
G_GEN, G_ARRIVED, G_BROKEN = range(MIRROR_LEN, MIRROR_LEN + 3)
CTL_LEN = MIRROR_LEN + 3
# ctl[CTL_LEN :]: the cpu launcher's ``cs`` and ``sh`` (a GPU's are in shared memory); that
# launcher, compiled without reference counts, allocates nothing (``ctl_len``)

# phases of a round (ctl[C_PHASE])
PH_START, PH_COUNTED, PH_WAIT_A, PH_DELIVERED, PH_KEPT, PH_WAIT_C, PH_STEPPED, PH_BROKEN, PH_PLACED = range(9)
PH_PULLED = 9

# commands: the parallel work of a phase
CMD_EXIT, CMD_COUNT, CMD_DELIVER, CMD_KEEP, CMD_STEP, CMD_PLACE, CMD_PULL = range(7)

# report statuses
RUNNING, PAUSED, DONE, ERROR, WAITING, BROKEN, LEFT, PROXY_POSTS, PROXY_ITEMS = range(9)

# what one sender posts to every receiver in one epoch: OWN words of its own, then its
# request to each rank; each value as two stamped words (low and high 32 bits)
M_VALID, M_REFUSED, M_NEEDED, M_INVALID, M_EXAMPLE, M_SEND_MASK, M_SEND_CALLS, M_SEND_ITEMS, M_ANY = range(9)
M_PAUSE = 9  # 1: the sender returns to its host after this round (every rank then does)
OWN = 10
LOW = 4294967295  # 2**32 - 1: the value half of a stamped word
TAGS = 2147483647  # tags cycle through [1, 2**31 - 1]: never 0 (zeroed memory), never negative


@inline_func
def post_words(size):
    """Stamped words one sender posts to one receiver in one epoch."""
    return 2 * (OWN + size)


@inline_func
def stamp_at(size, proxied):
    """Where a rank's mailbox holds, per parity and sender, the stamp of delivered items
    (after the posts, which a job across nodes sends through its hosts instead)."""
    return 0 if proxied else 2 * size * post_words(size)


@inline_func
def leave_at(size, proxied):
    """Where a rank's mailbox holds, per sender, whether it left (1: closed its forwarder,
    2: stopped after an error)."""
    return stamp_at(size, proxied) + 2 * size


def mail_len(size, proxied):
    """Words of one rank's mailbox: two parities of posts and of stamps; the leaving flags."""
    return leave_at(size, proxied) + size


# sh: a block's scratch (shared memory on a GPU): per-row counts of a tile, then the
# tile's first slot in each receiver's inbox
S_ROWS = 0


def shared_len(size):
    """Words of ``sh`` for ``size`` ranks or fewer, ``size`` rounded up to a power of two (8
    at least): the length is compiled into the launcher, and jobs of 2 to 8 ranks (or 9 to
    16 ...) share one compiled launcher, in a process and in the disk cache."""
    return 2 * (max(8, 1 << (size - 1).bit_length()) + 2)


def ctl_len(size):
    """Words of ``ctl`` for ``size`` ranks."""
    return CTL_LEN + MIRROR_LEN + shared_len(size)


# plan: the round's working words (device memory)
P_COUNTS = 0  # size + 3: items per row (ranks, ANY, invalid), then an invalid example


@uncounted_func
def _plan_at(size):
    grant = P_COUNTS + size + 3
    offset = grant + size
    frm = offset + size
    cursor = frm + size
    bounds = cursor + size
    share = bounds + size + 1
    seen = share + size
    requests = seen + size * OWN
    grants = requests + size * size
    stage = grants + size * size
    node = stage + size  # the slot of each rank among this node's (boxes, stages, mail), or -1
    return grant, offset, frm, cursor, bounds, share, seen, requests, grants, stage, node, node + size


def plan_len(size):
    return _plan_at(size)[-1]


def plan_seen(plan, size):
    """Every rank's own posted words (``M_VALID`` ...), as the last agreement read them: a
    ``(size, OWN)`` view of a host copy of ``plan``."""
    seen = _plan_at(size)[6]
    return plan[seen : seen + size * OWN].reshape(size, OWN)


@kernel
def idle(i, inbox, outbox):
    """The step of a launch that only forwards (``fwd.forward()``): it never runs."""


# report: what the host reads after a launch (zero-copy host memory on a GPU); draft: the
# same layout in device memory, where the rounds write
R_STATUS, R_RECORDS, R_ROUND, R_RECEIVED, R_ALIVE, R_DEFERRED, R_EPOCH, R_PHASE, R_MISSING = range(9)
REC_ROUND, REC_ALIVE, REC_DEFERRED, REC_RECEIVED, REC_T0, REC_T1, REC_T2, REC_T3, REC_END = range(
    9
)  # times: start, posted, agreed, delivered, end
REC_HEAD = 9  # then sent[size], received[size]


def record_words(size):
    return REC_HEAD + 2 * size


@inline_func
def records_at(size):
    """Where the rounds' records begin: after the missing ranks and this rank's posted words
    (a job across nodes posts them here, for its host)."""
    return R_MISSING + size + OWN + size


def report_len(size, records):
    return records_at(size) + records * record_words(size)


# ----------------------------------------------------------------------------- stamped words


@inline_func
def _tag(epoch):
    return epoch % TAGS + 1


@inline_func
def _post_value(box, at, value, tag):
    """Write ``value`` (64 bits) as two stamped words ``box[at]``, ``box[at + 1]``."""
    store_relaxed(box, at, tag * 4294967296 + (value & LOW))
    store_relaxed(box, at + 1, tag * 4294967296 + ((value >> 32) & LOW))


@inline_func
def _value(low, high):
    """The 64-bit value of two stamped words (the high half signed)."""
    high = high & LOW
    if high > 2147483647:
        high -= 4294967296
    return high * 4294967296 + (low & LOW)


# ----------------------------------------------------------------------------- the rules


@uncounted_func
def grant_column(plan, r, size, capacity, round_number, requests, grants):
    """Receiver ``r``'s grants to every sender (``rafi/_flow.py``'s rule, the same numbers)."""
    total = 0
    for s in range(size):
        total += plan[requests + s * size + r]
    if total <= capacity:
        for s in range(size):
            plan[grants + s * size + r] = plan[requests + s * size + r]
        return
    hungry = 0
    for s in range(size):
        plan[grants + s * size + r] = 0
        if plan[requests + s * size + r] > 0:
            hungry += 1
    left = capacity
    while left > 0 and hungry > 0:
        share = left // hungry
        if share == 0:
            break
        hungry = 0
        for s in range(size):
            asked = plan[requests + s * size + r]
            got = plan[grants + s * size + r]
            give = min(asked - got, share)
            if give > 0:
                plan[grants + s * size + r] = got + give
                left -= give
            if got + max(give, 0) < asked:
                hungry += 1
    if left > 0:  # fewer items left than hungry senders: one each, from a rotating start
        start = (round_number * left) % size
        for j in range(size):
            s = (j + start) % size
            if left > 0 and plan[grants + s * size + r] < plan[requests + s * size + r]:
                plan[grants + s * size + r] += 1
                left -= 1


@uncounted_func
def place_anywhere(plan, size, anywhere, share, bounds, seen, requests):
    """Give the ``ANY`` items of all ranks their ranks (``rafi/_anywhere.py``'s rule, the
    same numbers): each rank's share, the first global ANY index of each rank
    (``bounds``), and every sender's ANY items added to its requests for the ranks they
    go to. ``bounds`` holds the ranks' loads meanwhile."""
    lo, hi = 0, 0
    for r in range(size):  # loads: items pushed for each rank
        load = 0
        for s in range(size):
            load += plan[requests + s * size + r]
        plan[bounds + r] = load
        lo = load if r == 0 else min(lo, load)
        hi = load if r == 0 else max(hi, load)
    hi += anywhere
    while lo < hi:  # the highest level with sum(max(0, level - load)) <= anywhere
        mid = (lo + hi + 1) // 2
        need = 0
        for r in range(size):
            need += max(mid - plan[bounds + r], 0)
        if need <= anywhere:
            lo = mid
        else:
            hi = mid - 1
    left = anywhere
    for r in range(size):
        plan[share + r] = max(lo - plan[bounds + r], 0)
        left -= plan[share + r]
    for r in range(size):  # the few left over: one each to the ranks at the level, lowest first
        if left > 0 and plan[bounds + r] <= lo:
            plan[share + r] += 1
            left -= 1
    at = 0
    for r in range(size):
        plan[bounds + r] = at
        at += plan[share + r]
    plan[bounds + size] = at
    first = 0
    for s in range(size):  # sender s's ANY items are global indices [first, first + any)
        mine = plan[seen + s * OWN + M_ANY]
        for r in range(size):
            start = max(first, plan[bounds + r])
            stop = min(first + mine, plan[bounds + r + 1])
            if stop > start:
                plan[requests + s * size + r] += stop - start
        first += mine


@inline_func
def rank_of(plan, g, size, bounds):
    """The rank that global ANY index ``g`` goes to."""
    for r in range(size):
        if g < plan[bounds + r + 1]:
            return r
    return size - 1


# ----------------------------------------------------------------------------- parallel phases
#
# Each runs on the threads ``tt`` of ``nn`` (the leading block's, or the whole grid's); ``t``
# of ``nt`` is the thread within its block, whose scratch is ``sh``. One thread (``nn == 1``,
# the cpu backend) takes the serial path, in outbox order.
#
# A loop over threads is a ``while`` loop here and in the leader: numba's ``range`` with a
# step divides for its trip count, and LLVM unrolls it four times behind that division
# (a GPU runs such a loop once or not at all per thread): as ``while`` loops the CUDA
# launcher is some 2,500 instructions shorter (bench/RESULTS.md, 2026-12-07).


@inline_func
def count_items(t, nt, tt, nn, n, dest, size, plan, sh):
    """COUNT: items per row into ``plan[P_COUNTS ...]`` (zeroed by the leader)."""
    if nn == 1:  # a run of items for one row is counted in a register, then added
        run_row, run = 0, 0
        for k in range(n):
            d = dest[k]
            row = row_of(d, size)
            if row != run_row:
                plan[P_COUNTS + run_row] += run
                run_row, run = row, 0
            run += 1
            if row == size + 1:
                plan[P_COUNTS + size + 2] = d
        plan[P_COUNTS + run_row] += run
        return
    r = t
    while r < size + 2:
        sh[S_ROWS + r] = 0
        r += nt
    block_sync()
    tile = tt - t
    while tile < n:  # every thread of a block takes the same tiles (warp_group)
        k = tile + t
        tile += nn
        d = dest[k] if k < n else 0
        row = row_of(d, size) if k < n else -1
        leader, lane, below, count = warp_group(row)
        if k < n and lane == leader:
            atomic_add(sh, S_ROWS + row, count)
        if row == size + 1:
            plan[P_COUNTS + size + 2] = d
    block_sync()
    r = t
    while r < size + 2:
        if sh[S_ROWS + r] > 0:
            atomic_add(plan, P_COUNTS + r, sh[S_ROWS + r])
        r += nt


@inline_func
def _copy_record(src, k, dst, at, width):
    """Item ``k`` of ``src`` into slot ``at`` of ``dst``, four words loaded before any is
    stored (a GPU thread then waits for memory once per four words, not once per word).
    Not for the cpu's loop over items (``_deliver_serial`` copies word by word): four
    words at a time there made a 1000-item round of the ring slower (19-21 -> 24-26 us on
    2 vCPUs of an Intel Xeon, 2026-12-07)."""
    a, b = k * width, at * width
    quads = width // 4 * 4
    for w in range(0, quads, 4):
        w0, w1, w2, w3 = src[a + w], src[a + w + 1], src[a + w + 2], src[a + w + 3]
        dst[b + w], dst[b + w + 1], dst[b + w + 2], dst[b + w + 3] = w0, w1, w2, w3
    for w in range(quads, width):
        dst[b + w] = src[a + w]


@inline_func
def place_items(tt, nn, n, ctl, plan, dest, size):
    """PLACE: give every ``ANY`` item its rank, in push order on the cpu backend (the k-th
    ANY item of all ranks, counted from this rank's first, goes where ``bounds`` says)."""
    bounds = _plan_at(size)[4]
    k = tt
    while k < n:
        if dest[k] == ANY:
            g = ctl[G_ANY_FIRST] + atomic_add(ctl, G_ANY_CURSOR, 1)
            dest[k] = rank_of(plan, g, size, bounds)
        k += nn


@inline_func
def _deliver_serial(n, ctl, plan, boxes, stages, remote, dest, words, kept, kept_dest, width, me, error):
    """``deliver_items`` on one thread, in outbox order: this rank's own items into its
    inbox, those for its node's other ranks staged or pushed into their inboxes
    (``node_stores``), those for other nodes into ``remote`` (its host sends them), the
    rest kept. The copies are written out here, over unsigned indices (numba checks every
    signed index for a negative value, which keeps a CPU from vectorizing a copy)."""
    size = ctl[C_SIZE]
    grant, offset, frm, cursor, bounds, share, seen, requests, grants, stage, node, end = _plan_at(size)
    u = numba.uint64
    sending = ctl[G_STAGED] * width * words.itemsize
    pushed, streamed = _pushed(ctl, sending), sending >= ctl[G_STREAM_FROM]
    box, staged = boxes[plan[node + me]], stages[plan[node + me]]
    for k in range(n):
        d = dest[k]
        if d >= 0 and d < size:
            pos = plan[cursor + d]
            plan[cursor + d] = pos + 1
            if pos >= plan[grant + d]:
                _keep(words, k, kept, kept_dest, d, width, ctl)
            elif d == me:
                a, b = u(k) * u(width), u(plan[offset + d] + pos) * u(width)
                for w in range(u(width)):
                    box[b + w] = words[a + w]
            elif plan[node + d] < 0:
                a, b = u(k) * u(width), u(plan[stage + d] + pos) * u(width)
                for w in range(u(width)):
                    remote[b + w] = words[a + w]
            elif streamed:
                into = boxes[plan[node + d]]
                a, b = u(k) * u(width), u(plan[offset + d] + pos) * u(width)
                for w in range(u(width)):
                    stream_store(into, b + w, words[a + w])
            elif pushed:
                into = boxes[plan[node + d]]
                a, b = u(k) * u(width), u(plan[offset + d] + pos) * u(width)
                for w in range(u(width)):
                    into[b + w] = words[a + w]
            else:
                a, b = u(k) * u(width), u(plan[stage + d] + pos) * u(width)
                for w in range(u(width)):
                    staged[b + w] = words[a + w]
        elif d == ANY and error != 0:
            _keep(words, k, kept, kept_dest, ANY, width, ctl)
    if streamed:
        stream_fence()
    fence_release()


# The cpu backend's two ways to the node's other ranks (``G_PUSH_FROM``, ``G_STREAM_FROM``,
# chosen by the probe of rafi/_transports/_node_stores.py): ``cached``, every round pushed
# into their inboxes with ordinary stores (streaming stores from ``STREAM_BYTES`` on, past
# the caches); ``streaming``, staged (each receiver pulls its segment) below
# ``PUSH_BYTES`` and pushed with streaming stores from there, for a machine where taking
# back a line another core read costs more than the receiver's read from memory. Measured
# on the CPU machine (2 vCPUs of an AMD EPYC, 2026-12-07), the ring's 1000 x 64 B a round:
# delivery 26 us staged (each line the peer read last round taken back), 13 us streamed;
# the step then reads the items from memory (7 -> 16 us); the round 41 -> 33 us. A few
# lines go faster through the caches (the mfence after streaming stores costs more).
PUSH_BYTES = 1 << 13
NODE_STORES = {"cached": (0, STREAM_BYTES), "streaming": (PUSH_BYTES, PUSH_BYTES)}


@inline_func
def _pushed(ctl, nbytes):
    """Whether a sender of ``nbytes`` to its node's other ranks this round writes them
    straight into their inboxes (else it stages them, and each receiver pulls its part)."""
    return nbytes >= ctl[G_PUSH_FROM]


@uncounted_func
def _keep(words, k, kept, kept_dest, d, width, ctl):
    """Item ``k`` (for ``d``) not granted: to scratch, and then back into the outbox."""
    at = atomic_add(ctl, G_KEPT, 1)
    _copy_record(words, k, kept, at, width)
    kept_dest[at] = d


@inline_func
def deliver_items(
    t, nt, tt, nn, n, ctl, plan, sh, boxes, stages, remote, dest, words, kept, kept_dest, width
):
    """DELIVER: every granted item once towards its receiver, the rest to scratch; after an
    error nothing is granted and the ``ANY`` items are kept too.

    One thread (the cpu backend) walks the outbox in order, one cursor per receiver. Items
    for the node's other ranks it *pushes* straight into their inboxes, with ordinary or
    streaming stores, or *stages* into this rank's ``stages`` array (a segment per receiver
    in rank order, which each receiver pulls once stamped: ``pull_items``), as the node's
    probe chose (``_pushed``, ``NODE_STORES``). Items for this rank go straight into its inbox.

    Many threads (a GPU) *push*: each granted item straight into its receiver's inbox.
    Each block takes tiles of ``nt`` items: each item's rank among the tile's items for
    its receiver (one shared-memory atomic per warp and receiver: kernels/warps.py), one
    global atomic per receiver and tile for the tile's range, then every item its slot.

    Items for ranks on other nodes go to ``remote``, a segment per receiver in rank order
    (``plan[stage + d]``), which this rank's host sends."""
    size = ctl[C_SIZE]
    grant, offset, frm, cursor, bounds, share, seen, requests, grants, stage, node, end = _plan_at(size)
    error, me = ctl[G_ERROR], ctl[C_ME]
    if nn == 1:
        _deliver_serial(n, ctl, plan, boxes, stages, remote, dest, words, kept, kept_dest, width, me, error)
        return
    r = t
    while r < size:
        sh[S_ROWS + r] = 0
        r += nt
    block_sync()
    tile = tt - t
    while tile < n:  # every thread of a block takes the same tiles
        k = tile + t
        tile += nn
        d = dest[k] if k < n else -1
        mine = k < n and d >= 0 and d < size
        leader, lane, below, count = warp_group(d if mine else -1)
        first = 0
        if mine and lane == leader:
            first = atomic_add(sh, S_ROWS + d, count)
        rank = warp_shuffle(first, leader) + below
        block_sync()
        r = t
        while r < size:
            took = sh[S_ROWS + r]
            if took > 0:
                sh[S_ROWS + size + 2 + r] = atomic_add(plan, cursor + r, took)
            sh[S_ROWS + r] = 0
            r += nt
        block_sync()
        if mine:
            pos = sh[S_ROWS + size + 2 + d] + rank
            if pos >= plan[grant + d]:
                _keep(words, k, kept, kept_dest, d, width, ctl)
            elif plan[node + d] < 0:
                _copy_record(words, k, remote, plan[stage + d] + pos, width)
            else:
                _copy_record(words, k, boxes[plan[node + d]], plan[offset + d] + pos, width)
        elif k < n and d == ANY and error != 0:
            _keep(words, k, kept, kept_dest, ANY, width, ctl)
    if nn > nt:  # the grid's blocks: each thread's writes visible before its block arrives (in
        # block 0, the barrier before ``_post_stamps`` and the stamping thread's fence do it)
        fence_release()


@inline_func
def pull_items(ctl, plan, boxes, stages, width):
    """PULL (one thread, after every sender's stamp): each sender's segment for this rank
    from its ``stages`` into this rank's inbox, senders in rank order (bsp's inbox); a
    sender that pushed its items (``_pushed``) put them in place already."""
    size = ctl[C_SIZE]
    grant, offset, frm, cursor, bounds, share, seen, requests, grants, stage, node, end = _plan_at(size)
    me = ctl[C_ME]
    box = boxes[plan[node + me]]
    into = 0
    for s in range(size):
        took = plan[frm + s]
        if s == me or took == 0 or plan[node + s] < 0:  # items from other nodes: their host's
            into += took
            continue
        sent, first = 0, 0  # where s staged this rank's items: after those for lower ranks
        for d in range(size):
            if d != s and plan[node + d] >= 0:
                sent += plan[grants + s * size + d]
                if d < me:
                    first += plan[grants + s * size + d]
        if not _pushed(ctl, sent * width * box.itemsize):
            src, u = stages[plan[node + s]], numba.uint64
            a, b = u(first) * u(width), u(into) * u(width)
            for w in range(u(took) * u(width)):
                box[b + w] = src[a + w]
        into += took


@inline_func
def keep_items(tt, nn, n, words, dest, kept, kept_dest, width):
    """KEEP: the items not granted back to the front of the outbox."""
    j = tt
    while j < n:
        _copy_record(kept, j, words, j, width)
        dest[j] = kept_dest[j]
        j += nn


@functools.cache
def phase_runner(width, serial):
    """``run_phase`` for items of ``width`` words (a constant there, so that copies unroll
    and vectorize), compiled apart from the launchers (``uncounted_func``): once a process for every
    step body that forwards items of this width, not inlined into each launcher (numba
    types an inlined function again at every call site it inlines it into: the phases
    inlined made each launcher's compilation take seconds more). ``serial``: for the cpu
    backend's one thread, whose paths are then known when it compiles; the many threads'
    paths are left out of its code."""

    def run_phase(cmd, t, nt, tt, nn, ctl, plan, sh, boxes, stages, remote, outbox, words, kept, kept_dest):
        """The parallel work of ``cmd`` (anything but STEP, which the launcher runs)."""
        if serial:
            t, nt, tt, nn = 0, 1, 0, 1
        n = ctl[G_N]
        if cmd == CMD_COUNT:
            count_items(t, nt, tt, nn, n, outbox.dest, ctl[C_SIZE], plan, sh)
        elif cmd == CMD_PLACE:
            place_items(tt, nn, n, ctl, plan, outbox.dest, ctl[C_SIZE])
        elif cmd == CMD_DELIVER:
            deliver_items(
                t, nt, tt, nn, n, ctl, plan, sh, boxes, stages, remote, outbox.dest, words, kept, kept_dest,
                width,
            )  # fmt: skip
        elif cmd == CMD_KEEP:
            keep_items(tt, nn, n, words, outbox.dest, kept, kept_dest, width)
        elif cmd == CMD_PULL:
            pull_items(ctl, plan, boxes, stages, width)
        return 0

    return uncounted_func(run_phase)


# ----------------------------------------------------------------------------- the leader


@uncounted_func
def begin(t, nt, ctl, cs, launch, rounds, step, first_round, slice_ns, send_mask, send_calls, send_items):
    """Start a launch: the leader's words into ``cs``; the rounds to run, whether to step
    and the round number from the host. A launch that finds a round under way (one that
    returned while it waited) resumes it where it stopped; it steps what that round brings
    only if this launch steps (a ``forward()`` resuming an interrupted ``run()`` leaves the
    round's items in the inbox, for the caller). The pending send() errors always join the
    next post."""
    k = t
    while k < MIRROR_LEN:
        cs[k] = ctl[k]
        k += nt
    block_sync()
    if t == 0:
        cs[C_LAUNCH] = launch
        cs[C_RECORDS] = 0
        cs[C_BEGAN] = now_ns()
        cs[C_SLICE] = slice_ns
        ctl[G_BROKEN] = 0
        cs[C_SEND_MASK] = cs[C_SEND_MASK] | send_mask
        cs[C_SEND_CALLS] += send_calls
        cs[C_SEND_ITEMS] += send_items
        cs[C_ROUNDS_LEFT] = rounds
        cs[C_STEP] = step
        cs[C_ROUND] = first_round
    block_sync()


@uncounted_func
def _command(t, cs, cmd, n):
    if t == 0:
        cs[G_CMD] = cmd
        cs[G_N] = n
        cs[G_WIDE] = 1 if n > cs[C_WIDE_AT] else 0
    block_sync()
    return cmd


@uncounted_func
def _exit(t, nt, ctl, cs, draft, report, status, size):
    """End the launch: the leader's words back into ``ctl``; the report the host reads
    (mapped host memory on a GPU) gets the status, the missing ranks and the rounds'
    records, which the rounds wrote into ``draft`` (device memory: a write to host memory
    would make every later fence wait for it)."""
    k = R_MISSING + t
    while k < R_MISSING + size:
        report[k] = draft[k]
        k += nt
    first = records_at(size)
    k, end = first + t, first + cs[C_RECORDS] * (REC_HEAD + 2 * size)
    while k < end:
        report[k] = draft[k]
        k += nt
    if t == 0:
        cs[G_CMD] = CMD_EXIT
        cs[G_WIDE] = 1
    block_sync()
    k = t
    while k < MIRROR_LEN:
        ctl[k] = cs[k]
        k += nt
    if t == 0:
        report[R_STATUS] = status
        report[R_RECORDS] = cs[C_RECORDS]
        report[R_ROUND] = cs[C_ROUND]
        report[R_RECEIVED] = cs[C_RECEIVED]
        report[R_ALIVE] = cs[C_ALIVE]
        report[R_DEFERRED] = cs[C_DEFERRED]
        report[R_EPOCH] = cs[C_EPOCH]
        report[R_PHASE] = cs[C_PHASE]
    block_sync()
    return CMD_EXIT


@uncounted_func
def _own_value(v, size, cs, plan, state, capacity):
    """The ``v``-th word this rank posts: its own words (``M_VALID`` ...), then its requests."""
    if v == M_VALID:
        valid = 0
        for r in range(size + 1):
            valid += plan[P_COUNTS + r]
        return valid
    if v == M_REFUSED:
        return state[REFUSED]
    if v == M_NEEDED:
        return min(state[COUNT], capacity) + state[REFUSED]
    if v == M_INVALID:
        return plan[P_COUNTS + size + 1]
    if v == M_EXAMPLE:
        return plan[P_COUNTS + size + 2]
    if v == M_SEND_MASK:
        return cs[C_SEND_MASK]
    if v == M_SEND_CALLS:
        return cs[C_SEND_CALLS]
    if v == M_SEND_ITEMS:
        return cs[C_SEND_ITEMS]
    if v == M_ANY:
        return plan[P_COUNTS + size]
    if v == M_PAUSE:
        return cs[C_PAUSE]
    return plan[P_COUNTS + v - OWN]


@uncounted_func
def _post(t, nt, mail, me, size, parity, tag, cs, plan, state, capacity, report):
    """Post this rank's words into every rank's mailbox, as stamped words (one store each);
    in a job across nodes, into ``report``, for the host to exchange (a plain copy)."""
    grant, offset, frm, cursor, bounds, share, seen, requests, grants, stage, node, end = _plan_at(size)
    words = OWN + size
    if cs[C_PROXY] != 0:
        v = t
        while v < words:
            report[R_MISSING + size + v] = _own_value(v, size, cs, plan, state, capacity)
            v += nt
        block_sync()
        return
    at = (parity * size + me) * post_words(size)
    j, pairs = t, size * words
    while j < pairs:  # (receiver, value) pairs, spread over the threads
        r, v = j // words, j % words
        _post_value(mail[plan[node + r]], at + 2 * v, _own_value(v, size, cs, plan, state, capacity), tag)
        j += nt
    block_sync()


@inline_func
def _missing(t, cs, draft, s, how):
    """Sender ``s`` did not come within the slice (``how`` 1) or closed its forwarder (2)."""
    draft[R_MISSING + s] = how
    atomic_add(cs, C_MISSING, 1)
    if how == 2:
        cs[C_LEFT] = 1


@uncounted_func
def _begin_wait(t, nt, cs, draft, size):
    if t == 0:
        cs[C_MISSING] = 0
        cs[C_LEFT] = 0
        cs[C_WAIT_BEGAN] = now_ns()
    s = t
    while s < size:
        draft[R_MISSING + s] = 0
        s += nt
    block_sync()


@uncounted_func
def _read_posts(t, nt, box, size, parity, tag, cs, plan, draft):
    """Wait for every rank's stamped words of this epoch, for at most a time slice, and
    decode them into ``plan`` (``seen``, ``requests``); return whether all came (else
    ``draft[R_MISSING + s]`` marks the missing: 1, or 2 for a rank that closed its
    forwarder, which ``cs[C_LEFT]`` notes)."""
    grant, offset, frm, cursor, bounds, share, seen, requests, grants, stage, node, end = _plan_at(size)
    _begin_wait(t, nt, cs, draft, size)
    words = OWN + size
    left = leave_at(size, 0)
    j, pairs = t, size * words
    while j < pairs:  # (sender, value) pairs, a sender's last-posted value
        s, v = j // words, words - 1 - j % words  # first: where it is in, its earlier ones are too
        at = (parity * size + s) * post_words(size) + 2 * v
        k = 0
        low = load_relaxed(box, at)
        high = load_relaxed(box, at + 1)
        while (low >> 32) != tag or (high >> 32) != tag:
            if draft[R_MISSING + s] != 0:
                break  # another word of the same sender gave up already
            if load_relaxed(box, left + s) != 0:  # it closed its forwarder: unless its
                fence_acquire()  # words came just before, they never come
                low = load_relaxed(box, at)
                high = load_relaxed(box, at + 1)
                if (low >> 32) != tag or (high >> 32) != tag:
                    _missing(t, cs, draft, s, 2)
                break
            if now_ns() - cs[C_WAIT_BEGAN] > cs[C_SLICE]:
                _missing(t, cs, draft, s, 1)
                break
            pause(k)
            k += 1
            low = load_relaxed(box, at)
            high = load_relaxed(box, at + 1)
        value = _value(low, high)
        if v < OWN:
            plan[seen + s * OWN + v] = value
        else:
            plan[requests + s * size + v - OWN] = value
        j += nt
    block_sync()
    return cs[C_MISSING] == 0


@uncounted_func
def _post_stamps(t, nt, mail, me, size, parity, tag, plan, cs):
    """Stamp every receiver of this node this rank wrote items to: they are all in its inbox.
    The leading block's threads wrote them before the barrier that precedes this (the grid's
    other blocks fenced after their writes, before they arrived); the stamping thread fences
    before its stamp, which makes the stamp a release of every write that preceded the
    barrier (a fence is cumulative: it orders the writes its thread saw happen before)."""
    grant, offset, frm, cursor, bounds, share, seen, requests, grants, stage, node, end = _plan_at(size)
    at = stamp_at(size, cs[C_PROXY]) + parity * size + me
    r = t
    while r < size:
        if r != me and plan[grant + r] > 0 and plan[node + r] >= 0:
            fence_release()
            store_relaxed(mail[plan[node + r]], at, tag)
        r += nt
    block_sync()


@uncounted_func
def _wait_stamps(t, nt, box, me, size, parity, tag, cs, draft, plan):
    """Wait for the stamp of every sender of this node with items for this rank, for at
    most a time slice; return whether all came (the missing marked as ``_read_posts``
    does). Items from other nodes are in place already (``PROXY_ITEMS``)."""
    grant, offset, frm, cursor, bounds, share, seen, requests, grants, stage, node, end = _plan_at(size)
    _begin_wait(t, nt, cs, draft, size)
    base = stamp_at(size, cs[C_PROXY]) + parity * size
    left = leave_at(size, cs[C_PROXY])
    s = t
    while s < size:
        if s != me and plan[frm + s] > 0 and plan[node + s] >= 0:
            k = 0
            while load_relaxed(box, base + s) != tag:
                if load_relaxed(box, left + s) != 0:
                    fence_acquire()
                    if load_relaxed(box, base + s) != tag:
                        _missing(t, cs, draft, s, 2)
                    break
                if now_ns() - cs[C_WAIT_BEGAN] > cs[C_SLICE]:
                    _missing(t, cs, draft, s, 1)
                    break
                pause(k)
                k += 1
            fence_acquire()
        s += nt
    block_sync()
    return cs[C_MISSING] == 0


@uncounted_func
def _agree(t, nt, me, size, capacity, cs, plan):
    """From every rank's posted words (in ``plan``): the verdict, ``alive``, the placement
    of ANY items, the grants, and where this rank's items go in each receiver's inbox."""
    grant, offset, frm, cursor, bounds, share, seen, requests, grants, stage, node, end = _plan_at(size)
    if t == 0:
        alive, anywhere, first, error, pause = 0, 0, 0, 0, 0
        for s in range(size):
            own = seen + s * OWN
            pause |= plan[own + M_PAUSE]
            alive += plan[own + M_VALID]
            anywhere += plan[own + M_ANY]
            if s < me:
                first += plan[own + M_ANY]
            if plan[own + M_REFUSED] + plan[own + M_INVALID] + plan[own + M_SEND_MASK] != 0:
                error = 1
        cs[C_ALIVE] = alive
        cs[C_PAUSE] = pause
        cs[C_ANYWHERE] = anywhere
        cs[C_MINE_ANY] = plan[seen + me * OWN + M_ANY]
        cs[G_ERROR] = error
        cs[G_ANY_FIRST] = first
        cs[G_ANY_CURSOR] = 0
        cs[G_KEPT] = 0
        if error == 0 and alive > 0 and anywhere > 0:
            place_anywhere(plan, size, anywhere, share, bounds, seen, requests)
    block_sync()
    error = cs[G_ERROR]
    r = t
    while r < size:
        plan[cursor + r] = 0
        if error == 0:
            grant_column(plan, r, size, capacity, cs[C_ROUND], requests, grants)
            plan[grant + r] = plan[grants + me * size + r]
            below = 0
            for s in range(me):
                below += plan[grants + s * size + r]
            plan[offset + r] = below
        else:
            plan[grant + r] = 0
            plan[offset + r] = 0
        r += nt
    block_sync()
    if t == 0:
        received, deferred = 0, 0
        for s in range(size):
            took = plan[grants + s * size + me] if error == 0 else 0
            plan[frm + s] = took
            received += took
            deferred += plan[requests + me * size + s] - plan[grant + s]
        cs[C_RECEIVED] = received if error == 0 else 0
        cs[C_DEFERRED] = deferred if error == 0 else 0
        local, far = 0, 0  # where each receiver's items wait: staged (this node), or remote
        for d in range(size):
            if d == me:
                plan[stage + d] = 0
            elif plan[node + d] >= 0:
                plan[stage + d] = local
                local += plan[grant + d]
            else:
                plan[stage + d] = far
                far += plan[grant + d]
        cs[G_STAGED] = local
    block_sync()


@uncounted_func
def _record(cs, draft, plan, size, now):
    """One record of the round that just ended, for ``fwd.stats``."""
    grant, offset, frm, cursor, bounds, share, seen, requests, grants, stage, node, end = _plan_at(size)
    at = records_at(size) + cs[C_RECORDS] * (REC_HEAD + 2 * size)
    draft[at + REC_ROUND] = cs[C_ROUND]
    draft[at + REC_ALIVE] = cs[C_ALIVE]
    draft[at + REC_DEFERRED] = cs[C_DEFERRED]
    draft[at + REC_RECEIVED] = cs[C_RECEIVED]
    draft[at + REC_T0] = cs[C_T0]
    draft[at + REC_T1] = cs[C_T1]
    draft[at + REC_T2] = cs[C_T2]
    draft[at + REC_T3] = cs[C_T3]
    draft[at + REC_END] = now
    for r in range(size):
        draft[at + REC_HEAD + r] = plan[grant + r]
        draft[at + REC_HEAD + size + r] = plan[frm + r]
    cs[C_RECORDS] += 1


@uncounted_func
def _crosses_nodes(plan, size, me, grant, frm, node):
    """Whether this rank sends items to, or takes items from, a rank on another node."""
    for r in range(size):
        if plan[node + r] < 0 and (plan[grant + r] > 0 or plan[frm + r] > 0):
            return True
    return False


@uncounted_func
def _next_round(t, cs, draft, plan, size):
    """The round is over: its record, and the next round's number and epoch."""
    if t == 0:
        _record(cs, draft, plan, size, now_ns())
        cs[C_ROUND] += 1
        cs[C_EPOCH] += 1


@uncounted_func
def leader(t, nt, ctl, cs, plan, draft, report, mail, outbox, capacity):
    """Run the round's protocol from where ``cs[C_PHASE]`` says until it needs parallel
    work (return its command, with ``cs[G_N]`` items) or the launch ends (``CMD_EXIT``,
    with the report written). All threads of the leading block call it together.

    A job across nodes (``cs[C_PROXY]``) returns to its host twice a round: once posted
    (``PROXY_POSTS``: the host exchanges every rank's words and writes them into ``plan``)
    and, where items cross nodes, once they are staged (``PROXY_ITEMS``: the host sends
    them and puts what came into the inbox); the launch that resumes goes on from there."""
    size = cs[C_SIZE]
    me = cs[C_ME]
    grant, offset, frm, cursor, bounds, share, seen, requests, grants, stage, node, end = _plan_at(size)
    box = mail[plan[node + me]]
    state = outbox.state
    status = BROKEN
    while True:  # every way out of a launch breaks to the one _exit below (inlined once)
        phase = cs[C_PHASE]
        parity = cs[C_EPOCH] % 2
        tag = _tag(cs[C_EPOCH])
        block_sync()  # every thread has read them before one writes them
        # A phase that needs no parallel work goes straight on to the next (``phase``, the
        # same on every thread, follows ``cs[C_PHASE]``), not round the loop again
        if phase == PH_BROKEN:
            status = BROKEN
            break
        if phase == PH_START:
            if t == 0:
                cs[C_T0] = now_ns()
                cs[C_PHASE] = PH_COUNTED
            k = t
            while k < size + 3:
                plan[P_COUNTS + k] = 0
                k += nt
            block_sync()
            return _command(t, cs, CMD_COUNT, min(state[COUNT], capacity))
        if phase == PH_COUNTED:
            if t == 0:  # the launch's last round, or its time is up: the host hears of Ctrl-C
                late = now_ns() - cs[C_BEGAN] > cs[C_SLICE]
                cs[C_PAUSE] = 1 if cs[C_ROUNDS_LEFT] <= 1 or late else 0
            block_sync()
            _post(t, nt, mail, me, size, parity, tag, cs, plan, state, capacity, report)
            if t == 0:
                cs[C_SEND_MASK] = 0
                cs[C_SEND_CALLS] = 0
                cs[C_SEND_ITEMS] = 0
                cs[C_T1] = now_ns()
                cs[C_PHASE] = PH_WAIT_A
            block_sync()
            if cs[C_PROXY] != 0:
                status = PROXY_POSTS
                break
            phase = PH_WAIT_A
        if phase == PH_WAIT_A:
            if cs[C_PROXY] == 0 and not _read_posts(t, nt, box, size, parity, tag, cs, plan, draft):
                status = LEFT if cs[C_LEFT] else WAITING
                break
            _agree(t, nt, me, size, capacity, cs, plan)
            if t == 0:
                cs[C_T2] = now_ns()
                cs[C_T3] = cs[C_T2]
            if cs[C_ALIVE] == 0 and cs[G_ERROR] == 0:
                r = t
                while r < size:
                    plan[grant + r] = 0
                    plan[frm + r] = 0
                    r += nt
                block_sync()
                _next_round(t, cs, draft, plan, size)
                if t == 0:
                    cs[C_PHASE] = PH_START
                block_sync()
                status = DONE
                break
            placing = cs[G_ERROR] == 0 and cs[C_MINE_ANY] > 0
            if t == 0:
                cs[C_PHASE] = PH_PLACED if placing else PH_DELIVERED
            block_sync()
            return _command(t, cs, CMD_PLACE if placing else CMD_DELIVER, min(state[COUNT], capacity))
        if phase == PH_PLACED:
            if t == 0:
                cs[C_PHASE] = PH_DELIVERED
            block_sync()
            return _command(t, cs, CMD_DELIVER, min(state[COUNT], capacity))
        if phase == PH_DELIVERED:
            if t == 0:
                cs[C_KEPT] = cs[G_KEPT]
                cs[C_PHASE] = PH_KEPT
            block_sync()
            if cs[C_KEPT] > 0:
                return _command(t, cs, CMD_KEEP, cs[C_KEPT])
            phase = PH_KEPT
        if phase == PH_KEPT:
            if t == 0:
                cs[C_T3] = now_ns()
                state[COUNT] = cs[C_KEPT]
                state[REFUSED] = 0
            block_sync()
            if cs[G_ERROR] != 0:
                if t == 0:
                    cs[C_EPOCH] += 1
                    cs[C_PHASE] = PH_START
                block_sync()
                status = ERROR
                break
            _post_stamps(t, nt, mail, me, size, parity, tag, plan, cs)
            if t == 0:
                cs[C_PHASE] = PH_WAIT_C
            block_sync()
            if cs[C_PROXY] != 0 and _crosses_nodes(plan, size, me, grant, frm, node):
                status = PROXY_ITEMS
                break
            phase = PH_WAIT_C
        if phase == PH_WAIT_C:
            if not _wait_stamps(t, nt, box, me, size, parity, tag, cs, draft, plan):
                status = LEFT if cs[C_LEFT] else WAITING
                break
            if t == 0:
                cs[C_PHASE] = PH_PULLED
            block_sync()
            if nt == 1:  # one thread stages what it sends: its receivers pull
                return _command(t, cs, CMD_PULL, cs[C_RECEIVED])
            phase = PH_PULLED
        if phase == PH_PULLED:
            _next_round(t, cs, draft, plan, size)
            if t == 0:
                cs[C_ROUNDS_LEFT] -= 1
                cs[C_PHASE] = PH_STEPPED
            block_sync()
            if cs[C_STEP] != 0 and cs[C_RECEIVED] > 0:
                return _command(t, cs, CMD_STEP, cs[C_RECEIVED])
        # PH_STEPPED
        if t == 0:
            cs[C_PHASE] = PH_START
        block_sync()
        if cs[C_ROUNDS_LEFT] <= 0 or cs[C_PAUSE] != 0:  # every rank pauses after this round
            status = PAUSED
            break
    return _exit(t, nt, ctl, cs, draft, report, status, size)


# ----------------------------------------------------------------------------- launchers

# The persistent kernels, made per step body (``body``), its argument count, the node's
# ranks (``shared``: the scratch's length) and the words of an item (``width``), like a
# ``@rafi.kernel`` launcher (rafi/_kernel.py): the same protocol on every target.

_LAUNCH_ARGS = (
    "ctl, plan, draft, report, mail, boxes, stages, remote, inbox, outbox, words, kept, kept_dest, launch, "
    "rounds, step, first_round, slice_ns, send_mask, send_calls, send_items"
)
LAUNCH_ARGS = len(_LAUNCH_ARGS.split(","))  # the launcher's own arguments, before the step's
_BEGIN = "ctl, cs, launch, rounds, step, first_round, slice_ns, send_mask, send_calls, send_items"

CPU_LAUNCHER = f"""
def launcher({_LAUNCH_ARGS}{{comma}}{{args}}):
    cs = ctl[{CTL_LEN} : {CTL_LEN + MIRROR_LEN}]
    sh = ctl[{CTL_LEN + MIRROR_LEN} : {CTL_LEN + MIRROR_LEN} + {{shared}}]
    begin(0, 1, {_BEGIN})
    capacity = inbox.shape[0]
    while True:
        cmd = leader(0, 1, ctl, cs, plan, draft, report, mail, outbox, capacity)
        if cmd == CMD_EXIT:
            return
        if cmd == CMD_STEP:
            steps(cs[G_N], inbox, outbox{{comma}}{{args}})
        else:
            run_phase(cmd, 0, 1, 0, 1, cs, plan, sh, boxes, stages, remote, outbox, words, kept, kept_dest)
"""

# On CUDA, block 0 works on ``cs`` (ctl[: MIRROR_LEN]) in shared memory; before a command
# the whole grid runs it writes the command's words to ``ctl``, and reads back after it what
# the grid wrote there (``_exit`` writes them all when the launch ends).
CUDA_LAUNCHER = f"""
def launcher({_LAUNCH_ARGS}{{comma}}{{args}}):
    block = cuda.blockIdx.x
    t = cuda.threadIdx.x
    nt = {{threads}}  # the block size, a constant: a loop over the block divides by shifts
    blocks = cuda.gridDim.x
    capacity = inbox.shape[0]
    word = cuda.shared.array(1, numba.int64)
    cs = cuda.shared.array(MIRROR_LEN, numba.int64)
    sh = cuda.shared.array({{shared}}, numba.int64)
    seq = 0
    patience = max(PATIENCE_NS, 20 * slice_ns)  # how long a block waits for the others
    if block == 0:
        begin(t, nt, {_BEGIN})
    while True:
        if block == 0:
            cmd = leader(t, nt, ctl, cs, plan, draft, report, mail, outbox, capacity)
            wide = blocks > 1 and cs[G_WIDE] != 0
            if wide:
                copy_words(t, nt, cs, ctl, STATE_LEN, MIRROR_LEN)
                cuda.syncthreads()
            if wide and t == 0:
                ctl[G_ARRIVED] = 0
                cuda.threadfence()
                seq += 1
                store_relaxed(ctl, G_GEN, launch * 4294967296 + seq)
        else:
            if t == 0:
                seq += 1
                k = 0
                since = now_ns()
                word[0] = CMD_EXIT
                while load_relaxed(ctl, G_GEN) != launch * 4294967296 + seq:
                    if now_ns() - since > patience:
                        cuda.atomic.add(ctl, G_BROKEN, 1)
                        break
                    pause(k)
                    k += 1
                cuda.threadfence()
                if load_relaxed(ctl, G_GEN) == launch * 4294967296 + seq:
                    word[0] = load_relaxed(ctl, G_CMD)
            cuda.syncthreads()
            cmd = word[0]
            wide = True
        if cmd == CMD_EXIT:
            return
        tt = block * nt + t if wide else t
        nn = blocks * nt if wide else nt
        words_of = ctl if wide else cs
        if cmd == CMD_STEP:  # a loop the compilers do not unroll: the step's code once
            i = tt
            while i < words_of[G_N]:
                body(i, inbox, outbox{{comma}}{{args}})
                i += nn
        else:
            run_phase(cmd, t, nt, tt, nn, words_of, plan, sh, boxes, stages, remote, outbox, words, kept,
                      kept_dest)
        cuda.syncthreads()
        if t == 0 and wide:
            cuda.threadfence()
            if block == 0:
                k = 0
                since = now_ns()
                while load_relaxed(ctl, G_ARRIVED) < blocks - 1:
                    if now_ns() - since > patience:
                        cuda.atomic.add(ctl, G_BROKEN, 1)
                        break
                    pause(k)
                    k += 1
                cuda.threadfence()
            else:
                cuda.atomic.add(ctl, G_ARRIVED, 1)
        if block == 0 and wide:  # what the grid wrote; whether a block stopped answering
            cuda.syncthreads()
            copy_words(t, nt, ctl, cs, STATE_LEN, MIRROR_LEN)
            if t == 0 and load_relaxed(ctl, G_BROKEN) != 0:
                cs[C_PHASE] = PH_BROKEN
            cuda.syncthreads()
"""


@uncounted_func
def copy_words(t, nt, src, dst, lo, hi):
    k = lo + t
    while k < hi:
        dst[k] = src[k]
        k += nt


# what the launchers' globals hold besides the step (``body`` on CUDA, its bsp loop ``steps``
# on the CPU) and ``cuda``, ``numba`` on CUDA
NAMES = ("begin", "leader", "copy_words", "now_ns", "pause", "load_relaxed", "store_relaxed", "PATIENCE_NS")
NAMES += ("G_N", "G_WIDE", "G_ARRIVED", "G_GEN", "G_BROKEN", "G_CMD", "CMD_EXIT", "CMD_STEP", "STATE_LEN")
NAMES += ("MIRROR_LEN", "C_PHASE", "PH_BROKEN")

PATIENCE_NS = 60_000_000_000  # a block of a persistent grid waits this long for the others, at least
