"""The programs' command lines, run as users run them (``launch/local.sh 2 python -m ...``):
a bad input is one usage error (exit status 2), printed once for the job, with no
traceback and before any work; ``--help`` shows each default under the right name."""

import numpy as np
import pytest

from jobs import run

RANKS = 2
EXAMPLES = "rafi.examples."


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A .raw file of 100 bytes, an HDF5 file with one 3-D dataset, a checkpoint written by one rank."""
    import h5py
    from mpi4py import MPI

    import rafi

    folder = tmp_path_factory.mktemp("inputs")
    np.zeros(100, np.uint8).tofile(folder / "v.raw")
    with h5py.File(folder / "v.h5", "w") as f:
        f["fields/density"] = np.zeros((4, 4, 4), np.float32)
    with rafi.Forwarder(MPI.COMM_SELF, np.int64, 4, backend="cpu") as fwd:
        fwd.checkpoint(str(folder / "one-rank.h5"))
    (folder / "not-hdf5.h5").write_text("not a checkpoint")
    return folder


def refused(args, ranks=RANKS, cwd=None):
    """Run ``python -m ARGS`` on ``ranks`` ranks; return rank 0's error line (asserting that it
    is the only one, with exit status 2 and no traceback)."""
    code, out, err = run(ranks, ["-m", *args], timeout=120, cwd=cwd)
    assert code == 2, (code, out, err)
    assert "Traceback" not in err and "Traceback" not in out, err
    errors = [line for line in err.splitlines() if ": error: " in line]
    assert len(errors) == 1, err  # once per job, not once per rank
    assert err.count("usage: ") == 1, err
    return errors[0]


# fmt: off
CASES = [  # the inputs of issue 27: (program and options, what the one error line says)
    (["raytrace", "--width", "0"], "argument --width: must be an integer of at least 1, not 0"),
    (["raytrace", "--samples", "-1"], "argument --samples: must be an integer from 1 to 1048576, not -1"),
    (["raytrace", "--bounces", "-1"], "argument --bounces: must be an integer of at least 0, not -1"),
    (["raytrace", "--grid", "0"], "argument --grid: must be an integer from 1 to 32768, not 0"),
    (["raytrace", "--grid", "1"],
     "--grid 1 makes 1 cell, fewer than the 2 ranks (each owns at least one): use --grid 2 or more"),
    (["raytrace", "--checkpoint", "c.h5", "--checkpoint-every", "0"],
     "argument --checkpoint-every: must be an integer of at least 1, not 0"),
    (["raytrace", "--checkpoint", "c.h5", "--checkpoint-every", "-3"],
     "argument --checkpoint-every: must be an integer of at least 1, not -3"),
    (["volume", "--output", "missing/dir/x.png"],
     "--output missing/dir/x.png: the directory {cwd}/missing/dir does not exist"),
    (["schlieren", "--output", "x.txt"], "--output x.txt: unknown format .txt (use .png or .npy)"),
    (["raytrace", "--resume", "none.h5"], "--resume none.h5: no such file"),
    (["volume", "--volume", "none.raw", "--dims", "8", "8", "8", "--dtype", "uint8"],
     "--volume none.raw: no such file"),
    (["volume", "--volume", "{files}/v.raw", "--dims", "8", "8", "8", "--dtype", "uint8"],
     "--volume {files}/v.raw has 100 bytes; --dims 8 8 8 --dtype uint8 needs 512"),
    (["transport", "--particles", "-5"],
     "argument --particles: must be an integer from 0 to 2147483647, not -5"),
    (["volume", "--volume", "{files}/v.h5"],
     "--volume {files}/v.h5: an HDF5 volume is named with its dataset, as --volume "
     "{files}/v.h5:/path/to/dataset (its 3-D datasets: /fields/density)"),
    (["raytrace", "--resume", "{files}/one-rank.h5"],
     "--resume {files}/one-rank.h5: written by 1 rank, and this job has 2; run it on 1 rank "
     "(launch/local.sh 1 ..., mpirun -n 1 ...), or render again without --resume"),
    # and more of the same kind
    (["raytrace", "--resume", "{files}/not-hdf5.h5"], "--resume {files}/not-hdf5.h5: cannot be read as HDF5"),
    (["raytrace", "--output", "{files}"], "--output {files}: name a .png or .npy file"),
    (["volume", "--volume", "{files}/v.h5:/nothing"],
     "--volume {files}/v.h5:/nothing: {files}/v.h5 has no dataset /nothing "
     "(its 3-D datasets: /fields/density)"),
    (["schlieren", "--dims", "1", "1", "1"], "the volume has 1 x 1 x 1 cells, fewer than the 2 ranks"),
    (["volume", "--density", "nan"], "argument --density: must be a finite number, not nan"),
    (["volume", "--mode", "async", "--checkpoint", "c.h5"],
     "--checkpoint and --resume save and resume between rounds (--mode bsp or resident), not async"),
    (["transport", "--grid", "1"], "--grid 1 is fewer cells along x than the 2 ranks (one slab each)"),
    (["transport", "--json", "missing/t.json"],
     "--json missing/t.json: the directory {cwd}/missing does not exist"),
    (["forward", "--steps", "0"], "argument --steps: must be an integer of at least 1, not 0"),
    (["raytrace", "--mode", "nowhere"], "argument --mode: invalid choice: 'nowhere'"),
    (["raytrace", "--progress", "poll"],
     "--progress poll is for --mode async; rounds (bsp, resident) make their own progress"),
]
# fmt: on


@pytest.mark.timeout(600)
@pytest.mark.parametrize("args, expected", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_a_bad_input_is_one_usage_error(args, expected, files, tmp_path):
    where = {"files": str(files), "cwd": str(tmp_path)}
    program, *options = args
    line = refused([EXAMPLES + program, *(o.format(**where) for o in options)], cwd=tmp_path)
    assert line.startswith(f"python -m {EXAMPLES}{program}: error: ")
    assert expected.format(**where) in line
    assert "CheckpointError" not in line and "route=" not in line
    assert not list(tmp_path.iterdir())  # no output, no checkpoint: it stopped before any work


BENCH_CASES = [
    (["rafi.bench", "--rounds", "0"], "argument --rounds: must be an integer of at least 1, not 0"),
    (["rafi.bench", "--plot", "x.pdf"], "--plot x.pdf: unknown format .pdf (use .png)"),
    (["rafi.bench.empty", "--json", "missing/e.json"], "--json missing/e.json: the directory"),
    (["rafi.bench.anywhere", "--skew", "0"], "argument --skew: must be an integer of at least 1, not 0"),
    (
        ["rafi.bench.checkpoint", "--itemsize", "4"],
        "argument --itemsize: must be an integer of at least 8, not 4",
    ),
    (["rafi.bench.skew", "--hops", "0"], "argument --hops: must be an integer of at least 1, not 0"),
    (["rafi.bench.raytrace", "--samples-per-pass", "1", "1"], "--samples-per-pass: distinct values"),
    (["rafi.bench.workloads", "--volume", "none.raw"], "--volume none.raw: no such file"),
    (["rafi.bench.model", "none.json"], "records: none.json: no such file"),
    (
        ["rafi.bench.resident", "--rounds-per-launch", "0"],
        "argument --rounds-per-launch: must be an integer of at least 1, not 0",
    ),
    (["rafi.bench.node_floor", "--items", "0"], "argument --items: must be an integer of at least 1, not 0"),
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("args, expected", BENCH_CASES, ids=[" ".join(a) for a, _ in BENCH_CASES])
def test_a_bad_benchmark_input_is_one_usage_error(args, expected, tmp_path):
    line = refused(args, cwd=tmp_path)
    assert line.startswith(f"python -m {args[0]}: error: ") and expected in line


UNEVEN = """
import os, sys, time
start, who = sys.argv[1], sys.argv[2]
if start in ("mpi", "finalized"):
    from mpi4py import MPI
if start == "finalized":
    MPI.Finalize()
import rafi.examples._cli as cli
rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
parser = cli.Parser("uneven", "A program whose ranks err at different times.")
parser.add_argument("--n", type=cli.integer(1))
if who == "all":
    if rank == 0:
        time.sleep(3)  # the rank that speaks is the last to parse
    parser.parse_args(["--n", "0"])
elif rank == 1:  # rank 1 alone: rank 0 goes on working
    cli.PATIENCE = 2
    parser.parse_args(["--n", "0"])
time.sleep(60)
"""
ERROR = "python -m uneven: error: argument --n: must be an integer of at least 1, not 0"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("start", ["mpi", "plain"], ids=["MPI started", "MPI not started"])
def test_the_error_is_printed_when_rank_0_is_the_last_to_parse(start, tmp_path):
    """The launcher ends the job when the first rank exits with an error: the other ranks
    wait for rank 0's message, whether or not the program has started MPI."""
    (tmp_path / "uneven.py").write_text(UNEVEN)
    code, _, err = run(RANKS, [str(tmp_path / "uneven.py"), start, "all"], timeout=120)
    assert code == 2, err
    assert [line for line in err.splitlines() if ": error: " in line] == [ERROR], err


@pytest.mark.timeout(300)
@pytest.mark.parametrize("start", ["mpi", "plain"], ids=["MPI started", "MPI not started"])
def test_a_rank_alone_in_its_error_says_so_and_ends_the_job(start, tmp_path):
    """A usage error on one rank only (its peers go on, for a minute here) neither hangs
    nor is lost: that rank prints it, naming itself, and its exit ends the job."""
    (tmp_path / "uneven.py").write_text(UNEVEN)
    code, _, err = run(RANKS, [str(tmp_path / "uneven.py"), start, "one"], timeout=45)
    assert code == 2, err
    assert [line for line in err.splitlines() if ": error: " in line] == [f"rank 1: {ERROR}"], err


@pytest.mark.timeout(300)
def test_a_usage_error_after_mpi_is_finalized_exits_with_status_2(tmp_path):
    """With MPI finalized the ranks cannot meet: each leaves with status 2, MPI not called."""
    (tmp_path / "uneven.py").write_text(UNEVEN)
    code, _, err = run(RANKS, [str(tmp_path / "uneven.py"), "finalized", "all"], timeout=120)
    assert code == 2 and "Traceback" not in err and "MPI_" not in err, err


PROGRAMS = [
    (EXAMPLES + "raytrace", "--width WIDTH         image width in pixels (default: 160)"),
    (EXAMPLES + "volume", "(default: viridis)"),
    (EXAMPLES + "schlieren", "(default: knife)"),
    (EXAMPLES + "transport", "(default: 100000)"),
    (EXAMPLES + "forward", "(default: 20000)"),
    ("rafi.bench", "(default: 1000 10000 100000 1000000)"),
    ("rafi.bench.anywhere", "(default: 10000)"),
    ("rafi.bench.checkpoint", "(default: rafi-bench-checkpoint.h5)"),
    ("rafi.bench.empty", "(default: 2000)"),
    ("rafi.bench.model", "(default: 4096)"),
    ("rafi.bench.node_floor", "(default: 2000)"),
    ("rafi.bench.raytrace", "(default: 256)"),
    ("rafi.bench.resident", "(default: 2000)"),
    ("rafi.bench.skew", "(default: 200)"),
    ("rafi.bench.workloads", "(default: auto)"),
]


@pytest.mark.timeout(300)
def test_the_raw_exchange_wants_two_ranks_or_more():
    line = refused(["rafi.bench.node_floor"], ranks=1)
    assert line.endswith("error: 2 or more ranks, all on one node")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("module, default", PROGRAMS, ids=[m for m, _ in PROGRAMS])
def test_help_names_the_program_and_shows_defaults(module, default):
    code, out, err = run(RANKS, ["-m", module, "--help"], timeout=120)
    assert code == 0 and "Traceback" not in err, err
    assert out.count("usage: ") == 1 and out.startswith(f"usage: python -m {module} ")
    assert default in " ".join(out.split()) or default in out
    assert "__main__.py" not in out and ".py " not in out.splitlines()[0]


@pytest.mark.timeout(300)
def test_checkpoint_every_is_documented_with_its_default():
    code, out, _ = run(1, ["-m", EXAMPLES + "raytrace", "--help"], timeout=120)
    text = " ".join(out.split())
    assert code == 0 and "--checkpoint-every ROUNDS" in text and "(default: 10)" in text
    assert "a run of fewer rounds writes none, and says so" in text


@pytest.mark.timeout(600)
def test_a_short_run_says_it_wrote_no_checkpoint(tmp_path):
    """A render of fewer rounds than --checkpoint-every writes none and says so; the report
    names paths, rays, segments and rounds, and says what a round is."""
    args = ["--width", "8", "--height", "6", "--samples", "1", "--grid", "4", "--backend", "cpu", "--quiet"]
    args += ["--checkpoint", "c.h5", "--output", "x.npy"]
    code, out, err = run(RANKS, ["-m", EXAMPLES + "raytrace", *args], timeout=300, cwd=tmp_path)
    assert code == 0, err
    assert (
        err.count("wrote no checkpoint to c.h5: the render took ") == 1 and not (tmp_path / "c.h5").exists()
    )
    assert "48 paths (8x6 pixels, 1 sample each)" in out and " rays traced in " in out
    assert " ray segments (" in out and "(a round: one forward()" in out
