"""Realize: turn pending graph nodes into arrays.

This is the one place that walks down the layers: graph (signature) -> fusion (schedule) ->
backend (compile) -> runtime (launch). The reference backend skips fusion entirely and evaluates
node by node with numpy.
"""

from __future__ import annotations

import contextlib
import sys
import time

import numpy as np

from lazymath import settings
from lazymath._lazy import deferred
from lazymath.graph import node as gn
from lazymath.graph import reference
from lazymath.graph.ops import VIEWS
from lazymath.graph.walk import commit, live_outputs, nodes_of
from lazymath.units import fmt_bytes

# Loaded on the first compiled realize, not by `import lazymath`: the engine pulls in fusion, the
# backend (llvmlite) and the runtime, 200-300 ms that a script which never realizes should not pay.
engine = deferred("lazymath.engine")
runtime = deferred("lazymath.runtime")
# The compile server (backend/native/isolate.py) boots in ~60-80 ms on another core; started at
# the first compiled realize, before the engine, fusion and the backend load (~40 ms), its boot
# overlaps their loading as well as the fusion and lowering of the first graph.
workers = deferred("lazymath.backend.native.workers")
_STARTED = [False]  # the first compiled realize of this process has started the server

__all__ = ["realize", "schedule_of", "commit", "sharded_hook", "install_sharded_hook"]

_BACKEND = settings.BACKEND
_DEBUG = settings.DEBUG

# lazymath.distributed installs an object here when the first sharded tensor is made; graphs
# that read sharded data then realize on the Dask cluster (`SHARDED.realize(roots)` is True)
SHARDED = None


# lm.jit, while it traces a function: called with the roots of every realize inside it, so a
# trace that reads values of its inputs (Python control flow on a value, .numpy()) is known
_WATCH = None


@contextlib.contextmanager
def watch_realizes(callback):
    """Call `callback(roots)` for every realize in the block (lm.jit's trace)."""
    global _WATCH
    prev, _WATCH = _WATCH, callback
    try:
        yield
    finally:
        _WATCH = prev


def sharded_hook():
    """The installed distributed hook (or None). `lazymath.realize` the attribute is this
    module's `realize` function, so other modules read the hook through this function."""
    return SHARDED


def install_sharded_hook(hook) -> None:
    global SHARDED
    SHARDED = hook


def realize(*tensors) -> None:
    """Compute every given tensor; shared work is computed once."""
    roots = nodes_of(tensors)
    if _WATCH is not None:  # realized ones too: .numpy() of a traced input reads its values
        _WATCH([t._node for t in tensors])
    if not roots:
        return
    if SHARDED is not None and SHARDED.realize(roots):
        return
    backend = _BACKEND.get()
    if backend == "reference":
        t0 = time.perf_counter()
        outputs = live_outputs(roots)
        _check_reference_memory(outputs)
        values = reference.run(outputs)
        for n in outputs:
            commit(n, values[id(n)])
        _debug_line(outputs, "reference", t0)
        return
    if not _STARTED[0] and backend == "llvm":
        _STARTED[0] = True
        workers.prestart()
    engine.run_compiled(roots, backend)


def realize_into(t, out: np.ndarray) -> None:
    """`t.realize(out=out)`: compute `t` into the caller's array. The program writes straight
    into `out` when it is C-contiguous and `t` is a plain output of the program (no extra
    buffer, no copy); otherwise (a view, a realized tensor, another backend) the value is
    copied in. Afterwards `t` views `out` in the direct case, as torch's `out=` does: writing
    into `out` later changes `t`. Clear errors, before any work, for a wrong type, shape,
    dtype (no casting), a read-only array, and an `out` overlapping a buffer the computation
    reads (the kernels would overwrite their own inputs)."""
    if not isinstance(out, np.ndarray):
        raise TypeError(f"realize(out=...): out must be a numpy array, got {type(out).__name__}")
    node = t._node
    if out.shape != node.shape:
        raise ValueError(f"realize(out=...): out has shape {out.shape}, the tensor {node.shape}")
    if out.dtype != node.dtype:
        raise TypeError(f"realize(out=...): out has dtype {out.dtype}, the tensor {node.dtype} "
                        "(no casting: pass an array of the tensor's dtype)")  # fmt: skip
    if not out.flags.writeable:
        raise ValueError("realize(out=...): out is read-only")
    if node.realized is None:
        if _WATCH is not None:
            _WATCH([node])
        for n in gn.toposort([node]):
            r = n.realized
            if r is not None and r.size and np.may_share_memory(r, out):
                raise ValueError(f"realize(out=...): out overlaps an input of the computation "
                                 f"({n.op} {n.shape} created at {n.loc})")  # fmt: skip
        sharded = SHARDED is not None and SHARDED.reads_shards([node])
        if (not sharded and out.flags.c_contiguous and out.size
                and _BACKEND.get() != "reference"):  # fmt: skip
            engine.run_compiled([node], _BACKEND.get(), out=out)
        else:
            realize(t)
    elif node.realized is out or (node.realized.base is out and node.realized.shape == out.shape
                                  and node.realized.strides == out.strides):  # fmt: skip
        return  # already there
    elif np.may_share_memory(node.realized, out):
        raise ValueError("realize(out=...): out overlaps the tensor's own (different) buffer")
    r = node.realized
    if r.base is not out:
        np.copyto(out, r)


def _check_reference_memory(outputs: list) -> None:
    """The reference backend evaluates every node with numpy and keeps each intermediate (no
    fusion, no buffer reuse), so its peak is the sum of the non-view results: refuse before
    evaluating anything when that exceeds the device's memory or this host's (like the
    compiled path's plan check), naming the largest tensor and the user's line."""
    pending = [n for n in gn.toposort(outputs)
               if n.realized is None and n.op not in VIEWS]  # fmt: skip
    need = sum(n.nbytes for n in pending)
    if not pending:
        return
    spec = runtime.current_device().spec
    for cap, what in ((spec.hbm_bytes, f"the {fmt_bytes(spec.hbm_bytes)} of device memory of the "
                                       f"{spec.name} (DeviceSpec.hbm_bytes)"),
                      (engine._host_memory_bytes(), "this host's physical memory")):  # fmt: skip
        if cap and need > cap:
            big = max(pending, key=lambda n: n.nbytes)
            loc = f" created at {big.loc}" if big.loc else ""
            raise MemoryError(
                f"lazymath (reference backend): this realize needs {fmt_bytes(need)} for its "
                f"results and intermediates, more than {what}; the largest tensor is "
                f"{big.op}{list(big.shape)}:{big.dtype.name} ({fmt_bytes(big.nbytes)}){loc}. "
                "Nothing was evaluated. Realize smaller pieces or use the llvm backend (it "
                "fuses and reuses buffers)."
            )


def schedule_of(roots: list, spec=None):
    """What a realize of the pending nodes `roots` would run, without running it: the
    distributed plan when they read sharded data, else the fused schedule (`lm.schedule`)."""
    if roots and SHARDED is not None:
        plan = SHARDED.schedule(roots)
        if plan is not None:
            return plan
    return engine.schedule_of(roots, spec)


def _debug_line(outputs, what: str, t0: float) -> None:
    level = _DEBUG.get()
    if level >= 1:
        dt_us = (time.perf_counter() - t0) * 1e6
        print(
            f"[lazymath] realize {len(outputs)} output(s) via {what} in {dt_us:.0f} us",
            file=sys.stderr,
            flush=True,
        )
