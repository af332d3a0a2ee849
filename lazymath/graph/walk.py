"""Walks of the pending graph behind the tensors being realized.

`walk` is the one per-realize pass over the graph on a program-cache hit: the structural
signature (op structure, shapes, dtypes, strides, constants; never the data), the leaves and the
pending nodes a live tensor holds (they become outputs too). `commit` turns a computed node into
a realized leaf. The driver (realize.py, engine.py) and the public functions (api.py) use these.
"""

from __future__ import annotations

import threading

import numpy as np

from lazymath.graph import node as gn
from lazymath.graph import reference


def nodes_of(tensors) -> list[gn.Node]:
    """The pending nodes behind `tensors` (each once); TypeError for anything not a Tensor."""
    nodes, seen = [], set()
    for t in tensors:
        try:
            n = t._node
        except AttributeError:
            n = None
        if type(n) is not gn.Node:
            if n is not None:  # a dead handle (a tensor donated to lm.jit) raises its own error
                n.realized  # noqa: B018
            raise TypeError(f"realize() takes lazymath Tensors, got {type(t).__name__}")
        if n.realized is None and id(n) not in seen:
            seen.add(id(n))
            nodes.append(n)
    return nodes


def live_outputs(roots: list[gn.Node]) -> list[gn.Node]:
    """The requested nodes plus every pending node of the subgraph that a live tensor holds.

    Those must become buffers too, or a later realize of that tensor would recompute them.
    (The reference backend's version; compiled backends get the same set from `walk`.)
    """
    out = list(roots)
    want = {id(n) for n in roots}
    for n in gn.toposort(roots):
        if n.tensors > 0 and n.realized is None and id(n) not in want:
            out.append(n)
            want.add(id(n))
    return out


def commit(node: gn.Node, value: np.ndarray) -> None:
    """Make `node` a realized leaf: it keeps its value and drops its sources so the graph
    behind it can be freed."""
    if value.shape != node.shape or value.dtype != node.dtype:
        value = np.asarray(value, dtype=node.dtype).reshape(node.shape)
    if value.flags.writeable:
        value.flags.writeable = False  # a realized tensor is immutable; np.asarray(t) is a view
    node.realized = value
    gn.forget(node)


def walk(roots: list[gn.Node]) -> tuple:
    """One iterative depth-first walk of the pending graph behind `roots`: (signature parts,
    leaf nodes, nodes in topological order, node id -> position, pending nodes other than the
    roots that a live tensor holds).

    This is the whole per-realize graph work on a program-cache hit, so it is one pass with
    as little Python per node as possible (it replaced a toposort + a signature loop + a
    live-tensor scan, which together cost ~130 bytecodes per node)."""
    index: dict = {}  # node -> position (nodes hash by identity, in C: no id() calls)
    parts: list = []
    leaves: list = []
    order: list = []
    live: list = []
    for r in roots:
        if r in index:
            continue
        stack = [r]
        while stack:
            n = stack[-1]
            if n in index:
                stack.pop()
                continue
            if n.realized is not None:  # a root that is already a buffer
                stack.pop()
                _walk_leaf(n, index, parts, leaves, order)
                continue
            srcs = n.srcs
            pushed = False
            for s in srcs:
                if s not in index:
                    if s.realized is not None or (s.op in _FOLD_OPS and _fold_view(s)):
                        _walk_leaf(s, index, parts, leaves, order)  # indexed on sight
                    else:
                        stack.append(s)
                        pushed = True
            if pushed:
                continue
            stack.pop()
            if len(srcs) == 1:  # an int, not a 1-tuple: unambiguous, and the common case
                parts.append((n.op, n.dtype, n.shape, n.arg, index[srcs[0]]))
            else:
                parts.append((n.op, n.dtype, n.shape, n.arg, tuple([index[s] for s in srcs])))
            if n.tensors > 0 and n not in roots:
                live.append(n)
            index[n] = len(order)
            order.append(n)
    return parts, leaves, order, index, live


VIEW_FOLD_MAX = 64  # elements: views of realized buffers up to this size become leaves
_FOLD_OPS = frozenset(("reshape", "permute", "slice"))
_no_fold = threading.local()


class no_view_folding:
    """``with no_view_folding():`` -- `walk` keeps views of realized buffers as graph nodes.
    lm.jit needs it while it traces: its program's leaves must be the traced inputs
    themselves (bound anew at each replay), never views of this call's arrays."""

    def __enter__(self):
        _no_fold.depth = getattr(_no_fold, "depth", 0) + 1
        return self

    def __exit__(self, *exc) -> None:
        _no_fold.depth -= 1


def _fold_view(n: gn.Node) -> bool:
    """Realize `n`, a small chain of reshape/permute/slice over a realized buffer, as numpy's
    view of that buffer (no kernel, no copy) so that it enters the program as a leaf.

    Why: the offsets of a slice are part of the program key, so `x[i] == y[i]` for each i
    (element-by-element checks, Python loops over rows) was a new program and a new kernel
    per index -- two LLVM compiles, ~18 ms on Zen 5 -- where the same program with the view
    as a leaf is found in the cache for every index (its strides and shape are the key, its
    offset is the data pointer). The kernels read the same elements either way: a view
    composed into a kernel's load and a strided leaf give the same load (`fusion.views`).
    Only views of at most VIEW_FOLD_MAX elements (bigger ones fuse the same and gain little),
    never over a constant (those fold into the kernels) or a 0-d scalar argument, never
    through `expand`, and only when numpy's result is a C-contiguous view of the buffer (an
    element, a row, a run of a row: every leaf a kernel or the interpreter binds is
    contiguous, as before; strided views stay nodes that the kernels compose)."""
    if getattr(_no_fold, "depth", 0):
        return False
    chain = []
    m = n
    while m.realized is None:
        if m.op not in _FOLD_OPS or len(m.srcs) != 1 or _size(m.shape) > VIEW_FOLD_MAX:
            return False
        chain.append(m)
        m = m.srcs[0]
    base = m.realized
    if m.op == "const" or base.ndim == 0 or base.size == 0 or _size(n.shape) == 0:
        return False
    a = base
    for v in reversed(chain):
        a = reference.fold(v, [a])
    if not a.flags.c_contiguous or not np.may_share_memory(a, base):
        return False  # strided (kernels compose those) or a reshape numpy had to copy
    commit(n, a)
    return True


def _size(shape: tuple) -> int:
    k = 1
    for d in shape:
        k *= d
    return k


def _walk_leaf(n: gn.Node, index: dict, parts: list, leaves: list, order: list) -> None:
    index[n] = len(order)
    order.append(n)
    if n.op == "const":
        parts.append(("c", n.dtype, n.arg))
    else:
        a = n.realized
        parts.append(("L", a.dtype, a.shape, a.strides))
        leaves.append(n)


def signature(outputs: list[gn.Node]) -> tuple:
    """(key, leaf nodes in order, all walked nodes) of the pending graph behind `outputs`."""
    parts, leaves, order, index, _live = walk(outputs)
    return (tuple(parts), tuple([index[o] for o in outputs])), leaves, order


def plan_outputs(roots: list[gn.Node]) -> tuple:
    """(outputs, key, leaves, order) of a realize of `roots`: the outputs are the roots plus
    every pending node a live tensor holds (they must become buffers too, or a later realize
    of that tensor would recompute them)."""
    parts, leaves, order, index, live = walk(roots)
    outputs = roots + live if live else roots
    return outputs, (tuple(parts), tuple([index[o] for o in outputs])), leaves, order
