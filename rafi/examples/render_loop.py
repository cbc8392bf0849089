"""What the image-making examples share: their options, the sample-pass loop, the output.

A program describes its work as a ``Work`` (item dtype, capacity of one sample, camera and
trace kernels with their arguments); ``render`` runs it on every rank: for each pass the
camera kernel starts one ray per pixel of this rank's share for each of the pass's samples,
then ``trace`` runs on what arrives (rounds of ``forward()``, or async batches) until no ray
is left anywhere; pixel values are summed at their owner by a ``rafi.Reducer`` of ``3 *
pixels`` entries, and rank 0 gets the mean over the samples. A pass traces several samples
together (``--samples-per-pass``; by default as many as fit in memory, ``samples_per_pass``):
the rays of every sample cross the domains in the same rounds, so a render takes about the
rounds of one sample instead of one sample's rounds per sample. Kernel signatures:
``camera(i, outbox, red, pixel0, sample, *camera_args)`` for pixel ``pixel0 + i``, and
``trace(i, inbox, outbox, red, *trace_args)``. Numpy arrays among the arguments are put on
the forwarder's backend.
"""

import contextlib
import gc
import json
import os
import sys
import time
from typing import NamedTuple

import numpy as np
from mpi4py import MPI

import rafi
from rafi._errors import collective
from rafi._mpi_support import node_local

__all__ = [
    "Work",
    "add_options",
    "check_options",
    "render",
    "samples_per_pass",
    "forwarding",
    "settle_heap",
    "settling",
    "to_png",
    "report",
    "run_options",
]


class Work(NamedTuple):
    """What a program traces: see the module docstring."""

    item: np.dtype
    capacity: int  # items one rank may hold of one sample's rays
    camera: rafi.Kernel
    camera_args: tuple
    trace: rafi.Kernel
    trace_args: tuple
    options: tuple  # names of the options that make the image (a resume must match them)


def add_options(p, width=160, height=120, samples=2):
    """Add the options every image-making example takes to the parser ``p``."""
    p.add_argument("--width", type=int, default=width)
    p.add_argument("--height", type=int, default=height)
    p.add_argument("--samples", type=int, default=samples)
    fit = "samples traced together (0, the default: as many as fit in half the memory free for each rank)"
    p.add_argument("--samples-per-pass", type=int, default=0, help=fit)
    p.add_argument("--backend", default="auto", choices=["auto", "cuda", "cpu"])
    p.add_argument("--mode", default="bsp", choices=["bsp", "async"], help="rounds, or items flowing freely")
    p.add_argument("--progress", default="auto", choices=("auto", "poll", "thread"), help="async mode")
    p.add_argument("--output", default="image.png", help="a PNG, or .npy for the raw float64 image")
    p.add_argument("--stats", help="write per-round forwarding stats and totals as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--checkpoint", help="write in-flight rays and the image so far to this HDF5 file")
    p.add_argument("--checkpoint-every", type=int, default=10, help="rounds between checkpoints")
    p.add_argument("--resume", help="continue from this checkpoint (same ranks and options)")


def check_options(p, opts):
    """Reject what ``add_options``' options cannot do together (``p.error`` exits)."""
    if opts.width < 1 or opts.height < 1:
        p.error("--width and --height must be at least 1")
    if not 1 <= opts.samples <= 2**20:
        p.error("--samples must be between 1 and 2**20 (each (pixel, sample) has its own random stream)")
    if opts.samples_per_pass < 0:
        p.error("--samples-per-pass must be at least 1, or 0 for as many as fit in memory")
    if opts.mode == "async" and (opts.checkpoint or opts.resume):
        p.error("--checkpoint and --resume checkpoint between rounds: use them with --mode bsp")


def run_options(opts, work):
    """The options that make the image: a resume must use the same (others may change)."""
    return {name: getattr(opts, name) for name in work.options}


def render(opts, comm, work):
    """Render ``work`` on all ranks of ``comm``; return ``(image or None, info)`` (image on rank 0)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    pixels = opts.width * opts.height
    with contextlib.ExitStack() as stack:
        settle = stack.enter_context(settling())
        red = stack.enter_context(rafi.Reducer(comm, 3 * pixels, np.float64, backend=opts.backend))
        first_sample, rays, resuming = 0, 0, False
        mode, progress = getattr(opts, "mode", "bsp"), getattr(opts, "progress", "auto")
        if getattr(opts, "resume", None):
            fwd, state = rafi.Forwarder.restore(
                comm, opts.resume, backend=opts.backend, options=run_options(opts, work)
            )
            red.local[:] = state["image"]
            first_sample, rays, resuming = int(state["sample"][0]), int(state["rays"][0]), True
            per_pass = int(state["samples_per_pass"][0]) if "samples_per_pass" in state else 1
            asked = min(getattr(opts, "samples_per_pass", 0), opts.samples)
            if asked and asked != per_pass:  # the same on every rank: each raises
                stack.enter_context(fwd)
                raise collective(
                    rafi.ConfigError(
                        f"the checkpoint traces {per_pass} samples per pass, not {asked} "
                        "(--samples-per-pass: leave it out to resume)"
                    )
                )
        else:
            per_pass = getattr(opts, "samples_per_pass", 0)
            per_pass = min(per_pass or samples_per_pass(comm, red.backend, work, opts, mode), opts.samples)
            fwd = rafi.Forwarder(
                comm, work.item, per_pass * work.capacity, backend=opts.backend, mode=mode, progress=progress
            )
        stack.enter_context(fwd)
        camera_args = _on_backend(fwd, work.camera_args)
        trace = (fwd.outbox, red, *_on_backend(fwd, work.trace_args))
        first, count = _share(pixels, rank, size)
        bar = _progress(rank, opts, first_sample)
        started, compiled = time.perf_counter(), rafi.compile_seconds()
        for sample in range(first_sample, opts.samples, per_pass):
            samples = range(sample, min(sample + per_pass, opts.samples))
            for s in samples if not resuming else ():
                fwd.launch(work.camera, count, fwd.outbox, red, first, s, *camera_args)
            if fwd.mode == "async":
                for batch in fwd.batches():  # rays flow between ranks while others trace
                    rays += len(batch)
                    fwd.launch(work.trace, len(batch), batch, *trace)
                    settle(len(batch))
            else:
                rays = _rounds(opts, work, fwd, red, (sample, per_pass), rays, resuming, trace, settle)
                resuming = False
            if bar is not None:
                bar.update(len(samples))
        red.flush()
        compiling = rafi.compile_seconds() - compiled  # first launches of each kernel
        seconds = time.perf_counter() - started - compiling
        if bar is not None:
            bar.close()
        total = red.gather(root=0)
        info = {
            "ranks": size,
            "backend": fwd.backend,
            "transport": fwd.transport,
            "seconds": seconds,
            "compile_seconds": comm.allreduce(compiling, op=MPI.MAX),
            "rays": comm.allreduce(rays),
            "mode": fwd.mode,
            "samples_per_pass": per_pass,
        }
        info["rays_per_second"] = info["rays"] / seconds
        info.update(forwarding(comm, fwd))
    if rank != 0:
        return None, info
    return total.reshape(opts.height, opts.width, 3) / opts.samples, info


def samples_per_pass(comm, backend, work, opts, mode, share=0.5):
    """How many samples one pass can trace together (collective; the same on every rank):
    as many as keep the forwarder within ``share`` of the memory free for this rank, which
    is the free memory of its device (``backend``) divided among the ranks of its node that
    use that device; at least 1, at most ``opts.samples``. A forwarder holds about three
    records per item of capacity (outbox, inbox, a scratch copy), four in async mode."""
    gc.collect()  # what earlier runs left (a closed forwarder's buffers) is not in the way
    sharing = node_local(comm)[1]
    free = host_memory_available()
    if backend == "cuda":
        from numba import cuda

        context = cuda.current_context()
        if context.get_memory_info().free < float("inf"):  # not Numba's CUDA simulator (host arrays)
            context.deallocations.clear()  # Numba frees device memory lazily
            free, sharing = context.get_memory_info().free, -(-sharing // len(cuda.gpus))
    records = 4 if mode == "async" else 3
    per_sample = work.capacity * (records * work.item.itemsize + 8)
    fits = min(int(share * free / sharing) // per_sample, _MOST_ITEMS // work.capacity)
    return comm.allreduce(max(1, min(fits, opts.samples)), op=MPI.MIN)


_MOST_ITEMS = 2**31 - 1  # a forwarder's capacity: slots are numbered with int32


def host_memory_available():
    """Bytes of host memory this process may still take: the kernel's ``MemAvailable``
    (free memory and reclaimable caches), within the cgroup's limit where one is set (a
    Slurm job's ``--mem``)."""
    available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    with contextlib.suppress(OSError, ValueError, StopIteration):
        with open("/proc/meminfo") as f:
            line = next(line for line in f if line.startswith("MemAvailable:"))
        available = int(line.split()[1]) * 1024
    with contextlib.suppress(OSError, ValueError):
        with open("/sys/fs/cgroup/memory.max") as f, open("/sys/fs/cgroup/memory.current") as g:
            limit = f.read().strip()
            if limit != "max":
                available = min(available, int(limit) - int(g.read()))
    return max(available, 0)


def settle_heap():
    """Put every object alive now out of reach of Python's cyclic garbage collector
    (``gc.freeze``); call it inside ``settling()`` once the kernels are loaded: after the
    first launch of each that ran (an empty launch loads nothing). Numba's loaded kernels
    are about a million objects: a full collection over them stops a rank for 110-130 ms
    (H200 machine, 4 ranks), and in rounds every other rank waits for it. The objects made
    later are collected as usual."""
    gc.freeze()


class _Settle:
    """``settle(n)`` after each launch of ``n`` items of the loop's kernel: the first that
    ran one (the kernels before it ran already) settles the heap, once (``frozen``)."""

    def __init__(self):
        self.frozen = False

    def __call__(self, launched):
        if launched and not self.frozen:
            settle_heap()
            self.frozen = True


@contextlib.contextmanager
def settling():
    """Where a run settles its heap: yields ``settle(n)``, to call after each launch of the
    run's loop kernel with its ``n`` items (``_Settle``). Leaving it unfreezes the heap if
    the run froze it, so that the run's forwarder and its buffers, frozen with the rest,
    can be collected once they are gone, and collects it then: after an unfreeze the
    collector's count of its old objects is stale, and its next full collection (110-130
    ms on the GPU machine) would otherwise come early, in the next run's first rounds.
    (Python's freezes do not nest: a caller's own ``gc.freeze()`` before the run is undone
    with it. Nor can the run tell whether there was one: from Python 3.12 on,
    ``gc.get_freeze_count()`` counts objects the collector set aside itself.)"""
    settle = _Settle()
    try:
        yield settle
    finally:
        if settle.frozen:
            gc.unfreeze()
            gc.collect()


def forwarding(comm, fwd):
    """What ``fwd`` did, for a program's ``info`` (collective): ``rounds`` (async: this rank's
    batches), ``bytes_forwarded`` (every rank's ``fwd.stats`` total of bytes sent, summed;
    items a rank forwards to itself count), of which ``bytes_between_ranks`` went to
    another rank, and on rank 0 ``per_rank_stats`` (each rank's ``fwd.stats.as_dict()``)."""
    stats = fwd.stats.as_dict()
    sent = stats["totals"]["bytes_sent"]
    between = sent - stats["peers"]["bytes_sent"][fwd.rank]
    out = {
        "rounds": len(fwd.stats) if fwd.mode == "bsp" else fwd.async_stats["batches"],
        "bytes_forwarded": comm.allreduce(sent),
        "bytes_between_ranks": comm.allreduce(between),
    }
    stats = comm.gather(stats, root=0)
    if comm.Get_rank() == 0:
        out["per_rank_stats"] = stats
    return out


def _on_backend(fwd, args):
    return tuple(fwd.to_backend(a) if isinstance(a, np.ndarray) else a for a in args)


def _rounds(opts, work, fwd, red, samples, rays, resuming, trace, settle):
    """Trace one pass (``samples``: its first sample and the samples per pass) in rounds of
    ``forward()``; return the rays traced so far."""
    while True:
        if not resuming:  # a restored run first traces the inbox it was saved with
            result = fwd.forward()
            if not result.alive:
                return rays
            _maybe_checkpoint(opts, work, fwd, red, result.round, samples, rays)
        resuming = False
        rays += len(fwd.inbox)
        fwd.launch(work.trace, len(fwd.inbox), fwd.inbox, *trace)
        settle(len(fwd.inbox))


def _maybe_checkpoint(opts, work, fwd, red, round_number, samples, rays):
    """Every ``--checkpoint-every`` rounds: the image so far and every ray in flight."""
    if not getattr(opts, "checkpoint", None) or (round_number + 1) % opts.checkpoint_every:
        return
    red.flush()
    sample, per_pass = samples
    state = {
        "image": red.local,
        "sample": np.array([sample]),
        "samples_per_pass": np.array([per_pass]),
        "rays": np.array([rays]),
    }
    fwd.checkpoint(opts.checkpoint, state=state, options=run_options(opts, work))


def _share(n, rank, size):
    base, extra = divmod(n, size)
    return rank * base + min(rank, extra), base + (rank < extra)


def _progress(rank, opts, done):
    if rank != 0 or opts.quiet:
        return None
    from tqdm import tqdm

    return tqdm(total=opts.samples, initial=done, desc="samples", unit="spp", file=sys.stderr)


def to_png(image, path, gamma=2.2):
    """Tone-map (``1 / gamma``) and write ``image`` as an 8-bit PNG (or raw floats to ``.npy``)."""
    if str(path).endswith(".npy"):
        np.save(path, image)
        return
    from PIL import Image

    rgb = np.clip(image, 0.0, 1.0) ** (1 / gamma)
    Image.fromarray((rgb * 255 + 0.5).astype(np.uint8)).save(path)


def report(opts, image, info, gamma=2.2):
    """On rank 0: write the image, print what the run did, and write ``--stats``."""
    to_png(image, opts.output, gamma)
    steps = "rounds" if info["mode"] == "bsp" else "batches on rank 0"
    print(
        f"{info['ranks']} ranks, backend {info['backend']}, transport {info['transport']}: "
        f"{info['rays']:,} rays in {info['seconds']:.2f} s ({info['rays_per_second']:,.0f} rays/s; "
        f"compiling kernels took {info['compile_seconds']:.2f} s more), {info['rounds']} {steps}; "
        f"wrote {opts.output}"
    )
    if opts.stats:
        with open(opts.stats, "w") as f:
            json.dump(info, f, indent=1)
