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

What a render counts (``info``): ``paths``, one per pixel sample; ``rays``, the rays traced:
the paths' camera rays and every ray a trace kernel starts (a shadow ray, a bounce), each
once, which a kernel counts in the array ``Work.counter`` names; ``segments``, the rays
traced by a rank (a ray crossing three domains is three segments), and ``forwarding``'s
``items_between_ranks`` of them sent to another rank; ``rounds``, the ``forward()`` calls (a
round: every rank sends the rays that left its domain and traces the ones it received). The
first two are the whole render's, a resumed one's too, and do not depend on the rank count;
the others are this run's, and do. ``rays_this_run`` and ``rays_per_second``: the rays this
run traced (all of them unless ``resumed``).
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
from rafi._config import BACKENDS, PROGRESS
from rafi._errors import collective
from rafi._mpi_support import node_local

from ._cli import MOST_ITEMS, add_mode, input_file, integer, output_file

__all__ = [
    "Work",
    "add_options",
    "check_options",
    "counted",
    "IMAGE_FORMATS",
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
    counter: int = -1  # index in trace_args of an int64 array whose [0] trace adds each ray it starts to


def add_options(p, width=160, height=120, samples=2):
    """Add the options every image-making example takes to the parser ``p`` (a ``_cli.Parser``)."""
    p.add_argument("--width", type=integer(1), default=width, help="image width in pixels")
    p.add_argument("--height", type=integer(1), default=height, help="image height in pixels")
    each = "paths per pixel: camera rays through it, each with a random stream of its own"
    p.add_argument("--samples", type=integer(1, 2**20), default=samples, help=each)
    fit = "samples traced together (0: as many as fit in half the memory free for each rank)"
    p.add_argument("--samples-per-pass", type=integer(0), default=0, help=fit)
    p.add_argument("--backend", default="auto", choices=BACKENDS, help="where kernels run")
    add_mode(p, "rays")
    p.add_argument("--progress", default="auto", choices=PROGRESS, help="who moves messages in async mode")
    p.add_argument("--output", default="image.png", help="the image: a .png, or .npy for raw float64 values")
    p.add_argument("--stats", help="write per-round forwarding stats and totals here, as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    keep = "write the rays in flight and the image so far to this HDF5 file (see --checkpoint-every)"
    p.add_argument("--checkpoint", help=keep)
    every = (
        "with --checkpoint: write it after every this many rounds (a round is one forward(): "
        "every rank sends the rays that left its part of the scene, then traces what it "
        "received); a run of fewer rounds writes none, and says so"
    )
    p.add_argument("--checkpoint-every", type=integer(1), default=10, metavar="ROUNDS", help=every)
    again = "continue from this checkpoint (as many ranks and the same image options as it was written with)"
    p.add_argument("--resume", help=again)


def check_options(p, opts, options, rays_per_pixel=1):
    """Reject what ``add_options``' options cannot do, together or on this file system
    (``p.error`` exits on every rank of ``p.comm``; collective): ``options`` names the
    options that make the image (``Work.options``), which a resume must repeat;
    ``rays_per_pixel`` of a sample may be in flight at once (``Work.capacity``)."""
    rays = opts.width * opts.height * rays_per_pixel + 64
    if rays > MOST_ITEMS:
        p.error(
            f"--width {opts.width} --height {opts.height}: a sample's {rays:,} rays in flight are more "
            "than a forwarder holds (2**31 - 1); make the image smaller"
        )
    if opts.progress != "auto" and opts.mode != "async":
        own = "rounds (bsp, resident) make their own progress"
        p.error(f"--progress {opts.progress} is for --mode async; {own}")
    if opts.mode == "async" and (opts.checkpoint or opts.resume):
        p.error(
            "--checkpoint and --resume save and resume between rounds (--mode bsp or resident), not async"
        )
    p.agree(
        lambda: output_file("--checkpoint", opts.checkpoint),  # every rank writes its part
        lambda: input_file("--resume", opts.resume),  # and reads it
        root=[  # rank 0 writes these
            lambda: output_file("--output", opts.output, IMAGE_FORMATS),
            lambda: output_file("--stats", opts.stats),
        ],
    )
    if opts.resume:
        resumable = {name: getattr(opts, name) for name in options}
        p.agree(root=[lambda: _resume_problem(opts, resumable, p.ranks)])


IMAGE_FORMATS = (".png", ".npy")


def _resume_problem(opts, options, size):
    """Why the checkpoint ``opts.resume`` cannot continue this run of ``size`` ranks, or None."""
    from rafi import _checkpoint

    path = opts.resume
    try:
        with _checkpoint._open(path) as f:
            written = int(f.attrs["size"])
            meta = {k: f.attrs[k] for k in f.attrs}
            per_pass = f.get("rank_0/state/samples_per_pass")
            per_pass = int(per_pass[0]) if per_pass is not None else 1
    except (rafi.CheckpointError, OSError, KeyError, ValueError) as exc:
        return f"--resume {path}: {exc}".replace(f"--resume {path}: {path} ", f"--resume {path}: ")
    if written != size:
        ranks = f"{written} rank{'s' * (written != 1)}"
        return (
            f"--resume {path}: written by {ranks}, and this job has {size}; run it on {ranks} "
            f"(launch/local.sh {written} ..., mpirun -n {written} ...), or render again without --resume"
        )
    try:
        _checkpoint.check_options(meta, options, path)
    except rafi.ConfigError as exc:
        differ = str(exc).split("written with: ", 1)[-1]
        return (
            f"--resume {path}: written with other image options ({differ}); "
            "resume with the checkpoint's values"
        )
    asked = min(opts.samples_per_pass, opts.samples)
    if asked and asked != per_pass:
        return (
            f"--resume {path}: the checkpoint traces {per_pass} samples per pass, not {asked} "
            "(--samples-per-pass: leave it out to resume)"
        )
    return None


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
        first_sample, segments, secondary, resuming = 0, 0, 0, False
        mode, progress = getattr(opts, "mode", "bsp"), getattr(opts, "progress", "auto")
        if getattr(opts, "resume", None):
            fwd, state = rafi.Forwarder.restore(
                comm, opts.resume, backend=opts.backend, options=run_options(opts, work)
            )
            red.local[:] = state["image"]
            first_sample, resuming = int(state["sample"][0]), True
            secondary = int(state["secondary"][0]) if "secondary" in state else 0
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
        trace_args = list(work.trace_args)
        if work.counter >= 0:  # a counter of this render's own, from where a resumed one stopped
            trace_args[work.counter] = np.array([secondary], np.int64)
        trace = (fwd.outbox, red, *_on_backend(fwd, trace_args))
        checkpoints, launched, resumed_at = 0, 0, secondary  # (this run's counts)
        first, count = _share(pixels, rank, size)
        bar = _progress(rank, opts, first_sample)
        started, compiled = time.perf_counter(), rafi.compile_seconds()
        for sample in range(first_sample, opts.samples, per_pass):
            samples = range(sample, min(sample + per_pass, opts.samples))
            for s in samples if not resuming else ():
                fwd.launch(work.camera, count, fwd.outbox, red, first, s, *camera_args)
                launched += 1
            if fwd.mode == "async":
                for batch in fwd.batches():  # rays flow between ranks while others trace
                    segments += len(batch)
                    fwd.launch(work.trace, len(batch), batch, *trace)
                    settle(len(batch))
            else:
                rounds = _resident if fwd.mode == "resident" else _rounds
                traced = rounds(opts, work, fwd, red, (sample, per_pass), segments, resuming, trace, settle)
                segments, checkpoints = traced[0], checkpoints + traced[1]
                resuming = False
            if bar is not None:
                bar.update(len(samples))
        red.flush()
        compiling = rafi.compile_seconds() - compiled  # first launches of each kernel
        seconds = time.perf_counter() - started - compiling
        if bar is not None:
            bar.close()
        total = red.gather(root=0)
        if work.counter >= 0:
            secondary = int(rafi.asnumpy(trace[2 + work.counter])[0])
        paths, secondaries = pixels * opts.samples, comm.allreduce(np.array([secondary, resumed_at]))
        info = {
            "ranks": size,
            "backend": fwd.backend,
            "transport": fwd.transport,
            "seconds": seconds,
            "compile_seconds": comm.allreduce(compiling, op=MPI.MAX),
            "paths": paths,
            "rays": paths + int(secondaries[0]),
            "segments": comm.allreduce(segments),
            "mode": fwd.mode,
            "samples_per_pass": per_pass,
            "checkpoints": checkpoints,
        }
        traced = pixels * launched + int(secondaries[0] - secondaries[1])  # by this run
        info.update(resumed=bool(getattr(opts, "resume", None)), rays_this_run=traced)
        info["rays_per_second"] = traced / seconds
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
    fits = min(int(share * free / sharing) // per_sample, MOST_ITEMS // work.capacity)
    return comm.allreduce(max(1, min(fits, opts.samples)), op=MPI.MIN)


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
    batches), ``items_forwarded`` and ``bytes_forwarded`` (every rank's ``fwd.stats`` totals
    sent, summed; items a rank forwards to itself count), of which ``items_between_ranks``
    and ``bytes_between_ranks`` went to another rank, and on rank 0 ``per_rank_stats`` (each
    rank's ``fwd.stats.as_dict()``)."""
    stats = fwd.stats.as_dict()
    totals, peers = stats["totals"], stats["peers"]
    mine = (
        totals["items_sent"],
        totals["items_sent"] - peers["items_sent"][fwd.rank],
        totals["bytes_sent"],
        totals["bytes_sent"] - peers["bytes_sent"][fwd.rank],
    )
    summed = comm.allreduce(np.array(mine, np.int64))
    out = {"rounds": len(fwd.stats) if fwd.mode != "async" else fwd.async_stats["batches"]}
    out.update(
        zip(
            ("items_forwarded", "items_between_ranks", "bytes_forwarded", "bytes_between_ranks"),
            summed.tolist(),
        )
    )
    stats = comm.gather(stats, root=0)
    if comm.Get_rank() == 0:
        out["per_rank_stats"] = stats
    return out


def _on_backend(fwd, args):
    return tuple(fwd.to_backend(a) if isinstance(a, np.ndarray) else a for a in args)


def _rounds(opts, work, fwd, red, samples, segments, resuming, trace, settle):
    """Trace one pass (``samples``: its first sample and the samples per pass) in rounds of
    ``forward()``; return the segments traced so far and the checkpoints written."""
    written = 0
    while True:
        if not resuming:  # a restored run first traces the inbox it was saved with
            result = fwd.forward()
            if not result.alive:
                return segments, written
            written += _maybe_checkpoint(opts, work, fwd, red, result.round, samples, segments, trace)
        resuming = False
        segments += len(fwd.inbox)
        fwd.launch(work.trace, len(fwd.inbox), fwd.inbox, *trace)
        settle(len(fwd.inbox))


def _resident(opts, work, fwd, red, samples, segments, resuming, trace, settle):
    """Trace one pass in ``mode="resident"``: ``fwd.run(trace)`` runs the rounds on the
    device, ``--checkpoint-every`` rounds a launch when checkpoints are asked for (a
    checkpoint is written between launches); return the segments traced so far and the
    checkpoints written."""
    written = 0
    if resuming and len(fwd.inbox):  # a checkpoint of a bsp run holds an inbox not yet traced
        segments += len(fwd.inbox)
        fwd.launch(work.trace, len(fwd.inbox), fwd.inbox, *trace)
    every = opts.checkpoint_every if getattr(opts, "checkpoint", None) else None
    while True:
        before = fwd.stats.totals()["items_received"]
        result = fwd.run(work.trace, *trace[1:], rounds=every)
        segments += fwd.stats.totals()["items_received"] - before
        if not result.alive:
            return segments, written
        written += _maybe_checkpoint(opts, work, fwd, red, None, samples, segments, trace)


def _maybe_checkpoint(opts, work, fwd, red, round_number, samples, segments, trace):
    """Every ``--checkpoint-every`` rounds (``round_number`` None: now): the image so far
    and every ray in flight (and the counts so far: ``rays`` holds the segments). Return
    whether it wrote one."""
    if not getattr(opts, "checkpoint", None):
        return False
    if round_number is not None and (round_number + 1) % opts.checkpoint_every:
        return False
    red.flush()
    sample, per_pass = samples
    state = {
        "image": red.local,
        "sample": np.array([sample]),
        "samples_per_pass": np.array([per_pass]),
        "rays": np.array([segments]),
    }
    if work.counter >= 0:
        state["secondary"] = rafi.asnumpy(trace[2 + work.counter])[:1].copy()
    fwd.checkpoint(opts.checkpoint, state=state, options=run_options(opts, work))
    return True


def counted(opts, info):
    """What a render did, in two lines: its paths and rays (the same at every rank count),
    then its forwarding (``forwarding``'s counts, which are not)."""
    if info["mode"] == "async":
        steps = "batches on rank 0 (a batch: the rays that reached a rank together, traced in one launch)"
    else:
        steps = (
            "rounds (a round: one forward(), in which every rank sends the rays that left its part "
            "of the scene, then traces the ones it received)"
        )
    rays, forwarded = f"{info['rays']:,} rays traced", "forwarded"
    if info.get("resumed"):  # the paths and rays are the whole render's; the rest, this run's
        rays += f", {info['rays_this_run']:,} of them after resuming,"
        forwarded = "after resuming, forwarded"
    if info["rounds"] == 1:
        steps = steps.replace("rounds", "round", 1).replace("batches", "batch", 1)
    return (
        f"{info['ranks']} ranks, backend {info['backend']}, transport {info['transport']}: "
        f"{info['paths']:,} paths ({opts.width}x{opts.height} pixels, {opts.samples} "
        f"sample{'s' * (opts.samples != 1)} each), "
        f"{rays} in {info['seconds']:.2f} s ({info['rays_per_second']:,.0f} rays/s; "
        f"compiling kernels took {info['compile_seconds']:.2f} s more)\n"
        f"{forwarded} {info['segments']:,} ray segments ({info['items_between_ranks']:,} to another rank) "
        f"in {info['rounds']} {steps}"
    )


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
    """On rank 0: write the image, print what the run did (``counted``), and write ``--stats``."""
    to_png(image, opts.output, gamma)
    print(counted(opts, info) + f"; wrote {opts.output}")
    if getattr(opts, "checkpoint", None) and not info.get("checkpoints"):
        print(
            f"wrote no checkpoint to {opts.checkpoint}: the render took {info['rounds']} rounds, "
            f"fewer than --checkpoint-every {opts.checkpoint_every}",
            file=sys.stderr,
        )
    if opts.stats:
        with open(opts.stats, "w") as f:
            json.dump(info, f, indent=1)
