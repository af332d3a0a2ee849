"""The NPU instruction set: typed instructions over buffers in named scopes.

One program has three consumers, each a table keyed by instruction type in its own module:
``lower_llvm`` (native code), ``interp`` (numpy, exact, for tests and stepping) and ``cost``
(cycles per pipe). Adding an instruction is one dataclass in the ISA plus one entry in each
table.

Addresses and counts are `IntExpr` values (constants, loop variables, block index/count and
arithmetic on them) so a program is a closed description: nothing in it refers to Python state.

This module is the ISA's one namespace (`isa.X` everywhere): it holds `Program` and its checks
and re-exports the parts issue 36 split out by what they hold, which import one another only
downwards (values <- control <- vector <- registry <- mix <- here):

- `isa_values`: integer expressions (`Var`, `BinInt`, `add` ... `eval_int`, `int_range`),
  `Buffer`, `Ref`;
- `isa_control`: movers (`CopyIn`, `CopyOut`), scalar control (`Loop`, `Let`, `If`,
  `AtomicAdd`, `GetValue`), flags and barriers, the pipe names, `walk`, `refs_of`;
- `isa_vector`: the Vector unit's instructions and `Builder`;
- `isa_registry`: each instruction type's pipe and listing format (`register_instr`,
  `pipe_of`, `format_instr`);
- `isa_mix`: the MIX-kernel rules (`core_of`, `mix_cores`, `mix_streams`, the cross-core
  check).

Cube instructions are in ``isa_cube``.
"""

from __future__ import annotations

from dataclasses import dataclass

from lazymath.backend.npu.isa_control import (
    AIV_PIPES,
    CMP_OPS,
    CROSS_CORE_FLAGS,
    FLAG_PIPE_OF,
    FLAG_PIPES,
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
    refs_of,
    walk,
)
from lazymath.backend.npu.isa_mix import (
    _CORE_OF_TYPE,
    AIC_PIPES,
    CORE_PIPES,
    MIX_CORES,
    _check_mix,
    core_of,
    is_mix,
    mix_aivs,
    mix_cores,
    mix_streams,
)
from lazymath.backend.npu.isa_registry import (
    FORMAT,
    PIPE_OF,
    format_instr,
    pipe_of,
    register_instr,
)
from lazymath.backend.npu.isa_values import (
    BLOCK_IDX,
    BLOCK_NUM,
    INT_OPS,
    SCOPES,
    SUBBLOCK_IDX,
    BinInt,
    Buffer,
    IntExpr,
    Ref,
    Var,
    add,
    ceildiv,
    const_difference,
    eval_int,
    floordiv,
    imax,
    imin,
    int_range,
    linear,
    mod,
    mul,
    sub,
)
from lazymath.backend.npu.isa_vector import (
    VECTOR_BINARY,
    VECTOR_CMP,
    VECTOR_REDUCE,
    VECTOR_SCALAR,
    VECTOR_UNARY,
    Builder,
    LoopBuilder,
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

__all__ = [
    "AIC_PIPES",
    "AIV_PIPES",
    "AtomicAdd",
    "BLOCK_IDX",
    "BLOCK_NUM",
    "BinInt",
    "Buffer",
    "BufferOverflowError",
    "Builder",
    "CMP_OPS",
    "CORE_PIPES",
    "CROSS_CORE_FLAGS",
    "CopyIn",
    "CopyOut",
    "CrossCoreSetFlag",
    "CrossCoreWaitFlag",
    "FLAG_PIPES",
    "FLAG_PIPE_OF",
    "FORMAT",
    "GetValue",
    "INT_OPS",
    "If",
    "IntExpr",
    "Let",
    "Loop",
    "LoopBuilder",
    "MIX_CORES",
    "PIPES",
    "PIPE_OF",
    "PROGRAM_CHECKS",
    "PipeBarrier",
    "Program",
    "Ref",
    "SCOPES",
    "SUBBLOCK_IDX",
    "SetFlag",
    "VArgReduce",
    "VBinary",
    "VBrcb",
    "VCmp",
    "VCmpS",
    "VConv",
    "VDup",
    "VECTOR_BINARY",
    "VECTOR_CMP",
    "VECTOR_REDUCE",
    "VECTOR_SCALAR",
    "VECTOR_UNARY",
    "VFma",
    "VGather",
    "VHostMath",
    "VReduce",
    "VScalar",
    "VSel",
    "VUnary",
    "Var",
    "WaitFlag",
    "_CORE_OF_TYPE",
    "add",
    "ceildiv",
    "const_difference",
    "core_of",
    "eval_int",
    "floordiv",
    "format_instr",
    "imax",
    "imin",
    "int_range",
    "is_mix",
    "linear",
    "mix_aivs",
    "mix_cores",
    "mix_streams",
    "mod",
    "mul",
    "pipe_of",
    "refs_of",
    "register_instr",
    "sub",
    "walk",
]


# ----------------------------------------------------------------------------- program


class BufferOverflowError(ValueError):
    """A program declares more on-chip bytes in one scope than the device has per core."""


PROGRAM_CHECKS: list = []  # (program, spec) -> None, raise ValueError; see Program.check


def _check_vector_overlap(program, spec) -> None:
    """A vector instruction reads each source window in repeats while it writes the destination:
    a source that overlaps the destination without being it is not a valid NPU instruction (the
    LLVM lowering and the interpreter would disagree). Rejected when the offsets differ by a
    constant smaller than the element count's upper bound."""
    import numpy as np

    ranges: dict = {BLOCK_IDX: (0, float("inf")), BLOCK_NUM: (1, float("inf"))}
    for instr, _ in walk(program.body):
        if isinstance(instr, Loop):
            lo = int_range(instr.start, ranges)[0]
            ranges[instr.var] = (lo, int_range(instr.stop, ranges)[1] - 1)
            continue
        if isinstance(instr, Let):
            ranges[instr.var] = int_range(instr.value, ranges)
            continue
        dst = getattr(instr, "dst", None)
        n = getattr(instr, "n", None)
        if PIPE_OF.get(type(instr)) != "Vector" or not isinstance(dst, Ref) or n is None:
            continue
        if isinstance(instr, (VReduce, VArgReduce)):
            continue  # dst holds per-row accumulators: a different shape from src
        n_hi = int_range(n, ranges)[1]
        isz = np.dtype(dst.buf.dtype).itemsize
        for r in refs_of(instr):
            if r is dst or r.buf.name != dst.buf.name or r == dst:
                continue
            if np.dtype(r.buf.dtype).itemsize != isz:
                continue
            d = const_difference(r.off, dst.off)
            if d is not None and d != 0 and abs(d) < n_hi:
                raise ValueError(
                    f"kernel {program.name}: {format_instr(instr)!r}: a source overlaps the "
                    f"destination {abs(d)} elements apart (n up to {n_hi:g}); use the same "
                    "window (in place) or a disjoint one"
                )


PROGRAM_CHECKS.append(_check_vector_overlap)
PROGRAM_CHECKS.append(_check_mix)


def _align_up(x: int, a: int) -> int:
    return (x + a - 1) // a * a


@dataclass(frozen=True)
class Program:
    """One kernel for the emulated NPU: GM arguments, declared on-chip buffers and a body.

    `workspace` > 0 asks the launcher for that many zeroed bytes of GM scratch, passed as one
    extra argument after the kernel_args (split reductions keep their partials and their
    completion counter there). `blocks` is the block count the program asks of the device
    (templates: one per AI core the work can use, from the DeviceSpec, never from the host).
    The body reads BLOCK_IDX/BLOCK_NUM and splits its work GetBlockIdx()/GetBlockNum() style,
    so the same body is correct for any block count, and the host mapping
    (`compile.host_blocks`) launches as many host threads as pay. `device_blocks` is the useful
    block count on the NPU, used by the cost model (0 = same as `blocks`). `unit` is the AI-core
    kind that runs it ("vector" or "cube").
    """

    name: str
    args: tuple
    buffers: tuple
    body: tuple
    blocks: int = 1
    device_blocks: int = 0
    unit: str = "vector"
    workspace: int = 0  # bytes of zeroed GM scratch appended as the last argument (0 = none)

    def scope_bytes(self, spec) -> dict[str, int]:
        """Declared bytes per on-chip scope, each buffer rounded up to the scope's alignment."""
        totals: dict[str, int] = {}
        for b in self.buffers:
            a = spec.align.get(b.scope, 32)
            totals[b.scope] = totals.get(b.scope, 0) + _align_up(b.nbytes, a)
        return totals

    def check(self, spec) -> Program:
        """Raise BufferOverflowError / ValueError if the program cannot run on `spec`.

        Checks: per-scope capacity (the error names the scope, the buffers and their sizes, the
        total and the capacity), that every Ref names a declared buffer or argument, that GM
        buffers are only touched by movers, and static event ids against the spec.
        """
        totals = self.scope_bytes(spec)
        for scope, total in totals.items():
            cap = spec.capacity(scope)
            if total > cap:
                bufs = sorted(
                    (b for b in self.buffers if b.scope == scope), key=lambda b: -b.nbytes
                )
                listed = ", ".join(f"{b.name} ({b.nbytes} B)" for b in bufs)
                raise BufferOverflowError(
                    f"{scope} overflow in kernel {self.name}: buffers {listed}; "
                    f"total {total} B > {scope} capacity {cap} B ({spec.name})"
                )
        if scope_has := [s for s in totals if s not in SCOPES or s == "GM"]:
            raise ValueError(f"kernel {self.name}: buffers declared in bad scopes {scope_has}")
        names = {b.name: b for b in (*self.args, *self.buffers)}
        if len(names) != len(self.args) + len(self.buffers):
            raise ValueError(f"kernel {self.name}: duplicate buffer names")
        for extra in PROGRAM_CHECKS:  # registered by other ISA modules (isa_cube: bounds)
            extra(self, spec)
        n_ids = spec.event_ids_per_pipe_pair
        for instr, _ in walk(self.body):
            for r in refs_of(instr):
                if names.get(r.buf.name) != r.buf:
                    raise ValueError(
                        f"kernel {self.name}: {format_instr(instr)!r} uses undeclared buffer "
                        f"{r.buf.name}"
                    )
                if r.buf.scope == "GM" and not isinstance(instr, (CopyIn, CopyOut)):
                    if pipe_of(instr) == "Vector":
                        raise ValueError(
                            f"kernel {self.name}: vector instruction {format_instr(instr)!r} "
                            "reads GM; move the data into UB first"
                        )
            if isinstance(instr, (SetFlag, WaitFlag)) and isinstance(instr.event, int):
                if not 0 <= instr.event < n_ids:
                    raise ValueError(
                        f"kernel {self.name}: event id {instr.event} out of range "
                        f"(0..{n_ids - 1} per pipe pair on {spec.name})"
                    )
            if isinstance(instr, (CrossCoreSetFlag, CrossCoreWaitFlag)):
                if spec.coupled or self.unit != "mix":
                    raise ValueError(
                        f"kernel {self.name}: {format_instr(instr)!r}: cross-core flags join "
                        f"the AIC and AIVs of a MIX kernel on a split device, not {spec.name}"
                    )
                if isinstance(instr.flag, int) and not 0 <= instr.flag < CROSS_CORE_FLAGS:
                    raise ValueError(f"kernel {self.name}: cross-core flag {instr.flag} out of "
                                     f"range (0..{CROSS_CORE_FLAGS - 1})")  # fmt: skip
        return self

    def instructions(self) -> list:
        return [i for i, _ in walk(self.body)]

    def __str__(self) -> str:
        lines = [f"kernel {self.name}(" + ", ".join(
            f"{b.name}: gm {b.dtype}" for b in self.args) + f")  blocks={self.blocks}"]  # fmt: skip
        if is_mix(self):  # one program per core kind, run concurrently (see `mix_streams`)
            lines[0] += "  MIX: an AIC program and an AIV program joined by cross-core flags"
            aivs = mix_aivs(self)
            for core, prog in mix_streams(self).items():
                what = "Cube core" if core == "AIC" else "Vector core"
                if core == "AIV" and aivs > 1:
                    what = f"Vector cores: {aivs} per AIC, each with its subblock_idx"
                lines.append(f"  {core} ({what}):")
                lines += ["  " + ln for ln in prog._lines()]
            return "\n".join(lines)
        return "\n".join(lines + self._lines())

    def _lines(self) -> list[str]:
        lines = []
        for b in self.buffers:
            lines.append(f"  {b.scope.lower()} {b.name}: {b.dtype}[{b.size}]  {b.nbytes} B")
        for instr, depth in walk(self.body):
            pad = "  " * (depth + 1)
            if isinstance(instr, Loop):
                step = f" step {instr.step}" if instr.step != 1 else ""
                lines.append(f"{pad}for {instr.var} in {instr.start}..{instr.stop}{step}:")
            elif isinstance(instr, If):
                lines.append(f"{pad}if {instr.a} {instr.cmp} {instr.b}:")
            else:
                lines.append(pad + format_instr(instr))
        return lines
