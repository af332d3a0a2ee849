"""Indexing: `t[idx]` (basic indexing is a lazy view; integer-array and boolean indices run on the
host) and `t[idx] = value` (a functional update: the tensor is rebound to where(mask, value,
t)); Tensor.__getitem__ / __setitem__ call `getitem` / `setitem`. The Array API's take,
take_along_axis and nonzero gather on the host at the call (they realize their inputs).
"""

from __future__ import annotations

import builtins
import operator

import numpy as np

from lazymath import dtypes as dt
from lazymath.functions.base import astype, one_axis
from lazymath.functions.creation import (
    _as_tensor_or_scalar,
    _from_numpy,
    from_host,
    full,
    host_value,
    tensor,
    tensor_arg,
)
from lazymath.functions.elementwise import logical_and, where
from lazymath.functions.shapes import _slice_node, broadcast_to, expand_dims, flip, pad, reshape
from lazymath.tensor import Tensor, note_sync


def _is_advanced(idx: tuple) -> bool:
    return builtins.any(isinstance(i, (Tensor, np.ndarray, list, bool, np.bool_)) for i in idx)


def _basic_index(x: Tensor, idx: tuple) -> tuple[tuple, tuple]:
    """(per-axis (start, count, step), result shape) of a basic index: ints, slices, None,
    one ellipsis."""
    n_ell = builtins.sum(1 for i in idx if i is Ellipsis)
    if n_ell > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    n_real = builtins.sum(1 for i in idx if i is not None and i is not Ellipsis)
    if n_real > x.ndim:
        raise IndexError(f"too many indices for tensor of shape {x.shape}: {n_real} were given")
    if n_ell:
        k = idx.index(Ellipsis)
        idx = idx[:k] + (slice(None),) * (x.ndim - n_real) + idx[k + 1 :]
    else:
        idx = idx + (slice(None),) * (x.ndim - n_real)
    spec, out_shape, axis = [], [], 0
    for i in idx:
        if i is None:
            out_shape.append(1)
            continue
        size = x.shape[axis]
        if isinstance(i, slice):
            try:
                start, stop, step = i.indices(size)
            except TypeError:
                raise IndexError(f"slice {i} must have integer (or None) bounds") from None
            count = len(range(start, stop, step))
            spec.append((start if count else 0, count, step))
            out_shape.append(count)
        else:
            try:
                j = operator.index(i)
            except TypeError:
                raise IndexError(f"unsupported index {i!r} of type {type(i).__name__}") from None
            if not -size <= j < size:
                raise IndexError(f"index {j} is out of bounds for axis {axis} with size {size}")
            spec.append((j % size, 1, 1))
        axis += 1
    return tuple(spec), tuple(out_shape)


def _host_index(idx: tuple) -> tuple:
    """An advanced index with its tensors realized to numpy arrays (an implicit sync)."""
    out = []
    for i in idx:
        if isinstance(i, Tensor):
            note_sync("index", i)
            i = i.numpy()
        elif isinstance(i, list):
            i = np.asarray(i)
        if isinstance(i, np.ndarray) and i.dtype.kind not in "biu":
            raise IndexError(f"array indices must be integer or bool, not {i.dtype}")
        out.append(i)
    return tuple(out)


def getitem(x: Tensor, idx) -> Tensor:
    """Basic indexing (ints, slices with steps, None, ...) is a lazy view. Integer-array and
    boolean-mask indexing (numpy's advanced indexing) realize `x` and the index at the call:
    the result's shape depends on the data (masks) or it gathers (integer arrays)."""
    if not isinstance(idx, tuple):
        idx = (idx,)
    if _is_advanced(idx):
        key = _host_index(idx)
        note_sync("getitem", x)
        try:
            got = x.numpy()[key]
        except IndexError as e:
            raise IndexError(f"{e} (tensor of shape {x.shape})") from None
        return _from_numpy(np.array(got, copy=True, order="C"), "getitem", x._device)
    spec, out_shape = _basic_index(x, idx)
    out = _slice_node(x, spec)
    return reshape(out, out_shape)


def _axis_mask(size: int, start: int, count: int, step: int) -> np.ndarray:
    m = np.zeros(size, dtype=bool)
    m[range(start, start + count * step, step) if count else []] = True
    return m


def setitem(x: Tensor, idx, value) -> Tensor:
    """The tensor `x` would be after ``x[idx] = value``, as a new graph node (functional):
    where(mask, value placed at idx, x). Lazy for basic indices and for a boolean mask with a
    scalar value; an integer-array index, or a mask with an array of values, realizes `x`."""
    if not isinstance(idx, tuple):
        idx = (idx,)
    if isinstance(value, Tensor):
        v = value
    else:
        v = value if type(value) is complex else _as_tensor_or_scalar(value, "setitem")
        if not isinstance(v, Tensor):  # a Python scalar (weak): x's dtype if it holds the kind
            rank = {"b": 0, "u": 1, "i": 1, "f": 2, "c": 3}
            fits = rank[np.dtype(type(v)).kind] <= rank[x.dtype.kind]
            v = full((), v, x.dtype if fits else None)
    if v.dtype != x.dtype:
        if not np.can_cast(v.dtype, x.dtype, "same_kind"):
            raise TypeError(f"setitem: cannot store {v.dtype} values into a {x.dtype} tensor")
        v = astype(v, x.dtype)
    if len(idx) == 1 and isinstance(idx[0], Tensor) and idx[0].dtype == dt.bool_:
        mask = idx[0]
        if mask.shape == x.shape and v.size == 1:
            return where(mask, reshape(v, ()), x)
    if _is_advanced(idx):
        key = _host_index(idx)
        note_sync("setitem", x)
        a = np.array(x.numpy(), copy=True)
        try:
            a[key] = v.numpy()
        except (IndexError, ValueError) as e:
            raise type(e)(f"setitem: {e} (tensor of shape {x.shape})") from None
        return _from_numpy(a, "setitem", x._device)
    spec, region = _basic_index(x, idx)
    if builtins.any(c == 0 for _, c, _ in spec):
        return x
    try:
        vb = broadcast_to(v, region)
    except ValueError:
        raise ValueError(f"setitem: value of shape {v.shape} cannot be broadcast to the indexed "
                         f"region of shape {region}") from None  # fmt: skip
    mask = None
    for d, (start, count, step) in enumerate(spec):
        if count == x.shape[d]:
            continue  # the whole axis
        m = _axis_mask(x.shape[d], start, count, step).reshape(
            (1,) * d + (x.shape[d],) + (1,) * (x.ndim - d - 1))  # fmt: skip
        mt = tensor(m)
        mask = mt if mask is None else logical_and(mask, mt)
    if v.size == 1:
        placed = reshape(v, ())
    else:  # move the values to their positions: flip negative steps, spread steps, pad
        placed = reshape(vb, tuple(c for _, c, _ in spec))
        for d, (start, count, step) in enumerate(spec):
            if step < 0:
                placed = flip(placed, d)
                start, step = start + (count - 1) * step, -step
            if step > 1:
                w = [(0, 0)] * (placed.ndim + 1)
                w[d + 1] = (0, step - 1)
                spread = pad(expand_dims(placed, d + 1), w)
                shp = list(placed.shape)
                shp[d] = count * step
                placed = reshape(spread, tuple(shp))
                placed = _slice_node(
                    placed, tuple((0, (count - 1) * step + 1 if k == d else s, 1)
                                  for k, s in enumerate(placed.shape)))  # fmt: skip
            w = [(0, 0)] * placed.ndim
            w[d] = (start, x.shape[d] - start - placed.shape[d])
            placed = pad(placed, w)
    if mask is None:
        return broadcast_to(placed, x.shape) if placed.shape != x.shape else placed
    return where(mask, placed, x)


# ----------------------------------------------------------------------------- take, nonzero


def take(x, indices, /, *, axis=None) -> Tensor:
    """Elements of x at integer `indices` along `axis` (1-d x may omit it). A gather: computed
    on the host at the call (it realizes x and the indices)."""
    x, i = tensor_arg(x, "take"), tensor_arg(indices, "take")
    if i.dtype.kind not in "iu":
        raise IndexError(f"take: indices must be integers, got {i.dtype}")
    if axis is None:
        if x.ndim != 1:
            raise ValueError("take: axis is required for tensors of more than one dimension")
        axis = 0
    ax = one_axis(axis, x.ndim, "take")
    try:
        r = np.take(host_value(x, "take"), host_value(i, "take"), axis=ax)
    except IndexError as e:
        raise IndexError(f"take: {e}") from None
    return from_host(r, x)


def take_along_axis(x, indices, /, *, axis: int = -1) -> Tensor:
    """Gather along `axis` with an index tensor of x's rank. Realizes both at the call."""
    x, i = tensor_arg(x, "take_along_axis"), tensor_arg(indices, "take_along_axis")
    if i.dtype.kind not in "iu" or i.ndim != x.ndim:
        raise IndexError("take_along_axis: indices must be integers of x's rank")
    ax = one_axis(axis, x.ndim, "take_along_axis")
    try:
        r = np.take_along_axis(
            host_value(x, "take_along_axis"), host_value(i, "take_along_axis"), ax
        )
    except (IndexError, ValueError) as e:
        raise IndexError(f"take_along_axis: {e}") from None
    return from_host(r, x)


def nonzero(x, /) -> tuple:
    """Indices of the nonzero elements, one int64 tensor per axis. The output shape depends on
    the data: it realizes x at the call."""
    x = tensor_arg(x, "nonzero")
    if x.ndim == 0:
        raise ValueError("nonzero: 0-d tensors are not allowed (the standard's rule)")
    return tuple(from_host(i.astype(np.int64), x) for i in np.nonzero(host_value(x, "nonzero")))
