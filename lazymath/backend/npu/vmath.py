"""Vector math library: composite transcendentals as NPU programs.

On the NPU only ``vexp`` and ``vln`` are instructions; AscendC builds sin, cos, tanh, ... from
native vector instructions (range reduction + polynomial) over scratch buffers. lazymath mirrors
that split: the host's scalar bodies of ``vexp``/``vln`` are LLVM functions in the host mapping
(`backend.host.vmath_native.define_native`), and this module, device-side, has

- `emit_composite(b, op, dst, srcs, n, dtype, cap=...)`: appends native vector instructions for
  sin, cos, tan, tanh, sigmoid, exp2, pow, floor_divide and remainder to an `isa.Builder`.

Accuracy contract (measured by tests/backend/test_vmath.py over the whole float32 range):
float32 log is correctly rounded; exp, sin, cos, tan, tanh, exp2 and float32 pow are faithful
(within 1 ulp of the correctly rounded value, 97-99.6% of them correctly rounded), sigmoid
within 2; floor_divide and remainder match numpy bit for bit; IEEE special values (inf, nan,
-0.0, denormals) match numpy. numpy's own float32 results are up to 4 (log), 2 (exp) and 1-2
(sin, cos, tan, tanh) ulp off, so the distance to numpy stays within 4 ulp.

dtypes: float32 everywhere; float16 is computed in float32 (vconv in and out, chunk by chunk);
float64 has native exp/log and composite tanh (faithful), sigmoid and pow; the other float64
composites raise NotImplementedError so the caller falls back (host libm for trig/tanh, the
native vfloordiv/vmod for floor_divide/remainder, which are exact).

Requirements on the consumers: IEEE semantics per instruction (no fast-math flags: no
reassociation, contraction, nnan/ninf/nsz), vfma fused (one rounding), vrint ties-to-even,
vshr arithmetic on int32, vconv 'bits' a reinterpretation, vgather indices relative to the
table Ref's offset.

Why the float32 trigonometric reduction is done in float64 with a table: sin of 1e30 needs
x * 2/pi mod 2 to ~60 significant bits whatever the exponent of x. Writing |x| = M * 2^(16g)
with M < 2^40, the table holds T(g) = 2^(16g)/pi mod 2 as two doubles (f0 + f1, 106 bits) per
exponent group g; M * f0 is made exact with an fma two-product and M * f1 is tiny, so two
gathers, ~12 float64 instructions and no branch give a reduction that is exact enough for every
float32 (a Payne-Hanek reduction in floating point). Gathers are slow on the host (LLVM
scalarizes them), and arguments are almost always small, so sin/cos/tan branch once per
256-element chunk: one fused pass takes max|x| (vcmax of the bits << 1), the Scalar unit reads
it (`GetValue`) and an `If` picks the gather-free reduction when every |x| < 2^17 (1/pi split in
28 + 28 + 53 bits: x*A and x*B exact, two fmas) or the table path otherwise. q is rounded with
the 1.5*2^52 magic add, whose last mantissa bit is q's parity: the sign (-1)^q is an xor on v.

The polynomials were fitted with a Remez exchange (mpmath, 60 digits) on the stated intervals;
their relative approximation error is given next to each table.
"""

from __future__ import annotations

import itertools
import math
import struct
from dataclasses import dataclass

from lazymath import settings
from lazymath.backend.npu import cost, interp, isa
from lazymath.backend.npu.tiles import TileBuilder, TilePool

__all__ = [
    "COMPOSITE_OPS",
    "GetValue",
    "NATIVE_OPS",
    "composite_instructions",
    "composite_scratch_bytes",
    "emit_composite",
]

NATIVE_OPS = ("vexp", "vln")

# ============================================================================ polynomial tables
# sin(pi*v) = v * P(v^2), |v| <= 1/2, evaluated in float64 for float32 results: rel err 2^-27.5
SINPI5 = (3.1415926368260165, -5.167709674619445, 2.550069495752363, -0.5982404749746734,
          0.07755672950425486)  # fmt: skip
# tanh(x) = x + x^3 * P(x^2), |x| <= 0.9: rel err 2^-28.9
TANH_F32 = (-0.33333326179376244, 0.13333038976432698, -0.053932168951929614,
            0.02166840376079804, -0.008265123828144894, 0.00257686328604273,
            -0.000451494938257242)  # fmt: skip
# float64 tanh on the same interval (weighted least squares on Chebyshev nodes)
TANH_F64 = (-0.33333333333332965, 0.1333333333329268, -0.05396825395237456,
            0.021869488220560084, -0.008863231789029726, 0.0035920991592119657,
            -0.001455681217526506, 0.0005894500928657519, -0.00023755068890290098,
            9.375188056316518e-05, -3.46161336862638e-05, 1.087883674448358e-05,
            -2.4674778847350636e-06, 2.8902965288029593e-07)  # 2^-56.4, least squares  # fmt: skip
TANH_SMALL = 0.9  # below: the polynomial; above: 1 - 2 / (exp(2|x|) + 1)
# erf(x) = x * P(2x^2 - 1), |x| < 1, for float32 results evaluated in float64 (Chebyshev fit of
# erf(sqrt z)/sqrt z on z in [0, 1], mpmath at 40 digits): rel err 2^-46
ERF_SMALL = (0.9654687386698853, -0.14053608902272158, 0.019852496688084677,
             -0.002285485561060548, 0.00021751716323205794, -1.753716990441167e-05,
             1.2233626131615415e-06, -7.511463812306051e-08, 4.13878049391222e-09,
             -2.0457396616031867e-10)  # fmt: skip
# erfc(x) = exp(-x^2) * t * Q(s), 1 <= x <= ERFC_CLAMP, t = 1/x, s = t mapped from
# [1/ERFC_CLAMP, 1] to [-1, 1] (Chebyshev fit of x*exp(x^2)*erfc(x), the scaled complementary
# error function, which is smooth in 1/x): rel err 2^-33 (1e-4 of a float32 ulp)
ERFC_BIG = (0.5027581520241795, -0.0768760145318114, -0.004311887342642332,
            0.00919141318939873, -0.004087997354835831, 0.0009437329896098645,
            0.00011030691738696683, -0.0002506149863017829, 0.0001516467709657974,
            -5.798901087149584e-05, 1.6024659845766518e-05, 1.711705755482403e-06,
            -1.2358485088843313e-05, 8.419333243945663e-06, 3.745239014761174e-07,
            -1.3442726010084225e-06)  # fmt: skip
# float32 erfc(x) underflows to 0 from x = 10.06 on: beyond the clamp exp(-x^2) * Q(clamp) is
# below every float32 (and erf is 1), so the fit interval ends here
ERFC_CLAMP = 10.5


# ============================================================================ composites


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

# Trigonometric reduction tables, groups g = 9..15 of the biased exponent >> 4 (g < 9 share the
# g = 9 entry): F0 + F1 = (2^(16g-150) * unit mod 2) * 2^-(16g-150) as two doubles, unit = 1/pi
# (half turns) or 2/pi (quarter turns). Verified against mpmath in the tests.
_TRIG_G0 = 9
_HALF_F0 = (0.3183098861837907, 0.0019036361837906715, 1.284127663345183e-08,
            1.209391198562356e-13, 1.138005036539198e-18, 1.6271903045673365e-23,
            1.3250202406673238e-27)  # fmt: skip
_HALF_F1 = (-1.9678676675182486e-17, 5.3802864053693746e-20, -2.7170920538718753e-25,
            1.2355694379560215e-29, 8.34143383430412e-35, 1.2592086916704748e-39,
            5.794356676714072e-44)  # fmt: skip
_QUARTER_F0 = (0.6366197723675814, 0.001854147367581343, 2.568255326690366e-08,
               2.418782397124712e-13, 2.276010073078396e-18, 3.254380609134673e-23,
               1.0344533474420156e-27)  # fmt: skip
_QUARTER_F1 = (-3.935735335036497e-17, 1.0760572810738749e-19, -5.434184107743751e-25,
               2.471138875912043e-29, 1.668286766860824e-34, 2.5184173833409495e-39,
               -6.347906989929515e-44)  # fmt: skip

# Small arguments, |x| < 2^17 (TRIG_SMALL): unit = A + B + C with A, B of 28 significant bits,
# so x*A and x*B are exact in float64 for any float32 x; C carries the next 53 bits. No table
# and no gather: the reduction is five float64 instructions. A chunk takes this path when the
# largest |x| in it (one vcmax) is below the bound; otherwise the table reduction above.
_HALF_ABC = (0.3183098863810301, -1.972394114355125e-10, 2.7064329855079464e-19)
_QUARTER_ABC = (0.6366197727620602, -3.94478822871025e-10, 5.412865971015893e-19)
# |x| < 2^17 with q from elsewhere: x*A - q is exact, so the rest of 1/pi fits one double
# (B + C rounded, 2^-86 off: under 2^-69 absolute for |x| < 2^17, 2^-38 relative to the
# smallest |v|): v = fma(x, BC, fma(x, A, -q)), two fmas.
_HALF_BC = -1.972394111648692e-10
TRIG_SMALL_BITS = 0x48000000  # float32 bits of 2^17: |x| below it has table group < 9


def _signed_table(f0s: tuple, f1s: tuple) -> tuple:
    """32 gather entries at g + 8, g = (bits(x) << 1) >> 28 (arithmetic shift) in [-8, 7]:
    g = e >> 4 for e < 128 and e >> 4 - 16 above, e the biased exponent. Groups below 9 use the
    entry of group 9 (plain 1/pi, 2/pi: no whole periods to drop yet)."""

    def col(fs: tuple) -> tuple:
        return tuple(fs[max(gp, _TRIG_G0) - _TRIG_G0] for gp in (*range(8, 16), *range(8)))

    return col(f0s) + col(f1s)


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


def _check_srcs(op: str, srcs: tuple) -> None:
    if len(srcs) != _ARITY.get(op, 1):
        raise ValueError(f"vmath {op}: expected {_ARITY.get(op, 1)} sources, got {len(srcs)}")


def emit_composite(
    b: isa.Builder,
    op: str,
    dst: isa.Ref,
    srcs: tuple,
    n: isa.IntExpr,
    dtype: str,
    *,
    cap: int | None = None,
    host_math: bool | None = None,
) -> None:
    """Append native vector instructions computing dst[:n] = op(*srcs)[:n] in `dtype`.

    `cap` is the static upper bound of `n` (the tile; default ``b.tile``). Work is strip-mined
    in chunks of `CHUNK` elements so the scratch buffers (each `min(cap, CHUNK)` elements,
    from ``b.scratch``) stay in L1 between instructions. float16 is computed in float32 chunk
    by chunk (vconv in and out). Raises NotImplementedError for an (op, dtype) it does not
    expand, so the caller can fall back to a host or native instruction. `host_math` (default:
    the LAZYMATH_HOST_MATH setting) picks the float64 reduction of float32 sin/cos/tan.
    """
    if op not in COMPOSITE_OPS:
        raise NotImplementedError(f"vmath has no composite for {op!r}")
    if dtype not in ("float16", "float32", "float64"):
        raise NotImplementedError(f"vmath {op}: dtype {dtype} (floats only)")
    if dtype == "float64" and op not in _F64_OPS:
        raise NotImplementedError(f"vmath {op}: float64 is left to the host fallback")
    if op in HOST_ONLY:
        raise NotImplementedError(f"vmath {op}: no vector sequence yet (host libm)")
    _check_srcs(op, srcs)
    cap = cap or b.tile
    if not cap:
        raise ValueError("vmath.emit_composite needs cap (static bound of n) or b.tile")
    if host_math is None:
        host_math = host_math_enabled()
    chunk = min(int(cap), CHUNK)
    s = _Seq(b, chunk)
    if chunk >= cap:  # one chunk: no loop
        s.n = n
        _emit_chunk(s, op, dst, srcs, dtype, host_math)
        b.body.extend(s.pre)
        b.body.extend(s.body)
        return
    var = isa.Var(f"vm{len(b.body)}")
    s.n = isa.imin(chunk, isa.sub(n, var))
    _emit_chunk(s, op, dst + var, tuple(r + var for r in srcs), dtype, host_math)
    b.body.extend(s.pre)
    b.emit(isa.Loop(var, 0, n, chunk, tuple(s.body)))


def composite_scratch_bytes(op: str, dtype: str, cap: int) -> int:
    """UB bytes the scratch buffers of one `emit_composite` call take (for tiling decisions)."""
    b = isa.Builder(tile=cap)
    src = b.scratch(dtype, cap)
    srcs = (src,) * _ARITY.get(op, 1)
    before = len(b.buffers)
    emit_composite(b, op, src, srcs, cap, dtype, cap=cap)
    return sum(buf.nbytes for buf in b.buffers[before:])


def composite_instructions(op: str, dtype: str = "float32") -> int:
    """Instructions per chunk of `op` on its common path (the constant set-up before the loop
    excluded; of a range branch only the first, small-argument, body is counted)."""
    chunk = CHUNK
    s = _Seq(isa.Builder(tile=chunk), chunk)
    src = isa.Ref(isa.Buffer("x", "UB", dtype, chunk))
    _emit_chunk(s, op, src, (src,) * _ARITY.get(op, 1), dtype)
    ifs = [i for i in s.body if isinstance(i, isa.If)]
    rest = [i for i in s.body if not isinstance(i, isa.If)]
    return len(rest) + (len(ifs[0].body) if ifs else 0)


def _emit_chunk(s: _Seq, op: str, dst: isa.Ref, srcs: tuple, dtype: str,
                host_math: bool = False) -> None:  # fmt: skip
    """One chunk: float16 goes through float32 scratch; others write dst directly.

    sin/cos/tan of float32 branch per chunk on its largest |x| (see `_trig_by_range`);
    float16 arguments are always below the small-argument bound (|x| <= 65504 < 2^17)."""
    if dtype != "float16":
        if op in _TRIG_NPU:
            _trig_by_range(s, op, dst, srcs[0], _trig_table(host_math))
            return
        _OPS[op](s, dst, srcs, dtype)
        return
    wide = tuple(s.conv(r, "float32") for r in srcs)
    out = s.tmp("float32")
    if op in _TRIG_NPU:
        _trig_table(host_math)[op](s, out, wide[0], True)
    else:
        _OPS[op](s, out, wide, "float32")
    s.conv(out, "float16", out=dst)
    s.done(out, *wide)


def _trig_by_range(s: _Seq, op: str, dst: isa.Ref, x: isa.Ref, trig: dict) -> None:
    """if max|x| of the chunk < 2^17: table-free reduction, else the exact table reduction.

    One fused pass (vabs + vcmax) finds the largest |x| (NaN propagates, so inf/nan chunks go
    to the exact path), the Scalar unit reads its bits (GetValue) and branches. Each branch
    gets its own scratch buffers, so neither keeps the other's temporaries in UB (the lowering
    drops stores to buffers nothing else reads: both branches stay in registers).
    """
    mx = s.tmp("uint32")
    s.body.append(isa.VDup(mx, 0, 1))  # first: the n=1 fill would split the fused pass below
    bits = s.conv(x, "uint32", "bits")
    s.sc("vshl", bits, 1, out=bits)  # |x| bits << 1: unsigned order = order of |x|, nan last
    s.body.append(isa.VReduce("vcmax", mx, bits, s.n))
    var = isa.Var(f"vmax{next(_UID)}")
    s.body += [isa.SetFlag("V", "S", 0), isa.WaitFlag("V", "S", 0), GetValue(var, mx)]
    fast = _Seq(s.b, s.chunk)
    fast.n, fast.consts = s.n, s.consts
    trig[op](fast, dst, x, True)
    slow = _Seq(s.b, s.chunk)
    slow.n, slow.consts = s.n, s.consts
    trig[op](slow, dst, x, False)
    s.pre += fast.pre + slow.pre
    s.body += [isa.If(var, "<", 2 * TRIG_SMALL_BITS, tuple(fast.body)),
               isa.If(var, ">=", 2 * TRIG_SMALL_BITS, tuple(slow.body))]  # fmt: skip


# ---------------------------------------------------------------------------- trigonometry
def _reduce(s: _Seq, x: isa.Ref, f0s: tuple, f1s: tuple) -> tuple[isa.Ref, isa.Ref]:
    """x * unit as hi + w for float32 x, hi + w == x*unit (mod 2) to ~2^-65 (float64 each).

    |x| = M * 2^(16g-150) with M < 2^39 an integer, g = biased exponent >> 4. With
    F = T(g) * 2^-(16g-150) from the table, x * F0 = +-M * f0 (|.| < 2^40) is split exactly
    into hi + lo by an fma two-product, and x * F1 = +-M * f1 (< 2^-13) rounds harmlessly;
    w = lo + x*F1. The caller takes q = rint(hi + w) and v = (hi - q) + w: hi - q is exact.
    """
    g = s.conv(x, "int32", "bits")
    s.sc("vshl", g, 1, out=g)  # drop the sign
    s.sc("vshr", g, 28, out=g)  # (biased exponent >> 4) - 16 * (exponent >= 128), in [-8, 7]
    s.sc("vadds", g, 8, out=g)  # table position, in [0, 15]
    tab = s.table("float64", _signed_table(f0s, f1s))
    xd = s.conv(x, "float64")
    f0 = s.gather(tab, g)
    f1 = s.gather(tab + 16, g)
    s.done(g)
    hi = s.bin("vmul", xd, f0)
    nhi = s.un("vneg", hi)
    lo = s.fma(xd, f0, nhi, out=f0)  # exact: the rounding error of hi
    s.done(nhi)
    w = s.bin("vmul", xd, f1, out=f1)
    s.bin("vadd", lo, w, out=w)
    s.done(lo, xd)
    return hi, w


_MAGIC = 1.5 * 2.0**52  # y + _MAGIC rounds y to an integer (|y| < 2^51); its last bit = parity


def _reduce_qv(s: _Seq, x: isa.Ref, unit: str, small: bool, shift: bool = False):
    """qb = q + 1.5*2^52 with q = rint(x*unit [+ 1/2]), and v = x*unit - q [+ 1/2] (float64).

    The magic constant does the rounding (ties to even, like rint) and leaves q's parity in
    the last mantissa bit of qb (`_parity_sign`, `_odd_bits`): no rint, no mask packing.
    `small` (every |x| < 2^17, or inf/nan): unit = A + B + C, hi = x*A exact; then
    y = fma(x, B, hi), d = hi - q exact, v = fma(x, C, fma(x, B, d)): each fma rounds once
    relative to v, so v keeps ~2^-52 relative accuracy even for the float32 closest to a
    multiple of pi (|v| > 2^-31 below 2^17). Otherwise the table reduction `_reduce` (its
    |y| < 2^40). `shift` (cos): q = rint(x*unit + 1/2), v = x*unit - (q - 1/2).
    """
    if not small:
        f0s, f1s = (_HALF_F0, _HALF_F1) if unit == "half" else (_QUARTER_F0, _QUARTER_F1)
        hi, w = _reduce(s, x, f0s, f1s)
        qb = s.bin("vadd", hi, w)
    else:
        a, bb, c = _HALF_ABC if unit == "half" else _QUARTER_ABC
        xd = s.conv(x, "float64")
        hi = s.sc("vmuls", xd, a)
        kb = s.const("float64", bb)
        qb = s.fma(xd, kb, hi)
    if shift:
        s.sc("vadds", qb, 0.5, out=qb)
    s.sc("vadds", qb, _MAGIC, out=qb)
    q = s.sc("vadds", qb, -_MAGIC)
    if shift:
        s.sc("vadds", q, -0.5, out=q)
    v = s.bin("vsub", hi, q, out=q)
    if not small:
        s.bin("vadd", v, w, out=v)
        s.done(hi, w)
        return qb, v
    s.fma(xd, kb, v, out=v)
    s.fma(xd, s.const("float64", c), v, out=v)
    s.done(hi, xd)
    return qb, v


def _parity_sign(s: _Seq, qb: isa.Ref) -> isa.Ref:
    """int64 with only the sign bit set where q (qb = q + 1.5*2^52) is odd."""
    sb = s.conv(qb, "int64", "bits")
    s.sc("vshl", sb, 63, out=sb)
    return sb


def _odd_bits(s: _Seq, qb: isa.Ref) -> isa.Ref:
    """Mask of odd q from qb = q + 1.5*2^52."""
    sb = _parity_sign(s, qb)
    m = s.cmps("lt", sb, 0)
    s.done(sb)
    return m


def _sinpi(s: _Seq, v: isa.Ref, out=None) -> isa.Ref:
    """sin(pi*v) for |v| <= 1/2 in float64 with float32 accuracy: v * P(v^2)."""
    z = s.bin("vmul", v, v)
    p = s.horner_fma(z, SINPI5)
    s.done(z)
    return s.bin("vmul", v, p, out=p if out is None else out)


def _sincos32(s: _Seq, dst: isa.Ref, x: isa.Ref, op: str, small: bool = False) -> None:
    """sin / cos of float32 x: exact half-turn reduction and polynomial in float64.

    x/pi = q + v with q = rint(x/pi), |v| <= 1/2: sin(x) = (-1)^q sin(pi*v).
    cos(x) = sin(pi*(x/pi + 1/2)): q = rint(x/pi + 1/2), v = (hi - (q - 1/2)) + w.
    One rounding to float32 at the end (faithful, mostly correctly rounded); the sign (-1)^q
    flips v's sign bit (an xor) before the odd polynomial. sin(+-0) = +-0 by a final select
    (the reduction's additions would turn -0 into +0); denormals are exact in float64; inf and
    nan give nan.
    `small`: every |x| < 2^17 (or inf/nan), reduced without the table (`_sincos_small`).
    """
    if small:
        _sincos_small(s, dst, x, op)
        return
    qb, v = _reduce_qv(s, x, "half", small, shift=op == "cos")
    sb = _parity_sign(s, qb)  # sin(pi*(-v)) = -sin(pi*v) exactly (odd polynomial)
    s.done(qb)
    vb = s.conv(v, "int64", "bits")
    s.bin("vxor", vb, sb, out=vb)
    s.conv(vb, "float64", "bits", out=v)
    s.done(vb, sb)
    res = _sinpi(s, v, out=v)
    if op == "sin":
        rf = s.conv(res, "float32")
        zero = s.cmps("eq", x, 0.0)
        s.sel(zero, x, rf, out=dst)
        s.done(zero, rf)
    else:
        s.conv(res, "float32", out=dst)
    s.done(res)


_INVPI32 = round_f32(1.0 / math.pi)
_MAGIC32 = 1.5 * 2.0**23  # float32 twin of _MAGIC: rounds |t| < 2^22 to an integer


def _sincos_small(s: _Seq, dst: isa.Ref, x: isa.Ref, op: str) -> None:
    """sin / cos for |x| < 2^17 (inf/nan give nan): q in float32, v exact in float64.

    q = rint(x * float32(1/pi) [+ 1/2]) at 8 float32 lanes (magic add; its last bit is the
    parity, applied as an xor on the float32 result). q may be the neighbour of the exact
    rint(x/pi) when x/pi is within 2^-8.6 of a half-integer; v then reaches 1/2 + 2^-8.6, where
    the polynomial's error grows to 2^-26.9 (still faithful after the float32 rounding). v is
    accurate whatever q: d = fma(x, A, -q [+ 1/2]) is exact (x*A has 52 bits, |d| < 0.51), then
    v = fma(x, BC, d) rounds once relative to v (`_HALF_BC`).
    """
    t = s.sc("vmuls", x, _INVPI32)
    if op == "cos":
        s.sc("vadds", t, 0.5, out=t)
    s.sc("vadds", t, _MAGIC32, out=t)
    sign = s.conv(t, "int32", "bits")
    s.sc("vshl", sign, 31, out=sign)  # (-1)^q as the float32 sign bit
    s.sc("vmuls", t, -1.0, out=t)
    s.sc("vadds", t, _MAGIC32, out=t)  # -q, exact
    if op == "cos":
        s.sc("vadds", t, 0.5, out=t)  # -(q - 1/2), exact
    v = s.conv(t, "float64")
    s.done(t)
    xd = s.conv(x, "float64")
    s.fma(xd, s.const("float64", _HALF_ABC[0]), v, out=v)  # x*A - q: exact
    s.fma(xd, s.const("float64", _HALF_BC), v, out=v)
    s.done(xd)
    res = _sinpi(s, v, out=v)
    rb = s.conv(res, "float32")
    s.done(res)
    bits = s.conv(rb, "int32", "bits")
    s.bin("vxor", bits, sign, out=bits)
    s.done(sign)
    if op == "sin":
        s.conv(bits, "float32", "bits", out=rb)
        zero = s.cmps("eq", x, 0.0)
        s.sel(zero, x, rb, out=dst)
        s.done(zero)
    else:
        s.conv(bits, "float32", "bits", out=dst)
    s.done(bits, rb)


def _tan32(s: _Seq, dst: isa.Ref, x: isa.Ref, small: bool = False) -> None:
    """tan of float32 x: quarter-turn reduction x*2/pi = q + v, y = pi/2 * v.

    tan(y) = sin(pi*h)/cos(pi*h) with h = v/2, cos(pi*h) = sin(pi*(1/2 - |h|)) (exact
    argument); odd q gives -cot(y) = -cos/sin. All in float64, one rounding at the end.
    """
    q, h = _reduce_qv(s, x, "quarter", small)  # q: the magic-shifted qb
    s.sc("vmuls", h, 0.5, out=h)
    sn = _sinpi(s, h)
    c = s.un("vabs", h)
    s.sc("vmuls", c, -1.0, out=c)
    s.sc("vadds", c, 0.5, out=c)
    cs = _sinpi(s, c, out=c)
    s.done(h)
    odd = _odd_bits(s, q)
    s.done(q)
    ncs = s.un("vneg", cs)
    num = s.sel(odd, ncs, sn)
    s.done(ncs)
    den = s.sel(odd, sn, cs)
    s.done(sn, cs, odd)
    s.bin("vdiv", num, den, out=num)
    s.done(den)
    res = s.conv(num, "float32")
    s.done(num)
    zero = s.cmps("eq", x, 0.0)
    s.sel(zero, x, res, out=dst)
    s.done(zero, res)


def _op_sin(s, dst, srcs, dt):
    _sincos32(s, dst, srcs[0], "sin")


def _op_cos(s, dst, srcs, dt):
    _sincos32(s, dst, srcs[0], "cos")


def _op_tan(s, dst, srcs, dt):
    _tan32(s, dst, srcs[0])


# float32 trigonometry by argument range, host-only lowering (LAZYMATH_HOST_MATH=1): the
# reduction and the polynomial in float64 vector instructions. fn(s, dst, x, small)
_TRIG_HOST = {
    "sin": lambda s, d, x, small: _sincos32(s, d, x, "sin", small),
    "cos": lambda s, d, x, small: _sincos32(s, d, x, "cos", small),
    "tan": _tan32,
}


# ---------------------------------------------------------------------------- float32-only trig
# What an NPU runs (the default): every instruction on float32, int32 and bool (the Vector
# unit of both presets has no float64). x = q*pi/2 + r, |r| <= pi/4 (+ 0.012 from rounding q),
# r = rh + rl a float32 pair; sin(r) and cos(r) from short polynomials with the leading terms
# exact (fma two-products, Fast2Sum), the quadrant q mod 4 picks and signs them; tan divides
# the two pairs. Reduction below 2^17: Cody-Waite with pi/2 in three float32 parts
# (_cw_reduce); above (and inf/nan): Payne-Hanek with 2/pi in 24-bit integer chunks
# (_ph_reduce). Accuracy (tests/backend/test_vmath.py): faithful, <= 1 ulp from the correctly
# rounded result over the whole float32 range, like the float64 lowering.
_PIO2_1 = 1.5707963705062866  # float32(pi/2)
_PIO2_2 = -4.371138828673793e-08  # float32(pi/2 - _PIO2_1)
_PIO2_3 = -1.7151245100058819e-15  # float32(pi/2 - _PIO2_1 - _PIO2_2)
_TWO_OVER_PI32 = round_f32(2.0 / math.pi)
# sin(r) = r + r^3 S(z), cos(r) = 1 - z/2 + z^2 C(z), z = r^2, |r| <= 0.8; least squares on
# Chebyshev nodes, coefficients rounded to float32 one by one (the rest refitted): relative
# error 2^-31.8 (sin), 2^-36.7 (cos).
SIN_F32 = (-0.1666666716337204, 0.008333380334079266, -0.00019853407866321504,
           2.8351244054647395e-06)  # fmt: skip
COS_F32 = (0.0416666679084301, -0.0013888971880078316, 2.4818689780659042e-05,
           -2.8548427621899464e-07)  # fmt: skip
# 2/pi in 24-bit chunks: chunk k holds the bits 24(k-1)+1 .. 24k after the binary point
# (chunk 0: the zeros before it). Verified against mpmath in the tests.
TWO_OVER_PI_24 = (0, 10680707, 7228996, 1387004, 2578385, 16069853, 12639074, 9804092,
                  4427841, 16666979, 11263675, 12935607)  # fmt: skip
_TRIG_SMALL = 2.0**17  # = TRIG_SMALL_BITS as a float


def _two_sum(s: _Seq, a: isa.Ref, c: isa.Ref) -> tuple[isa.Ref, isa.Ref]:
    """(hi, err) with hi = fl(a + c), hi + err = a + c exactly (Knuth, six instructions)."""
    hi = s.bin("vadd", a, c)
    bb = s.bin("vsub", hi, a)
    ab = s.bin("vsub", hi, bb)
    s.bin("vsub", a, ab, out=ab)
    t = s.bin("vsub", c, bb, out=bb)
    s.bin("vadd", ab, t, out=ab)
    s.done(t)
    return hi, ab


def _cw_reduce(s: _Seq, x: isa.Ref) -> tuple[isa.Ref, isa.Ref, isa.Ref]:
    """(qi, rh, rl) for |x| < 2^17: x = q*pi/2 + rh + rl, the low two bits of int32 qi = q mod 4.

    q = rint(x * float32(2/pi)) by the 1.5*2^23 magic add (qi: its bits). pi/2 = Q1+Q2+Q3:
    r1 = x - q*Q1 is exact in the fma (r1 and q*Q1 are multiples of 2^-24, |r1| < 1);
    a = -q*Q2 rounded, with its error from a second fma; Fast2Sum(r1, a) is exact (r1 is a
    multiple of ulp(a)); q*Q3 and the errors go to rl. Absolute error ~q * 2^-72, relative to
    r at most 2^-29 below 2^17 (the float32 nearest a multiple of pi/2 there: |r| > 2^-27.9).
    """
    qm = s.sc("vmuls", x, _TWO_OVER_PI32)
    s.sc("vadds", qm, _MAGIC32, out=qm)
    q = s.sc("vadds", qm, -_MAGIC32)
    qi = s.conv(qm, "int32", "bits")  # 2^22 + q in the mantissa: low bits = q mod 4
    s.done(qm)
    nq = s.sc("vmuls", q, -1.0)
    r1 = s.fma(nq, s.const("float32", _PIO2_1), x)
    a = s.sc("vmuls", nq, _PIO2_2)
    en = s.fma(q, s.const("float32", _PIO2_2), a)  # a - (-q*Q2): a's rounding error
    s.done(q)
    rh = s.bin("vadd", r1, a)
    z = s.bin("vsub", rh, r1)
    s.bin("vsub", a, z, out=z)  # Fast2Sum error of r1 + a
    s.done(a, r1)
    rl = s.bin("vsub", z, en, out=z)
    s.done(en)
    s.fma(nq, s.const("float32", _PIO2_3), rl, out=rl)
    s.done(nq)
    return qi, rh, rl


def _ph_reduce(s: _Seq, x: isa.Ref) -> tuple[isa.Ref, isa.Ref, isa.Ref]:
    """(qi, rh, rl) like `_cw_reduce` for every float32 x (Payne-Hanek where |x| >= 2^17).

    |x| = m * 2^e, m in [1, 2). Bits of 2/pi before position e - 24 give multiples of 4
    (dropped); W0..W3 are the next four 24-bit windows of 2/pi, cut from the chunk table with
    int32 shifts (one gather per chunk). With m2 = 2m (24 bits, exact):
    x*2/pi = m2*W0 + m2*W1*2^-24 + m2*W2*2^-48 + m2*W3*2^-72 (mod 4). Each product is split
    exactly by an fma; integer parts are removed while the sums are still exact (every
    partial sum there is a multiple of 2^-22 below 2^2), the low parts are added with TwoSum,
    so v = x*2/pi - q is a float32 pair with absolute error ~2^-67. r = v*pi/2 (a pair).
    Elements below 2^17 take `_cw_reduce`'s result; inf/nan give nan.
    """
    sq, srh, srl = _cw_reduce(s, x)
    ax = s.un("vabs", x)
    ab = s.conv(ax, "int32", "bits")
    ef = s.sc("vshr", ab, 23)
    t = s.conv(ef, "float32")
    s.done(ef)
    s.sc("vmaxs", t, 127.0 + 17, out=t)  # (small |x|: any in-range window, result unused)
    s.sc("vmins", t, 254.0, out=t)  # (inf/nan: likewise; nan comes in at the end)
    s.sc("vadds", t, -127.0 - 25, out=t)  # t = e - 25 = (first window position) - 1
    jf = s.sc("vmuls", t, round_f32(1.0 / 24))
    s.un("vfloor", jf, out=jf)  # t // 24 (t in [-8, 102]: float32 1/24 is close enough)
    of = s.sc("vmuls", jf, -24.0)
    s.bin("vadd", of, t, out=of)  # offset of the window in its chunk, 0..23
    j = s.conv(jf, "int32")
    s.sc("vadds", j, 1, out=j)  # chunk 0 is the zero padding
    o = s.conv(of, "int32")
    s.sc("vmuls", of, -1.0, out=of)
    s.sc("vadds", of, 24.0, out=of)
    o2 = s.conv(of, "int32")
    s.done(jf, of, t)
    tab = s.table("int32", TWO_OVER_PI_24)
    g = [s.gather(tab + k, j) for k in range(5)]
    s.done(j)
    mask = s.const("int32", 0xFFFFFF)
    w = []
    for k in range(4):
        hi = s.bin("vshl", g[k], o)
        lo = s.bin("vshr", g[k + 1], o2)
        s.bin("vor", hi, lo, out=hi)
        s.bin("vand", hi, mask, out=hi)
        wf = s.conv(hi, "float32")
        s.done(hi, lo)
        if k:
            s.sc("vmuls", wf, 2.0 ** (-24 * k), out=wf)
        w.append(wf)
    s.done(*g, o, o2)
    mb = s.bin("vand", ab, s.const("int32", 0x7FFFFF))
    s.bin("vor", mb, s.const("int32", 0x40000000), out=mb)
    m2 = s.conv(mb, "float32", "bits")  # 2m in [2, 4): 24 bits, a multiple of 2^-22
    s.done(mb, ab)
    nm2 = s.sc("vmuls", m2, -1.0)
    # top window: m2*W0 = h0 - d0 exactly, < 2^26
    h0 = s.bin("vmul", m2, w[0])
    d0 = s.fma(nm2, w[0], h0)
    f = s.sc("vmuls", h0, 0.25)
    s.un("vfloor", f, out=f)
    s.fma(f, s.const("float32", -4.0), h0, out=h0)  # h0 mod 4 (exact)
    n0 = s.un("vrint", h0, out=f)
    s.bin("vsub", h0, n0, out=h0)  # in [-1/2, 1/2], a multiple of 2^-22
    s.bin("vsub", h0, d0, out=h0)  # + the product's low part (|.| <= 2): still exact
    n1 = s.un("vrint", h0, out=d0)
    f1 = s.bin("vsub", h0, n1, out=h0)
    s.bin("vadd", n0, n1, out=n0)
    s.done(n1)
    # second window: m2*W1*2^-24 = h1 - d1, < 4, a multiple of 2^-46
    h1 = s.bin("vmul", m2, w[1])
    d1 = s.fma(nm2, w[1], h1)
    sm, e01 = _two_sum(s, f1, h1)
    s.done(f1, h1)
    n2 = s.un("vrint", sm)
    s.bin("vadd", n0, n2, out=n0)  # q (up to a multiple of 4)
    dh = s.bin("vsub", sm, n2, out=sm)
    s.done(n2)
    s.sc("vmuls", d1, -1.0, out=d1)
    b1, eb1 = _two_sum(s, e01, d1)
    s.done(e01, d1)
    # third and fourth windows
    p2 = s.bin("vmul", m2, w[2])
    dp2 = s.fma(nm2, w[2], p2)
    b2, eb2 = _two_sum(s, b1, p2)
    s.done(b1, p2)
    vh, e2 = _two_sum(s, dh, b2)
    s.done(dh, b2)
    p3 = s.bin("vmul", m2, w[3])
    s.done(m2, nm2, *w)
    s.bin("vadd", e2, eb1, out=e2)
    s.bin("vadd", e2, eb2, out=e2)
    s.bin("vsub", e2, dp2, out=e2)
    vl = s.bin("vadd", e2, p3, out=e2)
    s.done(eb1, eb2, dp2, p3)
    th = s.bin("vadd", vh, vl)
    s.bin("vsub", th, vh, out=vh)
    tl = s.bin("vsub", vl, vh, out=vl)
    s.done(vh)
    # r = v * pi/2 as a pair
    rh = s.sc("vmuls", th, _PIO2_1)
    nrh = s.sc("vmuls", th, -_PIO2_1)
    rl = s.fma(th, s.const("float32", _PIO2_1), nrh, out=nrh)
    s.fma(th, s.const("float32", _PIO2_2), rl, out=rl)
    s.fma(tl, s.const("float32", _PIO2_1), rl, out=rl)
    s.done(th, tl)
    # x < 0: x*2/pi = -(|x|*2/pi)
    neg = s.cmps("lt", x, 0.0)
    tmp = s.sc("vmuls", n0, -1.0)
    s.sel(neg, tmp, n0, out=n0)
    s.sc("vmuls", rh, -1.0, out=tmp)
    s.sel(neg, tmp, rh, out=rh)
    s.sc("vmuls", rl, -1.0, out=tmp)
    s.sel(neg, tmp, rl, out=rl)
    qi = s.conv(n0, "int32")
    s.done(n0, neg)
    s.bin("vsub", x, x, out=tmp)  # nan for inf/nan, else 0
    s.bin("vadd", rh, tmp, out=rh)
    small = s.cmps("lt", ax, _TRIG_SMALL)
    s.sel(small, sq, qi, out=qi)
    s.sel(small, srh, rh, out=rh)
    s.sel(small, srl, rl, out=rl)
    s.done(small, ax, tmp, sq, srh, srl)
    return qi, rh, rl


def _sincos_pair(s: _Seq, rh: isa.Ref, rl: isa.Ref, lows: bool):
    """sin(r), cos(r) for r = rh + rl, |r| <= 0.8: (sh, sl, ch, cl), the lows only if `lows`.

    sin = rh + (rl + rh*z*S(z)): the correction is < 0.12 |sin|, so its float32 roundings
    cost < 0.4 ulp. cos = w + e - (rh^2 - z)/2 - rh*rl + z^2*C(z), w + e = 1 - z/2 exactly
    (Fast2Sum), rh^2 - z exact in an fma.
    """
    z = s.bin("vmul", rh, rh)
    y = s.bin("vmul", rh, z)
    p = s.horner_fma(z, SIN_F32)
    st = s.fma(y, p, rl, out=p)
    s.done(y)
    sh = s.bin("vadd", rh, st)
    nhz = s.sc("vmuls", z, -0.5)
    w = s.sc("vadds", nhz, 1.0)
    e = s.sc("vmuls", w, -1.0)
    s.sc("vadds", e, 1.0, out=e)
    s.bin("vadd", e, nhz, out=e)  # 1 - z/2 = w + e
    hr = s.sc("vmuls", rh, 0.5)
    s.fma(hr, rh, nhz, out=hr)  # (rh^2 - z) / 2
    s.done(nhz)
    s.bin("vsub", e, hr, out=e)
    s.bin("vmul", rh, rl, out=hr)
    s.bin("vsub", e, hr, out=e)
    s.done(hr)
    cp = s.horner_fma(z, COS_F32)
    s.bin("vmul", z, z, out=z)
    ct = s.fma(z, cp, e, out=cp)
    s.done(z, e)
    ch = s.bin("vadd", w, ct)
    if not lows:
        s.done(st, ct, w)
        return sh, None, ch, None
    sl = s.bin("vsub", sh, rh)
    s.bin("vsub", st, sl, out=sl)
    cl = s.bin("vsub", ch, w)
    s.bin("vsub", ct, cl, out=cl)
    s.done(st, ct, w)
    return sh, sl, ch, cl


def _trig32(s: _Seq, dst: isa.Ref, x: isa.Ref, op: str, small: bool) -> None:
    """sin / cos / tan of float32 x with float32, int32 and bool instructions only."""
    qi, rh, rl = _cw_reduce(s, x) if small else _ph_reduce(s, x)
    th = s.bin("vadd", rh, rl)  # renormalise the pair
    s.bin("vsub", th, rh, out=rh)
    s.bin("vsub", rl, rh, out=rl)
    s.done(rh)
    sh, sl, ch, cl = _sincos_pair(s, th, rl, op == "tan")
    s.done(th, rl)
    odd = s.sc("vshl", qi, 31)  # sign bit set where q is odd
    m = s.cmps("lt", odd, 0)
    if op == "tan":  # even q: sin/cos; odd: -cos/sin
        nh = s.sel(m, ch, sh)
        nl = s.sel(m, cl, sl)
        s.sel(m, sh, ch, out=sh)
        s.sel(m, sl, cl, out=sl)
        dh, dl = sh, sl
        s.done(ch, cl, m, qi)
        t0 = s.bin("vdiv", nh, dh)
        nt0 = s.sc("vmuls", t0, -1.0)
        s.fma(nt0, dh, nh, out=nh)  # exact remainder
        s.bin("vadd", nh, nl, out=nh)
        s.fma(nt0, dl, nh, out=nh)
        s.done(nt0, nl, dl)
        s.bin("vdiv", nh, dh, out=nh)
        res = s.bin("vadd", t0, nh, out=t0)
        s.done(nh, dh)
        sign = odd
    else:
        # sin(x), q mod 4 = 0..3: s, c, -s, -c;  cos(x): c, -s, -c, s
        res = s.sel(m, ch, sh) if op == "sin" else s.sel(m, sh, ch)
        s.done(ch, sh, m)
        if op == "cos":
            s.sc("vadds", qi, 1, out=qi)
        sign = s.sc("vshr", qi, 1, out=qi)
        s.sc("vshl", sign, 31, out=sign)
        s.done(odd)
    rb = s.conv(res, "int32", "bits")
    s.bin("vxor", rb, sign, out=rb)
    s.done(sign)
    if op == "cos":
        s.conv(rb, "float32", "bits", out=dst)
        s.done(rb, res)
        return
    s.conv(rb, "float32", "bits", out=res)  # sin/tan(-0) = -0: the reduction gives +0
    s.done(rb)
    zero = s.cmps("eq", x, 0.0)
    s.sel(zero, x, res, out=dst)
    s.done(zero, res)


_TRIG_NPU = {
    "sin": lambda s, d, x, small: _trig32(s, d, x, "sin", small),
    "cos": lambda s, d, x, small: _trig32(s, d, x, "cos", small),
    "tan": lambda s, d, x, small: _trig32(s, d, x, "tan", small),
}


def _trig_table(host_math: bool) -> dict:
    return _TRIG_HOST if host_math else _TRIG_NPU


def host_math_enabled() -> bool:
    """LAZYMATH_HOST_MATH: float32/float16 sin, cos and tan reduce in float64 (a faster
    host-only lowering, not what an NPU can run). Default: float32 instructions only."""
    return settings.HOST_MATH.get()


# ---------------------------------------------------------------------------- tanh, sigmoid
def _op_tanh(s: _Seq, dst: isa.Ref, srcs: tuple, dt: str) -> None:
    """|x| < 0.9: x + x^3 P(x^2); else sign(x) * (1 - 2/(exp(2|x|) + 1)) (exp never loses
    more than 1 ulp there since the subtraction keeps >= 0.7 of the result). tanh(+-inf) = +-1,
    tanh(-0) = -0 (polynomial branch), nan propagates through both. float32 and float64 (a
    14-term polynomial); both faithful."""
    x = srcs[0]
    ax = s.un("vabs", x)
    z = s.bin("vmul", x, x)
    p = s.horner(z, TANH_F64 if dt == "float64" else TANH_F32)
    s.bin("vmul", z, x, out=z)
    small = s.fma(z, p, x, out=p)  # x + x^3 P
    s.done(z)
    zero = s.cmps("eq", x, 0.0)  # tanh(-0.0) = -0.0 (x + x^3 P gives +0)
    s.sel(zero, x, small, out=small)
    s.done(zero)
    e = s.sc("vmuls", ax, 2.0)
    s.un("vexp", e, out=e)
    s.sc("vadds", e, 1.0, out=e)
    big = s.un("vrec", e, out=e)  # 2/(e+1) = 2 * (1/(e+1)) exactly
    s.sc("vmuls", big, -2.0, out=big)
    s.sc("vadds", big, 1.0, out=big)
    nbig = s.un("vneg", big)
    neg = s.cmps("lt", x, 0.0)  # -0.0 takes the polynomial branch
    s.sel(neg, nbig, big, out=big)
    s.done(nbig, neg)
    m = s.cmps("lt", ax, TANH_SMALL)
    s.done(ax)
    s.sel(m, small, big, out=dst)
    s.done(m, small, big)


def _op_sigmoid(s: _Seq, dst: isa.Ref, srcs: tuple, dt: str) -> None:
    """1/(1+exp(-x)) as e/(1+e) or 1/(1+e) with e = exp(-|x|) <= 1: never overflows, and the
    denormal tail of sigmoid(-100) is right (the naive form gives 0). nan propagates."""
    x = srcs[0]
    e = s.un("vabs", x)
    s.un("vneg", e, out=e)
    s.un("vexp", e, out=e)
    d = s.sc("vadds", e, 1.0)
    pos = s.cmps("ge", x, 0.0)
    one = s.conv(pos, dt)  # 1.0 exactly where it is selected
    num = s.sel(pos, one, e, out=e)
    s.done(pos, one)
    s.bin("vdiv", num, d, out=dst)
    s.done(num, d)


def _op_exp2(s: _Seq, dst: isa.Ref, srcs: tuple, dt: str) -> None:
    """2^x = exp(x*ln2) in float64: the product is exact enough, one rounding to float32."""
    xd = s.conv(srcs[0], "float64")
    s.sc("vmuls", xd, math.log(2.0), out=xd)
    s.un("vexp", xd, out=xd)
    s.conv(xd, dst.buf.dtype, out=dst)
    s.done(xd)


# ---------------------------------------------------------------------------- pow
def _op_pow(s: _Seq, dst: isa.Ref, srcs: tuple, dt: str) -> None:
    """C99/numpy pow: |a|^b = exp(b*log|a|) in float64, then the sign and special cases.

    float32 inputs are exact in float64 and the result is rounded once (faithful). float64
    inputs lose ~|b*log a| ulp-units of 2^-53 (relative error < 1e-13). Special cases: b == 0
    -> 1, a == 1 -> 1, a == -1 and |b| == inf -> 1, a < 0 (finite) and b not an integer -> nan,
    negative a (or -0.0) and odd integer b -> negated; inf/0 cases fall out of exp/log.
    """
    a, bb = srcs
    wide = dt != "float64"
    ad = s.conv(a, "float64") if wide else a
    bd = s.conv(bb, "float64") if wide else bb
    la = s.un("vabs", ad)
    s.un("vln", la, out=la)
    s.bin("vmul", la, bd, out=la)
    res = s.un("vexp", la, out=la)
    # integer / odd tests on b
    t = s.un("vrint", bd)
    yint = s.cmp("eq", t, bd)
    s.sc("vmuls", bd, 0.5, out=t)
    t2 = s.un("vrint", t)
    yodd = s.cmp("ne", t2, t)  # b/2 not an integer (false for inf: inf/2 is 'integer')
    s.done(t, t2)
    s.bin("vand", yodd, yint, out=yodd)
    ib = "int32" if wide else "int64"
    ab = s.conv(a, ib, "bits")
    aneg = s.cmps("lt", ab, 0)  # sign bit of a, also -0.0
    s.done(ab)
    s.bin("vand", yodd, aneg, out=yodd)
    s.done(aneg)
    nres = s.un("vneg", res)
    s.sel(yodd, nres, res, out=res)
    s.done(nres, yodd)
    # a < 0 finite and b not an integer -> nan
    m = s.cmps("lt", ad, 0.0)
    m2 = s.cmps("gt", ad, -math.inf)
    s.bin("vand", m, m2, out=m)
    s.un("vnot", yint, out=yint)
    s.bin("vand", m, yint, out=m)
    t = s.un("vsqrt", ad)  # nan exactly on those lanes (a < 0)
    s.sel(m, t, res, out=res)
    s.done(t)
    # b == 0 or a == 1 -> 1;  a == -1 and |b| == inf -> 1
    s.cmps("eq", ad, -1.0, out=m)
    t = s.un("vabs", bd)
    s.cmps("eq", t, math.inf, out=m2)
    s.done(t)
    s.bin("vand", m, m2, out=m)
    s.cmps("eq", ad, 1.0, out=m2)
    s.bin("vor", m, m2, out=m)
    s.cmps("eq", bd, 0.0, out=m2)
    s.bin("vor", m, m2, out=m)
    s.done(m2, yint)
    one = s.conv(m, "float64")  # 1.0 exactly where it is selected
    if wide:
        s.sel(m, one, res, out=res)
        s.conv(res, dst.buf.dtype, out=dst)
        s.done(res, ad, bd)
    else:
        s.sel(m, one, res, out=dst)
        s.done(res)
    s.done(m, one)


# ---------------------------------------------------------------------------- floor_divide, mod
_FMOD_STEP = 50  # bits of quotient removed per reduction step (float64 keeps the error < 1)


def _fmod_abs(s: _Seq, A: isa.Ref, B: isa.Ref, steps: int) -> isa.Ref:
    """fmod(A, B) for float64 A, B >= 0 holding float32 values: exact, branch-free.

    Long division in `steps` rounds of 50 quotient bits: q = floor(r * (1/B) * 2^-50j) is off
    by at most one, r - q*B*2^50j is exact in the fma (the result is a multiple of the coarser
    of the two ulps and smaller than 3*B*2^50j), and the last round is corrected both ways.
    B = inf gives A; B = 0 or A = inf give nan, like C fmod.
    """
    iB = s.un("vrec", B)
    r = s.un("vcopy", A)
    q = s.tmp("float64")
    nb = s.tmp("float64")
    for j in reversed(range(steps)):
        sc = 2.0 ** (_FMOD_STEP * j)
        s.bin("vmul", r, iB, out=q)
        if j:
            s.sc("vmuls", q, 1.0 / sc, out=q)
        s.un("vfloor", q, out=q)
        s.sc("vmuls", B, -sc, out=nb)
        s.fma(q, nb, r, out=r)
    s.done(iB, nb)
    m = s.cmps("lt", r, 0.0)
    s.bin("vadd", r, B, out=q)
    s.sel(m, q, r, out=r)
    s.cmp("ge", r, B, out=m)
    s.bin("vsub", r, B, out=q)
    s.sel(m, q, r, out=r)
    s.cmps("eq", B, math.inf, out=m)
    fin = s.cmps("lt", A, math.inf)  # fmod(inf, inf) stays nan
    s.bin("vand", m, fin, out=m)
    s.sel(m, A, r, out=r)
    s.done(m, q, fin)
    return r


def _divmod32(s: _Seq, dst: isa.Ref, srcs: tuple, want: str) -> None:
    """numpy's npy_divmod for float32, step by step, with fmod computed exactly in float64."""
    a, bb = srcs
    A = s.conv(a, "float64")
    s.un("vabs", A, out=A)
    B = s.conv(bb, "float64")
    s.un("vabs", B, out=B)
    r = _fmod_abs(s, A, B, 6 if want == "mod" else 1)
    s.done(A, B)
    mod = s.conv(r, "float32")
    s.done(r)
    ab = s.conv(a, "int32", "bits")
    aneg = s.cmps("lt", ab, 0)
    s.done(ab)
    nmod = s.un("vneg", mod)
    s.sel(aneg, nmod, mod, out=mod)  # fmod has the sign of a
    s.done(aneg)
    # adjust to the divisor's sign (Python convention)
    modnz = s.cmps("ne", mod, 0.0)
    bneg = s.cmps("lt", bb, 0.0)
    mneg = s.cmps("lt", mod, 0.0)
    s.bin("vxor", mneg, bneg, out=mneg)
    adj = s.bin("vand", mneg, modnz, out=mneg)
    if want == "mod":
        s.bin("vadd", mod, bb, out=nmod)
        s.sel(adj, nmod, mod, out=mod)
        s.done(nmod)
        zero = _signed_zero(s, bb)  # copysign(0, b)
        s.sel(modnz, mod, zero, out=dst)
        s.done(mod, zero, modnz, bneg, adj)
        return
    div = s.bin("vsub", a, mod, out=mod)
    s.bin("vdiv", div, bb, out=div)
    t = s.sc("vadds", div, -1.0, out=nmod)
    s.sel(adj, t, div, out=div)
    fl = s.un("vfloor", div, out=t)
    m = s.bin("vsub", div, fl, out=None)
    big = s.cmps("gt", m, 0.5, out=adj)
    s.sc("vadds", fl, 1.0, out=m)
    s.sel(big, m, fl, out=fl)
    q = s.bin("vdiv", a, bb, out=m)  # a/b: zero sign, b == 0 and huge quotients
    z = s.cmps("ne", div, 0.0, out=big)
    s.done(div)
    zero = _signed_zero(s, q)  # copysign(0, a/b), a/b == -0.0 included
    s.sel(z, fl, zero, out=fl)
    s.done(zero)
    # b == 0 -> a/b; |a/b| >= 2^25 -> a/b (numpy's result there, independent of mod). An infinite
    # operand -> floor(a/b) == a/b by the Array API's table (inf // 2 = inf where npy_divmod
    # gives nan; -1 // inf = -0 where it gives -1): a = +-inf makes |a/b| >= 2^25 (or NaN,
    # = a/b too), b = +-inf needs its own test.
    s.cmps("eq", bb, 0.0, out=z)
    aq = s.un("vabs", q)
    s.cmps("ge", aq, 2.0**25, out=modnz)
    s.bin("vor", z, modnz, out=z)
    s.un("vabs", bb, out=aq)
    s.cmps("eq", aq, math.inf, out=modnz)
    s.done(aq)
    s.bin("vor", z, modnz, out=z)
    s.sel(z, q, fl, out=dst)
    s.done(fl, q, z, modnz, bneg)


def _signed_zero(s: _Seq, x: isa.Ref) -> isa.Ref:
    """copysign(0.0, x) for float32 x from its sign bit (no constant buffer needed)."""
    t = s.conv(x, "int32", "bits")
    s.sc("vshr", t, 31, out=t)  # 0 or -1
    s.sc("vshl", t, 31, out=t)  # 0 or the sign bit
    z = s.conv(t, "float32", "bits")
    s.done(t)
    return z


def _op_floor_divide(s, dst, srcs, dt):
    _divmod32(s, dst, srcs, "div")


def _op_remainder(s, dst, srcs, dt):
    _divmod32(s, dst, srcs, "mod")


# ---------------------------------------------------------------------------- issue 16's
# float16/float32 through float64: every input is exact in float64 and each formula below loses
# a few float64 ulps at most, so one final rounding to float32 is faithful. float64 inputs go
# to the host libm (these are not in _F64_OPS).
_LN2 = math.log(2.0)


def _log1p64(s: _Seq, x: isa.Ref) -> isa.Ref:
    """log1p of float64 x (a fresh buffer): Kahan's log(u) * x / (u - 1), u = 1 + x; x where
    u == 1 (tiny x), and log(u) itself where u is inf or 0 (x = inf, x = -1)."""
    u = s.sc("vadds", x, 1.0)
    lu = s.un("vln", u)
    d = s.sc("vadds", u, -1.0)
    r = s.bin("vdiv", x, d)
    s.bin("vmul", r, lu, out=r)
    m = s.cmps("eq", u, 1.0)
    s.sel(m, x, r, out=r)
    s.un("vabs", lu, out=d)
    s.cmps("eq", d, math.inf, out=m)  # u = inf or u = 0: log(u) is the answer (+-inf)
    s.sel(m, lu, r, out=r)
    s.done(u, lu, d, m)
    return r


def _expm1_64(s: _Seq, x: isa.Ref) -> isa.Ref:
    """expm1 of float64 x (a fresh buffer): Kahan's (u - 1) * x / log(u), u = exp(x); x where
    u == 1, -1 where u - 1 == -1, u where u is inf (x = +inf, overflow); NaN propagates."""
    u = s.un("vexp", x)
    d = s.sc("vadds", u, -1.0)
    lu = s.un("vln", u)
    r = s.bin("vdiv", x, lu)
    s.bin("vmul", r, d, out=r)
    m = s.cmps("eq", u, 1.0)
    s.sel(m, x, r, out=r)
    s.cmps("eq", d, -1.0, out=m)
    s.sel(m, d, r, out=r)
    s.cmps("eq", u, math.inf, out=m)
    s.sel(m, u, r, out=r)
    s.done(u, d, lu, m)
    return r


def _wide(s: _Seq, srcs: tuple) -> tuple:
    return tuple(s.conv(r, "float64") for r in srcs)


def _narrow(s: _Seq, r: isa.Ref, dst: isa.Ref, *free: isa.Ref) -> None:
    s.conv(r, dst.buf.dtype, out=dst)
    s.done(r, *free)


def _op_log1p(s, dst, srcs, dt):
    (x,) = _wide(s, srcs)
    _narrow(s, _log1p64(s, x), dst, x)


def _op_expm1(s, dst, srcs, dt):
    (x,) = _wide(s, srcs)
    _narrow(s, _expm1_64(s, x), dst, x)


def _scaled_log(scale: float):
    def op(s, dst, srcs, dt):
        (x,) = _wide(s, srcs)
        s.un("vln", x, out=x)
        s.sc("vmuls", x, scale, out=x)
        s.conv(x, dst.buf.dtype, out=dst)
        s.done(x)

    return op


def _op_sinh(s, dst, srcs, dt):
    """sign(x) * (E + E / (E + 1)) / 2, E = expm1(|x|) >= 0: no cancellation near 0; inf where
    exp overflows (E = inf); -0.0 and NaN keep themselves."""
    (x,) = _wide(s, srcs)
    a = s.un("vabs", x)
    e = _expm1_64(s, a)
    t = s.sc("vadds", e, 1.0)
    s.bin("vdiv", e, t, out=t)
    s.bin("vadd", t, e, out=t)
    s.sc("vmuls", t, 0.5, out=t)
    m = s.cmps("eq", e, math.inf)
    s.sel(m, e, t, out=t)
    s.cmps("lt", x, 0.0, out=m)
    s.un("vneg", t, out=e)
    s.sel(m, e, t, out=t)
    s.done(m, a)
    _narrow(s, t, dst, x, e)


def _op_cosh(s, dst, srcs, dt):
    """(exp(|x|) + 1 / exp(|x|)) / 2 (no cancellation); inf where exp overflows."""
    (x,) = _wide(s, srcs)
    s.un("vabs", x, out=x)
    e = s.un("vexp", x)
    r = s.un("vrec", e)
    s.bin("vadd", r, e, out=r)
    s.sc("vmuls", r, 0.5, out=r)
    _narrow(s, r, dst, x, e)


def _op_asinh(s, dst, srcs, dt):
    """sign(x) * log1p(|x| + x^2 / (1 + sqrt(1 + x^2))) (float32 squares cannot overflow in
    float64); -0.0 and NaN keep themselves."""
    (x,) = _wide(s, srcs)
    a = s.un("vabs", x)
    q = s.bin("vmul", a, a)
    t = s.sc("vadds", q, 1.0)
    s.un("vsqrt", t, out=t)
    s.sc("vadds", t, 1.0, out=t)
    s.bin("vdiv", q, t, out=q)
    s.bin("vadd", q, a, out=q)
    big = s.cmps("eq", a, math.inf)  # x^2 / (1 + sqrt(1 + x^2)) is inf/inf for |x| = inf
    s.sel(big, a, q, out=q)
    r = _log1p64(s, q)
    neg = s.cmps("lt", x, 0.0)
    nr = s.un("vneg", r)
    s.sel(neg, nr, r, out=r)
    z = s.cmps("eq", x, 0.0)  # keeps -0.0
    s.sel(z, x, r, out=r)
    s.done(a, q, t, big, neg, nr, z)
    _narrow(s, r, dst, x)


def _op_acosh(s, dst, srcs, dt):
    """log1p((x - 1) + sqrt((x - 1) * (x + 1))): both factors exact in float64; NaN below 1."""
    (x,) = _wide(s, srcs)
    a = s.sc("vadds", x, -1.0)
    b = s.sc("vadds", x, 1.0)
    s.bin("vmul", b, a, out=b)
    s.un("vsqrt", b, out=b)
    s.bin("vadd", b, a, out=b)
    r = _log1p64(s, b)
    _narrow(s, r, dst, x, a, b)


def _op_atanh(s, dst, srcs, dt):
    """log1p(2x / (1 - x)) / 2: +-inf at +-1, NaN beyond, -0.0 kept."""
    (x,) = _wide(s, srcs)
    d = s.un("vneg", x)
    s.sc("vadds", d, 1.0, out=d)
    t = s.bin("vadd", x, x)
    s.bin("vdiv", t, d, out=t)
    r = _log1p64(s, t)
    s.sc("vmuls", r, 0.5, out=r)
    _narrow(s, r, dst, x, d, t)


def _op_hypot(s, dst, srcs, dt):
    """sqrt(a^2 + b^2) in float64 (float32 squares neither overflow nor lose bits); inf if
    either is infinite, even with a NaN (C99)."""
    a, b = _wide(s, srcs)
    s.un("vabs", a, out=a)
    s.un("vabs", b, out=b)
    r = s.bin("vmul", a, a)
    t = s.bin("vmul", b, b)
    s.bin("vadd", r, t, out=r)
    s.un("vsqrt", r, out=r)
    m = s.cmps("eq", a, math.inf)
    s.sel(m, a, r, out=r)
    s.cmps("eq", b, math.inf, out=m)
    s.sel(m, b, r, out=r)
    s.done(m, t)
    _narrow(s, r, dst, a, b)


def _op_logaddexp(s, dst, srcs, dt):
    """max(a, b) + log1p(exp(-|a - b|)); a + log(2) where a == b (also both infinite)."""
    a, b = _wide(s, srcs)
    mx = s.bin("vmax", a, b)
    d = s.bin("vsub", a, b)
    s.un("vabs", d, out=d)
    s.un("vneg", d, out=d)
    s.un("vexp", d, out=d)
    r = _log1p64(s, d)
    s.bin("vadd", r, mx, out=r)
    eq = s.cmp("eq", a, b)
    s.sc("vadds", a, _LN2, out=d)
    s.sel(eq, d, r, out=r)
    s.done(eq, mx)
    _narrow(s, r, dst, a, b, d)


# atan(u) = u + u^3 Q(u^2) for |u| <= tan(pi/8): the Taylor series, 13 terms (the first left
# out is u^27/27 <= 2^-40 |u|: far below float32's 2^-24), evaluated in float64
_ATAN_Q = tuple((-1.0) ** k / (2 * k + 1) for k in range(1, 13))
_TAN_PI_8 = math.sqrt(2.0) - 1.0
_TAN_3PI_8 = math.sqrt(2.0) + 1.0


def _atan64(s: _Seq, x: isa.Ref, keep_zero: bool = True) -> isa.Ref:
    """atan of float64 x (a fresh buffer), |x| reduced to |u| <= tan(pi/8): u = |x| (offset
    0), (|x| - 1)/(|x| + 1) (pi/4) or -1/|x| (pi/2) by two selects, then the sign of x; inf
    gives pi/2, NaN stays NaN (it fails both range tests: the middle branch), -0.0 stays."""
    a = s.un("vabs", x)
    lo = s.cmps("le", a, _TAN_PI_8)
    hi = s.cmps("gt", a, _TAN_3PI_8)
    u = s.sc("vadds", a, -1.0)  # middle range: (a - 1) / (a + 1)
    d = s.sc("vadds", a, 1.0)
    s.bin("vdiv", u, d, out=u)
    s.un("vrec", a, out=d)  # high range: -1 / a
    s.un("vneg", d, out=d)
    s.sel(hi, d, u, out=u)
    s.sel(lo, a, u, out=u)
    z = s.bin("vmul", u, u)
    q = s.horner(z, _ATAN_Q)
    s.bin("vmul", q, z, out=q)
    s.bin("vmul", q, u, out=q)
    s.bin("vadd", q, u, out=q)  # atan(u)
    r = s.sc("vadds", q, math.pi / 4)  # + the range's offset: 0, pi/4 or pi/2
    s.sel(lo, q, r, out=r)
    s.sc("vadds", q, math.pi / 2, out=d)
    s.sel(hi, d, r, out=r)
    neg = s.cmps("lt", x, 0.0)
    s.un("vneg", r, out=d)
    s.sel(neg, d, r, out=r)
    if keep_zero:
        s.cmps("eq", x, 0.0, out=neg)
        s.sel(neg, x, r, out=r)
    s.done(a, lo, hi, u, d, z, q, neg)
    return r


def _op_atan(s, dst, srcs, dt):
    """atan in float64, rounded once (faithful for float32/float16)."""
    (x,) = _wide(s, srcs)
    _narrow(s, _atan64(s, x), dst, x)


def _op_asin(s, dst, srcs, dt):
    """atan(x / sqrt((1 - x)(1 + x))): the product is exact in float64 for a float32 x, so the
    ends are right: +-1 give x / 0 = +-inf, atan +-pi/2; NaN beyond +-1 (sqrt of a negative);
    -0.0 kept."""
    (x,) = _wide(s, srcs)
    a = s.un("vneg", x)
    s.sc("vadds", a, 1.0, out=a)
    b = s.sc("vadds", x, 1.0)
    s.bin("vmul", a, b, out=a)
    s.un("vsqrt", a, out=a)
    s.bin("vdiv", x, a, out=b)
    r = _atan64(s, b)
    z = s.cmps("eq", x, 0.0)
    s.sel(z, x, r, out=r)
    s.done(z)
    _narrow(s, r, dst, x, a, b)


def _op_acos(s, dst, srcs, dt):
    """2 atan(sqrt((1 - x) / (1 + x))): 0 at 1, pi at -1 (1/0 = inf), NaN beyond +-1."""
    (x,) = _wide(s, srcs)
    a = s.un("vneg", x)
    s.sc("vadds", a, 1.0, out=a)
    b = s.sc("vadds", x, 1.0)
    s.bin("vdiv", a, b, out=a)
    s.un("vsqrt", a, out=a)
    r = _atan64(s, a)
    s.sc("vmuls", r, 2.0, out=r)
    _narrow(s, r, dst, x, a, b)


def _op_atan2(s, dst, srcs, dt):
    """atan(|y| / |x|) (0/0 taken as 0, inf/inf as 1: the C99 special cases), pi minus it
    where x has its sign bit set (also -0.0), then the sign bit of y (also -0.0)."""
    y, x = _wide(s, srcs)
    ay = s.un("vabs", y)
    ax = s.un("vabs", x)
    q = s.bin("vdiv", ay, ax)
    m = s.cmps("eq", ay, 0.0)
    t = s.cmps("eq", ax, 0.0)
    s.bin("vand", m, t, out=m)
    s.sel(m, s.const("float64", 0.0), q, out=q)
    s.cmps("eq", ay, math.inf, out=m)
    s.cmps("eq", ax, math.inf, out=t)
    s.bin("vand", m, t, out=m)
    s.sel(m, s.const("float64", 1.0), q, out=q)
    r = _atan64(s, q, keep_zero=False)  # q >= 0 or NaN
    bx = s.conv(x, "int64", mode="bits")
    s.cmps("lt", bx, 0, out=m)  # x's sign bit: the left half-plane
    s.un("vneg", r, out=ax)
    s.sc("vadds", ax, math.pi, out=ax)
    s.sel(m, ax, r, out=r)
    s.conv(y, "int64", mode="bits", out=bx)
    s.cmps("lt", bx, 0, out=m)
    s.un("vneg", r, out=ax)
    s.sel(m, ax, r, out=r)
    s.done(ay, q, t, bx, m)
    _narrow(s, r, dst, y, x, ax)


# ---------------------------------------------------------------------------- erf, erfc
def _erf_parts(s: _Seq, x: isa.Ref) -> tuple[isa.Ref, isa.Ref, isa.Ref, isa.Ref]:
    """float64 x (a float32 value widened) -> (small, E, neg, in_small): small = erf(x) for
    |x| < 1 (x * P(2x^2 - 1): -0.0 keeps its sign), E = erfc(|x|) for |x| >= 1 (exp(-x^2) *
    t * Q(s), t = 1/|x|; x^2 is exact in float64 for a float32 x, so exp(-x^2) is faithful and
    the tail keeps its relative accuracy down to the float32 denormals), neg = x < 0 and
    in_small = |x| < 1 as masks. +-inf give E = 0; NaN propagates through both branches."""
    z = s.bin("vmul", x, x)
    v = s.sc("vmuls", z, 2.0)
    s.sc("vadds", v, -1.0, out=v)
    small = s.horner(v, ERF_SMALL)
    s.bin("vmul", small, x, out=small)
    a = s.un("vabs", x)
    in_small = s.cmps("lt", a, 1.0)
    neg = s.cmps("lt", x, 0.0)
    t = s.sc("vmins", a, ERFC_CLAMP, out=a)
    s.un("vrec", t, out=t)
    lo = 1.0 / ERFC_CLAMP
    s.sc("vmuls", t, 2.0 / (1.0 - lo), out=v)
    s.sc("vadds", v, -(1.0 + lo) / (1.0 - lo), out=v)
    q = s.horner(v, ERFC_BIG)
    s.bin("vmul", q, t, out=q)
    s.un("vneg", z, out=z)
    s.un("vexp", z, out=z)
    s.bin("vmul", q, z, out=q)
    s.done(z, v, t)
    return small, q, neg, in_small


def _op_erf(s, dst, srcs, dt):
    """erf: the small branch below |x| = 1, else sign(x) * (1 - erfc(|x|)) (erfc(|x|) <= 0.16
    there, so the subtraction loses nothing). erf(+-0) = +-0, erf(+-inf) = +-1. float32 is
    computed in float64 and rounded once (measured: within 0.5 ulp of the float64 libm value,
    so correctly rounded or 1 ulp from it); float64 is the host libm's (`_F64_OPS`)."""
    (x,) = _wide(s, srcs)
    small, e, neg, in_small = _erf_parts(s, x)
    s.sc("vmuls", e, -1.0, out=e)
    s.sc("vadds", e, 1.0, out=e)
    ne = s.un("vneg", e)
    s.sel(neg, ne, e, out=e)
    s.sel(in_small, small, e, out=e)
    s.done(ne, neg, in_small, small)
    _narrow(s, e, dst, x)


def _op_erfc(s, dst, srcs, dt):
    """erfc: 1 - erf(x) below |x| = 1 (erfc >= 0.157 there: no cancellation), erfc(x) for
    x >= 1, 2 - erfc(-x) for x <= -1. erfc(+inf) = 0, erfc(-inf) = 2, NaN propagates."""
    (x,) = _wide(s, srcs)
    small, e, neg, in_small = _erf_parts(s, x)
    s.sc("vmuls", small, -1.0, out=small)
    s.sc("vadds", small, 1.0, out=small)
    two = s.sc("vmuls", e, -1.0)
    s.sc("vadds", two, 2.0, out=two)
    s.sel(neg, two, e, out=e)
    s.sel(in_small, small, e, out=e)
    s.done(two, neg, in_small, small)
    _narrow(s, e, dst, x)


_OPS = {
    "erf": _op_erf,
    "erfc": _op_erfc,
    "asin": _op_asin,
    "acos": _op_acos,
    "atan": _op_atan,
    "atan2": _op_atan2,
    "log1p": _op_log1p,
    "expm1": _op_expm1,
    "log2": _scaled_log(1.0 / _LN2),
    "log10": _scaled_log(1.0 / math.log(10.0)),
    "sinh": _op_sinh,
    "cosh": _op_cosh,
    "asinh": _op_asinh,
    "acosh": _op_acosh,
    "atanh": _op_atanh,
    "hypot": _op_hypot,
    "logaddexp": _op_logaddexp,
    "sin": _op_sin,
    "cos": _op_cos,
    "tan": _op_tan,
    "tanh": _op_tanh,
    "sigmoid": _op_sigmoid,
    "exp2": _op_exp2,
    "pow": _op_pow,
    "floor_divide": _op_floor_divide,
    "remainder": _op_remainder,
}


# ============================================================================ part 3: calls
# Out-of-line composites. A fused kernel with many transcendental ops would otherwise hand
# LLVM one copy of every composite (dozens of blocks per op: the optimizer's time grows much
# faster than the kernel). Instead `VMathCall` asks a vector subroutine of the runtime library
# (`vmlib`: one function per (op, dtype), compiled once per host and kept in the disk cache like
# a kernel) to run the composite over the tile: the kernel costs the optimizer one call per op.
#
# Semantics: a VMathCall is exactly `emit_composite(op, dst, srcs, n, dtype)` with chunks of
# CHUNK elements counted from the tile start (the inlined expansion strip-mines the same way:
# chunk = min(tile, CHUNK) and a tile shorter than CHUNK is a single chunk either way), so the
# per-chunk range branch of sin/cos/tan sees the same elements and results are bit-identical
# to the inlined form on every backend. The subroutine's scratch stays declared in the calling
# kernel (`call_footprint`): the UB footprint, and so the tiling, is the inlined one. Which
# kernels call the library and which inline: `vmlib.call_plan`.
CALL_CAP = 1 << 30  # static bound of a call's n: any tile (chunks of CHUNK, strip-mined)


@dataclass(frozen=True, slots=True)
class VMathCall:
    """dst[:n] = op(*srcs)[:n] in `dtype` by the runtime library's vector subroutine."""

    op: str
    dtype: str
    dst: isa.Ref
    srcs: tuple
    n: isa.IntExpr


isa.register_instr(
    VMathCall,
    "Vector",
    lambda i: f"vmath.{i.op}.{i.dtype} {i.dst}, {', '.join(map(str, i.srcs))}, n={i.n}",
)


def call_symbol(op: str, dtype: str, target: str | None = None) -> str:
    """The library's C symbol of (op, dtype) for a host target (default: the one in force,
    LAZYMATH_TARGET_CPU): void f(ptr dst, ptr src0, ptr src1, i64 n). Native code has no
    suffix; a forced target's is ``.<cpu>`` (a process that switches targets links each
    target's kernels to that target's library code)."""
    if target is None:  # == host.requested(), read here: vmath sits below the host target
        target = (settings.TARGET_CPU.get() or "").strip()
        target = "" if target in ("native", "host") else target
    return f"lazymath_vm_{op}_{dtype}" + (f".{target}" if target else "")


_EXPANSIONS: dict = {}


def expand_call(i: VMathCall, prefix: str = "vmx") -> tuple[list, list]:
    """(instructions, scratch buffers) equal to the call: the composite strip-mined in CHUNKs.
    Scratch buffers are named `prefix`<k> (the interpreter gives each its own memory).
    Memoized per instruction (the interpreter and the cost model expand every tile's call)."""
    key = (i, prefix)
    hit = _EXPANSIONS.get(key)
    if hit is None:
        b = isa.Builder(tile=CALL_CAP, prefix=prefix)
        emit_composite(b, i.op, i.dst, tuple(i.srcs), i.n, i.dtype, cap=CALL_CAP)
        hit = (b.body, b.buffers)
        if len(_EXPANSIONS) > 4096:
            _EXPANSIONS.clear()
        _EXPANSIONS[key] = hit
    return hit


_FOOTPRINT: dict = {}


def call_footprint(op: str, dtype: str, tile: int, arity: int) -> tuple[tuple, tuple]:
    """What the inlined composite would take from a template's tile pool, recorded once:
    ((dtype, size) of each pooled scratch, in borrowing order), ((dtype, size, key) of each
    buffer outside the pool; key: the coefficient chunk it holds, shared per expression).
    Raises NotImplementedError like `emit_composite` for what it cannot expand. The caller
    borrows (and returns) the same pool tiles and declares the others, so a kernel calling the
    library has the UB footprint, the tile and the chunking of the kernel that inlines it."""
    key = (op, dtype, tile, arity)
    hit = _FOOTPRINT.get(key)
    if hit is not None:
        return hit
    pool = TilePool(tile)
    tb = TileBuilder(pool)
    tb.shared_consts = {}
    src = pool.get(dtype)
    dst = pool.get(dtype)
    emit_composite(tb, op, dst, (src,) * arity, tile, dtype)
    pooled = tuple((r.buf.dtype, r.buf.size) for r in tb.borrowed)
    const_of = {r.buf.name: k for k, r in tb.shared_consts.items()}
    other = tuple((buf.dtype, buf.size, const_of.get(buf.name)) for buf in tb.buffers)
    _FOOTPRINT[key] = (pooled, other)
    return _FOOTPRINT[key]


@interp.register(VMathCall)
def _interp_vmath_call(m, i: VMathCall) -> None:
    import numpy as np

    body, bufs = expand_call(i, prefix=f"vmx_{i.op}_{i.dtype}_")
    for buf in bufs:
        have = m.mem.get(buf.name)
        if have is None or have.size != buf.size or have.dtype != np.dtype(buf.dtype):
            m.mem[buf.name] = np.zeros(buf.size, dtype=buf.dtype)
    saved = dict(m.env)
    try:
        m.run(body)
    finally:
        m.env = saved


@cost.register(VMathCall)
def _cost_vmath_call(ctx, i: VMathCall):
    body, _ = expand_call(i)
    saved = dict(ctx.env)
    ctx.run(body)
    ctx.env = saved
    return "Scalar", 1, 0.0
