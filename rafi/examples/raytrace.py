"""Data-parallel path tracer: each rank owns one spatial domain; rays are forwarded by rafi.

    mpirun -n 4 python -m rafi.examples.raytrace --width 256 --height 256 --samples 4 --output image.png

A ray that leaves a rank's cells goes to the rank owning the next cell; hits send a
shadow ray toward the light and a bounce ray; pixel contributions are summed at the
pixel's owner by a ``rafi.Reducer``; rank 0 writes the PNG. The image does not depend
on the number of ranks (random numbers hash seed, pixel, sample and bounce).
"""

import argparse
import contextlib
import json
import sys
import time

import numpy as np
from mpi4py import MPI

import rafi
from rafi.kernels import raytrace as rt

from .scene import SCENES, decompose, local_cells, make_scene


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=160)
    p.add_argument("--height", type=int, default=120)
    p.add_argument("--samples", type=int, default=2)
    p.add_argument("--bounces", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--scene", default="spheres", choices=SCENES)
    p.add_argument("--grid", type=int, default=16, help="cells per side of the scene")
    p.add_argument("--backend", default="auto", choices=["auto", "cuda", "cpu"])
    p.add_argument("--mode", default="bsp", choices=["bsp", "async"], help="rounds, or items flowing freely")
    p.add_argument("--progress", default="auto", choices=("auto", "poll", "thread"), help="async mode")
    p.add_argument("--output", default="image.png")
    p.add_argument("--stats", help="write per-round forwarding stats and totals as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--checkpoint", help="write in-flight rays and the image so far to this HDF5 file")
    p.add_argument("--checkpoint-every", type=int, default=10, help="rounds between checkpoints")
    p.add_argument("--resume", help="continue from this checkpoint (same ranks and options)")
    opts = p.parse_args(argv)
    if not 1 <= opts.samples <= 2**20:
        p.error("--samples must be between 1 and 2**20 (each (pixel, sample) has its own random stream)")
    if opts.mode == "async" and (opts.checkpoint or opts.resume):
        p.error("--checkpoint and --resume checkpoint between rounds: use them with --mode bsp")
    return opts


def render(opts, comm):
    """Render on all ranks of ``comm``; return ``(image or None, info)`` (image on rank 0)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    g = opts.grid
    cells = make_scene(opts.scene, g, opts.seed)
    domains, owner = decompose(cells, g, size)
    pixels = opts.width * opts.height
    capacity = pixels * (opts.bounces + 2) + 64  # every ray of a sample pass can be in flight
    with contextlib.ExitStack() as stack:
        red = stack.enter_context(rafi.Reducer(comm, 3 * pixels, np.float64, backend=opts.backend))
        first_sample, rays, resuming = 0, 0, False
        if getattr(opts, "resume", None):
            fwd, state = rafi.Forwarder.restore(
                comm, opts.resume, backend=opts.backend, options=run_options(opts)
            )
            red.local[:] = state["image"]
            first_sample, rays, resuming = int(state["sample"][0]), int(state["rays"][0]), True
        else:
            mode, progress = getattr(opts, "mode", "bsp"), getattr(opts, "progress", "auto")
            fwd = rafi.Forwarder(comm, rt.Ray, capacity, backend=opts.backend, mode=mode, progress=progress)
        stack.enter_context(fwd)
        put = fwd.to_backend
        sph = put(local_cells(cells, g, domains[rank]))  # this rank's geometry only
        dom = put(np.array(domains[rank], np.int64))
        own = put(owner)
        first, count = _share(pixels, rank, size)
        bar = _progress(rank, opts, first_sample)
        started, compiled = time.perf_counter(), rafi.compile_seconds()
        for sample in range(first_sample, opts.samples):
            if not resuming:
                fwd.launch(
                    rt.camera,
                    count,
                    fwd.outbox,
                    red,
                    first,
                    opts.width,
                    opts.height,
                    sample,
                    opts.seed,
                    g,
                    own,
                )
            trace = (fwd.outbox, red, sph, dom, own, g, opts.seed, opts.bounces)
            if fwd.mode == "async":
                for batch in fwd.batches():  # rays flow between ranks while others trace
                    rays += len(batch)
                    fwd.launch(rt.trace, len(batch), batch, *trace)
            else:
                rays = _rounds(opts, fwd, red, sample, rays, resuming, trace)
                resuming = False
            if bar is not None:
                bar.update(1)
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
            "rounds": len(fwd.stats) if fwd.mode == "bsp" else fwd.async_stats["batches"],
        }
        info["rays_per_second"] = info["rays"] / seconds
        stats = comm.gather(fwd.stats.as_dict(), root=0)
    if rank != 0:
        return None, info
    info["per_rank_stats"] = stats
    return total.reshape(opts.height, opts.width, 3) / opts.samples, info


def _rounds(opts, fwd, red, sample, rays, resuming, trace):
    """Trace one sample pass in rounds of ``forward()``; return the rays traced so far."""
    while True:
        if not resuming:  # a restored run first traces the inbox it was saved with
            result = fwd.forward()
            if not result.alive:
                return rays
            _maybe_checkpoint(opts, fwd, red, result.round, sample, rays)
        resuming = False
        rays += len(fwd.inbox)
        fwd.launch(rt.trace, len(fwd.inbox), fwd.inbox, *trace)


def _maybe_checkpoint(opts, fwd, red, round_number, sample, rays):
    """Every ``--checkpoint-every`` rounds: the image so far and every ray in flight."""
    if not getattr(opts, "checkpoint", None) or (round_number + 1) % opts.checkpoint_every:
        return
    red.flush()
    state = {"image": red.local, "sample": np.array([sample]), "rays": np.array([rays])}
    fwd.checkpoint(opts.checkpoint, state=state, options=run_options(opts))


def run_options(opts):
    """The options that make the image: a resume must use the same (others may change)."""
    return {
        name: getattr(opts, name)
        for name in ("width", "height", "samples", "bounces", "seed", "scene", "grid")
    }


def _share(n, rank, size):
    base, extra = divmod(n, size)
    return rank * base + min(rank, extra), base + (rank < extra)


def _progress(rank, opts, done):
    if rank != 0 or opts.quiet:
        return None
    from tqdm import tqdm

    return tqdm(total=opts.samples, initial=done, desc="samples", unit="spp", file=sys.stderr)


def to_png(image, path):
    """Tone-map (gamma 2.2) and write ``image`` as an 8-bit PNG (or raw floats to ``.npy``)."""
    if str(path).endswith(".npy"):
        np.save(path, image)
        return
    from PIL import Image

    rgb = np.clip(image, 0.0, 1.0) ** (1 / 2.2)
    Image.fromarray((rgb * 255 + 0.5).astype(np.uint8)).save(path)


def main(argv=None):
    opts = parse(argv)
    comm = MPI.COMM_WORLD
    image, info = render(opts, comm)
    if comm.Get_rank() == 0:
        to_png(image, opts.output)
        print(
            f"{info['ranks']} ranks, backend {info['backend']}, transport {info['transport']}: "
            f"{info['rays']:,} rays in {info['seconds']:.2f} s ({info['rays_per_second']:,.0f} rays/s; "
            f"compiling kernels took {info['compile_seconds']:.2f} s more), {info['rounds']} rounds; "
            f"wrote {opts.output}"
        )
        if opts.stats:
            with open(opts.stats, "w") as f:
                json.dump(info, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
