"""What every family of tensor functions builds on: the node helpers (`_expand` with its cache of
broadcast constants, `_cast` folding a cast of a constant), the argument checks (`_axes`,
`_shape_arg`, `one_axis`), the bounded plan memo (`_memo`), `broadcast_shapes` and `astype`.
"""

from __future__ import annotations

import builtins
import operator

import numpy as np

from lazymath import dtypes as dt
from lazymath.graph import node as gn
from lazymath.tensor import Tensor, device_arg, peel_const


def _shape_arg(shape) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    try:
        shape = tuple(operator.index(s) for s in shape)
    except TypeError:
        raise TypeError(f"shape must be a tuple of ints, got {shape!r}") from None
    if builtins.any(s < 0 for s in shape):
        raise ValueError(f"negative dimensions are not allowed: {shape}")
    return shape


def broadcast_shapes(*shapes: tuple[int, ...], op: str = "broadcast") -> tuple[int, ...]:
    """The numpy broadcast of `shapes` (axes aligned on the right, size 1 stretches).

    Raises ValueError naming `op` and every shape when two sizes disagree, so the message
    points at the user's call (`matmul (batch dimensions)`, `add`, ...), not at this helper."""
    first = shapes[0] if shapes else ()
    if all(s == first for s in shapes):
        return tuple(first)
    ndim = builtins.max((len(s) for s in shapes), default=0)
    out = []
    for d in range(ndim):
        size = 1
        for s in shapes:
            k = d - (ndim - len(s))
            if k < 0:
                continue
            v = s[k]
            if v == 1:
                continue
            if size != 1 and v != size:
                shown = " and ".join(str(tuple(x)) for x in shapes)
                raise ValueError(
                    f"{op}: shapes {shown} cannot be broadcast together: axis {d - ndim} has "
                    f"sizes {size} and {v} (sizes must match or be 1)"
                )
            size = v
        out.append(size)
    return tuple(out)


_CONST_EXPANDS: dict = {}  # (id(const), shape) -> (const, its expand): kept alive


def _expand(node: gn.Node, shape: tuple[int, ...]) -> gn.Node:
    if node.shape == shape:
        return node
    if node.op == "const":
        # scalars broadcast to the same shapes in every call of a composite op: keeping these
        # expand nodes alive saves re-creating (and re-interning) one node per scalar per call
        hit = _CONST_EXPANDS.get((id(node), shape))
        if hit is not None and hit[1].realized is None:
            return hit[1]
        out = gn.make("expand", node.dtype, shape, (node,))
        if len(_CONST_EXPANDS) > 4096:
            _CONST_EXPANDS.clear()
        _CONST_EXPANDS[(id(node), shape)] = (node, out)
        return out
    return gn.make("expand", node.dtype, shape, (node,))


def _cast(node: gn.Node, dtype: np.dtype) -> gn.Node:
    if node.dtype == dtype:
        return node
    c = peel_const(node)
    if c is not None:  # fold: a cast (broadcast) constant is a (broadcast) constant
        with np.errstate(all="ignore"):
            value = c.realized.astype(dtype).item()
        return _expand(gn.const_node(value, dtype), node.shape)
    return gn.make("cast", dtype, node.shape, (node,))


def _memo(table: dict, key: tuple, compute, *args):
    """table[key], computed by compute(*args) on a miss. Plan tables are bounded (cleared when
    full); a key that cannot be hashed (an unhashable arg or axis list) is computed each time.
    Errors raised by compute are never stored, so a bad call raises on every attempt."""
    try:
        plan = table.get(key)
    except TypeError:
        return compute(*args)
    if plan is None:
        plan = compute(*args)
        if len(table) > 8192:
            table.clear()
        table[key] = plan
    return plan


def _axes(axis, ndim: int, op: str) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, (int, np.integer)):
        axis = (int(axis),)
    elif not isinstance(axis, (tuple, list)):
        raise TypeError(f"{op}: axis must be an int or a tuple of ints, got {axis!r}")
    out = []
    for a in axis:
        if not isinstance(a, (int, np.integer)):
            raise TypeError(f"{op}: axis must be an int or a tuple of ints, got {a!r}")
        if not -ndim <= a < ndim:
            raise ValueError(f"{op}: axis {a} is out of bounds for a tensor of {ndim} dimensions")
        a = int(a) % ndim
        if a in out:
            raise ValueError(f"{op}: repeated axis {a}")
        out.append(a)
    return tuple(sorted(out))


def astype(x: Tensor, dtype, /, *, copy: bool = True, device=None) -> Tensor:
    """x converted to `dtype` (lazy). Tensors are immutable, so `copy=True` gives a new handle
    and `copy=False` may return x itself."""
    dtype = dt.as_dtype(dtype)
    if not isinstance(x, Tensor):
        raise TypeError(f"astype: expected a Tensor, got {type(x).__name__}")
    node = _cast(x._node, dtype)
    dev = x._device if device is None else device_arg(device, "astype")
    if node is x._node and not copy and dev is x._device:
        return x
    return Tensor(node, dev)


def one_axis(axis, ndim: int, who: str) -> int:
    return _axes(axis, ndim, who)[0]
