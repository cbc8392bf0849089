"""The command lines of rafi's programs under MPI: every rank parses, rank 0 speaks.

Every rank of a job runs the same ``argparse`` over the same words and so reaches the same
verdict on them. ``Parser`` prints (``--help``, a usage error) on rank 0 only, and every rank
exits with argparse's status (0 after ``--help``, 2 after an error) once rank 0 has printed:
one message per job, no traceback, before any forwarder is made or kernel compiled. What
depends on the file system (an input file, an output's directory) may differ between ranks:
``Parser.agree`` runs such checks on every rank and turns any rank's complaint into the same
usage error everywhere.

Option types that check their value (``integer``, ``real``) give argparse's own message,
``argument --width: must be at least 1, not 0``.
"""

import argparse
import os
import sys

__all__ = ["Parser", "integer", "real", "output_file", "input_file", "MOST_ITEMS"]

MOST_ITEMS = 2**31 - 1  # a forwarder's capacity: its slots are numbered with int32


def _world():
    """``MPI.COMM_WORLD`` if this process has initialized MPI, else None (a plain process)."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
        return None
    return mpi.COMM_WORLD


def _launched(names):
    """The first of the launcher's variables ``names`` (mpirun's, srun's) that holds a number,
    for a program that does not start MPI; None when none does."""
    for name in names:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def _launched_rank():
    """This process's rank as its launcher says (mpirun, srun); 0 when none does."""
    return _launched(("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")) or 0


def _start_mpi_if_launched():
    """Start MPI in a program that has not imported it but was launched on several ranks,
    so that its ranks can leave together (``Parser.exit``). Every rank makes its parser at
    the same point, so every rank starts MPI (it must: a rank that starts it waits for all
    the others to). A program that imported MPI is left as it is."""
    if "mpi4py.MPI" in sys.modules:
        return
    if (_launched(("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS")) or 1) < 2:
        return
    try:
        import mpi4py.MPI  # noqa: F401 (importing it starts MPI)
    except Exception:  # no MPI to start: a plain process
        pass


def _together(comm, seconds):
    """Wait until every rank of ``comm`` is here too, for at most ``seconds``; return
    whether they all came."""
    from rafi._errors import CollectiveTimeout
    from rafi._liveness import wait

    try:
        wait([comm.Ibarrier()], "leaving after a usage error", timeout=seconds)
    except CollectiveTimeout:
        return False
    return True


PATIENCE = 60  # seconds a rank that leaves waits for the others to leave too


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Each option's help ends with its default, unless it has none (None, a flag)."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        hidden = default is None or default is False or default is argparse.SUPPRESS
        if "%(default)" in text or hidden or not action.option_strings:
            return text
        if isinstance(default, (list, tuple)):
            default = " ".join(map(str, default)).replace("%", "%%")
            return f"{text} (default: {default})"
        return f"{text} (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` for ``python -m module`` under MPI (see the module docstring).

    Args:
        module: the program's module, as ``python -m`` takes it (its ``prog``).
        doc: the module's docstring; its first line is the description.
        comm: the ranks that parse together; rank 0 of it speaks (default ``MPI.COMM_WORLD``
            if this process has initialized MPI, else this process alone).
    """

    def __init__(self, module, doc, comm=None, **kwargs):
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(prog=f"python -m {module}", description=doc.strip().splitlines()[0], **kwargs)
        self.comm = comm
        if comm is None:
            _start_mpi_if_launched()

    def _comm(self):
        return self.comm if self.comm is not None else _world()

    @property
    def ranks(self):
        """How many ranks parse together."""
        comm = self._comm()
        return 1 if comm is None else comm.Get_size()

    def _print_message(self, message, file=None):
        comm = self._comm()
        if (comm.Get_rank() if comm is not None else _launched_rank()) == 0:
            super()._print_message(message, file)

    def exit(self, status=0, message=None):
        """Print ``message`` on rank 0, then leave on every rank once rank 0 has printed: a
        launcher ends the whole job when one rank exits with an error, and the rank that had
        the message to print must not be the one it ends first. A rank whose peers do not
        come within ``PATIENCE`` seconds (it alone called this) prints its message itself
        and leaves at once, so that its launcher ends the job."""
        if message:
            self._print_message(message, sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        comm = self._comm()
        if comm is not None and comm.Get_size() > 1 and not _together(comm, PATIENCE):
            if message and comm.Get_rank() != 0:
                sys.stderr.write(f"rank {comm.Get_rank()}: {message}")
                sys.stderr.flush()
            os._exit(status)  # not MPI's finalization, which would wait for the peers
        sys.exit(status)

    def agree(self, *checks, root=()):
        """Run each of ``checks`` (a callable returning a complaint, or None) on every rank,
        and those of ``root`` (what only rank 0 reads or writes) on rank 0; if any rank
        complains, every rank exits with the first complaint as a usage error (collective).
        A complaint of ``checks`` that not every rank makes says on which ranks it was."""
        comm = self._comm()
        rank = 0 if comm is None else comm.Get_rank()
        mine = _first_complaint(checks)
        if mine is None and rank == 0:
            mine = _first_complaint(root)
            mine = mine and (mine, True)
        elif mine is not None:
            mine = (mine, False)
        found = [mine] if comm is None else comm.allgather(mine)
        complaints = [(r, found[r]) for r in range(len(found)) if found[r]]
        if not complaints:
            return
        message, only_root = complaints[0][1]
        where = [r for r, (m, _) in complaints if m == message]
        if not only_root and len(where) < len(found):
            message += (
                f" (on rank{'s' if len(where) > 1 else ''} {', '.join(map(str, where))} of {len(found)})"
            )
        self.error(message)


def _first_complaint(checks):
    """The first complaint of ``checks``, or None; a check that fails complains of its error
    (so that no rank leaves the others waiting for its verdict)."""
    for check in checks:
        try:
            complaint = check()
        except Exception as exc:  # told to every rank as a usage error
            complaint = f"{type(exc).__name__}: {exc}"
        if complaint:
            return complaint
    return None


def _bounds(low, high, what):
    if low is not None and high is not None:
        return f"{what} from {low} to {high}"
    if low is not None:
        return f"{what} of at least {low}"
    return f"{what} of at most {high}"


def integer(low=None, high=None):
    """An option type: an integer within ``[low, high]`` (either may be None)."""

    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if (low is not None and value < low) or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be an {_bounds(low, high, 'integer')}, not {value}")
        return value

    parse.__name__ = "integer"
    return parse


def real(low=None, high=None, *, above=None, below=None):
    """An option type: a finite number within ``[low, high]`` and ``(above, below)``."""

    def parse(text):
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise argparse.ArgumentTypeError(f"must be a finite number, not {text}")
        wrong = [
            f"at least {low}" if low is not None and value < low else "",
            f"at most {high}" if high is not None and value > high else "",
            f"greater than {above}" if above is not None and value <= above else "",
            f"less than {below}" if below is not None and value >= below else "",
        ]
        wrong = [w for w in wrong if w]
        if wrong:
            raise argparse.ArgumentTypeError(f"must be {' and '.join(wrong)}, not {text}")
        return value

    parse.__name__ = "number"
    return parse


def add_mode(parser, items):
    """``--mode``: the forwarder's mode, its choices the forwarder's own (``items``: what
    moves, as the help says it: "rays", "particles")."""
    from rafi._engines import MODES

    parser.add_argument(
        "--mode", default="bsp", choices=MODES,
        help="the forwarder's mode: bsp runs rounds driven by the host, resident runs them on the device "
        f"(one node), async moves {items} without rounds",
    )  # fmt: skip


def output_file(option, path, formats=None):
    """Why ``path`` cannot be written as ``option``'s file, or None: its directory is missing
    or not writable, it is a directory (or another thing than a file), or its name ends in
    none of ``formats`` (suffixes such as ``.png``; None: any)."""
    if path is None:
        return None
    if formats is not None:
        suffix = os.path.splitext(path)[1].lower()
        if suffix not in formats:
            known = " or ".join(formats)
            return f"{option} {path}: " + (
                f"unknown format {suffix} (use {known})" if suffix else f"name a {known} file"
            )
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        return f"{option} {path}: the directory {folder} does not exist"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"{option} {path}: cannot write into {folder} (permission denied)"
    if os.path.isdir(path):
        return f"{option} {path}: is a directory; name a file in it"
    if os.path.exists(path) and not os.path.isfile(path):
        return f"{option} {path}: exists and is not a regular file"
    if os.path.exists(path) and not os.access(path, os.W_OK):
        return f"{option} {path}: exists and cannot be written (permission denied)"
    return None


def input_file(option, path):
    """Why ``path`` cannot be read as ``option``'s file, or None."""
    if path is None:
        return None
    if not os.path.exists(path):
        return f"{option} {path}: no such file"
    if os.path.isdir(path):
        return f"{option} {path}: is a directory, not a file"
    if not os.access(path, os.R_OK):
        return f"{option} {path}: cannot be read (permission denied)"
    return None
