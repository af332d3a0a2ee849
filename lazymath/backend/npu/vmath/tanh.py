"""vmath's tanh, sigmoid and exp2 (float32 and, for tanh and sigmoid, float64)."""

from __future__ import annotations

import math

from lazymath.backend.npu import isa
from lazymath.backend.npu.vmath.core import _Seq

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
