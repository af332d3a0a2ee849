"""Lower an `isa.Program` to an llvmlite ``ir.Module`` (the fast consumer of the ISA).

The module holds one function ``void @<name>(i64 block_idx, i64 block_num, ptr args)`` where
``args`` points at one base pointer per GM argument (``kernel_args`` order). On-chip buffers
(UB, L1, L0A/L0B/L0C) become 64-byte aligned allocas in the entry block: on the host the
scopes are just cache-resident scratch arrays, so emulating the NPU and running fast coincide.

Lowering is a table keyed by instruction type; other modules add entries with::

    from lazymath.backend.host import lower_llvm

    @lower_llvm.register(isa_cube.Mmad)
    def _mmad(ctx: lower_llvm.LowerCtx, instr: isa_cube.Mmad) -> None: ...

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
``@lower_llvm.elementwise(InstrType) def fn(ctx, instr) -> Elem`` returning the per-element
computation as data; ``lower_body`` then fuses each run of them over the same ``n`` (and with
consistent offsets, see `_fusible_run`) into ONE vectorized loop whose intermediate values stay
in registers. A 60-instruction vmath composite is then one pass over the tile, not 60.

Missing lowerings raise ``NotImplementedError`` naming the instruction: never a silent
miscompile. Pipe flags (set/wait/barrier) lower to nothing: on the host each block runs its
instructions in program order, which is the strongest ordering the flags could ask for.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from llvmlite import ir

from lazymath.backend.host import vmath_native
from lazymath.backend.host.bfloat16 import bf16_to_f32, f32_to_bf16
from lazymath.backend.npu import isa, vmath
from lazymath.backend.npu.cancel import CANCEL_SYMBOL  # the flag tile loops poll (Ctrl-C)

I1 = ir.IntType(1)
I8 = ir.IntType(8)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
F16 = ir.HalfType()
F32 = ir.FloatType()
F64 = ir.DoubleType()
PTR = ir.PointerType()

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


def kind(dtype: str) -> str:
    """numpy kind letter: 'f' float, 'i' signed, 'u' unsigned, 'b' bool (bfloat16: 'f', which
    numpy files under 'V')."""
    return "f" if dtype == "bfloat16" else np.dtype(dtype).kind


_NARROW = ("float16", "bfloat16")  # stored narrow, computed as float


def widen(b: ir.IRBuilder, dtype: str, v: ir.Value) -> ir.Value:
    """Storage value -> compute value (float16/bfloat16 -> float, exact; others unchanged)."""
    if dtype == "float16":
        return b.fpext(v, F32)
    if dtype == "bfloat16":
        return bf16_to_f32(b, v)
    return v


def narrow(b: ir.IRBuilder, dtype: str, v: ir.Value) -> ir.Value:
    """Compute value -> storage value (float -> float16/bfloat16, rounded to nearest even)."""
    if dtype == "float16":
        return b.fptrunc(v, F16)
    if dtype == "bfloat16":
        return f32_to_bf16(b, v)
    return v


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


def _suffix(t: ir.Type) -> str:
    if isinstance(t, ir.VectorType):
        return f"v{t.count}{_suffix(t.element)}"
    if t == F32:
        return "f32"
    if t == F64:
        return "f64"
    if t == F16:
        return "f16"
    return f"i{t.width}"


def lower_program(
    program: isa.Program, spec=None, module: ir.Module | None = None, symbol: str | None = None
) -> ir.Module:
    """Program -> llvmlite module with one function named `symbol` (default: program.name)."""
    ctx = LowerCtx(program, spec, module, symbol)
    b = ctx.builder
    # GM argument base pointers
    for buf in program.args:
        slot = b.gep(ctx.func.args[2], [ir.Constant(I64, buf.arg)], source_etype=PTR)
        ctx.base[buf.name] = b.load(slot, typ=PTR, name=f"{buf.name}.base")
    # on-chip buffers: aligned allocas in the entry block
    for buf in program.buffers:
        t = ir.ArrayType(ctx.storage_type(buf.dtype), max(buf.size, 1))
        a = b.alloca(t, name=buf.name)
        a.type = PTR  # opaque pointer: every access is a typed getelementptr
        a.align = 64
        ctx.base[buf.name] = a
    ctx.lower_body(program.body)
    ctx.builder.ret_void()
    return ctx.module


# ============================================================================= scalar semantics
# Each entry builds one element of a vector instruction from compute-type values. They are
# total functions (no traps, no poison) on any input bits: tail lanes of a tile hold garbage.


def _fcmp(b, op, x, y):
    return b.fcmp_unordered(op, x, y) if op == "!=" else b.fcmp_ordered(op, x, y)


def _isnan(b, x):
    return b.fcmp_unordered("uno", x, x)


def _icmp(b, k, op, x, y):
    return b.icmp_signed(op, x, y) if k == "i" else b.icmp_unsigned(op, x, y)


def _int_div_guard(ctx, k, x, y):
    """Divisor with 0 and (MIN, -1) replaced by 1 so the host never traps; mask of y == 0."""
    b = ctx.builder
    zero, one = ir.Constant(y.type, 0), ir.Constant(y.type, 1)
    yz = b.icmp_signed("==", y, zero)
    bad = yz
    if k == "i":
        mn = ir.Constant(y.type, -(1 << (y.type.width - 1)))
        bad = b.or_(bad, b.and_(b.icmp_signed("==", x, mn),
                                b.icmp_signed("==", y, ir.Constant(y.type, -1))))  # fmt: skip
    return b.select(bad, one, y), yz


def _int_divmod(ctx, k, x, y, want: str):
    """Python/numpy integer floor division or modulo; division by zero gives 0 like numpy."""
    b = ctx.builder
    ys, yz = _int_div_guard(ctx, k, x, y)
    zero = ir.Constant(x.type, 0)
    if k != "i":
        q, r = b.udiv(x, ys), b.urem(x, ys)
        res = q if want == "div" else r
        return b.select(yz, zero, res)
    q, r = b.sdiv(x, ys), b.srem(x, ys)
    if want == "trunc":
        return b.select(yz, zero, q)
    sign_differs = b.icmp_signed("!=", b.icmp_signed("<", r, zero), b.icmp_signed("<", ys, zero))
    adj = b.and_(b.icmp_signed("!=", r, zero), sign_differs)
    if want == "div":
        res = b.select(adj, b.sub(q, ir.Constant(x.type, 1)), q)
    else:
        res = b.select(adj, b.add(r, ys), r)
    return b.select(yz, zero, res)


def _float_divmod(ctx, x, y, want: str):
    """numpy's npy_divmod: floor_divide / remainder for floats, branch-free."""
    b = ctx.builder
    t = x.type
    z = ir.Constant(t, 0.0)
    one = ir.Constant(t, 1.0)
    mod = b.frem(x, y)
    yz = b.fcmp_ordered("==", y, z)
    div = b.fdiv(b.fsub(x, mod), y)
    modnz = b.fcmp_unordered("!=", mod, z)
    flip = b.and_(modnz, b.xor(b.fcmp_ordered("<", y, z), b.fcmp_ordered("<", mod, z)))
    mod2 = b.select(flip, b.fadd(mod, y), mod)
    div2 = b.select(flip, b.fsub(div, one), div)
    if want == "mod":
        signed0 = ctx.call_intrinsic("copysign", t, z, y)
        res = b.select(modnz, mod2, signed0)
        return b.select(yz, mod, res)
    fl = ctx.call_intrinsic("floor", t, div2)
    fl = b.select(b.fcmp_ordered(">", b.fsub(div2, fl), ir.Constant(t, 0.5)), b.fadd(fl, one), fl)
    q = b.fdiv(x, y)
    res = b.select(b.fcmp_unordered("!=", div2, z), fl, ctx.call_intrinsic("copysign", t, z, q))
    res = b.select(yz, q, res)
    # the Array API's table where an operand is infinite: floor(x / y) (inf // 2 = inf, not
    # npy_divmod's nan; -1 // inf = -0, not -1), as graph.ops.floor_divide_ref
    inf = ir.Constant(t, float("inf"))
    fabs = lambda v: ctx.call_intrinsic("fabs", t, v)  # noqa: E731
    anyinf = b.or_(b.fcmp_ordered("==", fabs(x), inf), b.fcmp_ordered("==", fabs(y), inf))
    return b.select(anyinf, q, res)  # floor(q) == q: q is +-inf, +-0 or NaN there


def _int_pow(ctx, k, x, y):
    """x ** y for integers by square-and-multiply (wraps like numpy).

    A small while loop over the exponent's bits (at most its width): cheap to compile and fast
    for the small exponents integer powers use; its loop keeps the enclosing loop scalar.
    """
    b = ctx.builder
    t = x.type
    one, zero = ir.Constant(t, 1), ir.Constant(t, 0)
    pre = b.block
    ctx._nblocks += 1
    q = ctx._nblocks
    head = ctx.func.append_basic_block(f"ipow{q}")
    body = ctx.func.append_basic_block(f"ipowbody{q}")
    done = ctx.func.append_basic_block(f"ipowdone{q}")
    b.branch(head)
    b.position_at_end(head)
    r, base, e = b.phi(t), b.phi(t), b.phi(t)
    r.add_incoming(one, pre)
    base.add_incoming(x, pre)
    e.add_incoming(y, pre)
    b.cbranch(b.icmp_signed("!=", e, zero), body, done)
    b.position_at_end(body)
    bit = b.icmp_signed("!=", b.and_(e, one), zero)
    r.add_incoming(b.select(bit, b.mul(r, base), r), body)
    base.add_incoming(b.mul(base, base), body)
    e.add_incoming(b.lshr(e, one), body)
    b.branch(head)
    b.position_at_end(done)
    res = r
    if k == "i":  # negative exponents: numpy raises; give the integer truncation of x**y
        neg = b.icmp_signed("<", y, zero)
        m1 = ir.Constant(t, -1)
        odd = b.icmp_signed("!=", b.and_(y, one), zero)
        alt_m1 = b.select(b.icmp_signed("==", x, m1), b.select(odd, m1, one), zero)
        alt = b.select(b.icmp_signed("==", x, one), one, alt_m1)
        res = b.select(neg, alt, res)
    return res


def _maxmin(ctx, k, op, x, y):
    b = ctx.builder
    if k == "f":  # numpy: a if (a > b or isnan(a)) else b
        c = b.or_(b.fcmp_ordered(">" if op == "max" else "<", x, y), _isnan(b, x))
        return b.select(c, x, y)
    return b.select(_icmp(b, k, ">" if op == "max" else "<", x, y), x, y)


def binary_op(ctx: LowerCtx, op: str, dtype: str, x: ir.Value, y: ir.Value) -> ir.Value:
    """One element of VBinary `op` on compute-type values of `dtype`."""
    b = ctx.builder
    k = kind(dtype)
    f = k == "f"
    if op == "vadd":
        return b.fadd(x, y) if f else (b.or_(x, y) if k == "b" else b.add(x, y))
    if op == "vsub":
        return b.fsub(x, y) if f else (b.xor(x, y) if k == "b" else b.sub(x, y))
    if op == "vmul":
        return b.fmul(x, y) if f else (b.and_(x, y) if k == "b" else b.mul(x, y))
    if op == "vdiv":
        return b.fdiv(x, y) if f else _int_divmod(ctx, k, x, y, "trunc" if k == "i" else "div")
    if op in ("vmax", "vmin"):
        return _maxmin(ctx, k, op[1:], x, y)
    if op in ("vand", "vor", "vxor") and not f:
        return {"vand": b.and_, "vor": b.or_, "vxor": b.xor}[op](x, y)
    if op in ("vfloordiv", "vmod"):
        if f:
            return _float_divmod(ctx, x, y, "div" if op == "vfloordiv" else "mod")
        return _int_divmod(ctx, k, x, y, "div" if op == "vfloordiv" else "mod")
    if op == "vpow":
        if f:
            return ctx.call_intrinsic("pow", x.type, x, y)
        return _int_pow(ctx, k, x, y)
    if op in ("vshl", "vshr") and k in "iu":
        # numpy: a count outside [0, width) shifts every bit out (LLVM would make it poison)
        t = x.type
        width = ir.Constant(t, t.width)
        out = b.icmp_unsigned(">=", y, width)  # negative counts are huge unsigned
        safe = b.select(out, ir.Constant(t, 0), y)
        if op == "vshl":
            return b.select(out, ir.Constant(t, 0), b.shl(x, safe))
        if k == "u":
            return b.select(out, ir.Constant(t, 0), b.lshr(x, safe))
        return b.ashr(x, b.select(out, ir.Constant(t, t.width - 1), y))
    raise NotImplementedError(f"vector binary {op} on {dtype}")


def unary_op(ctx: LowerCtx, op: str, dtype: str, x: ir.Value) -> ir.Value:
    b = ctx.builder
    k = kind(dtype)
    t = x.type
    if op == "vcopy":
        return x
    if k == "f":
        if op in ("vexp", "vln"):
            native_dt = "float64" if dtype == "float64" else "float32"
            return b.call(ctx.native(op, native_dt), [x])
        if op == "vabs":
            return ctx.call_intrinsic("fabs", t, x)
        if op == "vrelu":
            z = ir.Constant(t, 0.0)
            return b.select(b.or_(b.fcmp_ordered(">", x, z), _isnan(b, x)), x, z)
        if op == "vsqrt":
            return ctx.call_intrinsic("sqrt", t, x)
        if op == "vrsqrt":
            return b.fdiv(ir.Constant(t, 1.0), ctx.call_intrinsic("sqrt", t, x))
        if op == "vrec":
            return b.fdiv(ir.Constant(t, 1.0), x)
        if op == "vneg":
            return b.fneg(x)
        intr = {"vfloor": "floor", "vceil": "ceil", "vrint": "roundeven", "vtrunc": "trunc"}
        if op in intr:
            return ctx.call_intrinsic(intr[op], t, x)
    else:
        zero = ir.Constant(t, 0)
        if op in ("vfloor", "vceil", "vrint", "vtrunc"):
            return x
        if op == "vabs":
            if k != "i":
                return x
            return b.select(b.icmp_signed("<", x, zero), b.sub(zero, x), x)
        if op == "vneg":
            return b.sub(zero, x)
        if op == "vnot":
            return b.xor(x, ir.Constant(t, 1 if k == "b" else -1))
        if op == "vrelu":
            return b.select(_icmp(b, k, ">", x, zero), x, zero)
        if op == "vrec":
            return _int_divmod(ctx, k, ir.Constant(t, 1), x, "trunc" if k == "i" else "div")
    raise NotImplementedError(f"vector unary {op} on {dtype}")


def scalar_op(ctx: LowerCtx, op: str, dtype: str, x: ir.Value, s) -> ir.Value:
    b = ctx.builder
    k = kind(dtype)
    c = ctx.const(dtype, s)
    if op == "vadds":
        return binary_op(ctx, "vadd", dtype, x, c)
    if op == "vmuls":
        return binary_op(ctx, "vmul", dtype, x, c)
    if op == "vmaxs":
        return binary_op(ctx, "vmax", dtype, x, c)
    if op == "vmins":
        return binary_op(ctx, "vmin", dtype, x, c)
    if op in ("vshl", "vshr") and k in "iu":
        width = x.type.width
        if int(s) >= width:  # shifting out every bit (LLVM would make it poison)
            if op == "vshl" or k == "u":
                return ir.Constant(x.type, 0)
            return b.ashr(x, ir.Constant(x.type, width - 1))
        sh = ir.Constant(x.type, int(s))
        if op == "vshl":
            return b.shl(x, sh)
        return b.ashr(x, sh) if k == "i" else b.lshr(x, sh)
    raise NotImplementedError(f"vector scalar op {op} on {dtype}")


_CMP = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


def compare(ctx: LowerCtx, cmp: str, dtype: str, x: ir.Value, y: ir.Value) -> ir.Value:
    b = ctx.builder
    k = kind(dtype)
    op = _CMP[cmp]
    c = _fcmp(b, op, x, y) if k == "f" else _icmp(b, k, op, x, y)
    return b.zext(c, I8)


def convert(ctx: LowerCtx, src_dt: str, dst_dt: str, x: ir.Value, mode: str) -> ir.Value:
    """Storage-type value of src_dt -> storage-type value of dst_dt (one rounding)."""
    b = ctx.builder
    ks, kd = kind(src_dt), kind(dst_dt)
    ts, td = ctx.storage_type(src_dt), ctx.storage_type(dst_dt)
    if mode == "bits":
        return b.bitcast(x, td)
    if src_dt == "bfloat16" and dst_dt != "bfloat16":  # exact to float, then float's rules
        return convert(ctx, "float32", dst_dt, bf16_to_f32(b, x), mode)
    if dst_dt == "bfloat16" and src_dt != "bfloat16":
        # one rounding, as ml_dtypes: exact (or rounded to odd) to float first, then to nearest
        # even; float64 and int64 go through double like the float16 path below
        if src_dt in ("float16", "float32"):
            f = b.fpext(x, F32) if ts == F16 else x
        else:
            d = x if ts == F64 else convert(ctx, src_dt, "float64", x, mode)
            f = _f64_to_f32_odd(ctx, d)
        return f32_to_bf16(b, f)
    if ks == "f" and mode in ("rint", "floor", "ceil") and kd != "f":
        x = ctx.call_intrinsic({"rint": "roundeven"}.get(mode, mode), ts, x)
    if kd == "b":
        if ks == "f":
            c = b.fcmp_unordered("!=", x, ir.Constant(ts, 0.0))
        else:
            c = b.icmp_signed("!=", x, ir.Constant(ts, 0))
        return b.zext(c, I8)
    if td == F16 and (ts == F64 or ks != "f"):
        # no libcall (__truncdfhf2 / __floatdihf are not in every process): exact to double,
        # round-to-odd to float, then one correctly rounded float -> half step
        if ks != "f":
            x = b.sitofp(x, F64) if ks == "i" else b.uitofp(x, F64)
        return b.fptrunc(_f64_to_f32_odd(ctx, x), F16)
    if ks == "f" and kd == "f":
        if ts == td:
            return x
        return b.fpext(x, td) if _fbits(ts) < _fbits(td) else b.fptrunc(x, td)
    if ks == "f":  # x86 / numpy semantics: through int32 or int64, NaN and overflow -> MIN
        if ts == F16:  # exact; half cannot hold the 2^31 / 2^63 range limits
            x, ts = b.fpext(x, F32), F32
        if kd == "u" and td.width == 64:
            big = ir.Constant(ts, 2.0**63)
            hi = b.fcmp_ordered(">=", x, big)
            lo_v = _cvtt(ctx, x, I64)
            hi_v = b.xor(_cvtt(ctx, b.fsub(x, big), I64), ir.Constant(I64, -(2**63)))
            return b.select(hi, hi_v, lo_v)
        wide = I64 if td.width == 64 or (kd == "u" and td.width == 32) else I32
        v = _cvtt(ctx, x, wide)
        return v if wide == td else b.trunc(v, td)
    if kd == "f":
        return b.sitofp(x, td) if ks == "i" else b.uitofp(x, td)
    if ts.width == td.width:
        return x
    if ts.width > td.width:
        return b.trunc(x, td)
    return b.sext(x, td) if ks == "i" else b.zext(x, td)


def _cvtt(ctx: LowerCtx, x: ir.Value, t: ir.IntType) -> ir.Value:
    """cvttss2si: truncate toward zero; NaN or out of range gives the minimum integer.

    A bad lane is replaced by 0.0 before a plain `fptosi` (defined for every lane then) and
    its result by the minimum afterwards: LLVM vectorizes this to one vcvttps2dq and a blend.
    `llvm.fptosi.sat` (same values) is scalarized by the x86 backend in vector loops: the
    znver4 listing of exp(sin(x)*0.5+1)*x had 64 vcvttss2si and 128 vucomiss + cmov in one
    loop of the sin (its large-argument path); after this change 5 vcvttss2si (scalar
    remainders) and 10 vcvttps2dq."""
    b = ctx.builder
    ft = x.type
    w = t.width
    bad = b.or_(b.fcmp_unordered("uno", x, x),
                b.or_(b.fcmp_ordered(">=", x, ir.Constant(ft, 2.0 ** (w - 1))),
                      b.fcmp_ordered("<", x, ir.Constant(ft, -(2.0 ** (w - 1))))))  # fmt: skip
    v = b.fptosi(b.select(bad, ir.Constant(ft, 0.0), x), t)
    return b.select(bad, ir.Constant(t, -(1 << (w - 1))), v)


def _f64_to_f32_odd(ctx: LowerCtx, d: ir.Value) -> ir.Value:
    """double -> float rounded to odd, so a following float -> half rounding is correct."""
    b = ctx.builder
    f = b.fptrunc(d, F32)
    back = b.fpext(f, F64)
    inexact = b.fcmp_unordered("!=", back, d)
    away = b.fcmp_ordered(
        ">", ctx.call_intrinsic("fabs", F64, back), ctx.call_intrinsic("fabs", F64, d)
    )
    bits = b.bitcast(f, I32)
    bits = b.select(away, b.sub(bits, ir.Constant(I32, 1)), bits)
    bits = b.select(inexact, b.or_(bits, ir.Constant(I32, 1)), bits)
    return b.bitcast(bits, F32)


def _fbits(t: ir.Type) -> int:
    return {F16: 16, F32: 32, F64: 64}[t]


# ============================================================================= vector lowering


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


def _reduce_identity(ctx: LowerCtx, op: str, dt: str) -> ir.Constant:
    k = kind(dt)
    if op == "vcadd":
        return ctx.const(dt, 0)
    if op == "vcmul":
        return ctx.const(dt, 1)
    if k == "f":
        return ctx.const(dt, float("-inf") if op == "vcmax" else float("inf"))
    info = np.iinfo(dt) if k != "b" else None
    if op == "vcmax":
        return ctx.const(dt, 0 if k == "b" else info.min)
    return ctx.const(dt, 1 if k == "b" else info.max)


def _combine(ctx: LowerCtx, op: str, dt: str, acc: ir.Value, x: ir.Value) -> ir.Value:
    b = ctx.builder
    k = kind(dt)
    if op == "vcadd":
        return (
            b.fadd(acc, x, flags=("reassoc",)) if k == "f" else binary_op(ctx, "vadd", dt, acc, x)
        )
    if op == "vcmul":
        return (
            b.fmul(acc, x, flags=("reassoc",)) if k == "f" else binary_op(ctx, "vmul", dt, acc, x)
        )
    if k == "f":  # NaN-propagating, recognised by the loop vectorizer as a reduction
        return ctx.call_intrinsic("maximum" if op == "vcmax" else "minimum", acc.type, acc, x)
    if k == "b":
        return b.or_(acc, x) if op == "vcmax" else b.and_(acc, x)
    nm = ("s" if k == "i" else "u") + ("max" if op == "vcmax" else "min")
    return ctx.call_intrinsic(nm, acc.type, acc, x)


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


LIBM_UNARY = ("log1p", "expm1", "log2", "log10", "sinh", "cosh", "asinh", "acosh", "atanh",
              "asin", "acos", "atan", "erf", "erfc")  # fmt: skip
LIBM_BINARY = ("atan2", "hypot")


def host_math(ctx: LowerCtx, fn: str, t: ir.Type, xs) -> ir.Value:
    """One element of a math function by the C library (float or double `t`): the fallback of
    the composites vmath does not expand (issue 16's functions on float64, asin/acos/atan/atan2
    on every float dtype), and the Cube epilogue's scalar form of them."""
    b = ctx.builder
    suffix = "f" if t == F32 else ""
    if fn in LIBM_UNARY:
        return b.call(ctx.libm(fn + suffix, t), [xs[0]])
    if fn in LIBM_BINARY:
        return b.call(ctx.libm(fn + suffix, t, 2), [xs[0], xs[1]])
    if fn == "logaddexp":  # max + log1p(exp(-|a - b|)); a + log(2) where a == b
        a, c = xs
        mx = _maxmin(ctx, "f", "max", a, c)
        d = b.fneg(ctx.call_intrinsic("fabs", t, b.fsub(a, c)))
        e = b.call(ctx.native("vexp", "float64" if t == F64 else "float32"), [d])
        r = b.fadd(mx, b.call(ctx.libm("log1p" + suffix, t), [e]))
        return b.select(b.fcmp_ordered("==", a, c), b.fadd(a, ir.Constant(t, math.log(2))), r)
    raise NotImplementedError(f"host math function {fn}")


# Copies that are not fusible (2-D, converting, stride-0 writes) take the row loop / memcpy path.
LOWER[isa.CopyIn] = _copy_in
LOWER[isa.CopyOut] = _copy_out
