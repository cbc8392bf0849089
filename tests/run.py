"""Run the whole test suite: serial, then under mpirun, on the cpu backend and the cuda path.

    python tests/run.py                  # CI: cpu + CUDA simulator, mpirun -n 2 and -n 3
    python tests/run.py --gpu --ranks 2 4  # a GPU machine: the cuda path on the real device
    python tests/run.py --gpu --cuda-only --transports auto host   # ... once per transport

Every step runs under a timeout and its process group is killed when it expires, so a
rank that hangs cannot hang the run. The last line is ``N passed, N failed, N skipped``.

Mixed transports: with 3 ranks or more among ``--ranks``, two more steps run 3 ranks as
2 + 1 emulated nodes (``RAFI_NODE_SIZE=2``), on the cpu backend (ranks 0 and 1 reach each
other through shared memory and rank 2 through MPI: ``fwd.transport`` is ``shm+host`` and
``host``) and on the cuda path (the simulator moves everything through the host; on GPUs
ranks 0 and 1 use CUDA IPC: ``ipc+host``). They run the tests of the paths that differ
when some peers are on the node and others are not (``MIXED``: forwarding, flow control,
errors, the exchanges, ANY placement, checkpoints, reductions, async mode, shm, and resident
rounds, which cross the emulated nodes through the hosts), not every
MPI test again: on 2 cores the full cpu set as 2 + 1 took 3.7 min, ``MIXED`` about 1.
The step with counts by the sparse exchange (``RAFI_EXCHANGE=sparse``) runs ``MIXED`` too:
every MPI test again took 10 minutes of a CI run near its hour.
"""

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOCAL = os.path.join(ROOT, "launch", "local.sh")
MIXED = [
    f"tests/test_{name}_mpi.py"
    for name in (
        "forward",
        "flow",
        "errors",
        "exchange",
        "anywhere",
        "checkpoint",
        "reducer",
        "async",
        "shm",
        "ipc",
        "node_size",
        "resident",
        "recovery",
    )
]


def steps(ranks, gpu, cuda_only, transports=("auto",)):
    sim = {} if gpu else {"NUMBA_ENABLE_CUDASIM": "1"}
    cuda = "the GPU" if gpu else "the CUDA simulator"
    if not cuda_only:
        yield "serial, cpu backend", {}, [], ["-m", "not mpi and not cuda_path"]
    yield f"serial, cuda backend on {cuda}", sim, [], ["-m", "not mpi and cuda_path"]
    for n in ranks:
        mpi = [LOCAL, str(n)]
        quick = ["--timeout=240"]  # a hung test aborts its rank, and mpirun the rest, sooner
        if not cuda_only:
            yield (
                f"mpirun -n {n}, cpu backend",
                {},
                mpi,
                ["--with-mpi", *quick, "-m", "mpi and not cuda_path"],
            )
            if n == max(ranks):  # the tests of the exchanges' paths again, counts by the sparse one
                cpu = ["--with-mpi", *quick, *MIXED, "-m", "mpi and not cuda_path"]
                yield f"mpirun -n {n}, cpu backend, sparse exchange", {"RAFI_EXCHANGE": "sparse"}, mpi, cpu
        for transport in transports:
            env = sim if transport == "auto" else {**sim, "RAFI_TRANSPORT": transport}
            yield (
                f"mpirun -n {n}, cuda backend on {cuda}, transport {transport}",
                env,
                mpi,
                ["--with-mpi", *quick, "-m", "mpi and cuda_path"],
            )
    if max(ranks) >= 3:  # 3 ranks as 2 + 1 nodes: node peers and remote peers in one job
        mpi, nodes = [LOCAL, "3"], {"RAFI_NODE_SIZE": "2"}
        mixed = ["--with-mpi", "--timeout=240", *MIXED]
        if not cuda_only:
            yield (
                "mpirun -n 3 as 2 + 1 nodes, cpu backend",
                nodes,
                mpi,
                [*mixed, "-m", "mpi and not cuda_path"],
            )
        yield (
            f"mpirun -n 3 as 2 + 1 nodes, cuda backend on {cuda}",
            {**sim, **nodes},
            mpi,
            [*mixed, "-m", "mpi and cuda_path"],
        )


def run_step(name, env, launcher, args, timeout, report):
    command = launcher + [sys.executable, "-m", "pytest", "-q", f"--junitxml={report}", *args]
    print(f"\n=== {name}: {' '.join(command)}", flush=True)
    started = time.time()
    proc = subprocess.Popen(command, cwd=ROOT, env={**os.environ, **env}, start_new_session=True)
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(proc)
        print(f"=== {name}: TIMED OUT after {timeout} s", flush=True)
        return None
    except BaseException:  # Ctrl-C, or SIGTERM/SIGHUP from timeout, Slurm or CI: the step too
        _kill(proc)
        raise
    print(f"=== {name}: exit {code} in {time.time() - started:.0f} s", flush=True)
    return code


def _kill(proc):
    """Kill a step's whole process group (its pytest and any MPI ranks it started)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # already gone
        pass
    proc.wait()


def counts(report):
    if not os.path.exists(report):
        return None
    suite = ET.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite[0]
    tests, skipped = int(suite.get("tests")), int(suite.get("skipped"))
    failed = int(suite.get("failures")) + int(suite.get("errors"))
    return tests - skipped - failed, failed, skipped


def _interrupted(signum, frame):
    raise SystemExit(128 + signum)  # unwinds through run_step, which kills the running step


def main(argv=None):
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _interrupted)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--gpu", action="store_true", help="run the cuda path on the real GPU")
    parser.add_argument("--cuda-only", action="store_true", help="skip the cpu-backend steps")
    parser.add_argument(
        "--transports", nargs="+", default=["auto"], help="RAFI_TRANSPORT values for the cuda MPI steps"
    )
    parser.add_argument("--timeout", type=int, default=1200, help="seconds per step")
    opts = parser.parse_args(argv)
    passed = failed = skipped = 0
    broken = []
    with tempfile.TemporaryDirectory() as tmp:
        plan = steps(opts.ranks, opts.gpu, opts.cuda_only, opts.transports)
        for k, (name, env, launcher, args) in enumerate(plan):
            report = os.path.join(tmp, f"step{k}.xml")
            code = run_step(name, env, launcher, args, opts.timeout, report)
            got = counts(report)
            if got is not None:
                passed, failed, skipped = passed + got[0], failed + got[1], skipped + got[2]
            if code not in (0, 5) or got is None:  # 5: pytest found no test to run
                broken.append(name)
                if got is None or got[1] == 0:  # a crash or timeout counts as one failure
                    failed += 1
    for name in broken:
        print(f"FAILED step: {name}")
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if broken or failed else 0


if __name__ == "__main__":
    sys.exit(main())
