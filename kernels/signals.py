"""Signals between the persistent kernels of one node: the words resident rounds are written in.

Resident rounds (kernels/resident.py) move items and counts through memory that another
process writes (node-shared memory on the cpu backend, CUDA-IPC-mapped memory on GPUs). Six
primitives, each one function with an njit and a CUDA implementation (and a plain-Python
body that the CUDA simulator runs):

- ``load_relaxed(a, i)``: read a word another process may be writing, from memory (never a
  stale copy the compiler or a cache kept): a relaxed atomic load on the CPU,
  ``ld.relaxed.sys`` on CUDA (volatile asm: a spin re-reads it every turn);
- ``store_relaxed(a, i, v)``: write a word other processes poll: a relaxed atomic store on
  the CPU, ``st.relaxed.sys`` on CUDA;
- ``fence_release()``: every earlier write of this thread is visible to every process
  before any later one (a writer fences between its payload and its stamp);
- ``fence_acquire()``: no later read of this thread happens before an earlier one (a
  reader fences between seeing a stamp and reading what it announces); on CUDA both are
  ``fence.acq_rel.sys`` (system scope: the writer may be another GPU);
- ``now_ns()``: a clock in nanoseconds: ``CLOCK_MONOTONIC`` on the CPU, ``%globaltimer`` on CUDA;
- ``pause(k)``: back off in the ``k``-th turn of a wait: the CPU spins, then yields the
  core, then sleeps up to 0.2 ms (so that more ranks than cores make progress); the GPU
  sleeps a little longer each turn, up to 1 us.

and ``block_sync()``: ``syncthreads`` on CUDA (and under its simulator); nothing on the
CPU, whose rounds run on one thread.
"""

import functools
import os
import time

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.extending import intrinsic

from rafi._targets import overload_targets

__all__ = [
    "block_sync",
    "fence_acquire",
    "fence_release",
    "load_relaxed",
    "now_ns",
    "pause",
    "store_relaxed",
]

_SPIN = 64  # turns of a wait that spin before the CPU yields its core
_YIELD = 4096  # turns before it sleeps
_SLEEP_NS = 200_000  # the longest a CPU wait sleeps at once


# ----------------------------------------------------------------------------- plain Python


def load_relaxed(array, index):
    """The word ``array[index]``, read from memory."""
    return array[index]


def store_relaxed(array, index, value):
    """``array[index] = value``, written where every process sees it."""
    array[index] = value


def fence_release():
    """Order this thread's earlier writes before its later ones, for every process."""


def fence_acquire():
    """Order this thread's earlier reads before its later ones."""


def now_ns():
    """Nanoseconds of a monotonic clock."""
    return time.perf_counter_ns()


def pause(k):
    """Back off in turn ``k`` of a wait."""
    if k >= _YIELD:
        time.sleep(1e-4)
    elif k >= _SPIN:
        os.sched_yield()


def block_sync():
    """Wait for every thread of the block (under the simulator, its simulated block)."""
    from rafi._targets import simulator

    if simulator():
        from numba.cuda.simulator.kernel import _get_kernel_context

        context = _get_kernel_context()
        if context is not None:
            context.syncthreads()


# ----------------------------------------------------------------------------- cpu


def _data_pointer(context, builder, array_type, array, index_type, index):
    data = context.make_array(array_type)(context, builder, array).data
    return builder.gep(data, [context.cast(builder, index, index_type, types.intp)])


@intrinsic
def _atomic_load(typingctx, array, index):
    if not (isinstance(array, types.Array) and isinstance(index, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        array_type, index_type = signature.args
        pointer = _data_pointer(context, builder, array_type, args[0], index_type, args[1])
        return builder.load_atomic(pointer, "monotonic", array_type.dtype.bitwidth // 8)

    return array.dtype(array, index), codegen


@intrinsic
def _atomic_store(typingctx, array, index, value):
    if not (isinstance(array, types.Array) and isinstance(index, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        array_type, index_type, value_type = signature.args
        pointer = _data_pointer(context, builder, array_type, args[0], index_type, args[1])
        word = context.cast(builder, args[2], value_type, array_type.dtype)
        builder.store_atomic(word, pointer, "monotonic", array_type.dtype.bitwidth // 8)
        return context.get_dummy_value()

    return types.void(array, index, value), codegen


def _fence_intrinsic(ordering):
    @intrinsic
    def fence(typingctx):
        def codegen(context, builder, signature, args):
            builder.fence(ordering)
            return context.get_dummy_value()

        return types.void(), codegen

    return fence


_release, _acquire = _fence_intrinsic("release"), _fence_intrinsic("acquire")


def _timespec(builder):
    return cgutils.alloca_once(builder, ir.ArrayType(ir.IntType(64), 2))


def _libc(builder, name, result, arguments):
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(result, arguments), name)


@intrinsic
def _monotonic_ns(typingctx):
    def codegen(context, builder, signature, args):
        i32, i64 = ir.IntType(32), ir.IntType(64)
        spec = _timespec(builder)
        builder.call(_libc(builder, "clock_gettime", i32, [i32, spec.type]), [ir.Constant(i32, 1), spec])
        zero, one = ir.Constant(i32, 0), ir.Constant(i32, 1)
        seconds = builder.load(builder.gep(spec, [zero, zero]))
        nanoseconds = builder.load(builder.gep(spec, [zero, one]))
        return builder.add(builder.mul(seconds, ir.Constant(i64, 1_000_000_000)), nanoseconds)

    return types.int64(), codegen


@intrinsic
def _yield_core(typingctx):
    def codegen(context, builder, signature, args):
        builder.call(_libc(builder, "sched_yield", ir.IntType(32), []), [])
        return context.get_dummy_value()

    return types.void(), codegen


@intrinsic
def _sleep_ns(typingctx, nanoseconds):
    def codegen(context, builder, signature, args):
        i32, i64 = ir.IntType(32), ir.IntType(64)
        spec = _timespec(builder)
        zero, one = ir.Constant(i32, 0), ir.Constant(i32, 1)
        builder.store(ir.Constant(i64, 0), builder.gep(spec, [zero, zero]))
        ns = context.cast(builder, args[0], signature.args[0], types.int64)
        builder.store(ns, builder.gep(spec, [zero, one]))
        nanosleep = _libc(builder, "nanosleep", i32, [spec.type, spec.type])
        builder.call(nanosleep, [spec, ir.Constant(spec.type, None)])
        return context.get_dummy_value()

    return types.void(nanoseconds), codegen


def _cpu_load(array, index):
    return lambda array, index: _atomic_load(array, index)


def _cpu_store(array, index, value):
    return lambda array, index, value: _atomic_store(array, index, value)


def _cpu_pause(k):
    def impl(k):
        if k >= _YIELD:
            _sleep_ns(min(_SLEEP_NS, 1000 * (k - _YIELD + 1)))
        elif k >= _SPIN:
            _yield_core()

    return impl


# ----------------------------------------------------------------------------- CUDA


def _cuda_intrinsic():
    from numba.cuda.extending import intrinsic as cuda_intrinsic

    return cuda_intrinsic


@functools.cache
def _cuda_asm(text, result):
    """A CUDA intrinsic of one volatile PTX instruction without operands: ``result`` is
    ``"int64"`` (its one output register) or ``"void"`` (then it clobbers memory)."""

    @_cuda_intrinsic()
    def instruction(typingctx):
        def codegen(context, builder, signature, args):
            if result == "void":
                asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), text, "~{memory}", True)
                builder.call(asm, [])
                return context.get_dummy_value()
            return builder.call(ir.InlineAsm(ir.FunctionType(ir.IntType(64), []), text, "=l", True), [])

        return getattr(types, result)(), codegen

    return instruction


def _cuda_now():
    timer = _cuda_asm("mov.u64 $0, %globaltimer;", "int64")
    return lambda: timer()


def _cuda_fence():
    """``fence.acq_rel.sys``: orders this thread's accesses as release and acquire need, at
    system scope (the peer may be another GPU), without the single total order of a
    ``membar.sys`` (``fence.sc.sys``), which costs more and no rule here relies on."""
    fence = _cuda_asm("fence.acq_rel.sys;", "void")
    return lambda: fence()


@functools.cache
def _cuda_words():
    """``ld.relaxed.sys`` and ``st.relaxed.sys`` of a 4- or 8-byte word, as volatile asm with a
    memory clobber, so that the compiler neither hoists a load out of a spin nor drops a
    store (numba-cuda's ``ldcv`` is asm without side effects, which a loop may hoist)."""
    from numba.cuda.cache_hints import _get_element_pointer

    cuda_intrinsic = _cuda_intrinsic()
    letter = {32: "r", 64: "l"}

    @cuda_intrinsic
    def load(typingctx, array, index):
        if not (isinstance(array, types.Array) and isinstance(index, types.Integer)):
            return None
        bits = array.dtype.bitwidth

        def codegen(context, builder, signature, args):
            array_type, index_type = signature.args
            pointer = _get_element_pointer(context, builder, index_type, args[1], array_type, args[0])
            word = context.get_value_type(array_type.dtype)
            asm = ir.InlineAsm(
                ir.FunctionType(word, [pointer.type]),
                f"ld.relaxed.sys.global.b{bits} $0, [$1];",
                f"={letter[bits]},l,~{{memory}}",
                side_effect=True,
            )
            return builder.call(asm, [pointer])

        return array.dtype(array, index), codegen

    @cuda_intrinsic
    def store(typingctx, array, index, value):
        if not (isinstance(array, types.Array) and isinstance(index, types.Integer)):
            return None
        bits = array.dtype.bitwidth

        def codegen(context, builder, signature, args):
            array_type, index_type, value_type = signature.args
            pointer = _get_element_pointer(context, builder, index_type, args[1], array_type, args[0])
            word = context.cast(builder, args[2], value_type, array_type.dtype)
            asm = ir.InlineAsm(
                ir.FunctionType(ir.VoidType(), [pointer.type, word.type]),
                f"st.relaxed.sys.global.b{bits} [$0], $1;",
                f"l,{letter[bits]},~{{memory}}",
                side_effect=True,
            )
            builder.call(asm, [pointer, word])
            return context.get_dummy_value()

        return types.void(array, index, value), codegen

    return load, store


def _cuda_load(array, index):
    load = _cuda_words()[0]
    return lambda array, index: load(array, index)


def _cuda_store(array, index, value):
    store = _cuda_words()[1]
    return lambda array, index, value: store(array, index, value)


def _cuda_pause(k):
    from numba import cuda

    def impl(k):
        if k >= 8:
            cuda.nanosleep(min(1000, 32 * (k - 7)))

    return impl


def _cuda_sync():
    from numba import cuda

    return lambda: cuda.syncthreads()


overload_targets(load_relaxed, _cpu_load, _cuda_load)
overload_targets(store_relaxed, _cpu_store, _cuda_store)
overload_targets(fence_release, lambda: lambda: _release(), _cuda_fence)
overload_targets(fence_acquire, lambda: lambda: _acquire(), _cuda_fence)
overload_targets(now_ns, lambda: lambda: _monotonic_ns(), _cuda_now)
overload_targets(pause, _cpu_pause, _cuda_pause)
overload_targets(block_sync, lambda: lambda: None, _cuda_sync)
