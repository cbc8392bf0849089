"""What the resident protocol's primitives cost on this GPU (kernels/signals.py, kernels/warps.py).

One block of 256 threads runs each primitive ``N`` times in a loop, timed by thread 0 with
``%globaltimer``; the table gives nanoseconds per turn. A round of kernels/resident.py is a
chain of these (barriers, system-scope fences, loads of words other processes write, warp
matches), so the table says which of them a round's microseconds can come from.

    python bench/gpu_primitives.py
"""

import numba
import numpy as np
from numba import cuda, int64

from rafi._targets import enable_cuda

enable_cuda()  # the CUDA versions of rafi's device primitives, before they are compiled in

from rafi.kernels.signals import fence_release, load_relaxed, now_ns, store_relaxed  # noqa: E402
from rafi.kernels.warps import warp_group  # noqa: E402

N = 2000
ALL = 0xFFFFFFFF
NAMES = (
    "bar.sync",
    "fence.acq_rel.sys by thread 0, then a barrier",
    "fence.acq_rel.sys by every thread, then a barrier",
    "a store and fence.acq_rel.sys by every thread, then a barrier",
    "dependent ld.relaxed.sys (thread 0)",
    "dependent ld.global (thread 0)",
    "dependent ld.shared (thread 0)",
    "%globaltimer read",
    "global atomic add, result used (thread 0)",
    "st.relaxed.sys then ld.relaxed.sys of one word (thread 0)",
    "warp_group (match.any.sync.b64), shared atomic, barrier",
    "store, fence.acq_rel.sys, st.relaxed.sys (a stamp, thread 0)",
    "match.any.sync.b64, then a barrier",
    "match.any.sync.b32, then a barrier",
)


@cuda.jit
def primitives(g, out, peer):
    t = cuda.threadIdx.x
    sh = cuda.shared.array(4096, int64)
    for k in range(t, 4096, cuda.blockDim.x):
        sh[k] = (k * 7 + 1) % 4096
    cuda.syncthreads()
    x, s = 0, 0
    t0 = now_ns()
    for k in range(N):
        cuda.syncthreads()
    out[0] = now_ns() - t0
    t0 = now_ns()
    for k in range(N):
        if t == 0:
            fence_release()
        cuda.syncthreads()
    out[1] = now_ns() - t0
    t0 = now_ns()
    for k in range(N):
        fence_release()
        cuda.syncthreads()
    out[2] = now_ns() - t0
    t0 = now_ns()
    for k in range(N):
        g[1024 + t] = k
        fence_release()
        cuda.syncthreads()
    out[3] = now_ns() - t0
    t0 = now_ns()
    if t == 0:
        for k in range(N):
            x = load_relaxed(g, x)
    out[4] = now_ns() - t0
    t0 = now_ns()
    if t == 0:
        for k in range(N):
            x = g[x]
    out[5] = now_ns() - t0
    t0 = now_ns()
    if t == 0:
        for k in range(N):
            x = sh[x]
    out[6] = now_ns() - t0
    t0 = now_ns()
    for k in range(N):
        s += now_ns()
    out[7] = now_ns() - t0
    t0 = now_ns()
    if t == 0:
        for k in range(N):
            x = cuda.atomic.add(g, 2048 + (x & 1), 1)
    out[8] = now_ns() - t0
    t0 = now_ns()
    if t == 0:
        for k in range(N):
            store_relaxed(g, 3000, k)
            x += load_relaxed(g, 3000)
    out[9] = now_ns() - t0
    t0 = now_ns()
    for k in range(N):
        leader, lane, below, count = warp_group(t & 3)
        if lane == leader:
            cuda.atomic.add(sh, t & 3, count)
        cuda.syncthreads()
    out[10] = now_ns() - t0
    t0 = now_ns()
    if t == 0:
        for k in range(N):
            peer[k % 64] = k
            fence_release()
            store_relaxed(peer, 100, k)
    out[11] = now_ns() - t0
    t0 = now_ns()
    for k in range(N):
        x += cuda.match_any_sync(ALL, t & 3)
        cuda.syncthreads()
    out[12] = now_ns() - t0
    t0 = now_ns()
    for k in range(N):
        x += cuda.match_any_sync(ALL, numba.int32(t & 3))
        cuda.syncthreads()
    out[13] = now_ns() - t0
    out[len(NAMES)] = x + s  # what the loops computed, so that none is optimized away


def main():
    words = np.zeros(4096, np.int64)
    words[:1024] = (np.arange(1024) * 7 + 1) % 1024  # a chain of dependent loads
    g = cuda.to_device(words)
    out = cuda.to_device(np.zeros(len(NAMES) + 1, np.int64))
    peer = cuda.to_device(np.zeros(128, np.int64))
    for _ in range(3):  # the first compiles and warms up
        primitives[1, 256](g, out, peer)
        cuda.synchronize()
    times = out.copy_to_host()
    print(f"# {cuda.get_current_device().name.decode()}: ns per operation, one block of 256 threads")
    for name, ns in zip(NAMES, times):
        print(f"{name:64s} {ns / N:8.1f}")


if __name__ == "__main__":
    main()
