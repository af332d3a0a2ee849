"""LLVM lowerings of the Vector unit's instructions: the elementwise ones as `Elem` data (fused
into one loop by `lower_ctx.lower_elementwise`), broadcast, reductions and arg-reductions, and
the libm fallback of the composites vmath does not expand.

Split out of `lower_llvm` (issue 36); importing this module registers its lowerings in
`lower_ctx.LOWER` / `lower_ctx.ELEMENTWISE_INSTRS`.
"""

from __future__ import annotations

from llvmlite import ir

from lazymath.backend.host.llvm_ops import (
    F32,
    F64,
    I64,
    _combine,
    _float_divmod,
    _icmp,
    _isnan,
    _reduce_identity,
    binary_op,
    compare,
    convert,
    host_math,
    kind,
    scalar_op,
    unary_op,
    widen,
)
from lazymath.backend.host.lower_ctx import (
    ELEMENTWISE_INSTRS,
    Elem,
    LowerCtx,
    elementwise,
    register,
)
from lazymath.backend.npu import isa


@elementwise(isa.VBinary)
def _vbinary(ctx: LowerCtx, i: isa.VBinary) -> Elem:
    dt = i.a.buf.dtype
    return Elem(i.dst, (i.a, i.b), i.n, lambda x, y: binary_op(ctx, i.op, dt, x, y))


@elementwise(isa.VScalar)
def _vscalar(ctx: LowerCtx, i: isa.VScalar) -> Elem:
    dt = i.src.buf.dtype
    return Elem(i.dst, (i.src,), i.n, lambda x: scalar_op(ctx, i.op, dt, x, i.scalar))


@elementwise(isa.VUnary)
def _vunary(ctx: LowerCtx, i: isa.VUnary) -> Elem:
    dt = i.src.buf.dtype
    if i.dst.buf.dtype != dt:
        raise ValueError(f"{isa.format_instr(i)}: unary ops keep the dtype")
    return Elem(i.dst, (i.src,), i.n, lambda x: unary_op(ctx, i.op, dt, x))


@elementwise(isa.VFma)
def _vfma(ctx: LowerCtx, i: isa.VFma) -> Elem:
    dt = i.dst.buf.dtype
    b = ctx.builder
    if kind(dt) == "f":
        return Elem(i.dst, (i.a, i.b, i.c), i.n,
                    lambda x, y, z: ctx.call_intrinsic("fma", x.type, x, y, z))  # fmt: skip
    return Elem(i.dst, (i.a, i.b, i.c), i.n, lambda x, y, z: b.add(b.mul(x, y), z))


@elementwise(isa.VConv)
def _vconv(ctx: LowerCtx, i: isa.VConv) -> Elem:
    sd, dd = i.src.buf.dtype, i.dst.buf.dtype
    return Elem(i.dst, (i.src,), i.n, lambda x: convert(ctx, sd, dd, x, i.mode), raw=True)


@elementwise(isa.VCmp)
def _vcmp(ctx: LowerCtx, i: isa.VCmp) -> Elem:
    dt = i.a.buf.dtype
    return Elem(i.dst, (i.a, i.b), i.n, lambda x, y: compare(ctx, i.cmp, dt, x, y))


@elementwise(isa.VCmpS)
def _vcmps(ctx: LowerCtx, i: isa.VCmpS) -> Elem:
    dt = i.src.buf.dtype
    return Elem(i.dst, (i.src,), i.n,
                lambda x: compare(ctx, i.cmp, dt, x, ctx.const(dt, i.scalar)))  # fmt: skip


@elementwise(isa.VSel)
def _vsel(ctx: LowerCtx, i: isa.VSel) -> Elem:
    b = ctx.builder

    def fn(m, x, y):
        return b.select(b.icmp_unsigned("!=", m, ir.Constant(m.type, 0)), x, y)

    return Elem(i.dst, (i.mask, i.a, i.b), i.n, fn)


@elementwise(isa.VDup)
def _vdup(ctx: LowerCtx, i: isa.VDup) -> Elem:
    dt = i.dst.buf.dtype

    def fn():
        if isinstance(i.scalar, (isa.Var, isa.BinInt)):  # a scalar register value
            c = convert(ctx, "int64", dt, ctx.int(i.scalar), "trunc")
            return widen(ctx.builder, dt, c)
        return ctx.const(dt, i.scalar)

    return Elem(i.dst, (), i.n, fn)


@elementwise(isa.CopyIn)
def _copy_in_elem(ctx: LowerCtx, i: isa.CopyIn) -> Elem | None:
    """A 1-D copy is elementwise (dst[k] = gm[off + k*stride]): it fuses with the compute."""
    if len(i.counts) != 1 or i.src.buf.dtype != i.dst.buf.dtype:
        return None
    return Elem(i.dst, (i.src,), i.counts[0], lambda x: x, raw=True, src_strides=(i.strides[0],))


@elementwise(isa.CopyOut)
def _copy_out_elem(ctx: LowerCtx, i: isa.CopyOut) -> Elem | None:
    if len(i.counts) != 1 or i.src.buf.dtype != i.dst.buf.dtype:
        return None
    if isinstance(i.strides[0], int) and i.strides[0] == 0:
        return None  # every element lands on one GM address: keep the ordered loop
    return Elem(i.dst, (i.src,), i.counts[0], lambda x: x, raw=True, dst_stride=i.strides[0])


@elementwise(isa.VGather)
def _vgather(ctx: LowerCtx, i: isa.VGather) -> Elem:
    b = ctx.builder
    tdt = i.table.buf.dtype

    def fn(j):
        j = b.sext(j, I64) if j.type.width < 64 else j
        return ctx.load(ctx.ptr(i.table), tdt, j)

    return Elem(i.dst, (i.idx,), i.n, fn, table=i.table)


def _vbrcb_elem(ctx: LowerCtx, i: isa.VBrcb) -> Elem | None:
    """One row: dst[k] = src[0], a stride-0 read that fuses with the consumers' loop (the value
    stays in a register and a dead dst is never stored)."""
    if not (isinstance(i.rows, int) and i.rows == 1):
        return None
    return Elem(i.dst, (i.src,), i.n, lambda x: x, raw=True, src_strides=(0,))


ELEMENTWISE_INSTRS[isa.VBrcb] = _vbrcb_elem


@register(isa.VBrcb)
def _vbrcb(ctx: LowerCtx, i: isa.VBrcb) -> None:
    """dst[r*n + k] = src[r]: a scalar loop over rows, a vectorized fill per row."""
    b = ctx.builder
    dt = i.dst.buf.dtype
    if i.src.buf.dtype != dt:
        raise ValueError(f"{isa.format_instr(i)}: vbrcb keeps the dtype")
    sp, dp = ctx.ptr(i.src), ctx.ptr(i.dst)
    n = ctx.int(i.n)

    def row(r):
        v = ctx.load_raw(sp, dt, r)
        base = b.mul(r, n)
        ctx.parallel_for(n, lambda k: ctx.store_raw(dp, dt, b.add(base, k), v))

    ctx.for_range(0, ctx.int(i.rows), 1, row)


@register(isa.VReduce)
def _vreduce(ctx: LowerCtx, i: isa.VReduce) -> None:
    """Row-wise reduction into dst[r]; computed in dst's dtype with a vectorizable phi loop."""
    b = ctx.builder
    sd, dd = i.src.buf.dtype, i.dst.buf.dtype
    sp, dp = ctx.ptr(i.src), ctx.ptr(i.dst)
    n = ctx.int(i.n)

    def row(r):
        k = ctx.compute_type(dd)
        start = b.mul(r, n)
        acc0 = ctx.load(dp, dd, r)
        pre = b.block
        # inner reduction loop with an explicit accumulator phi
        ctx._nblocks += 1
        j = ctx._nblocks
        head = ctx.func.append_basic_block(f"red{j}")
        body = ctx.func.append_basic_block(f"redbody{j}")
        done = ctx.func.append_basic_block(f"reddone{j}")
        b.branch(head)
        b.position_at_end(head)
        c = b.phi(I64)
        acc = b.phi(k)
        c.add_incoming(ir.Constant(I64, 0), pre)
        acc.add_incoming(_reduce_identity(ctx, i.op, dd), pre)
        b.cbranch(b.icmp_signed("<", c, n), body, done)
        b.position_at_end(body)
        x = ctx.load_raw(sp, sd, b.add(start, c))
        x = convert(ctx, sd, dd, x, "trunc") if sd != dd else x
        x = widen(b, dd, x)
        nacc = _combine(ctx, i.op, dd, acc, x)
        c.add_incoming(b.add(c, ir.Constant(I64, 1)), b.block)
        acc.add_incoming(nacc, b.block)
        b.branch(head)
        b.position_at_end(done)
        ctx.store(dp, dd, r, _combine(ctx, i.op, dd, acc0, acc))

    ctx.for_range(0, i.rows, 1, row)


ARG_CHUNK = 64  # argmax/argmin: vectorized max of a chunk first, scalar scan only if it wins


@register(isa.VArgReduce)
def _vargreduce(ctx: LowerCtx, i: isa.VArgReduce) -> None:
    """First-occurrence arg max/min, NaN wins (first NaN), like numpy.argmax/argmin.

    Per row: for each 64-element chunk a vectorized (NaN-propagating) max/min; only when the
    chunk beats the running best is it scanned for its first winning index. The tail is scanned.
    """
    b = ctx.builder
    sd, vd, idt = i.src.buf.dtype, i.dst_val.buf.dtype, i.dst_idx.buf.dtype
    if sd != vd:
        raise NotImplementedError(f"{isa.format_instr(i)}: value dtype must match source")
    sp, vp, ip = ctx.ptr(i.src), ctx.ptr(i.dst_val), ctx.ptr(i.dst_idx)
    n, base = ctx.int(i.n), ctx.int(i.base)
    k = kind(vd)
    ct = ctx.compute_type(vd)
    cmp = ">" if i.op == "vargmax" else "<"
    red_op = "vcmax" if i.op == "vargmax" else "vcmin"
    with b.goto_entry_block():
        bv_slot = b.alloca(ct)
        bj_slot = b.alloca(I64)
    W = ir.Constant(I64, ARG_CHUNK)

    def better(x, best):
        if k == "f":
            nan_wins = b.and_(_isnan(b, x), b.fcmp_ordered("ord", best, best))
            return b.or_(b.fcmp_ordered(cmp, x, best), nan_wins)
        return _icmp(b, k, cmp, x, best)

    def scan(first, c0, cnt):
        def one(j):
            x = ctx.load(sp, sd, b.add(first, j))
            best = b.load(bv_slot)
            win = better(x, best)
            b.store(b.select(win, x, best), bv_slot)
            b.store(b.select(win, b.add(base, b.add(c0, j)), b.load(bj_slot)), bj_slot)

        ctx.for_range(0, cnt, 1, one, no_unroll=True)

    def row(r):
        start = b.mul(r, n)
        b.store(ctx.load(vp, vd, r), bv_slot)
        j0 = ctx.load(ip, idt, r)
        b.store(j0 if j0.type == I64 else b.sext(j0, I64), bj_slot)
        nfull = b.mul(b.sdiv(n, W), W)

        def chunk(c0):
            first = b.add(start, c0)

            def fold(j, acc):
                return [_combine(ctx, red_op, vd, acc, ctx.load(sp, sd, b.add(first, j)))]

            # unroll.disable: LLVM 22's unroller + vectorizer loop forever on this reduction
            (cm,) = ctx._loop(0, W, 1, fold, parallel=True, no_unroll=True,
                              carry=[_reduce_identity(ctx, red_op, vd)])  # fmt: skip
            with b.if_then(better(cm, b.load(bv_slot))):
                scan(first, c0, W)

        ctx.for_range(0, nfull, ARG_CHUNK, chunk, no_unroll=True)
        scan(b.add(start, nfull), nfull, b.sub(n, nfull))
        ctx.store(vp, vd, r, b.load(bv_slot))
        bj = b.load(bj_slot)
        it = ctx.storage_type(idt)
        ctx.store(ip, idt, r, bj if it == I64 else b.trunc(bj, it))

    ctx.for_range(0, i.rows, 1, row, no_unroll=True)


@elementwise(isa.VHostMath)
def _vhostmath(ctx: LowerCtx, i: isa.VHostMath) -> Elem:
    """libm fallback for composites vmath cannot expand (scalar calls; correct, not fast)."""
    b = ctx.builder
    dt = i.dst.buf.dtype
    t = ctx.compute_type(dt)
    suffix = "f" if t == F32 else ""

    def fn(*xs):
        if i.fn in ("sin", "cos", "tan", "tanh"):
            return b.call(ctx.libm(i.fn + suffix, t), [xs[0]])
        if i.fn == "sigmoid":
            one = ir.Constant(t, 1.0)
            e = b.call(ctx.native("vexp", "float64" if t == F64 else "float32"), [b.fneg(xs[0])])
            return b.fdiv(one, b.fadd(one, e))
        if i.fn == "pow":
            return ctx.call_intrinsic("pow", t, xs[0], xs[1])
        if i.fn == "exp2":
            return ctx.call_intrinsic("exp2", t, xs[0])
        if i.fn in ("floor_divide", "remainder"):
            return _float_divmod(ctx, xs[0], xs[1], "div" if i.fn == "floor_divide" else "mod")
        return host_math(ctx, i.fn, t, xs)

    return Elem(i.dst, tuple(i.srcs), i.n, fn)
