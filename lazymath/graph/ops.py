"""The graph's op vocabulary, as tables.

ELEMENTWISE maps each elementwise op to the numpy ufunc whose type resolution defines its dtype
rule (so promotion is numpy's by construction) and to its reference implementation. The names are
the same as the backend's scalar ops (`backend.kernel_ir.SCALAR_OPS`), so fusion translates a
node into an SOp by name.

Other node kinds:
  buffer, const                    leaves
  reshape, permute, expand, slice  views (zero-copy; `slice` also covers flip via step -1)
  reduce                           arg = (op, axes); output drops the reduced axes
  matmul                           srcs (a, b) with equal batch dims: (..., m, k) @ (..., k, n)
  pad, concat                      copies, arg = (widths, value) / axis
  conv1d, fft                      arg = parameters; reference numpy paths (AI CPU kernels)
"""

from __future__ import annotations

import numpy as np


def _sigmoid(x):
    """Stable on both tails: exp(x)/(1+exp(x)) for x < 0 keeps denormal results that
    1/(1+exp(-x)) would flush to zero."""
    with np.errstate(over="ignore", under="ignore"):
        e = np.exp(-np.abs(x))
        out = np.where(x >= 0, 1 / (1 + e), e / (1 + e))
    return np.asarray(out).astype(x.dtype, copy=False)


def _relu(x):
    return np.maximum(x, x.dtype.type(0))


def _leaky_relu(x, slope):
    return np.where(x >= 0, x, x * x.dtype.type(slope)).astype(x.dtype, copy=False)


def _rsqrt(x):
    return (1 / np.sqrt(x)).astype(x.dtype, copy=False)


def _reciprocal(x):
    return (1 / x).astype(x.dtype, copy=False)


# name -> (ufunc used for dtype resolution, reference implementation)
ELEMENTWISE: dict[str, tuple] = {
    "neg": (np.negative, np.negative),
    "abs": (np.absolute, np.absolute),
    "exp": (np.exp, np.exp),
    "log": (np.log, np.log),
    "sqrt": (np.sqrt, np.sqrt),
    "rsqrt": (np.sqrt, _rsqrt),
    "reciprocal": (np.sqrt, _reciprocal),  # float result like sqrt (numpy's is integer-valued)
    "sin": (np.sin, np.sin),
    "cos": (np.cos, np.cos),
    "tan": (np.tan, np.tan),
    "tanh": (np.tanh, np.tanh),
    "sigmoid": (np.exp, _sigmoid),
    "relu": (np.positive, _relu),
    "leaky_relu": (np.sqrt, _leaky_relu),
    "sign": (np.sign, np.sign),
    "floor": (np.floor, np.floor),
    "ceil": (np.ceil, np.ceil),
    "round": (np.rint, np.rint),
    "logical_not": (np.logical_not, np.logical_not),
    "add": (np.add, np.add),
    "sub": (np.subtract, np.subtract),
    "mul": (np.multiply, np.multiply),
    "div": (np.true_divide, np.true_divide),
    "floor_divide": (np.floor_divide, np.floor_divide),
    "remainder": (np.remainder, np.remainder),
    "pow": (np.power, np.power),
    "maximum": (np.maximum, np.maximum),
    "minimum": (np.minimum, np.minimum),
    "eq": (np.equal, np.equal),
    "ne": (np.not_equal, np.not_equal),
    "lt": (np.less, np.less),
    "le": (np.less_equal, np.less_equal),
    "gt": (np.greater, np.greater),
    "ge": (np.greater_equal, np.greater_equal),
    "logical_and": (np.logical_and, np.logical_and),
    "logical_or": (np.logical_or, np.logical_or),
    "where": (None, np.where),
    "cast": (None, None),
}

UNARY = frozenset(k for k, (u, _) in ELEMENTWISE.items() if u is not None and u.nin == 1)
BINARY = frozenset(k for k, (u, _) in ELEMENTWISE.items() if u is not None and u.nin == 2)
COMPARISONS = frozenset({"eq", "ne", "lt", "le", "gt", "ge"})
LOGICAL = frozenset({"logical_and", "logical_or", "logical_not"})
VIEWS = frozenset({"reshape", "permute", "expand", "slice"})
REDUCE_OPS = ("sum", "prod", "max", "min", "argmax", "argmin")


def kind(op: str) -> str:
    """Coarse class of a node op, used by fusion rules and visualization."""
    if op in ELEMENTWISE:
        return "elementwise"
    if op in VIEWS:
        return "view"
    if op in ("buffer", "const"):
        return "leaf"
    return op  # reduce, matmul, pad, concat, conv1d, fft


def ufunc_dtypes(op: str, operands: tuple) -> tuple[tuple[np.dtype, ...], np.dtype]:
    """(input loop dtypes, output dtype) numpy would use for `op` on these operands.

    Operands are dtypes (tensors) or Python scalar types (weak, as in NEP 50).
    """
    ufunc = ELEMENTWISE[op][0]
    # a Python bool is not weak in NEP 50 (it is the lowest kind already): numpy's
    # resolve_dtypes only takes the weak types int/float/complex, so pass bool as np.bool_
    operands = tuple(_BOOL if o is bool else o for o in operands)
    res = _resolve(ufunc, operands)
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
