"""Walks of the pending graph behind the tensors being realized.

`walk` is the one per-realize pass over the graph on a program-cache hit: the structural
signature (op structure, shapes, dtypes, strides, constants; never the data), the leaves and the
pending nodes a live tensor holds (they become outputs too). `commit` turns a computed node into
a realized leaf. The driver (realize.py, engine.py) and the public functions (api.py) use these.
"""

from __future__ import annotations

import numpy as np

from . import node as gn


def nodes_of(tensors) -> list[gn.Node]:
    """The pending nodes behind `tensors` (each once); TypeError for anything not a Tensor."""
    nodes, seen = [], set()
    for t in tensors:
        try:
            n = t._node
        except AttributeError:
            n = None
        if type(n) is not gn.Node:
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
                    if s.realized is not None:  # leaves are indexed on sight, never pushed
                        _walk_leaf(s, index, parts, leaves, order)
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
