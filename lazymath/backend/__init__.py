"""Layer 4: the NPU instruction set and everything that consumes it.

Owns: the ISA (`isa`, Cube part in `isa_cube`), kernel templates that turn fused kernel IR into
ISA programs (`templates/`), the three consumers of a program -- LLVM lowering (`lower_llvm`,
compiled by the MCJIT engine in `jit`), the numpy interpreter (`interp`) and the cycle cost
model (`cost`) -- and the kernel cache (`kernel_cache`, memory + disk).

Public entry points (loaded lazily so importing the ISA stays cheap):
    compile_kernel(ir, spec, backend="llvm", name=None) -> CompiledKernel
    cache_info() -> dict, clear_cache()
    BufferOverflowError, KernelCost
"""

from __future__ import annotations

_LAZY = {
    "compile_kernel": ("compile", "compile_kernel"),
    "CompiledKernel": ("compile", "CompiledKernel"),
    "build_program": ("compile", "build_program"),
    "cache_info": ("kernel_cache", "cache_info"),
    "clear_cache": ("kernel_cache", "clear_cache"),
    "KernelCost": ("cost", "KernelCost"),
    "estimate_cost": ("cost", "estimate"),
    "BufferOverflowError": ("isa", "BufferOverflowError"),
}

__all__ = list(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        return getattr(importlib.import_module(f"lazymath.backend.{mod}"), attr)
    raise AttributeError(f"module 'lazymath.backend' has no attribute {name!r}")
