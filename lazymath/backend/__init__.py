"""Layer 4: the NPU instruction set and everything that consumes it.

Three rooms, imports one way (npu <- native <- host <- the driver here):

- `npu/`: the device-only NPU program -- the ISA, kernel templates, the interpreter, the
  cycle cost model, the race checker; no LLVM.
- `native/`: native code -- host CPU description, MCJIT, ELF loader, kernel cache, compile
  workers; knows no ISA instruction.
- `host/`: the host mapping -- LLVM lowering of the ISA, GEMM microkernels, vector math and
  microkernel libraries, the host roofline.

On top, the compile driver (`compile`: fused kernel IR -> program -> compiled kernel) and the
GEMM autotuner it calls (`autotune`, which needs the compiler and the cache).

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
    "cache_info": ("native.kernel_cache", "cache_info"),
    "clear_cache": ("native.kernel_cache", "clear_cache"),
    "KernelCost": ("npu.cost", "KernelCost"),
    "estimate_cost": ("npu.cost", "estimate"),
    "BufferOverflowError": ("npu.isa", "BufferOverflowError"),
}

__all__ = list(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        return getattr(importlib.import_module(f"lazymath.backend.{mod}"), attr)
    raise AttributeError(f"module 'lazymath.backend' has no attribute {name!r}")
