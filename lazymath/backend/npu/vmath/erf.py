"""vmath's erf and erfc on float16/float32 (computed in float64, rounded once)."""

from __future__ import annotations

from lazymath.backend.npu import isa
from lazymath.backend.npu.vmath.core import (
    _narrow,
    _Seq,
    _wide,
)

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
