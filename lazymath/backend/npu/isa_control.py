"""The ISA's data movers (`CopyIn`, `CopyOut`), scalar control (`Loop`, `Let`, `If`,
`AtomicAdd`, `GetValue`), pipe and cross-core flags, barriers, the pipe names, and the walks
over a body (`walk`, `refs_of`).

Part of the ISA's one namespace, `isa` (issue 36 split it by what it holds): use `isa.X`.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

from lazymath.backend.npu.isa_values import IntExpr, Ref, Var

# ----------------------------------------------------------------------------- movers, control
# Data movers address GM through an element offset plus up to two (count, stride) pairs, the same
# addressing an `ArgView` uses, so a tile of a strided, broadcast (stride 0) or flipped (negative
# stride) view is read in place. The on-chip side is dense row-major (pitch = row length unless
# given), which is what the vector instructions then see.


@dataclass(frozen=True, slots=True)
class CopyIn:
    """MTE2: dst[r*pitch + c] = GM src[src.off + r*strides[0] + c*strides[1]].

    `counts`/`strides` have one entry (a 1-D run) or two (rows, cols); strides are in elements of
    the GM buffer and may be 0 or negative. dst is in UB or L1; `dst_pitch` defaults to the
    column count so the tile is dense.
    """

    dst: Ref
    src: Ref
    counts: tuple
    strides: tuple
    dst_pitch: IntExpr | None = None


@dataclass(frozen=True, slots=True)
class CopyOut:
    """MTE3: GM dst[dst.off + r*strides[0] + c*strides[1]] = src[r*pitch + c] (UB -> GM)."""

    dst: Ref
    src: Ref
    counts: tuple
    strides: tuple
    src_pitch: IntExpr | None = None


@dataclass(frozen=True, slots=True)
class Loop:
    """for var in range(start, stop, step): body. Trip counts are static or block-dependent."""

    var: Var
    start: IntExpr
    stop: IntExpr
    step: IntExpr
    body: tuple


@dataclass(frozen=True, slots=True)
class Let:
    """var = value (scalar unit). Visible to the rest of the enclosing body."""

    var: Var
    value: IntExpr


@dataclass(frozen=True, slots=True)
class If:
    """if a <cmp> b: body (scalar unit); cmp in == != < <= > >=."""

    a: IntExpr
    cmp: str
    b: IntExpr
    body: tuple


@dataclass(frozen=True, slots=True)
class AtomicAdd:
    """var = fetch-and-add of the int64 at GM `dst` by `value` (acquire-release).

    The cross-block handshake of a split reduction: every block publishes its partial result,
    then increments a GM counter; the block that sees ``old == block_num - 1`` is the last one
    and combines the partials (AscendC does the same with atomic GM ops / SyncAll). Works
    whether blocks run in parallel or one after another.
    """

    dst: Ref
    value: IntExpr
    var: Var


@dataclass(frozen=True, slots=True)
class GetValue:
    """var = the int64 at GM `src` (AscendC `GlobalTensor::GetValue`, how a dynamic-shape
    kernel reads its tiling data: the extent of a dimension known only at launch).

    Why: one program serves every size of a run-time dimension; its loop bounds and tail
    counts are expressions of `var`. `bound` is the largest value the program is built for
    (on-chip buffers and the host's scratch are sized from it): the cost model uses it when
    no size is given (`cost.estimate(..., values={var.name: n})`)."""

    var: Var
    src: Ref
    bound: int


CMP_OPS = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le,
           ">": operator.gt, ">=": operator.ge}  # fmt: skip


@dataclass(frozen=True, slots=True)
class SetFlag:
    """Pipe `src` signals pipe `dst` on `event` once everything `src` issued before it is done."""

    src: str
    dst: str
    event: IntExpr = 0


@dataclass(frozen=True, slots=True)
class WaitFlag:
    """Pipe `dst` stalls until the matching set_flag(src, dst, event) has fired (consumes it)."""

    src: str
    dst: str
    event: IntExpr = 0


@dataclass(frozen=True, slots=True)
class CrossCoreSetFlag:
    """AscendC CrossCoreSetFlag<2, pipe>(flag), in a MIX kernel of the split 910B (one Cube
    core, AIC, and its two Vector cores, AIV, run one kernel and exchange data only through
    GM): `pipe` of the issuing core signals the other core kind of the group on `flag` once
    everything it issued before is done. `side` names the issuing core ("AIC" or "AIV")."""

    pipe: str
    flag: IntExpr
    side: str = "AIC"


@dataclass(frozen=True, slots=True)
class CrossCoreWaitFlag:
    """AscendC CrossCoreWaitFlag<2, pipe>(flag): `pipe` of core `side` stalls until the other
    core kind of the group has set `flag` (consumes it)."""

    pipe: str
    flag: IntExpr
    side: str = "AIV"


CROSS_CORE_FLAGS = 16  # flag ids 0..15 between the AIC and the AIVs of a group


@dataclass(frozen=True, slots=True)
class PipeBarrier:
    """pipe_barrier(PIPE_ALL): every pipe waits until all issued work is done. In a MIX
    kernel the AIVs' barriers are `pipe="AIV"`: a core's barrier covers only its own pipes
    (`AIV_PIPES`), never the Cube core's FixPipe/Cube/MTE1."""

    pipe: str = "ALL"


AIV_PIPES = ("Scalar", "MTE2", "Vector", "MTE3")


PIPES = ("Scalar", "MTE2", "MTE1", "Vector", "Cube", "MTE3", "FixPipe")
FLAG_PIPES = ("MTE2", "MTE1", "V", "M", "MTE3", "FIX", "S")
# Short flag names as AscendC spells HardEvent (MTE2_V, V_MTE3, ...) -> the pipe they sync.
FLAG_PIPE_OF = {"MTE2": "MTE2", "MTE1": "MTE1", "V": "Vector", "M": "Cube", "MTE3": "MTE3",
                "FIX": "FixPipe", "S": "Scalar"}  # fmt: skip


def walk(body) -> list[tuple[object, int]]:
    """Every instruction with its loop depth, in program order (iterative, loops included)."""
    out, stack = [], [(iter(body), 0)]
    while stack:
        it, depth = stack[-1]
        instr = next(it, None)
        if instr is None:
            stack.pop()
            continue
        out.append((instr, depth))
        if isinstance(instr, (Loop, If)):
            stack.append((iter(instr.body), depth + 1))
    return out


def refs_of(instr) -> list[Ref]:
    """Every Ref operand of an instruction (for declaration checks and tools)."""
    out = []
    for k in getattr(instr, "__dataclass_fields__", {}):
        v = getattr(instr, k)
        if isinstance(v, Ref):
            out.append(v)
        elif isinstance(v, tuple):
            out.extend(x for x in v if isinstance(x, Ref))
    return out
