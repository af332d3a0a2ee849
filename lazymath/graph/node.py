"""Interned graph nodes.

A node is (op, dtype, shape, arg, srcs). Structurally equal nodes are the same object (interning
gives common-subexpression elimination for free and makes identity comparisons valid), and each
carries a structural hash from which every cache key derives.

The structural part of a node never changes. Two things are attached beside it and take no part
in the hash: the user's source line that first created it (for error messages and tooltips) and,
after a realize, the computed array (`realized`). Once realized, a node behaves like a buffer for
every later graph that uses it, so live tensors pointing at it never recompute it.
"""

from __future__ import annotations

import itertools
import os
import sys
import weakref
from collections.abc import Iterable

import numpy as np

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_buffer_ids = itertools.count()


def user_location() -> str:
    """file:line of the innermost frame outside the lazymath package (the user's call site)."""
    f = sys._getframe(1)
    while f is not None:
        fn = f.f_code.co_filename
        if not fn.startswith(_PKG_DIR):
            return f"{fn}:{f.f_lineno}"
        f = f.f_back
    return "<unknown>"


class Node:
    """One value in the lazy DAG. Create through `make`, never directly (interning)."""

    __slots__ = ("op", "dtype", "shape", "arg", "srcs", "hash", "loc", "realized", "tensors",
                 "__weakref__")  # fmt: skip

    op: str
    dtype: np.dtype
    shape: tuple[int, ...]
    arg: object
    srcs: tuple[Node, ...]
    hash: int
    loc: str
    realized: np.ndarray | None

    def __repr__(self) -> str:
        state = "realized" if self.realized is not None else "lazy"
        return f"<{self.op} {self.dtype} {self.shape} {state}>"

    def __hash__(self) -> int:
        return self.hash

    @property
    def size(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def is_leaf(self) -> bool:
        """Leaves have nothing left to compute: buffers, constants and realized values."""
        return self.realized is not None or self.op in ("buffer", "const")


_interned: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def make(
    op: str,
    dtype: np.dtype,
    shape: tuple[int, ...],
    srcs: Iterable[Node] = (),
    arg: object = None,
    loc: str | None = None,
) -> Node:
    """Return the unique node with this structure, creating it if needed."""
    srcs = tuple(srcs)
    dtype = np.dtype(dtype)
    shape = tuple(int(s) for s in shape)
    key = (op, dtype.str, shape, arg, tuple(id(s) for s in srcs))
    node = _interned.get(key)
    if node is not None:
        return node
    node = Node()
    node.op, node.dtype, node.shape, node.arg, node.srcs = op, dtype, shape, arg, srcs
    node.hash = hash((op, dtype.str, shape, arg, tuple(s.hash for s in srcs)))
    node.loc = loc if loc is not None else user_location()
    node.realized = None
    node.tensors = None
    _interned[key] = node
    return node


def buffer_node(array: np.ndarray, loc: str | None = None) -> Node:
    """A leaf holding concrete data. Every buffer is distinct: `arg` is a fresh id."""
    node = make("buffer", array.dtype, array.shape, (), next(_buffer_ids), loc)
    node.realized = array
    return node


def const_node(value, dtype: np.dtype, loc: str | None = None) -> Node:
    """A 0-d constant; broadcast with an `expand` view. Constants fold into kernels as literals."""
    dtype = np.dtype(dtype)
    v = dtype.type(value).item()
    if isinstance(v, float) and v != v:  # NaN != NaN would defeat interning
        key = ("nan",)
    else:
        key = (v, type(v).__name__, np.signbit(v) if isinstance(v, float) else False)
    node = make("const", dtype, (), (), key, loc)
    if node.realized is None:
        node.realized = np.array(v, dtype=dtype)
    return node


def const_value(node: Node):
    """Python scalar of a const node."""
    return node.realized.item()


def toposort(roots: Iterable[Node], stop_at_realized: bool = True) -> list[Node]:
    """Nodes reachable from `roots`, every node after its sources. Iterative (no recursion
    limit: a chain of 10,000 ops is fine). Realized nodes are leaves unless told otherwise."""
    order: list[Node] = []
    seen: set[int] = set()
    stack: list[tuple[Node, bool]] = [(r, False) for r in reversed(list(roots))]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        if stop_at_realized and node.realized is not None:
            continue
        for s in reversed(node.srcs):
            if id(s) not in seen:
                stack.append((s, False))
    return order


def forget(node: Node) -> None:
    """Detach a node that has just been realized: drop its sources (freeing the graph behind
    it) and its interning entry (whose key holds the sources' ids, which may be reused)."""
    key = (node.op, node.dtype.str, node.shape, node.arg, tuple(id(s) for s in node.srcs))
    if _interned.get(key) is node:
        del _interned[key]
    node.srcs = ()
