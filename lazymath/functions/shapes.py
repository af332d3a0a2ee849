"""Shape functions: the views (reshape, permute_dims/transpose/swapaxes, expand_dims, squeeze,
broadcast_to, flip: nodes that move no data until a kernel reads through them) and the joins
(concat, stack, pad).
"""

from __future__ import annotations

import builtins
import math
import operator
from collections.abc import Sequence

import numpy as np

from lazymath import dtypes as dt
from lazymath.functions.base import _axes, _cast, _expand, _shape_arg, broadcast_shapes
from lazymath.functions.creation import tensor
from lazymath.graph import node as gn
from lazymath.tensor import Tensor, check_devices, peel_const, wrap

# ----------------------------------------------------------------------------- views


def reshape(x: Tensor, shape, *, copy=None) -> Tensor:
    """A view with a new shape (one -1 is inferred). Tensors are immutable: `copy=` is
    accepted for the Array API and changes nothing."""
    try:
        shape = (
            (operator.index(shape),)
            if not isinstance(shape, (tuple, list))
            else tuple(operator.index(s) for s in shape)
        )
    except TypeError:
        raise TypeError(
            f"reshape: shape must be an int or a tuple of ints, got {shape!r}"
        ) from None
    if shape.count(-1) > 1:
        raise ValueError(f"reshape: only one dimension can be -1, got {shape}")
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        if known == 0 or x.size % known:
            raise ValueError(f"reshape: cannot reshape tensor of shape {x.shape} into {shape}")
        shape = tuple(x.size // known if s == -1 else s for s in shape)
    if builtins.any(s < 0 for s in shape) or math.prod(shape) != x.size:
        raise ValueError(
            f"reshape: cannot reshape tensor of shape {x.shape} ({x.size} elements) into "
            f"shape {shape} ({math.prod(shape)} elements)"
        )
    if shape == x.shape:
        return x
    node = x._node
    if node.op == "reshape" and node.srcs:  # reshape of reshape is one reshape
        node = node.srcs[0]
        if node.shape == shape:
            return wrap(node, [x])
    c = peel_const(x._node)
    if c is not None:
        return wrap(_expand(c, shape), [x])
    return wrap(gn.make("reshape", x.dtype, shape, (node,)), [x])


def permute_dims(x: Tensor, axes) -> Tensor:
    """A view with the axes reordered: output axis i is input axis `axes[i]`. No data
    moves until a kernel reads it; nested permutes compose into one."""
    axes = tuple(int(a) for a in axes)
    if (
        sorted(a % x.ndim if x.ndim else a for a in axes) != list(range(x.ndim))
        or len(axes) != x.ndim
    ):
        raise ValueError(f"permute_dims: axes {axes} are not a permutation of {x.ndim} axes")
    axes = tuple(a % x.ndim for a in axes)
    if axes == tuple(range(x.ndim)):
        return x
    shape = tuple(x.shape[a] for a in axes)
    node = x._node
    if node.op == "permute" and node.srcs:  # compose permutations (unless realized)
        inner = node.arg
        axes = tuple(inner[a] for a in axes)
        node = node.srcs[0]
        if axes == tuple(range(len(axes))):
            return wrap(node, [x])
    return wrap(gn.make("permute", x.dtype, shape, (node,), axes), [x])


def transpose(x: Tensor, axes=None) -> Tensor:
    """A view with the axes reversed (or reordered by `axes`, like numpy.transpose)."""
    if axes is None:
        axes = tuple(reversed(range(x.ndim)))
    return permute_dims(x, axes)


def swapaxes(x: Tensor, a: int, b: int) -> Tensor:
    """A view with axes `a` and `b` exchanged."""
    a, b = _axes(a, x.ndim, "swapaxes")[0], _axes(b, x.ndim, "swapaxes")[0]
    axes = list(range(x.ndim))
    axes[a], axes[b] = axes[b], axes[a]
    return permute_dims(x, axes)


def expand_dims(x: Tensor, axis) -> Tensor:
    """A view with size-1 axes inserted at `axis` (an int or a tuple of positions in the
    result)."""
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    nd = x.ndim + len(axes)
    for a in axes:  # the standard raises IndexError here; numpy's AxisError is also a ValueError
        if isinstance(a, (int, np.integer)) and not -nd <= a < nd:
            raise np.exceptions.AxisError(
                f"expand_dims: axis {a} is out of bounds for the {nd}-d result (x has {x.ndim})"
            )
    norm = _axes(axes, nd, "expand_dims")
    shape, it = [], iter(x.shape)
    for i in range(nd):
        shape.append(1 if i in norm else next(it))
    return reshape(x, tuple(shape))


def squeeze(x: Tensor, axis=None) -> Tensor:
    """A view without the size-1 axes (all of them, or those in `axis`; naming an axis whose
    size is not 1 raises ValueError)."""
    if axis is None:
        axes = tuple(i for i, s in enumerate(x.shape) if s == 1)
    else:
        axes = _axes(axis, x.ndim, "squeeze")
        for a in axes:
            if x.shape[a] != 1:
                raise ValueError(
                    f"squeeze: cannot remove axis {a} of size {x.shape[a]} (shape {x.shape})"
                )
    return reshape(x, tuple(s for i, s in enumerate(x.shape) if i not in axes))


def broadcast_to(x: Tensor, shape) -> Tensor:
    """A read-only view of `x` broadcast to `shape` (stride 0 on the stretched axes);
    raises ValueError when numpy's broadcasting rules do not allow it."""
    shape = _shape_arg(shape)
    out = broadcast_shapes(x.shape, shape, op="broadcast_to")
    if out != shape:
        raise ValueError(f"broadcast_to: cannot broadcast shape {x.shape} to {shape}")
    if shape == x.shape:
        return x
    return wrap(_expand(x._node, shape), [x])


def _slice_node(x: Tensor, spec) -> Tensor:
    """spec: per-axis (start, count, step) with step != 0, already normalised."""
    if builtins.all(st == 0 and c == s and sp == 1 for (st, c, sp), s in zip(spec, x.shape)):
        return x
    shape = tuple(c for _, c, _ in spec)
    return wrap(gn.make("slice", x.dtype, shape, (x._node,), tuple(spec)), [x])


def flip(x: Tensor, axis=None) -> Tensor:
    """A view with the order of elements reversed along `axis` (all axes by default): a
    negative-stride slice, no copy."""
    axes = _axes(axis, x.ndim, "flip")
    spec = tuple(
        (s - 1, s, -1) if i in axes and s > 0 else (0, s, 1) for i, s in enumerate(x.shape)
    )
    return _slice_node(x, spec)


# ----------------------------------------------------------------------------- copies


def concat(tensors: Sequence[Tensor], axis: int | None = 0) -> Tensor:
    """Join tensors along `axis` (None: flattened first, as the Array API says)."""
    ts = [t if isinstance(t, Tensor) else tensor(t) for t in tensors]
    if not ts:
        raise ValueError("concat: need at least one tensor")
    if axis is None:
        ts, axis = [reshape(t, (-1,)) for t in ts], 0
    check_devices("concat", ts)
    nd = ts[0].ndim
    if nd == 0:
        raise ValueError("concat: zero-dimensional tensors cannot be concatenated")
    for t in ts:
        if t.ndim != nd:
            raise ValueError(
                f"concat: all tensors must have the same number of dimensions, got shapes "
                f"{[t.shape for t in ts]}"
            )
    ax = _axes(axis, nd, "concat")[0]
    for t in ts:
        for d in range(nd):
            if d != ax and t.shape[d] != ts[0].shape[d]:
                raise ValueError(
                    f"concat: shapes {[t.shape for t in ts]} differ on axis {d}, which is not "
                    f"the concatenation axis {ax}"
                )
    out_dtype = dt.result_type(*[t.dtype for t in ts])
    shape = list(ts[0].shape)
    shape[ax] = builtins.sum(t.shape[ax] for t in ts)
    srcs = [_cast(t._node, out_dtype) for t in ts]
    return wrap(gn.make("concat", out_dtype, tuple(shape), srcs, ax), ts)


concatenate = concat


def stack(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    """Join same-shape tensors along a new axis `axis` (numpy.stack): each gets a size-1 axis
    and the results are concatenated."""
    ts = [t if isinstance(t, Tensor) else tensor(t) for t in tensors]
    if not ts:
        raise ValueError("stack: need at least one tensor")
    for t in ts:
        if t.shape != ts[0].shape:
            raise ValueError(
                f"stack: all tensors must have the same shape, got {[t.shape for t in ts]}"
            )
    ax = _axes(axis, ts[0].ndim + 1, "stack")[0]
    return concat([expand_dims(t, ax) for t in ts], ax)


def pad(x: Tensor, pad_width, mode: str = "constant", constant_values=0) -> Tensor:
    """numpy.pad with mode='constant': `pad_width` is an int, a (before, after) pair, or one
    pair per axis; the padding is filled with `constant_values`."""
    if mode != "constant":
        raise ValueError(f"pad: only mode='constant' is supported, got {mode!r}")
    try:
        w = np.broadcast_to(np.asarray(pad_width, dtype=np.int64), (x.ndim, 2))
    except (TypeError, ValueError):
        raise ValueError(
            f"pad: pad_width {pad_width!r} must be an int, a (before, after) pair or one pair "
            f"per axis of shape {x.shape}"
        ) from None
    if (w < 0).any():
        raise ValueError(f"pad: pad widths must be non-negative, got {pad_width}")
    widths = tuple((int(a), int(b)) for a, b in w)
    if not builtins.any(a or b for a, b in widths):  # nothing to pad (also every 0-d tensor)
        return x
    shape = tuple(s + a + b for s, (a, b) in zip(x.shape, widths))
    try:  # numpy's rule: a Python int that does not fit the dtype is an OverflowError
        value = np.asarray(constant_values, dtype=x.dtype).item()
    except OverflowError as e:
        raise OverflowError(f"pad: constant_values {constant_values!r} does not fit dtype "
                            f"{x.dtype}: {e}") from None  # fmt: skip
    return wrap(gn.make("pad", x.dtype, shape, (x._node,), (widths, value)), [x])
