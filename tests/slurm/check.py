"""Check what the Slurm templates' jobs wrote (called by tests/slurm/run.sh).

    python tests/slurm/check.py render IMAGE.png STATS.json --size 64x64 --ranks 2
    python tests/slurm/check.py same A.npy B.npy     # two renders' raw images agree to 1e-12

Each exits nonzero with a message naming what is wrong.
"""

import argparse
import json
import sys

import numpy as np
from PIL import Image


def render(opts):
    """A PNG of the asked size that is not blank, and the stats of a finished render."""
    width, height = map(int, opts.size.split("x"))
    with Image.open(opts.image) as png:
        png.verify()  # checksums and structure; the file must be reopened to read pixels
    with Image.open(opts.image) as png:
        if png.format != "PNG" or png.size != (width, height):
            sys.exit(f"{opts.image}: {png.format} {png.size[0]}x{png.size[1]}, expected PNG {opts.size}")
        if np.asarray(png).max() == 0:
            sys.exit(f"{opts.image}: every pixel is black")
    with open(opts.stats) as f:
        stats = json.load(f)
    if stats["ranks"] != opts.ranks or len(stats["per_rank_stats"]) != opts.ranks:
        sys.exit(f"{opts.stats}: {stats['ranks']} ranks, expected {opts.ranks}")
    if stats["rays"] <= 0 or stats["rounds"] <= 0:
        sys.exit(f"{opts.stats}: {stats['rays']} rays in {stats['rounds']} rounds")
    print(f"{opts.image}: PNG {opts.size}; {opts.stats}: {stats['rays']} rays, {stats['rounds']} rounds")


def same(opts):
    """Equal shapes and values within 1e-12 (the same render, only summed in another order)."""
    a, b = np.load(opts.a), np.load(opts.b)
    if a.shape != b.shape:
        sys.exit(f"{opts.a} is {a.shape}, {opts.b} is {b.shape}")
    diff = float(np.max(np.abs(a - b)))
    if not diff <= 1e-12:  # also catches NaN
        sys.exit(f"{opts.a} and {opts.b} differ by up to {diff:.3g}")
    print(f"{opts.a} equals {opts.b} (largest difference {diff:.3g}, mean value {a.mean():.4f})")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="check", required=True)
    p = sub.add_parser("render")
    p.add_argument("image")
    p.add_argument("stats")
    p.add_argument("--size", required=True, help="WIDTHxHEIGHT")
    p.add_argument("--ranks", type=int, required=True)
    p = sub.add_parser("same")
    p.add_argument("a")
    p.add_argument("b")
    opts = parser.parse_args(argv)
    {"render": render, "same": same}[opts.check](opts)


if __name__ == "__main__":
    main()
