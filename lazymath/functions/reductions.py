"""Reductions: sum, prod, max, min, argmax, argmin over axes (one `reduce` node each, with
numpy's accumulator dtypes), and the composites built from them: mean, var, std, softmax,
log_softmax; the Array API's any, all, count_nonzero (sums of truth values).
"""

from __future__ import annotations

import builtins
import math

import numpy as np

from lazymath import dtypes as dt
from lazymath.functions.base import _axes, _cast, _memo, astype
from lazymath.functions.creation import _as_tensor_or_scalar, tensor, tensor_arg
from lazymath.functions.elementwise import abs, eq, exp, gt, log, logical_not, sqrt
from lazymath.functions.shapes import reshape
from lazymath.graph import node as gn
from lazymath.tensor import Tensor

# ----------------------------------------------------------------------------- reductions


_REDUCE_PLANS: dict = {}  # (op, dtype, shape, axis, keepdims) -> (axes, out dtype, out shape)


def _reduce(op: str, x, axis, keepdims: bool) -> Tensor:
    if type(x) is not Tensor:
        x = _as_tensor_or_scalar(x, op)
        if not isinstance(x, Tensor):
            x = tensor(x)
    node = x._node
    key = (op, node.dtype, node.shape, axis, keepdims)
    axes, out_dtype, out_shape = _memo(_REDUCE_PLANS, key, _reduce_plan, op, x, axis)
    if axes and dt.is_bf16(node.dtype):  # in float32 (exact), rounded once: see `_ew_node`
        out = _reduce(op, Tensor(_cast(node, dt.float32), x._device), axis, keepdims)
        return out if op in ("argmax", "argmin") else astype(out, node.dtype)
    src = node if op in ("argmax", "argmin", "max", "min") else _cast(node, out_dtype)
    if not axes:
        if op in ("argmax", "argmin"):  # argmax of a 0-d tensor
            out_node = gn.const_node(0, dt.int64)
        else:
            out_node = _cast(src, out_dtype)
    else:
        out_node = gn.make("reduce", out_dtype, out_shape, (src,), (op, axes))
    out = Tensor(out_node, x._device)
    if keepdims:
        out = reshape(out, tuple(1 if i in axes else s for i, s in enumerate(x.shape)))
    return out


def _reduce_plan(op: str, x: Tensor, axis) -> tuple:
    """(axes, output dtype, output shape) of a reduction, with the user-facing errors."""
    axes = _axes(axis, x.ndim, op)
    if op in ("argmax", "argmin"):
        if axis is not None and not isinstance(axis, (int, np.integer)):
            raise TypeError(f"{op}: axis must be None or a single int, got {axis!r}")
        out_dtype = dt.int64
    elif op in ("sum", "prod"):
        if x.dtype.kind == "u":
            out_dtype = dt.uint64
        elif x.dtype == dt.bool_ or (dt.is_int(x.dtype) and x.dtype.itemsize < 8):
            out_dtype = dt.int64
        else:
            out_dtype = x.dtype
    else:
        out_dtype = x.dtype
    if op in ("max", "min", "argmax", "argmin"):
        for a in axes:
            if x.shape[a] == 0:
                raise ValueError(
                    f"{op}: reduction over axis {a} of size 0 (shape {x.shape}) has no identity"
                )
    out_shape = tuple(s for i, s in enumerate(x.shape) if i not in axes)
    return axes, np.dtype(out_dtype), out_shape


def sum(x, axis=None, keepdims=False, *, dtype=None) -> Tensor:
    """Sum over `axis` (all by default); integers accumulate in int64 (uint64 unsigned), float16
    in float32; `dtype=` casts the input first and is the result's dtype (the Array API's
    accumulator dtype: a narrow integer dtype wraps, as numpy's)."""
    if dtype is None:
        return _reduce("sum", x, axis, keepdims)
    x = astype(x if isinstance(x, Tensor) else tensor(x), dtype, copy=False)
    return astype(_reduce("sum", x, axis, keepdims), dtype, copy=False)


def prod(x, axis=None, keepdims=False, *, dtype=None) -> Tensor:
    """Product over `axis` (all axes by default); integers accumulate in int64 (uint64 when
    unsigned), like numpy. `dtype=` casts the input first and is the result's dtype (the
    Array API's accumulator dtype)."""
    if dtype is None:
        return _reduce("prod", x, axis, keepdims)
    x = astype(x if isinstance(x, Tensor) else tensor(x), dtype, copy=False)
    return astype(_reduce("prod", x, axis, keepdims), dtype, copy=False)


def max(x, axis=None, keepdims=False) -> Tensor:
    """Maximum over `axis` (all by default). NaN propagates like numpy.max; an empty axis raises
    ValueError (there is no identity to return)."""
    return _reduce("max", x, axis, keepdims)


def min(x, axis=None, keepdims=False) -> Tensor:
    """Minimum over `axis` (all by default). NaN propagates like numpy.min; an empty axis raises
    ValueError."""
    return _reduce("min", x, axis, keepdims)


def argmax(x, axis=None, keepdims=False) -> Tensor:
    """Index of the first maximum along `axis` (of the flattened tensor when `axis` is None),
    int64 like numpy; `keepdims` keeps the reduced axes as size 1."""
    if axis is None and isinstance(x, Tensor):
        out = _reduce("argmax", reshape(x, (-1,)), 0, False)
        return reshape(out, (1,) * x.ndim) if keepdims else out
    return _reduce("argmax", x, axis, keepdims)


def argmin(x, axis=None, keepdims=False) -> Tensor:
    """Index of the first minimum along `axis` (of the flattened tensor when `axis` is None),
    int64 like numpy; `keepdims` keeps the reduced axes as size 1."""
    if axis is None and isinstance(x, Tensor):
        out = _reduce("argmin", reshape(x, (-1,)), 0, False)
        return reshape(out, (1,) * x.ndim) if keepdims else out
    return _reduce("argmin", x, axis, keepdims)


def _float_for_mean(x: Tensor) -> Tensor:
    if x.dtype.kind in "fc" or dt.is_bf16(x.dtype):
        return x
    return astype(x, dt.float64)


def mean(x, axis=None, keepdims=False) -> Tensor:
    """Arithmetic mean over `axis` (all by default). Integers average in float64 (numpy's
    rule); float16 accumulates in float32 and is cast back. An empty reduction gives NaN."""
    x = x if isinstance(x, Tensor) else tensor(x)
    axes = _axes(axis, x.ndim, "mean")
    n = math.prod(x.shape[a] for a in axes)
    xf = _float_for_mean(x)
    acc = astype(xf, dt.float32) if xf.dtype == dt.float16 or dt.is_bf16(xf.dtype) else xf
    s = sum(acc, axis, keepdims)
    out = s * (1.0 / n) if n else s * float("nan")
    return astype(out, xf.dtype)


def var(x, axis=None, keepdims=False, ddof=0, *, correction=None) -> Tensor:
    """Variance; `correction` (the Array API's name) is numpy's `ddof`."""
    return _var("var", x, axis, keepdims, ddof if correction is None else correction)


def _var(op: str, x, axis, keepdims: bool, ddof) -> Tensor:
    x = x if isinstance(x, Tensor) else tensor(x)
    axes = _axes(axis, x.ndim, op)
    n = math.prod(x.shape[a] for a in axes)
    xf = _float_for_mean(x)
    acc = astype(xf, dt.float32) if xf.dtype == dt.float16 or dt.is_bf16(xf.dtype) else xf
    m = mean(acc, axis, keepdims=True)
    d = acc - m
    out_dtype = xf.dtype
    if dt.is_complex(xf.dtype):  # numpy: mean of |d|^2, a real result (float32 for complex64)
        a = abs(d)
        sq = a * a
        out_dtype = a.dtype
    else:
        sq = d * d
    denom = builtins.max(n - ddof, 0)
    s = sum(sq, axis, keepdims)
    out = s * (1.0 / denom) if denom else s * float("nan")
    return astype(out, out_dtype)


def std(x, axis=None, keepdims=False, ddof=0, *, correction=None) -> Tensor:
    """Standard deviation; `correction` (the Array API's name) is numpy's `ddof`."""
    return sqrt(_var("std", x, axis, keepdims, ddof if correction is None else correction))


def softmax(x, axis=-1) -> Tensor:
    """exp(x - max) / sum(exp(x - max)) along `axis`: the max shift keeps exp from
    overflowing. The planner fuses the whole chain into one row-resident kernel when a row
    fits the Vector unit's Unified Buffer (see `lm.explain`)."""
    x = _float_for_mean(x if isinstance(x, Tensor) else tensor(x))
    _axes(axis, x.ndim, "softmax")  # validate here so errors name softmax, not max
    m = max(x, axis, keepdims=True)
    e = exp(x - m)
    return e / sum(e, axis, keepdims=True)


def log_softmax(x, axis=-1) -> Tensor:
    """(x - max) - log(sum(exp(x - max))) along `axis`, the stable form; fused into one
    row-resident kernel like `softmax`."""
    x = _float_for_mean(x if isinstance(x, Tensor) else tensor(x))
    _axes(axis, x.ndim, "log_softmax")  # validate here so errors name log_softmax, not max
    m = max(x, axis, keepdims=True)
    z = x - m
    return z - log(sum(exp(z), axis, keepdims=True))


# ------------------------------------------------------------------------- any, all, count_nonzero


def any(x, /, *, axis=None, keepdims: bool = False) -> Tensor:  # noqa: A001
    """Whether any element (along `axis`) is nonzero; False over an empty axis. Lazy."""
    x = tensor_arg(x, "any")
    nz = astype(x, dt.bool_, copy=False)
    return gt(sum(astype(nz, dt.int64), axis, keepdims), 0)


def all(x, /, *, axis=None, keepdims: bool = False) -> Tensor:  # noqa: A001
    """Whether every element (along `axis`) is nonzero; True over an empty axis. Lazy."""
    x = tensor_arg(x, "all")
    z = logical_not(astype(x, dt.bool_, copy=False))
    return eq(sum(astype(z, dt.int64), axis, keepdims), 0)


def count_nonzero(x, /, *, axis=None, keepdims: bool = False) -> Tensor:
    """Number of nonzero elements along `axis` (int64). Lazy."""
    x = tensor_arg(x, "count_nonzero")
    return sum(astype(astype(x, dt.bool_, copy=False), dt.int64), axis, keepdims)
