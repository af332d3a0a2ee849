"""The NPU instruction set: typed instructions over buffers in named scopes.

One program has three consumers, each a table keyed by instruction type in its own module:
``lower_llvm`` (native code), ``interp`` (numpy, exact, for tests and stepping) and ``cost``
(cycles per pipe). Adding an instruction is one dataclass here plus one entry in each table.

Addresses and counts are `IntExpr` values (constants, loop variables, block index/count and
arithmetic on them) so a program is a closed description: nothing in it refers to Python state.

This module defines the data types and the vector unit's instructions. Movers, scalar control
and pipe flags live in the second half; Cube instructions are in ``isa_cube``.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

# ----------------------------------------------------------------------------- scalar values

SCOPES = ("GM", "L1", "L0A", "L0B", "L0C", "UB")


@dataclass(frozen=True, slots=True)
class Var:
    """A scalar (int64) variable: loop counters, block index/count, Let-bound values."""

    name: str

    def __str__(self) -> str:
        return self.name


class _IntArith:
    """Python operators on integer expressions (`i * tile + 1`, `n // 2`, `(t + 1) % 2`): kernel
    authors (`lazymath.kernel`) write addresses as plain arithmetic. Constants fold, like the
    module functions `add`, `mul`, ... that these call."""

    __slots__ = ()

    def __add__(self, o):
        return add(self, o) if _is_int(o) else NotImplemented

    def __radd__(self, o):
        return add(o, self) if _is_int(o) else NotImplemented

    def __sub__(self, o):
        return sub(self, o) if _is_int(o) else NotImplemented

    def __rsub__(self, o):
        return sub(o, self) if _is_int(o) else NotImplemented

    def __mul__(self, o):
        return mul(self, o) if _is_int(o) else NotImplemented

    def __rmul__(self, o):
        return mul(o, self) if _is_int(o) else NotImplemented

    def __floordiv__(self, o):
        return floordiv(self, o) if _is_int(o) else NotImplemented

    def __rfloordiv__(self, o):
        return floordiv(o, self) if _is_int(o) else NotImplemented

    def __mod__(self, o):
        return mod(self, o) if _is_int(o) else NotImplemented

    def __rmod__(self, o):
        return mod(o, self) if _is_int(o) else NotImplemented


def _is_int(o) -> bool:
    return isinstance(o, (int, Var, BinInt)) and not isinstance(o, bool)


for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__",
              "__floordiv__", "__rfloordiv__", "__mod__", "__rmod__"):  # fmt: skip
    setattr(Var, _name, getattr(_IntArith, _name))


@dataclass(frozen=True, slots=True)
class BinInt:
    """Integer arithmetic on IntExpr; op in + - * // % min max."""

    op: str
    a: IntExpr
    b: IntExpr

    def __str__(self) -> str:
        if self.op in ("min", "max"):
            return f"{self.op}({self.a}, {self.b})"
        return f"({self.a} {self.op} {self.b})"


IntExpr = int | Var | BinInt

for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__",
              "__floordiv__", "__rfloordiv__", "__mod__", "__rmod__"):  # fmt: skip
    setattr(BinInt, _name, getattr(_IntArith, _name))

BLOCK_IDX = Var("block_idx")  # GetBlockIdx()
BLOCK_NUM = Var("block_num")  # GetBlockNum()
# GetSubBlockIdx(): which Vector core (AIV) of its group runs the code, in a MIX kernel. A loop
# over it (`Loop(SUBBLOCK_IDX, 0, n, 1, body)`, n <= the spec's AIVs per AIC) is a sub-block
# section: on the host an ordinary loop (the AIVs' parts one after the other), on the device
# iteration v is what AIV v of the group runs (see "MIX kernels" below).
SUBBLOCK_IDX = Var("subblock_idx")


def add(a: IntExpr, b: IntExpr) -> IntExpr:
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    if b == 0:
        return a
    if a == 0:
        return b
    return BinInt("+", a, b)


def mul(a: IntExpr, b: IntExpr) -> IntExpr:
    if isinstance(a, int) and isinstance(b, int):
        return a * b
    if a == 1:
        return b
    if b == 1:
        return a
    if a == 0 or b == 0:
        return 0
    return BinInt("*", a, b)


def sub(a: IntExpr, b: IntExpr) -> IntExpr:
    if isinstance(a, int) and isinstance(b, int):
        return a - b
    if b == 0:
        return a
    return BinInt("-", a, b)


def imin(a: IntExpr, b: IntExpr) -> IntExpr:
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b)
    return BinInt("min", a, b)


def imax(a: IntExpr, b: IntExpr) -> IntExpr:
    if isinstance(a, int) and isinstance(b, int):
        return max(a, b)
    return BinInt("max", a, b)


def floordiv(a: IntExpr, b: IntExpr) -> IntExpr:
    """Python floor division (consumers implement floor semantics for negative values too)."""
    if isinstance(a, int) and isinstance(b, int):
        return a // b
    if b == 1:
        return a
    return BinInt("//", a, b)


def mod(a: IntExpr, b: IntExpr) -> IntExpr:
    """Python modulo (result has the divisor's sign)."""
    if isinstance(a, int) and isinstance(b, int):
        return a % b
    if b == 1:
        return 0
    return BinInt("%", a, b)


def ceildiv(a: IntExpr, b: IntExpr) -> IntExpr:
    """ceil(a / b) for b > 0: the blockFactor / tile-count formula of AscendC tiling."""
    return floordiv(add(a, sub(b, 1)) if isinstance(b, int) else sub(add(a, b), 1), b)


def eval_int(e: IntExpr, env: dict) -> int:
    """Evaluate an IntExpr with Var values from `env` (iterative: deep address sums are fine)."""
    if isinstance(e, int):
        return e
    if isinstance(e, Var):
        return env[e]
    stack, out = [(e, False)], []
    while stack:
        node, done = stack.pop()
        if isinstance(node, int):
            out.append(node)
        elif isinstance(node, Var):
            out.append(env[node])
        elif done:
            b, a = out.pop(), out.pop()
            out.append(INT_OPS[node.op](a, b))
        else:
            stack.append((node, True))
            stack.append((node.b, False))
            stack.append((node.a, False))
    return out[0]


INT_OPS = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "//": lambda a, b: a // b,
    "%": lambda a, b: a % b,
    "min": min,
    "max": max,
}


# ----------------------------------------------------------------------------- buffers


@dataclass(frozen=True, slots=True)
class Buffer:
    """A named buffer in a scope. GM buffers are kernel arguments (`arg` = position);
    on-chip buffers have a fixed element count that the program declares and the spec checks."""

    name: str
    scope: str
    dtype: str  # numpy dtype name; "bool" is stored as one byte
    size: int  # elements (GM: 0, unknown)
    arg: int = -1  # GM argument index

    @property
    def nbytes(self) -> int:
        import numpy as np

        # bfloat16 by name: np.dtype("bfloat16") exists only once ml_dtypes is imported, and a
        # program (its capacity check, its listing) must not depend on who imported what
        item = 2 if self.dtype == "bfloat16" else np.dtype(self.dtype).itemsize
        return self.size * item

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True, slots=True)
class Ref:
    """A position inside a buffer: element offset `off` (an IntExpr) from the buffer start."""

    buf: Buffer
    off: IntExpr = 0

    def __str__(self) -> str:
        return f"{self.buf.name}[{self.off}]" if self.off != 0 else self.buf.name

    def __add__(self, k: IntExpr) -> Ref:
        return Ref(self.buf, add(self.off, k))


# ----------------------------------------------------------------------------- vector unit
# Every vector instruction works on `n` contiguous elements of UB buffers (n is an IntExpr).
# Operands of one instruction share a dtype unless the instruction converts.

VECTOR_BINARY = (
    "vadd",
    "vsub",
    "vmul",
    "vdiv",
    "vmax",
    "vmin",
    "vand",
    "vor",
    "vxor",  # bitwise, integer/bool dtypes
    "vfloordiv",
    "vmod",
    "vpow",
    "vshl",
    "vshr",
)  # fmt: skip  (shifts by a tile of counts: integer dtypes)
VECTOR_SCALAR = ("vadds", "vmuls", "vmaxs", "vmins", "vshl", "vshr")  # dst = op(src, scalar)
VECTOR_UNARY = ("vexp", "vln", "vabs", "vrelu", "vsqrt", "vrsqrt", "vrec", "vneg", "vnot",
                "vfloor", "vceil", "vrint", "vtrunc", "vcopy")  # fmt: skip
VECTOR_CMP = ("eq", "ne", "lt", "le", "gt", "ge")
VECTOR_REDUCE = ("vcadd", "vcmax", "vcmin", "vcmul")


@dataclass(frozen=True, slots=True)
class VBinary:
    """dst = op(a, b) elementwise over n elements."""

    op: str
    dst: Ref
    a: Ref
    b: Ref
    n: IntExpr


@dataclass(frozen=True, slots=True)
class VScalar:
    """dst = op(src, scalar) over n elements (vadds, vmuls, vmaxs, vmins, vshl, vshr)."""

    op: str
    dst: Ref
    src: Ref
    scalar: float | int
    n: IntExpr


@dataclass(frozen=True, slots=True)
class VUnary:
    """dst = op(src) over n elements. vexp/vln are native on the Vector unit."""

    op: str
    dst: Ref
    src: Ref
    n: IntExpr


@dataclass(frozen=True, slots=True)
class VFma:
    """dst = a * b + c (vmla/vmadd); one rounding on the host (llvm.fma)."""

    dst: Ref
    a: Ref
    b: Ref
    c: Ref
    n: IntExpr


@dataclass(frozen=True, slots=True)
class VConv:
    """dst = cast(src) to dst's dtype; `mode` for float->int: 'trunc' (C cast), 'rint', 'floor',
    'ceil'; 'bits' reinterprets the bits (same itemsize)."""

    dst: Ref
    src: Ref
    n: IntExpr
    mode: str = "trunc"


@dataclass(frozen=True, slots=True)
class VCmp:
    """dst (bool mask) = a <cmp> b."""

    cmp: str
    dst: Ref
    a: Ref
    b: Ref
    n: IntExpr


@dataclass(frozen=True, slots=True)
class VCmpS:
    """dst (bool mask) = src <cmp> scalar."""

    cmp: str
    dst: Ref
    src: Ref
    scalar: float | int
    n: IntExpr


@dataclass(frozen=True, slots=True)
class VSel:
    """dst = mask ? a : b."""

    dst: Ref
    mask: Ref
    a: Ref
    b: Ref
    n: IntExpr


@dataclass(frozen=True, slots=True)
class VDup:
    """dst = scalar broadcast over n elements (vector_dup). For integer dtypes the scalar may be
    an IntExpr (a scalar register, e.g. the first row index of this block's slice)."""

    dst: Ref
    scalar: float | IntExpr  # IntExpr (a scalar register) for integer dtypes
    n: IntExpr


@dataclass(frozen=True, slots=True)
class VBrcb:
    """dst[r*n + k] = src[r] for r < rows, k < n: per-row scalars broadcast over rows of n
    (AscendC's Brcb). Row-resident kernels use it to apply a row's reduction result (its max,
    sum, mean...) to every element of the row held in UB; with one row it fuses into the
    consumers' loop as a register broadcast."""

    dst: Ref
    src: Ref
    n: IntExpr
    rows: IntExpr = 1


@dataclass(frozen=True, slots=True)
class VGather:
    """dst[i] = table[idx[i]] (AscendC Gather); idx is int32, table a UB buffer."""

    dst: Ref
    table: Ref
    idx: Ref
    n: IntExpr


@dataclass(frozen=True, slots=True)
class VReduce:
    """dst[0] = op(dst[0], reduce(src[0:n])) for op in vcadd/vcmax/vcmin/vcmul.

    Accumulates into dst so a tiled loop reduces tile by tile; initialise dst with VDup.
    With `rows` > 1 it is AscendC's WholeReduce: dst[r] = op(dst[r], reduce(src[r*n:(r+1)*n]))
    for every r < rows, which reduces many short rows (e.g. a sum over a small last axis) in one
    instruction. dst may be wider than src (float16 -> float32, float32 -> float64 accumulators);
    the reduction is computed in dst's dtype. vcmax/vcmin propagate NaN like numpy.
    """

    op: str
    dst: Ref
    src: Ref
    n: IntExpr
    rows: IntExpr = 1


@dataclass(frozen=True, slots=True)
class VArgReduce:
    """Running arg-reduction (vargmax / vargmin), first occurrence wins, NaN-aware like numpy.

    For every r < rows: scan src[r*n + c] for c < n and update (dst_val[r], dst_idx[r]) when the
    element beats the current value (strictly greater for argmax, strictly smaller for argmin) or
    is the first NaN seen; the stored index is `base + c` (int64). Initialise dst_val with the
    identity (-inf / +inf) and dst_idx with 0 before the first tile.
    """

    op: str
    dst_val: Ref
    dst_idx: Ref
    src: Ref
    n: IntExpr
    base: IntExpr
    rows: IntExpr = 1


@dataclass(frozen=True, slots=True)
class VHostMath:
    """dst = fn(*srcs) by the host's libm: the fallback for a function with no native
    instruction that the vector math library (``vmath``) cannot expand.

    Not an NPU instruction (the NPU composes these from native ones); kept so every op works
    while vmath grows. The cost model charges it like a 16-instruction polynomial sequence.
    """

    fn: str
    dst: Ref
    srcs: tuple
    n: IntExpr


@dataclass
class Builder:
    """Appends instructions to a list; one method per vector instruction, named as on the NPU.

    Templates and the vector math library (``vmath``) emit through this so they never build
    dataclasses by hand. Scratch UB buffers are requested with `scratch`; the program declares
    them and the capacity check counts them.
    """

    body: list = field(default_factory=list)
    buffers: list = field(default_factory=list)
    _n: int = 0
    # Static upper bound of `n` for the instructions being emitted (the UB tile, in elements).
    # `scratch(dtype)` without a size allocates this many elements. Templates pass vector
    # instructions n == tile (a constant) so composites can size scratch buffers statically.
    tile: int = 0
    prefix: str = "tmp"

    def emit(self, instr) -> None:
        self.body.append(instr)

    def scratch(
        self, dtype: str, size: int | None = None, scope: str = "UB", prefix: str | None = None
    ) -> Ref:
        """A fresh on-chip buffer, declared by the program and counted by the capacity check."""
        if size is None:
            size = self.tile
        if not isinstance(size, int) or size <= 0:
            raise ValueError(f"scratch buffers need a static positive size, got {size!r}")
        self._n += 1
        buf = Buffer(f"{prefix or self.prefix}{self._n}", scope, dtype, size)
        self.buffers.append(buf)
        return Ref(buf, 0)

    # binary
    def vadd(self, d, a, b, n):
        self.emit(VBinary("vadd", d, a, b, n))

    def vsub(self, d, a, b, n):
        self.emit(VBinary("vsub", d, a, b, n))

    def vmul(self, d, a, b, n):
        self.emit(VBinary("vmul", d, a, b, n))

    def vdiv(self, d, a, b, n):
        self.emit(VBinary("vdiv", d, a, b, n))

    def vmax(self, d, a, b, n):
        self.emit(VBinary("vmax", d, a, b, n))

    def vmin(self, d, a, b, n):
        self.emit(VBinary("vmin", d, a, b, n))

    def vand(self, d, a, b, n):
        self.emit(VBinary("vand", d, a, b, n))

    def vor(self, d, a, b, n):
        self.emit(VBinary("vor", d, a, b, n))

    def vxor(self, d, a, b, n):
        self.emit(VBinary("vxor", d, a, b, n))

    # with a scalar
    def vadds(self, d, s, x, n):
        self.emit(VScalar("vadds", d, s, x, n))

    def vmuls(self, d, s, x, n):
        self.emit(VScalar("vmuls", d, s, x, n))

    def vmaxs(self, d, s, x, n):
        self.emit(VScalar("vmaxs", d, s, x, n))

    def vmins(self, d, s, x, n):
        self.emit(VScalar("vmins", d, s, x, n))

    def vshl(self, d, s, x, n):
        self.emit(VScalar("vshl", d, s, x, n))

    def vshr(self, d, s, x, n):
        self.emit(VScalar("vshr", d, s, x, n))

    # unary
    def vexp(self, d, s, n):
        self.emit(VUnary("vexp", d, s, n))

    def vln(self, d, s, n):
        self.emit(VUnary("vln", d, s, n))

    def vabs(self, d, s, n):
        self.emit(VUnary("vabs", d, s, n))

    def vrelu(self, d, s, n):
        self.emit(VUnary("vrelu", d, s, n))

    def vsqrt(self, d, s, n):
        self.emit(VUnary("vsqrt", d, s, n))

    def vrsqrt(self, d, s, n):
        self.emit(VUnary("vrsqrt", d, s, n))

    def vrec(self, d, s, n):
        self.emit(VUnary("vrec", d, s, n))

    def vneg(self, d, s, n):
        self.emit(VUnary("vneg", d, s, n))

    def vfloor(self, d, s, n):
        self.emit(VUnary("vfloor", d, s, n))

    def vrint(self, d, s, n):
        self.emit(VUnary("vrint", d, s, n))

    def vcopy(self, d, s, n):
        self.emit(VUnary("vcopy", d, s, n))

    # the rest
    def vfma(self, d, a, b, c, n):
        self.emit(VFma(d, a, b, c, n))

    def vconv(self, d, s, n, mode="trunc"):
        self.emit(VConv(d, s, n, mode))

    def vcmp(self, cmp, d, a, b, n):
        self.emit(VCmp(cmp, d, a, b, n))

    def vcmps(self, cmp, d, s, x, n):
        self.emit(VCmpS(cmp, d, s, x, n))

    def vsel(self, d, m, a, b, n):
        self.emit(VSel(d, m, a, b, n))

    def vdup(self, d, x, n):
        self.emit(VDup(d, x, n))

    def vgather(self, d, table, idx, n):
        self.emit(VGather(d, table, idx, n))

    def vreduce(self, op, d, s, n, rows=1):
        self.emit(VReduce(op, d, s, n, rows))

    def vargreduce(self, op, dval, didx, s, n, base, rows=1):
        self.emit(VArgReduce(op, dval, didx, s, n, base, rows))

    def vmod(self, d, a, b, n):
        self.emit(VBinary("vmod", d, a, b, n))

    def vfloordiv(self, d, a, b, n):
        self.emit(VBinary("vfloordiv", d, a, b, n))

    def vpow(self, d, a, b, n):
        self.emit(VBinary("vpow", d, a, b, n))

    def vceil(self, d, s, n):
        self.emit(VUnary("vceil", d, s, n))

    def vtrunc(self, d, s, n):
        self.emit(VUnary("vtrunc", d, s, n))

    def vnot(self, d, s, n):
        self.emit(VUnary("vnot", d, s, n))

    # movers and control (see below)
    def copy_in(self, dst, src, counts, strides, dst_pitch=None):
        self.emit(CopyIn(dst, src, tuple(counts), tuple(strides), dst_pitch))

    def copy_out(self, dst, src, counts, strides, src_pitch=None):
        self.emit(CopyOut(dst, src, tuple(counts), tuple(strides), src_pitch))

    def set_flag(self, src_pipe, dst_pipe, event=0):
        self.emit(SetFlag(src_pipe, dst_pipe, event))

    def wait_flag(self, src_pipe, dst_pipe, event=0):
        self.emit(WaitFlag(src_pipe, dst_pipe, event))

    def let(self, var, value):
        self.emit(Let(var, value))


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


# ----------------------------------------------------------------------------- MIX kernels
# A MIX kernel (AscendC KERNEL_TYPE_MIX_AIC_1_2, split 910B) is written as ONE body, as AscendC
# writes it as one kernel function whose core-specific parts sit under ASCEND_IS_AIC /
# ASCEND_IS_AIV: the compiler builds one binary per core kind from it. Here the core of each
# instruction follows from the instruction itself (the table below: the AIC owns L1/L0 and the
# Cube, MTE1 and FixPipe pipes, the AIV owns UB, Vector and MTE3; MTE2 and Scalar exist on both
# and go by the buffer or the flag), so the split needs no marker in the body: `mix_streams`
# projects the body onto each core (scalar control, Let / Loop / If, goes to every core whose
# instructions it encloses). The host (llvm, interp) runs the body in program order, one valid
# interleaving of the two streams (every cross-core wait comes after its set), so host results
# do not depend on the split; the device model (cost, listings, the timeline's lanes) uses the
# two programs, which run concurrently and meet only at the cross-core flags.
# Sub-blocks (KERNEL_TYPE_MIX_AIC_1_2: two AIVs per AIC): a loop over SUBBLOCK_IDX holds what
# each AIV does with its index (e.g. its half of a tile's rows); the AIV work outside such loops
# is sub-block 0's (`if GetSubBlockIdx() == 0`), and a program without them uses one AIV. With
# n AIVs an AIC cross-core set reaches each of them and an AIC wait completes when all n have
# set the flag (AscendC's mode-2 flags within a group).

MIX_CORES = ("AIC", "AIV")
AIC_PIPES = ("Scalar", "MTE2", "MTE1", "Cube", "FixPipe")
CORE_PIPES = {"AIC": AIC_PIPES, "AIV": AIV_PIPES}
_CORE_OF_PIPE = {"MTE1": "AIC", "Cube": "AIC", "FixPipe": "AIC", "Vector": "AIV", "MTE3": "AIV"}
_CORE_OF_SCOPE = {"L1": "AIC", "L0A": "AIC", "L0B": "AIC", "L0C": "AIC", "UB": "AIV"}
_CORE_OF_FLAG = {"MTE1": "AIC", "M": "AIC", "FIX": "AIC", "V": "AIV", "MTE3": "AIV"}
# a Scalar-pipe instruction with no core of its own: the split reductions' arrival counter is
# the Vector cores' (they publish and combine the partials; the AIC only multiplies)
_CORE_OF_TYPE: dict[type, str] = {AtomicAdd: "AIV"}


def core_of(instr) -> str | None:
    """The core kind ("AIC" / "AIV") of a MIX kernel that runs `instr`; None for scalar control
    (Let, Loop, If), which each core's program has where it needs it. ValueError if the
    instruction belongs to no single core (a barrier over all pipes, a flag between pipes of
    different cores)."""
    t = type(instr)
    if t in (Let, Loop, If):
        return None
    if t in (CrossCoreSetFlag, CrossCoreWaitFlag):
        return instr.side
    if t is PipeBarrier:
        if instr.pipe in MIX_CORES:
            return instr.pipe
        raise ValueError(f"{format_instr(instr)!r}: in a MIX kernel a barrier covers one core's "
                         "pipes (pipe_barrier AIC or AIV)")  # fmt: skip
    if t in (SetFlag, WaitFlag):
        cores = {_CORE_OF_FLAG.get(instr.src), _CORE_OF_FLAG.get(instr.dst)} - {None}
        if len(cores) != 1:
            raise ValueError(f"{format_instr(instr)!r}: a set/wait flag joins two pipes of one "
                             "core; between the AIC and the AIV use cross-core flags")  # fmt: skip
        return cores.pop()
    if t in _CORE_OF_TYPE:
        return _CORE_OF_TYPE[t]
    pipe = pipe_of(instr)
    if pipe in _CORE_OF_PIPE:
        return _CORE_OF_PIPE[pipe]
    dst = getattr(instr, "dst", None)
    if pipe == "MTE2" and isinstance(dst, Ref) and dst.buf.scope in _CORE_OF_SCOPE:
        return _CORE_OF_SCOPE[dst.buf.scope]
    raise ValueError(f"{format_instr(instr)!r}: no core of a MIX kernel runs it")


def mix_cores(body) -> dict[int, tuple[str, ...]]:
    """id(instruction) -> the cores whose program contains it, for every instruction of `body`
    (leaves: their core; Loop / If: the cores of their body; Let: the cores of the body it is
    declared in)."""
    out: dict[int, tuple[str, ...]] = {}

    def visit(b) -> set:
        here: set = set()
        lets = []
        for i in b:
            if isinstance(i, (Loop, If)):
                inner = visit(i.body)
                out[id(i)] = tuple(c for c in MIX_CORES if c in inner)
                here |= inner
            elif isinstance(i, Let):
                lets.append(i)
            else:
                c = core_of(i)
                out[id(i)] = (c,)
                here.add(c)
        for i in lets:
            out[id(i)] = tuple(c for c in MIX_CORES if c in here)
        return here

    visit(body)
    return out


def mix_aivs(program) -> int:
    """AIVs per AIC that a MIX kernel uses: the trip count of its sub-block loops (else 1)."""
    n = 1
    for i, _ in walk(program.body):
        if isinstance(i, Loop) and i.var == SUBBLOCK_IDX and isinstance(i.stop, int):
            n = max(n, i.stop)
    return n


def is_mix(program) -> bool:
    """A MIX kernel with two instruction streams (AIC + AIV) joined by cross-core flags."""
    return program.unit == "mix" and any(
        isinstance(i, (CrossCoreSetFlag, CrossCoreWaitFlag)) for i, _ in walk(program.body)
    )


def mix_streams(program) -> dict:
    """{"AIC": Program, "AIV": Program}: the instruction stream of each core kind of a MIX
    kernel (the body projected onto the core; buffers of its scopes; see the section comment)."""
    cores = mix_cores(program.body)
    subs = mix_aivs(program) > 1

    def project(body, core, sub=False):
        out: list = []
        run: list = []  # sub-block 0's AIV work outside sub-block loops

        def flush() -> None:
            if run:
                out.append(If(SUBBLOCK_IDX, "==", 0, tuple(run)))
                run.clear()

        for i in body:
            if core not in cores[id(i)]:
                continue
            if isinstance(i, Loop) and i.var == SUBBLOCK_IDX:  # each AIV: its own iteration
                flush()
                out.extend(project(i.body, core, True))
                continue
            if isinstance(i, Loop):
                i = Loop(i.var, i.start, i.stop, i.step, project(i.body, core, sub))
            elif isinstance(i, If):
                i = If(i.a, i.cmp, i.b, project(i.body, core, sub))
            if subs and core == "AIV" and not sub and not isinstance(i, (Let, Loop, If)):
                run.append(i)
                continue
            flush()
            out.append(i)
        flush()
        return tuple(out)

    unit = {"AIC": "cube", "AIV": "vector"}
    return {c: Program(f"{program.name}.{c.lower()}", program.args,
                       tuple(b for b in program.buffers if _CORE_OF_SCOPE.get(b.scope) == c),
                       project(program.body, c), program.blocks, program.device_blocks,
                       unit[c], program.workspace)
            for c in MIX_CORES}  # fmt: skip


def _check_mix(program, spec) -> None:
    """A MIX kernel: every instruction belongs to one core, a cross-core flag is raised on a
    pipe of its own core, and every cross-core wait can be matched by a set of the other core
    on a flag id it can take (and every set by a wait): the NPU would hang on a wait nobody sets.
    (Counts are the cost model's check: it walks the streams and raises on a wait left with no
    pending set.)"""
    if spec.coupled or not is_mix(program):  # (Program.check refuses cross-core flags there)
        return
    ranges: dict = {BLOCK_IDX: (0, max(program.blocks, 1) - 1)}
    sets: dict = {c: [] for c in MIX_CORES}
    waits: dict = {c: [] for c in MIX_CORES}
    aivs = max(1, spec.vector_cores // max(spec.cube_cores, 1))

    def visit(body) -> None:
        for i in body:
            core_of(i)  # raises for an instruction of no single core
            if isinstance(i, Loop) and i.var == SUBBLOCK_IDX:
                if not (isinstance(i.stop, int) and i.start == 0 and i.step == 1
                        and 1 <= i.stop <= aivs):  # fmt: skip
                    raise ValueError(f"kernel {program.name}: a sub-block loop runs 0..n, n <= "
                                     f"{aivs} (AIVs per AIC on {spec.name})")  # fmt: skip
                if any(core_of(j) not in (None, "AIV") for j, _ in walk(i.body)):
                    raise ValueError(f"kernel {program.name}: a sub-block loop holds AIV work "
                                     "only")  # fmt: skip
            if isinstance(i, Loop):
                s, t = int_range(i.start, ranges), int_range(i.stop, ranges)
                ranges[i.var] = (s[0], t[1] - 1)
                visit(i.body)
            elif isinstance(i, If):
                visit(i.body)
            elif isinstance(i, Let):
                ranges[i.var] = int_range(i.value, ranges)
            elif isinstance(i, (CrossCoreSetFlag, CrossCoreWaitFlag)):
                if i.side not in MIX_CORES:
                    raise ValueError(f"kernel {program.name}: {format_instr(i)!r}: side must be "
                                     "AIC or AIV")  # fmt: skip
                if FLAG_PIPE_OF.get(i.pipe) not in CORE_PIPES[i.side]:
                    raise ValueError(f"kernel {program.name}: {format_instr(i)!r}: pipe {i.pipe} "
                                     f"is not a pipe of the {i.side}")  # fmt: skip
                lo, hi = int_range(i.flag, ranges)
                lo, hi = max(lo, 0), min(hi, CROSS_CORE_FLAGS - 1)
                (sets if isinstance(i, CrossCoreSetFlag) else waits)[i.side].append((i, lo, hi))

    visit(program.body)
    for core in MIX_CORES:
        other = MIX_CORES[1 - MIX_CORES.index(core)]
        for mine, theirs, what in ((waits[core], sets[other], "set"),
                                   (sets[core], waits[other], "wait")):  # fmt: skip
            for i, lo, hi in mine:
                if not any(a <= hi and lo <= b for _, a, b in theirs):
                    why = "the NPU would wait forever" if what == "set" else "nobody consumes it"
                    raise ValueError(
                        f"kernel {program.name}: {format_instr(i)!r} has no matching "
                        f"cross-core {what} on the {other} (flag ids {lo:g}..{hi:g}): {why}"
                    )


# ----------------------------------------------------------------------------- program


class BufferOverflowError(ValueError):
    """A program declares more on-chip bytes in one scope than the device has per core."""


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


PROGRAM_CHECKS: list = []  # (program, spec) -> None, raise ValueError; see Program.check


def linear(e: IntExpr) -> dict | None:
    """`e` as {term: coefficient} (the constant under key 1) when it is a sum of constants and
    constant multiples of other sub-expressions; None otherwise (only + - and * by a constant
    are expanded, anything else is one opaque term)."""
    if isinstance(e, int):
        return {1: e}
    if isinstance(e, BinInt) and e.op in ("+", "-"):
        a, b = linear(e.a), linear(e.b)
        if a is None or b is None:
            return None
        sign = 1 if e.op == "+" else -1
        out = dict(a)
        for k, v in b.items():
            out[k] = out.get(k, 0) + sign * v
        return {k: v for k, v in out.items() if v or k == 1}
    if isinstance(e, BinInt) and e.op == "*" and (isinstance(e.a, int) or isinstance(e.b, int)):
        c, x = (e.a, e.b) if isinstance(e.a, int) else (e.b, e.a)
        lx = linear(x)
        return None if lx is None else {k: c * v for k, v in lx.items()}
    return {e: 1, 1: 0}


def const_difference(a: IntExpr, b: IntExpr) -> int | None:
    """a - b when it is the same constant for every variable value, else None."""
    la, lb = linear(a), linear(b)
    if la is None or lb is None:
        return None
    d = dict(la)
    for k, v in lb.items():
        d[k] = d.get(k, 0) - v
    if any(v for k, v in d.items() if k != 1):
        return None
    return d.get(1, 0)


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


def int_range(e: IntExpr, ranges: dict) -> tuple[float, float]:
    """Interval [lo, hi] of an IntExpr given intervals of its variables (unknown: unbounded)."""
    inf = float("inf")
    if isinstance(e, int):
        return e, e
    if isinstance(e, Var):
        return ranges.get(e, (-inf, inf))
    a, b = int_range(e.a, ranges), int_range(e.b, ranges)
    op = e.op
    if op == "+":
        return a[0] + b[0], a[1] + b[1]
    if op == "-":
        return a[0] - b[1], a[1] - b[0]
    if op == "min":
        return min(a[0], b[0]), min(a[1], b[1])
    if op == "max":
        return max(a[0], b[0]), max(a[1], b[1])
    if op == "*":
        cs = [x * y for x in a for y in b if not (x == 0 or y == 0)] or [0]
        cs += [0] if 0 in (*a, *b) else []
        return min(cs), max(cs)
    if op == "%" and b[0] == b[1] and b[0] > 0:
        if a[0] >= 0 and a[1] < b[0]:
            return a
        return 0, b[0] - 1
    if op == "//" and b[0] > 0 and b[1] < inf:
        cs = [x // y if abs(x) < inf else x for x in a for y in b]
        return min(cs), max(cs)
    return -inf, inf


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


class LoopBuilder:
    """Context manager returned by `Builder.loop`: collects the body, then appends the Loop."""

    def __init__(self, b: Builder, var: Var, start, stop, step):
        self.b, self.var, self.args = b, var, (start, stop, step)

    def __enter__(self) -> Var:
        self.saved = self.b.body
        self.b.body = []
        return self.var

    def __exit__(self, *exc) -> None:
        body, self.b.body = self.b.body, self.saved
        if exc[0] is None:
            self.b.emit(Loop(self.var, *self.args, tuple(body)))


def _builder_loop(self: Builder, var: Var | str, start, stop, step=1) -> LoopBuilder:
    """`with b.loop("i", 0, n, t) as i:` emits a Loop around what the block appends."""
    return LoopBuilder(self, Var(var) if isinstance(var, str) else var, start, stop, step)


Builder.loop = _builder_loop
