"""bfloat16 <-> float conversions in LLVM IR, shared by the Vector lowering (`lower_llvm`) and
the GEMM packing and FixPipe code (`gemm`).

bfloat16 is stored as ``i16`` bits and computed as ``float``. The conversions are integer code
on purpose: LLVM lowers ``fptrunc float to bfloat`` to a ``__truncsfbf2`` libcall on targets
without AVX512_BF16, which a JIT process may not resolve, while shifts and adds vectorize on any
target and give the same round-to-nearest-even answer as vcvtneps2bf16, ml_dtypes and torch.
This module imports nothing of lazymath (both of its users sit in an import cycle of their own).
"""

from __future__ import annotations

from llvmlite import ir

I16 = ir.IntType(16)
I32 = ir.IntType(32)
F32 = ir.FloatType()


def _like(t: ir.Type, et: ir.Type) -> ir.Type:
    """`et`, or a vector of `et` as wide as `t`."""
    return ir.VectorType(et, t.count) if isinstance(t, ir.VectorType) else et


def _splat(t: ir.Type, value: int) -> ir.Constant:
    return ir.Constant(t, [value] * t.count if isinstance(t, ir.VectorType) else value)


def bf16_to_f32(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """bfloat16 bits (i16, scalar or vector) -> float: they are the top half of the float's
    bits, so the widening is exact and keeps NaN payloads and signed zeros."""
    wide = _like(v.type, I32)
    return b.bitcast(b.shl(b.zext(v, wide), _splat(wide, 16)), _like(v.type, F32))


def f32_to_bf16(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """float (scalar or vector) -> bfloat16 bits, rounded to nearest even like vcvtneps2bf16,
    ml_dtypes and torch: add 0x7fff plus the kept LSB and keep the top half. A NaN keeps its
    sign and top payload and gets the quiet bit (the rounding add could otherwise carry it into
    infinity). Integer ops only: LLVM needs no `__truncsfbf2` libcall on targets without
    AVX512_BF16, and the loop vectorizer widens it like any other integer code."""
    i32 = _like(v.type, I32)
    bits = b.bitcast(v, i32)
    lsb = b.and_(b.lshr(bits, _splat(i32, 16)), _splat(i32, 1))
    rounded = b.add(bits, b.add(lsb, _splat(i32, 0x7FFF)))
    quiet = b.or_(bits, _splat(i32, 0x400000))
    out = b.select(b.fcmp_unordered("uno", v, v), quiet, rounded)
    return b.trunc(b.lshr(out, _splat(i32, 16)), _like(v.type, I16))
