"""Lowerings of the Cube instructions (``isa_cube``) for the LLVM, interpreter and cost tables.

LLVM (fast path): the Cube data path becomes a packed GEMM (see ``gemm``): LoadNz = packing
into an fp32 host panel (F16C widening, strides, prologue), LoadL0 = pointer step, Mmad = the
host target's register-blocked microkernel over the tile, FixPipe = one pass writing the tile
out with relu / cast / epilogue. Host mapping (the program is the device's; only its lowering
is host-shaped): the L0B slice loop and the L0 K-step loop of an L1 panel are each lowered as
one Mmad (`merge_l0b_slices`, `merge_k_steps`), and sizes the program's variable ranges prove
constant reach the GEMM emitters as constants (`var_ranges`).

Host shadow storage: L1/L0A/L0B buffers are declared with the NPU operand dtype (float16 counts
2 bytes for the capacity check) but the host keeps them as float32, so each gets an fp32 alloca
of its element count. An L0A/L0B buffer whose LoadL0 is proven alias-safe (`aliasable_l0`) points
at the L1 panel it was loaded from (runtime pointer state), otherwise LoadL0 copies; a memoised
LoadNz whose source the program never writes redirects its L1 panel to a slot of the host
thread's heap workspace (``gemm.get_thread_workspace``: MiB-sized panels do not belong on an
8 MiB thread stack). A float32 row-major A panel that the Mmad reads whole is not packed at all
(`nd_panels`): the L1 panel is redirected to the operand in GM and the Mmad's microkernels read
its rows in place (the A re-pack once per N panel cost 6-9% of fp32 GEMM time at 1024-4096).
Mmad's micro-tiles never leave the tile (gemm.emit_mmad's tail kernel).
The proofs behind these shortcuts are static walks of the program, in ``cube_proofs``.

Interpreter: exact numpy semantics of the same instructions on the declared buffers (NZ
layouts, float16 buffers round like the NPU's).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir

from lazymath.backend.host import gemm, gemm_bf16, im2col, lower_llvm
from lazymath.backend.host.cube_proofs import (
    aliasable_l0,
    memo_sources_read_only,
    merge_k_steps,
    merge_l0b_slices,
    nd_panels,
    pair_only_panels,
    pair_panels,
    var_ranges,
)
from lazymath.backend.npu import isa
from lazymath.backend.npu import isa_cube as cube
from lazymath.backend.npu.kernel_ir import Expr
from lazymath.graph.ops import COMPARISONS, ELEMENTWISE, LOGICAL, Native

# ============================================================================= LLVM


CUBE_SCOPES = ("L1", "L0A", "L0B", "L0C")  # only Cube instructions touch them: host fp32 shadows


class _CubeState:
    """Per-program host state: fp32 shadows of Cube buffers and pointer redirections."""

    def __init__(self, ctx: lower_llvm.LowerCtx):
        self.ctx = ctx
        self.shadow: dict[str, ir.Value] = {}
        self.redirect: dict[str, tuple[ir.Value, ir.Value]] = {}  # name -> (ptr, at offset)
        self.workspace: dict[str, ir.Value] = {}
        self.alias: dict[str, tuple[ir.Value, ir.Value]] = {}  # L0 name -> (ptr slot, at slot)
        self.alias_ok: frozenset[str] = frozenset()
        self.alias_rows: dict[str, int] = {}  # aliased L0 name -> padded rows of its L1 tile
        self.memo_ok = True
        self.ranges: dict = {}
        self.nd_ok: frozenset[str] = frozenset()  # L1 panels the Mmad may read in place (ND A)
        self.nd: dict[str, tuple[ir.Value, int]] = {}  # L1 name -> (in place? i1, row stride)
        self.nd_slots: dict[str, tuple[ir.Value, int]] = {}  # aliased L0A -> (i1 slot, stride)
        self.pairs: frozenset[str] = frozenset()  # L1 B panels with a bf16 pair twin (pair_panels)
        self.pair_l0b: frozenset[str] = frozenset()  # the L0B buffers that read them
        self.pair_only: frozenset[str] = frozenset()  # pairs read only via the twin
        self.twin: dict[str, tuple[ir.Value, ir.Value]] = {}  # L1 name -> (memo twin, at offset)
        self.twin_slots: dict[str, ir.Value] = {}  # aliased L0B -> slot of its twin pointer

    def entry_alloca(self, n_floats: int, name: str) -> ir.Value:
        b = self.ctx.builder
        if b.block is not self.ctx.entry:  # (a second builder would shift ctx.builder's anchor)
            b = ir.IRBuilder(self.ctx.entry)
            b.position_at_start(self.ctx.entry)
        a = b.alloca(ir.ArrayType(gemm.F32, max(n_floats, 1)), name=name)
        a.type = gemm.PTR
        a.align = 64
        return a

    def memo_base(self, name: str | tuple) -> ir.Value:
        """fp32 memo panel of L1 buffer `name` inside this thread's heap workspace.

        One ``lm_thread_ws`` call at function entry sizes the workspace for every memoised
        LoadNz of the program (each destination buffer gets its own region; ``("pairs", name)``
        is the bfloat16 pair twin of a `pair_panels` buffer's slots)."""
        if not self.workspace:
            offsets: dict = {}
            total = 0
            for instr in self.ctx.program.instructions():
                if isinstance(instr, cube.LoadNz) and instr.memo is not None:
                    if instr.dst.buf.name not in offsets:
                        offsets[instr.dst.buf.name] = total
                        total += -(-instr.memo_slots * instr.memo_slot_elems // 16) * 16
                        if instr.dst.buf.name in self.pairs:  # its twin: i16, half the floats
                            offsets[("pairs", instr.dst.buf.name)] = total
                            total += -(-instr.memo_slots * instr.memo_slot_elems // 32) * 16
            b = self.ctx.builder
            if b.block is not self.ctx.entry:
                b = ir.IRBuilder(self.ctx.entry)
                b.position_at_start(self.ctx.entry)
            ws = b.call(gemm.get_thread_workspace(b.module), [gemm.c64(4 * total)], name="ws")
            for nm, off in offsets.items():
                self.workspace[nm] = gemm.gep(b, ws, off) if off else ws
        return self.workspace[name]

    def base(self, buf: isa.Buffer) -> ir.Value:
        if buf.scope not in CUBE_SCOPES:
            return self.ctx.base[buf.name]
        if buf.name not in self.shadow:
            self.shadow[buf.name] = self.entry_alloca(buf.size, f"{buf.name}.f32")
        return self.shadow[buf.name]

    def nd_shadow(self, i: cube.LoadNz) -> tuple[ir.Value, int]:
        """(fp32 row-major host buffer, row stride in floats) for the widened ND copy of the
        panels LoadNz `i` fills: rows of its longest K range plus gemm.ND_PAD floats (rows not
        4 KiB apart). One per L1 buffer: the Mmad that reads a panel runs before the next
        LoadNz into it (nd_panels)."""
        key = ("nd", i.dst.buf.name)
        if key not in self.shadow:
            _, hi = isa.int_range(i.cols, self.ranges)
            cap = i.dst.buf.size // max(i.dst_rows, 1)  # the L1 buffer bounds any panel
            cols = cap if hi == float("inf") else min(int(hi), cap)
            stride = -(-cols // cube.C0) * cube.C0 + gemm.ND_PAD
            self.shadow[key] = (self.entry_alloca(i.dst_rows * stride, f"{i.dst.buf.name}.nd"),
                                stride)  # fmt: skip
        return self.shadow[key]

    def bf16_scratch(self, which: str) -> ir.Value:
        """i16 scratch for a bfloat16 Mmad's narrowed A or B operand (`gemm_bf16.emit_mmad_bf16`):
        as many elements as the largest Cube buffer or memo slot the operand can come from,
        allocated once per program at function entry."""
        key = ("bf16", which)
        if key not in self.shadow:
            n = max([b.size for b in self.ctx.program.buffers if b.scope in CUBE_SCOPES]
                    + [i.memo_slot_elems for i in self.ctx.program.instructions()
                       if isinstance(i, cube.LoadNz) and i.memo is not None])  # fmt: skip
            self.shadow[key] = self.entry_alloca(-(-n // 2), f"{which}.bf16")
        return self.shadow[key]

    def twin_ptr(self, ref: isa.Ref) -> ir.Value:
        """i16 pointer into the bfloat16 pair twin of the L1 B panel at `ref` (a memo slot's
        twin in the workspace, else an entry alloca): the float32 panel's element offsets."""
        b, off = self.ctx.builder, self.ctx.int(ref.off)
        if ref.buf.name in self.twin:
            p, at = self.twin[ref.buf.name]
            return gemm.gep(b, p, b.sub(off, at), gemm.I16)
        key = ("pairs", ref.buf.name)
        if key not in self.shadow:
            self.shadow[key] = self.entry_alloca(-(-ref.buf.size // 2), f"{ref.buf.name}.pairs")
        return gemm.gep(b, self.shadow[key], off, gemm.I16)

    def entry_slot(self, typ: ir.Type, name: str) -> ir.Value:
        """A stack slot allocated once at function entry (mem2reg turns it into a register)."""
        key = ("slot", name)
        if key not in self.shadow:
            b = ir.IRBuilder(self.ctx.entry)
            b.position_at_start(self.ctx.entry)
            self.shadow[key] = b.alloca(typ, name=name)
        return self.shadow[key]

    def alias_slots(self, name: str) -> tuple[ir.Value, ir.Value]:
        """Stack slots (pointer, dst offset) of the L1 panel an aliased L0 buffer last loaded:
        runtime state, like the L0 buffer's contents (mem2reg turns them into registers)."""
        if name not in self.alias:
            b = self.ctx.builder
            if b.block is not self.ctx.entry:
                b = ir.IRBuilder(self.ctx.entry)
                b.position_at_start(self.ctx.entry)
            self.alias[name] = (b.alloca(gemm.PTR, name=f"{name}.alias"),
                                b.alloca(gemm.I64, name=f"{name}.at"))  # fmt: skip
        return self.alias[name]

    def ptr(self, ref: isa.Ref) -> ir.Value:
        """fp32 host pointer of an on-chip Cube ref (following redirections)."""
        b = self.ctx.builder
        off = self.ctx.int(ref.off)
        if ref.buf.name in self.alias:
            p_slot, at_slot = self.alias[ref.buf.name]
            p = b.load(p_slot, typ=gemm.PTR)
            return gemm.gep(b, p, b.sub(off, b.load(at_slot, typ=gemm.I64)))
        if ref.buf.name in self.redirect:
            p, at = self.redirect[ref.buf.name]
            return gemm.gep(b, p, b.sub(off, at))
        return gemm.gep(b, self.base(ref.buf), off)


def _state(ctx: lower_llvm.LowerCtx) -> _CubeState:
    st = getattr(ctx, "_cube_state", None)
    if st is None:
        st = _CubeState(ctx)
        st.alias_ok = aliasable_l0(ctx.program)
        st.memo_ok = memo_sources_read_only(ctx.program)
        st.ranges = var_ranges(ctx.program)
        st.nd_ok = nd_panels(ctx.program, st.alias_ok) if gemm.ND_A else frozenset()
        if gemm.ND_A and gemm_bf16.bf16_dot_available():  # bfloat16 A read in place (vdpbf16ps)
            st.nd_ok |= nd_panels(ctx.program, st.alias_ok, ("bfloat16",))
        if gemm.ND_PACK:
            narrow = ("float16",) if gemm_bf16.bf16_dot_available() else ("float16", "bfloat16")
            st.nd_ok |= nd_panels(ctx.program, st.alias_ok, narrow)
        if gemm_bf16.bf16_dot_available():
            st.pairs, st.pair_l0b = pair_panels(ctx.program, st.alias_ok, st.nd_ok)
            st.pair_only = pair_only_panels(ctx.program, st.pairs, st.pair_l0b)
        ctx._cube_state = st
    return st


def _val(ctx: lower_llvm.LowerCtx, e: isa.IntExpr) -> gemm.Val:
    """A Python int when `e` takes one value wherever it is evaluated (the program's variable
    ranges, see `var_ranges`), else its LLVM value. Sizes that are static let the host GEMM
    emit only the microkernel widths and packing paths that run: a 2048^3 matmul has full
    256-column panels everywhere, so no edge-column kernels (compile time, IR size)."""
    if isinstance(e, (int, np.integer)):
        return int(e)
    lo, hi = isa.int_range(e, _state(ctx).ranges)
    if lo == hi:
        return int(lo)
    return ctx.int(e)


# ----------------------------------------------------------------------------- scalar expressions
# From the op records (`graph.ops.Op`): ops that are one native instruction per element, and
# the binary composites by their native fallback (a scalar epilogue has no vmath sequence).
_BIN = {k: m.lowering.instr if isinstance(m.lowering, Native) else m.lowering.fallback
        for k, m in ELEMENTWISE.items() if m.arity == 2
        and (isinstance(m.lowering, Native) or getattr(m.lowering, "fallback", None))}  # fmt: skip
_UN = {k: m.lowering.instr for k, m in ELEMENTWISE.items()
       if m.arity == 1 and isinstance(m.lowering, Native)}  # fmt: skip


def _round16(ctx: lower_llvm.LowerCtx, dtype: str, v: ir.Value) -> ir.Value:
    """float16 (bfloat16) values are carried as float32 rounded to half after every op
    (numpy's rule)."""
    if dtype not in ("float16", "bfloat16"):
        return v
    b = ctx.builder
    return lower_llvm.widen(b, dtype, lower_llvm.narrow(b, dtype, v))


def emit_scalar_expr(
    ctx: lower_llvm.LowerCtx, expr: Expr, loads: dict[int, tuple[ir.Value, str]], acc=None
) -> list[ir.Value]:
    """Evaluate an SSA expression on scalar compute-type values (lower_llvm's conventions).

    `loads[i]` = (value, dtype) of input i, `acc` the float32 accumulator value. Returns the
    compute-type value of every op.
    """
    b = ctx.builder
    vals: list[ir.Value] = []
    for op in expr:
        dt = op.dtype
        srcs = [vals[s] for s in op.srcs]
        sdt = [expr[s].dtype for s in op.srcs]
        name = op.op
        if name == "load":
            v, ldt = loads[op.arg]
            v = _convert(ctx, ldt, dt, v) if ldt != dt else v
        elif name == "const":
            v = ctx.const(dt, op.arg)
        elif name == "acc":
            v = _convert(ctx, "float32", dt, acc) if dt != "float32" else acc
        elif name == "cast":
            v = _convert(ctx, sdt[0], dt, srcs[0])
        elif name in _BIN:
            v = lower_llvm.binary_op(ctx, _BIN[name], dt, *srcs)
        elif name in _UN:
            v = lower_llvm.unary_op(ctx, _UN[name], dt, srcs[0])
        elif name in COMPARISONS:
            v = lower_llvm.compare(ctx, name, sdt[0], *srcs)
        elif name == "where":
            c = b.icmp_unsigned("!=", srcs[0], ir.Constant(srcs[0].type, 0))
            v = b.select(c, srcs[1], srcs[2])
        elif name in LOGICAL:
            bits = [b.icmp_unsigned("!=", s, ir.Constant(s.type, 0)) for s in srcs]
            r = (
                (b.and_ if name == "logical_and" else b.or_)(*bits)
                if len(bits) == 2
                else b.not_(bits[0])
            )
            v = b.zext(r, lower_llvm.I8)
        elif name in _SCALAR_NEW:
            v = _scalar_new(ctx, name, dt, sdt, srcs)
        else:
            v = _float_special(ctx, name, dt, srcs[0], op.arg)
        vals.append(_round16(ctx, dt, v))
    return vals


_SCALAR_NEW = frozenset(("isnan", "isinf", "isfinite", "signbit", "square", "copysign", "hypot",
                         "logaddexp", "atan2", *lower_llvm.LIBM_UNARY))  # fmt: skip


def _scalar_new(ctx: lower_llvm.LowerCtx, name: str, dt: str, sdt: list, xs: list) -> ir.Value:
    """Issue 16's elementwise functions on scalar compute-type values (a Cube epilogue)."""
    b = ctx.builder
    x = xs[0]
    k = np.dtype(sdt[0]).kind
    if name in ("isnan", "isinf", "isfinite", "signbit"):
        if k != "f":
            return ir.Constant(lower_llvm.I8, int(name == "isfinite"))
        t = x.type
        if name == "isnan":
            c = b.fcmp_unordered("uno", x, x)
        elif name == "signbit":
            bits = b.bitcast(x, ir.IntType(64 if t == lower_llvm.F64 else 32))
            c = b.icmp_signed("<", bits, ir.Constant(bits.type, 0))
        else:
            a = ctx.call_intrinsic("fabs", t, x)
            inf = ir.Constant(t, float("inf"))
            c = b.fcmp_ordered("==" if name == "isinf" else "<", a, inf)
        return b.zext(c, lower_llvm.I8)
    if name == "square":
        return lower_llvm.binary_op(ctx, "vmul", dt, x, x)
    if name == "copysign":
        return ctx.call_intrinsic("copysign", x.type, x, xs[1])
    return lower_llvm.host_math(ctx, name, x.type, xs)


def _float_special(ctx: lower_llvm.LowerCtx, name: str, dt: str, x: ir.Value, arg) -> ir.Value:
    b = ctx.builder
    t = x.type
    one = ir.Constant(t, 1.0)
    zero = ir.Constant(t, 0.0)
    if name == "sigmoid":
        e = b.call(ctx.native("vexp", "float64" if dt == "float64" else "float32"), [b.fneg(x)])
        return b.fdiv(one, b.fadd(one, e))
    if name in ("sin", "cos", "exp2"):
        return ctx.call_intrinsic(name, t, x)
    if name in ("tan", "tanh"):
        cname = name + ("" if t == lower_llvm.F64 else "f")
        return b.call(ctx.libm(cname, t), [x])
    if name == "leaky_relu":
        return b.select(b.fcmp_ordered(">", x, zero), x, b.fmul(x, ir.Constant(t, float(arg))))
    if name == "sign":
        pos = b.uitofp(b.fcmp_ordered(">", x, zero), t)
        neg = b.uitofp(b.fcmp_ordered("<", x, zero), t)
        return b.select(b.fcmp_unordered("uno", x, x), x, b.fsub(pos, neg))
    raise NotImplementedError(f"matmul prologue/epilogue op {name} on {dt}")


def _convert(ctx: lower_llvm.LowerCtx, src: str, dst: str, v: ir.Value) -> ir.Value:
    """Compute-type value of `src` -> compute-type value of `dst` (float16 and bfloat16 ride
    as float32)."""
    if src == dst:
        return v
    b = ctx.builder
    out = lower_llvm.convert(ctx, src, dst, lower_llvm.narrow(b, src, v), "trunc")
    return lower_llvm.widen(b, dst, out)


def _prologue_fn(ctx: lower_llvm.LowerCtx, expr: Expr | None, src_dtype: str):
    """gemm.emit_pack_nz callback: apply `expr` to float32 values (scalars or vectors, per lane)."""
    if not expr:
        return None
    out_dt = expr[-1].dtype

    def scalar(x: ir.Value) -> ir.Value:
        raw = (x if src_dtype in ("float32", "float16", "bfloat16")
               else _convert(ctx, "float32", src_dtype, x))  # fmt: skip
        v = emit_scalar_expr(ctx, expr, {0: (raw, src_dtype)})[-1]
        return _convert(ctx, out_dt, "float32", v) if out_dt != "float32" else v

    def apply(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
        if not isinstance(x.type, ir.VectorType):
            return scalar(x)
        out = ir.Constant(x.type, ir.Undefined)
        for lane in range(x.type.count):
            idx = ir.Constant(gemm.I32, lane)
            out = b.insert_element(out, scalar(b.extract_element(x, idx)), idx)
        return out

    return apply


# ----------------------------------------------------------------------------- instructions


@lower_llvm.register(cube.LoadNz)
def _load_nz(ctx: lower_llvm.LowerCtx, i: cube.LoadNz) -> None:
    st = _state(ctx)
    b = ctx.builder
    src = ctx.ptr(i.src)
    sr, sc = i.strides
    pro = _prologue_fn(ctx, i.prologue, i.src.buf.dtype)

    def pack(dst: ir.Value) -> None:
        if i.im2col:  # implicit GEMM (conv1d): the windows and zero padding built here
            im2col.emit_pack(b, dst, i.dst_rows, src, i.src.buf.dtype, sr, sc, i.im2col,
                             _val(ctx, i.im2col_k0), _val(ctx, i.im2col_n0), _val(ctx, i.rows),
                             _val(ctx, i.cols), i.row_pad, pro)  # fmt: skip
            return
        gemm.emit_pack_nz(b, dst, i.dst_rows, src, i.src.buf.dtype, 0, sr, sc,
                          _val(ctx, i.rows), _val(ctx, i.cols), i.row_pad, pro)  # fmt: skip

    if i.dst.buf.name in st.nd_ok:  # read in place when whole (see nd_panels), else packed
        rows, cols = _val(ctx, i.rows), _val(ctx, i.cols)
        conds = []
        if isinstance(rows, int):
            static_ok = rows == i.dst_rows
        else:
            static_ok = True
            conds.append(b.icmp_signed("==", rows, gemm.c64(i.dst_rows)))
        if isinstance(cols, int):
            static_ok = static_ok and cols % cube.C0 == 0
        else:
            conds.append(b.icmp_signed("==", b.and_(cols, gemm.c64(cube.C0 - 1)), gemm.c64(0)))
        if static_ok:
            at = ctx.int(i.dst.off)
            whole = True
            ptr, stride = src, sr
            # packed row-major (float16; bfloat16 without vdpbf16ps): see ND_PACK; the dot
            # product microkernels read a bfloat16 A in place (gemm_bf16.emit_mmad_bf16's a_nd)
            in_place = ("float32", "bfloat16") if gemm_bf16.bf16_dot_available() else ("float32",)
            widen = i.src.buf.dtype not in in_place
            if widen:
                ptr, stride = st.nd_shadow(i)
            if conds:  # decided at run time: packed into the L1 shadow when not whole
                whole = conds[0] if len(conds) == 1 else b.and_(conds[0], conds[1])
                shadow = gemm.gep(b, st.base(i.dst.buf), at)
                with b.if_else(whole) as (then, otherwise):
                    with then:
                        if widen:
                            gemm.emit_pack_nd(b, ptr, stride, src, i.src.buf.dtype, sr,
                                              rows, cols)  # fmt: skip
                    with otherwise:
                        pack(shadow)
                ptr = b.select(whole, ptr, shadow)
            elif widen:
                gemm.emit_pack_nd(b, ptr, stride, src, i.src.buf.dtype, sr, rows, cols)
            st.redirect[i.dst.buf.name] = (ptr, at)
            st.nd[i.dst.buf.name] = (whole, stride)
            return
    st.nd.pop(i.dst.buf.name, None)
    twin = i.dst.buf.name in st.pairs

    # the twin packed straight from bfloat16 GM, the float32 panel left unfilled (nothing
    # reads it: pair_only_panels)
    direct = (twin and i.dst.buf.name in st.pair_only and pro is None and not i.im2col
              and i.src.buf.dtype == "bfloat16"
              and gemm_bf16.pack_pairs_direct(sr, sc))  # fmt: skip

    def narrow(dst: ir.Value, panel: ir.Value) -> None:  # the pair twin (pair_panels)
        if direct:
            gemm_bf16.emit_pack_pairs(b, dst, i.dst_rows, src, sr, sc, _val(ctx, i.rows),
                                      _val(ctx, i.cols))  # fmt: skip
            return
        nfc = gemm.ceil_div(b, _val(ctx, i.rows), cube.C0)
        ncb = gemm.ceil_div(b, _val(ctx, i.cols), cube.C0)
        gemm_bf16.emit_narrow_b_pairs(b, dst, panel, i.dst_rows, nfc, ncb)

    if i.memo is None or not st.memo_ok:
        st.redirect.pop(i.dst.buf.name, None)
        st.twin.pop(i.dst.buf.name, None)
        if not direct:
            pack(st.ptr(i.dst))
        if twin:
            narrow(st.twin_ptr(i.dst), st.ptr(i.dst))
        return
    memo = b.mul(ctx.int(i.memo), gemm.c64(i.memo_slot_elems))
    slot = gemm.gep(b, st.memo_base(i.dst.buf.name), memo)
    if twin:
        tslot = gemm.gep(b, st.memo_base(("pairs", i.dst.buf.name)), memo, gemm.I16)
    fill = ctx.int(i.memo_fill)
    with b.if_then(b.icmp_signed("!=", fill, gemm.c64(0))):
        if not direct:
            pack(slot)
        if twin:
            narrow(tslot, slot)
    st.redirect[i.dst.buf.name] = (slot, ctx.int(i.dst.off))
    if twin:
        st.twin[i.dst.buf.name] = (tslot, ctx.int(i.dst.off))


@lower_llvm.register(cube.LoadL0)
def _load_l0(ctx: lower_llvm.LowerCtx, i: cube.LoadL0) -> None:
    st = _state(ctx)
    if i.dst.buf.name in st.alias_ok:  # proven unobservable (see aliasable_l0): pointer step
        st.alias_rows[i.dst.buf.name] = i.src_rows  # the alias keeps L1's row pitch
        p_slot, at_slot = st.alias_slots(i.dst.buf.name)
        ctx.builder.store(st.ptr(i.src), p_slot)
        ctx.builder.store(ctx.int(i.dst.off), at_slot)
        st.nd_slots.pop(i.dst.buf.name, None)
        if i.dst.buf.name in st.pair_l0b:  # its panel's bfloat16 pair twin (pair_panels)
            slot = st.entry_slot(gemm.PTR, f"{i.dst.buf.name}.pairs")
            ctx.builder.store(st.twin_ptr(i.src), slot)
            st.twin_slots[i.dst.buf.name] = slot
        if i.src.buf.name in st.nd:  # the panel may be the operand in place (ND): say which
            whole, stride = st.nd[i.src.buf.name]
            slot = True
            if whole is not True:  # decided per panel at run time
                slot = st.entry_slot(gemm.I1, f"{i.dst.buf.name}.nd")
                ctx.builder.store(whole, slot)
            st.nd_slots[i.dst.buf.name] = (slot, stride)
        return
    # the NPU's copy: fractal column by fractal column (rows x 16 contiguous floats in each)
    b = ctx.builder
    src, dst = st.ptr(i.src), st.ptr(i.dst)
    rows = ctx.int(i.rows)
    nbytes = b.mul(rows, gemm.c64(cube.C0 * 4))
    memcpy = ctx.intrinsic("llvm.memmove.p0.p0.i64", ir.VoidType(),
                           [gemm.PTR, gemm.PTR, gemm.I64, gemm.I1])  # fmt: skip

    def column(c: ir.Value) -> None:
        ps = gemm.gep(b, src, b.mul(c, gemm.c64(i.src_rows * cube.C0)))
        pd = gemm.gep(b, dst, b.mul(c, gemm.c64(i.dst_rows * cube.C0)))
        b.call(memcpy, [pd, ps, nbytes, ir.Constant(gemm.I1, 0)])

    ctx.for_range(0, gemm.ceil_div(b, ctx.int(i.cols), cube.C0), 1, column)


@lower_llvm.register(cube.Mmad)
def _mmad(ctx: lower_llvm.LowerCtx, i: cube.Mmad) -> None:
    st = _state(ctx)
    acc = i.accumulate
    accv = int(acc) if isinstance(acc, (int, np.integer)) else ctx.builder.icmp_signed(
        "!=", ctx.int(acc), gemm.c64(0))  # fmt: skip
    a_rows = st.alias_rows.get(i.a.buf.name, i.a_rows)
    b_rows = st.alias_rows.get(i.b.buf.name, i.b_rows)
    b = ctx.builder

    def mmad(a_nd: int | None = None) -> None:
        if i.in_dtype == "bfloat16" and gemm_bf16.bf16_dot_available():  # vdpbf16ps (NZ B)
            pairs = st.twin_slots.get(i.b.buf.name)  # B narrowed when its panel was filled
            if pairs is None:
                bp, b16 = st.ptr(i.b), st.bf16_scratch("b")
            else:
                at = b.load(st.alias_slots(i.b.buf.name)[1], typ=gemm.I64)
                bp, b16 = gemm.gep(b, b.load(pairs, typ=gemm.PTR), b.sub(ctx.int(i.b.off), at),
                                   gemm.I16), None  # fmt: skip
            gemm_bf16.emit_mmad_bf16(b, st.ptr(i.c), i.c_rows, st.ptr(i.a), a_rows, bp, b_rows,
                                     _val(ctx, i.m), _val(ctx, i.n), _val(ctx, i.k), accv,
                                     st.bf16_scratch("a"), b16, a_nd=a_nd,
                                     b_pairs=pairs is not None)  # fmt: skip
            return
        gemm.emit_mmad(b, st.ptr(i.c), i.c_rows, st.ptr(i.a), a_rows, st.ptr(i.b), b_rows,
                       _val(ctx, i.m), _val(ctx, i.n), _val(ctx, i.k), accv,
                       a_nd=a_nd)  # fmt: skip

    if i.a.buf.name not in st.nd_slots:
        mmad()
        return
    slot, stride = st.nd_slots[i.a.buf.name]  # A in place (ND) or packed: decided per panel
    if slot is True:
        mmad(stride)
        return
    with b.if_else(b.load(slot, typ=gemm.I1)) as (in_place, packed):
        with in_place:
            mmad(stride)
        with packed:
            mmad()


_generic_loop = lower_llvm.LOWER[isa.Loop]


@lower_llvm.register(isa.Loop)
def _loop(ctx: lower_llvm.LowerCtx, i: isa.Loop) -> None:
    merged = None
    if ctx.program.unit in ("cube", "mix"):
        alias_ok = _state(ctx).alias_ok
        merged = merge_k_steps(i, ctx.program, alias_ok) if gemm.K_STEP_MERGE else None
        if merged is None:
            merged = merge_l0b_slices(i, alias_ok)
    if merged is None:
        _generic_loop(ctx, i)
        return
    ctx.lower_body(merged)


@lower_llvm.register(cube.FixPipe)
def _fixpipe(ctx: lower_llvm.LowerCtx, i: cube.FixPipe) -> None:
    st = _state(ctx)
    src = st.ptr(i.src)
    dst = ctx.ptr(i.dst)
    sm, sn = i.strides
    if not i.epilogue:
        gemm.emit_fixpipe(ctx.builder, dst, i.dst.buf.dtype, sm, sn, src, i.src_rows,
                          _val(ctx, i.rows), _val(ctx, i.cols), i.relu)  # fmt: skip
        return
    # extended FixPipe (910B MIX fallback): evaluate the epilogue per element
    b = ctx.builder
    epi = [(ctx.ptr(r), r.buf.dtype, s) for r, s in zip(i.epi_srcs, i.epi_strides)]
    out_dt = i.dst.buf.dtype
    res_dt = i.epilogue[i.result].dtype

    def row(m: ir.Value) -> None:
        def col(n: ir.Value) -> None:
            cb = b.sdiv(n, gemm.c64(cube.C0))
            at = b.add(b.mul(b.add(b.mul(cb, gemm.c64(i.src_rows)), m), gemm.c64(cube.C0)),
                       b.srem(n, gemm.c64(cube.C0)))  # fmt: skip
            acc = b.load(gemm.gep(ctx.builder, src, at), typ=gemm.F32)
            if i.relu:
                acc = gemm.relu_f(b, acc)
            loads = {}
            for k, (p, dt, (esm, esn)) in enumerate(epi):
                idx = b.add(b.mul(m, gemm.c64(esm)), b.mul(n, gemm.c64(esn)))
                loads[k] = (ctx.load(p, dt, idx), dt)
            v = emit_scalar_expr(ctx, i.epilogue, loads, acc)[i.result]
            v = _convert(ctx, res_dt, out_dt, v)
            ctx.store(dst, out_dt, b.add(b.mul(m, gemm.c64(sm)), b.mul(n, gemm.c64(sn))), v)

        ctx.for_range(0, _val(ctx, i.cols), 1, col)

    ctx.for_range(0, _val(ctx, i.rows), 1, row)


# ----------------------------------------------------------------------------- early microkernels


def main_ukernels(program: isa.Program, mmads: list) -> list[str]:
    """The `uklib` symbols of the full-size GEMM microkernels (MR rows, the plan's width, NZ A)
    the lowering of `mmads` under `gemm.UK_LIBRARY` will call, named before it runs (compile
    starts their compiles while the kernel is lowered): every Mmad lowers to loops around one
    (`gemm.emit_mmad`), whose software-prefetch depth depends only on the Mmad's row count
    when that is static (`_val`: the program's variable ranges), else on its L0A row pitch
    (the buffer's, or the L1 panel's when the lowering aliases L0A to it: predicted only when
    both give the same depth, as every tile of 96 rows or more does). Edge-width, tail-row and
    in-place (ND) microkernels are left to the lowering. A wrong guess costs one needless
    library compile, never a result."""
    ranges = var_ranges(program)
    uk = gemm.host_gemm().uk
    out: list[str] = []

    def depth(rows: int) -> int:  # emit_mmad's q
        return min(cube.C0, max(1, -(-cube.C0 // max(-(-rows // gemm.MR), 1))))

    loads = None
    for i in mmads:
        if i.in_dtype == "bfloat16" and gemm_bf16.bf16_dot_available():
            continue  # its dot-product microkernels are defined in the module (emit_mmad_bf16)
        lo, hi = isa.int_range(i.m, ranges)
        if lo == hi:
            qs = {depth(int(lo))}
        else:
            if loads is None:
                loads = [x for x in program.instructions() if isinstance(x, cube.LoadL0)]
            qs = {
                depth(r) for r in {i.a_rows} | {x.src_rows for x in loads if x.dst.buf == i.a.buf}
            }
        if len(qs) != 1:
            continue
        token = gemm.UK_LIBRARY.set(out.append)
        try:
            gemm.get_ukernel(ir.Module(), uk, qs.pop(), uk.nr)
        finally:
            gemm.UK_LIBRARY.reset(token)
    return out


lower_llvm.PREDICT_CALLS[cube.Mmad] = main_ukernels
