"""Interned graph nodes.

A node is (op, dtype, shape, arg, srcs). Structurally equal nodes are the same object (interning
gives common-subexpression elimination for free and makes identity comparisons valid). Cache
keys derive from the structure by one walk at realize time (`graph.walk.walk`), which numbers the
nodes so that shared subgraphs and repeated inputs are part of the key.

The structural part of a node never changes. Two things are attached beside it and take no part
in its identity: the user's source line that first created it (for error messages and tooltips) and,
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


_internal_code: set[int] = set()  # ids of lazymath code objects


def is_lazymath_code(code) -> bool:
    """Whether a code object belongs to the lazymath package (not the user's code)."""
    if id(code) in _internal_code:
        return True
    if code.co_filename.startswith(_PKG_DIR):
        _internal_code.add(id(code))
        return True
    return False


def _user_frame() -> tuple[str, int] | None:
    """(file, line) of the user's call site, unformatted: nodes store this and format it only
    when someone reads `loc` (formatting on every op cost more than the walk)."""
    f = sys._getframe(2)
    internal = _internal_code
    while f is not None:
        code = f.f_code
        if id(code) in internal:
            f = f.f_back
            continue
        if code.co_filename.startswith(_PKG_DIR):
            # lazymath's own code objects live as long as the process, so their ids are
            # stable keys (a set of ids: hashing a code object itself is slow)
            internal.add(id(code))
            f = f.f_back
            continue
        return (code.co_filename, f.f_lineno)
    return None


class Node:
    """One value in the lazy DAG. Create through `make`, never directly (interning).

    Nodes hash and compare by identity (Python's default, computed in C): interning makes
    structural equality and identity the same thing, and the graph walks put nodes in dicts
    and sets on every realize."""

    __slots__ = ("op", "dtype", "shape", "arg", "srcs", "_loc", "key", "realized", "tensors",
                 "addr", "__weakref__")  # fmt: skip

    op: str
    dtype: np.dtype
    shape: tuple[int, ...]
    arg: object
    srcs: tuple[Node, ...]
    key: tuple | None  # interning key (holds the sources); None once forgotten
    realized: np.ndarray | None

    @property
    def loc(self) -> str:
        """file:line of the user code that created this node."""
        where = self._loc
        if type(where) is tuple:
            return f"{where[0]}:{where[1]}"
        return "<unknown>" if where is None else where

    def __repr__(self) -> str:
        state = "realized" if self.realized is not None else "lazy"
        return f"<{self.op} {self.dtype} {self.shape} {state}>"

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


class _Ref(weakref.ref):
    """Weak reference that remembers its interning key, so one module-level callback can drop
    the entry (cheaper than a closure per node: node creation is on every op's path)."""

    __slots__ = ("key",)


# key -> weak reference to the node; the callback drops the entry when the node dies.
_interned: dict = {}


def _gone(ref: _Ref) -> None:
    key = ref.key
    if key is not None and _interned.get(key) is ref:
        del _interned[key]


_MAX_BYTES = 2**63 - 1  # numpy's limit too: size * itemsize must fit intp


def make(
    op: str,
    dtype: np.dtype,
    shape: tuple[int, ...],
    srcs: Iterable[Node] = (),
    arg: object = None,
    loc: str | tuple[str, int] | None = None,
) -> Node:
    """Return the unique node with this structure, creating it if needed."""
    if type(srcs) is not tuple:
        srcs = tuple(srcs)
    if type(shape) is not tuple:
        shape = tuple(int(s) for s in shape)
    if not isinstance(dtype, np.dtype):
        dtype = np.dtype(dtype)
    # Sources are in the key themselves (nodes hash by identity, in C), one alone unwrapped.
    # The key lives in the table entry and on the node; `forget` drops both, so a realized node
    # no longer holds the graph behind it.
    key = (op, dtype.char, shape, arg, srcs[0] if len(srcs) == 1 else srcs)
    ref = _interned.get(key)
    if ref is not None:
        node = ref()
        if node is not None:
            return node
    size = 1
    for d in shape:
        size *= d
    if size * dtype.itemsize > _MAX_BYTES:
        nbytes = size * dtype.itemsize
        raise ValueError(f"{op}: shape {shape} of {dtype.name} is too big: {size} elements "
                         f"({nbytes} bytes) do not fit the int64 address range")  # fmt: skip
    node = Node()
    node.op, node.dtype, node.shape, node.arg, node.srcs = op, dtype, shape, arg, srcs
    node._loc = loc if loc is not None else _user_frame()
    node.key = key
    node.realized = None
    node.tensors = 0
    node.addr = None  # (realized array, address, layout id): runtime.replay.address_of
    ref = _Ref(node, _gone)
    ref.key = key
    _interned[key] = ref
    return node


def buffer_node(array: np.ndarray, loc: str | tuple[str, int] | None = None) -> Node:
    """A leaf holding concrete data. Every buffer is distinct: `arg` is a fresh id.

    Built directly, not through `make`: a fresh id makes its key unique, so interning could
    never find it again, and skipping the table and its weak reference halves the cost of a
    realized value's node (every replayed lm.jit output pays it)."""
    node = Node()
    node.op, node.dtype, node.shape, node.arg, node.srcs = ("buffer", array.dtype, array.shape,
                                                            next(_buffer_ids), ())  # fmt: skip
    node._loc = loc if loc is not None else _user_frame()
    node.key = None  # not interned (see above): `forget` has nothing to drop
    node.realized = array
    node.tensors = 0
    node.addr = None
    return node


_const_cache: dict = {}


def const_node(value, dtype: np.dtype, loc: str | None = None) -> Node:
    """A 0-d constant; broadcast with an `expand` view. Constants fold into kernels as literals.

    Constants are kept alive in a small cache: scalars recur in every call of a composite op.
    """
    ck = (value, type(value), dtype, str(value)[:1] == "-")
    try:
        hit = _const_cache.get(ck)
    except TypeError:  # unhashable value
        hit = None
    if hit is not None:
        return hit
    dtype = np.dtype(dtype)
    v = dtype.type(value).item()
    if isinstance(v, float) and v != v:  # NaN != NaN would defeat interning
        key = ("nan",)
    else:
        key = (v, type(v).__name__, np.signbit(v) if isinstance(v, float) else False)
    node = make("const", dtype, (), (), key, loc)
    if node.realized is None:
        node.realized = np.array(v, dtype=dtype)
    if len(_const_cache) > 4096:
        _const_cache.clear()
    if not (isinstance(value, float) and value != value):
        _const_cache[ck] = node
    return node


def toposort(roots: Iterable[Node], stop_at_realized: bool = True) -> list[Node]:
    """Nodes reachable from `roots`, every node after its sources. Iterative (no recursion
    limit: a chain of 10,000 ops is fine). Realized nodes are leaves unless told otherwise."""
    order: list[Node] = []
    seen: set[int] = set()
    empty = ()
    for r in roots:
        if id(r) in seen:
            continue
        seen.add(id(r))
        stack = [(r, iter(empty if stop_at_realized and r.realized is not None else r.srcs))]
        while stack:
            node, it = stack[-1]
            for s in it:
                if id(s) not in seen:
                    seen.add(id(s))
                    leaf = stop_at_realized and s.realized is not None
                    stack.append((s, iter(empty if leaf else s.srcs)))
                    break
            else:
                stack.pop()
                order.append(node)
    return order


def forget(node: Node) -> None:
    """Detach a node that has just been realized: drop its sources (freeing the graph behind
    it) and its interning entry (whose key holds the sources' ids, which may be reused)."""
    key = node.key
    if key is not None:
        ref = _interned.get(key)
        if ref is not None and ref() is node:
            del _interned[key]
            ref.key = None
        node.key = None
    node.srcs = ()
