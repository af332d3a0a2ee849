"""The Vector unit's instructions (`VBinary` ... `VHostMath`, the op-name tuples) and `Builder`,
which templates and the vector math library emit through (one method per instruction, scratch
buffers, `with b.loop(...)`).

Part of the ISA's one namespace, `isa` (issue 36 split it by what it holds): use `isa.X`. The
pipes and listing formats of these instructions are registered in `isa_registry`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lazymath.backend.npu.isa_control import CopyIn, CopyOut, Let, Loop, SetFlag, WaitFlag
from lazymath.backend.npu.isa_values import Buffer, IntExpr, Ref, Var

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

    # movers and control (`isa_control`)
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
