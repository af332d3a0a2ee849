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

Interpreter: exact numpy semantics of the same instructions on the declared buffers (NZ
layouts, float16 buffers round like the NPU's).
"""

from __future__ import annotations

import dataclasses

import numpy as np
from llvmlite import ir

from lazymath.backend.host import gemm, gemm_bf16, im2col, lower_llvm
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
        ctx._cube_state = st
    return st


# ----------------------------------------------------------------------------- shortcut proofs
# The host takes two shortcuts over the NPU's copies; each is used only where a static walk of the
# program proves it gives the same values as the copy (otherwise the lowering copies).


def writes_of(instr) -> list[isa.Ref]:
    """Refs an instruction writes: fields named dst* and Mmad's c."""
    out = []
    for k in getattr(instr, "__dataclass_fields__", {}):
        v = getattr(instr, k)
        if isinstance(v, isa.Ref) and (k.startswith("dst") or (k == "c" and isinstance(
                instr, cube.Mmad))):  # fmt: skip
            out.append(v)
    return out


def pair_panels(program: isa.Program, alias_ok, nd_ok) -> tuple[frozenset, frozenset]:
    """(L1 panels, L0B buffers): the L0B buffers read only as the B operand of bfloat16 Mmads,
    each aliased to its L1 panel (`aliasable_l0`) and loaded only from L1 panels that only
    LoadNz writes and are never read in place (`nd_panels`), with those panels. On a vdpbf16ps
    host each such panel gets a bfloat16 pair twin narrowed when LoadNz fills it (a memo slot
    once per work item), and the Mmad reads the twin instead of narrowing B itself
    (`gemm_bf16.emit_mmad_bf16`'s b_pairs): the twin is exactly as fresh as the panel."""
    instrs = list(program.instructions())
    writers: dict[str, set] = {}
    for x in instrs:
        for r in writes_of(x):
            writers.setdefault(r.buf.name, set()).add(type(x))
    l1_ok = {n for n, t in writers.items() if t == {cube.LoadNz}} - set(nd_ok)
    mmads = [x for x in instrs if isinstance(x, cube.Mmad)]
    loads = [x for x in instrs if isinstance(x, cube.LoadL0)]
    l0b = {x.b.buf.name for x in mmads if x.in_dtype == "bfloat16"} & set(alias_ok)
    l0b -= {x.b.buf.name for x in mmads if x.in_dtype != "bfloat16"}
    l0b -= {x.a.buf.name for x in mmads} | {x.c.buf.name for x in mmads}
    l0b -= {x.dst.buf.name for x in loads if x.src.buf.name not in l1_ok}
    l0b -= {n for n, t in writers.items() if t != {cube.LoadL0}}
    return frozenset(x.src.buf.name for x in loads if x.dst.buf.name in l0b), frozenset(l0b)


def _vars_of(e) -> set:
    out, stack = set(), [e]
    while stack:
        x = stack.pop()
        if isinstance(x, isa.Var):
            out.add(x)
        elif isinstance(x, isa.BinInt):
            stack += [x.a, x.b]
    return out


_DIRTY = "dirty"


def aliasable_l0(program: isa.Program) -> frozenset[str]:
    """L0A/L0B buffers whose LoadL0 may be a pointer alias of the L1 panel on the host.

    Copy and alias differ only when the L0 buffer is read after its source region in L1 changed,
    or through an offset other than the one the last LoadL0 wrote. The walk tracks, per L0 buffer,
    the (source buffer, dst offset expression, variables both offsets depend on) of its last
    LoadL0; a write to the source buffer or a new value of one of those variables makes it stale.
    Proven when every read of the buffer finds a fresh alias with the same offset expression, the
    buffer is written only by LoadL0 with matching row counts from L1, and loops are walked twice
    (loop-carried reads see the previous iteration's state). Anything else: copy."""
    l0 = {b.name for b in program.buffers if b.scope in ("L0A", "L0B")}
    bad: set[str] = set()
    shapes: dict[str, set] = {}
    for instr in program.instructions():
        for w in writes_of(instr):
            if w.buf.name in l0 and not (
                isinstance(instr, cube.LoadL0) and instr.src.buf.scope == "L1"
            ):
                bad.add(w.buf.name)
            if isinstance(instr, cube.LoadL0):
                shapes.setdefault(w.buf.name, set()).add((instr.dst_rows, instr.src_rows))
    bad |= {d for d, sh in shapes.items() if len(sh) > 1}  # one L1 row pitch per alias

    def touch_var(state: dict, v) -> None:
        for d, st in state.items():
            if st is not _DIRTY and v in st[2]:
                state[d] = _DIRTY

    def run(body, state: dict) -> None:
        for instr in body:
            if isinstance(instr, isa.Loop):
                entry = dict(state)
                for _ in range(2):
                    touch_var(state, instr.var)
                    run(instr.body, state)
                for d in set(state) | set(entry):  # zero trips: join with the entry state
                    if state.get(d, _DIRTY) != entry.get(d, _DIRTY):
                        state[d] = _DIRTY
                continue
            if isinstance(instr, isa.If):
                entry = dict(state)
                run(instr.body, state)
                for d in set(state) | set(entry):
                    if state.get(d, _DIRTY) != entry.get(d, _DIRTY):
                        state[d] = _DIRTY
                continue
            if isinstance(instr, isa.Let):
                touch_var(state, instr.var)
                continue
            if isinstance(instr, isa.AtomicAdd):
                touch_var(state, instr.var)
            writes = writes_of(instr)
            wnames = {w.buf.name for w in writes}
            for r in isa.refs_of(instr):  # reads first: an instruction reads before it writes
                if r.buf.name in l0 and not isinstance(instr, (cube.Mmad, cube.LoadL0)):
                    bad.add(r.buf.name)  # only Mmad reads an alias (with the L1 row pitch)
                if r.buf.name in l0 and (r not in writes or isinstance(instr, cube.Mmad)):
                    st = state.get(r.buf.name, _DIRTY)
                    if st is _DIRTY or st[1] != r.off:
                        bad.add(r.buf.name)
            for d, st in list(state.items()):
                if st is not _DIRTY and st[0] in wnames:
                    state[d] = _DIRTY
            if isinstance(instr, cube.LoadL0) and instr.dst.buf.name in l0:
                deps = frozenset(_vars_of(instr.dst.off) | _vars_of(instr.src.off))
                state[instr.dst.buf.name] = (instr.src.buf.name, instr.dst.off, deps)

    run(program.body, {})
    return frozenset(l0 - bad)


def memo_sources_read_only(program: isa.Program) -> bool:
    """A memoised LoadNz may skip its repack on the host only if nothing in the program writes
    the GM buffer it reads (the interpreter checks the hint's claim that the source is the same
    panel, see `_i_load_nz`)."""
    written = {w.buf.name for i in program.instructions() for w in writes_of(i)}
    return not any(
        isinstance(i, cube.LoadNz) and i.memo is not None and i.src.buf.name in written
        for i in program.instructions()
    )


def nd_panels(program: isa.Program, alias_ok=None,
              dtypes: tuple[str, ...] = ("float32",)) -> frozenset[str]:  # fmt: skip
    """L1 buffers whose LoadNz the host may skip: the Mmad then reads the operand in place (ND,
    row-major fp32 straight from GM: `gemm.emit_mmad`'s `a_nd`) whenever the panel is whole.

    Proven per buffer: its only writer is one LoadNz of a float32 GM view with unit column
    stride, no prologue, im2col or memo, whose source nothing in the program writes; its only
    readers are the L0A loads of L0 K-step loops that `merge_k_steps` turns into one Mmad, each
    a later sibling of the LoadNz in the same body with no Let in between rebinding a variable
    of the LoadNz, and reading the panel at the LoadNz's own offset with the Mmad's m and k
    equal to the LoadNz's rows and cols. The lowering then checks at run time that the panel is
    whole (rows = its padded row count, cols a multiple of 16: every element a microkernel
    reads exists in GM) and packs it as before otherwise.

    `dtypes`: the GM source dtypes accepted (default float32: read in place). The lowering
    packs a float16 panel proven the same way row-major (`gemm.emit_pack_nd`, see
    gemm.ND_PACK) and the `_nd` microkernels read that copy."""
    written: dict[str, list] = {}
    readers: dict[str, list] = {}
    for instr in program.instructions():
        ws = writes_of(instr)
        for w in ws:
            written.setdefault(w.buf.name, []).append(instr)
        for r in isa.refs_of(instr):
            if r not in ws or isinstance(instr, cube.Mmad):
                readers.setdefault(r.buf.name, []).append(instr)
    ok: set[str] = set()
    merged_reads: dict[int, str] = {}  # id(L0A LoadL0) -> L1 name it was proven for

    def eligible(x) -> bool:
        return (isinstance(x, cube.LoadNz) and x.dst.buf.scope == "L1"
                and x.src.buf.scope == "GM" and x.src.buf.dtype in dtypes
                and x.strides[1] == 1 and x.prologue is None and not x.im2col
                and x.memo is None and x.src.buf.name not in written
                and written.get(x.dst.buf.name) == [x])  # fmt: skip

    def visit(body) -> None:
        for idx, x in enumerate(body):
            if isinstance(x, (isa.Loop, isa.If)):
                visit(x.body)
            if not eligible(x):
                continue
            deps = set()
            for e in (x.rows, x.cols, x.dst.off, x.src.off):
                deps |= _vars_of(e)
            for y in body[idx + 1 :]:
                if isinstance(y, isa.Let) and y.var in deps:
                    break
                if not isinstance(y, isa.Loop):
                    continue
                ld = _nd_read(y, program, alias_ok, x)
                if ld is not None:
                    merged_reads[id(ld)] = x.dst.buf.name

    visit(program.body)
    for name in {n for n in merged_reads.values()}:
        rs = [r for r in readers.get(name, []) if not (isinstance(r, cube.LoadNz)
                                                         and r.dst.buf.name == name)]  # fmt: skip
        if rs and all(merged_reads.get(id(r)) == name for r in rs):
            ok.add(name)
    return frozenset(ok)


def _nd_read(loop: isa.Loop, program: isa.Program, alias_ok, nz: cube.LoadNz):
    """The L0A LoadL0 of `loop` when `merge_k_steps` merges it into one Mmad that reads the
    panel `nz` fills at `nz`'s offset, with m = nz.rows and k = nz.cols; else None."""
    merged = merge_k_steps(loop, program, alias_ok)
    if merged is None:
        return None
    if len(merged) == 1 and isinstance(merged[0], isa.If):
        merged = merged[0].body
    lets: dict = {}
    for x in merged:
        if isinstance(x, isa.Let):
            lets[x.var] = _expand(x.value, lets)
    lds = [x for x in merged if isinstance(x, cube.LoadL0) and x.dst.buf.scope == "L0A"]
    mms = [x for x in merged if isinstance(x, cube.Mmad)]
    if len(lds) != 1 or len(mms) != 1 or lds[0].src.buf != nz.dst.buf:
        return None
    ld, mm = lds[0], mms[0]
    if mm.a.buf != ld.dst.buf or ld.src_rows != nz.dst_rows:
        return None
    if not (_same_values(_expand(ld.src.off, lets), nz.dst.off)
            and _same_values(_expand(mm.m, lets), nz.rows)
            and _same_values(_expand(mm.k, lets), nz.cols)):  # fmt: skip
        return None
    # the original LoadL0 of the loop (the merged one is a copy with the panel's depth)
    return next(x for x in loop.body if isinstance(x, cube.LoadL0) and x.dst.buf == ld.dst.buf)


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


def var_ranges(program: isa.Program) -> dict:
    """Interval of every variable over the whole program (the union over all its bindings;
    loop variables range over [start, stop - 1], BLOCK_IDX/BLOCK_NUM are unbounded)."""
    inf = float("inf")
    ranges: dict = {isa.BLOCK_IDX: (0, inf), isa.BLOCK_NUM: (1, inf)}

    def bind(v, r) -> None:
        old = ranges.get(v)
        ranges[v] = r if old is None else (min(old[0], r[0]), max(old[1], r[1]))

    def visit(body) -> None:
        for i in body:
            if isinstance(i, isa.Loop):
                s, t = isa.int_range(i.start, ranges), isa.int_range(i.stop, ranges)
                bind(i.var, (s[0], max(s[0], t[1] - 1)))
                visit(i.body)
            elif isinstance(i, isa.If):
                visit(i.body)
            elif isinstance(i, isa.Let):
                bind(i.var, isa.int_range(i.value, ranges))
            elif isinstance(i, isa.AtomicAdd):
                bind(i.var, (-inf, inf))

    visit(program.body)
    visit(program.body)  # a variable used before a later binding of it widens on the 2nd pass
    return ranges


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

    def narrow(dst: ir.Value, panel: ir.Value) -> None:  # the pair twin (pair_panels)
        nfc = gemm.ceil_div(b, _val(ctx, i.rows), cube.C0)
        ncb = gemm.ceil_div(b, _val(ctx, i.cols), cube.C0)
        gemm_bf16.emit_narrow_b_pairs(b, dst, panel, i.dst_rows, nfc, ncb)

    if i.memo is None or not st.memo_ok:
        st.redirect.pop(i.dst.buf.name, None)
        st.twin.pop(i.dst.buf.name, None)
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


# ----------------------------------------------------------------------------- host mapping
# The NPU walks an L0C tile in L0B slices of n0 columns (L0B is small: 32 columns of fp32 at
# K = 256 on the 910), one LoadL0 + Mmad per slice. On the host L0B is a pointer into the L1B
# panel and the slices of L0C and L1B are consecutive NZ fractal columns, so the slice loop is
# one Mmad over the whole tile width: the host microkernel then runs its full width (64
# columns on AVX-512) instead of the slice's, and its B micro-panels are the panel's.


def _subst(e: isa.IntExpr, var: isa.Var, value: int) -> isa.IntExpr:
    if isinstance(e, isa.Var):
        return value if e == var else e
    if isinstance(e, isa.BinInt):
        a, b = _subst(e.a, var, value), _subst(e.b, var, value)
        fn = {"+": isa.add, "-": isa.sub, "*": isa.mul, "min": isa.imin, "max": isa.imax,
              "//": isa.floordiv, "%": isa.mod}[e.op]  # fmt: skip
        return fn(a, b)
    return e


def _vars(e: isa.IntExpr, out: set) -> set:
    if isinstance(e, isa.Var):
        out.add(e)
    elif isinstance(e, isa.BinInt):
        _vars(e.a, out)
        _vars(e.b, out)
    return out


def _steps_by(e: isa.IntExpr, var: isa.Var, step: int) -> bool:
    """e(var = j) == e(var = 0) + j * step for every value of the other variables (checked at
    j = 0..3 over a few random assignments: the offsets are affine in the loop variable)."""
    names = sorted(_vars(e, set()) - {var}, key=lambda v: v.name)
    rng = np.random.default_rng(len(names))
    for _ in range(3):
        env = {v: int(x) for v, x in zip(names, rng.integers(0, 1 << 12, len(names)))}
        base = isa.eval_int(e, {**env, var: 0})
        for j in (1, 2, 3):
            if isa.eval_int(e, {**env, var: j}) != base + j * step:
                return False
    return True


_FLAGS = (isa.SetFlag, isa.WaitFlag, isa.PipeBarrier)
_MINUS = "-"  # IntExpr subtraction (isa.BinInt op), not a graph op name


def merge_l0b_slices(loop: isa.Loop, alias_ok=None):
    """(LoadL0, Mmad) for the whole tile width when `loop` is the template's L0B slice loop
    whose L0B load is a host pointer alias (`alias_ok`: see aliasable_l0; None = any), else
    None. Pipe flags in the slice are dropped: the host runs a block in program order, their
    lowering is empty."""
    body = [x for x in loop.body if not isinstance(x, _FLAGS)]
    if len(body) != 2 or loop.start != 0 or loop.step != 1:
        return None
    ld, mm = body
    if not (isinstance(ld, cube.LoadL0) and isinstance(mm, cube.Mmad)):
        return None
    if ld.dst.buf.scope != "L0B" or mm.b.buf != ld.dst.buf or mm.b.off != ld.dst.off:
        return None
    if alias_ok is not None and ld.dst.buf.name not in alias_ok:
        return None  # a real copy into L0B: the full width would not fit its host storage
    j = loop.var
    n = mm.n  # imin(n0, nv - j * n0)
    if not (isinstance(n, isa.BinInt) and n.op == "min" and isinstance(n.a, int)):
        return None
    n0 = n.a
    rest = n.b
    if not (isinstance(rest, isa.BinInt) and rest.op == _MINUS and j not in _vars(rest.a, set())):
        return None
    nv = rest.a
    if _subst(rest.b, j, 1) != n0 or _subst(rest.b, j, 0) != 0:
        return None
    if n0 % cube.C0:
        return None
    if not (_steps_by(mm.c.off, j, n0 * mm.c_rows) and _steps_by(ld.src.off, j, n0 * ld.src_rows)):
        return None
    if any(j in _vars(e, set()) for e in (mm.a.off, mm.m, mm.k, mm.accumulate)):
        return None
    cols = isa.mul(isa.ceildiv(nv, cube.C0), cube.C0)
    dst0 = isa.Ref(ld.dst.buf, _subst(ld.dst.off, j, 0))
    ld0 = dataclasses.replace(
        ld, dst=dst0, src=isa.Ref(ld.src.buf, _subst(ld.src.off, j, 0)), cols=cols
    )
    mm0 = dataclasses.replace(mm, c=isa.Ref(mm.c.buf, _subst(mm.c.off, j, 0)), b=ld0.dst, n=nv)
    return ld0, mm0


# The NPU also splits each L1 panel into L0 K steps (kl0 deep: what double-buffers in L0A, 64
# for fp32 on the 910), one LoadL0A + slice loop + Mmad per step, all accumulating into the same
# L0C tile. On the host both L0 loads are pointer aliases into the L1 panels and consecutive K
# steps are consecutive NZ fractal columns of L1A and consecutive rows of L1B, so the K-step loop
# is one Mmad over the panel's whole depth: the microkernel keeps its accumulators in registers
# across the panel instead of storing and reloading the C tile every kl0, and the host K panel of
# the GEMM plan (L1d-sized) decides the depth of one microkernel pass. Every C element still sees
# the same fused multiply-adds in the same k order: the results are bit-identical.


def _expand(e: isa.IntExpr, lets: dict) -> isa.IntExpr:
    """`e` with the variables bound by `lets` (Var -> IntExpr, already expanded) substituted."""
    if isinstance(e, isa.Var):
        return lets.get(e, e)
    if isinstance(e, isa.BinInt):
        a, b = _expand(e.a, lets), _expand(e.b, lets)
        if a is e.a and b is e.b:
            return e
        return isa.BinInt(e.op, a, b)
    return e


def _same_values(x: isa.IntExpr, y: isa.IntExpr, fixed: dict | None = None) -> bool:
    """x == y for a few random non-negative assignments of their variables (loop indices and
    sizes are non-negative): the template's expressions are checked the way _steps_by does."""
    names = sorted(_vars(x, set()) | _vars(y, set()), key=lambda v: v.name)
    rng = np.random.default_rng(len(names) + 7)
    for _ in range(4):
        env = {v: int(a) for v, a in zip(names, rng.integers(0, 1 << 12, len(names)))}
        env.update(fixed or {})
        if isa.eval_int(x, env) != isa.eval_int(y, env):
            return False
    return True


def merge_k_steps(loop: isa.Loop, program: isa.Program, alias_ok=None):
    """The body to lower instead of `loop` when it is the template's loop over the L0 K steps of
    one L1 panel with aliased L0A/L0B loads (see above), else None.

    Checked on the loop (Lets expanded): start 0, step 1, stop = ceil(total / kl); per step one
    LoadL0 into L0A and one into L0B (directly or as the L0B slice loop, merged first) and one
    Mmad reading exactly those, with k = min(kl, total - ks * kl), the L1A source advancing kl
    fractal-column elements (kl * rows) and the L1B source kl rows (kl * 16) per step, the C tile,
    m and n independent of the step, accumulate != 0 from the second step on, and the two L0
    buffers read nowhere else in the program. The result binds ks = 0 and runs the step's body
    once with k = total (guarded by total's loop having a trip)."""
    if loop.start != 0 or loop.step != 1:
        return None
    ks = loop.var
    lets: dict = {}
    head: list = []
    ld_a = inner = None
    for x in loop.body:
        if isinstance(x, _FLAGS):
            continue
        if isinstance(x, isa.Let):
            if ld_a is not None or x.var in lets:
                return None
            lets[x.var] = _expand(x.value, lets)
            head.append(x)
        elif ld_a is None and isinstance(x, cube.LoadL0):
            ld_a = x
        elif ld_a is not None and inner is None:
            inner = x
        else:
            return None
    if ld_a is None or inner is None or ld_a.dst.buf.scope != "L0A":
        return None
    if isinstance(inner, isa.Loop):
        pair = merge_l0b_slices(inner, alias_ok)
        if pair is None:
            return None
        ld_b, mm = pair
    else:
        return None
    if alias_ok is not None and not {ld_a.dst.buf.name, ld_b.dst.buf.name} <= alias_ok:
        return None
    if mm.a.buf != ld_a.dst.buf or mm.a.off != ld_a.dst.off:
        return None
    if mm.b.buf != ld_b.dst.buf or mm.b.off != ld_b.dst.off:
        return None
    k = _expand(mm.k, lets)  # min(kl, total - ks * kl)
    if not (isinstance(k, isa.BinInt) and k.op == "min" and isinstance(k.a, int) and k.a > 0):
        return None
    kl = k.a
    rest = k.b
    if not (isinstance(rest, isa.BinInt) and rest.op == _MINUS and ks not in _vars(rest.a, set())):
        return None
    total = rest.a
    if _subst(rest.b, ks, 1) != kl or _subst(rest.b, ks, 0) != 0 or kl % cube.C0:
        return None
    if not _same_values(_expand(loop.stop, lets), isa.ceildiv(total, kl)):
        return None
    a_src, b_src = _expand(ld_a.src.off, lets), _expand(ld_b.src.off, lets)
    if not (_steps_by(a_src, ks, kl * ld_a.src_rows) and _steps_by(b_src, ks, kl * cube.C0)):
        return None
    if any(ks in _vars(_expand(e, lets), set()) for e in (mm.c.off, mm.m, mm.n)):
        return None
    acc = _expand(mm.accumulate, lets)  # accumulates from the second step on
    if not all(_same_values(isa.imin(isa.imax(acc, 0), 1), 1, {ks: j}) for j in (1, 2, 3)):
        return None
    # the two L0 buffers are read by this loop's Mmad only
    l0 = {ld_a.dst.buf.name, ld_b.dst.buf.name}
    readers = [i for i in program.instructions() if any(r.buf.name in l0 for r in isa.refs_of(i))]
    if sum(isinstance(i, cube.Mmad) for i in readers) != 1:
        return None
    cols = isa.mul(isa.ceildiv(total, cube.C0), cube.C0)
    ld_a1 = dataclasses.replace(ld_a, cols=cols)
    ld_b1 = dataclasses.replace(ld_b, rows=cols)
    mm1 = dataclasses.replace(mm, k=total)
    body = (isa.Let(ks, 0), *head, ld_a1, ld_b1, mm1)
    stop = loop.stop
    if isinstance(stop, int):
        return body if stop > 0 else ()
    return (isa.If(stop, ">", 0, body),)


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
