"""Lower an `isa.Program` to an llvmlite ``ir.Module`` (the fast consumer of the ISA).

The module holds one function ``void @<name>(i64 block_idx, i64 block_num, ptr args)`` where
``args`` points at one base pointer per GM argument (``kernel_args`` order). On-chip buffers
(UB, L1, L0A/L0B/L0C) become 64-byte aligned allocas in the entry block: on the host the
scopes are just cache-resident scratch arrays, so emulating the NPU and running fast coincide.

The lowering lives in four modules (issue 36 split them out of this one, by what they hold):

- `lower_ctx`: `LowerCtx` (what a lowering function can use), the tables `LOWER`,
  `ELEMENTWISE_INSTRS`, `PREDICT_CALLS` with their decorators `register` / `elementwise`, and
  the fusion of elementwise runs into one vectorized loop;
- `llvm_ops`: the scalar semantics of every op (`binary_op`, `unary_op`, `convert`, ...);
- `lower_vector`: the Vector instructions' lowerings (elementwise, broadcast, reductions);
- `lower_control`: movers and control flow.

This module keeps `lower_program` and imports all four, so importing it registers every
Vector/control lowering; the Cube ones register from `lower_cube`. The names other modules
used to take from here stay importable (`lower_llvm.LowerCtx`, `lower_llvm.register`, ...).
"""

from __future__ import annotations

from llvmlite import ir

from lazymath.backend.host import lower_control, lower_vector
from lazymath.backend.host.llvm_ops import (
    F16,
    F32,
    F64,
    I1,
    I8,
    I32,
    I64,
    LIBM_BINARY,
    LIBM_UNARY,
    PTR,
    binary_op,
    compare,
    convert,
    host_math,
    kind,
    narrow,
    scalar_op,
    unary_op,
    widen,
)
from lazymath.backend.host.lower_ctx import (
    ELEMENTWISE_INSTRS,
    LOWER,
    PREDICT_CALLS,
    Elem,
    LowerCtx,
    _names_in,
    elementwise,
    predicted_calls,
    register,
)
from lazymath.backend.npu import isa

__all__ = [
    "ELEMENTWISE_INSTRS",
    "F16",
    "F32",
    "F64",
    "I1",
    "I8",
    "I32",
    "I64",
    "LIBM_BINARY",
    "LIBM_UNARY",
    "LOWER",
    "PREDICT_CALLS",
    "PTR",
    "Elem",
    "LowerCtx",
    "_names_in",
    "binary_op",
    "compare",
    "convert",
    "elementwise",
    "host_math",
    "kind",
    "lower_control",
    "lower_program",
    "lower_vector",
    "narrow",
    "predicted_calls",
    "register",
    "scalar_op",
    "unary_op",
    "widen",
]


def lower_program(
    program: isa.Program, spec=None, module: ir.Module | None = None, symbol: str | None = None
) -> ir.Module:
    """Program -> llvmlite module with one function named `symbol` (default: program.name)."""
    ctx = LowerCtx(program, spec, module, symbol)
    b = ctx.builder
    # GM argument base pointers
    for buf in program.args:
        slot = b.gep(ctx.func.args[2], [ir.Constant(I64, buf.arg)], source_etype=PTR)
        ctx.base[buf.name] = b.load(slot, typ=PTR, name=f"{buf.name}.base")
    # on-chip buffers: aligned allocas in the entry block
    for buf in program.buffers:
        t = ir.ArrayType(ctx.storage_type(buf.dtype), max(buf.size, 1))
        a = b.alloca(t, name=buf.name)
        a.type = PTR  # opaque pointer: every access is a typed getelementptr
        a.align = 64
        ctx.base[buf.name] = a
    ctx.lower_body(program.body)
    ctx.builder.ret_void()
    return ctx.module
