"""vmath's core: the `_Seq` emitter every composite writes through, the op tables
(`COMPOSITE_OPS`, arity, the float64 and host-only sets, `CHUNK`) and the `GetValue` instruction
(a UB element into a Scalar register, for the per-chunk range branches).

The composites themselves are the family modules of this package (`trig`, `tanh`, `powmod`,
`wide`, `erf`), which import this module and nothing of each other's but what they share;
the package (`vmath/__init__.py`) dispatches to them (`emit_composite`) and holds the
out-of-line call (`VMathCall`). Split out of the one vmath module (issue 36).
"""

from __future__ import annotations

import itertools
import struct
from dataclasses import dataclass

from lazymath import settings
from lazymath.backend.npu import cost, interp, isa

NATIVE_OPS = ("vexp", "vln")


def round_f32(v: float) -> float:
    """v rounded to float32 (the float constants of float32 programs are exactly representable)."""
    return struct.unpack("f", struct.pack("f", v))[0]


COMPOSITE_OPS = ("sin", "cos", "tan", "tanh", "sigmoid", "exp2", "pow", "floor_divide",
                 "remainder", "log1p", "expm1", "log2", "log10", "sinh", "cosh", "asinh", "acosh",
                 "atanh", "hypot", "logaddexp", "asin", "acos", "atan", "atan2", "erf",
                 "erfc")  # fmt: skip
_ARITY = {"pow": 2, "floor_divide": 2, "remainder": 2, "hypot": 2, "logaddexp": 2, "atan2": 2}
# ops with no vector sequence (every dtype raises NotImplementedError here, so the templates call
# the host libm inside the fused kernel): none since asin/acos/atan/atan2 got theirs
HOST_ONLY: tuple = ()
# float64 inputs: ops whose float64 sequence is exact enough; the rest raise NotImplementedError
# so the caller falls back (host libm for trig/tanh, native vfloordiv/vmod/vpow for the others).
_F64_OPS = ("sigmoid", "pow", "tanh")
CHUNK = 256  # strip-mine width: a chunk of every scratch (~26 KB for sin) stays in L1


_UID = itertools.count()  # names of the rare out-of-pool table buffers


# ---------------------------------------------------------------------------- GetValue
@dataclass(frozen=True, slots=True)
class GetValue:
    """var = src[0]: one integer UB element (int32, uint32, int64) into a scalar register (AscendC's
    ``LocalTensor::GetValue``). Lets the Scalar unit branch on vector results (an ``If`` on
    var), e.g. a range test of a whole chunk. Precede it with set/wait_flag V->S."""

    var: isa.Var
    src: isa.Ref


isa.register_instr(GetValue, "Scalar", lambda i: f"{i.var} = get_value {i.src}")


@interp.register(GetValue)
def _interp_get_value(m, i: GetValue) -> None:
    if i.src.buf.dtype not in ("int32", "int64", "uint32"):
        raise TypeError(f"get_value reads int32/int64/uint32 elements, not {i.src.buf.dtype}")
    m.env[i.var] = int(m.view(i.src, 1)[0])


@cost.register(GetValue)
def _cost_get_value(ctx, i: GetValue):
    # the model has no data: assume the common case (small arguments, the fast branch)
    ctx.env[i.var] = 0
    return "Scalar", 1, 0.0


class _Seq:
    """Emits one composite: SSA-style helpers over recycled scratch buffers.

    Every helper allocates its destination from per-dtype free lists (`done` returns buffers),
    so a sequence of 40 instructions needs about ten chunk-sized buffers. Gather tables are
    filled before the strip-mining loop (`pre`), one vector_dup of n=1 per entry. There are no
    other constant buffers: coefficients are scalar operands (vmuls/vadds), constant 1.0 comes
    from converting a mask, so no chunk-wide vector_dup can collide with a table of another
    composite in a recycled tile when a template hoists invariant vector_dups.
    """

    def __init__(self, b: isa.Builder, chunk: int):
        self.b = b
        self.chunk = chunk
        self.n: isa.IntExpr = chunk
        self.pre: list = []
        self.body: list = []
        self.free: dict[str, list[isa.Ref]] = {}
        self.consts: dict = {}  # (dtype, value) -> chunk of that constant (vmla operands)

    # ---- buffers
    def tmp(self, dt: str) -> isa.Ref:
        lst = self.free.setdefault(dt, [])
        if lst:
            return lst.pop()
        return self.b.scratch(dt, self.chunk)

    def done(self, *refs: isa.Ref) -> None:
        for r in refs:
            self.free.setdefault(r.buf.dtype, []).append(r)

    def table(self, dt: str, values: tuple) -> isa.Ref:
        """A gather table: one chunk-sized scratch buffer (a small uniquely named one when the
        chunk is shorter than the table), filled entry by entry before the chunk loop."""
        if len(values) > self.chunk:  # tiny tiles: outside the template's pool
            r = self.b.scratch(dt, len(values), prefix=f"vmtab{next(_UID)}_")
        else:
            r = self.b.scratch(dt, self.chunk)
        for i, v in enumerate(values):
            self.pre.append(isa.VDup(r + i, v, 1))
        return r

    def const(self, dt: str, value: float) -> isa.Ref:
        """A chunk filled with `value` (an operand of vmla, which takes no scalar).

        Its own uniquely named buffer, never a recycled pool tile, filled once before the
        chunk loop: the template then hoists the fill out of the tile loop, which is only
        safe for a buffer that nothing else writes."""
        key = (dt, float(value))
        r = self.consts.get(key)
        if r is None:
            # shared with the earlier composites of the kernel's expression (`shared_consts`
            # of a template's builder): already filled, before this composite runs
            shared = getattr(self.b, "shared_consts", None)
            r = shared.get((key, self.chunk)) if shared is not None else None
            if r is None:
                r = isa.Builder.scratch(self.b, dt, self.chunk, prefix=f"vmc{next(_UID)}_")
                self.pre.append(isa.VDup(r, value, self.chunk))
                if shared is not None:
                    shared[(key, self.chunk)] = r
            self.consts[key] = r
        return r

    # ---- instructions (each returns a fresh buffer unless `out` is given)
    def _out(self, out, dt):
        return out if out is not None else self.tmp(dt)

    def bin(self, op: str, a: isa.Ref, c: isa.Ref, out=None) -> isa.Ref:
        d = self._out(out, a.buf.dtype)
        self.body.append(isa.VBinary(op, d, a, c, self.n))
        return d

    def sc(self, op: str, a: isa.Ref, s, out=None) -> isa.Ref:
        d = self._out(out, a.buf.dtype)
        self.body.append(isa.VScalar(op, d, a, s, self.n))
        return d

    def un(self, op: str, a: isa.Ref, out=None) -> isa.Ref:
        d = self._out(out, a.buf.dtype)
        self.body.append(isa.VUnary(op, d, a, self.n))
        return d

    def fma(self, a: isa.Ref, c: isa.Ref, e: isa.Ref, out=None) -> isa.Ref:
        d = self._out(out, a.buf.dtype)
        self.body.append(isa.VFma(d, a, c, e, self.n))
        return d

    def conv(self, a: isa.Ref, dt: str, mode: str = "trunc", out=None) -> isa.Ref:
        d = self._out(out, dt)
        self.body.append(isa.VConv(d, a, self.n, mode))
        return d

    def cmps(self, cmp: str, a: isa.Ref, s, out=None) -> isa.Ref:
        d = self._out(out, "bool")
        self.body.append(isa.VCmpS(cmp, d, a, s, self.n))
        return d

    def cmp(self, cmp: str, a: isa.Ref, c: isa.Ref, out=None) -> isa.Ref:
        d = self._out(out, "bool")
        self.body.append(isa.VCmp(cmp, d, a, c, self.n))
        return d

    def sel(self, m: isa.Ref, a: isa.Ref, c: isa.Ref, out=None) -> isa.Ref:
        d = self._out(out, a.buf.dtype)
        self.body.append(isa.VSel(d, m, a, c, self.n))
        return d

    def gather(self, table: isa.Ref, idx: isa.Ref, out=None) -> isa.Ref:
        d = self._out(out, table.buf.dtype)
        self.body.append(isa.VGather(d, table, idx, self.n))
        return d

    def horner_fma(self, z: isa.Ref, coeffs: tuple, out=None) -> isa.Ref:
        """coeffs[0] + z*(coeffs[1] + ...) with one vmla per step (coefficient chunks)."""
        k = [self.const(z.buf.dtype, c) for c in coeffs]
        p = self.fma(z, k[-1], k[-2], out=out)
        for kc in reversed(k[:-2]):
            self.fma(p, z, kc, out=p)
        return p

    def horner(self, z: isa.Ref, coeffs: tuple, out=None) -> isa.Ref:
        """coeffs[0] + z*(coeffs[1] + ...) as vmuls/vadds then vmul/vadds pairs (out != z)."""
        p = self.sc("vmuls", z, coeffs[-1], out=out)
        self.sc("vadds", p, coeffs[-2], out=p)
        for co in reversed(coeffs[:-2]):
            self.bin("vmul", p, z, out=p)
            self.sc("vadds", p, co, out=p)
        return p


def host_math_enabled() -> bool:
    """LAZYMATH_HOST_MATH: float32/float16 sin, cos and tan reduce in float64 (a faster
    host-only lowering, not what an NPU can run). Default: float32 instructions only."""
    return settings.HOST_MATH.get()


def _wide(s: _Seq, srcs: tuple) -> tuple:
    return tuple(s.conv(r, "float64") for r in srcs)


def _narrow(s: _Seq, r: isa.Ref, dst: isa.Ref, *free: isa.Ref) -> None:
    s.conv(r, dst.buf.dtype, out=dst)
    s.done(r, *free)
