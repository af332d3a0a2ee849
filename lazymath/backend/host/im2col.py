"""Implicit GEMM: conv1d's im2col and zero padding inside the Cube's GM -> L1 packing.

A dense (or grouped, dilated, strided) conv1d is the matmul ``W (C_out, C*K) @ B (C*K, L_out)``
per batch (and group) with ``B[c*K + j, l] = x[c, l*stride + j*dilation - pad_left]`` and 0
where that position falls outside x. No im2col buffer and no padded copy of x exist: the
matmul template's B load is a `LoadNz` with ``im2col`` set (`isa_cube.LoadNz`), and the three
consumers of the instruction build the panel straight from x (the (N, C, L) input as the user
holds it, any strides):

- LLVM (`emit_pack`): per panel row (c, j) the positions of one 16-column fractal are
  consecutive in x when stride and x's position stride are 1: one 16-wide vector load (float16
  widened), the operand prologue (an elementwise producer of x fused into the load), one store;
  fractals that touch the zero padding or the panel edge load lane by lane from clamped
  positions and select 0 where a position is outside x (after the prologue: padding is zero
  whatever the prologue would make of it). Other strides take the lane-by-lane path.
- interpreter (`gather`): the same element rule in numpy.
- race checker (`footprint`): the span of x rows and positions the panel reads.

The cost model charges it as any LoadNz of rows x cols elements (MTE2).
"""

from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir

from lazymath.backend.host import gemm
from lazymath.backend.host.gemm import (
    C0,
    F32,
    I64,
    LLVM_TYPES,
    as_i64,
    c64,
    ceil_div,
    for_range,
    gep,
)


def emit_pack(
    b: ir.IRBuilder,
    dst: ir.Value,
    dst_rows: int,
    src: ir.Value,
    src_dtype: str,
    sc: int,
    sl: int,
    geom: tuple[int, int, int, int, int],
    k0: gemm.Val,
    n0: gemm.Val,
    rows: gemm.Val,
    cols: gemm.Val,
    rows_pad: int,
    prologue: Callable[[ir.IRBuilder, ir.Value], ir.Value] | None = None,
) -> None:
    """Pack B[k0 : k0+rows, n0 : n0+cols] of the implicit-GEMM operand into NZ fp32 at `dst`
    (NZ row stride `dst_rows`; rows zero-filled up to a multiple of `rows_pad`, columns up to a
    multiple of C0). x[c, p] = src[c*sc + p*sl]; `geom` = (K, stride, dilation, pad_left, L)."""
    kw, stride, dil, pad, length = geom
    et = LLVM_TYPES[src_dtype]
    pro = prologue or (lambda _b, v: v)
    vt64 = ir.VectorType(I64, C0)
    lanes = ir.Constant(vt64, [e * stride for e in range(C0)])
    lane_cols = ir.Constant(vt64, list(range(C0)))
    zero16 = ir.Constant(ir.VectorType(F32, C0), [0.0] * C0)
    rows_p = gemm.imul(b, ceil_div(b, rows, rows_pad), rows_pad)
    ncb = ceil_div(b, cols, C0)
    cols_v = as_i64(cols)

    def splat64(v: ir.Value) -> ir.Value:
        return b.shuffle_vector(
            b.insert_element(ir.Constant(vt64, ir.Undefined), v, ir.Constant(gemm.I32, 0)),
            ir.Constant(vt64, ir.Undefined),
            ir.Constant(ir.VectorType(gemm.I32, C0), [0] * C0),
        )

    def dst_row(cb: ir.Value, r: ir.Value) -> ir.Value:
        return gep(b, dst, b.mul(b.add(b.mul(cb, c64(dst_rows)), r), c64(C0)))

    def lanewise(row: ir.Value, p: ir.Value, col0: ir.Value) -> ir.Value:
        """16 positions from p (stride apart), 0 outside x or beyond the panel's columns."""
        pv = b.add(splat64(p), lanes)
        ok = b.and_(b.icmp_signed(">=", pv, ir.Constant(vt64, [0] * C0)),
                    b.icmp_signed("<", pv, ir.Constant(vt64, [length] * C0)))  # fmt: skip
        ok = b.and_(ok, b.icmp_signed("<", b.add(splat64(col0), lane_cols), splat64(cols_v)))
        if length == 0:  # nothing to read (all padding)
            return zero16
        safe = b.select(ok, pv, ir.Constant(vt64, [0] * C0))
        vec = ir.Constant(ir.VectorType(et, C0), ir.Undefined)
        for e in range(C0):
            idx = ir.Constant(gemm.I32, e)
            at = b.extract_element(safe, idx)
            el = b.load(gep(b, row, b.mul(at, c64(sl)) if sl != 1 else at, et), typ=et)
            vec = b.insert_element(vec, el, idx)
        return b.select(ok, pro(b, gemm.to_f32(b, vec, src_dtype)), zero16)

    def row_of(r: ir.Value) -> tuple[ir.Value, ir.Value]:
        """(x row pointer, x position of column 0) of panel row r = (channel, tap)."""
        kk = b.add(as_i64(k0), r)
        ch = b.sdiv(kk, c64(kw))
        j = b.srem(kk, c64(kw))
        p0 = b.sub(b.add(b.mul(as_i64(n0), c64(stride)), b.mul(j, c64(dil))), c64(pad))
        return gep(b, src, b.mul(ch, c64(sc)), et), p0

    def fractal(row: ir.Value, p0: ir.Value, r: ir.Value, cb: ir.Value) -> None:
        col0 = b.mul(cb, c64(C0))
        p = b.add(p0, b.mul(col0, c64(stride)))
        out = dst_row(cb, r)
        if stride == 1 and sl == 1 and length >= C0:
            full = b.and_(
                b.and_(b.icmp_signed(">=", p, c64(0)), b.icmp_signed("<=", p, c64(length - C0))),
                b.icmp_signed("<=", b.add(col0, c64(C0)), cols_v),
            )
            with b.if_else(full) as (inside, edge):
                with inside:
                    v = gemm.load_as_f32(b, gep(b, row, p, et), src_dtype, C0)
                    b.store(pro(b, v), out, align=32)
                with edge:
                    b.store(lanewise(row, p, col0), out, align=32)
        else:
            b.store(lanewise(row, p, col0), out, align=32)

    # blocks of PACK_ROWS panel rows per fractal column (as gemm.emit_pack_nz): row by row, the
    # stores of one row hit every fractal column at the NZ column stride (a multiple of 4 KiB
    # for the template's panels), all in one L1 set
    blk = gemm.PACK_ROWS
    rows_b = rows // blk * blk if isinstance(rows, int) else b.and_(rows, c64(-blk))
    with for_range(b, 0, rows_b, blk, name="i2rb") as r0:
        block = [(*row_of(b.add(r0, c64(i))), b.add(r0, c64(i))) for i in range(blk)]
        with for_range(b, 0, ncb, name="i2cb") as cb:
            for row, p0, r in block:
                fractal(row, p0, r, cb)
    with for_range(b, rows_b, rows, name="i2r") as r:
        row, p0 = row_of(r)
        with for_range(b, 0, ncb, name="i2cb") as cb:
            fractal(row, p0, r, cb)
    with for_range(b, rows, rows_p, name="i2z") as r:
        with for_range(b, 0, ncb, name="i2zc") as cb:
            b.store(zero16, dst_row(cb, r), align=32)
