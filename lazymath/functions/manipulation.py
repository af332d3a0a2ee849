"""The Array API's manipulation functions built from the shape and elementwise ones (lazy unless
said): moveaxis, matrix_transpose, unstack, broadcast_arrays, meshgrid, tril, triu, roll, tile,
repeat, diff, isin; and `dense` / `dense_view`, how a broadcast or permuted view is made dense
so that a reshape can merge its axes.
"""

from __future__ import annotations

import builtins
import operator

import numpy as np

from lazymath import dtypes as dt
from lazymath.functions.base import _axes, broadcast_shapes, one_axis
from lazymath.functions.creation import from_host, host_value, tensor, tensor_arg, zeros
from lazymath.functions.elementwise import add, eq, logical_not, logical_or, sub, where
from lazymath.functions.reductions import any
from lazymath.functions.shapes import (
    broadcast_to,
    concat,
    expand_dims,
    permute_dims,
    reshape,
    swapaxes,
)
from lazymath.tensor import Tensor


def moveaxis(x, source, destination, /) -> Tensor:
    """Move axes to new positions (a lazy permutation)."""
    x = tensor_arg(x, "moveaxis")
    src = (source,) if isinstance(source, int) else tuple(source)
    dst = (destination,) if isinstance(destination, int) else tuple(destination)
    if len(src) != len(dst):
        raise ValueError("moveaxis: source and destination need the same number of axes")
    src = [_axes(a, x.ndim, "moveaxis")[0] for a in src]
    dst = [_axes(a, x.ndim, "moveaxis")[0] for a in dst]
    if len(set(src)) != len(src) or len(set(dst)) != len(dst):
        raise ValueError("moveaxis: repeated axis")
    order = [a for a in range(x.ndim) if a not in src]
    for d, s_ in sorted(zip(dst, src)):
        order.insert(d, s_)
    return permute_dims(x, order)


def matrix_transpose(x, /) -> Tensor:
    """Swap the last two axes (lazy)."""
    x = tensor_arg(x, "matrix_transpose")
    if x.ndim < 2:
        raise ValueError(f"matrix_transpose: needs at least 2 dimensions, got {x.shape}")
    return swapaxes(x, -1, -2)


def unstack(x, /, *, axis: int = 0) -> tuple:
    """The slices of x along `axis` (lazy views)."""
    x = tensor_arg(x, "unstack")
    if x.ndim == 0:
        raise ValueError("unstack: a 0-d tensor has no axis")
    ax = one_axis(axis, x.ndim, "unstack")
    return tuple(x[(slice(None),) * ax + (i,)] for i in range(x.shape[ax]))


def broadcast_arrays(*arrays) -> list:
    """The tensors broadcast to their common shape (lazy views)."""
    ts = [tensor_arg(a, "broadcast_arrays") for a in arrays]
    shape = broadcast_shapes(*(t.shape for t in ts), op="broadcast_arrays")
    return [broadcast_to(t, shape) for t in ts]


def meshgrid(*arrays, indexing: str = "xy") -> list:
    """Coordinate grids from 1-d tensors (lazy broadcasts); 'xy' swaps the first two axes."""
    if indexing not in ("xy", "ij"):
        raise ValueError(f"meshgrid: indexing must be 'xy' or 'ij', got {indexing!r}")
    ts = [tensor_arg(a, "meshgrid") for a in arrays]
    for t in ts:
        if t.ndim != 1:
            raise ValueError(f"meshgrid: inputs must be 1-d, got shape {t.shape}")
    if ts and builtins.len({t.dtype for t in ts}) > 1:
        raise TypeError("meshgrid: inputs must share a dtype")
    n = len(ts)
    shape = [t.shape[0] for t in ts]
    if indexing == "xy" and n >= 2:
        shape[0], shape[1] = shape[1], shape[0]
    out = []
    for k, t in enumerate(ts):
        pos = k
        if indexing == "xy" and n >= 2 and k < 2:
            pos = 1 - k
        r = [1] * n
        r[pos] = t.shape[0]
        out.append(broadcast_to(reshape(t, tuple(r)), tuple(shape)))
    return out


def _tri_mask(shape: tuple, k: int, lower: bool) -> Tensor:
    m, n = shape[-2], shape[-1]
    mask = np.tri(m, n, k, dtype=bool) if lower else ~np.tri(m, n, k - 1, dtype=bool)
    return tensor(mask)


def tril(x, /, *, k: int = 0) -> Tensor:
    """Lower triangle (elements above the k-th diagonal zeroed): a lazy where() with a mask."""
    x = tensor_arg(x, "tril")
    if x.ndim < 2:
        raise ValueError(f"tril: needs at least 2 dimensions, got {x.shape}")
    return where(_tri_mask(x.shape, operator.index(k), True), x, zeros((), x.dtype))


def triu(x, /, *, k: int = 0) -> Tensor:
    """Upper triangle (elements below the k-th diagonal zeroed): a lazy where() with a mask."""
    x = tensor_arg(x, "triu")
    if x.ndim < 2:
        raise ValueError(f"triu: needs at least 2 dimensions, got {x.shape}")
    return where(_tri_mask(x.shape, operator.index(k), False), x, zeros((), x.dtype))


def roll(x, /, shift, *, axis=None) -> Tensor:
    """Shift elements along axes, wrapping around (lazy slices and a concat)."""
    x = tensor_arg(x, "roll")
    if axis is None:
        return reshape(roll(reshape(x, (-1,)), shift, axis=0), x.shape)
    shifts = (shift,) if isinstance(shift, int) else tuple(shift)
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    if len(shifts) == 1 and len(axes) > 1:
        shifts = shifts * len(axes)
    if len(shifts) != len(axes):
        raise ValueError("roll: shift and axis must have the same length")
    out = x
    for sh, ax in zip(shifts, axes):
        ax = _axes(ax, x.ndim, "roll")[0]
        n = x.shape[ax]
        if n == 0:
            continue
        sh = operator.index(sh) % n
        if sh == 0:
            continue
        pre = (slice(None),) * ax
        out = concat([out[pre + (slice(n - sh, None),)], out[pre + (slice(0, n - sh),)]], ax)
    return out


def tile(x, repetitions, /) -> Tensor:
    """x repeated along each axis (lazy: a broadcast and a reshape)."""
    x = tensor_arg(x, "tile")
    reps = tuple(operator.index(r) for r in repetitions)
    if builtins.any(r < 0 for r in reps):
        raise ValueError(f"tile: repetitions must be non-negative, got {reps}")
    nd = builtins.max(x.ndim, len(reps))
    reps = (1,) * (nd - len(reps)) + reps
    shape = (1,) * (nd - x.ndim) + x.shape
    inter = []
    for s_ in shape:
        inter += [1, s_]
    y = reshape(x, tuple(inter))
    big = []
    for r, s_ in zip(reps, shape):
        big += [r, s_]
    y = broadcast_to(y, tuple(big))
    return reshape(dense(y), tuple(r * s_ for r, s_ in zip(reps, shape)))


def dense(x: Tensor) -> Tensor:
    """A broadcast view made dense, so a reshape can merge its axes (a fused copy)."""
    return add(x, zeros((), x.dtype)) if x.dtype != dt.bool_ else logical_or(x, False)


def repeat(x, repeats, /, *, axis=None) -> Tensor:
    """Each element repeated `repeats` times along `axis` (flattened if None). Lazy for an
    integer count; a tensor of counts (data-dependent shape) realizes at the call."""
    x = tensor_arg(x, "repeat")
    if axis is None:
        x, axis = reshape(x, (-1,)), 0
    ax = one_axis(axis, x.ndim, "repeat")
    if isinstance(repeats, Tensor) or not isinstance(repeats, (int, np.integer)):
        r = (
            host_value(tensor_arg(repeats, "repeat"), "repeat")
            if isinstance(repeats, Tensor)
            else repeats
        )
        return from_host(np.repeat(host_value(x, "repeat"), r, axis=ax), x)
    r = operator.index(repeats)
    if r < 0:
        raise ValueError(f"repeat: repeats must be non-negative, got {r}")
    y = expand_dims(x, ax + 1)
    shape = list(y.shape)
    shape[ax + 1] = r
    y = broadcast_to(y, tuple(shape))
    out = list(x.shape)
    out[ax] *= r
    return reshape(dense(y), tuple(out))


def diff(x, /, *, axis: int = -1, n: int = 1, prepend=None, append=None) -> Tensor:
    """n-th forward difference along `axis` (lazy slices and subtractions)."""
    x = tensor_arg(x, "diff")
    if x.ndim == 0:
        raise ValueError("diff: a 0-d tensor has no axis")
    ax = one_axis(axis, x.ndim, "diff")
    n = operator.index(n)
    if n < 0:
        raise ValueError(f"diff: n must be non-negative, got {n}")
    parts = [p for p in (prepend, x, append) if p is not None]
    if len(parts) > 1:
        x = concat([tensor_arg(p, "diff") for p in parts], ax)
    pre = (slice(None),) * ax
    for _ in range(n):
        if x.shape[ax] == 0:
            break
        x = sub(x[pre + (slice(1, None),)], x[pre + (slice(None, -1),)])
    return x


def isin(x1, x2, /, *, invert: bool = False) -> Tensor:
    """Whether each element of x1 is in x2 (lazy: a broadcast compare and an any())."""
    a, b = tensor_arg(x1, "isin"), tensor_arg(x2, "isin")
    flat = reshape(b, (-1,))
    hit = eq(expand_dims(a, -1), flat)
    found = any(hit, axis=-1)
    return logical_not(found) if invert else found


def dense_view(x: Tensor) -> Tensor:
    return x if x.node.op != "permute" else dense(x)
