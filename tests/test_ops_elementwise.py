"""Elementwise ops, operators and casts against numpy, on every backend.

Protects: numpy's values *and* result dtypes (NEP 50 promotion, weak Python scalars) for every
elementwise op of the public API, on awkward shapes (0-d, 0-size, 1, primes, size-1 axes) and
layouts (transposed, strided, negative strides, broadcast views), plus numpy's special-value
semantics (NaN, +-inf, +-0). An op numpy rejects for a dtype must be rejected at the call with
TypeError.
"""

from __future__ import annotations

import math
import operator

import numpy as np
import pytest

import lazymath as lm
from lazymath.graph.ops import BINARY as BINARY_OPS
from lazymath.graph.ops import ELEMENTWISE
from lazymath.graph.ops import UNARY as UNARY_OPS
from lazymath.testing.standard import std_floor_divide

DTYPES = ["float16", "float32", "float64", "int8", "int32", "int64", "bool"]
# every layout is tried on the prime-sized shape; the edge shapes are tried contiguous
LAYOUT_SHAPE = (7, 13)
EDGE_SHAPES = [(), (0,), (1,), (0, 3), (3, 1, 5)]
F16_TRANSCENDENTAL = dict(rtol=2e-3, atol=2e-3)


def _cases(data, dtype, lo, hi, nonzero=False, layouts=True):
    """[(label, numpy input, lazymath input)] over edge shapes and layouts."""
    out = []
    if layouts:
        for name, a, t in data.layouts(LAYOUT_SHAPE, dtype, lo, hi, nonzero):
            out.append((f"{LAYOUT_SHAPE}/{name}", a, t))
    for shape in EDGE_SHAPES:
        a = data.rand(shape, dtype, lo, hi, nonzero)
        out.append((f"{shape}", a, lm.tensor(a)))
    return out


def _dtype_of(ufunc, *dtypes) -> np.dtype:
    """numpy's result dtype for `ufunc` on these dtypes (raises TypeError like numpy)."""
    return ufunc(*[np.zeros(1, d) for d in dtypes]).dtype


def _via_float64(fn, rule):
    """Expected value computed in float64 and rounded once to numpy's result dtype `rule`."""

    def expected(x):
        d = _dtype_of(rule, x.dtype)
        with np.errstate(all="ignore"):
            return np.asarray(fn(x.astype(np.float64))).astype(d)

    return expected


def _exact(ufunc):
    def expected(x):
        with np.errstate(all="ignore"):
            return ufunc(x)

    return expected


def _relu(x):
    _dtype_of(np.positive, x.dtype)  # numpy's rule: bool has no relu (TypeError)
    return np.maximum(x, x.dtype.type(0))


def _round(x):
    return np.round(x)


def _leaky(x, slope=0.01):
    d = _dtype_of(np.sqrt, x.dtype)
    x64 = x.astype(np.float64)
    return np.where(x64 >= 0, x64, x64 * slope).astype(d)


# name -> (expected(x), (lo, hi) input domain, transcendental?)
UNARY = {
    "neg": (_exact(np.negative), (-3, 3), False),
    "abs": (_exact(np.absolute), (-3, 3), False),
    "exp": (_via_float64(np.exp, np.exp), (-5, 5), True),
    "exp2": (_via_float64(np.exp2, np.exp2), (-5, 5), True),
    "log": (_via_float64(np.log, np.log), (0.1, 10), True),
    "sqrt": (_via_float64(np.sqrt, np.sqrt), (0, 10), True),
    "rsqrt": (_via_float64(lambda x: 1 / np.sqrt(x), np.sqrt), (0.1, 10), True),
    "reciprocal": (_via_float64(lambda x: 1 / x, np.sqrt), (0.5, 4), True),
    "sin": (_via_float64(np.sin, np.sin), (-4, 4), True),
    "cos": (_via_float64(np.cos, np.cos), (-4, 4), True),
    "tan": (_via_float64(np.tan, np.tan), (-1.2, 1.2), True),
    "tanh": (_via_float64(np.tanh, np.tanh), (-4, 4), True),
    "sigmoid": (_via_float64(lambda x: 1 / (1 + np.exp(-x)), np.exp), (-6, 6), True),
    "relu": (_relu, (-3, 3), False),
    "leaky_relu": (_leaky, (-3, 3), False),
    "sign": (_exact(np.sign), (-3, 3), False),
    "floor": (_exact(np.floor), (-3, 3), False),
    "ceil": (_exact(np.ceil), (-3, 3), False),
    "round": (_round, (-3, 3), False),
    "logical_not": (_exact(np.logical_not), (-2, 2), False),
    # the Array API's (issue 16)
    "isnan": (_exact(np.isnan), (-3, 3), False),
    "isinf": (_exact(np.isinf), (-3, 3), False),
    "isfinite": (_exact(np.isfinite), (-3, 3), False),
    "signbit": (_exact(np.signbit), (-3, 3), False),
    "trunc": (_exact(np.trunc), (-3, 3), False),
    "square": (_exact(np.square), (-3, 3), False),
    "bitwise_invert": (_exact(np.invert), (-3, 3), False),
    "log1p": (_via_float64(np.log1p, np.log1p), (-0.9, 10), True),
    "expm1": (_via_float64(np.expm1, np.expm1), (-5, 5), True),
    "log2": (_via_float64(np.log2, np.log2), (0.1, 10), True),
    "log10": (_via_float64(np.log10, np.log10), (0.1, 10), True),
    "sinh": (_via_float64(np.sinh, np.sinh), (-5, 5), True),
    "cosh": (_via_float64(np.cosh, np.cosh), (-5, 5), True),
    "asinh": (_via_float64(np.arcsinh, np.arcsinh), (-5, 5), True),
    "acosh": (_via_float64(np.arccosh, np.arccosh), (1, 10), True),
    "atanh": (_via_float64(np.arctanh, np.arctanh), (-0.9, 0.9), True),
    "asin": (_via_float64(np.arcsin, np.arcsin), (-1, 1), True),
    "acos": (_via_float64(np.arccos, np.arccos), (-1, 1), True),
    "atan": (_via_float64(np.arctan, np.arctan), (-5, 5), True),
    # issue 33 (numpy has no erf: the C library's, per element)
    "erf": (_via_float64(np.frompyfunc(math.erf, 1, 1), np.exp), (-4, 4), True),
    "erfc": (_via_float64(np.frompyfunc(math.erfc, 1, 1), np.exp), (-4, 6), True),
}


def test_every_unary_op_is_tested():
    """A new unary op record needs a row above (its oracle and input domain)."""
    assert set(UNARY) == UNARY_OPS


def _tol(dtype, transcendental):
    if np.dtype(dtype) == np.float16 and transcendental:
        return F16_TRANSCENDENTAL
    return {}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary(backend, check, data, op, dtype):
    expected_fn, (lo, hi), trans = UNARY[op]
    fn = getattr(lm, op)
    try:
        _ = expected_fn(data.rand((2,), dtype, lo, hi))
    except TypeError:
        with pytest.raises(TypeError, match=op):
            fn(lm.tensor(data.rand((2,), dtype, lo, hi)))
        return
    layouts = op not in ISSUE16 or dtype in ("float32", "int32")
    cases = _cases(data, dtype, lo, hi, nonzero=op in ("reciprocal",), layouts=layouts)
    outs = [fn(t) for _, _, t in cases]
    lm.realize(*outs)
    for (label, a, _), out in zip(cases, outs):
        try:
            check(out, expected_fn(a), **_tol(dtype, trans))
        except AssertionError as e:
            raise AssertionError(f"{op}({dtype} {label}): {e}") from None


def test_unary_methods_and_aliases(backend, check, data):
    a = data.rand((7, 13), "float32")
    t = lm.tensor(a)
    check(abs(t), np.abs(a))
    check(-t, -a)
    check(+t, a)
    check(lm.negative(t), -a)
    check(lm.leaky_relu(t, negative_slope=0.2), np.where(a >= 0, a, a * np.float32(0.2)))
    check(t.clip(-1, 1), np.clip(a, -1, 1))


SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.5, 1e-3, 60.0])


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("op", sorted(set(UNARY) - {"logical_not"}))
def test_unary_special_values(backend, check, op, dtype):
    """NaN, infinities and signed zeros behave as in numpy (NaN in -> NaN out, etc.)."""
    expected_fn, _, trans = UNARY[op]
    a = SPECIAL.astype(dtype)
    try:
        want = expected_fn(a)
    except TypeError:  # bitwise_invert has no float loop: rejected at the call
        with pytest.raises(TypeError, match=op):
            getattr(lm, op)(lm.tensor(a))
        return
    check(getattr(lm, op)(lm.tensor(a)), want, **_tol(dtype, trans))


def test_logical_not_special_values(backend, check):
    a = SPECIAL.astype(np.float32)
    check(lm.logical_not(lm.tensor(a)), np.logical_not(a))


# ----------------------------------------------------------------------------- binary


# every binary op of the registry -> the numpy ufunc that defines it (the oracle is numpy)
BINARY = {k: ELEMENTWISE[k].info.dtypes.ufunc for k in sorted(BINARY_OPS)}
BINARY["floor_divide"] = std_floor_divide  # the standard, not numpy, where an operand is inf
DIVISIONS = ("div", "floor_divide", "remainder")

PAIRS = [(d, d) for d in DTYPES] + [
    ("float16", "float32"),
    ("int8", "float16"),
    ("int32", "float32"),
    ("int64", "float32"),
    ("int8", "int32"),
    ("bool", "int32"),
    ("int32", "float16"),
    ("bool", "float16"),
]


def _domains(op, da, db):
    """Input ranges that keep numpy well defined and exact: no integer division by zero, no
    negative integer powers, no negative float bases (those are tested separately)."""
    a_dom, b_dom, b_nonzero = (-3, 3), (-3, 3), op in DIVISIONS
    if op == "pow":
        a_dom = (0.25, 3) if np.dtype(da).kind == "f" else (-3, 3)
        b_dom = (-2, 2) if np.dtype(db).kind == "f" else (0, 3)
    return a_dom, b_dom, b_nonzero


# issue 16's ops share the templates' dtype and layout handling with the ops above: they are
# tested on every dtype and layout, but mixed-dtype promotion on two pairs only (CI time)
ISSUE16 = {"isnan", "isinf", "isfinite", "signbit", "trunc", "square", "bitwise_invert", "log1p",
           "expm1", "log2", "log10", "sinh", "cosh", "asinh", "acosh", "atanh", "asin", "acos",
           "atan", "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_left_shift",
           "bitwise_right_shift", "copysign", "hypot", "logaddexp", "atan2"}  # fmt: skip
BINARY_CASES = [(op, da, db) for op in sorted(BINARY) for da, db in PAIRS
                if op not in ISSUE16 or da == db or (da, db) in PAIRS[-2:]]  # fmt: skip


@pytest.mark.parametrize("op,da,db", BINARY_CASES, ids=[f"{o}-{a}-{b}" for o, a, b in BINARY_CASES])
def test_binary(backend, check, data, op, da, db):
    ufunc, fn = BINARY[op], getattr(lm, op)
    a_dom, b_dom, nz = _domains(op, da, db)
    try:
        _dtype_of(ufunc, da, db)
    except TypeError:
        with pytest.raises(TypeError, match=op):
            fn(lm.tensor(data.rand((2,), da)), lm.tensor(data.rand((2,), db)))
        return
    cases = []  # (label, a, b, ta, tb)
    b_full = data.rand(LAYOUT_SHAPE, db, *b_dom, nonzero=nz)
    layouts = data.layouts(LAYOUT_SHAPE, da, *a_dom) if da == db else []
    for name, a, t in layouts:  # every layout of a against a contiguous b, and swapped
        cases.append((f"a:{name}", a, b_full, t, lm.tensor(b_full)))
    for name, b, t in data.layouts(LAYOUT_SHAPE, db, *b_dom, nonzero=nz)[:3]:
        a = data.rand(LAYOUT_SHAPE, da, *a_dom)
        cases.append((f"b:{name}", a, b, lm.tensor(a), t))
    for sa, sb in [((7, 1), (1, 13)), ((), (5,)), ((0, 3), (1, 3)), ((2, 1, 3), (4, 1))]:
        a = data.rand(sa, da, *a_dom)
        b = data.rand(sb, db, *b_dom, nonzero=nz)
        cases.append((f"{sa}x{sb}", a, b, lm.tensor(a), lm.tensor(b)))
    outs = [fn(ta, tb) for *_, ta, tb in cases]
    lm.realize(*outs)
    for (label, a, b, _, _), out in zip(cases, outs):
        with np.errstate(all="ignore"):
            want = ufunc(a, b)
        tol = _tol(want.dtype, op == "pow")
        try:
            check(out, want, **tol)
        except AssertionError as e:
            raise AssertionError(f"{op}({da}, {db}) {label}: {e}") from None


SPECIAL_A, SPECIAL_B = np.meshgrid(SPECIAL, SPECIAL)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("op", sorted(BINARY))
def test_binary_special_values(backend, check, op, dtype):
    """Every pair of special values (NaN, +-inf, +-0, ...) matches numpy, including NaN
    propagation of maximum/minimum and numpy's floor_divide/remainder sign rules (floor_divide: the standard's inf cases)."""
    a, b = SPECIAL_A.astype(dtype), SPECIAL_B.astype(dtype)
    with np.errstate(all="ignore"):
        try:
            want = BINARY[op](a, b)
        except TypeError:  # bitwise ops and shifts have no float loops: rejected at the call
            with pytest.raises(TypeError, match=op):
                getattr(lm, op)(lm.tensor(a), lm.tensor(b))
            return
    check(getattr(lm, op)(lm.tensor(a), lm.tensor(b)), want, **_tol(dtype, op == "pow"))


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64"])
def test_integer_division_signs(backend, check, dtype):
    """Integer floor_divide/remainder round toward -inf like numpy (not C truncation)."""
    v = np.array([-7, -6, -1, 0, 1, 6, 7], dtype=dtype)
    a, b = np.meshgrid(v, np.array([-3, -2, -1, 1, 2, 3], dtype=dtype))
    ta, tb = lm.tensor(a), lm.tensor(b)
    check(lm.floor_divide(ta, tb), np.floor_divide(a, b))
    check(lm.remainder(ta, tb), np.remainder(a, b))
    check(ta // 2, a // 2)
    check(ta % -3, a % -3)


def test_integer_overflow_wraps(backend, check):
    a = np.array([100, -100, 127, -128], dtype=np.int8)
    t = lm.tensor(a)
    check(t + t, a + a)
    check(t * 3, a * np.int8(3))
    check(-t, -a)


# ----------------------------------------------------------------------------- scalars


SCALARS = [2, -1, 2.5, True, 0.0]


@pytest.mark.parametrize("scalar", SCALARS, ids=repr)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", sorted(BINARY))
def test_scalar_operands(backend, check, data, op, dtype, scalar):
    """Python scalars are weak (NEP 50): `t op s` and `s op t` have numpy's dtype and value."""
    ufunc, fn = BINARY[op], getattr(lm, op)
    a = data.rand((3, 5), dtype, 1, 3, nonzero=True)  # positive: valid divisor and exponent
    t = lm.tensor(a)
    orders = (("t,s", (a, scalar), (t, scalar)), ("s,t", (scalar, a), (scalar, t)))
    for label, args, targs in orders:
        try:
            with np.errstate(all="ignore"):
                want = ufunc(*args)
        except (TypeError, ValueError, OverflowError) as e:
            if isinstance(e, ValueError) and "negative integer powers" in str(e):
                continue  # numpy fails at compute time; lazymath cannot know values
            with pytest.raises(type(e)):
                fn(*targs)
            continue
        if op in DIVISIONS and label == "t,s" and scalar == 0 and want.dtype.kind in "iub":
            continue  # integer division by zero: numpy warns and returns 0 (undefined on NPU)
        try:
            check(fn(*targs), want, **_tol(want.dtype, op == "pow"))
        except AssertionError as e:
            raise AssertionError(f"{op}({label}) dtype={dtype} s={scalar!r}: {e}") from None


def test_scalar_out_of_range_raises_at_call():
    t = lm.tensor(np.arange(4, dtype=np.int8))
    with pytest.raises(OverflowError, match="1000"):
        t + 1000
    with pytest.raises(OverflowError):
        lm.mul(300, t)


def test_numpy_scalar_operands_are_strong(backend, check):
    """numpy scalars are *not* weak: np.float64(2) * float32 tensor -> float64."""
    a = np.arange(6, dtype=np.float32)
    t = lm.tensor(a)
    check(t * np.float64(2), a * np.float64(2))
    check(np.float64(2) * t, np.float64(2) * a)
    check(t + np.int8(1), a + np.int8(1))


# ----------------------------------------------------------------------------- operators

OPERATORS = {
    "+": (operator.add, np.add),
    "-": (operator.sub, np.subtract),
    "*": (operator.mul, np.multiply),
    "/": (operator.truediv, np.true_divide),
    "//": (operator.floordiv, np.floor_divide),
    "%": (operator.mod, np.remainder),
    "**": (operator.pow, np.power),
    "==": (operator.eq, np.equal),
    "!=": (operator.ne, np.not_equal),
    "<": (operator.lt, np.less),
    "<=": (operator.le, np.less_equal),
    ">": (operator.gt, np.greater),
    ">=": (operator.ge, np.greater_equal),
}


@pytest.mark.parametrize("dtype", ["float16", "float32", "int32"])
@pytest.mark.parametrize("sym", sorted(OPERATORS))
def test_operators_and_reflected(backend, check, data, sym, dtype):
    pyop, ufunc = OPERATORS[sym]
    a = data.rand((4, 7), dtype, 1, 3, nonzero=True)
    b = data.rand((1, 7), dtype, 1, 3, nonzero=True)
    ta, tb = lm.tensor(a), lm.tensor(b)
    tol = _tol(dtype, sym == "**")
    check(pyop(ta, tb), ufunc(a, b), **tol)
    check(pyop(ta, 2), ufunc(a, 2), **tol)
    check(pyop(2, ta), ufunc(2, a), **tol)  # reflected: 2 - t, 2 ** t, 2 / t, ...
    check(pyop(ta, 1.5), ufunc(a, 1.5), **tol)
    check(pyop(1.5, ta), ufunc(1.5, a), **tol)
    out = pyop(b, ta)  # numpy array on the left defers to the tensor's reflected operator
    assert isinstance(out, lm.Tensor), f"ndarray {sym} Tensor gave {type(out).__name__}"
    check(out, ufunc(b, a), **tol)
    out = pyop(ta, b)
    check(out, ufunc(a, b), **tol)


def test_bool_operators(backend, check, data):
    a = data.rand((5, 3), "bool")
    b = data.rand((5, 3), "bool")
    ta, tb = lm.tensor(a), lm.tensor(b)
    check(ta & tb, a & b)
    check(ta | tb, a | b)
    check(~ta, ~a)
    check(ta + tb, a + b)  # bool + bool is logical or in numpy
    check(ta * tb, a * b)
    check(ta == tb, a == b)


def test_in_place_operators_rebind(backend, check):
    a = np.arange(5, dtype=np.float32)
    t = lm.tensor(a)
    u = t  # the same tensor object: it sees the update, as with numpy
    v = t[1:]  # another tensor reading the old node (and buffer) keeps its values
    t += 1
    t *= 2
    check(t, (a + 1) * 2)
    assert u is t
    check(v, a[1:])  # the update is functional: no realized buffer was written


# ----------------------------------------------------------------------------- where, clip


@pytest.mark.parametrize("dtype", DTYPES)
def test_where(backend, check, data, dtype):
    c = data.rand((7, 1), "bool")
    a = data.rand((1, 13), dtype)
    b = data.rand((7, 13), dtype)
    tc, ta, tb = lm.tensor(c), lm.tensor(a), lm.tensor(b)
    check(lm.where(tc, ta, tb), np.where(c, a, b))
    check(lm.where(tc, ta, 2), np.where(c, a, 2))
    check(lm.where(tc, 1.5, tb), np.where(c, 1.5, b))
    check(lm.where(tc, ta.T.T, tb[::-1]), np.where(c, a, b[::-1]))
    check(lm.where(tc, 1, 0), np.where(c, 1, 0))
    cond = data.rand((7, 13), "int32", -1, 1)  # non-bool condition: nonzero is true
    check(lm.where(lm.tensor(cond), tb, ta), np.where(cond, b, a))
    check(lm.where(tb > tb.T.T, ta, tb), np.where(b > b, a, b))


def test_where_mixed_dtypes(backend, check, data):
    c = data.rand((4, 6), "bool")
    a = data.rand((4, 6), "int8")
    b = data.rand((4, 6), "float16")
    check(lm.where(lm.tensor(c), lm.tensor(a), lm.tensor(b)), np.where(c, a, b))
    check(lm.where(lm.tensor(c), lm.tensor(a), 2.5), np.where(c, a, 2.5))
    check(lm.where(lm.tensor(c), lm.tensor(a), 7), np.where(c, a, np.int8(7)))


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int8", "int32", "int64"])
def test_clip(backend, check, data, dtype):
    for _name, a, t in data.layouts((7, 13), dtype):
        check(lm.clip(t, -1, 2), np.clip(a, -1, 2))
        check(lm.clip(t, 0, None), np.clip(a, 0, None))
        check(lm.clip(t, None, 1), np.clip(a, None, 1))
    a = data.rand((7, 13), dtype)
    lo = data.rand((1, 13), dtype, -3, 0)
    hi = data.rand((7, 1), dtype, 0, 3)
    check(lm.clip(lm.tensor(a), lm.tensor(lo), lm.tensor(hi)), np.clip(a, lo, hi))
    check(lm.clip(lm.tensor(a), 2, -1), np.clip(a, 2, -1))  # lo > hi: numpy gives hi
    check(lm.clip(lm.tensor(a), 0.5, 1.5), np.clip(a, 0.5, 1.5))  # float bounds promote ints


def test_clip_nan(backend, check):
    a = SPECIAL.astype(np.float32)
    check(lm.clip(lm.tensor(a), -1, 1), np.clip(a, -1, 1))


# ----------------------------------------------------------------------------- astype

CAST_DTYPES = DTYPES


@pytest.mark.parametrize("dst", CAST_DTYPES)
@pytest.mark.parametrize("src", CAST_DTYPES)
def test_astype(backend, check, data, src, dst):
    cases = [(n, a, t) for n, a, t in data.layouts((7, 13), src, -3, 3) if n != "broadcast"]
    cases += [("0-d", a := data.rand((), src), lm.tensor(a))]
    cases += [("0-size", a := data.rand((0, 4), src), lm.tensor(a))]
    outs = [lm.astype(t, dst) for *_, t in cases]
    lm.realize(*outs)
    for (label, a, _), out in zip(cases, outs):
        try:
            check(out, a.astype(dst))
        except AssertionError as e:
            raise AssertionError(f"astype {src}->{dst} {label}: {e}") from None
    # method form and str/np.dtype spellings
    a = data.rand((3, 4), src)
    check(lm.tensor(a).astype(np.dtype(dst)), a.astype(dst))


def test_astype_float_to_int_truncates(backend, check):
    a = np.array([-2.7, -0.5, 0.0, 0.5, 1.999, 100.25, -128.0], dtype=np.float32)
    t = lm.tensor(a)
    for d in ("int8", "int32", "int64"):
        check(t.astype(d), a.astype(d))
    check(t.astype("bool"), a.astype(bool))
    h = lm.tensor(a.astype(np.float16))
    check(h.astype("int32"), a.astype(np.float16).astype(np.int32))


def test_astype_complex(backend, check, data):
    a = data.rand((5, 3), "float32")
    check(lm.tensor(a).astype("complex64"), a.astype(np.complex64))


def test_float16_rounding_of_results(backend, check):
    """float16 arithmetic rounds like numpy's float16 ufuncs (computed wider, rounded once)."""
    a = np.array([1.0, 2049.0, 0.1, 65504.0, 6e-8, -3.3], dtype=np.float16)
    b = np.array([1e-3, 1.0, 0.2, 65504.0, 6e-8, 1.1], dtype=np.float16)
    ta, tb = lm.tensor(a), lm.tensor(b)
    with np.errstate(over="ignore"):
        check(ta + tb, a + b, rtol=0, atol=0)
        check(ta * tb, a * b, rtol=0, atol=0)
        check(ta - tb, a - b, rtol=0, atol=0)
