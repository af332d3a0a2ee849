"""vmath's trigonometry: sin, cos and tan.

The default (what an NPU runs) is float32-only: below 2^17 sin and cos reduce by pi in three
fmas and evaluate one odd polynomial (`_sincos_half`, 20-22 instructions, <= 2 ulp), tan by
pi/2 into a float32 pair (`_cw_reduce`); above, Payne-Hanek with 2/pi in 24-bit integer chunks
(`_trig32`, <= 1 ulp); LAZYMATH_HOST_MATH picks the host-only float64
reduction with the exponent-group table (`_sincos32`, `_tan32`); either way each chunk
branches once on its largest |x| (`_trig_by_range`). The reasoning is in the package
docstring (`vmath/__init__.py`).
"""

from __future__ import annotations

import math

from lazymath.backend.npu import isa
from lazymath.backend.npu.vmath.core import (
    _UID,
    GetValue,
    _Seq,
    round_f32,
)

# sin(pi*v) = v * P(v^2), |v| <= 1/2, evaluated in float64 for float32 results: rel err 2^-27.5
SINPI5 = (3.1415926368260165, -5.167709674619445, 2.550069495752363, -0.5982404749746734,
          0.07755672950425486)  # fmt: skip


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
# rounded result over the whole float32 range, like the float64 lowering. sin and cos of a
# chunk below 2^17 take the shorter `_sincos_half` instead (<= 2 ulp).
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
    _apply_sign(s, dst, x, res, sign, op)


def _apply_sign(s: _Seq, dst: isa.Ref, x: isa.Ref, res: isa.Ref, sign: isa.Ref, op: str) -> None:
    """dst = res with its sign bit xor `sign` (the quadrant's sign, an int32 sign bit); sin and
    tan keep x's -0 (the reductions give +0 there). Frees res and sign."""
    rb = s.conv(res, "int32", "bits")
    s.bin("vxor", rb, sign, out=rb)
    s.done(sign)
    if op == "cos":
        s.conv(rb, "float32", "bits", out=dst)
        s.done(rb, res)
        return
    s.conv(rb, "float32", "bits", out=res)
    s.done(rb)
    zero = s.cmps("eq", x, 0.0)
    s.sel(zero, x, res, out=dst)
    s.done(zero, res)


# sin / cos below 2^17 (the common chunk): half turns, x = q*pi + r, |r| <= pi/2 + 0.013, one
# float32 r and one odd polynomial; pi = PI_1 + PI_2 + PI_3 (float32 parts, 2^-75 off).
_PI_1 = 3.1415927410125732  # float32(pi)
_PI_2 = -8.742277657347586e-08  # float32(pi - _PI_1)
_PI_3 = -3.4302490200117637e-15  # float32(pi - _PI_1 - _PI_2)
# sin(r) = r + r^3 P(r^2), |r| <= 1.59; Remez on the relative error (mpmath, 50 digits), the
# coefficients rounded to float32 lowest first (the rest refitted): relative error 2^-30.2.
SIN_HALF_F32 = (-0.1666666716337204, 0.008333354257047176, -0.00019843743939418346,
                2.7662840693665203e-06, -2.6131978358989727e-08)  # fmt: skip


def _sincos_half(s: _Seq, dst: isa.Ref, x: isa.Ref, op: str) -> None:
    """sin / cos of float32 x, every |x| < 2^17, in 20-22 float32/int32 instructions.

    q = rint(x * float32(1/pi) [+ 1/2]) by the 1.5*2^23 magic add (its last bit: q's parity,
    the sign (-1)^q, applied as an xor at the end); q may be the neighbour of rint(x/pi) near
    a half-integer (|r| then reaches pi/2 + 0.013, inside the polynomial's interval) and any
    integer q is right: sin(x) = (-1)^q sin(x - q*pi). cos: h = q - 1/2, cos(x) = (-1)^q
    sin(x - h*pi). Cody-Waite in three fmas: r1 = x - h*PI_1 is exact (a multiple of 2^-23
    below 2); r2 = r1 - h*PI_2 is exact when |r2| < 2^-23 (a multiple of 2^-47), else rounds
    by < 2^-25 relative; r3 = r2 - h*PI_3 rounds once more. Where x is closest to a multiple
    of pi below 2^17 (|r| > 2^-28) the argument is still good to ~2^-24 relative: <= 2 ulp
    from the correctly rounded result (the pair reduction of `_cw_reduce` gets 1, at twice the
    instructions). sin(-0) = -0 by a final select (r + r^3 P turns -0 into +0).
    """
    t = s.sc("vmuls", x, _INVPI32)
    if op == "cos":
        s.sc("vadds", t, 0.5, out=t)
    s.sc("vadds", t, _MAGIC32, out=t)
    sign = s.conv(t, "int32", "bits")
    s.sc("vshl", sign, 31, out=sign)  # (-1)^q as the float32 sign bit
    h = s.sc("vadds", t, -_MAGIC32, out=t)
    if op == "cos":
        s.sc("vadds", h, -0.5, out=h)  # exact: |q| < 2^16
    r = s.fma(h, s.const("float32", -_PI_1), x)
    s.fma(h, s.const("float32", -_PI_2), r, out=r)
    s.fma(h, s.const("float32", -_PI_3), r, out=r)
    s.done(h)
    z = s.bin("vmul", r, r)
    p = s.horner_fma(z, SIN_HALF_F32)
    s.bin("vmul", z, r, out=z)
    res = s.fma(z, p, r, out=p)
    s.done(z, r)
    _apply_sign(s, dst, x, res, sign, op)


def _sincos_npu(s: _Seq, dst: isa.Ref, x: isa.Ref, op: str, small: bool) -> None:
    """float32-only sin / cos: `_sincos_half` below 2^17, else `_trig32` (Payne-Hanek)."""
    if small:
        _sincos_half(s, dst, x, op)
    else:
        _trig32(s, dst, x, op, False)


_TRIG_NPU = {
    "sin": lambda s, d, x, small: _sincos_npu(s, d, x, "sin", small),
    "cos": lambda s, d, x, small: _sincos_npu(s, d, x, "cos", small),
    "tan": lambda s, d, x, small: _trig32(s, d, x, "tan", small),
}


def _trig_table(host_math: bool) -> dict:
    return _TRIG_HOST if host_math else _TRIG_NPU
