"""The public functions that look at or prepare compilation without running anything:
`schedule`, `explain`, `precompile`, `cache_info`, `clear_cache` (`lm.<name>`)."""

from __future__ import annotations

from . import engine
from .graph.walk import nodes_of, plan_outputs
from .realize import schedule_of
from .tensor import Tensor, tensor

__all__ = ["schedule", "explain", "precompile", "cache_info", "clear_cache"]


def schedule(*tensors, spec=None):
    """Compile without executing: the fused kernels, their units, costs, streams and plan."""
    return schedule_of(nodes_of(tensors), spec)


def explain(*tensors, spec=None) -> str:
    return str(schedule(*tensors, spec=spec))


def cache_info() -> dict:
    from .backend.kernel_cache import cache_info as kernel_cache_info

    info = dict(kernel_cache_info())
    info["programs"] = len(engine._programs)
    info.update(engine.STATS)
    return info


def clear_cache() -> None:
    from .backend.kernel_cache import clear_cache as clear_kernels

    engine._programs.clear()
    clear_kernels()


def precompile(fn, *example_inputs, autotune: bool = False) -> int:
    """Trace `fn` on inputs of the examples' shapes/dtypes and compile every kernel it needs
    into the kernel cache (memory and disk), without executing. Returns the kernel count.

    `autotune=True` times the host GEMM candidates of every matmul kernel not measured before
    (as LAZYMATH_AUTOTUNE=1 does) and stores the winners for later processes."""
    if autotune:
        from .backend import autotune as tuning

        with tuning.forced():
            return precompile(fn, *example_inputs)
    args = [a if isinstance(a, Tensor) else tensor(a) for a in example_inputs]
    out = fn(*args)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    roots = nodes_of(outs)
    if not roots:
        return 0
    spec = engine._device_spec()
    backend = engine.backend_name()
    outputs, key, leaves, order = plan_outputs(roots)
    prog = engine.compile_program(outputs, leaves, order, spec, backend, tiered=False)
    engine._programs[(key, spec.key(), backend)] = prog
    return len(prog.kernels)
