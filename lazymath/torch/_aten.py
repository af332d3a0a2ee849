"""ATen -> lazymath: one lowering per ATen overload the backend maps.

Each lowering takes the FX node's arguments with every tensor already a lazy lazymath Tensor
(Python numbers, lists and dtypes as FX recorded them) plus ``out``, the node's FakeTensor
metadata (shape, dtype; a tuple of them for multi-output ops), and returns lazy Tensors: nothing
here computes, so a whole FX graph becomes one lazymath graph that fuses as native code does.

A lowering raises `Unsupported` for a case it does not cover (a transposed convolution, a
dtype lazymath has not): the caller then runs that node in torch eager (a graph break) instead
of guessing. The table is keyed by OpOverload; `lowering_for` also falls back to the overload
packet for the ops whose overloads differ only in scalar-vs-tensor arguments.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable

import numpy as np
import torch

from lazymath import nn as lnn
from lazymath.torch import _lm as lm

aten = torch.ops.aten
prims = torch.ops.prims


class Unsupported(Exception):
    """This node (op, arguments or dtype) has no lazymath lowering: run it in torch eager."""


# torch dtype -> numpy dtype for the dtypes lazymath computes in (bfloat16 through ml_dtypes:
# lm.bfloat16; a preset without bfloat16, ascend910, refuses it at realize, and the graph
# then runs in torch eager)
TORCH_TO_NP: dict = {
    torch.bfloat16: lm.bfloat16,
    torch.float16: np.dtype(np.float16),
    torch.float32: np.dtype(np.float32),
    torch.float64: np.dtype(np.float64),
    torch.int8: np.dtype(np.int8),
    torch.int16: np.dtype(np.int16),
    torch.int32: np.dtype(np.int32),
    torch.int64: np.dtype(np.int64),
    torch.uint8: np.dtype(np.uint8),
    torch.bool: np.dtype(np.bool_),
    torch.complex64: np.dtype(np.complex64),
    torch.complex128: np.dtype(np.complex128),
}


def np_dtype(d) -> np.dtype:
    """The numpy dtype of torch dtype `d`; Unsupported for one lazymath has not (bfloat16)."""
    try:
        return TORCH_TO_NP[d]
    except KeyError:
        raise Unsupported(f"dtype {d} has no lazymath equivalent") from None


LOWERINGS: dict = {}


def lowering_for(target) -> Callable | None:
    """The lowering of FX target `target` (an OpOverload), or None."""
    fn = LOWERINGS.get(target)
    if fn is None and isinstance(target, torch._ops.OpOverload):
        fn = LOWERINGS.get(target.overloadpacket)
    return fn


def _register(*targets):
    def deco(fn):
        for t in targets:
            LOWERINGS[t] = fn
        return fn

    return deco


def _out_dtype(out) -> np.dtype:
    return np_dtype(out.dtype)


def _dim(d: int, ndim: int) -> int:
    return d + ndim if d < 0 else d


def _dims(dims, ndim: int) -> tuple[int, ...] | None:
    """An ATen dim list (None or [] = all dims) as a tuple of non-negative axes."""
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return None
    if isinstance(dims, int):
        dims = [dims]
    return tuple(_dim(int(d), builtin_max(ndim, 1)) for d in dims)


builtin_max = max


# ----------------------------------------------------------------------------- elementwise

_UNARY = {
    aten.abs: lm.abs, aten.neg: lm.neg, aten.exp: lm.exp, aten.exp2: lm.exp2, aten.log: lm.log,
    aten.log2: lm.log2, aten.log10: lm.log10, aten.log1p: lm.log1p, aten.expm1: lm.expm1,
    aten.sqrt: lm.sqrt, aten.rsqrt: lm.rsqrt, aten.reciprocal: lm.reciprocal, aten.sin: lm.sin,
    aten.cos: lm.cos, aten.tan: lm.tan, aten.tanh: lm.tanh, aten.sigmoid: lm.sigmoid,
    aten.relu: lm.relu, aten.sign: lm.sign, aten.floor: lm.floor, aten.ceil: lm.ceil,
    aten.trunc: lm.trunc, aten.erf: lm.erf, aten.special_erfc: lm.erfc, aten.erfc: lm.erfc,
    aten.sinh: lm.sinh, aten.cosh: lm.cosh, aten.asinh: lm.asinh, aten.acosh: lm.acosh,
    aten.atanh: lm.atanh, aten.asin: lm.asin, aten.acos: lm.acos, aten.atan: lm.atan,
    aten.logical_not: lm.logical_not, aten.isnan: lm.isnan, aten.isinf: lm.isinf,
    aten.signbit: lm.signbit, aten.isfinite: lm.isfinite,
}  # fmt: skip

for _op, _fn in _UNARY.items():
    LOWERINGS[_op] = lambda out, x, _fn=_fn: _fn(x)


@_register(aten.round.default)
def _round(out, x):
    return lm.round(x)  # both round half to even


@_register(aten.bitwise_not)
def _bitwise_not(out, x):
    return lm.logical_not(x) if x.dtype == np.bool_ else lm.bitwise_invert(x)


_BINARY = {
    aten.mul: lm.multiply, aten.div: lm.divide, aten.maximum: lm.maximum,
    aten.minimum: lm.minimum, aten.eq: lm.eq, aten.ne: lm.ne, aten.lt: lm.lt, aten.le: lm.le,
    aten.gt: lm.gt, aten.ge: lm.ge, aten.logical_and: lm.logical_and,
    aten.logical_or: lm.logical_or, aten.logical_xor: lm.logical_xor,
    aten.atan2: lm.atan2, aten.hypot: lm.hypot, aten.copysign: lm.copysign,
    aten.remainder: lm.remainder, aten.floor_divide: lm.floor_divide,
}  # fmt: skip


def _binary_lowering(fn):
    def lower(out, a, b, **kw):
        if kw.get("rounding_mode") is not None:
            raise Unsupported("div with rounding_mode")
        if out.dtype == torch.bool and fn in (lm.multiply,):
            return lm.logical_and(a, b)
        return fn(a, b)

    return lower


for _op, _fn in _BINARY.items():
    LOWERINGS[_op] = _binary_lowering(_fn)


@_register(aten.div.Tensor_mode, aten.div.Scalar_mode)
def _div_mode(out, a, b, rounding_mode=None):
    if rounding_mode is None:
        return lm.divide(a, b)
    if rounding_mode == "floor":
        if np.dtype(_out_dtype(out)).kind in "iu":
            return lm.floor_divide(a, b)
        return lm.floor(lm.divide(a, b))
    if rounding_mode == "trunc":
        if np.dtype(_out_dtype(out)).kind in "iu":
            raise Unsupported("integer division with rounding_mode='trunc'")
        return lm.trunc(lm.divide(a, b))
    raise Unsupported(f"div rounding_mode={rounding_mode!r}")


def _logical_if_bool(out, fn_bool, fn_int):
    def lower(o, a, b):
        return (fn_bool if o.dtype == torch.bool else fn_int)(a, b)

    return lower


LOWERINGS[aten.bitwise_and] = _logical_if_bool(None, lm.logical_and, lm.bitwise_and)
LOWERINGS[aten.bitwise_or] = _logical_if_bool(None, lm.logical_or, lm.bitwise_or)
LOWERINGS[aten.bitwise_xor] = _logical_if_bool(None, lm.logical_xor, lm.bitwise_xor)


@_register(aten.add)
def _add(out, a, b, alpha=1):
    if out.dtype == torch.bool:
        return lm.logical_or(a, b)
    return lm.add(a, b if alpha == 1 else b * alpha)


@_register(aten.sub)
def _sub(out, a, b, alpha=1):
    return lm.subtract(a, b if alpha == 1 else b * alpha)


@_register(aten.rsub)
def _rsub(out, a, b, alpha=1):
    return lm.subtract(b, a if alpha == 1 else a * alpha)


@_register(aten.pow)
def _pow(out, a, b):
    if isinstance(b, (int, float)) and not isinstance(b, bool):
        if b == 2:
            return lm.square(a)
        if b == 0.5:
            return lm.sqrt(a)
        if b == 1:
            return a
        if b == -1:
            return lm.reciprocal(a)
    if isinstance(a, (int, float)) and not isinstance(b, (int, float)):
        return lm.power(lm.full((), a, dtype=b.dtype), b)
    return lm.power(a, b)


@_register(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def _where(out, cond, a, b):
    return lm.where(cond, a, b)


@_register(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def _masked_fill(out, x, mask, value):
    return lm.where(mask, value, x)


@_register(aten.clamp.default, aten.clamp.Tensor)
def _clamp(out, x, min=None, max=None):
    if min is not None and max is not None and not isinstance(min, lm.Tensor):
        if not isinstance(max, lm.Tensor) and min > max:
            raise Unsupported("clamp with min > max")  # torch's answer is max; keep torch's
    if isinstance(min, lm.Tensor) or isinstance(max, lm.Tensor):
        y = x if min is None else lm.maximum(x, min)
        return y if max is None else lm.minimum(y, max)
    return lm.clip(x, min, max)


@_register(aten.clamp_min)
def _clamp_min(out, x, v):
    return lm.maximum(x, v)


@_register(aten.clamp_max)
def _clamp_max(out, x, v):
    return lm.minimum(x, v)


@_register(aten.leaky_relu.default)
def _leaky_relu(out, x, negative_slope=0.01):
    return lm.where(x > 0, x, x * negative_slope)


@_register(aten.gelu.default)
def _gelu(out, x, approximate="none"):
    return lnn.gelu(x, approximate=approximate)


@_register(aten.silu.default)
def _silu(out, x):
    return lnn.silu(x)


# ----------------------------------------------------------------------------- casts, copies


@_register(
    aten.clone.default, aten.alias.default, aten.detach.default, aten.lift_fresh_copy.default,
    aten.contiguous.default,
)  # fmt: skip
def _identity(out, x, **kw):
    return x


@_register(aten._to_copy.default)
def _to_copy(out, x, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
             memory_format=None):  # fmt: skip
    if device is not None and torch.device(device).type != "cpu":
        raise Unsupported(f"_to_copy to device {device}")
    return lm.astype(x, _out_dtype(out))


@_register(prims.convert_element_type.default)
def _convert(out, x, dtype):
    return lm.astype(x, np_dtype(dtype))


# ----------------------------------------------------------------------------- creation


def _fill(out, size, value, dtype):
    return lm.full(tuple(int(s) for s in size), value, dtype=dtype)


@_register(aten.full.default)
def _full(out, size, fill_value, **kw):
    return _fill(out, size, fill_value, _out_dtype(out))


@_register(aten.zeros.default, aten.new_zeros.default)
def _zeros(out, *args, **kw):
    size = args[-1]
    return _fill(out, size, 0, _out_dtype(out))


@_register(aten.ones.default, aten.new_ones.default)
def _ones(out, *args, **kw):
    return _fill(out, args[-1], 1, _out_dtype(out))


@_register(aten.new_full.default)
def _new_full(out, x, size, value, **kw):
    return _fill(out, size, value, _out_dtype(out))


@_register(aten.empty.memory_format, aten.new_empty.default)
def _empty(out, *args, **kw):
    return _fill(out, args[-1], 0, _out_dtype(out))


@_register(aten.full_like.default)
def _full_like(out, x, value, **kw):
    return lm.full(x.shape, value, dtype=_out_dtype(out))


@_register(aten.zeros_like.default, aten.empty_like.default)
def _zeros_like(out, x, **kw):
    return lm.full(x.shape, 0, dtype=_out_dtype(out))


@_register(aten.ones_like.default)
def _ones_like(out, x, **kw):
    return lm.full(x.shape, 1, dtype=_out_dtype(out))


@_register(aten.scalar_tensor.default)
def _scalar_tensor(out, value, **kw):
    return lm.full((), value, dtype=_out_dtype(out))


@_register(aten.arange.default, aten.arange.start, aten.arange.start_step)
def _arange(out, *args, **kw):
    start, end, step = 0, None, 1
    if len(args) == 1:
        (end,) = args
    elif len(args) == 2:
        start, end = args
    else:
        start, end, step = args[:3]
    return lm.arange(start, end, step, dtype=_out_dtype(out))


# ----------------------------------------------------------------------------- views, shapes


@_register(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def _view(out, x, size):
    return lm.reshape(x, tuple(int(s) for s in size))


@_register(prims.collapse_view.default, prims.collapse.default)
def _collapse(out, x, start, end):
    s = x.shape
    return lm.reshape(x, (*s[:start], math.prod(s[start:end]), *s[end:]))


@_register(aten.permute.default)
def _permute(out, x, dims):
    return lm.permute_dims(x, tuple(_dim(int(d), x.ndim) for d in dims))


@_register(aten.t.default)
def _t(out, x):
    return x if x.ndim < 2 else lm.swapaxes(x, 0, 1)


@_register(aten.transpose.int)
def _transpose(out, x, d0, d1):
    return lm.swapaxes(x, _dim(d0, x.ndim), _dim(d1, x.ndim)) if x.ndim else x


@_register(aten.expand.default)
def _expand(out, x, size, implicit=False):
    lead = len(size) - x.ndim
    shape = tuple((x.shape[i - lead] if int(s) == -1 else int(s)) for i, s in enumerate(size))
    return lm.broadcast_to(x, shape)


@_register(aten.unsqueeze.default)
def _unsqueeze(out, x, dim):
    return lm.expand_dims(x, _dim(dim, x.ndim + 1))


@_register(aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default)
def _squeeze(out, x, dims=None):
    if x.ndim == 0:
        return x
    if dims is None:
        axes = tuple(i for i, s in enumerate(x.shape) if s == 1)
    else:
        dims = [dims] if isinstance(dims, int) else dims
        axes = tuple(a for a in (_dim(d, x.ndim) for d in dims) if x.shape[a] == 1)
    return lm.squeeze(x, axes) if axes else x


@_register(aten.slice.Tensor)
def _slice(out, x, dim=0, start=None, end=None, step=1):
    d = _dim(dim, x.ndim)
    n = x.shape[d]
    start = (
        0
        if start is None
        else builtin_max(-n, min(int(start), n))
        if start < 0
        else min(int(start), n)
    )
    end = n if end is None else int(end)
    end = builtin_max(end + n, 0) if end < 0 else min(end, n)
    idx = [slice(None)] * x.ndim
    idx[d] = slice(start, end, int(step))
    return x[tuple(idx)]


@_register(aten.select.int)
def _select(out, x, dim, index):
    idx = [slice(None)] * x.ndim
    idx[_dim(dim, x.ndim)] = int(index)
    return x[tuple(idx)]


@_register(aten.split_with_sizes.default)
def _split_with_sizes(out, x, sizes, dim=0):
    d = _dim(dim, x.ndim)
    parts, at = [], 0
    for s in sizes:
        idx = [slice(None)] * x.ndim
        idx[d] = slice(at, at + int(s))
        parts.append(x[tuple(idx)])
        at += int(s)
    return parts


@_register(aten.split.Tensor)
def _split(out, x, size, dim=0):
    d = _dim(dim, x.ndim)
    n = x.shape[d]
    return _split_with_sizes(out, x, [min(size, n - i) for i in range(0, n, size)], dim)


@_register(aten.unbind.int)
def _unbind(out, x, dim=0):
    d = _dim(dim, x.ndim)
    return [_select(None, x, d, i) for i in range(x.shape[d])]


@_register(aten.cat.default)
def _cat(out, tensors, dim=0):
    ts = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)]  # torch skips these
    if not ts:
        return lm.full(tuple(out.shape), 0, dtype=_out_dtype(out))
    dt = _out_dtype(out)
    ts = [t if t.dtype == dt else lm.astype(t, dt) for t in ts]
    return lm.concat(ts, axis=_dim(dim, ts[0].ndim))


@_register(aten.stack.default)
def _stack(out, tensors, dim=0):
    return lm.stack(list(tensors), axis=_dim(dim, tensors[0].ndim + 1))


@_register(aten.flip.default)
def _flip(out, x, dims):
    return lm.flip(x, axis=tuple(_dim(d, x.ndim) for d in dims))


@_register(aten.constant_pad_nd.default)
def _pad(out, x, pad, value=0):
    if any(p < 0 for p in pad):
        raise Unsupported("negative padding (cropping)")
    widths = [(0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        widths[x.ndim - 1 - i] = (int(pad[2 * i]), int(pad[2 * i + 1]))
    return lm.pad(x, widths, constant_values=value)


@_register(aten.tril.default)
def _tril(out, x, diagonal=0):
    return lm.tril(x, k=diagonal)


@_register(aten.triu.default)
def _triu(out, x, diagonal=0):
    return lm.triu(x, k=diagonal)


# ----------------------------------------------------------------------------- reductions


def _reduce(fn):
    def lower(out, x, dims=None, keepdim=False, *, dtype=None):
        if x.ndim == 0:
            y = x
        else:
            y = fn(x, axis=_dims(dims, x.ndim), keepdims=bool(keepdim))
        return lm.astype(y, _out_dtype(out))

    return lower


LOWERINGS[aten.sum.dim_IntList] = _reduce(lm.sum)
LOWERINGS[aten.mean.dim] = _reduce(lm.mean)
LOWERINGS[aten.amax.default] = _reduce(lm.max)
LOWERINGS[aten.amin.default] = _reduce(lm.min)
LOWERINGS[aten.prod.dim_int] = _reduce(lm.prod)
LOWERINGS[aten.any.dim] = _reduce(lm.any)
LOWERINGS[aten.any.dims] = _reduce(lm.any)
LOWERINGS[aten.all.dim] = _reduce(lm.all)


def _reduce_all_of(fn):
    return lambda out, x, dtype=None: lm.astype(fn(x) if x.ndim else x, _out_dtype(out))


LOWERINGS[aten.sum.default] = _reduce_all_of(lm.sum)
LOWERINGS[aten.mean.default] = _reduce_all_of(lm.mean)
LOWERINGS[aten.any.default] = _reduce_all_of(lm.any)
LOWERINGS[aten.all.default] = _reduce_all_of(lm.all)
LOWERINGS[aten.prod.default] = _reduce_all_of(lm.prod)


@_register(aten.var.correction)
def _var(out, x, dims=None, *, correction=None, keepdim=False):
    c = 1 if correction is None else correction
    return lm.astype(
        lm.var(x, axis=_dims(dims, x.ndim), keepdims=bool(keepdim), correction=c),
        _out_dtype(out),
    )


@_register(aten.argmax.default)
def _argmax(out, x, dim=None, keepdim=False):
    y = lm.argmax(x, axis=None if dim is None else _dim(dim, x.ndim), keepdims=bool(keepdim))
    return lm.astype(y, np.int64)


@_register(aten.argmin.default)
def _argmin(out, x, dim=None, keepdim=False):
    y = lm.argmin(x, axis=None if dim is None else _dim(dim, x.ndim), keepdims=bool(keepdim))
    return lm.astype(y, np.int64)


@_register(aten.max.dim)
def _max_dim(out, x, dim, keepdim=False):
    d = _dim(dim, x.ndim)
    return (lm.max(x, axis=d, keepdims=bool(keepdim)),
            lm.astype(lm.argmax(x, axis=d, keepdims=bool(keepdim)), np.int64))  # fmt: skip


@_register(aten.min.dim)
def _min_dim(out, x, dim, keepdim=False):
    d = _dim(dim, x.ndim)
    return (lm.min(x, axis=d, keepdims=bool(keepdim)),
            lm.astype(lm.argmin(x, axis=d, keepdims=bool(keepdim)), np.int64))  # fmt: skip


@_register(aten._softmax.default)
def _softmax(out, x, dim, half_to_float=False):
    return lm.astype(lm.softmax(x, axis=_dim(dim, builtin_max(x.ndim, 1))), _out_dtype(out))


@_register(aten._log_softmax.default)
def _log_softmax(out, x, dim, half_to_float=False):
    return lm.astype(lm.log_softmax(x, axis=_dim(dim, builtin_max(x.ndim, 1))),
                     _out_dtype(out))  # fmt: skip


@_register(aten.native_layer_norm.default)
def _native_layer_norm(out, x, normalized_shape, weight, bias, eps):
    ns = tuple(int(s) for s in normalized_shape)
    axes = tuple(range(x.ndim - len(ns), x.ndim))
    y = lnn.layer_norm(x, ns, weight, bias, eps)
    # the saved statistics (float32 for float16 input, as torch's CPU kernel): lazy, so they
    # cost nothing when only the output is used (inference)
    xf = x if x.dtype != np.float16 else lm.astype(x, np.float32)
    mean = lm.mean(xf, axis=axes, keepdims=True)
    var = lm.mean(lm.square(xf - mean), axis=axes, keepdims=True)
    rstd = lm.rsqrt(var + eps)
    return (y, None if out[1] is None else lm.astype(mean, _out_dtype(out[1])),
            None if out[2] is None else lm.astype(rstd, _out_dtype(out[2])))  # fmt: skip


# ----------------------------------------------------------------------------- matmul, conv


@_register(aten.mm.default, aten.bmm.default, aten.matmul.default)
def _mm(out, a, b):
    return lm.matmul(a, b)


@_register(aten.addmm.default)
def _addmm(out, bias, a, b, *, beta=1, alpha=1):
    p = lm.matmul(a, b)
    if alpha != 1:
        p = p * alpha
    if beta == 0:
        return p
    return p + (bias if beta == 1 else bias * beta)


@_register(aten.baddbmm.default)
def _baddbmm(out, bias, a, b, *, beta=1, alpha=1):
    return _addmm(out, bias, a, b, beta=beta, alpha=alpha)


@_register(aten.convolution.default)
def _convolution(out, x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    if transposed:
        raise Unsupported("transposed convolution")
    if x.ndim != 3 or len(stride) != 1:
        raise Unsupported(f"{x.ndim - 2}-d convolution (lazymath has conv1d)")
    return lm.conv1d(x, w, bias, stride=int(stride[0]), padding=int(padding[0]),
                     dilation=int(dilation[0]), groups=int(groups))  # fmt: skip


@_register(aten.embedding.default)
def _embedding(out, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return lnn.embedding(indices, weight)


@_register(aten.index_select.default)
def _index_select(out, x, dim, index):
    return lm.take(x, index, axis=_dim(dim, x.ndim))


# ----------------------------------------------------------------------------- attention


def _sdpa_scores(q, k, is_causal, attn_mask, scale):
    """The masked, scaled attention logits (..., L, S) in q's dtype, and the scale used."""
    E = q.shape[-1]
    sc = 1.0 / math.sqrt(E) if scale is None else float(scale)
    s = lm.matmul(q, lm.swapaxes(k, -1, -2)) * sc
    L, S = q.shape[-2], k.shape[-2]
    if is_causal:
        i = lm.arange(L, dtype=np.int32).reshape(L, 1)
        j = lm.arange(S, dtype=np.int32).reshape(1, S)
        s = lm.where(i >= j, s, -math.inf)
    elif attn_mask is not None:
        s = (lm.where(attn_mask, s, -math.inf) if attn_mask.dtype == np.bool_
             else s + lm.astype(attn_mask, s.dtype))  # fmt: skip
    return s, sc


@_register(aten._scaled_dot_product_flash_attention_for_cpu.default)
def _sdpa_flash_cpu(out, q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None,
                    scale=None):  # fmt: skip
    if dropout_p:
        raise Unsupported("attention dropout (random numbers stay torch's)")
    if out[1] is None:  # inference: no logsumexp, lm.nn's attention as it stands
        o = lnn.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                                             scale=scale)  # fmt: skip
        return (o, None)
    # training: the saved logsumexp comes from the same scores as the output (one QK^T)
    s, _ = _sdpa_scores(q, k, is_causal, attn_mask, scale)
    sf = s if s.dtype == np.float32 else lm.astype(s, np.float32)
    mx = lm.max(sf, axis=-1, keepdims=True)
    safe = lm.where(mx == -math.inf, 0.0, mx)  # a fully masked row: zeros, as torch's kernel
    e = lm.exp(sf - safe)
    total = lm.sum(e, axis=-1, keepdims=True)
    p = e / lm.where(total == 0, 1.0, total)
    o = lm.matmul(lm.astype(p, v.dtype), v)
    lse = lm.squeeze(lm.log(total) + safe, -1)
    return (o, lm.astype(lse, _out_dtype(out[1])))


@_register(aten._scaled_dot_product_flash_attention_for_cpu_backward.default)
def _sdpa_flash_cpu_backward(out, dout, q, k, v, o, lse, dropout_p=0.0, is_causal=False, *,
                             attn_mask=None, scale=None):  # fmt: skip
    """The attention backward from the saved logsumexp: P = exp(S - lse) recomputed,
    dV = P^T dO, dS = P * (dO V^T - rowsum(dO * O)), dQ = dS K scale, dK = dS^T Q scale,
    in float32 (float16 inputs are widened, as torch's CPU kernel accumulates)."""
    if dropout_p:
        raise Unsupported("attention dropout backward")
    f32 = np.float32
    qf, kf, vf, dof, of = (lm.astype(t, f32) for t in (q, k, v, dout, o))
    s, sc = _sdpa_scores(qf, kf, is_causal, attn_mask, scale)
    p = lm.exp(s - lm.expand_dims(lm.astype(lse, f32), -1))
    dv = lm.matmul(lm.swapaxes(p, -1, -2), dof)
    dp = lm.matmul(dof, lm.swapaxes(vf, -1, -2))
    delta = lm.sum(dof * of, axis=-1, keepdims=True)
    ds = p * (dp - delta)
    dq = lm.matmul(ds, kf) * sc
    dk = lm.matmul(lm.swapaxes(ds, -1, -2), qf) * sc
    return tuple(lm.astype(g, _out_dtype(m)) for g, m in zip((dq, dk, dv), out))


# operator.* on Python numbers (dynamic shapes: SymInt arithmetic) run as Python
PYTHON_TARGETS = {operator.add, operator.sub, operator.mul, operator.floordiv,
                  operator.truediv, operator.mod, operator.neg, operator.pow, math.ceil,
                  math.floor, math.sqrt, operator.eq, operator.ne, operator.lt, operator.le,
                  operator.gt, operator.ge}  # fmt: skip


# ----------------------------------------------------------------------------- second model set


@_register(aten.slice_scatter.default)
def _slice_scatter(out, x, src, dim=0, start=None, end=None, step=1):
    """x with x[dim][start:end] replaced by src: the backward of slicing (RoPE's halves in
    training). Written as a concat of the kept pieces around src, so it fuses like cat."""
    d = _dim(dim, x.ndim)
    n = x.shape[d]
    start = 0 if start is None else int(start)
    start = builtin_max(start + n, 0) if start < 0 else min(start, n)
    end = n if end is None else int(end)
    end = builtin_max(end + n, 0) if end < 0 else min(end, n)
    if int(step) != 1:
        raise Unsupported("slice_scatter with step != 1")
    dt = _out_dtype(out)
    src = src if src.dtype == dt else lm.astype(src, dt)
    pieces = []
    for lo, hi in ((0, start), (end, n)):
        if hi > lo:
            idx = [slice(None)] * x.ndim
            idx[d] = slice(lo, hi)
            pieces.append((lo, x[tuple(idx)]))
    pieces.append((start, src))
    pieces.sort(key=lambda p: p[0])
    ts = [p[1] for p in pieces]
    return ts[0] if len(ts) == 1 else lm.concat(ts, axis=d)


@_register(aten.cumsum.default)
def _cumsum(out, x, dim, dtype=None):
    return lm.cumulative_sum(x, axis=_dim(dim, x.ndim), dtype=_out_dtype(out))


@_register(aten._native_batch_norm_legit_no_training.default)
def _batch_norm_eval(out, x, weight, bias, running_mean, running_var, momentum, eps):
    """BatchNorm in eval: an elementwise affine map over channel dim 1 from the running
    statistics (the saved mean/rstd torch returns here are empty)."""
    shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    y = (x - lm.reshape(running_mean, shape)) * lm.rsqrt(lm.reshape(running_var, shape) + eps)
    if weight is not None:
        y = y * lm.reshape(weight, shape)
    if bias is not None:
        y = y + lm.reshape(bias, shape)
    y = lm.astype(y, _out_dtype(out[0]))
    rest = tuple(None if o is None else _fill(o, o.shape, 0, _out_dtype(o)) for o in out[1:])
    return (y,) + rest


@_register(aten.gather.default)
def _gather(out, x, dim, index, sparse_grad=False):
    """torch.gather is numpy's take_along_axis (same index shape rule on the gathered dim;
    torch also allows an index smaller than x on the other dims, which we slice to)."""
    d = _dim(dim, x.ndim)
    if x.ndim == 0:
        return x
    idx = tuple(slice(0, int(s)) if i != d else slice(None) for i, s in enumerate(index.shape))
    if any(int(index.shape[i]) != x.shape[i] for i in range(x.ndim) if i != d):
        x = x[idx]
    return lm.take_along_axis(x, lm.astype(index, np.int64), axis=d)


@_register(aten.max_pool2d_with_indices.default)
def _max_pool2d(out, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    """Max pooling (MaxPool1d arrives here as a 2-d pool of height 1) as the elementwise
    maximum of the kh*kw strided window slices over an -inf padded input: fuses into one
    Vector kernel. The indices (flat h*w positions in the unpadded input, the first maximum
    as torch's CPU kernel) are a where() chain over the same slices; lazy, so free when unused."""
    if ceil_mode:
        raise Unsupported("max_pool2d with ceil_mode=True")

    def pair(v, default):
        v = default if v is None or (not isinstance(v, int) and len(v) == 0) else v
        return (int(v), int(v)) if isinstance(v, int) else (int(v[0]), int(v[-1]))

    k = pair(kernel_size, None)
    s = pair(stride, k)
    p = pair(padding, 0)
    d = pair(dilation, 1)
    h, w = x.shape[-2] + 2 * p[0], x.shape[-1] + 2 * p[1]
    ho = (h - d[0] * (k[0] - 1) - 1) // s[0] + 1
    wo = (w - d[1] * (k[1] - 1) - 1) // s[1] + 1
    if p != (0, 0):
        width = [(0, 0)] * (x.ndim - 2) + [(p[0], p[0]), (p[1], p[1])]
        x = lm.pad(
            x, width, constant_values=-np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
        )
    w_in = w - 2 * p[1]
    rows = lm.reshape(lm.arange(ho, dtype=np.int64) * s[0] - p[0], (ho, 1))
    cols = lm.reshape(lm.arange(wo, dtype=np.int64) * s[1] - p[1], (1, wo))
    y = ix = None
    for i in range(k[0]):
        for j in range(k[1]):
            r0, c0 = i * d[0], j * d[1]
            win = x[..., r0 : r0 + s[0] * (ho - 1) + 1 : s[0], c0 : c0 + s[1] * (wo - 1) + 1 : s[1]]
            pos = (rows + r0) * w_in + (cols + c0)
            if y is None:
                y, ix = win, lm.broadcast_to(pos, win.shape)
            else:
                take = (win > y) | (lm.isnan(win) & ~lm.isnan(y))
                ix = lm.where(take, pos, ix)
                y = lm.where(take, win, y)
    return (y, None if out[1] is None else lm.astype(ix, np.int64))
