"""Strided views: how a chain of view nodes over a buffer becomes one (shape, strides, offset).

Views never copy. A kernel reads a leaf buffer through the composition of every view between
the leaf and the kernel's iteration space; permute, expand (stride 0) and slice (offset, scaled
or negative stride) always compose, reshape composes when numpy could reshape without a copy.
When it cannot, `compose` returns None and the fusion layer materializes the reshape's source.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lazymath.graph.node import Node
from lazymath.graph.ops import VIEWS

VIEW_OPS = VIEWS  # reshape, permute, expand, slice: the op records of kind view


@dataclass(frozen=True, slots=True)
class SView:
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # elements
    offset: int = 0


def contiguous(shape: tuple[int, ...]) -> SView:
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(s, 1)
    return SView(tuple(shape), tuple(reversed(strides)), 0)


def of_array(a: np.ndarray) -> SView | None:
    """Element strides of a numpy array relative to its data pointer (None if not whole)."""
    size = a.dtype.itemsize
    if any(s % size for s in a.strides):
        return None
    return SView(a.shape, tuple(s // size for s in a.strides), 0)


def _reshape(sv: SView, new_shape: tuple[int, ...]) -> SView | None:
    """numpy's no-copy reshape rule on strides; None when a copy would be needed."""
    if 0 in sv.shape or 0 in new_shape:
        return SView(new_shape, (0,) * len(new_shape), sv.offset)
    old = [(s, st) for s, st in zip(sv.shape, sv.strides) if s != 1]
    new_strides = [0] * len(new_shape)
    oi = ni = 0
    while ni < len(new_shape) and oi < len(old):
        np_, op_ = new_shape[ni], old[oi][0]
        nj, oj = ni + 1, oi + 1
        while np_ != op_:
            if np_ < op_:
                np_ *= new_shape[nj]
                nj += 1
            else:
                op_ *= old[oj][0]
                oj += 1
        for ok in range(oi, oj - 1):
            if old[ok][1] != old[ok + 1][0] * old[ok + 1][1]:
                return None
        new_strides[nj - 1] = old[oj - 1][1]
        for nk in range(nj - 1, ni, -1):
            new_strides[nk - 1] = new_strides[nk] * new_shape[nk]
        ni, oi = nj, oj
    return SView(tuple(new_shape), tuple(new_strides), sv.offset)


def apply(view: Node, sv: SView) -> SView | None:
    """The view node `view` applied to a source seen as `sv`."""
    op, arg, shape = view.op, view.arg, view.shape
    if op == "permute":
        return SView(shape, tuple(sv.strides[a] for a in arg), sv.offset)
    if op == "expand":
        nd = len(shape)
        pad = nd - len(sv.shape)
        strides = []
        for d in range(nd):
            if d < pad:
                strides.append(0)
            else:
                src = sv.shape[d - pad]
                strides.append(0 if (src == 1 and shape[d] != 1) else sv.strides[d - pad])
        return SView(shape, tuple(strides), sv.offset)
    if op == "slice":
        off = sv.offset
        strides = []
        for (start, _count, step), st in zip(arg, sv.strides):
            off += start * st
            strides.append(st * step)
        return SView(shape, tuple(strides), off)
    if op == "reshape":
        return _reshape(sv, shape)
    if op == "window":  # over a 1-D source
        strides, off = arg
        (st,) = sv.strides
        return SView(shape, tuple(s * st for s in strides), sv.offset + off * st)
    raise ValueError(f"not a view op: {op}")


def compose(base: SView, chain: tuple[Node, ...]) -> tuple[SView | None, Node | None]:
    """Apply view nodes `chain` (outermost first, as met walking down from the kernel root)
    to `base`. Returns (view, None) or (None, the view node that could not compose)."""
    sv = base
    for v in reversed(chain):
        nxt = apply(v, sv)
        if nxt is None:
            return None, v
        sv = nxt
    return sv, None


def same_layout(a: SView, b: SView) -> bool:
    """True when two views address the same elements in the same order (size-1 dims ignored)."""
    if a.offset != b.offset:
        return False
    da = [(s, st) for s, st in zip(a.shape, a.strides) if s != 1]
    db = [(s, st) for s, st in zip(b.shape, b.strides) if s != 1]
    return da == db
