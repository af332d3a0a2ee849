"""Realize: turn pending graph nodes into arrays.

This is the one place that walks down the layers: graph (signature) -> fusion (schedule) ->
backend (compile) -> runtime (launch). The reference backend skips fusion entirely and evaluates
node by node with numpy.
"""

from __future__ import annotations

import time

import numpy as np

from . import settings
from .graph import node as gn
from .graph import reference

_BACKEND = settings.BACKEND
_DEBUG = settings.DEBUG


def backend_name() -> str:
    """$LAZYMATH_BACKEND: "llvm" (default), "interp", "reference" or "irref"."""
    return _BACKEND.get()


def _nodes_of(tensors) -> list[gn.Node]:
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
    (The reference backend's version; compiled backends get the same set from `engine._walk`.)
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


# lazymath.distributed installs an object here when the first sharded tensor is made; graphs
# that read sharded data then realize on the Dask cluster (`SHARDED.realize(roots)` is True)
SHARDED = None


def sharded_hook():
    """The installed distributed hook (or None). `lazymath.realize` the attribute is this
    module's `realize` function, so other modules read the hook through this function."""
    return SHARDED


def install_sharded_hook(hook) -> None:
    global SHARDED
    SHARDED = hook


def realize(*tensors) -> None:
    """Compute every given tensor; shared work is computed once."""
    roots = _nodes_of(tensors)
    if not roots:
        return
    if SHARDED is not None and SHARDED.realize(roots):
        return
    backend = _BACKEND.get()
    if backend == "reference":
        t0 = time.perf_counter()
        outputs = live_outputs(roots)
        values = reference.run(outputs)
        for n in outputs:
            commit(n, values[id(n)])
        _debug_line(outputs, "reference", t0)
        return
    _run_compiled()(roots, backend)


_RUN_COMPILED = None


def _run_compiled():
    """engine.run_compiled, imported on first use (the engine pulls in the runtime)."""
    global _RUN_COMPILED
    if _RUN_COMPILED is None:
        from .engine import run_compiled

        _RUN_COMPILED = run_compiled
    return _RUN_COMPILED


def _debug_line(outputs, what: str, t0: float) -> None:
    level = _DEBUG.get()
    if level >= 1:
        dt_us = (time.perf_counter() - t0) * 1e6
        print(f"[lazymath] realize {len(outputs)} output(s) via {what} in {dt_us:.0f} us")
