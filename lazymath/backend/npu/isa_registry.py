"""The instruction registry: which pipe runs each instruction type (`PIPE_OF`, `pipe_of`) and
how a listing spells it (`FORMAT`, `format_instr`). Importing this module registers the
Vector, mover and control instructions; `isa_cube` registers the Cube ones.

Part of the ISA's one namespace, `isa` (issue 36 split it by what it holds): use `isa.X`.
"""

from __future__ import annotations

from lazymath.backend.npu.isa_control import (
    PIPES,
    AtomicAdd,
    CopyIn,
    CopyOut,
    CrossCoreSetFlag,
    CrossCoreWaitFlag,
    GetValue,
    If,
    Let,
    Loop,
    PipeBarrier,
    SetFlag,
    WaitFlag,
)
from lazymath.backend.npu.isa_vector import (
    VArgReduce,
    VBinary,
    VBrcb,
    VCmp,
    VCmpS,
    VConv,
    VDup,
    VFma,
    VGather,
    VHostMath,
    VReduce,
    VScalar,
    VSel,
    VUnary,
)

# ----------------------------------------------------------------------------- registry
# Which pipe executes an instruction and how the listing spells it. Other modules (isa_cube)
# register their instruction types here, then add lowering/interp/cost entries in those modules.

PIPE_OF: dict[type, str] = {}
FORMAT: dict[type, object] = {}


def register_instr(cls: type, pipe: str, fmt=None) -> type:
    """Declare an instruction type: its pipe and an optional `fmt(instr) -> str` for listings."""
    if pipe not in PIPES:
        raise ValueError(f"unknown pipe {pipe!r}; pipes: {', '.join(PIPES)}")
    PIPE_OF[cls] = pipe
    if fmt is not None:
        FORMAT[cls] = fmt
    return cls


def pipe_of(instr) -> str:
    try:
        return PIPE_OF[type(instr)]
    except KeyError:
        raise NotImplementedError(
            f"instruction {type(instr).__name__} is not registered with isa.register_instr"
        ) from None


def _n(e) -> str:
    return str(e)


def _fmt_copy_in(i: CopyIn) -> str:
    scope = i.dst.buf.scope.lower()
    shape = "x".join(str(c) for c in i.counts)
    st = ",".join(str(s) for s in i.strides)
    extra = f" pitch {i.dst_pitch}" if i.dst_pitch is not None else ""
    return f"copy_gm_to_{scope} {i.dst} <- {i.src} [{shape}] stride ({st}){extra}"


def _fmt_copy_out(i: CopyOut) -> str:
    scope = i.src.buf.scope.lower()
    shape = "x".join(str(c) for c in i.counts)
    st = ",".join(str(s) for s in i.strides)
    extra = f" pitch {i.src_pitch}" if i.src_pitch is not None else ""
    return f"copy_{scope}_to_gm {i.dst} <- {i.src} [{shape}] stride ({st}){extra}"


_BUILTIN_FORMATS = {
    VBinary: lambda i: f"{i.op} {i.dst}, {i.a}, {i.b}, n={i.n}",
    VScalar: lambda i: f"{i.op} {i.dst}, {i.src}, {i.scalar!r}, n={i.n}",
    VUnary: lambda i: f"{i.op} {i.dst}, {i.src}, n={i.n}",
    VFma: lambda i: f"vmla {i.dst}, {i.a}, {i.b}, {i.c}, n={i.n}",
    VConv: lambda i: (
        f"vconv.{i.src.buf.dtype}->{i.dst.buf.dtype}.{i.mode} {i.dst}, {i.src}, n={i.n}"
    ),
    VCmp: lambda i: f"vcmp.{i.cmp} {i.dst}, {i.a}, {i.b}, n={i.n}",
    VCmpS: lambda i: f"vcmps.{i.cmp} {i.dst}, {i.src}, {i.scalar!r}, n={i.n}",
    VSel: lambda i: f"vsel {i.dst}, {i.mask}, {i.a}, {i.b}, n={i.n}",
    VDup: lambda i: f"vector_dup {i.dst}, {i.scalar!r}, n={i.n}",
    VGather: lambda i: f"vgather {i.dst}, {i.table}, {i.idx}, n={i.n}",
    VBrcb: lambda i: (
        f"vbrcb {i.dst}, {i.src}, n={i.n}" + (f", rows={i.rows}" if i.rows != 1 else "")
    ),
    VReduce: lambda i: (
        f"{i.op} {i.dst}, {i.src}, n={i.n}" + (f", rows={i.rows}" if i.rows != 1 else "")
    ),
    VArgReduce: lambda i: (
        f"{i.op} {i.dst_val}, {i.dst_idx}, {i.src}, n={i.n}, base={i.base}"
        + (f", rows={i.rows}" if i.rows != 1 else "")
    ),
    VHostMath: lambda i: f"host.{i.fn} {i.dst}, {', '.join(map(str, i.srcs))}, n={i.n}",
    CopyIn: _fmt_copy_in,
    CopyOut: _fmt_copy_out,
    Let: lambda i: f"{i.var} = {i.value}",
    SetFlag: lambda i: f"set_flag {i.src}->{i.dst} {i.event}",
    WaitFlag: lambda i: f"wait_flag {i.src}->{i.dst} {i.event}",
    PipeBarrier: lambda i: f"pipe_barrier {i.pipe}",
    CrossCoreSetFlag: lambda i: f"{i.side.lower()}: cross_core_set_flag {i.pipe} {i.flag}",
    CrossCoreWaitFlag: lambda i: f"{i.side.lower()}: cross_core_wait_flag {i.pipe} {i.flag}",
}
for _cls in (VBinary, VScalar, VUnary, VFma, VConv, VCmp, VCmpS, VSel, VDup, VGather, VBrcb,
             VReduce, VArgReduce, VHostMath):  # fmt: skip
    register_instr(_cls, "Vector", _BUILTIN_FORMATS[_cls])
register_instr(CopyIn, "MTE2", _fmt_copy_in)
register_instr(CopyOut, "MTE3", _fmt_copy_out)
register_instr(Let, "Scalar", _BUILTIN_FORMATS[Let])
register_instr(Loop, "Scalar")
register_instr(If, "Scalar")
register_instr(GetValue, "Scalar", lambda i: f"{i.var} = get_value {i.src} (<= {i.bound})")
register_instr(AtomicAdd, "Scalar", lambda i: f"{i.var} = atomic_add {i.dst}, {i.value}")
register_instr(SetFlag, "Scalar", _BUILTIN_FORMATS[SetFlag])
register_instr(WaitFlag, "Scalar", _BUILTIN_FORMATS[WaitFlag])
register_instr(PipeBarrier, "Scalar", _BUILTIN_FORMATS[PipeBarrier])
register_instr(CrossCoreSetFlag, "Scalar", _BUILTIN_FORMATS[CrossCoreSetFlag])
register_instr(CrossCoreWaitFlag, "Scalar", _BUILTIN_FORMATS[CrossCoreWaitFlag])


def format_instr(instr) -> str:
    fmt = FORMAT.get(type(instr))
    if fmt is not None:
        return fmt(instr)
    fields = getattr(instr, "__dataclass_fields__", {})
    name = getattr(instr, "op", type(instr).__name__.lower())
    args = ", ".join(f"{k}={getattr(instr, k)}" for k in fields if k != "op")
    return f"{name} {args}"
