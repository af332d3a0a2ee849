"""The native transcendentals' LLVM bodies: the scalar ``vexp`` / ``vln`` functions.

On the NPU ``vexp`` and ``vln`` are instructions (`npu.vmath.NATIVE_OPS`); on the host each is
a scalar LLVM function, alwaysinline and branch-free (selects only), so a loop calling it still
vectorizes. The ISA lowering (`lower_llvm.LowerCtx.native`) defines it once per module and
float16 callers widen to float32 first. The composites built from native instructions (sin,
tanh, pow, ...) are NPU programs and live in `npu/vmath.py`, with the accuracy contract both
halves meet (tests/backend/test_vmath.py).

exp: k = round(x / ln2), r = x - k*ln2 in two parts, exp(r) = 1 + r + r^2 * P(r), scaled by
2^k (vscalef on AVX-512 targets, exponent bits elsewhere); log: the mantissa/exponent split
and log(1+f) = f - f^2/2 + s*(f^2/2 + R(s^2)), s = f/(2+f).
"""

from __future__ import annotations

import math

from llvmlite import ir

from lazymath.backend.native import host
from lazymath.backend.npu.vmath import NATIVE_OPS, round_f32

# exp(r) = 1 + r + r^2 * P(r), |r| <= ln2/2 (+5e-4 slack for the float32 rounding of k)
EXP_F32 = (0.4999999339509693, 0.16666519849660108, 0.041668397249614124,
           0.00836881167933121, 0.0013814402212155492)  # rel err 2^-28.3  # fmt: skip
EXP_F64 = (0.5, 0.16666666666666685, 0.04166666666666577, 0.008333333333316538,
           0.0013888888889222086, 0.00019841269897482954, 2.4801586767277272e-05,
           2.7557233850789542e-06, 2.755769258926031e-07, 2.5112367652527006e-08,
           2.079757135827625e-09)  # rel err 2^-63.7  # fmt: skip
# log(1+f) = f - f^2/2 + s*(f^2/2 + R), s = f/(2+f), R = z*L(z), z = s^2 <= 0.0295
LOG_F32 = (0.6666666575420286, 0.4000033985210901, 0.28535986655206047, 0.236187252251587)
LOG_F64 = (0.666666666666671, 0.3999999999951718, 0.28571428730011333, 0.22222199005393076,
           0.1818357643089106, 0.15313030178560308, 0.14811936241135093)  # 2^-57.6  # fmt: skip

_F32, _F64 = ir.FloatType(), ir.DoubleType()
_I32, _I64 = ir.IntType(32), ir.IntType(64)


class _Fn:
    """Small helper around an IRBuilder for straight-line float code with intrinsics."""

    def __init__(self, module: ir.Module, fn: ir.Function, ft: ir.Type):
        self.m, self.ft = module, ft
        self.it = _I32 if ft == _F32 else _I64
        self.sfx = "f32" if ft == _F32 else "f64"
        self.b = ir.IRBuilder(fn.append_basic_block("entry"))

    def c(self, v: float) -> ir.Constant:
        return ir.Constant(self.ft, round_f32(v) if self.ft == _F32 else float(v))

    def ci(self, v: int) -> ir.Constant:
        return ir.Constant(self.it, v)

    def intr(self, name: str, *args: ir.Value) -> ir.Value:
        full = f"llvm.{name}.{self.sfx}"
        fn = self.m.globals.get(full)
        if fn is None:
            fn = ir.Function(self.m, ir.FunctionType(self.ft, [self.ft] * len(args)), name=full)
        return self.b.call(fn, list(args))

    def fma(self, a, b, c):
        return self.intr("fma", a, b, c)

    def horner(self, x, coeffs):
        """coeffs[0] + x*(coeffs[1] + ...) with one fma per step."""
        acc = self.c(coeffs[-1])
        for co in reversed(coeffs[:-1]):
            acc = self.fma(acc, x, self.c(co))
        return acc

    def sel(self, cond, a, b):
        return self.b.select(cond, a, b)

    def fcmp(self, op, a, b):
        return self.b.fcmp_ordered(op, a, b)


def _native_name(op: str, dtype: str) -> str:
    return f"lazymath.vmath.{op}.{dtype}"


def define_native(module: ir.Module, op: str, dtype: str) -> ir.Function:
    """Define (once per module) the scalar body of native `op` ("vexp"/"vln") for `dtype`.

    float32 and float64 only: the lowering computes float16 in float32 (fpext before, fptrunc
    after), which is exact for exp/log since float32 carries 13 more bits than float16.
    """
    if op not in NATIVE_OPS:
        raise ValueError(f"define_native: {op!r} is not a native transcendental ({NATIVE_OPS})")
    if dtype not in ("float32", "float64"):
        raise ValueError(f"define_native: dtype {dtype!r} (float16 is computed as float32)")
    name = _native_name(op, dtype)
    existing = module.globals.get(name)
    if existing is not None:
        return existing
    ft = _F32 if dtype == "float32" else _F64
    fn = ir.Function(module, ir.FunctionType(ft, [ft]), name=name)
    fn.linkage = "internal"
    fn.attributes.add("alwaysinline")
    fn.attributes.add("nounwind")
    h = _Fn(module, fn, ft)
    x = fn.args[0]
    res = _exp_body(h, x) if op == "vexp" else _log_body(h, x)
    h.b.ret(res)
    return fn


def _pow2(h: _Fn, k: ir.Value) -> ir.Value:
    """2^k as a float for an integer k in the normal exponent range (built from the bits)."""
    mant = 23 if h.ft == _F32 else 52
    bias = 127 if h.ft == _F32 else 1023
    bits = h.b.shl(h.b.add(k, h.ci(bias)), h.ci(mant))
    return h.b.bitcast(bits, h.ft)


def _exp_body(h: _Fn, x: ir.Value) -> ir.Value:
    """exp(x) = 2^k * exp(r), k = rint(x/ln2), r = x - k*ln2 (Cody-Waite with fma, exact hi part).

    The clamp keeps k in range (and makes fptosi safe); overflow to inf and gradual underflow
    then come out of the final two multiplies by 2^k1 * 2^k2 (k = k1 + k2, each factor normal),
    so the denormal result is rounded once, correctly. NaN is restored at the end.
    With AVX-512 (`_has_scalef`) the scaling is one llvm.ldexp (vscalefps/pd: same bits,
    rounded once) and NaN passes the clamps, so neither the split nor the NaN select is needed
    (float32 exp over L2-resident rows measured 0.73 -> 0.37 ns/element on an AVX-512 host).
    """
    b, f32 = h.b, h.ft == _F32
    lo, hi = (-104.0, 89.0) if f32 else (-746.0, 710.0)
    scalef = _has_scalef()
    if scalef:  # NaN passes both clamps (ordered compares are false) and stays NaN
        xc = h.sel(h.fcmp("<", x, h.c(lo)), h.c(lo), x)
        xc = h.sel(h.fcmp(">", xc, h.c(hi)), h.c(hi), xc)
    else:
        xc = h.sel(h.fcmp(">", x, h.c(lo)), x, h.c(lo))  # NaN -> lo (fixed at the end)
        xc = h.sel(h.fcmp("<", xc, h.c(hi)), xc, h.c(hi))
    ln2 = math.log(2.0)
    if f32:  # k*ln2_hi is exact in the fma; ln2_lo carries the next 24 bits
        ln2_hi = round_f32(ln2)
        ln2_lo = round_f32(ln2 - ln2_hi)
    else:
        ln2_hi, ln2_lo = ln2, 2.3190468138462996e-17  # ln2 - double(ln2)
    kf = h.intr("rint", b.fmul(xc, h.c(1.4426950408889634)))
    r = h.fma(kf, h.c(-ln2_hi), xc)
    r = h.fma(kf, h.c(-ln2_lo), r)
    q = h.horner(r, EXP_F32 if f32 else EXP_F64)
    p = b.fadd(h.c(1.0), h.fma(b.fmul(r, r), q, r))
    k = b.fptosi(kf, _I32)  # i32 even for doubles: AVX2 has no vector double -> i64 convert
    if scalef:  # one vscalefps/pd: p * 2^k rounded once (overflow, gradual underflow, NaN)
        k = _freeze(b, k)  # fptosi(NaN) is poison; any i32 scales NaN to NaN
        return _ldexp(h, p, k)
    k1 = b.ashr(k, ir.Constant(_I32, 1))
    k2 = b.sub(k, k1)
    if not f32:
        k1, k2 = b.sext(k1, _I64), b.sext(k2, _I64)
    res = b.fmul(b.fmul(p, _pow2(h, k1)), _pow2(h, k2))
    return h.sel(b.fcmp_unordered("uno", x, x), x, res)


def _has_scalef() -> bool:
    """Does the code target have AVX-512 (vscalefps/pd: LLVM lowers llvm.ldexp to it)? Elsewhere
    ldexp is a libm call per element, so the exponent is built from the bits instead.

    Both paths give the same bits, so this only ever decides speed."""
    return host.target().avx512


def _freeze(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """LLVM `freeze` (llvmlite's builder has none): poison becomes some fixed value."""
    instr = ir.instructions.Instruction(b.block, v.type, "freeze", [v])
    b._insert(instr)
    return instr


def _ldexp(h: _Fn, p: ir.Value, k: ir.Value) -> ir.Value:
    name = f"llvm.ldexp.{h.sfx}.i32"
    fn = h.m.globals.get(name)
    if fn is None:
        fn = ir.Function(h.m, ir.FunctionType(h.ft, [h.ft, _I32]), name=name)
    return h.b.call(fn, [p, k])


def _log_body(h: _Fn, x: ir.Value) -> ir.Value:
    """log(x) = k*ln2 + log(m), m in [sqrt(1/2), sqrt(2)) from the bits (frexp by integer ops).

    log(m) = 2*atanh(s) = 2s + s*R(s^2) with f = m - 1 (exact) and s = f/(2+f): the division
    buys a short polynomial in s^2 <= 0.03. float32 evaluates this tail in float64 (see
    LOG_F32_IN_F64); float64 uses the FreeBSD arrangement f - f^2/2 + s*(f^2/2 + R) with ln2
    split in two, under 1 ulp. Denormal inputs are scaled by 2^23 (2^54) first; 0 -> -inf,
    x < 0 -> nan, inf -> inf, nan -> nan.
    """
    b, f32 = h.b, h.ft == _F32
    mant = 23 if f32 else 52
    tiny = 2.0**-126 if f32 else 2.0**-1022
    scale = 23 if f32 else 54
    den = h.fcmp("<", x, h.c(tiny))
    xs = h.sel(den, b.fmul(x, h.c(2.0**scale)), x)
    ix = b.bitcast(xs, h.it)
    # shift so that the mantissa field splits at sqrt(1/2): m in [0.7071, 1.4142)
    sqrt_half_bits = 0x3F3504F3 if f32 else 0x3FE6A09E667F3BCD
    one_bits = 0x3F800000 if f32 else 0x3FF0000000000000
    ix2 = b.add(ix, h.ci(one_bits - sqrt_half_bits))
    bias = 127 if f32 else 1023
    k = b.sub(b.ashr(ix2, h.ci(mant)), h.ci(bias))
    k = b.sub(k, b.select(den, h.ci(scale), h.ci(0)))
    mbits = b.add(b.and_(ix2, h.ci((1 << mant) - 1)), h.ci(sqrt_half_bits))
    m = b.bitcast(mbits, h.ft)
    f = b.fsub(m, h.c(1.0))
    if f32 and LOG_F32_IN_F64:
        res = _log_tail_f64(h, f, k)
    else:
        res = _log_tail(h, f, k)
    inf = h.c(math.inf)
    res = h.sel(h.fcmp("==", x, inf), inf, res)
    res = h.sel(h.fcmp("==", x, h.c(0.0)), h.c(-math.inf), res)
    bad = b.fcmp_unordered("<", x, h.c(0.0))  # x < 0 or nan
    return h.sel(bad, h.c(math.nan), res)


# float32 log evaluated in float64 after the (exact) float32 argument reduction: correctly
# rounded (no miss in 2^28 sampled bit patterns). numpy's float32 log is itself up to 4 ulp
# off, so only a correctly rounded log is guaranteed within 4 ulp of numpy. Costs a float64
# division: ~40% more time for vln alone, ~8% for sin+exp+log in one kernel. False selects the
# all-float32 tail (faithful, ~0.3% of results 1 ulp off; up to 5 ulp from numpy).
LOG_F32_IN_F64 = True


def _log_tail_f64(h: _Fn, f: ir.Value, k: ir.Value) -> ir.Value:
    """k*ln2 + log1p(f) for float32 f, k, computed in float64 and rounded once."""
    b = h.b
    d = _Fn.__new__(_Fn)
    d.m, d.ft, d.it, d.sfx, d.b = h.m, _F64, _I64, "f64", b
    fd = b.fpext(f, _F64)
    s = b.fdiv(fd, b.fadd(d.c(2.0), fd))
    z = b.fmul(s, s)
    r = b.fmul(z, d.horner(z, LOG_F64))  # 2^-57: the float32 rounding is the only error
    lg = d.fma(s, r, b.fadd(s, s))  # 2*atanh(s) = 2s + s*R
    res = d.fma(b.sitofp(k, _F64), d.c(math.log(2.0)), lg)
    return b.fptrunc(res, _F32)


def _log_tail(h: _Fn, f: ir.Value, k: ir.Value) -> ir.Value:
    """k*ln2 + log1p(f) in the working precision (FreeBSD-style: faithful)."""
    b, f32 = h.b, h.ft == _F32
    s = b.fdiv(f, b.fadd(h.c(2.0), f))
    z = b.fmul(s, s)
    r = b.fmul(z, h.horner(z, LOG_F32 if f32 else LOG_F64))
    hfsq = b.fmul(b.fmul(h.c(0.5), f), f)
    dk = b.sitofp(k if f32 else b.trunc(k, _I32), h.ft)  # i32: vectorizable on AVX2
    if f32:
        ln2_hi, ln2_lo = 6.9313812256e-01, 9.0580006145e-06  # ln2_hi has 16 trailing zero bits
    else:
        ln2_hi, ln2_lo = 6.93147180369123816490e-01, 1.90821492927058770002e-10
    t = h.fma(s, b.fadd(hfsq, r), b.fmul(dk, h.c(ln2_lo)))
    return b.fsub(b.fmul(dk, h.c(ln2_hi)), b.fsub(b.fsub(hfsq, t), f))
