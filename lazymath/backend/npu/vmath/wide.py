"""vmath's functions of issue 16 on float16/float32, computed in float64 and rounded once:
log1p, expm1, log2, log10, sinh, cosh, asinh, acosh, atanh, hypot, logaddexp, atan, asin, acos
and atan2 (float64 inputs go to the host libm)."""

from __future__ import annotations

import math

from lazymath.backend.npu import isa
from lazymath.backend.npu.vmath.core import (
    _narrow,
    _Seq,
    _wide,
)

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
