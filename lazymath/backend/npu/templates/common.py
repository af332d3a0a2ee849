"""Shared pieces of the Vector templates: dim collapsing, tiling, block split, and the emitter
that turns a fused scalar expression (`kernel_ir.Expr`) into vector instructions over UB tiles.

Why an emitter with a buffer pool: every SSA value of an expression needs a UB tile, but UB is
small, so tiles are recycled as soon as a value is dead (linear-scan over the SSA order), and
ops write in place when their operand dies. Fewer live tiles means larger tiles, which is what
the tiling function maximises. The count of live tiles is known only after emission, so the
templates emit twice: once to count, once with the real tile size.
"""

from __future__ import annotations

import math
from contextvars import ContextVar
from dataclasses import dataclass

import numpy as np

from lazymath.backend.npu import isa, vmath
from lazymath.backend.npu.kernel_ir import ArgView, Expr, SOp
from lazymath.backend.npu.tiles import TileBuilder, TilePool
from lazymath.graph.ops import COMPARISONS, ELEMENTWISE, Composite, Native

# Set by backend.compile while it builds a kernel that calls the vector math library for its
# composites instead of inlining them (vmath.call_plan decides per kernel).
CALLS: ContextVar[bool] = ContextVar("lazymath_vmath_calls", default=False)

SMALL_WORK = 32 * 1024  # elements: below this one block keeps latency low
TILE_ALIGN = 32  # elements: 32-byte aligned tiles for every dtype up to 8 bytes (NPU: 32 B)


def itemsize(dtype: str) -> int:
    return np.dtype(dtype).itemsize


def device_blocks(spec, work_items: int) -> int:
    """How many blocks a Vector program asks of the device: one per AI core the work can use.
    A property of the device and the kernel, never of the host: the host mapping
    (`compile.host_blocks`) decides how many host threads run them."""
    return max(1, min(spec.vector_cores, work_items))


def collapse(shape: tuple[int, ...], strides_list: list[tuple[int, ...]]):
    """Drop size-1 dims and merge adjacent dims every view walks contiguously.

    Returns (shape, [strides per view]); at least one dim (a scalar becomes (1,)).
    """
    dims = [d for d in range(len(shape)) if shape[d] != 1]
    if not dims:
        return (1,), [(0,) for _ in strides_list]
    out_shape = [shape[dims[0]]]
    out_strides = [[s[dims[0]]] for s in strides_list]
    for d in dims[1:]:
        size = shape[d]
        if all(st[-1] == s[d] * size for st, s in zip(out_strides, strides_list)):
            out_shape[-1] *= size
            for st, s in zip(out_strides, strides_list):
                st[-1] = s[d]
        else:
            out_shape.append(size)
            for st, s in zip(out_strides, strides_list):
                st.append(s[d])
    return tuple(out_shape), [tuple(s) for s in out_strides]


def align_down(x: int, a: int = TILE_ALIGN) -> int:
    return max(a, x // a * a)


def align_up(x: int, a: int = TILE_ALIGN) -> int:
    return max(a, (x + a - 1) // a * a)


def buffers_bytes(spec, buffers) -> int:
    """UB bytes of `buffers`, each rounded up to the scope alignment (as Program.check)."""
    a = spec.align.get("UB", 32)
    return sum((b.nbytes + a - 1) // a * a for b in buffers if b.scope == "UB")


def fit_tile(spec, bytes_at, cap: int | None = None) -> int:
    """Largest 32-aligned tile (elements) whose buffers fit in UB.

    `bytes_at(tile)` is the UB footprint of the program built with that tile. It is affine in
    the tile once composites' fixed-size chunks are reached, so two probes give the slope
    (bytes per tile element: double-buffered queues count twice) and the fixed part.
    """
    seen: dict[int, int] = {}  # each probe builds the whole program: never one tile twice

    def probe(t: int) -> int:
        b = seen.get(t)
        if b is None:
            b = seen[t] = bytes_at(t)
        return b

    t1, t2 = 512, 1024
    b1, b2 = probe(t1), probe(t2)
    slope = max((b2 - b1) / (t2 - t1), 1e-9)
    base = b1 - slope * t1
    t = align_down(int((spec.ub_bytes - base) / slope))
    if cap is not None:
        t = min(t, align_up(cap))
    while t > TILE_ALIGN and probe(t) > spec.ub_bytes:
        t = align_down(int(t * 0.9))
    return t


def block_range(items: isa.IntExpr) -> tuple[isa.IntExpr, isa.IntExpr, list]:
    """[start, stop) of this block's work items, GetBlockIdx()/GetBlockNum() style (`items`
    may be a run-time expression: a dynamic-shape kernel's).

    blockFactor = ceil(items / block_num); computed in the kernel so one program is right for any
    launch width (the host's cores or the NPU's).
    """
    factor = isa.Var("block_factor")
    start = isa.Var("block_start")
    stop = isa.Var("block_stop")
    lets = [
        isa.Let(factor, isa.floordiv(isa.add(isa.sub(items, 1), isa.BLOCK_NUM), isa.BLOCK_NUM)),
        isa.Let(start, isa.mul(isa.BLOCK_IDX, factor)),
        isa.Let(stop, isa.imin(isa.add(start, factor), items)),
    ]
    return start, stop, lets


def unravel(index: isa.IntExpr, sizes: tuple[int, ...]) -> list[isa.IntExpr]:
    """C-order multi-index of a flat index (div/mod chain; empty sizes -> [])."""
    out: list[isa.IntExpr] = []
    rest = index
    for k in range(len(sizes) - 1, -1, -1):
        if k == 0:
            out.append(rest)
        else:
            out.append(isa.mod(rest, sizes[k]))
            rest = isa.floordiv(rest, sizes[k])
    return out[::-1]


def dot(idx: list[isa.IntExpr], strides: tuple[int, ...], base: isa.IntExpr = 0) -> isa.IntExpr:
    acc = base
    for i, s in zip(idx, strides):
        acc = isa.add(acc, isa.mul(i, s))
    return acc


def gm_args(views: tuple[ArgView, ...], names: list[str]) -> tuple[isa.Buffer, ...]:
    return tuple(
        isa.Buffer(n, "GM", v.dtype, 0, arg=k) for k, (v, n) in enumerate(zip(views, names))
    )


def runtime_rows(args: tuple[isa.Buffer, ...], bound: int):
    """A dynamic-shape kernel's row count: (args + the tiling word, the `rows` variable, the
    `get_value` that reads it at the top of the program). The tiling word is the GM argument
    after the views (`kernel_ir.TILING_VIEW`); `bound` is the most rows the kernel serves."""
    tiling = isa.Buffer("tiling", "GM", "int64", 0, arg=len(args))
    rows = isa.Var("rows")
    return (*args, tiling), rows, isa.GetValue(rows, isa.Ref(tiling, 0), bound)


def runtime_lead(rows: isa.Var, lead: int, bound: int) -> isa.IntExpr:
    """The run-time extent of a collapsed leading dim of `lead` elements at the bound: the
    batch dim (`bound` rows) merged with the dims after it, so `rows * lead / bound`."""
    if lead % bound:
        raise ValueError(f"the leading dim ({lead}) does not hold the batch of {bound} rows")
    return isa.mul(rows, lead // bound)


# ============================================================================= emitter


@dataclass
class Const:
    """An expression value that is a scalar constant (folded into vadds/vmuls/... when possible)."""

    value: object
    dtype: str


def _last_uses(expr: Expr, results: tuple[int, ...]) -> list[int]:
    last = list(range(len(expr)))
    for i, op in enumerate(expr):
        for s in op.srcs:
            last[s] = max(last[s], i)
    for r in results:
        last[r] = len(expr)
    return last


# From the op records (`graph.ops.Op`): ops that compute with one instruction per element and
# may run in place (trait `inplace`), and the vmath composites (lowering `Composite`: sin, cos,
# tan, tanh, sigmoid, pow, floor_divide, remainder; a `fallback` is the native instruction used
# where vmath does not expand the dtype, else the host libm)
_INPLACE_OK = frozenset(k for k, m in ELEMENTWISE.items() if m.info.inplace)
_COMPOSITE: dict[str, Composite] = {
    k: m.lowering for k, m in ELEMENTWISE.items() if isinstance(m.lowering, Composite)
}
COMPOSITE = tuple(_COMPOSITE)


class ExprEmitter:
    """Emit vector instructions for a fused expression over the first `n` elements of tiles.

    `n` may be dynamic (a tail tile, or a Var bound per step); buffers are `pool.tile` long.
    `loads[k]` is the tile Ref holding input k, `acc` the accumulator tile (epilogues) and
    `dests[j]` optional preferred destination tiles for result j (the output queues). Returns the
    Ref (or `Const`) of every result. Temporaries come from `pool`; constants used as whole
    operands become tiles filled once (`hoisted`, emitted before the tile loop); composites go to
    `vmath.emit_composite` (scratch from the pool), or to a host libm instruction if vmath
    cannot expand them.
    """

    def __init__(self, b: isa.Builder, pool: TilePool, n: isa.IntExpr):
        self.b = b
        self.pool = pool
        self.n = n
        self.const_tiles: dict = {}
        self.hoisted: list = []  # VDup of constant tiles, emitted once before the tile loop
        # vmath's coefficient chunks, shared by the composites of this expression (each is
        # filled by the first composite that needs it, before any reader, and never written
        # again): the UB footprint stays flat in the number of composites
        self.vm_consts: dict = {}
        self.const_prefix = ""  # names of constant tiles (two emitters in one program differ)

    # ---------------------------------------------------------------- helpers
    def const_tile(self, value, dtype: str) -> isa.Ref:
        key = (repr(value), dtype)
        if key not in self.const_tiles:
            # unique in the pool: a reduce kernel's prologue and epilogue are two emitters
            # sharing one pool (pow(sum(pow(x, 3)), 1/3) had two buffers named c0_float32)
            i = len(self.const_tiles)
            pre = self.const_prefix
            while f"{pre}c{i}_{dtype}" in self.pool._by_name:
                i += 1
            buf = isa.Buffer(f"{pre}c{i}_{dtype}", "UB", dtype, self.pool.tile)
            self.pool.buffers.append(buf)  # counted, never freed
            self.pool._by_name[buf.name] = buf
            r = isa.Ref(buf, 0)
            self.hoisted.append(isa.VDup(r, value, self.pool.tile))
            self.const_tiles[key] = r
        return self.const_tiles[key]

    def tile_of(self, v, dtype: str) -> isa.Ref:
        return self.const_tile(v.value, dtype) if isinstance(v, Const) else v

    def emit(
        self,
        expr: Expr,
        results: tuple[int, ...],
        loads: dict[int, isa.Ref],
        acc: isa.Ref | None = None,
        dests: dict[int, isa.Ref] | None = None,
    ) -> list:
        dests = dict(dests or {})
        last = _last_uses(expr, results)
        vals: list = []
        claimed: set[int] = set()
        for i, op in enumerate(expr):
            if op.op == "load":
                vals.append(loads[op.arg])
                continue
            if op.op == "const":
                vals.append(Const(op.arg, op.dtype))
                continue
            if op.op == "acc":
                vals.append(acc)
                continue
            srcs = [vals[s] for s in op.srcs]
            if srcs and all(isinstance(v, Const) for v in srcs):  # fusion folds these; rare
                srcs[0] = self.const_tile(srcs[0].value, expr[op.srcs[0]].dtype)
            dst = None
            for j, r in enumerate(results):
                if r == i and j not in claimed and j in dests:
                    dst = dests[j]
                    claimed.add(j)
                    break
            if dst is None and op.op in _INPLACE_OK:
                for s in op.srcs:
                    v = vals[s]
                    if (last[s] == i and isinstance(v, isa.Ref) and self.pool.owns(v)
                            and v.buf.dtype == op.dtype and op.srcs.count(s) >= 1):  # fmt: skip
                        dst = v
                        break
            if dst is None:
                dst = self.pool.get(op.dtype)
            src_dtypes = [expr[s].dtype for s in op.srcs]
            self.emit_op(op, dst, srcs, src_dtypes)
            vals.append(dst)
            for s in set(op.srcs):  # free dead operands (not the one reused as dst)
                v = vals[s]
                if last[s] == i and isinstance(v, isa.Ref) and v is not dst and v != dst:
                    self.pool.put(v)
        out = []
        for j, r in enumerate(results):
            v = vals[r]
            if j in dests and j not in claimed:
                d = dests[j]
                if isinstance(v, Const):
                    self.b.vdup(d, v.value, self.n)
                elif v != d:
                    self.b.vcopy(d, v, self.n)
                v = d
                claimed.add(j)
            out.append(v)
        return out

    # ---------------------------------------------------------------- one op
    def emit_op(self, op: SOp, dst: isa.Ref, srcs: list, src_dtypes: list[str]) -> None:
        b, n = self.b, self.n
        name, dt = op.op, op.dtype
        k = np.dtype(dt).kind
        sk = np.dtype(src_dtypes[0]).kind if src_dtypes else k
        t = self.tile_of

        if name == "cast":
            return self._cast(dst, srcs[0], src_dtypes[0], dt)
        if len(srcs) == 2 and name in _COMMUTATIVE_SCALAR:
            a, c = srcs
            if isinstance(a, Const):
                a, c = c, a
            if isinstance(c, Const):
                sop, val = _COMMUTATIVE_SCALAR[name], c.value
                if k == "b" and name in ("add", "mul", "maximum", "minimum"):
                    pass  # bool: use the tile form (or/and)
                else:
                    b.emit(isa.VScalar(sop, dst, a, val, n))
                    return
        if name == "sub" and isinstance(srcs[1], Const) and k in "fiu":
            val = srcs[1].value
            b.emit(isa.VScalar("vadds", dst, srcs[0], -val if k == "f" else _wrap_neg(val, dt), n))
            return
        if name in _UNARY_NATIVE:
            x = t(srcs[0], src_dtypes[0])
            if name == "abs" and k == "b":
                b.vcopy(dst, x, n)
            else:
                b.emit(isa.VUnary(_UNARY_NATIVE[name], dst, x, n))
            return
        if name in _BINARY_NATIVE:
            x, y = t(srcs[0], src_dtypes[0]), t(srcs[1], src_dtypes[1])
            b.emit(isa.VBinary(_binary_native(name, k), dst, x, y, n))
            return
        if name in _COMPOSITE and _COMPOSITE[name].fallback:  # floor_divide, remainder, pow
            x, y = t(srcs[0], src_dtypes[0]), t(srcs[1], src_dtypes[1])
            if k == "f" and self._composite(name, dst, (x, y), dt):
                return
            b.emit(isa.VBinary(_COMPOSITE[name].fallback, dst, x, y, n))
            return
        if name in _CMPS:
            a, c = srcs
            cmp = name
            if isinstance(a, Const) and not isinstance(c, Const):
                a, c, cmp = c, a, _SWAP[name]
            if isinstance(c, Const):
                b.emit(isa.VCmpS(cmp, dst, a, c.value, n))
            else:
                b.emit(isa.VCmp(cmp, dst, a, c, n))
            return
        if name in ("logical_and", "logical_or"):
            x, y = (self._as_bool(s, d) for s, d in zip(srcs, src_dtypes))
            b.emit(isa.VBinary("vand" if name == "logical_and" else "vor", dst, x, y, n))
            self._release_bool(x, srcs[0])
            self._release_bool(y, srcs[1])
            return
        if name == "logical_not":
            if sk == "b":
                b.emit(isa.VUnary("vnot", dst, t(srcs[0], "bool"), n))
            else:
                b.emit(isa.VCmpS("eq", dst, srcs[0], 0, n))
            return
        if name == "where":
            m = self._as_bool(srcs[0], src_dtypes[0])
            x, y = t(srcs[1], src_dtypes[1]), t(srcs[2], src_dtypes[2])
            b.emit(isa.VSel(dst, m, x, y, n))
            self._release_bool(m, srcs[0])
            return
        if name == "leaky_relu":  # where(x >= 0, x, x * slope)
            x = srcs[0]
            m = self.pool.get("bool")
            s = self.pool.get(dt)
            b.emit(isa.VCmpS("ge", m, x, 0, n))
            b.emit(isa.VScalar("vmuls", s, x, op.arg, n))
            b.emit(isa.VSel(dst, m, x, s, n))
            self.pool.put(m)
            self.pool.put(s)
            return
        if name == "sign":
            return self._sign(dst, srcs[0], dt)
        if name in _FLOAT_TESTS:
            return self._float_test(name, dst, t(srcs[0], src_dtypes[0]), src_dtypes[0])
        if name == "square":
            x = t(srcs[0], src_dtypes[0])
            b.emit(isa.VBinary(_binary_native("mul", k), dst, x, x, n))
            return
        if name == "copysign":  # where(signbit(y), -|x|, |x|)
            x, y = t(srcs[0], src_dtypes[0]), t(srcs[1], src_dtypes[1])
            m = self.pool.get("bool")
            self._float_test("signbit", m, y, src_dtypes[1])
            ax, nx = self.pool.get(dt), self.pool.get(dt)
            b.emit(isa.VUnary("vabs", ax, x, n))
            b.emit(isa.VUnary("vneg", nx, ax, n))
            b.emit(isa.VSel(dst, m, nx, ax, n))
            for r in (m, ax, nx):
                self.pool.put(r)
            return
        if name in _COMPOSITE and k == "f":
            xs = tuple(t(s, d) for s, d in zip(srcs, src_dtypes))
            if self._composite(name, dst, xs, dt):
                return
            b.emit(isa.VHostMath(name, dst, xs, n))
            return
        raise NotImplementedError(f"scalar op {name!r} on {dt} has no vector lowering")

    def _composite(self, name: str, dst: isa.Ref, srcs: tuple, dt: str) -> bool:
        """Ask the vector math library (vmath) to expand `name`; False if it cannot."""
        fn = vmath.emit_composite
        # the runtime library holds what an NPU runs: host-only trig (LAZYMATH_HOST_MATH) inlines
        host_only = fn is not None and name in ("sin", "cos", "tan") and vmath.host_math_enabled()
        if (
            fn is not None
            and CALLS.get()
            and not host_only
            and self._call(vmath, name, dst, srcs, dt)
        ):
            return True
        if fn is not None:
            tb = TileBuilder(self.pool)
            tb.shared_consts = self.vm_consts
            try:
                fn(tb, name, dst, tuple(srcs), self.n, dt)
            except (NotImplementedError, KeyError, ValueError):
                for r in tb.borrowed:
                    self.pool.put(r)
                tb = None
            if tb is not None:
                self.b.body.extend(tb.body)
                self.b.buffers.extend(tb.buffers)
                for r in tb.borrowed:
                    self.pool.put(r)
                return True
        if getattr(_COMPOSITE.get(name), "fallback", None):
            return False  # native vfloordiv / vmod / vpow handle floats too
        self.b.emit(isa.VHostMath(name, dst, tuple(srcs), self.n))
        return True

    def _call(self, vmath, name: str, dst: isa.Ref, srcs: tuple, dt: str) -> bool:
        """`name` as a call into the vector math library (`vmath.VMathCall`); False if vmath
        has no composite for it. The inlined composite's scratch is borrowed from the pool
        and declared all the same, so the tile (and the chunking) is the inlined kernel's."""
        try:
            pooled, other = vmath.call_footprint(name, dt, self.pool.tile, len(srcs))
        except (NotImplementedError, KeyError, ValueError):
            return False
        borrowed = [self.pool.get(d, size) for d, size in pooled]
        for d, size, key in other:
            if key is not None and key in self.vm_consts:
                continue
            r = isa.Builder.scratch(self.b, d, size, prefix=f"vmcall{len(self.b.buffers)}_")
            if key is not None:
                self.vm_consts[key] = r
        self.b.emit(vmath.VMathCall(name, dt, dst, tuple(srcs), self.n))
        for r in borrowed:
            self.pool.put(r)
        return True

    def _as_bool(self, v, dtype: str):
        if isinstance(v, Const):
            return self.const_tile(bool(v.value), "bool")
        if dtype == "bool":
            return v
        m = self.pool.get("bool")
        self.b.emit(isa.VCmpS("ne", m, v, 0, self.n))
        return m

    def _release_bool(self, m, original) -> None:
        if m is not original and self.pool.owns(m) and m not in self.const_tiles.values():
            self.pool.put(m)

    def _cast(self, dst, src, sdt: str, ddt: str) -> None:
        b, n = self.b, self.n
        if isinstance(src, Const):
            b.vdup(dst, np.asarray(src.value, dtype=sdt).astype(ddt).item(), n)
        elif sdt == ddt:
            b.vcopy(dst, src, n)
        elif ddt == "bool":
            b.emit(isa.VCmpS("ne", dst, src, 0, n))
        else:
            b.emit(isa.VConv(dst, src, n, "trunc"))

    def _float_test(self, name: str, dst, x, sdt: str) -> None:
        """isnan / isinf / isfinite / signbit of `x` (dtype `sdt`) into the bool tile `dst`;
        integers are never NaN or infinite (signbit's rule casts them to float first)."""
        b, n = self.b, self.n
        if np.dtype(sdt).kind != "f":
            b.vdup(dst, 1 if name == "isfinite" else 0, n)
            return
        if name == "isnan":
            b.emit(isa.VCmp("ne", dst, x, x, n))
            return
        if name == "signbit":  # the sign bit as an integer's: also -0.0 and -NaN
            src = x
            if sdt == "float16":  # widening keeps the sign bit (NaN included)
                src = self.pool.get("float32")
                b.emit(isa.VConv(src, x, n))
            wide = src.buf.dtype
            bits = self.pool.get("int64" if wide == "float64" else "int32")
            b.emit(isa.VConv(bits, src, n, "bits"))
            b.emit(isa.VCmpS("lt", dst, bits, 0, n))
            self.pool.put(bits)
            if src is not x:
                self.pool.put(src)
            return
        a = self.pool.get(sdt)
        b.emit(isa.VUnary("vabs", a, x, n))
        b.emit(isa.VCmpS("eq" if name == "isinf" else "lt", dst, a, math.inf, n))
        self.pool.put(a)

    def _sign(self, dst, x, dt: str) -> None:
        b, n = self.b, self.n
        k = np.dtype(dt).kind
        if k == "b":
            b.vcopy(dst, x, n)
            return
        pos, neg = self.pool.get("bool"), self.pool.get("bool")
        one, mone = self.const_tile(1, dt), self.const_tile(-1 if k != "u" else 0, dt)
        zero = self.const_tile(0, dt)
        b.emit(isa.VCmpS("gt", pos, x, 0, n))
        b.emit(isa.VCmpS("lt", neg, x, 0, n))
        tmp = self.pool.get(dt)
        b.emit(isa.VSel(tmp, neg, mone, zero, n))
        if k == "f":  # NaN stays NaN: sel(x > 0, 1, sel(x < 0, -1, x*0 ... )) keep x when unordered
            b.emit(isa.VCmp("ne", neg, x, x, n))
            b.emit(isa.VSel(tmp, neg, x, tmp, n))
        b.emit(isa.VSel(dst, pos, one, tmp, n))
        for r in (pos, neg, tmp):
            self.pool.put(r)


# ops lowered to one native instruction (op records' lowering `Native`): name -> instruction
_UNARY_NATIVE = {k: m.lowering.instr for k, m in ELEMENTWISE.items()
                 if m.arity == 1 and isinstance(m.lowering, Native)}  # fmt: skip
_BINARY_NATIVE = {k: m.lowering.instr for k, m in ELEMENTWISE.items()
                  if m.arity == 2 and isinstance(m.lowering, Native)}  # fmt: skip
_COMMUTATIVE_SCALAR = {"add": "vadds", "mul": "vmuls", "maximum": "vmaxs", "minimum": "vmins"}
_CMPS = COMPARISONS
_SWAP = {"eq": "eq", "ne": "ne", "lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}


_FLOAT_TESTS = ("isnan", "isinf", "isfinite", "signbit")


def _binary_native(name: str, kind: str) -> str:
    if kind == "b" and _BINARY_NATIVE.get(name) in ("vand", "vor", "vxor"):
        return _BINARY_NATIVE[name]  # bitwise_and/or/xor of bools
    if kind == "b":  # bool: the logical instruction with the same truth table
        return {"add": "vor", "mul": "vand", "maximum": "vor", "minimum": "vand",
                "sub": "vxor", "div": "vdiv"}[name]  # fmt: skip
    return _BINARY_NATIVE[name]


def _wrap_neg(val, dtype: str):
    """-val in the integer dtype's two's complement (x - c == x + (-c) with wrap-around)."""
    info = np.iinfo(dtype)
    bits = info.bits
    v = (-int(val)) & ((1 << bits) - 1)
    if info.min < 0 and v >= 1 << (bits - 1):
        v -= 1 << bits
    return v


def hoist_invariant_dups(body: list, scope: list | None = None) -> tuple[list, list]:
    """Move constant vector_dup instructions out of a tile loop body.

    A VDup is loop invariant when its buffer is written by nothing else in the body (VDups to
    distinct offsets of one buffer are fine: vmath packs coefficient tables that way) and its
    scalar is a constant. `scope` is everything that runs in the loop (default: `body`).
    Returns (hoisted, remaining body).
    """
    writers: dict[str, list] = {}
    for instr, _ in isa.walk(scope if scope is not None else body):
        refs = isa.refs_of(instr)
        if not refs or isinstance(instr, (isa.CopyOut,)):
            continue
        dst = _written(instr)
        for r in dst:
            writers.setdefault(r.buf.name, []).append(instr)
    ok = set()
    for name, ws in writers.items():
        if not all(isinstance(w, isa.VDup) and isinstance(w.scalar, (int, float)) for w in ws):
            continue
        offs = [(w.dst.off, w.n) for w in ws]
        if len(set(offs)) == len(offs):
            ok.add(name)
    hoisted = [i for i in body if isinstance(i, isa.VDup) and i.dst.buf.name in ok]
    rest = [i for i in body if not (isinstance(i, isa.VDup) and i.dst.buf.name in ok)]
    return hoisted, rest


def _written(instr) -> list:
    """Refs an instruction writes (dst-like fields)."""
    out = []
    for k in ("dst", "dst_val", "dst_idx"):
        r = getattr(instr, k, None)
        if isinstance(r, isa.Ref):
            out.append(r)
    return out


def pipeline_flags_prologue() -> list:
    """Both ping-pong buffers start free: pre-set the 'consumer done' flags (AscendC style)."""
    return [isa.SetFlag("V", "MTE2", 0), isa.SetFlag("V", "MTE2", 1),
            isa.SetFlag("MTE3", "V", 0), isa.SetFlag("MTE3", "V", 1)]  # fmt: skip


def pipeline_flags_epilogue() -> list:
    return [isa.WaitFlag("V", "MTE2", 0), isa.WaitFlag("V", "MTE2", 1),
            isa.WaitFlag("MTE3", "V", 0), isa.WaitFlag("MTE3", "V", 1)]  # fmt: skip


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def prod(xs) -> int:
    return math.prod(xs)
