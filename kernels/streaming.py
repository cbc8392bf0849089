"""``stream_store`` and ``stream_fence``: stores that bypass the cache, for copies larger than it.

An ordinary store first reads the destination's cache line, which a large copy never
reads again: a third of its memory traffic. A non-temporal store writes the line without
reading it (a gather of 1M 64-byte records in outbox order on the CPU machine: 13.3 ms
with ordinary stores, 8.5 with these; ``np.copyto`` of the same bytes 12.8). On the cpu backend
``stream_store`` is such a store (LLVM's ``!nontemporal``: ``movnti`` on x86-64) and
``stream_fence`` a full fence, after which every earlier store is visible to every process
(non-temporal stores are weakly ordered, even against the lock of a later barrier). On
CUDA and under the simulator the store is plain and the fence nothing: a kernel's stores
are complete when it ends.

Use them for data no one reads soon: past the caches, a later reader pays a trip to memory.
"""

from llvmlite import ir
from numba import types
from numba.core.extending import intrinsic

from rafi._targets import overload_targets

__all__ = ["STREAM_BYTES", "stream_fence", "stream_store"]

STREAM_BYTES = 1 << 22  # a copy this large (4 MiB) outgrows a core's caches: stream it


def stream_store(array, index, value):
    """``array[index] = value``, not kept in the cache (on the cpu backend)."""
    array[index] = value


def stream_fence():
    """Make every earlier ``stream_store`` visible before any later store."""


@intrinsic
def _nontemporal_store(typingctx, array, index, value):
    writable = isinstance(array, types.Array) and array.ndim == 1 and array.layout == "C" and array.mutable
    if not (writable and isinstance(index, types.Integer)):
        return None  # a flat writable array and an integer index only: anything else is a typing error

    def codegen(context, builder, signature, args):
        array_type, index_type, value_type = signature.args
        data = context.make_array(array_type)(context, builder, args[0]).data
        at = context.cast(builder, args[1], index_type, types.intp)
        word = context.cast(builder, args[2], value_type, array_type.dtype)
        store = builder.store(word, builder.gep(data, [at]))
        store.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
        return context.get_dummy_value()

    return types.void(array, index, value), codegen


@intrinsic
def _full_fence(typingctx):
    def codegen(context, builder, signature, args):
        builder.fence("seq_cst")  # mfence on x86-64, which orders non-temporal stores too
        return context.get_dummy_value()

    return types.void(), codegen


def _cpu_store(array, index, value):
    return lambda array, index, value: _nontemporal_store(array, index, value)


def _cuda_store(array, index, value):
    return stream_store


def _cpu_fence():
    return lambda: _full_fence()


def _cuda_fence():
    return stream_fence


overload_targets(stream_store, _cpu_store, _cuda_store)
overload_targets(stream_fence, _cpu_fence, _cuda_fence)
