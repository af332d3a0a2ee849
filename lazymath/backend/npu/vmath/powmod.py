"""vmath's pow (C99/numpy special cases, float32 and float64) and float32 floor_divide and
remainder (exact, branch-free long division: numpy's results bit for bit)."""

from __future__ import annotations

import math

from lazymath.backend.npu import isa
from lazymath.backend.npu.vmath.core import _Seq


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
