"""Resident rounds: forwarding on the device, with no host code between rounds.

Every rank of a node runs one persistent kernel (the cpu backend: one compiled loop) that
forwards round after round, and between rounds runs the user's ``step`` over what arrived.
Ranks signal each other through node-shared memory (kernels/signals.py): every rank's
**inbox** and **mailbox** can be written by every other rank (CUDA-IPC-mapped device
memory on GPUs, an MPI shared-memory window on the CPU: ``rafi/_transports/_mailboxes.py``).

A round (``leader``), as every rank runs it:

1. **count**: the outbox's items per destination (rows as in kernels/partition.py: one per
   rank, one for ``ANY``, one for invalid destinations);
2. **post** this rank's words into every rank's mailbox (its requests to each rank, its
   totals and error flags, as ``rafi/_control.py``'s control block), then its stamp;
3. **agree**: wait for every rank's stamp; every rank now holds the same matrix of
   requests, so each computes the same verdict (errors), the same ``alive``, the same
   placement of ``ANY`` items (``rafi/_anywhere.py``'s rule) and the same grants
   (``rafi/_flow.py``'s rule, per receiver), and from them where in each receiver's inbox
   its own items go (after those of every lower rank: the inbox bsp fills);
4. **deliver** (push): each granted item is written once, straight into its receiver's
   inbox; the rest, in order, goes to scratch and back to the front of the outbox;
5. **stamp** every receiver it wrote to, and wait for the stamps of every sender that
   wrote to it; then ``step`` runs over the inbox, and the next round begins.

Mailboxes are double-buffered by the parity of an **epoch** (one per exchange attempt,
the same count on every rank; a round that raised an error is retried in the next epoch
under the same round number). A rank can be at most one epoch ahead of any other, since
it needs every rank's post of the epoch before, so parity is enough; an inbox needs no
second buffer, since a sender writes into it only after the receiver posted the counts
it made by stepping over the inbox before. A round whose ``alive`` is 0 ends after step 3,
on every rank alike; an error ends it after step 4, with nothing moved.

A rank that closes its forwarder sets its flag in every rank's mailbox: a kernel waiting
for it returns with status ``LEFT`` (the host raises ``RankLeft``). Every wait is bounded:
after a time slice of waiting the kernel returns with status ``WAITING`` (the host checks
the deadline, signals and census questions, then launches again to resume where it
waited: ``ctl[C_PHASE]`` remembers). A launch also returns
after ``rounds`` rounds (``PAUSED``), when nothing is alive (``DONE``) or on an error
(``ERROR``); ``report`` tells the host which, and one record per round for ``fwd.stats``
(the rounds write them into ``draft``, in device memory, and the launch's end copies them).

On CUDA, block 0 runs the protocol (its threads work in parallel over peers and items);
a phase with many items is run by the whole grid (``CUDA_LAUNCHER``): the other blocks
wait for a command word, run it, and arrive at a counter. The grid is sized so that every
rank's kernel is resident at once (``rafi/_engines/_resident.py``).
"""

from rafi._kernel import kernel
from rafi._targets import func
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

__all__ = [
    "CPU_LAUNCHER",
    "CTL_LEN",
    "CUDA_LAUNCHER",
    "MAIL_W",
    "mail_len",
    "plan_len",
    "record_words",
    "report_len",
]

# ----------------------------------------------------------------------------- layouts

# ctl: this rank's own control words (device memory)
C_PHASE, C_EPOCH, C_ROUND, C_ROUNDS_LEFT, C_STEP, C_N, C_BEGAN, C_SLICE = range(8)
C_CMD, C_WIDE, C_GEN, C_ARRIVED, C_LAUNCH, C_ME, C_WIDE_AT, C_RECORDS = range(8, 16)
C_SEND_MASK, C_SEND_CALLS, C_SEND_ITEMS, C_ANY_FIRST, C_ANY_CURSOR, C_KEPT, C_ERROR = range(16, 23)
C_ALIVE, C_RECEIVED, C_DEFERRED, C_MISSING, C_T0, C_T1, C_T2, C_T3, C_BROKEN, C_LEFT = range(23, 33)
C_WAIT_BEGAN = 33
CTL_LEN = 34

# phases of a round (ctl[C_PHASE])
PH_START, PH_COUNTED, PH_WAIT_A, PH_DELIVERED, PH_KEPT, PH_WAIT_C, PH_STEPPED, PH_BROKEN, PH_PLACED = range(9)

# commands: the parallel work of a phase
CMD_EXIT, CMD_COUNT, CMD_DELIVER, CMD_KEEP, CMD_STEP, CMD_PLACE = range(6)

# report statuses
RUNNING, PAUSED, DONE, ERROR, WAITING, BROKEN, LEFT = range(7)

# a mailbox entry: what one sender posts to one receiver in one epoch
M_STAMP_A, M_STAMP_C = 0, 1
M_VALID, M_REFUSED, M_NEEDED, M_INVALID, M_EXAMPLE, M_SEND_MASK, M_SEND_CALLS, M_SEND_ITEMS, M_ANY = range(
    2, 11
)
OWN = 9  # the sender's own words, M_VALID .. M_ANY
M_REQ = 11  # then its requests, one per rank
MAIL_W = M_REQ  # + size


def leave_at(size):
    """Where a rank's mailbox holds, per sender, whether it closed its forwarder (1)."""
    return 2 * size * (MAIL_W + size)


def mail_len(size):
    """Words of one rank's mailbox: two parities, one entry per sender; then the leaving flags."""
    return leave_at(size) + size


# plan: the round's working words (device memory)
P_COUNTS = 0  # size + 3: items per row (ranks, ANY, invalid), then an invalid example


@func
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
    return grant, offset, frm, cursor, bounds, share, seen, requests, grants, grants + size * size


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


def report_len(size, records):
    return R_MISSING + size + records * record_words(size)


# ----------------------------------------------------------------------------- the rules


@func
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


@func
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
        mine = plan[seen + s * OWN + (M_ANY - M_VALID)]
        for r in range(size):
            start = max(first, plan[bounds + r])
            stop = min(first + mine, plan[bounds + r + 1])
            if stop > start:
                plan[requests + s * size + r] += stop - start
        first += mine


@func
def rank_of(plan, g, size, bounds):
    """The rank that global ANY index ``g`` goes to."""
    for r in range(size):
        if g < plan[bounds + r + 1]:
            return r
    return size - 1


# ----------------------------------------------------------------------------- parallel phases


@func
def count_items(t, nt, n, dest, size, plan):
    """COUNT: items per row into ``plan[P_COUNTS ...]`` (zeroed by the leader)."""
    for k in range(t, n, nt):
        d = dest[k]
        row = row_of(d, size)
        atomic_add(plan, P_COUNTS + row, 1)
        if row == size + 1:
            plan[P_COUNTS + size + 2] = d


@func
def _copy_record(src, k, dst, at, width):
    """Item ``k`` of ``src`` into slot ``at`` of ``dst``, four words loaded before any is
    stored (a GPU thread then waits for memory once per four words, not once per word)."""
    a, b, w = k * width, at * width, 0
    while w + 4 <= width:
        w0, w1, w2, w3 = src[a + w], src[a + w + 1], src[a + w + 2], src[a + w + 3]
        dst[b + w], dst[b + w + 1], dst[b + w + 2], dst[b + w + 3] = w0, w1, w2, w3
        w += 4
    while w < width:
        dst[b + w] = src[a + w]
        w += 1


@func
def place_items(t, nt, n, ctl, plan, dest, size):
    """PLACE: give every ``ANY`` item its rank, in push order on the cpu backend (the k-th
    ANY item of all ranks, counted from this rank's first, goes where ``bounds`` says)."""
    bounds = _plan_at(size)[4]
    for k in range(t, n, nt):
        if dest[k] == ANY:
            g = ctl[C_ANY_FIRST] + atomic_add(ctl, C_ANY_CURSOR, 1)
            dest[k] = rank_of(plan, g, size, bounds)


@func
def deliver_items(t, nt, n, ctl, plan, boxes, dest, words, kept, kept_dest, width):
    """DELIVER: every granted item once into its receiver's inbox, the rest to scratch, one
    receiver after another (its inbox is taken from the tuple once, not once per item);
    after an error nothing is granted and the ``ANY`` items are kept too."""
    size = len(boxes)
    grant, offset, frm, cursor, bounds, share, seen, requests, grants, end = _plan_at(size)
    for d in range(size):
        box, granted, at = boxes[d], plan[grant + d], plan[offset + d]
        for k in range(t, n, nt):
            if dest[k] == d:
                pos = atomic_add(plan, cursor + d, 1)
                if pos < granted:
                    _copy_record(words, k, box, at + pos, width)
                else:
                    _keep(words, k, kept, kept_dest, d, width, ctl)
    if ctl[C_ERROR] != 0:
        for k in range(t, n, nt):
            if dest[k] == ANY:
                _keep(words, k, kept, kept_dest, ANY, width, ctl)
    fence_release()


@func
def _keep(words, k, kept, kept_dest, d, width, ctl):
    at = atomic_add(ctl, C_KEPT, 1)
    _copy_record(words, k, kept, at, width)
    kept_dest[at] = d


@func
def keep_items(t, nt, n, words, dest, kept, kept_dest, width):
    """KEEP: the items not granted back to the front of the outbox."""
    for j in range(t, n, nt):
        _copy_record(kept, j, words, j, width)
        dest[j] = kept_dest[j]


@func
def run_phase(cmd, t, nt, ctl, plan, boxes, outbox, words, kept, kept_dest, width):
    """The parallel work of ``cmd`` (anything but STEP, which the launcher runs)."""
    n = ctl[C_N]
    if cmd == CMD_COUNT:
        count_items(t, nt, n, outbox.dest, len(boxes), plan)
    elif cmd == CMD_PLACE:
        place_items(t, nt, n, ctl, plan, outbox.dest, len(boxes))
    elif cmd == CMD_DELIVER:
        deliver_items(t, nt, n, ctl, plan, boxes, outbox.dest, words, kept, kept_dest, width)
    elif cmd == CMD_KEEP:
        keep_items(t, nt, n, words, outbox.dest, kept, kept_dest, width)


# ----------------------------------------------------------------------------- the leader


@func
def begin(t, ctl, launch, rounds, step, first_round, slice_ns, send_mask, send_calls, send_items):
    """Start a launch. The pending send() errors always join the next post. A launch that
    finds its rounds between two rounds (``PH_START``) takes the rounds to run, the step and
    the round number from the host; one that finds a round under way (a wait that ran out of
    time slice) resumes it with its own."""
    if t == 0:
        ctl[C_LAUNCH] = launch
        ctl[C_RECORDS] = 0
        ctl[C_BEGAN] = now_ns()
        ctl[C_SLICE] = slice_ns
        ctl[C_BROKEN] = 0
        ctl[C_SEND_MASK] = ctl[C_SEND_MASK] | send_mask
        ctl[C_SEND_CALLS] += send_calls
        ctl[C_SEND_ITEMS] += send_items
        if ctl[C_PHASE] == PH_START:
            ctl[C_ROUNDS_LEFT] = rounds
            ctl[C_STEP] = step
            ctl[C_ROUND] = first_round
    block_sync()


@func
def _command(t, ctl, cmd, n):
    if t == 0:
        ctl[C_CMD] = cmd
        ctl[C_N] = n
        ctl[C_WIDE] = 1 if n > ctl[C_WIDE_AT] else 0
    block_sync()
    return cmd


@func
def _exit(t, nt, ctl, draft, report, status, size):
    """End the launch: the report the host reads (mapped host memory on a GPU) gets the
    status, the missing ranks and the rounds' records, which the rounds wrote into
    ``draft`` (device memory: a write to host memory would make every later fence wait
    for it)."""
    for k in range(R_MISSING + t, R_MISSING + size + ctl[C_RECORDS] * (REC_HEAD + 2 * size), nt):
        report[k] = draft[k]
    if t == 0:
        report[R_STATUS] = status
        report[R_RECORDS] = ctl[C_RECORDS]
        report[R_ROUND] = ctl[C_ROUND]
        report[R_RECEIVED] = ctl[C_RECEIVED]
        report[R_ALIVE] = ctl[C_ALIVE]
        report[R_DEFERRED] = ctl[C_DEFERRED]
        report[R_EPOCH] = ctl[C_EPOCH]
        report[R_PHASE] = ctl[C_PHASE]
        ctl[C_CMD] = CMD_EXIT
        ctl[C_WIDE] = 1
    block_sync()
    return CMD_EXIT


@func
def _post_counts(t, nt, mail, me, size, parity, stamp, ctl, plan, state, capacity):
    """Post this rank's requests and words into every rank's mailbox, then the stamp."""
    valid = 0
    for r in range(size + 1):
        valid += plan[P_COUNTS + r]
    pushed = min(state[COUNT], capacity)
    entry = MAIL_W + size
    for r in range(t, size, nt):
        box = mail[r]
        at = (parity * size + me) * entry
        box[at + M_VALID] = valid
        box[at + M_REFUSED] = state[REFUSED]
        box[at + M_NEEDED] = pushed + state[REFUSED]
        box[at + M_INVALID] = plan[P_COUNTS + size + 1]
        box[at + M_EXAMPLE] = plan[P_COUNTS + size + 2]
        box[at + M_SEND_MASK] = ctl[C_SEND_MASK]
        box[at + M_SEND_CALLS] = ctl[C_SEND_CALLS]
        box[at + M_SEND_ITEMS] = ctl[C_SEND_ITEMS]
        box[at + M_ANY] = plan[P_COUNTS + size]
        for d in range(size):
            box[at + M_REQ + d] = plan[P_COUNTS + d]
        fence_release()
        store_relaxed(box, at + M_STAMP_A, stamp)
    block_sync()


@func
def _post_stamps(t, nt, mail, me, size, parity, stamp, plan, grant):
    """Stamp every receiver this rank wrote items to: they are all in its inbox."""
    entry = MAIL_W + size
    for r in range(t, size, nt):
        if r != me and plan[grant + r] > 0:
            fence_release()
            store_relaxed(mail[r], (parity * size + me) * entry + M_STAMP_C, stamp)
    block_sync()


@func
def _wait_stamps(t, nt, box, me, size, parity, word, stamp, ctl, draft, plan, frm):
    """Wait for the stamp ``word`` of every sender (``frm < 0``) or of those with items for
    this rank (``plan[frm + s] > 0``), for at most a time slice; return
    whether all came (else ``draft[R_MISSING + s]`` marks the missing: 1, or 2 for a rank
    that closed its forwarder, which ``ctl[C_LEFT]`` counts)."""
    if t == 0:
        ctl[C_MISSING] = 0
        ctl[C_LEFT] = 0
        ctl[C_WAIT_BEGAN] = now_ns()
    block_sync()
    entry = MAIL_W + size
    left = 2 * size * entry  # leave_at(size)
    for s in range(t, size, nt):
        needed = frm < 0 or (s != me and plan[frm + s] > 0)
        draft[R_MISSING + s] = 0
        if needed:
            at = (parity * size + s) * entry + word
            k = 0
            while load_relaxed(box, at) != stamp:
                if load_relaxed(box, left + s) != 0:  # it closed its forwarder: unless its
                    fence_acquire()  # stamp came just before, it never comes
                    if load_relaxed(box, at) != stamp:
                        draft[R_MISSING + s] = 2
                        atomic_add(ctl, C_LEFT, 1)
                        atomic_add(ctl, C_MISSING, 1)
                    break
                if now_ns() - ctl[C_WAIT_BEGAN] > ctl[C_SLICE]:
                    draft[R_MISSING + s] = 1
                    atomic_add(ctl, C_MISSING, 1)
                    break
                pause(k)
                k += 1
            fence_acquire()
    block_sync()
    fence_acquire()
    return ctl[C_MISSING] == 0


@func
def _agree(t, nt, box, me, size, parity, capacity, ctl, plan):
    """Read every rank's posted words; compute the verdict, ``alive``, the placement of
    ANY items, the grants, and where this rank's items go in each receiver's inbox."""
    grant, offset, frm, cursor, bounds, share, seen, requests, grants, end = _plan_at(size)
    entry = MAIL_W + size
    for s in range(t, size, nt):
        at = (parity * size + s) * entry
        for k in range(OWN):
            plan[seen + s * OWN + k] = load_relaxed(box, at + M_VALID + k)
        for r in range(size):
            plan[requests + s * size + r] = load_relaxed(box, at + M_REQ + r)
    block_sync()
    if t == 0:
        alive, anywhere, first, error = 0, 0, 0, 0
        for s in range(size):
            own = seen + s * OWN
            alive += plan[own + (M_VALID - M_VALID)]
            anywhere += plan[own + (M_ANY - M_VALID)]
            if s < me:
                first += plan[own + (M_ANY - M_VALID)]
            flags = plan[own + (M_REFUSED - M_VALID)] + plan[own + (M_INVALID - M_VALID)]
            if flags + plan[own + (M_SEND_MASK - M_VALID)] != 0:
                error = 1
        ctl[C_ALIVE] = alive
        ctl[C_ERROR] = error
        ctl[C_ANY_FIRST] = first
        ctl[C_ANY_CURSOR] = 0
        ctl[C_KEPT] = 0
        if error == 0 and alive > 0 and anywhere > 0:
            place_anywhere(plan, size, anywhere, share, bounds, seen, requests)
    block_sync()
    error = ctl[C_ERROR]
    for r in range(t, size, nt):
        plan[cursor + r] = 0
        if error == 0:
            grant_column(plan, r, size, capacity, ctl[C_ROUND], requests, grants)
            plan[grant + r] = plan[grants + me * size + r]
            below = 0
            for s in range(me):
                below += plan[grants + s * size + r]
            plan[offset + r] = below
        else:
            plan[grant + r] = 0
            plan[offset + r] = 0
    block_sync()
    for s in range(t, size, nt):
        plan[frm + s] = plan[grants + s * size + me] if error == 0 else 0
    block_sync()
    if t == 0:
        received, deferred = 0, 0
        for s in range(size):
            received += plan[frm + s]
            deferred += plan[requests + me * size + s] - plan[grant + s]
        ctl[C_RECEIVED] = received if error == 0 else 0
        ctl[C_DEFERRED] = deferred if error == 0 else 0
    block_sync()


@func
def _record(ctl, draft, plan, size, now):
    """One record of the round that just ended, for ``fwd.stats``."""
    grant, offset, frm, cursor, bounds, share, seen, requests, grants, end = _plan_at(size)
    at = R_MISSING + size + ctl[C_RECORDS] * (REC_HEAD + 2 * size)
    draft[at + REC_ROUND] = ctl[C_ROUND]
    draft[at + REC_ALIVE] = ctl[C_ALIVE]
    draft[at + REC_DEFERRED] = ctl[C_DEFERRED]
    draft[at + REC_RECEIVED] = ctl[C_RECEIVED]
    draft[at + REC_T0] = ctl[C_T0]
    draft[at + REC_T1] = ctl[C_T1]
    draft[at + REC_T2] = ctl[C_T2]
    draft[at + REC_T3] = ctl[C_T3]
    draft[at + REC_END] = now
    for r in range(size):
        draft[at + REC_HEAD + r] = plan[grant + r]
        draft[at + REC_HEAD + size + r] = plan[frm + r]
    ctl[C_RECORDS] += 1


@func
def leader(t, nt, ctl, plan, draft, report, mail, outbox, capacity):
    """Run the round's protocol from where ``ctl[C_PHASE]`` says until it needs parallel
    work (return its command, with ``ctl[C_N]`` items) or the launch ends (``CMD_EXIT``,
    with the report written). All threads of the leading block call it together."""
    size = len(mail)
    me = ctl[C_ME]
    box = mail[me]
    grant, offset, frm, cursor, bounds, share, seen, requests, grants, end = _plan_at(size)
    state = outbox.state
    while True:
        if t == 0 and load_relaxed(ctl, C_BROKEN) != 0:  # a block of the grid stopped answering
            ctl[C_PHASE] = PH_BROKEN
        block_sync()
        phase = ctl[C_PHASE]
        parity = ctl[C_EPOCH] % 2
        stamp = ctl[C_EPOCH] + 1
        block_sync()  # every thread has read them before one writes them
        if phase == PH_BROKEN:
            return _exit(t, nt, ctl, draft, report, BROKEN, size)
        if phase == PH_START:
            if t == 0:
                ctl[C_T0] = now_ns()
                for k in range(size + 3):
                    plan[P_COUNTS + k] = 0
                ctl[C_PHASE] = PH_COUNTED
            block_sync()
            return _command(t, ctl, CMD_COUNT, min(state[COUNT], capacity))
        if phase == PH_COUNTED:
            _post_counts(t, nt, mail, me, size, parity, stamp, ctl, plan, state, capacity)
            if t == 0:
                ctl[C_SEND_MASK] = 0
                ctl[C_SEND_CALLS] = 0
                ctl[C_SEND_ITEMS] = 0
                ctl[C_T1] = now_ns()
                ctl[C_PHASE] = PH_WAIT_A
        elif phase == PH_WAIT_A:
            if not _wait_stamps(t, nt, box, me, size, parity, M_STAMP_A, stamp, ctl, draft, plan, -1):
                return _exit(t, nt, ctl, draft, report, LEFT if ctl[C_LEFT] else WAITING, size)
            _agree(t, nt, box, me, size, parity, capacity, ctl, plan)
            if t == 0:
                ctl[C_T2] = now_ns()
                ctl[C_T3] = ctl[C_T2]
            if ctl[C_ALIVE] == 0 and ctl[C_ERROR] == 0:
                if t == 0:
                    for r in range(size):
                        plan[grant + r] = 0
                        plan[frm + r] = 0
                    _record(ctl, draft, plan, size, now_ns())
                    ctl[C_ROUND] += 1
                    ctl[C_EPOCH] += 1
                    ctl[C_PHASE] = PH_START
                block_sync()
                return _exit(t, nt, ctl, draft, report, DONE, size)
            mine = plan[seen + me * OWN + (M_ANY - M_VALID)]  # this rank's ANY items
            if t == 0:
                ctl[C_PHASE] = PH_PLACED if ctl[C_ERROR] == 0 and mine > 0 else PH_DELIVERED
            block_sync()
            if ctl[C_PHASE] == PH_PLACED:
                return _command(t, ctl, CMD_PLACE, min(state[COUNT], capacity))
            return _command(t, ctl, CMD_DELIVER, min(state[COUNT], capacity))
        elif phase == PH_PLACED:
            if t == 0:
                ctl[C_PHASE] = PH_DELIVERED
            block_sync()
            return _command(t, ctl, CMD_DELIVER, min(state[COUNT], capacity))
        elif phase == PH_DELIVERED:
            if t == 0:
                ctl[C_PHASE] = PH_KEPT
            block_sync()
            if ctl[C_KEPT] > 0:
                return _command(t, ctl, CMD_KEEP, ctl[C_KEPT])
        elif phase == PH_KEPT:
            if t == 0:
                ctl[C_T3] = now_ns()
                state[COUNT] = ctl[C_KEPT]
                state[REFUSED] = 0
            block_sync()
            if ctl[C_ERROR] != 0:
                if t == 0:
                    ctl[C_EPOCH] += 1
                    ctl[C_PHASE] = PH_START
                block_sync()
                return _exit(t, nt, ctl, draft, report, ERROR, size)
            _post_stamps(t, nt, mail, me, size, parity, stamp, plan, grant)
            if t == 0:
                ctl[C_PHASE] = PH_WAIT_C
        elif phase == PH_WAIT_C:
            if not _wait_stamps(t, nt, box, me, size, parity, M_STAMP_C, stamp, ctl, draft, plan, frm):
                return _exit(t, nt, ctl, draft, report, LEFT if ctl[C_LEFT] else WAITING, size)
            if t == 0:
                _record(ctl, draft, plan, size, now_ns())
                ctl[C_ROUND] += 1
                ctl[C_EPOCH] += 1
                ctl[C_ROUNDS_LEFT] -= 1
                ctl[C_PHASE] = PH_STEPPED
            block_sync()
            if ctl[C_STEP] != 0 and ctl[C_RECEIVED] > 0:
                return _command(t, ctl, CMD_STEP, ctl[C_RECEIVED])
        else:  # PH_STEPPED
            if t == 0:
                ctl[C_PHASE] = PH_START
            block_sync()
            if ctl[C_ROUNDS_LEFT] <= 0:
                return _exit(t, nt, ctl, draft, report, PAUSED, size)


# ----------------------------------------------------------------------------- launchers

# The persistent kernels, made per step body (``body``) and its argument count, like a
# ``@rafi.kernel`` launcher (rafi/_kernel.py): the same protocol on every target.

_LAUNCH_ARGS = (
    "ctl, plan, draft, report, mail, boxes, inbox, outbox, words, kept, kept_dest, launch, rounds, "
    "step, first_round, slice_ns, send_mask, send_calls, send_items"
)

CPU_LAUNCHER = f"""
def launcher({_LAUNCH_ARGS}{{comma}}{{args}}):
    begin(0, ctl, launch, rounds, step, first_round, slice_ns, send_mask, send_calls, send_items)
    capacity = inbox.shape[0]
    width = words.shape[0] // capacity
    while True:
        cmd = leader(0, 1, ctl, plan, draft, report, mail, outbox, capacity)
        if cmd == CMD_EXIT:
            return
        if cmd == CMD_STEP:
            for i in range(ctl[C_N]):
                body(i, inbox, outbox{{comma}}{{args}})
        else:
            run_phase(cmd, 0, 1, ctl, plan, boxes, outbox, words, kept, kept_dest, width)
"""

CUDA_LAUNCHER = f"""
def launcher({_LAUNCH_ARGS}{{comma}}{{args}}):
    block = cuda.blockIdx.x
    t = cuda.threadIdx.x
    nt = cuda.blockDim.x
    blocks = cuda.gridDim.x
    capacity = inbox.shape[0]
    width = words.shape[0] // capacity
    word = cuda.shared.array(1, numba.int64)
    seq = 0
    patience = max(PATIENCE_NS, 20 * slice_ns)  # how long a block waits for the others
    if block == 0:
        begin(t, ctl, launch, rounds, step, first_round, slice_ns, send_mask, send_calls, send_items)
    while True:
        if block == 0:
            cmd = leader(t, nt, ctl, plan, draft, report, mail, outbox, capacity)
            wide = blocks > 1 and ctl[C_WIDE] != 0
            if wide and t == 0:
                ctl[C_ARRIVED] = 0
                cuda.threadfence()
                seq += 1
                store_relaxed(ctl, C_GEN, launch * 4294967296 + seq)
        else:
            if t == 0:
                seq += 1
                k = 0
                since = now_ns()
                word[0] = CMD_EXIT
                while load_relaxed(ctl, C_GEN) != launch * 4294967296 + seq:
                    if now_ns() - since > patience:
                        cuda.atomic.add(ctl, C_BROKEN, 1)
                        break
                    pause(k)
                    k += 1
                cuda.threadfence()
                if load_relaxed(ctl, C_GEN) == launch * 4294967296 + seq:
                    word[0] = load_relaxed(ctl, C_CMD)
            cuda.syncthreads()
            cmd = word[0]
            wide = True
        if cmd == CMD_EXIT:
            return
        tt = block * nt + t if wide else t
        nn = blocks * nt if wide else nt
        if cmd == CMD_STEP:
            for i in range(tt, ctl[C_N], nn):
                body(i, inbox, outbox{{comma}}{{args}})
        else:
            run_phase(cmd, tt, nn, ctl, plan, boxes, outbox, words, kept, kept_dest, width)
        cuda.syncthreads()
        if t == 0 and wide:
            cuda.threadfence()
            if block == 0:
                k = 0
                since = now_ns()
                while load_relaxed(ctl, C_ARRIVED) < blocks - 1:
                    if now_ns() - since > patience:
                        cuda.atomic.add(ctl, C_BROKEN, 1)
                        break
                    pause(k)
                    k += 1
                cuda.threadfence()
            else:
                cuda.atomic.add(ctl, C_ARRIVED, 1)
"""

# what the launchers' globals hold besides ``body`` (and ``cuda``, ``numba`` on CUDA)
NAMES = ("begin", "leader", "run_phase", "now_ns", "pause", "load_relaxed", "store_relaxed", "PATIENCE_NS")
NAMES += ("C_N", "C_WIDE", "C_ARRIVED", "C_GEN", "C_BROKEN", "C_CMD", "CMD_EXIT", "CMD_STEP")

PATIENCE_NS = 60_000_000_000  # a block of a persistent grid waits this long for the others, at least
