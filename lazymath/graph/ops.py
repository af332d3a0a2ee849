"""The op registry: one record per op. Every other table of ops is derived from it.

`Op` has one member per op of the graph. Its value is an `OpInfo` record: arity, kind, dtype
rule, numpy reference, cost class, fusion traits and lowering. `Op` members are `str`s equal to
their lowercase names (``Op.EXP == "exp"``), so a node's ``op`` (a plain string: it is a key in
hot paths) and a member compare, hash and look up interchangeably; ``Op("exp")`` or
``OPS["exp"]`` gives the member of a name.

What derives from the records (nothing restates the vocabulary):
- here: `ELEMENTWISE`, `UNARY`, `BINARY`, `COMPARISONS`, `LOGICAL`, `VIEWS`, `REDUCE_OPS`,
  `kind()` and the dtype rule `ufunc_dtypes()`;
- the tensor bindings (`lazymath.add`, `lazymath.exp`, ...) for simple unary and binary ops;
- the fusion rule sets (`fusion.rules.FIXPIPE_OPS`, `EXPENSIVE_OPS`) and `fusion.views.VIEW_OPS`;
- the kernel IR's scalar vocabulary (`backend.npu.kernel_ir.SCALAR_OPS`, `REDUCE_OPS`);
- the lowering tables of the Vector templates, the reduce template and the Cube epilogue: the
  record names its lowering as data (`Native("vexp")`, `Composite("sin")`, `AiCpu()`) and the
  backend resolves it (graph/ never imports backend/); vmath's list of composites is checked
  against the records by tests/graph/test_op_registry.py.

Node ops that are not elementwise:
  buffer, const                    leaves
  reshape, permute, expand, slice  views (zero-copy; `slice` also covers flip via step -1)
  window                           strided (overlapping) view of a 1-D source, arg (strides, offset)
  im2col                           conv1d's zero-padded windows of x (N, C, L), arg (K, stride,
                                   dilation, pad_left, groups): read by a matmul's GM -> L1 packing
  reduce                           arg = (op, axes), op one of `REDUCE_OPS`; drops the axes
  matmul                           srcs (a, b) with equal batch dims: (..., m, k) @ (..., k, n)
  pad, concat                      copies, arg = (widths, value) / axis
  conv1d, fft                      arg = parameters; reference numpy paths (AI CPU kernels)
  complex_planes, complex_join     complex <-> float32 (real, imaginary) planes (the Cube FFT)
  custom                           a user kernel (`lazymath.kernel`), arg = (key, params); the
                                   definition lives in `graph.custom`, not here

How to add an elementwise op (exp2 was added this way):
1. one member below: `EXP2 = OpInfo("exp2", 1, EW, U(np.exp2), np.exp2, TRANSC,
   Composite("exp2"))` -- the numpy ufunc that defines its dtype rule, its reference, cost,
   traits and lowering;
2. its binding line in functions/elementwise.py: `exp2 = _unary(Op.EXP2)` (name and docstring
   come from the record; tests/graph/test_op_registry.py fails while it is missing);
3. its row in tests/test_ops_elementwise.py's UNARY table (oracle and input domain; a test
   fails while it is missing; binary ops are tested from the registry directly);
4. if the lowering is new: a `Native` instruction needs its entry in `backend/npu/isa.py` and the
   lowering/interpreter/cost tables; a `Composite` its expansion in `backend/npu/vmath/` and, for
   the dtypes vmath leaves to the host, a case in `lower_vector._vhostmath`, `interp._HOST` and
   `lower_cube._float_special` (the matmul epilogue). Fusion, the kernel IR and the Vector
   templates need nothing: they read the record.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np

from lazymath import dtypes as _dtypes
from lazymath.dtypes import float64 as _F64

# ============================================================================ record parts


class Kind(str, enum.Enum):
    """Coarse class of a node op: what fusion rules and visualization key on."""

    ELEMENTWISE = "elementwise"
    REDUCE = "reduce"
    VIEW = "view"
    LEAF = "leaf"
    MATMUL = "matmul"
    PAD = "pad"
    CONCAT = "concat"
    CONV1D = "conv1d"
    IM2COL = "im2col"  # conv1d's implicit-GEMM operand (the matmul's packing reads it)
    FFT = "fft"
    CUSTOM = "custom"  # a user kernel (`lazymath.kernel`)

    __str__ = str.__str__
    __format__ = str.__format__


class Cost(enum.IntEnum):
    """Work per element, as the fusion planner weighs recomputation."""

    FREE = 0  # no instruction: views, leaves
    CHEAP = 1  # one simple vector instruction (add, max, compare, select, ...)
    DIVIDE = 2  # a divide or square root: many cycles per repeat
    TRANSCENDENTAL = 3  # exp/log (native) or a composite polynomial sequence


@dataclass(frozen=True, slots=True)
class Ufunc:
    """dtype rule: numpy's type resolution of `ufunc` (promotion is numpy's by construction).

    `float_result`: an integer or bool result becomes float64 (numpy's rule for the ufunc would
    give an integer); `bool_inputs`: the operands are cast to bool first (logical ops)."""

    ufunc: np.ufunc
    float_result: bool = False
    bool_inputs: bool = False


# Lowerings: what the backend turns an op into. Plain data; `backend/` resolves them.
@dataclass(frozen=True, slots=True)
class Native:
    """One native vector instruction per tile (`isa.VUnary` / `VBinary` op name)."""

    instr: str


@dataclass(frozen=True, slots=True)
class Composite:
    """A vmath composite (native instructions: range reduction + polynomial) for floats.

    `fallback`: the native instruction used where vmath does not expand the dtype (integers,
    float64 for some ops); None means the host libm (`isa.VHostMath`)."""

    fn: str
    fallback: str | None = None


@dataclass(frozen=True, slots=True)
class Emitted:
    """A short hand-written instruction sequence in the templates' expression emitter
    (compare, select, cast, sign, ...)."""


@dataclass(frozen=True, slots=True)
class ReduceInstr:
    """A reduction: `instr` reduces a tile into the accumulator, `combine` merges two partial
    results (None: arg-reductions carry an index and have their own merge)."""

    instr: str
    combine: str | None


@dataclass(frozen=True, slots=True)
class Cube:
    """A Cube-unit template (matmul)."""


@dataclass(frozen=True, slots=True)
class AiCpu:
    """No AI Core template: the AI CPU runs the numpy reference."""


@dataclass(frozen=True, slots=True)
class NoCode:
    """Nothing to run: leaves, and views (strides read in place)."""


@dataclass(frozen=True, slots=True)
class UserKernel:
    """A kernel written by the user with `lazymath.kernel`: the node's ``arg`` is (kernel key,
    parameters), and the kernel's definition (registered in `graph.custom`) builds its program."""


Lowering = Native | Composite | Emitted | ReduceInstr | Cube | AiCpu | NoCode | UserKernel


@dataclass(frozen=True, slots=True)
class OpInfo:
    """One op, everything the layers need to know about it.

    arity: operands (node sources); kind: `Kind`; dtypes: the dtype rule (None: the binding
    computes it: where, cast, non-elementwise ops); ref: numpy reference (None: structural, the
    reference executor handles the node kind); cost: `Cost`; fixpipe: the 910B FixPipe applies
    it on the way L0C -> GM (a Cube epilogue op that needs no Vector kernel); inplace: computed
    by one instruction that may write over its operand's tile; lower: the `Lowering`.
    """

    name: str
    arity: int
    kind: Kind
    dtypes: Ufunc | None
    ref: object
    cost: Cost
    lower: Lowering
    fixpipe: bool = False
    inplace: bool = False

    @property
    def expensive(self) -> bool:
        """Not cheap to recompute in every consumer kernel (fusion materializes it once)."""
        return self.cost >= Cost.DIVIDE


# ============================================================================ references


def _sigmoid(x):
    """Stable on both tails: exp(x)/(1+exp(x)) for x < 0 keeps denormal results that
    1/(1+exp(-x)) would flush to zero."""
    with np.errstate(over="ignore", under="ignore"):
        e = np.exp(-np.abs(x))
        out = np.where(x >= 0, 1 / (1 + e), e / (1 + e))
    return np.asarray(out).astype(x.dtype, copy=False)


def _erf_ufunc(fn):
    """numpy reference of erf/erfc (numpy has none): the C library's double function per
    element, rounded once to the input's float dtype (float16/32 results correctly rounded
    or 1 ulp off; the reference backend and validation mode compare against it)."""
    vec = np.frompyfunc(fn, 1, 1)

    def ref(x):
        x = np.asarray(x)
        dt = x.dtype if x.dtype.kind == "f" else np.result_type(x.dtype, np.float64)
        return np.asarray(vec(x.astype(np.float64)), dtype=np.float64).astype(dt)

    ref.__name__ = fn.__name__
    return ref


_erf = _erf_ufunc(math.erf)
_erfc = _erf_ufunc(math.erfc)


def _relu(x):
    return np.maximum(x, x.dtype.type(0))


def _leaky_relu(x, slope):
    return np.where(x >= 0, x, x * x.dtype.type(slope)).astype(x.dtype, copy=False)


def _expm1(x):
    """np.expm1, except for complex x where numpy computes exp(z) - 1 (cancellation near 0
    and NaN for every infinite part). Complex: Re = expm1(a) cos(b) - 2 sin(b/2)^2, Im =
    exp(a) sin(b) (no cancellation), then the C99 Annex G / Array API special cases:
    (+-0, +0) -> +0 + 0j, (a, +-0) keeps the zero imaginary part (so (+inf, 0) -> inf + 0j and
    (NaN, 0) -> NaN + 0j), (-inf, b) -> -1 + 0j, (+inf, inf or NaN) -> inf + NaN j."""
    if x.dtype.kind != "c":
        return np.expm1(x)
    z = x.astype(np.complex128)
    a, b = z.real, z.imag
    with np.errstate(all="ignore"):
        re = np.expm1(a) * np.cos(b) - 2.0 * np.sin(b / 2) ** 2 + 0.0  # + 0.0: -0 -> +0
        im = np.exp(a) * np.sin(b)
        im = np.where(b == 0, b, im)
        ninf = a == -np.inf
        re = np.where(ninf, -1.0, re)
        im = np.where(ninf, np.where(np.isfinite(b), 0.0 * np.sin(b), 0.0), im)
        pinf = (a == np.inf) & ~np.isfinite(b)
        re = np.where(pinf, np.inf, re)
        im = np.where(pinf, np.nan, im)
    out = np.empty(np.shape(re), x.dtype)  # re + 1j * im would turn inf * 0j into NaN
    out.real, out.imag = re, im
    return out


def _rsqrt(x):
    return (1 / np.sqrt(x)).astype(x.dtype, copy=False)


def floor_divide_ref(a, b):
    """floor_divide as the Array API standard's special-case table wants it: numpy's npy_divmod
    quotient, except where an operand is infinite, where the standard takes floor(a / b) (inf // 2
    is inf, not numpy's nan; -1 // inf is -0, not numpy's -1). Integers are numpy's unchanged.
    Shared by the reference executor and the interpreter so every backend agrees."""
    with np.errstate(all="ignore"):
        r = np.floor_divide(a, b)
        if np.result_type(a, b).kind != "f":
            return r
        inf = np.isinf(a) | np.isinf(b)
        if not np.any(inf):
            return r
        return np.where(inf, np.floor(np.true_divide(a, b)), r).astype(r.dtype, copy=False)


def _reciprocal(x):
    return (1 / x).astype(x.dtype, copy=False)


# ============================================================================ the registry

EW, RED, VIEW, LEAF = Kind.ELEMENTWISE, Kind.REDUCE, Kind.VIEW, Kind.LEAF
FREE, CHEAP, DIVIDE, TRANSC = Cost.FREE, Cost.CHEAP, Cost.DIVIDE, Cost.TRANSCENDENTAL
U = Ufunc


class Op(str, enum.Enum):
    """Every op of the graph, one record each (see the module docstring)."""

    # --- elementwise, unary
    NEG = OpInfo("neg", 1, EW, U(np.negative), np.negative, CHEAP, Native("vneg"), inplace=True)
    ABS = OpInfo("abs", 1, EW, U(np.absolute), np.absolute, CHEAP, Native("vabs"), inplace=True)
    EXP = OpInfo("exp", 1, EW, U(np.exp), np.exp, TRANSC, Native("vexp"), inplace=True)
    EXP2 = OpInfo("exp2", 1, EW, U(np.exp2), np.exp2, TRANSC, Composite("exp2"))
    LOG = OpInfo("log", 1, EW, U(np.log), np.log, TRANSC, Native("vln"), inplace=True)
    SQRT = OpInfo("sqrt", 1, EW, U(np.sqrt), np.sqrt, DIVIDE, Native("vsqrt"), inplace=True)
    RSQRT = OpInfo("rsqrt", 1, EW, U(np.sqrt, float_result=True), _rsqrt, DIVIDE,
                   Native("vrsqrt"), inplace=True)  # fmt: skip
    # float result like sqrt (numpy's reciprocal of an integer is integer-valued)
    RECIPROCAL = OpInfo("reciprocal", 1, EW, U(np.sqrt, float_result=True), _reciprocal, DIVIDE,
                        Native("vrec"), inplace=True)  # fmt: skip
    SIN = OpInfo("sin", 1, EW, U(np.sin), np.sin, TRANSC, Composite("sin"))
    COS = OpInfo("cos", 1, EW, U(np.cos), np.cos, TRANSC, Composite("cos"))
    TAN = OpInfo("tan", 1, EW, U(np.tan), np.tan, TRANSC, Composite("tan"))
    TANH = OpInfo("tanh", 1, EW, U(np.tanh), np.tanh, TRANSC, Composite("tanh"))
    SIGMOID = OpInfo("sigmoid", 1, EW, U(np.exp, float_result=True), _sigmoid, TRANSC,
                     Composite("sigmoid"))  # fmt: skip
    RELU = OpInfo("relu", 1, EW, U(np.positive), _relu, CHEAP, Native("vrelu"), fixpipe=True,
                  inplace=True)  # fmt: skip
    # arg = negative slope (float)
    LEAKY_RELU = OpInfo("leaky_relu", 1, EW, U(np.sqrt, float_result=True), _leaky_relu, CHEAP,
                        Emitted())  # fmt: skip
    SIGN = OpInfo("sign", 1, EW, U(np.sign), np.sign, CHEAP, Emitted())
    FLOOR = OpInfo("floor", 1, EW, U(np.floor), np.floor, CHEAP, Native("vfloor"), inplace=True)
    CEIL = OpInfo("ceil", 1, EW, U(np.ceil), np.ceil, CHEAP, Native("vceil"), inplace=True)
    # half to even, like numpy
    ROUND = OpInfo("round", 1, EW, U(np.rint), np.rint, CHEAP, Native("vrint"), inplace=True)
    LOGICAL_NOT = OpInfo("logical_not", 1, EW, U(np.logical_not, bool_inputs=True),
                         np.logical_not, CHEAP, Emitted(), inplace=True)  # fmt: skip
    # the Array API's elementwise functions (issue 16)
    ISNAN = OpInfo("isnan", 1, EW, U(np.isnan), np.isnan, CHEAP, Emitted())
    ISINF = OpInfo("isinf", 1, EW, U(np.isinf), np.isinf, CHEAP, Emitted())
    ISFINITE = OpInfo("isfinite", 1, EW, U(np.isfinite), np.isfinite, CHEAP, Emitted())
    SIGNBIT = OpInfo("signbit", 1, EW, U(np.signbit), np.signbit, CHEAP, Emitted())
    TRUNC = OpInfo("trunc", 1, EW, U(np.trunc), np.trunc, CHEAP, Native("vtrunc"), inplace=True)
    SQUARE = OpInfo("square", 1, EW, U(np.square), np.square, CHEAP, Emitted())
    BITWISE_INVERT = OpInfo("bitwise_invert", 1, EW, U(np.invert), np.invert, CHEAP,
                            Native("vnot"), inplace=True)  # fmt: skip
    LOG1P = OpInfo("log1p", 1, EW, U(np.log1p), np.log1p, TRANSC, Composite("log1p"))
    EXPM1 = OpInfo("expm1", 1, EW, U(np.expm1), _expm1, TRANSC, Composite("expm1"))
    LOG2 = OpInfo("log2", 1, EW, U(np.log2), np.log2, TRANSC, Composite("log2"))
    LOG10 = OpInfo("log10", 1, EW, U(np.log10), np.log10, TRANSC, Composite("log10"))
    SINH = OpInfo("sinh", 1, EW, U(np.sinh), np.sinh, TRANSC, Composite("sinh"))
    COSH = OpInfo("cosh", 1, EW, U(np.cosh), np.cosh, TRANSC, Composite("cosh"))
    ASINH = OpInfo("asinh", 1, EW, U(np.arcsinh), np.arcsinh, TRANSC, Composite("asinh"))
    ACOSH = OpInfo("acosh", 1, EW, U(np.arccosh), np.arccosh, TRANSC, Composite("acosh"))
    ATANH = OpInfo("atanh", 1, EW, U(np.arctanh), np.arctanh, TRANSC, Composite("atanh"))
    # no vector sequence yet: the host libm computes these inside the fused kernel
    ASIN = OpInfo("asin", 1, EW, U(np.arcsin), np.arcsin, TRANSC, Composite("asin"))
    ACOS = OpInfo("acos", 1, EW, U(np.arccos), np.arccos, TRANSC, Composite("acos"))
    ATAN = OpInfo("atan", 1, EW, U(np.arctan), np.arctan, TRANSC, Composite("atan"))
    # issue 33: the error function (GELU); dtype rule of exp (integers -> float64)
    ERF = OpInfo("erf", 1, EW, U(np.exp), _erf, TRANSC, Composite("erf"))
    ERFC = OpInfo("erfc", 1, EW, U(np.exp), _erfc, TRANSC, Composite("erfc"))

    # --- elementwise, binary
    ADD = OpInfo("add", 2, EW, U(np.add), np.add, CHEAP, Native("vadd"), inplace=True)
    SUB = OpInfo("sub", 2, EW, U(np.subtract), np.subtract, CHEAP, Native("vsub"), inplace=True)
    MUL = OpInfo("mul", 2, EW, U(np.multiply), np.multiply, CHEAP, Native("vmul"), inplace=True)
    DIV = OpInfo("div", 2, EW, U(np.true_divide), np.true_divide, DIVIDE, Native("vdiv"),
                 inplace=True)  # fmt: skip
    FLOOR_DIVIDE = OpInfo("floor_divide", 2, EW, U(np.floor_divide), floor_divide_ref, DIVIDE,
                          Composite("floor_divide", fallback="vfloordiv"))  # fmt: skip
    REMAINDER = OpInfo("remainder", 2, EW, U(np.remainder), np.remainder, DIVIDE,
                       Composite("remainder", fallback="vmod"))  # fmt: skip
    POW = OpInfo("pow", 2, EW, U(np.power), np.power, TRANSC, Composite("pow", fallback="vpow"))
    MAXIMUM = OpInfo("maximum", 2, EW, U(np.maximum), np.maximum, CHEAP, Native("vmax"),
                     inplace=True)  # fmt: skip
    MINIMUM = OpInfo("minimum", 2, EW, U(np.minimum), np.minimum, CHEAP, Native("vmin"),
                     inplace=True)  # fmt: skip
    EQ = OpInfo("eq", 2, EW, U(np.equal), np.equal, CHEAP, Emitted())
    NE = OpInfo("ne", 2, EW, U(np.not_equal), np.not_equal, CHEAP, Emitted())
    LT = OpInfo("lt", 2, EW, U(np.less), np.less, CHEAP, Emitted())
    LE = OpInfo("le", 2, EW, U(np.less_equal), np.less_equal, CHEAP, Emitted())
    GT = OpInfo("gt", 2, EW, U(np.greater), np.greater, CHEAP, Emitted())
    GE = OpInfo("ge", 2, EW, U(np.greater_equal), np.greater_equal, CHEAP, Emitted())
    LOGICAL_AND = OpInfo("logical_and", 2, EW, U(np.logical_and, bool_inputs=True),
                         np.logical_and, CHEAP, Emitted())  # fmt: skip
    LOGICAL_OR = OpInfo("logical_or", 2, EW, U(np.logical_or, bool_inputs=True),
                        np.logical_or, CHEAP, Emitted())  # fmt: skip
    # the Array API's (issue 16)
    BITWISE_AND = OpInfo("bitwise_and", 2, EW, U(np.bitwise_and), np.bitwise_and, CHEAP,
                         Native("vand"), inplace=True)  # fmt: skip
    BITWISE_OR = OpInfo("bitwise_or", 2, EW, U(np.bitwise_or), np.bitwise_or, CHEAP,
                        Native("vor"), inplace=True)  # fmt: skip
    BITWISE_XOR = OpInfo("bitwise_xor", 2, EW, U(np.bitwise_xor), np.bitwise_xor, CHEAP,
                         Native("vxor"), inplace=True)  # fmt: skip
    # a count >= the width (or negative) shifts every bit out, like numpy
    BITWISE_LEFT_SHIFT = OpInfo("bitwise_left_shift", 2, EW, U(np.left_shift), np.left_shift,
                                CHEAP, Native("vshl"))  # fmt: skip
    BITWISE_RIGHT_SHIFT = OpInfo("bitwise_right_shift", 2, EW, U(np.right_shift),
                                 np.right_shift, CHEAP, Native("vshr"))  # fmt: skip
    COPYSIGN = OpInfo("copysign", 2, EW, U(np.copysign), np.copysign, CHEAP, Emitted())
    HYPOT = OpInfo("hypot", 2, EW, U(np.hypot), np.hypot, DIVIDE, Composite("hypot"))
    LOGADDEXP = OpInfo("logaddexp", 2, EW, U(np.logaddexp), np.logaddexp, TRANSC,
                       Composite("logaddexp"))  # fmt: skip
    ATAN2 = OpInfo("atan2", 2, EW, U(np.arctan2), np.arctan2, TRANSC, Composite("atan2"))

    # --- elementwise, other (dtype rule in the binding): where(cond: bool, a, b), cast
    WHERE = OpInfo("where", 3, EW, None, np.where, CHEAP, Emitted())
    # to the node's dtype; float->int truncates toward zero, ->bool is != 0
    CAST = OpInfo("cast", 1, EW, None, None, CHEAP, Emitted(), fixpipe=True, inplace=True)

    # --- reductions: the op of a `reduce` node (arg[0]); dtype rule in the binding
    SUM = OpInfo("sum", 1, RED, None, np.sum, CHEAP, ReduceInstr("vcadd", "vadd"))
    PROD = OpInfo("prod", 1, RED, None, np.prod, CHEAP, ReduceInstr("vcmul", "vmul"))
    MAX = OpInfo("max", 1, RED, None, np.max, CHEAP, ReduceInstr("vcmax", "vmax"))
    MIN = OpInfo("min", 1, RED, None, np.min, CHEAP, ReduceInstr("vcmin", "vmin"))
    ARGMAX = OpInfo("argmax", 1, RED, None, np.argmax, CHEAP, ReduceInstr("vargmax", None))
    ARGMIN = OpInfo("argmin", 1, RED, None, np.argmin, CHEAP, ReduceInstr("vargmin", None))

    # --- structural node ops (the reference executor and the templates handle each kind)
    BUFFER = OpInfo("buffer", 0, LEAF, None, None, FREE, NoCode())
    CONST = OpInfo("const", 0, LEAF, None, None, FREE, NoCode())
    RESHAPE = OpInfo("reshape", 1, VIEW, None, None, FREE, NoCode())
    PERMUTE = OpInfo("permute", 1, VIEW, None, None, FREE, NoCode())
    EXPAND = OpInfo("expand", 1, VIEW, None, None, FREE, NoCode())
    SLICE = OpInfo("slice", 1, VIEW, None, None, FREE, NoCode())
    # arg = (strides, offset) in elements of a 1-D source: overlapping windows (conv1d's im2col
    # as a view: the Cube's GM -> L1 packing reads it in place)
    WINDOW = OpInfo("window", 1, VIEW, None, None, FREE, NoCode())
    REDUCE = OpInfo("reduce", 1, RED, None, None, CHEAP, NoCode())  # the node; arg[0] says which
    MATMUL = OpInfo("matmul", 2, Kind.MATMUL, None, None, CHEAP, Cube())
    PAD = OpInfo("pad", 1, Kind.PAD, None, None, CHEAP, AiCpu())
    CONCAT = OpInfo("concat", -1, Kind.CONCAT, None, None, CHEAP, AiCpu())  # any number of srcs
    CONV1D = OpInfo("conv1d", -1, Kind.CONV1D, None, None, CHEAP, AiCpu())  # x, w[, bias]
    # x (N, C, L) -> (N, C*K, L_out) (groups 1) or (N, G, C/G*K, L_out): element (c*K + j, l) is
    # x[c, l*stride + j*dilation - pad_left], 0 outside x; arg = (K, stride, dilation, pad_left,
    # groups). Only a matmul's B operand: the Cube's GM -> L1 packing computes it (implicit GEMM,
    # lazymath/backend/host/im2col.py); materialized on its own it is an AI CPU kernel.
    IM2COL = OpInfo("im2col", 1, Kind.IM2COL, None, None, FREE, Cube())
    # arg = (kind, n, axis, norm, why this implementation)
    FFT = OpInfo("fft", 1, Kind.FFT, None, None, CHEAP, AiCpu())
    # the Cube FFT's edges (graph/dft.py): complex (..., n) -> float32 planes (..., 2, n) (real,
    # imaginary), and back (arg = (the plan's reason, shown by lm.explain; n): the source in C
    # order is (..., 2, n) planes, the result keeps the first shape[-1] of the n)
    COMPLEX_PLANES = OpInfo("complex_planes", 1, Kind.FFT, None, None, CHEAP, AiCpu())
    COMPLEX_JOIN = OpInfo("complex_join", 1, Kind.FFT, None, None, CHEAP, AiCpu())
    # a user kernel (`lazymath.kernel`): arg = (kernel key, params); one record for all of them
    CUSTOM = OpInfo("custom", -1, Kind.CUSTOM, None, None, CHEAP, UserKernel())

    def __new__(cls, info: OpInfo):
        obj = str.__new__(cls, info.name)
        obj._value_ = info.name
        obj.info = info
        return obj

    __str__ = str.__str__
    __format__ = str.__format__

    # shortcuts to the record
    arity = property(lambda self: self.info.arity)
    kind = property(lambda self: self.info.kind)
    lowering = property(lambda self: self.info.lower)  # not `lower`: str.lower stays a method
    ref = property(lambda self: self.info.ref)


del EW, RED, VIEW, LEAF, FREE, CHEAP, DIVIDE, TRANSC, U

for _m in Op:
    if _m.name.lower() != _m.value:
        raise AssertionError(f"Op.{_m.name}: record name {_m.value!r} is not the member name")


def ufunc_bool(ufunc: np.ufunc) -> bool:
    """True when every loop of `ufunc` returns bool (a comparison)."""
    return all(t.endswith("->?") for t in ufunc.types if "O" not in t)


# ============================================================================ derived tables
# Keys are plain `str` (node ops are plain strings; exact-str dict lookups are the fast ones).

OPS: dict[str, Op] = {m.value: m for m in Op}
ELEMENTWISE: dict[str, Op] = {m.value: m for m in Op if m.kind is Kind.ELEMENTWISE}
UNARY = frozenset(k for k, m in ELEMENTWISE.items() if m.arity == 1 and m.info.dtypes)
BINARY = frozenset(k for k, m in ELEMENTWISE.items() if m.arity == 2)
LOGICAL = frozenset(
    k for k, m in ELEMENTWISE.items() if m.info.dtypes and m.info.dtypes.bool_inputs
)
# binary ops whose result is bool for any operands (and whose inputs are not cast to bool)
COMPARISONS = frozenset(k for k in BINARY - LOGICAL
                        if ufunc_bool(ELEMENTWISE[k].info.dtypes.ufunc))  # fmt: skip
VIEWS = frozenset(m.value for m in Op if m.kind is Kind.VIEW)
REDUCE_OPS = tuple(m.value for m in Op if m.kind is Kind.REDUCE and m is not Op.REDUCE)
_KIND: dict[str, str] = {m.value: m.kind.value for m in Op}


def kind(op: str) -> str:
    """Coarse class of a node op, used by fusion rules and visualization (a plain string:
    elementwise, view, leaf, reduce, matmul, pad, concat, conv1d, fft)."""
    return _KIND.get(op, op)


def ufunc_dtypes(op: str, operands: tuple) -> tuple[tuple[np.dtype, ...], np.dtype]:
    """(input loop dtypes, output dtype) numpy would use for `op` on these operands.

    Operands are dtypes (tensors) or Python scalar types (weak, as in NEP 50).
    """
    ufunc = ELEMENTWISE[op].info.dtypes.ufunc
    # a Python bool is not weak in NEP 50 (it is the lowest kind already): numpy's
    # resolve_dtypes only takes the weak types int/float/complex, so pass bool as np.bool_
    operands = tuple(_BOOL if o is bool else o for o in operands)
    res = _resolve(ufunc, operands)
    # bf16 with int/bool tensors: torch's bf16 result (is_bf16: no ml_dtypes import for others)
    if _F64 in res and any(_dtypes.is_bf16(o) for o in operands):
        bf16 = _dtypes.bfloat16
        wide = tuple(bf16 if isinstance(o, np.dtype) and o.kind in "biu" else o
                     for o in operands)  # fmt: skip
        if all(o == bf16 for o in wide if isinstance(o, np.dtype)):
            res = _resolve(ufunc, wide)
    return res[:-1], res[-1]


_BOOL = np.dtype(bool)
_resolve_cache: dict = {}


def _resolve(ufunc, operands):
    key = (ufunc.__name__, operands)
    hit = _resolve_cache.get(key)
    if hit is None:
        hit = ufunc.resolve_dtypes((*operands, None))
        _resolve_cache[key] = hit
    return hit
