"""``copy_record(dst, src)``: one whole record onto another, as a few wide loads and stores.

numba copies a record field by field, and a field that is an array (``pad: f8[6]``) as a
view per element: 50 ns an item for ``device.emit`` of a 64-byte record on the cpu backend,
where copying its eight words takes 4. Here a record (numba passes it as a pointer to its
bytes) is copied as machine words, every load issued before the first store: on the CPU
and on CUDA the same few instructions, whatever the record's fields. Under the simulator
the plain Python body runs (records are numpy records there).
"""

from llvmlite import ir
from numba import types

from rafi._targets import overload_targets

__all__ = ["copy_record"]

_UNROLL = 64  # words copied by unrolled loads and stores; a larger record takes llvm.memcpy


def copy_record(dst, src):
    """Copy record ``src`` onto record ``dst`` (the same dtype)."""
    for name in dst.dtype.names:  # numpy records viewing their arrays (the simulator)
        dst[name] = src[name]
    return 0


def _word_bytes(size, alignment):
    for word in (8, 4, 2):
        if size % word == 0 and alignment % word == 0:
            return word
    return 1


def _codegen(context, builder, signature, args):
    record = signature.args[0]
    size, alignment = record.size, record.dtype.alignment
    word = _word_bytes(size, alignment)
    count = size // word
    dst, src = args
    if count > _UNROLL:
        from numba.core import cgutils

        cgutils.raw_memcpy(builder, dst, src, context.get_constant(types.intp, size), 1, align=alignment)
        return context.get_constant(types.int64, 0)
    pointer = ir.IntType(8 * word).as_pointer()
    to, frm = builder.bitcast(dst, pointer), builder.bitcast(src, pointer)
    values = [
        builder.load(builder.gep(frm, [ir.Constant(ir.IntType(32), k)]), align=word) for k in range(count)
    ]
    for k, value in enumerate(values):
        builder.store(value, builder.gep(to, [ir.Constant(ir.IntType(32), k)]), align=word)
    return context.get_constant(types.int64, 0)


def _typer(intrinsic):
    @intrinsic
    def raw_copy(typingctx, dst, src):
        if isinstance(dst, types.Record) and isinstance(src, types.Record) and dst.dtype == src.dtype:
            return types.int64(dst, src), _codegen
        return None

    return raw_copy


def _cpu(dst, src):
    from numba.core.extending import intrinsic

    raw_copy = _typer(intrinsic)
    return lambda dst, src: raw_copy(dst, src)


def _cuda(dst, src):
    from numba.cuda.extending import intrinsic

    raw_copy = _typer(intrinsic)
    return lambda dst, src: raw_copy(dst, src)


overload_targets(copy_record, _cpu, _cuda)
