"""The lowering context (`LowerCtx`), the lowering tables and the fused elementwise loop.

`lower_llvm.lower_program` lowers an `isa.Program` to an llvmlite ``ir.Module``.

The module holds one function ``void @<name>(i64 block_idx, i64 block_num, ptr args)`` where
``args`` points at one base pointer per GM argument (``kernel_args`` order). On-chip buffers
(UB, L1, L0A/L0B/L0C) become 64-byte aligned allocas in the entry block: on the host the
scopes are just cache-resident scratch arrays, so emulating the NPU and running fast coincide.

Lowering is a table keyed by instruction type; other modules add entries with::

    from lazymath.backend.host import lower_ctx

    @lower_ctx.register(isa_cube.Mmad)
    def _mmad(ctx: lower_ctx.LowerCtx, instr: isa_cube.Mmad) -> None: ...

What a lowering function can use on ``ctx`` (a `LowerCtx`):

- ``ctx.builder`` (``ir.IRBuilder`` positioned where the instruction goes), ``ctx.module``,
  ``ctx.func``, ``ctx.spec`` (DeviceSpec or None), ``ctx.program``.
- ``ctx.int(expr) -> i64 Value`` for any ``IntExpr`` (loop vars, block idx/num, arithmetic with
  Python floor semantics for ``//`` and ``%``).
- ``ctx.ptr(ref) -> ptr`` typed element pointer: getelementptr of the buffer base by
  ``ref.off`` elements (never inttoptr). ``ctx.elem_ptr(ptr, dtype, i)`` indexes further.
- ``ctx.storage_type(dtype)`` / ``ctx.compute_type(dtype)``: float16 is stored as ``half`` and
  computed as ``float``; bfloat16 is stored as ``i16`` bits and computed as ``float`` (integer
  shifts in `backend.host.bfloat16`: no libcall, any target); bool is stored
  and computed as ``i8`` holding 0/1.
- ``ctx.load(ptr, dtype, i)`` / ``ctx.store(ptr, dtype, i, value)``: element access converting
  storage <-> compute type; inside ``ctx.parallel_for`` the access joins the loop's access
  group so the loop vectorizer knows iterations are independent (no runtime alias checks).
- ``ctx.parallel_for(n, body)`` emits ``for i in 0..n`` with ``llvm.loop`` metadata
  (parallel_accesses + vectorize.enable); ``body(i)`` must emit straight-line code.
  ``ctx.for_range(start, stop, step, body)`` is a plain scalar loop (may nest anything).
- ``ctx.map(dst_ref, src_refs, n, fn)`` = parallel_for + loads + ``fn(*values) -> value`` +
  store; the common shape of every elementwise vector instruction.
- ``ctx.intrinsic(name, ret, args)`` declares ``llvm.*`` intrinsics with an explicit signature;
  ``ctx.native(op, dtype)`` returns the scalar function for a native transcendental
  (``vexp``/``vln``) from ``lazymath.backend.npu.vmath`` (falls back to the llvm intrinsic when
  vmath is not importable).
- ``ctx.lower_body(instrs)`` lowers a nested instruction list (what Loop does).

Elementwise instructions (every ``V*`` except the reductions) are registered differently, with
``@lower_ctx.elementwise(InstrType) def fn(ctx, instr) -> Elem`` returning the per-element
computation as data; ``lower_body`` then fuses each run of them over the same ``n`` (and with
consistent offsets, see `_fusible_run`) into ONE vectorized loop whose intermediate values stay
in registers. A 60-instruction vmath composite is then one pass over the tile, not 60.

Missing lowerings raise ``NotImplementedError`` naming the instruction: never a silent
miscompile. Pipe flags (set/wait/barrier) lower to nothing: on the host each block runs its
instructions in program order, which is the strongest ordering the flags could ask for.

This module holds the tables (`LOWER`, `ELEMENTWISE_INSTRS`, `PREDICT_CALLS`), `LowerCtx` and
the fusion of elementwise runs into one loop (`_fusible_run`, `lower_elementwise`): what
``ctx.lower_body`` needs. The instruction lowerings register from `lower_vector` and
`lower_control`, which import this module and not `lower_llvm` (which imports them), so no
lowering module imports back (issue 36).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from llvmlite import ir

from lazymath.backend.host import vmath_native
from lazymath.backend.host.llvm_ops import (
    _NARROW,
    F16,
    F32,
    F64,
    I1,
    I8,
    I32,
    I64,
    PTR,
    _combine,
    _reduce_identity,
    _suffix,
    convert,
    kind,
    narrow,
    widen,
)
from lazymath.backend.npu import isa
from lazymath.backend.npu.cancel import CANCEL_SYMBOL  # the flag tile loops poll (Ctrl-C)

_STORAGE = {
    "float16": F16, "bfloat16": ir.IntType(16), "float32": F32, "float64": F64, "bool": I8,
    "int8": I8, "int16": ir.IntType(16), "int32": I32, "int64": I64,
    "uint8": I8, "uint16": ir.IntType(16), "uint32": I32, "uint64": I64,
}  # fmt: skip

LOWER: dict[type, Callable] = {}
# Library functions a program's lowering will call, named before it runs (`predicted_calls`):
# the Cube lowering registers the GEMM microkernels of its Mmads (lower_cube.main_ukernels)
PREDICT_CALLS: dict[type, Callable] = {}


def predicted_calls(program) -> list[str]:
    """Symbols of library functions the lowering of `program` will call (for instruction types
    that registered a predictor in PREDICT_CALLS; a guess, never needed for correctness)."""
    out: list[str] = []
    for cls, fn in PREDICT_CALLS.items():
        instrs = [i for i in program.instructions() if isinstance(i, cls)]
        if instrs:
            out += fn(program, instrs)
    return list(dict.fromkeys(out))


def register(cls: type) -> Callable:
    """Decorator: `@register(InstrType) def fn(ctx, instr)` adds a lowering to the table."""

    def deco(fn: Callable) -> Callable:
        LOWER[cls] = fn
        return fn

    return deco


class _DistinctMD(ir.values.MDValue):
    """`distinct !{...}` metadata node, needed for self-referential loop ids / access groups."""

    def descr(self, buf) -> None:
        tmp: list = []
        super().descr(tmp)
        buf += ("distinct " + tmp[0], "\n")

    def __hash__(self) -> int:
        return id(self)

    def __eq__(self, other) -> bool:
        return self is other


class LowerCtx:
    """State and helpers for lowering one program (see the module docstring)."""

    def __init__(
        self,
        program: isa.Program,
        spec=None,
        module: ir.Module | None = None,
        symbol: str | None = None,
    ):
        self.program = program
        self.spec = spec
        self.module = module or ir.Module(name=symbol or program.name)
        fnty = ir.FunctionType(ir.VoidType(), [I64, I64, PTR])
        self.func = ir.Function(self.module, fnty, name=symbol or program.name)
        for a, nm in zip(self.func.args, ("block_idx", "block_num", "args")):
            a.name = nm
        self.entry = self.func.append_basic_block("entry")
        self.builder = ir.IRBuilder(self.entry)
        self.env: dict[isa.Var, ir.Value] = {
            isa.BLOCK_IDX: self.func.args[0],
            isa.BLOCK_NUM: self.func.args[1],
        }
        self.base: dict[str, ir.Value] = {}
        self._access_group = None
        self._fns: dict = {}
        self._nblocks = 0
        self.global_refs = _names_in(program.body)
        self._loaded: set | None = None  # see `_loaded_names`

    # --------------------------------------------------------------------- types, values
    def storage_type(self, dtype: str) -> ir.Type:
        try:
            return _STORAGE[dtype]
        except KeyError:
            raise NotImplementedError(f"dtype {dtype} has no LLVM lowering") from None

    def compute_type(self, dtype: str) -> ir.Type:
        return F32 if dtype in _NARROW else self.storage_type(dtype)

    def const(self, dtype: str, value) -> ir.Constant:
        """A constant of `dtype`'s compute type (bool -> i8 0/1, ints wrap like numpy)."""
        t = self.compute_type(dtype)
        k = kind(dtype)
        if k == "f":  # round to the dtype first: a float16 operand holds a float16 scalar
            return ir.Constant(t, float(np.dtype(dtype).type(value)))
        if k == "b":
            return ir.Constant(t, 1 if value else 0)
        bits = t.width
        v = int(value) & ((1 << bits) - 1)
        if k == "i" and v >= 1 << (bits - 1):
            v -= 1 << bits
        return ir.Constant(t, v)

    def int(self, e: isa.IntExpr) -> ir.Value:
        """i64 value of an IntExpr (Python floor semantics for // and %)."""
        b = self.builder
        if isinstance(e, (int, np.integer)):
            return ir.Constant(I64, int(e))
        if isinstance(e, isa.Var):
            try:
                return self.env[e]
            except KeyError:
                raise ValueError(f"kernel {self.program.name}: unbound variable {e}") from None
        stack, out = [(e, False)], []
        while stack:
            node, done = stack.pop()
            if not isinstance(node, isa.BinInt):
                out.append(self.int(node))
                continue
            if not done:
                stack += [(node, True), (node.b, False), (node.a, False)]
                continue
            y, x = out.pop(), out.pop()
            op = node.op
            if op == "+":
                r = b.add(x, y)
            elif op == "-":
                r = b.sub(x, y)
            elif op == "*":
                r = b.mul(x, y)
            elif op == "min":
                r = b.select(b.icmp_signed("<", x, y), x, y)
            elif op == "max":
                r = b.select(b.icmp_signed(">", x, y), x, y)
            elif op in ("//", "%"):
                r = self._floor_divmod(x, y, op)
            else:
                raise NotImplementedError(f"integer op {op!r}")
            out.append(r)
        return out[0]

    def _floor_divmod(self, x: ir.Value, y: ir.Value, op: str) -> ir.Value:
        b = self.builder
        if isinstance(y, ir.Constant) and int(y.constant) > 0:
            q, r = b.sdiv(x, y), b.srem(x, y)
            neg = b.icmp_signed("<", r, ir.Constant(x.type, 0))
        else:
            q, r = b.sdiv(x, y), b.srem(x, y)
            zero = ir.Constant(x.type, 0)
            neg = b.and_(b.icmp_signed("!=", r, zero),
                         b.icmp_signed("!=", b.icmp_signed("<", r, zero),
                                       b.icmp_signed("<", y, zero)))  # fmt: skip
        if op == "//":
            return b.select(neg, b.sub(q, ir.Constant(x.type, 1)), q)
        return b.select(neg, b.add(r, y), r)

    # --------------------------------------------------------------------- memory
    def ptr(self, ref: isa.Ref) -> ir.Value:
        """Typed element pointer to `ref` (gep from the buffer base by ref.off elements)."""
        try:
            base = self.base[ref.buf.name]
        except KeyError:
            raise ValueError(
                f"kernel {self.program.name}: buffer {ref.buf.name} is not declared"
            ) from None
        if isinstance(ref.off, int) and ref.off == 0:
            return base
        return self.elem_ptr(base, ref.buf.dtype, self.int(ref.off))

    def elem_ptr(self, p: ir.Value, dtype: str, i: ir.Value) -> ir.Value:
        return self.builder.gep(p, [i], source_etype=self.storage_type(dtype))

    def _tag(self, instr) -> None:
        if self._access_group is not None:
            instr.set_metadata("llvm.access.group", self._access_group)

    def load_raw(self, p: ir.Value, dtype: str, i: ir.Value) -> ir.Value:
        t = self.storage_type(dtype)
        v = self.builder.load(self.elem_ptr(p, dtype, i), typ=t)
        self._tag(v)
        return v

    def store_raw(self, p: ir.Value, dtype: str, i: ir.Value, v: ir.Value) -> None:
        s = self.builder.store(v, self.elem_ptr(p, dtype, i))
        self._tag(s)

    def load(self, p: ir.Value, dtype: str, i: ir.Value) -> ir.Value:
        return widen(self.builder, dtype, self.load_raw(p, dtype, i))

    def store(self, p: ir.Value, dtype: str, i: ir.Value, v: ir.Value) -> None:
        self.store_raw(p, dtype, i, narrow(self.builder, dtype, v))

    # --------------------------------------------------------------------- control flow
    def _distinct(self, ops_fn) -> _DistinctMD:
        md = _DistinctMD(self.module, [], name=str(len(self.module.metadata)))
        md.operands = tuple(ops_fn(md))
        return md

    def _loop(self, start, stop, step, body, parallel: bool, carry=(), no_unroll=False,
              width: int | None = None, no_vectorize: bool = False,
              exit_if=None):  # fmt: skip
        """Counted loop; `body(i)` emits into the loop body. step must be > 0 (or static).

        With `carry` (initial values), `body(i, *values)` returns the next values (loop-carried
        phis, e.g. reduction accumulators) and the values after the loop are returned.
        `width` (parallel loops) fixes the vectorization factor (llvm.loop.vectorize.width)."""
        b = self.builder
        start = start if isinstance(start, ir.Value) else self.int(start)
        stop = stop if isinstance(stop, ir.Value) else self.int(stop)
        step_v = step if isinstance(step, ir.Value) else self.int(step)
        down = isinstance(step, int) and step < 0
        self._nblocks += 1
        k = self._nblocks
        pre = b.block
        head = self.func.append_basic_block(f"loop{k}")
        bodyb = self.func.append_basic_block(f"body{k}")
        done = self.func.append_basic_block(f"done{k}")
        b.branch(head)
        b.position_at_end(head)
        i = b.phi(I64, name=f"i{k}")
        i.add_incoming(start, pre)
        phis = []
        for v in carry:
            ph = b.phi(v.type)
            ph.add_incoming(v, pre)
            phis.append(ph)
        b.cbranch(b.icmp_signed(">" if down else "<", i, stop), bodyb, done)
        b.position_at_end(bodyb)
        if exit_if is not None:  # leave the loop early when exit_if() (an i1) is true
            cont = self.func.append_basic_block(f"cont{k}")
            b.cbranch(exit_if(), done, cont)
            b.position_at_end(cont)
        saved = self._access_group
        if parallel:
            self._access_group = self._distinct(lambda md: [])
        nxt_vals = body(i, *phis) if carry else body(i)
        nxt = b.add(i, step_v, name=f"i{k}.next")
        i.add_incoming(nxt, b.block)
        for ph, v in zip(phis, nxt_vals or ()):
            ph.add_incoming(v, b.block)
        br = b.branch(head)
        if (no_unroll or no_vectorize) and not parallel:
            mod = self.module
            hints = []
            if no_unroll:
                hints.append(mod.add_metadata([ir.MetaDataString(mod, "llvm.loop.unroll.disable")]))
            if no_vectorize:
                off = ir.MetaDataString(mod, "llvm.loop.vectorize.enable")
                hints.append(mod.add_metadata([off, ir.Constant(I1, 0)]))
            br.set_metadata("llvm.loop", self._distinct(lambda md: [md, *hints]))
        if parallel:
            ag = self._access_group
            mod = self.module

            def ops(md):
                # parallel_accesses (not vectorize.enable): legal without alias checks, and the
                # vectorizer still decides profitability (no warnings for libm-call loops)
                par = ir.MetaDataString(mod, "llvm.loop.parallel_accesses")
                extra = []
                if no_unroll:
                    extra.append(
                        mod.add_metadata([ir.MetaDataString(mod, "llvm.loop.unroll.disable")])
                    )
                if width:
                    vw = ir.MetaDataString(mod, "llvm.loop.vectorize.width")
                    extra.append(mod.add_metadata([vw, ir.Constant(I32, width)]))
                return [md, mod.add_metadata([par, ag]), *extra]

            br.set_metadata("llvm.loop", self._distinct(ops))
        self._access_group = saved
        b.position_at_end(done)
        return phis

    def parallel_for(self, n, body: Callable[[ir.Value], None], start=0, width=None) -> None:
        """for i in start..n with independent iterations: vectorizable, no alias checks."""
        self._loop(start, n, 1, body, parallel=True, width=width)

    def for_range(self, start, stop, step, body: Callable[[ir.Value], None], no_unroll=False,
                  no_vectorize=False, exit_if=None):  # fmt: skip
        self._loop(start, stop, step, body, parallel=False, no_unroll=no_unroll,
                   no_vectorize=no_vectorize, exit_if=exit_if)  # fmt: skip

    def cancelled(self) -> ir.Value:
        """i1: the process asked running kernels to stop (the runtime symbol CANCEL_SYMBOL,
        set by the engine when Ctrl-C interrupts a long realize).

        A monotonic atomic load, a plain ``mov`` on x86: a plain load of a global no store in
        the loop writes is loop-invariant, and LICM hoisted it out of the tile loop, so a flag
        set while a kernel ran was never seen (a 2**44-element broadcast sum ran for hours).
        llvmlite has no volatile loads (a ``volatile`` attribute on its LoadInstr is silently
        dropped from the IR text); LLVM never hoists or merges an atomic load above
        unordered."""
        mod = self.module
        flag = mod.globals.get(CANCEL_SYMBOL)
        if flag is None:
            flag = ir.GlobalVariable(mod, I32, name=CANCEL_SYMBOL)
        v = self.builder.load_atomic(flag, "monotonic", 4, name="cancel")
        return self.builder.icmp_unsigned("!=", v, ir.Constant(I32, 0))

    def map(self, dst: isa.Ref, srcs: tuple, n, fn: Callable, dtypes=None) -> None:
        """dst[i] = fn(*[src[i] for src in srcs]) for i < n, values in compute types."""
        dp = self.ptr(dst)
        # identical refs share one SSA pointer, so an in-place op (dst is src) stays provably
        # elementwise for the vectorizer
        seen: dict = {(dst.buf.name, dst.off): dp}
        sps = []
        for r in srcs:
            key = (r.buf.name, r.off)
            if key not in seen:
                seen[key] = self.ptr(r)
            sps.append(seen[key])
        dts = dtypes or [r.buf.dtype for r in srcs]

        def body(i):
            vals = [self.load(p, dt, i) for p, dt in zip(sps, dts)]
            self.store(dp, dst.buf.dtype, i, fn(*vals))

        self.parallel_for(self.int(n), body)

    # --------------------------------------------------------------------- functions
    def intrinsic(self, name: str, ret: ir.Type, args: list) -> ir.Function:
        key = ("intr", name)
        if key not in self._fns:
            try:
                self._fns[key] = self.module.get_global(name)
            except KeyError:
                self._fns[key] = ir.Function(self.module, ir.FunctionType(ret, args), name=name)
        return self._fns[key]

    def call_intrinsic(self, base: str, t: ir.Type, *vals, nargs=None) -> ir.Value:
        """call llvm.<base>.<type suffix>(vals) with every operand and result of type t."""
        suffix = _suffix(t)
        fn = self.intrinsic(f"llvm.{base}.{suffix}", t, [t] * len(vals))
        return self.builder.call(fn, list(vals))

    def libm(self, name: str, t: ir.Type, nargs: int = 1) -> ir.Function:
        """Declare a C math function (resolved from the process by MCJIT)."""
        return self.intrinsic(name, t, [t] * nargs)

    def native(self, op: str, dtype: str) -> ir.Function:
        """Scalar function for a native transcendental (vexp / vln) in `dtype` (f32/f64)."""
        key = ("native", op, dtype)
        if key not in self._fns:
            self._fns[key] = vmath_native.define_native(self.module, op, dtype)
        return self._fns[key]

    # --------------------------------------------------------------------- bodies
    def lower_body(self, body) -> None:
        body = list(body)
        body_refs = None
        k = 0
        while k < len(body):
            instr = body[k]
            if type(instr) in ELEMENTWISE_INSTRS:
                run, end = _fusible_run(self, body, k)
                if run:
                    if body_refs is None:
                        body_refs = _names_in(body)
                    lower_elementwise(self, run, self._dead_after(body_refs, body[k:end], run))
                    k = end
                    continue
            k += 1
            fn = LOWER.get(type(instr))
            if fn is None:
                raise NotImplementedError(
                    f"no LLVM lowering for instruction {type(instr).__name__} "
                    f"({isa.format_instr(instr)}) in kernel {self.program.name}"
                )
            fn(self, instr)

    def _dead_after(self, body_refs: Counter, run_instrs: list, elems: list) -> frozenset:
        """On-chip buffers written by the run that nothing outside the run ever references:
        not elsewhere in this body (later, or earlier = the next loop iteration) and not
        outside this body. Their stores can be dropped."""
        if self._loaded is None:
            self._loaded = _loaded_names(self, self.program.body)
        declared = {b.name for b in self.program.buffers}
        run_refs = _names_in(run_instrs)
        # a buffer the run reads from memory (a window not written earlier in the run) holds
        # values stored before: by an earlier iteration of the enclosing loop, when the run
        # itself writes it (a ring of slots): its stores are live
        loaded = _run_loads(elems)
        out = set()
        for e in elems:
            if isinstance(e, _ReduceMark):
                continue
            name = e.dst.buf.name
            if e.dst.buf.scope == "GM" or name in loaded:
                continue
            in_body_elsewhere = body_refs[name] - run_refs[name]
            outside = self.global_refs[name] - body_refs[name]
            if in_body_elsewhere == 0 and outside == 0:
                out.add(name)
            elif name in declared and name not in self._loaded:
                out.add(name)  # every read of it anywhere is a register of its own run
        return frozenset(out)


def _run_loads(elems: list) -> set[str]:
    """Buffers a fused run reads from memory: a read of a window the run wrote earlier is the
    register holding that value, not a load."""
    loaded, seen = set(), set()
    for e in elems:
        if isinstance(e, _ReduceMark):
            srcs = [(e.reduce.src, 1)]
        else:
            srcs = list(zip(e.srcs, e.src_strides or (1,) * len(e.srcs)))
            if e.table is not None:
                loaded.add(e.table.buf.name)
        for r, st in srcs:
            if _key(r, st) not in seen:
                loaded.add(r.buf.name)
        if not isinstance(e, _ReduceMark):
            seen.add(_key(e.dst, e.dst_stride))
    return loaded


def _loaded_names(ctx: LowerCtx, body) -> set[str]:
    """Buffers some instruction of the program reads from memory, with the partition into
    fused runs that `lower_body` makes (same function, same order). A declared buffer outside
    this set is only ever read as a register inside the run that wrote it: its stores are dead
    everywhere (the broadcast and output tiles of a pipelined row kernel, which its guarded
    head/tail loops also name)."""
    out: set[str] = set()
    stack = [list(body)]
    while stack:
        instrs = stack.pop()
        k = 0
        while k < len(instrs):
            instr = instrs[k]
            if type(instr) in ELEMENTWISE_INSTRS:
                run, end = _fusible_run(ctx, instrs, k)
                if run:
                    out |= _run_loads(run)
                    k = end
                    continue
            inner = getattr(instr, "body", None)
            if isinstance(inner, tuple):
                stack.append(list(inner))
            out.update(r.buf.name for r in isa.refs_of(instr))
            k += 1
    return out


def _names_in(instrs) -> Counter:
    """How often each buffer name is referenced in `instrs` (nested bodies included)."""
    c: Counter = Counter()
    for instr, _ in isa.walk(instrs):
        for r in isa.refs_of(instr):
            c[r.buf.name] += 1
    return c


@dataclass
class Elem:
    """One elementwise vector instruction as data: dst[k] = fn(*[src[k] for src in srcs]).

    `fn` maps compute-type values (float16 widened to float) to a compute-type value, or
    storage-type values to a storage-type value when `raw` (conversions need the exact source
    bits and round once into the destination).
    """

    dst: isa.Ref
    srcs: tuple
    n: object
    fn: Callable
    raw: bool = False
    table: isa.Ref | None = None  # read at arbitrary indices by `fn` (gather)
    src_strides: tuple = ()  # element strides of the sources (default 1; GM copies)
    dst_stride: object = 1


# Elementwise *instruction types* (isa.VBinary, VUnary, ...; not graph ops, whose table is
# `graph.ops.ELEMENTWISE`) -> Elem builder. Consecutive instructions of these types over the
# same n are lowered as ONE vectorized loop (see `lower_elementwise`).
ELEMENTWISE_INSTRS: dict[type, Callable] = {}


def elementwise(cls):
    """Register an elementwise instruction: `fn(ctx, instr) -> Elem` (fusible with others)."""

    def deco(fn):
        ELEMENTWISE_INSTRS[cls] = fn
        LOWER[cls] = lambda ctx, i: lower_elementwise(ctx, [fn(ctx, i)])
        return fn

    return deco


def _same_n(a, b) -> bool:
    return a == b


def _fusible_run(ctx: LowerCtx, body, start: int) -> tuple[list, int]:
    """The longest run of elementwise instructions from body[start] that may share one loop.

    Rule: equal `n`; a buffer written in the run is accessed at one window only, or at windows
    that provably never share an element (`_disjoint`: constant offsets far enough apart, or
    the slots of a ring, base + S * ((v + c) % Q) with different c); a gather's table is not
    written in the run. Then element k of every instruction only meets element k of the
    others, so interleaving them per element equals running them one after another. Read-only
    buffers may be read at several offsets (coefficient tables). Flags in between are no-ops
    on the host. Single-row reductions over the same n join the run (`_ReduceMark`: folded
    into an accumulator phi, stored after the loop) when their destination is disjoint from
    every other access of the run: a software-pipelined row kernel closes several rows'
    reductions in one loop.
    """
    elems: list = []
    acc: dict[str, list] = {}  # buffer name -> [(off, stride, span, kind)], kind r / w / red
    tables: set[str] = set()

    def ok(r: isa.Ref, st, span, kind: str) -> bool:
        for off, st2, span2, kind2 in acc.get(r.buf.name, ()):
            same = (off, st2, span2) == (r.off, st, span)
            if same and "red" not in (kind, kind2):
                continue
            if kind != "r" or kind2 != "r":
                if not _disjoint(r.off, st, span, off, st2, span2):
                    return False
        return True

    def note(r: isa.Ref, st, span, kind: str) -> None:
        acc.setdefault(r.buf.name, []).append((r.off, st, span, kind))

    k = start
    while k < len(body):
        instr = body[k]
        t = type(instr)
        if t in (isa.SetFlag, isa.WaitFlag) and elems:
            k += 1
            continue
        if t is isa.VReduce and elems:
            if not (instr.rows == 1 and _same_n(instr.n, elems[0].n)):
                break
            src_span = _span(instr.n, 1)
            if instr.dst.buf.name in tables or instr.src.buf.name in tables:
                break
            if not (ok(instr.src, 1, src_span, "r") and ok(instr.dst, 0, 1, "red")):
                break
            note(instr.src, 1, src_span, "r")
            note(instr.dst, 0, 1, "red")
            elems.append(_ReduceMark(instr))
            k += 1
            continue
        if t not in ELEMENTWISE_INSTRS:
            break
        e = ELEMENTWISE_INSTRS[t](ctx, instr)
        if e is None or (elems and not _same_n(e.n, elems[0].n)):
            break
        strides = e.src_strides or (1,) * len(e.srcs)
        srcs = [(r, st, _span(e.n, st)) for r, st in zip(e.srcs, strides)]
        wspan = _span(e.n, e.dst_stride)
        if e.dst.buf.name in tables:
            break
        if not all(ok(r, st, sp, "r") for r, st, sp in srcs):
            break
        if not ok(e.dst, e.dst_stride, wspan, "w"):
            break
        if e.table is not None:
            tb = e.table.buf.name
            if tb == e.dst.buf.name or any(kd != "r" for *_, kd in acc.get(tb, ())):
                break
        for r, st, sp in srcs:
            note(r, st, sp, "r")
        note(e.dst, e.dst_stride, wspan, "w")
        if e.table is not None:
            tables.add(e.table.buf.name)
        elems.append(e)
        k += 1
    return elems, k


def _span(n, stride) -> int | None:
    """Elements from the first touched to the last one (+1); None when not static."""
    if not isinstance(stride, int):
        return None
    if stride == 0:
        return 1
    if not isinstance(n, int):
        return None
    return (n - 1) * abs(stride) + 1 if n > 0 else 0


def _ring(off: isa.IntExpr):
    """off = base + S * ((v + c) % Q) as (v, c mod Q, Q, S, base), else None."""
    lin = isa.linear(off)
    if lin is None:
        return None
    terms = [(t, c) for t, c in lin.items() if t != 1]
    if len(terms) != 1:
        return None
    t, S = terms[0]
    if not (isinstance(t, isa.BinInt) and t.op == "%" and isinstance(t.b, int) and t.b > 0):
        return None
    inner = isa.linear(t.a)
    if inner is None:
        return None
    vs = [(u, c) for u, c in inner.items() if u != 1]
    if len(vs) != 1 or vs[0][1] != 1:
        return None
    return vs[0][0], inner.get(1, 0) % t.b, t.b, S, lin.get(1, 0)


def _disjoint(o1, s1, w1, o2, s2, w2) -> bool:
    """Do windows (offset, stride, span) never share an element, whatever the variables?"""
    if w1 is None or w2 is None or s1 < 0 or s2 < 0:
        return False
    if w1 == 0 or w2 == 0:
        return True
    d = isa.const_difference(o1, o2)
    if d is not None and s1 == s2 and s1 > 1 and d % s1:  # interleaved: (re, im) pairs
        return True
    if d is not None:
        return d >= w2 or -d >= w1
    r1, r2 = _ring(o1), _ring(o2)
    if r1 is None or r2 is None:
        return False
    (v1, c1, q1, S1, b1), (v2, c2, q2, S2, b2) = r1, r2
    if (v1, q1, S1, b1) != (v2, q2, S2, b2) or c1 == c2:
        return False
    return abs(S1) >= max(w1, w2)


@dataclass
class _ReduceMark:
    """Closes a fused run with a VReduce (see lower_elementwise)."""

    reduce: isa.VReduce


def _key(r: isa.Ref, stride=1) -> tuple:
    return (r.buf.name, r.off, stride)


def lower_elementwise(ctx: LowerCtx, elems: list, dead: frozenset = frozenset()) -> None:
    """One vectorized loop for a run of elementwise instructions.

    Values stay in registers: a later read of a ref written earlier in the run reuses the
    value (rounded to the ref's dtype, exactly what a store + load would give), and each
    written ref is stored once, after its last write -- unless its buffer is in `dead` (on-chip
    buffers nothing reads after this run), in which case the store is dropped. A fused
    copy_gm_to_ub -> compute -> copy_ub_to_gm therefore touches GM once per element and UB not
    at all.
    """
    b = ctx.builder
    reds = [e.reduce for e in elems if isinstance(e, _ReduceMark)]
    ptrs: dict = {}
    for e in elems:
        if isinstance(e, _ReduceMark):
            e = Elem(e.reduce.src, (e.reduce.src,), e.reduce.n, None)
        strides = e.src_strides or (1,) * len(e.srcs)
        for r, st in ((e.dst, e.dst_stride), *zip(e.srcs, strides)):
            key = _key(r, st)
            if key not in ptrs:
                ptrs[key] = (ctx.ptr(r), st)

    def index(k, st):
        if isinstance(st, int) and st == 1:
            return k
        return b.mul(k, ctx.int(st))

    def body(k, accs=()):
        vals: dict = {}  # key -> storage-type value currently held by that ref
        order: list = []

        def read(r: isa.Ref, st, raw: bool):
            key = _key(r, st)
            dt = r.buf.dtype
            v = vals.get(key)
            if v is None:
                p, _ = ptrs[key]
                v = ctx.load_raw(p, dt, index(k, st))
                vals[key] = v
            return v if raw else widen(b, dt, v)

        dts = {}
        out = []
        for e in elems:
            if isinstance(e, _ReduceMark):  # fold the source's current value (raw bits)
                i = e.reduce
                sd, dd = i.src.buf.dtype, i.dst.buf.dtype
                x = read(i.src, 1, True)
                x = convert(ctx, sd, dd, x, "trunc") if sd != dd else x
                x = widen(b, dd, x)
                a = accs[len(out)]
                if _nan_tracked(i):  # maxnum (one vmaxps) + a sticky "saw a NaN" flag
                    nm = "maxnum" if i.op == "vcmax" else "minnum"
                    fn = ctx.intrinsic(f"llvm.{nm}.{_suffix(a.type)}", a.type, [a.type, a.type])
                    out.append(b.call(fn, [a, x], fastmath=("nnan", "nsz")))
                    out.append(b.or_(accs[len(out)], b.fcmp_unordered("uno", x, x)))
                    continue
                out.append(_combine(ctx, i.op, dd, a, x))
                continue
            strides = e.src_strides or (1,) * len(e.srcs)
            args = [read(r, st, e.raw) for r, st in zip(e.srcs, strides)]
            v = e.fn(*args)
            dt = e.dst.buf.dtype
            if not e.raw:
                v = narrow(b, dt, v)
            key = _key(e.dst, e.dst_stride)
            if key not in order:
                order.append(key)
            vals[key] = v
            dts[key] = dt
        for key in order:
            p, st = ptrs[key]
            if key[0] in dead:
                continue
            ctx.store_raw(p, dts[key], index(k, st), vals[key])
        return out

    plain = [e for e in elems if not isinstance(e, _ReduceMark)]
    if not reds:
        ctx.parallel_for(ctx.int(elems[0].n), body, width=_mixed_width(plain))
        return
    # vcadd/vcmax/... in the run: each folds its source's value into an accumulator phi, so a
    # copy -> prologue -> reduce step reads GM once and never writes UB
    inits = []
    for i in reds:
        inits.append(_reduce_identity(ctx, i.op, i.dst.buf.dtype))
        if _nan_tracked(i):
            inits.append(ir.Constant(I1, 0))
    accs = list(ctx._loop(0, ctx.int(elems[0].n), 1, lambda k, *a: body(k, a), parallel=True,
                          carry=inits))  # fmt: skip
    for i in reds:
        dd = i.dst.buf.dtype
        a = accs.pop(0)
        if _nan_tracked(i):  # the loop's maxnum is poison after a NaN: the flag selects NaN
            a = b.select(accs.pop(0), ir.Constant(a.type, float("nan")), a)
        dp = ctx.ptr(i.dst)
        zero = ir.Constant(I64, 0)
        ctx.store(dp, dd, zero, _combine(ctx, i.op, dd, ctx.load(dp, dd, zero), a))


def _nan_tracked(i: isa.VReduce) -> bool:
    """A fused float max/min reduction folds with maxnum/minnum under nnan (one vmaxps; LLVM's
    NaN-propagating maximum costs six instructions per vector) beside an or-reduction of
    isnan(x); after the loop a seen NaN gives NaN, numpy's max/min semantics."""
    return i.op in ("vcmax", "vcmin") and kind(i.dst.buf.dtype) == "f"


MIXED_WIDTH = 8  # float32 lanes of one AVX2 register


def _mixed_width(elems: list) -> int | None:
    """Vectorization factor for a run mixing float32/float16 and float64 values (vmath's
    float32 functions computed in float64): LLVM sizes such a loop by its float64 values
    (4 lanes), which leaves half of every float32 register idle and gives the out-of-order
    core half the independent work per iteration; 8 lanes ran sin ~12% faster (1.19 vs 1.34
    ns/element). Loops without float64 keep LLVM's choice."""
    dts = set()
    for e in elems:
        dts.update(r.buf.dtype for r in (e.dst, *e.srcs))
    if "float64" in dts and dts & {"float32", "float16"}:
        return MIXED_WIDTH
    return None
