"""One Python function, three targets: numba njit, numba-cuda, and plain Python under the simulator.

A device-API function (``push``, ``contribute``, a user's ``@rafi.func``) is written as a
plain Python function. Here it is given an njit overload at once and a CUDA overload when
the cuda backend first starts (so that ``import rafi`` never imports numba-cuda). Under
``NUMBA_ENABLE_CUDASIM=1`` no CUDA overload is made: the simulator runs the plain body.
"""

import functools
import os

__all__ = ["overload_targets", "func", "inline_func", "uncounted_func", "enable_cuda", "simulator"]

_cuda_typers = []
_cuda_enabled = False


def simulator():
    """Return True when numba-cuda runs kernels in its CPU simulator."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


def overload_targets(py_fn, cpu_typer, cuda_typer, inline=True, counted=True):
    """Give ``py_fn`` an njit implementation now and a CUDA one once CUDA is in use.

    Args:
        py_fn: the plain Python function kernels call (runs as is under the simulator).
        cpu_typer: numba ``overload`` typing function for the njit target.
        cuda_typer: numba-cuda ``overload`` typing function for the CUDA target.
        inline: inline the njit implementation into its caller at numba's IR level. numba
            compiles an overload as a function of its own, which LLVM does not inline
            across: ``device.push`` cost 34 ns a call that way and 2 ns inlined. The device
            API's few lines are inlined (where the caller compiles for the cpu:
            ``_on_the_cpu``); a user's ``@rafi.func`` (often large) is not.
        counted: the njit implementation counts references to the arrays it is given, as
            numba's runtime (NRT) does: a locked increment and decrement of each array a
            call passes. False for functions that allocate nothing and are called with
            many arrays many times a round (kernels/resident.py: 1.8 of the 6 us of an
            empty round went to those instructions).
    """
    from numba.core.extending import overload

    options = {} if counted else {"_nrt": False}
    overload(py_fn, target="cpu", inline=_on_the_cpu if inline else "never", jit_options=options)(cpu_typer)
    _cuda_typers.append((py_fn, cuda_typer))
    if _cuda_enabled and not simulator():
        _register_cuda(py_fn, cuda_typer)


def _on_the_cpu(expr, caller, callee):
    """numba's cost model of an inlined cpu overload: inline it where the caller compiles
    for the cpu, never elsewhere. numba's pass that inlines overloads takes the first
    template of the function that has inlining data for the call's types, whatever its
    target: once a cpu kernel called ``device.push`` with some types, a CUDA kernel
    calling it with the same types got the cpu body (no atomics) inlined. numba-cuda
    compiles under ``target_override("cuda")``, which ``current_target`` reports."""
    from numba.core.target_extension import current_target

    return current_target() == "cpu"


def _register_cuda(py_fn, cuda_typer):
    from numba.cuda.extending import overload

    overload(py_fn)(cuda_typer)


def enable_cuda():
    """Register the CUDA overloads of every device-API function (idempotent); under the
    simulator, make its shared arrays safe instead (``_simulator``)."""
    global _cuda_enabled
    if _cuda_enabled:
        return
    _cuda_enabled = True
    if simulator():
        from ._simulator import shared_arrays_atomic

        shared_arrays_atomic()
        return
    for py_fn, cuda_typer in _cuda_typers:
        _register_cuda(py_fn, cuda_typer)


def _same_function(fn):
    """A typing function with ``fn``'s signature that picks ``fn`` itself as the implementation."""

    @functools.wraps(fn)
    def typer(*args, **kwargs):
        return fn

    return typer


def func(fn):
    """Mark ``fn`` as a helper that kernels call; it compiles for whichever backend calls it.

    Returns:
        ``fn`` itself, still callable from plain Python.
    """
    typer = _same_function(fn)
    overload_targets(fn, typer, typer, inline=False)
    return fn


def uncounted_func(fn):
    """``func``, compiled for the cpu without reference counts (``overload_targets``): for
    rafi's own functions that take many arrays, are called many times a round and
    allocate nothing (the resident kernel's protocol)."""
    typer = _same_function(fn)
    overload_targets(fn, typer, typer, inline=False, counted=False)
    return fn


def inline_func(fn):
    """``func``, inlined into its njit callers: for rafi's own few-line helpers that kernels
    call per item (a call of a function numba compiled apart costs tens of nanoseconds)."""
    typer = _same_function(fn)
    overload_targets(fn, typer, typer)
    return fn
