"""LLVM lowerings of the movers (GM <-> on-chip copies that do not fuse) and of control flow
(loops, lets, ifs, scalar reads, atomics, vector math library calls, pipe flags).

Split out of `lower_llvm` (issue 36). It imports `lower_vector` first: the fusible 1-D copies
register there as elementwise instructions, and the 2-D copy lowering at the end of this module
must replace their `LOWER` entries, not be replaced by them.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir

from lazymath.backend.host import lower_vector  # noqa: F401  (registers first: see above)
from lazymath.backend.host.llvm_ops import I1, I64, PTR, kind
from lazymath.backend.host.lower_ctx import LOWER, LowerCtx, register
from lazymath.backend.npu import isa, vmath

# ============================================================================= movers


def _copy_2d(ctx: LowerCtx, gm_is_src: bool, gm_ref, chip_ref, counts, strides, pitch) -> None:
    """Dense chip tile <-> strided GM (2-D at most). memcpy for unit inner stride."""
    b = ctx.builder
    dt = chip_ref.buf.dtype
    if gm_ref.buf.dtype != dt:
        raise ValueError(f"copy between {gm_ref.buf.dtype} and {dt}: movers do not convert")
    if len(counts) == 1:
        counts, strides = (1, counts[0]), (0, strides[0])
    if len(counts) != 2:
        raise NotImplementedError(f"copies of {len(counts)} dims (at most 2)")
    rows, cols = ctx.int(counts[0]), ctx.int(counts[1])
    pitch_v = cols if pitch is None else ctx.int(pitch)
    gp, cp = ctx.ptr(gm_ref), ctx.ptr(chip_ref)
    s0, s1 = strides
    s0v = ctx.int(s0)
    itemsize = np.dtype(dt).itemsize

    def row(r):
        g = ctx.elem_ptr(gp, dt, b.mul(r, s0v))
        c = ctx.elem_ptr(cp, dt, b.mul(r, pitch_v))
        if isinstance(s1, int) and s1 == 1:
            nbytes = b.mul(cols, ir.Constant(I64, itemsize))
            fn = ctx.intrinsic("llvm.memcpy.p0.p0.i64", ir.VoidType(), [PTR, PTR, I64, I1])
            dst, src = (c, g) if gm_is_src else (g, c)
            b.call(fn, [dst, src, nbytes, ir.Constant(I1, 0)])
            return
        if isinstance(s1, int) and s1 == 0 and gm_is_src:
            v = ctx.load_raw(g, dt, ir.Constant(I64, 0))  # broadcast: read once, fill the row
            ctx.parallel_for(cols, lambda k: ctx.store_raw(c, dt, k, v))
            return
        s1v = ctx.int(s1)

        def elem(k):
            gi = b.mul(k, s1v)
            if gm_is_src:
                ctx.store_raw(c, dt, k, ctx.load_raw(g, dt, gi))
            else:
                ctx.store_raw(g, dt, gi, ctx.load_raw(c, dt, k))

        if gm_is_src or (isinstance(s1, int) and s1 != 0):
            ctx.parallel_for(cols, elem)
        else:  # writing a stride-0 GM view: last write wins, keep the order
            ctx.for_range(0, cols, 1, elem)

    # A row loop of memcpys whose GM rows run backwards (a flip: s0 < 0): LLVM 22's loop
    # vectorizer (quick pipeline) widens the small row copies into a reversed vector loop and
    # aborts the process on an internal assertion ("VPlan cost model and legacy cost model
    # disagreed", e.g. 31 rows of 2 or 4 bytes). Such loops gain nothing from the vectorizer
    # (each row is one small copy), so it is told to leave them alone.
    backwards = isinstance(s1, int) and s1 == 1 and isinstance(s0, int) and s0 < 0
    ctx.for_range(0, rows, 1, row, no_vectorize=backwards)


def _copy_in(ctx: LowerCtx, i: isa.CopyIn) -> None:
    _copy_2d(ctx, True, i.src, i.dst, i.counts, i.strides, i.dst_pitch)


def _copy_out(ctx: LowerCtx, i: isa.CopyOut) -> None:
    _copy_2d(ctx, False, i.dst, i.src, i.counts, i.strides, i.src_pitch)


# ============================================================================= control


_MOVERS = (isa.CopyIn, isa.CopyOut)


def _moves_data(body) -> bool:
    """Whether a loop body moves tiles between GM and on-chip memory (a tile loop)."""
    for instr in body:
        if isinstance(instr, _MOVERS) or type(instr).__name__ in ("LoadNz", "FixPipe"):
            return True
        inner = getattr(instr, "body", None)
        if isinstance(inner, tuple) and _moves_data(inner):
            return True
    return False


@register(isa.Loop)
def _loop(ctx: LowerCtx, i: isa.Loop) -> None:
    def body(v):
        saved = ctx.env.get(i.var)
        ctx.env[i.var] = v
        ctx.lower_body(i.body)
        if saved is None:
            ctx.env.pop(i.var, None)
        else:
            ctx.env[i.var] = saved

    if not isinstance(i.step, int) or i.step == 0:
        if not isinstance(i.step, int):
            ctx.for_range(i.start, i.stop, i.step, body)
            return
        raise ValueError(f"loop {i.var} has step 0")
    # Tile loops check the cancel flag once per iteration (a tile is thousands of elements):
    # Ctrl-C can stop even a 2**40-element reduction within a tile's time.
    exit_if = ctx.cancelled if _moves_data(i.body) else None
    ctx.for_range(i.start, i.stop, i.step, body, exit_if=exit_if)


@register(isa.Let)
def _let(ctx: LowerCtx, i: isa.Let) -> None:
    ctx.env[i.var] = ctx.int(i.value)


_ICMP = {"==": "==", "!=": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}


@register(isa.If)
def _if(ctx: LowerCtx, i: isa.If) -> None:
    b = ctx.builder
    cond = b.icmp_signed(_ICMP[i.cmp], ctx.int(i.a), ctx.int(i.b))
    saved = dict(ctx.env)
    with b.if_then(cond):
        ctx.lower_body(i.body)
    ctx.env = saved  # names bound inside the branch do not dominate what follows


@register(vmath.GetValue)
def _get_value(ctx: LowerCtx, i: vmath.GetValue) -> None:
    """A UB element into a scalar (i64) the following Ifs branch on."""
    b = ctx.builder
    dt = i.src.buf.dtype
    v = b.load(ctx.ptr(i.src), typ=ctx.storage_type(dt))
    if v.type != I64:
        v = b.zext(v, I64) if kind(dt) == "u" else b.sext(v, I64)
    ctx.env[i.var] = v


@register(vmath.VMathCall)
def _vmath_call(ctx: LowerCtx, i: vmath.VMathCall) -> None:
    """A call into the vector math runtime library (`vmlib`): the composite runs out of line
    over the tile, ``void lazymath_vm_<op>_<dtype>(dst, src0, src1, n)``, called through its
    pointer cell ``lazymath_vmp_<op>_<dtype>`` (the library's quickly compiled code can be
    replaced by its optimized code while kernels are linked to it)."""
    name = "lazymath_vmp_" + vmath.call_symbol(i.op, i.dtype)[len("lazymath_vm_") :]
    cell = ctx.module.globals.get(name)
    if cell is None:
        cell = ir.GlobalVariable(ctx.module, PTR, name=name)
    b = ctx.builder
    fnty = ir.FunctionType(ir.VoidType(), [PTR, PTR, PTR, I64])
    fn = b.load(cell, typ=fnty.as_pointer())
    srcs = [ctx.ptr(r) for r in i.srcs]
    srcs += [srcs[0]] * (2 - len(srcs))
    b.call(fn, [ctx.ptr(i.dst), *srcs, ctx.int(i.n)])


@register(isa.GetValue)
def _get_value(ctx: LowerCtx, i: isa.GetValue) -> None:  # the int64 tiling word
    ctx.env[i.var] = ctx.builder.load(ctx.ptr(i.src), typ=I64)


@register(isa.AtomicAdd)
def _atomic_add(ctx: LowerCtx, i: isa.AtomicAdd) -> None:
    if i.dst.buf.dtype != "int64":
        raise ValueError(f"{isa.format_instr(i)}: atomic counters are int64")
    old = ctx.builder.atomic_rmw("add", ctx.ptr(i.dst), ctx.int(i.value), "acq_rel")
    ctx.env[i.var] = old


@register(isa.SetFlag)
@register(isa.WaitFlag)
@register(isa.PipeBarrier)
@register(isa.CrossCoreSetFlag)
@register(isa.CrossCoreWaitFlag)
def _flag(ctx: LowerCtx, i) -> None:
    """Host blocks run in program order: flags matter only to interp checks and the cost model."""


# Copies that are not fusible (2-D, converting, stride-0 writes) take the row loop / memcpy path.
LOWER[isa.CopyIn] = _copy_in
LOWER[isa.CopyOut] = _copy_out
