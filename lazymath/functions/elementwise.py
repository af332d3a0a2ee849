"""The elementwise functions: one binding per op record of `graph.ops` (`exp = _unary(Op.EXP)`:
name, docstring and dtype rule from the record; tests/graph/test_op_registry.py checks none is
missing), numpy's spellings of them, and the few with rules of their own: pow (integer powers),
the comparisons (an int beyond the dtype's range folds), where, clip, leaky_relu, abs of an FFT;
the Array API's positive and logical_xor, and conj, real, imag, nextafter (on the host at the
call for complex tensors / nextafter).

`_elementwise` records one op with numpy's dtype rule and broadcasting; its fast path reuses
the plan of an earlier call with the same operand dtypes and shapes (every call of a composite
op after the first).
"""

from __future__ import annotations

import builtins
import sys
from collections.abc import Sequence

import numpy as np

from lazymath import dtypes as dt
from lazymath import settings
from lazymath.functions.base import _cast, _expand, _memo, astype, broadcast_shapes
from lazymath.functions.creation import (
    _as_tensor_or_scalar,
    from_host,
    full,
    host_value,
    tensor_arg,
)
from lazymath.functions.datatypes import result_type
from lazymath.functions.shapes import reshape
from lazymath.graph import custom
from lazymath.graph import node as gn
from lazymath.graph.ops import ELEMENTWISE, Op, ufunc_dtypes
from lazymath.graph.reference import fold
from lazymath.tensor import (
    PY_SCALAR_TYPES,
    Tensor,
    check_devices,
    peel_const,
    scalar_arg,
    scalar_args_of,
    wrap,
)

_SCALAR_ARGS = settings.SCALAR_ARGS

_FAST_OPERANDS = (float, int, bool)
_EW_PLANS: dict = {}  # (op, arg, operand dtypes/shapes/scalar types) -> dtypes and shape


def _elementwise(op: str, operands: Sequence, arg=None) -> Tensor:
    """Record an elementwise op with numpy's dtype rule and broadcasting.

    Fast path first: a unary op on a tensor, or a binary op on two tensors or a tensor and a
    Python scalar, whose plan is already known (every call of a composite op after the first).
    Anything else, and every error, goes through `_elementwise_general`."""
    try:
        if len(operands) == 2:
            a, b = operands
            if type(a) is Tensor:
                na = a._node
                tb = type(b)
                if tb is Tensor:
                    nb = b._node
                    if b._device is a._device:
                        plan = _EW_PLANS.get((op, arg, na.dtype, na.shape, nb.dtype, nb.shape))
                        if plan is not None:
                            out = _fast_binary(op, arg, plan, na, nb, a._device)
                            if out is not None:
                                return out
                elif tb is float or tb is int:
                    plan = _EW_PLANS.get((op, arg, na.dtype, na.shape, tb))
                    if plan is not None:
                        nb = gn.const_node(b, plan[0][1])
                        out = _fast_binary(op, arg, plan, na, nb, a._device)
                        if out is not None:
                            return out
            elif type(b) is Tensor and (type(a) is float or type(a) is int):
                nb = b._node
                plan = _EW_PLANS.get((op, arg, type(a), nb.dtype, nb.shape))
                if plan is not None:
                    na = gn.const_node(a, plan[0][0])
                    out = _fast_binary(op, arg, plan, na, nb, b._device)
                    if out is not None:
                        return out
        elif len(operands) == 1:
            (a,) = operands
            if type(a) is Tensor:
                na = a._node
                plan = _EW_PLANS.get((op, arg, na.dtype, na.shape))
                if plan is not None:
                    (d,), out_dtype, shape = plan
                    if na.dtype is not d and na.dtype != d:
                        na = _cast(na, d)
                    if peel_const(na) is None:
                        return Tensor(_ew_node(op, out_dtype, shape, (na,), arg), a._device)
    except (TypeError, OverflowError):  # unhashable arg, scalar out of range: the slow path
        pass  # raises the user-facing error
    return _elementwise_general(op, operands, arg)


def _fast_binary(op, arg, plan, na, nb, device):
    """The node of a binary op with a known plan, or None to take the general path (constant
    operands fold there)."""
    (da, db), out_dtype, shape = plan
    # `is not` first: builtin dtypes are singletons, and numpy's dtype != is slow
    if na.dtype is not da and na.dtype != da:
        na = _cast(na, da)
    if na.shape != shape:
        na = _expand(na, shape)
    if nb.dtype is not db and nb.dtype != db:
        nb = _cast(nb, db)
    if nb.shape != shape:
        nb = _expand(nb, shape)
    if peel_const(na) is not None and peel_const(nb) is not None:
        return None
    return Tensor(_ew_node(op, out_dtype, shape, (na, nb), arg), device)


def _elementwise_general(op: str, operands: Sequence, arg=None) -> Tensor:
    """Record an elementwise op with numpy's dtype rule and broadcasting."""
    ops = []
    tensors = []
    key = [op, arg]
    for x in operands:
        tx = type(x)
        if tx is not Tensor and tx not in _FAST_OPERANDS:
            x = _as_tensor_or_scalar(x, op)
            tx = Tensor if isinstance(x, Tensor) else type(x)
        if tx is Tensor:
            tensors.append(x)
            n = x._node
            key.append(n.dtype)
            key.append(n.shape)
        else:
            key.append(tx)
        ops.append(x)
    if len(tensors) > 1:
        check_devices(op, tensors)
    # Every op of a composite is captured on each call: the dtype rule and broadcast result
    # for this (op, operand kinds) are computed once and replayed.
    in_dtypes, out_dtype, shape = _memo(_EW_PLANS, tuple(key), _ew_plan, op, ops, tensors)
    nodes = []
    all_const = True
    for x, d in zip(ops, in_dtypes):
        if type(x) is Tensor:
            n = x._node
            if n.dtype != d:
                n = _cast(n, d)
        else:
            try:
                n = gn.const_node(x, d)
            except OverflowError as e:
                raise OverflowError(f"{op}: scalar {x!r} does not fit dtype {d}: {e}") from None
        if n.shape != shape:
            n = _expand(n, shape)
        if all_const and peel_const(n) is None:
            all_const = False
        nodes.append(n)
    if all_const:  # constant folding: every operand a (broadcast) constant -> one constant
        consts = [peel_const(n) for n in nodes]
        probe = gn.make(op, out_dtype, (), consts, arg)
        value = fold(probe, [c.realized for c in consts])
        c = gn.const_node(value.item(), out_dtype)
        return wrap(_expand(c, shape), tensors)
    return Tensor(_ew_node(op, out_dtype, shape, nodes, arg), tensors[0]._device)


def _ew_node(op: str, out_dtype: np.dtype, shape: tuple, srcs: tuple, arg) -> gn.Node:
    """The node of elementwise `op`; a bfloat16 result is the float32 op rounded by one cast
    (its inputs are float32 already, `_ew_plan`), so kernels only ever load, store and convert
    bfloat16 and every op keeps its float32 lowering (vmath, comparisons, reductions)."""
    if dt.is_bf16(out_dtype):
        return gn.make("cast", out_dtype, shape, (gn.make(op, dt.float32, shape, srcs, arg),))
    return gn.make(op, out_dtype, shape, srcs, arg)


def _ew_plan(op: str, ops: list, tensors: list) -> tuple:
    """(input dtypes, output dtype, output shape) of `op` on these operands, with the errors
    a user should see (unsupported dtypes, shapes that do not broadcast)."""
    if op == "where":
        cond, a, b = ops
        kinds = tuple(x.dtype if isinstance(x, Tensor) else type(x) for x in (a, b))
        try:
            out_dtype = dt.result_type(*[np.empty(0, k) if isinstance(k, np.dtype) else
                                         k(0) for k in kinds])  # fmt: skip
        except TypeError as e:
            raise TypeError(f"where: cannot combine dtypes {kinds}: {e}") from None
        in_dtypes = (dt.bool_, out_dtype, out_dtype)
    else:
        kinds = tuple(x.dtype if isinstance(x, Tensor) else type(x) for x in ops)
        try:
            in_dtypes, out_dtype = ufunc_dtypes(op, kinds)
        except Exception:
            shown = ", ".join(k.name if isinstance(k, np.dtype) else k.__name__ for k in kinds)
            raise TypeError(f"{op}: not supported for operand dtypes ({shown})") from None
        rule = ELEMENTWISE[op].info.dtypes
        if rule.float_result and out_dtype.kind not in "fc" and not dt.is_bf16(out_dtype):
            out_dtype = dt.float64
            in_dtypes = (dt.float64,)
        if rule.bool_inputs:
            in_dtypes = tuple(dt.bool_ for _ in in_dtypes)
    # bfloat16 is a storage format: the op computes in float32 and `_ew_node` rounds its result
    # once (exact for the inputs, one rounding on store, as float16 is computed elsewhere)
    in_dtypes = tuple(dt.float32 if dt.is_bf16(d) else d for d in in_dtypes)
    if out_dtype not in dt.SUPPORTED:
        raise TypeError(f"{op}: result dtype {out_dtype} is not supported by lazymath")
    shape = broadcast_shapes(*(t.shape for t in tensors), op=op)
    return tuple(np.dtype(d) for d in in_dtypes), np.dtype(out_dtype), shape


# ----------------------------------------------------------------------------- elementwise


def _doc(m: Op) -> str:
    """A binding's docstring from its op record: the numpy function whose semantics (result
    dtype, values, NaN/inf) it follows."""
    rule = m.info.dtypes
    what = f"Elementwise {m.value}" + (" with broadcasting" if m.arity > 1 else "")
    if m.info.ref is rule.ufunc:
        return f"{what}, as numpy.{rule.ufunc.__name__} (result dtype and values). Lazy."
    extra = ", a float for integer inputs" if rule.float_result else ""
    return f"{what}; result dtype as numpy.{rule.ufunc.__name__}{extra}. Lazy."


def _unary(m: Op):
    """The public function of unary op record `m` (one line per op below)."""
    if m.arity != 1 or m.info.dtypes is None:
        raise TypeError(f"{m!r} is not a unary elementwise op with a dtype rule")
    op = m.value  # a plain str: the node op, a key of the plan tables

    def f(x, *args) -> Tensor:
        return _elementwise(op, (x,), *args)

    f.__name__ = f.__qualname__ = op
    f.__doc__ = _doc(m)
    return f


def _binary(m: Op):
    """The public function of binary op record `m`."""
    if m.arity != 2 or m.info.dtypes is None:
        raise TypeError(f"{m!r} is not a binary elementwise op with a dtype rule")
    op = m.value

    def f(a, b) -> Tensor:
        if type(a) is not type(b):  # a Python scalar from user code: a runtime argument
            a, b = scalar_args_of(op, a, b, sys._getframe(1).f_code)
        return _elementwise(op, (a, b))

    f.__name__ = f.__qualname__ = op
    f.__doc__ = _doc(m)
    return f


def _fft_abs(x: Tensor) -> Tensor | None:
    """|fft(...)| as one Vector Stockham kernel that writes the magnitudes (float32), when `x`
    is the pending, uncropped result of one; None otherwise."""
    j = x._node
    if j.realized is not None or j.arg[1] != j.shape[-1]:
        return None
    s = j.srcs[0]
    if s.op != "custom" or s.realized is not None or s.arg[0] != custom.BUILTIN.get("fft_stockham"):
        return None
    p = dict(s.arg[1])
    if p.get("lay") is not None or p.get("mode") not in (None, "rpost", "rfused"):
        return None
    # (a packed rfft's combine, separate or inside the Stockham kernel, writes the magnitudes)
    mode = {"rpost": "rpost_abs", "rfused": "rfused_abs"}.get(p.get("mode"), "abs")
    params = tuple(sorted({**p, "mode": mode}.items()))
    node = gn.make("custom", dt.float32, s.shape[:-1], s.srcs, (s.arg[0], params))
    return reshape(wrap(node, [x]), x.shape)


# One line per op record of `graph.ops` with a dtype rule (tests/graph/test_op_registry.py
# checks that none is missing); the function, its name and docstring come from the record.
neg = _unary(Op.NEG)
abs = _unary(Op.ABS)
_abs_elementwise = abs


def abs(x, *args) -> Tensor:  # noqa: A001
    if type(x) is Tensor and x._node.op == "complex_join":
        fused = _fft_abs(x)
        if fused is not None:
            return fused
    return _abs_elementwise(x, *args)


abs.__doc__ = _abs_elementwise.__doc__ + (
    " abs(fft(x)) of a Vector Stockham FFT is one kernel: its last stage writes the magnitudes."
)
exp = _unary(Op.EXP)
exp2 = _unary(Op.EXP2)
log = _unary(Op.LOG)
sqrt = _unary(Op.SQRT)
rsqrt = _unary(Op.RSQRT)
reciprocal = _unary(Op.RECIPROCAL)
sin = _unary(Op.SIN)
cos = _unary(Op.COS)
tan = _unary(Op.TAN)
tanh = _unary(Op.TANH)
sigmoid = _unary(Op.SIGMOID)
relu = _unary(Op.RELU)
sign = _unary(Op.SIGN)
floor = _unary(Op.FLOOR)
ceil = _unary(Op.CEIL)
_round = _unary(Op.ROUND)


def round(x) -> Tensor:
    """Round half to even (numpy.round). Integers round to themselves and keep their dtype,
    as in numpy.round (numpy.rint would give floats); bool gives float16 like numpy."""
    if isinstance(x, Tensor) and dt.is_int(x.dtype):
        return x
    return _round(x)


def _integral_identity(op: str, f):
    """floor/ceil of integers and bools are the input itself (numpy 2 keeps the dtype), so no
    backend has to implement integer rounding."""

    def g(x) -> Tensor:
        return x if isinstance(x, Tensor) and x.dtype.kind in "iub" else f(x)

    g.__name__, g.__doc__ = op, f"Elementwise {op}, numpy semantics (identity on integers)."
    return g


floor = _integral_identity("floor", floor)
ceil = _integral_identity("ceil", ceil)
logical_not = _unary(Op.LOGICAL_NOT)
isnan = _unary(Op.ISNAN)
isinf = _unary(Op.ISINF)
isfinite = _unary(Op.ISFINITE)
signbit = _unary(Op.SIGNBIT)
trunc = _integral_identity("trunc", _unary(Op.TRUNC))
square = _unary(Op.SQUARE)
bitwise_invert = _unary(Op.BITWISE_INVERT)
log1p = _unary(Op.LOG1P)
expm1 = _unary(Op.EXPM1)
log2 = _unary(Op.LOG2)
log10 = _unary(Op.LOG10)
sinh = _unary(Op.SINH)
cosh = _unary(Op.COSH)
asinh = _unary(Op.ASINH)
acosh = _unary(Op.ACOSH)
atanh = _unary(Op.ATANH)
asin = _unary(Op.ASIN)
acos = _unary(Op.ACOS)
atan = _unary(Op.ATAN)
erf = _unary(Op.ERF)
erfc = _unary(Op.ERFC)

add = _binary(Op.ADD)
sub = _binary(Op.SUB)
mul = _binary(Op.MUL)
div = _binary(Op.DIV)
floor_divide = _binary(Op.FLOOR_DIVIDE)
remainder = _binary(Op.REMAINDER)
_pow = _binary(Op.POW)


def _negative_int(x) -> bool:
    """x is a negative Python/numpy integer (a tensor exponent is checked when it is computed:
    the reference backend raises at realize, naming the line)."""
    if isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)):
        return x < 0
    return False


def _negative_values(x) -> bool:
    """x is a signed-integer exponent whose values are already on the host (a realized tensor,
    a numpy array, a list) and holds a negative value. A lazily computed exponent is not
    read here (that would force a realize at graph-building time)."""
    if isinstance(x, Tensor):
        arr = x._node.realized
        if arr is None:
            return False
    elif isinstance(x, (np.ndarray, list, tuple)):
        arr = np.asarray(x)
    else:
        return False
    return arr.dtype.kind == "i" and arr.size > 0 and bool((arr < 0).any())


def pow(a, b) -> Tensor:
    """Elementwise power with broadcasting (numpy.power's dtype rule): an integer base raised
    to a negative integer exponent is a ValueError, as in numpy, for a Python or numpy
    exponent and for an exponent tensor whose values are known (realized). An exponent
    computed in the same graph is not checked on the llvm and interp backends (the integer
    result there is 0 for 2 ** -1, like C's integer power); the reference backend raises."""
    base = a.dtype if isinstance(a, Tensor) else np.asarray(a).dtype
    if base.kind in "iub" and (_negative_int(b) or _negative_values(b)):
        bt = b.dtype if isinstance(b, Tensor) else np.asarray(b).dtype
        if dt.result_type(base, bt).kind in "iu":
            raise ValueError("Integers to negative integer powers are not allowed.")
    return _pow(a, b)


maximum = _binary(Op.MAXIMUM)
minimum = _binary(Op.MINIMUM)
# op(x, c) for an integer tensor x and a Python int c below (index 0) or above (index 1) x's
# dtype's range: every element has the same, known answer (numpy 2, NEP 50)
_OUT_OF_RANGE = {"eq": (False, False), "ne": (True, True), "lt": (False, True),
                 "le": (False, True), "gt": (True, False), "ge": (True, False)}  # fmt: skip
_MIRROR = {"eq": "eq", "ne": "ne", "lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}


def _int_out_of_range(x, c) -> int:
    """-1 / +1 when `x` is an integer tensor and `c` a Python int below / above the range of
    x's dtype (numpy 2 compares such a pair mathematically instead of raising), else 0."""
    if type(x) is not Tensor or not isinstance(c, int) or isinstance(c, bool):
        return 0
    d = x._node.dtype
    if d.kind not in "iu":
        return 0
    info = np.iinfo(d)
    return -1 if c < info.min else 1 if c > info.max else 0


def _compare(m: Op):
    """The public function of comparison record `m`: `_binary`'s, plus numpy 2's answer for
    an integer tensor against an out-of-range Python int (`lm.greater(u8, -1)` is all True,
    `lm.equal(u8, 256)` all False): a constant of x's shape, decided here at the call."""
    op = m.value
    f = _binary(m)

    def g(a, b) -> Tensor:
        side, x, name = _int_out_of_range(a, b), a, op
        if not side:
            side, x, name = _int_out_of_range(b, a), b, _MIRROR[op]
        if side:
            value = _OUT_OF_RANGE[name][side > 0]
            return wrap(_expand(gn.const_node(value, dt.bool_), x.shape), [x])
        if type(a) is not type(b):  # an in-range user scalar: a runtime argument (as _binary)
            a, b = scalar_args_of(op, a, b, sys._getframe(1).f_code)
        return f(a, b)

    g.__name__ = g.__qualname__ = op
    g.__doc__ = (f.__doc__ or "") + (
        " An integer tensor against a Python int outside its dtype's range gives numpy 2's "
        "answer (all True or all False), not an OverflowError."
    )
    return g


eq = _compare(Op.EQ)
ne = _compare(Op.NE)
lt = _compare(Op.LT)
le = _compare(Op.LE)
gt = _compare(Op.GT)
ge = _compare(Op.GE)
logical_and = _binary(Op.LOGICAL_AND)
logical_or = _binary(Op.LOGICAL_OR)
bitwise_and = _binary(Op.BITWISE_AND)
bitwise_or = _binary(Op.BITWISE_OR)
bitwise_xor = _binary(Op.BITWISE_XOR)
bitwise_left_shift = _binary(Op.BITWISE_LEFT_SHIFT)
bitwise_right_shift = _binary(Op.BITWISE_RIGHT_SHIFT)
copysign = _binary(Op.COPYSIGN)
hypot = _binary(Op.HYPOT)
logaddexp = _binary(Op.LOGADDEXP)
atan2 = _binary(Op.ATAN2)

subtract, multiply, divide, true_divide, negative, power = sub, mul, div, div, neg, pow
equal, not_equal, less, less_equal, greater, greater_equal = eq, ne, lt, le, gt, ge


def leaky_relu(x, negative_slope: float = 0.01) -> Tensor:
    """Elementwise x if x >= 0 else x * negative_slope; a float result for integer inputs."""
    return _elementwise(Op.LEAKY_RELU.value, (x,), float(negative_slope))


def where(cond, a, b) -> Tensor:
    """Elementwise choice: `a` where `cond` is true, else `b` (numpy.where with three
    arguments). `cond` is cast to bool; `a` and `b` broadcast and promote like an add. One
    Vector op, fused with its neighbours."""
    c = _as_tensor_or_scalar(cond, "where")
    if isinstance(c, Tensor) and c.dtype != dt.bool_:
        c = astype(c, dt.bool_)
    if type(a) is not type(b) and _SCALAR_ARGS.get():  # a user scalar: a runtime argument
        caller = sys._getframe(1).f_code
        if not gn.is_lazymath_code(caller):
            a, b = _where_scalar_args(a, b)
    return _elementwise("where", (c, a, b))


def _where_scalar_args(a, b):
    """where's Python scalar branch beside a tensor branch as a 0-d runtime argument of the
    weak-scalar result dtype (numpy.result_type of the tensor's dtype and the scalar)."""
    for i, (s, t) in enumerate(((b, a), (a, b))):
        if type(t) is Tensor and type(s) in PY_SCALAR_TYPES:
            try:
                d = np.dtype(dt.result_type(t.dtype, s))
                if d not in dt.SUPPORTED or (d.kind == "b" and type(s) is not bool):
                    continue
                with np.errstate(over="ignore"):
                    arr = np.array(s, dtype=d)
            except (OverflowError, ValueError, TypeError):
                continue
            arr.flags.writeable = False
            st = Tensor(gn.buffer_node(arr), t._device)
            if i == 0:
                b = st
            else:
                a = st
    return a, b


def clip(x, /, min=None, max=None) -> Tensor:
    """Elementwise clamp to [min, max] (scalars or tensors; positional like numpy's a_min,
    a_max); the result keeps x's dtype. With neither bound, x itself (the standard's rule)."""
    lo, hi = min, max
    if lo is None and hi is None:
        if isinstance(x, Tensor):
            return x
        raise ValueError("clip: give at least one of min and max")
    # numpy 2: a Python int bound outside an integer x's range that cannot bind (a min below
    # the dtype's minimum, a max above its maximum) is no bound; one that would bind everything
    # is numpy's OverflowError
    for name, bound, harmless in (("min", lo, -1), ("max", hi, 1)):
        side = _int_out_of_range(x, bound)
        if side and side != harmless:
            raise OverflowError(f"clip: {name}={bound!r} is out of bounds for {x.dtype}")
    if _int_out_of_range(x, lo) == -1:
        lo = None
    if _int_out_of_range(x, hi) == 1:
        hi = None
    if lo is None and hi is None:
        return x
    if type(x) is Tensor and _SCALAR_ARGS.get():  # user scalar bounds: runtime arguments
        caller = sys._getframe(1).f_code
        if type(lo) in PY_SCALAR_TYPES:
            lo = scalar_arg(x, lo, "maximum", False, caller)
        if type(hi) in PY_SCALAR_TYPES:
            hi = scalar_arg(x, hi, "minimum", False, caller)
    out = x
    if lo is not None:
        out = maximum(out, lo)
    if hi is not None:
        out = minimum(out, hi)
    return out


# fmt: off
__all__ = [
    "neg", "abs", "exp", "exp2", "log", "sqrt", "rsqrt", "reciprocal", "sin", "cos", "tan", "tanh",
    "sigmoid", "relu", "sign", "floor", "ceil", "round", "logical_not", "add", "sub", "mul", "div",
    "floor_divide", "remainder", "pow", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge",
    "logical_and", "logical_or", "subtract", "multiply", "divide", "true_divide", "negative",
    "power", "equal", "not_equal", "less", "less_equal", "greater", "greater_equal", "leaky_relu",
    "isnan", "isinf", "isfinite", "signbit", "trunc", "square", "bitwise_invert", "log1p", "expm1",
    "log2", "log10", "sinh", "cosh", "asinh", "acosh", "atanh", "asin", "acos", "atan",
    "erf", "erfc",
    "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_left_shift", "bitwise_right_shift",
    "copysign", "hypot", "logaddexp", "atan2", "where", "clip",
]
# fmt: on


# ----------------------------------------------------------------------------- Array API extras


def positive(x, /) -> Tensor:
    """+x (a new handle on the same values)."""
    x = tensor_arg(x, "positive")
    if x.dtype == dt.bool_:
        raise TypeError("positive: not supported for bool tensors")
    return astype(x, x.dtype, copy=True)


def logical_xor(x1, x2, /) -> Tensor:
    """Elementwise x1 != x2 of the truth values (numpy.logical_xor)."""
    a = x1 if not isinstance(x1, Tensor) else astype(x1, dt.bool_, copy=False)
    b = x2 if not isinstance(x2, Tensor) else astype(x2, dt.bool_, copy=False)
    return ne(a if isinstance(a, Tensor) else builtins.bool(a),
                b if isinstance(b, Tensor) else builtins.bool(b))  # fmt: skip


def conj(x, /) -> Tensor:
    """Complex conjugate: the input itself for real tensors; complex tensors (AI CPU dtypes)
    are conjugated on the host at the call."""
    x = tensor_arg(x, "conj")
    if not dt.is_complex(x.dtype):
        return x
    return from_host(np.conj(host_value(x, "conj")), x)


def real(x, /) -> Tensor:
    """The real part (float32 of complex64, float64 of complex128); real tensors unchanged.
    Complex tensors are read on the host at the call."""
    x = tensor_arg(x, "real")
    if not dt.is_complex(x.dtype):
        return x
    return from_host(np.real(host_value(x, "real")), x)


def imag(x, /) -> Tensor:
    """The imaginary part of a complex tensor (float32 for complex64, float64 for complex128).

    Complex tensors are read on the host at the call; a real input raises TypeError."""
    x = tensor_arg(x, "imag")
    if not dt.is_complex(x.dtype):
        raise TypeError(f"imag: expected a complex tensor, got {x.dtype}")
    return from_host(np.imag(host_value(x, "imag")), x)


def _pyscalar(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def nextafter(x1, x2, /) -> Tensor:
    """The next representable value after x1 toward x2 (computed on the host at the call).
    One of them may be a Python float or int (it takes the other's dtype)."""
    if not isinstance(x1, Tensor) and isinstance(x2, Tensor) and _pyscalar(x1):
        x1 = full(x2.shape, float(x1), dtype=x2.dtype, device=x2.device)
    if not isinstance(x2, Tensor) and isinstance(x1, Tensor) and _pyscalar(x2):
        x2 = full(x1.shape, float(x2), dtype=x1.dtype, device=x1.device)
    a, b = tensor_arg(x1, "nextafter"), tensor_arg(x2, "nextafter")
    if a.dtype.kind != "f" or b.dtype.kind != "f":
        raise TypeError("nextafter: real floating tensors only")
    out = result_type(a, b)
    return from_host(np.nextafter(host_value(a, "nextafter").astype(out),
                                   host_value(b, "nextafter").astype(out)), a)  # fmt: skip
