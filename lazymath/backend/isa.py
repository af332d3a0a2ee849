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

from dataclasses import dataclass, field
from typing import Union

# ----------------------------------------------------------------------------- scalar values

SCOPES = ("GM", "L1", "L0A", "L0B", "L0C", "UB")


@dataclass(frozen=True, slots=True)
class Var:
    """A scalar (int64) variable: loop counters, block index/count, Let-bound values."""

    name: str

    def __str__(self) -> str:
        return self.name


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


IntExpr = Union[int, Var, BinInt]

BLOCK_IDX = Var("block_idx")  # GetBlockIdx()
BLOCK_NUM = Var("block_num")  # GetBlockNum()


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

        return self.size * np.dtype(self.dtype).itemsize

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

VECTOR_BINARY = ("vadd", "vsub", "vmul", "vdiv", "vmax", "vmin",
                 "vand", "vor", "vxor",  # bitwise, integer/bool dtypes
                 "vfloordiv", "vmod", "vpow")  # fmt: skip
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
    """dst = scalar broadcast over n elements (vector_dup)."""

    dst: Ref
    scalar: float | int
    n: IntExpr


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
    """

    op: str
    dst: Ref
    src: Ref
    n: IntExpr


VectorInstr = Union[VBinary, VScalar, VUnary, VFma, VConv, VCmp, VCmpS, VSel, VDup, VGather, VReduce]


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

    def emit(self, instr) -> None:
        self.body.append(instr)

    def scratch(self, dtype: str, size: int, scope: str = "UB", prefix: str = "tmp") -> Ref:
        self._n += 1
        buf = Buffer(f"{prefix}{self._n}", scope, dtype, size)
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

    def vreduce(self, op, d, s, n):
        self.emit(VReduce(op, d, s, n))


# ----------------------------------------------------------------------------- movers, control
# (owned by the ISA/lowering work: data movers MTE2/MTE3/MTE1/FixPipe, Loop/Let, set/wait flag,
#  Program with declared buffers and the capacity check, str(program) listing.)
