"""Reductions, softmax and log_softmax against numpy, on every backend.

Protects: numpy's axis handling (None, int, negative, tuples, empty tuple) and keepdims, result
dtypes (int sums widen to int64, int means give float64, float16 stays float16), NaN
propagation (sum/max/min/argmax/... see a NaN like numpy does), empty reductions (identity or
NaN, or an error at the call when numpy has no identity), and every layout of the input.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import lazymath as lm

DTYPES = ["float16", "float32", "float64", "int8", "int32", "int64", "bool"]
SHAPE = (3, 5, 7)
AXES = [None, 0, -1, 1, (0, 2), (2, 0), (-1, -2), (), (0, 1, 2)]


def _count(shape, axis) -> int:
    if axis is None:
        return math.prod(shape)
    axes = (axis,) if isinstance(axis, int) else axis
    return math.prod(shape[a] for a in axes)


def _tol(op, dtype, n):
    """Tolerance for a reduction of `n` elements: summation order may differ per backend."""
    d = np.dtype(dtype)
    n = max(n, 1)
    if d == np.float16:
        return dict(rtol=3e-3, atol=3e-3)
    if d == np.float32:
        return dict(rtol=2e-5, atol=2e-6 * n)
    if d == np.float64:
        return dict(rtol=1e-11, atol=1e-12 * n)
    return {}


def _np_reduce(op, a, axis, keepdims, ddof=0):
    """numpy's answer; float16 sums/means computed in float32 and rounded once (the NPU's and
    the reference's numerics; numpy's own float16 accumulation is less accurate)."""
    with np.errstate(all="ignore"):
        if op in ("argmax", "argmin"):
            return getattr(np, op)(a, axis=axis, keepdims=keepdims)
        if op in ("var", "std"):
            want_dtype = getattr(np, op)(np.zeros(2, a.dtype)).dtype
            r = getattr(np, op)(a.astype(np.float64), axis=axis, keepdims=keepdims, ddof=ddof)
            return np.asarray(r).astype(want_dtype)
        want_dtype = np.asarray(getattr(np, op)(np.zeros((1,), a.dtype))).dtype
        x = a.astype(np.float64) if a.dtype.kind == "f" else a
        r = getattr(np, op)(x, axis=axis, keepdims=keepdims)
        return np.asarray(r).astype(want_dtype)


def _domain(op, dtype):
    if op == "prod":
        return (0.5, 1.5) if np.dtype(dtype).kind == "f" else (-2, 2)
    return (-3, 3)


REDUCTIONS = ["sum", "mean", "max", "min", "prod"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", REDUCTIONS)
def test_reduce_axes_keepdims(backend, check, data, op, dtype):
    lo, hi = _domain(op, dtype)
    a = data.rand(SHAPE, dtype, lo, hi)
    t = lm.tensor(a)
    cases = [(axis, kd) for axis in AXES for kd in (False, True)]
    outs = [getattr(lm, op)(t, axis=axis, keepdims=kd) for axis, kd in cases]
    lm.realize(*outs)
    for (axis, kd), out in zip(cases, outs):
        want = _np_reduce(op, a, axis, kd)
        try:
            check(out, want, **_tol(op, want.dtype, _count(SHAPE, axis)))
        except AssertionError as e:
            raise AssertionError(f"{op}({dtype}, axis={axis}, keepdims={kd}): {e}") from None


@pytest.mark.parametrize("dtype", ["float16", "float32", "int32", "bool"])
@pytest.mark.parametrize("op", REDUCTIONS + ["argmax", "argmin"])
def test_reduce_layouts(backend, check, data, op, dtype):
    """Reductions read transposed, strided, flipped and broadcast inputs correctly."""
    lo, hi = _domain(op, dtype)
    cases = data.layouts((7, 13), dtype, lo, hi)
    for axis in (None, 0, 1):
        outs = [getattr(lm, op)(t, axis=axis) for *_, t in cases]
        lm.realize(*outs)
        for (name, a, _), out in zip(cases, outs):
            want = _np_reduce(op, a, axis, False)
            try:
                check(out, want, **_tol(op, want.dtype, _count((7, 13), axis)))
            except AssertionError as e:
                raise AssertionError(f"{op}({dtype} {name}, axis={axis}): {e}") from None


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["argmax", "argmin"])
def test_argmax_argmin(backend, check, data, op, dtype):
    # few distinct values so ties are common: numpy returns the first occurrence
    a = data.rand(SHAPE, dtype, -2, 2)
    t = lm.tensor(a)
    for axis in (None, 0, 1, -1, 2):
        for kd in (False, True):
            want = getattr(np, op)(a, axis=axis, keepdims=kd)
            got = getattr(lm, op)(t, axis=axis, keepdims=kd)
            try:
                check(got, want)
            except AssertionError as e:
                raise AssertionError(f"{op}({dtype}, axis={axis}, keepdims={kd}): {e}") from None
    check(getattr(t, op)(axis=1), getattr(a, op)(axis=1))
    with pytest.raises(TypeError, match=op):
        getattr(lm, op)(t, axis=(0, 1))


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int8", "int32", "bool"])
@pytest.mark.parametrize("ddof", [0, 1])
@pytest.mark.parametrize("op", ["var", "std"])
def test_var_std(backend, check, data, op, dtype, ddof):
    a = data.rand(SHAPE, dtype)
    for layout, x, t in data.layouts(SHAPE, dtype):
        for axis in (None, 0, (1, 2), -1):
            for kd in (False, True):
                want = _np_reduce(op, x, axis, kd, ddof)
                got = getattr(lm, op)(t, axis=axis, keepdims=kd, ddof=ddof)
                try:
                    check(got, want, **_tol(op, want.dtype, _count(SHAPE, axis)))
                except AssertionError as e:
                    raise AssertionError(f"{op}({dtype} {layout}, axis={axis}): {e}") from None
    check(getattr(lm.tensor(a), op)(ddof=ddof), _np_reduce(op, a, None, False, ddof),
          **_tol(op, _np_reduce(op, a, None, False).dtype, a.size))  # fmt: skip


def test_var_ddof_equal_to_count_is_nan_or_inf(backend, check):
    a = np.arange(4, dtype=np.float32)
    with np.errstate(all="ignore"):
        want = np.var(a, ddof=4)
    got = lm.var(lm.tensor(a), ddof=4)
    assert got.dtype == want.dtype
    assert not np.isfinite(got.numpy()) and not np.isfinite(want)


def test_method_forms(backend, check, data):
    a = data.rand((4, 6), "float32")
    t = lm.tensor(a)
    check(t.sum(), a.sum(dtype=np.float32), rtol=1e-5, atol=1e-5)
    check(t.sum(axis=1, keepdims=True), a.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-5)
    check(t.mean(0), a.mean(0))
    check(t.max(axis=-1), a.max(axis=-1))
    check(t.min(keepdims=True), a.min(keepdims=True))
    check(t.prod(axis=0), a.prod(axis=0))
    check(t.var(ddof=1), a.var(ddof=1), rtol=1e-5)
    check(t.std(axis=1), a.std(axis=1), rtol=1e-5)
    check(lm.sum([1, 2, 3]), np.sum([1, 2, 3]))


# ----------------------------------------------------------------------------- empty inputs


@pytest.mark.parametrize("dtype", ["float32", "int32", "bool"])
def test_empty_reductions(backend, check, dtype):
    a = np.zeros((0, 5), dtype=dtype)
    t = lm.tensor(a)
    for axis in (None, 0, 1, (0, 1)):
        check(lm.sum(t, axis=axis), np.sum(a, axis=axis))
        check(lm.prod(t, axis=axis), np.prod(a, axis=axis))
        with np.errstate(all="ignore"):
            check(lm.mean(t, axis=axis), np.asarray(np.mean(a, axis=axis)))
    # axis 1 has size 5: max over it of a (0, 5) tensor is an empty (0,) result
    check(lm.max(t, axis=1), np.max(a, axis=1))
    check(lm.argmin(t, axis=1), np.argmin(a, axis=1))
    for op in ("max", "min", "argmax", "argmin"):
        for axis in (None, 0):
            with pytest.raises(ValueError, match=op):
                getattr(lm, op)(t, axis=axis)  # no identity: error at the call, like numpy


def test_reduce_0d(backend, check):
    a = np.array(2.5, dtype=np.float32)
    t = lm.tensor(a)
    check(lm.sum(t), np.sum(a))
    check(lm.max(t), np.max(a))
    check(lm.mean(t), np.mean(a))
    check(lm.argmax(t), np.argmax(a))
    check(lm.sum(t, keepdims=True), np.sum(a, keepdims=True))


# ----------------------------------------------------------------------------- NaN / inf

NAN_ROWS = np.array(
    [
        [1.0, np.nan, 3.0, -1.0],
        [np.nan, np.nan, 0.0, 2.0],
        [np.inf, 1.0, -np.inf, 0.0],
        [-np.inf, -np.inf, -np.inf, -np.inf],
        [1.0, 2.0, 3.0, np.nan],
    ]
)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("op", ["sum", "mean", "max", "min", "prod", "argmax", "argmin"])
def test_nan_propagation(backend, check, op, dtype):
    a = NAN_ROWS.astype(dtype)
    t = lm.tensor(a)
    for axis in (None, 0, 1):
        want = _np_reduce(op, a, axis, False)
        try:
            check(getattr(lm, op)(t, axis=axis), want)
        except AssertionError as e:
            raise AssertionError(f"{op}({dtype}, axis={axis}): {e}") from None


@pytest.mark.parametrize("op", ["var", "std"])
def test_var_nan(backend, check, op):
    a = NAN_ROWS.astype(np.float32)
    for axis in (None, 1):
        check(getattr(lm, op)(lm.tensor(a), axis=axis), _np_reduce(op, a, axis, False))


# ----------------------------------------------------------------------------- softmax


def _softmax64(a, axis):
    x = a.astype(np.float64)
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / e.sum(axis=axis, keepdims=True)


def _log_softmax64(a, axis):
    x = a.astype(np.float64)
    z = x - np.max(x, axis=axis, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=axis, keepdims=True))


SOFTMAX = {"softmax": _softmax64, "log_softmax": _log_softmax64}


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int32"])
@pytest.mark.parametrize("op", sorted(SOFTMAX))
def test_softmax(backend, check, data, op, dtype):
    out_dtype = np.dtype(dtype) if np.dtype(dtype).kind == "f" else np.dtype("float64")
    tol = dict(rtol=3e-3, atol=3e-3) if out_dtype == np.float16 else dict(rtol=1e-5, atol=1e-6)
    for name, a, t in data.layouts((7, 13), dtype, -4, 4):
        for axis in (-1, 0, 1):
            want = SOFTMAX[op](a, axis).astype(out_dtype)
            try:
                check(getattr(lm, op)(t, axis=axis), want, **tol)
            except AssertionError as e:
                raise AssertionError(f"{op}({dtype} {name}, axis={axis}): {e}") from None
    a = data.rand((2, 3, 5), dtype, -4, 4)
    check(getattr(lm, op)(lm.tensor(a)), SOFTMAX[op](a, -1).astype(out_dtype), **tol)


@pytest.mark.parametrize("op", sorted(SOFTMAX))
def test_softmax_is_stable(backend, check, op):
    """Large logits do not overflow (max is subtracted first); -inf logits give 0 / -inf."""
    a = np.array([[1000.0, 1001.0, 999.0], [-1e4, 0.0, 1e4], [0.0, -np.inf, 1.0]], np.float32)
    with np.errstate(all="ignore"):
        want = SOFTMAX[op](a, -1).astype(np.float32)
    got = getattr(lm, op)(lm.tensor(a), axis=-1)
    check(got, want, rtol=1e-5, atol=1e-6)
    assert not np.isnan(got.numpy()).any()


def test_softmax_sums_to_one(backend, data):
    a = data.rand((6, 11), "float32", -10, 10)
    s = lm.sum(lm.softmax(lm.tensor(a), axis=1), axis=1).numpy()
    np.testing.assert_allclose(s, np.ones(6), rtol=1e-5)


def test_bad_reduce_axes(backend):
    t = lm.tensor(np.zeros((2, 3), np.float32))
    for op in ("sum", "mean", "max", "min", "prod", "var", "std", "softmax"):
        with pytest.raises(ValueError, match=f"{op}.*axis"):
            getattr(lm, op)(t, axis=2)
    with pytest.raises(ValueError, match="repeated axis"):
        lm.sum(t, axis=(0, 0))
    with pytest.raises(TypeError, match="axis"):
        lm.sum(t, axis=1.5)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_constant_operands_in_prologue_and_epilogue_of_one_reduction(backend, check, data, dtype):
    """A vector norm: pow with a constant tile before and after the sum, in one kernel (the two
    expression emitters named their constant tiles alike: 'duplicate buffer names')."""
    a = data.rand((4, 37), dtype)
    t = lm.tensor(a)
    want = np.power(np.sum(np.power(np.abs(a), 3.0), -1), 1 / 3)
    check(lm.pow(lm.sum(lm.pow(lm.abs(t), 3.0), -1), 1 / 3), want.astype(dtype), rtol=2e-3)
    check(lm.sum(t * 2.0, axis=1) * 2.0 + 1.0, (a * 2.0).sum(axis=1) * 2.0 + 1.0, rtol=2e-3)
