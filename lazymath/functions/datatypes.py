"""The Array API's data type functions: `finfo`, `iinfo`, `isdtype`, `result_type`, `can_cast`.

Type promotion is the standard's table (it agrees with numpy 2 wherever the standard defines a
result; mixed-kind operations the standard leaves undefined follow numpy, see
`lazymath.dtypes`). Here, below the other families, because the functions built on host numpy
(nextafter, linalg.solve, linalg.cross, searchsorted) promote their operands with `result_type`.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass

import numpy as np

from lazymath import dtypes as dt
from lazymath.tensor import Tensor


def _dtype_of(x, who: str) -> np.dtype:
    if isinstance(x, Tensor):
        return x.dtype
    if hasattr(x, "dtype") and not isinstance(x, type) and isinstance(x.dtype, np.dtype):
        return dt.as_dtype(x.dtype)
    try:
        return dt.as_dtype(x)
    except TypeError:
        raise TypeError(f"{who}: expected a lazymath dtype or tensor, got {x!r}") from None


# ----------------------------------------------------------------------------- finfo, iinfo


@dataclass(frozen=True)
class finfo_object:  # noqa: N801 (the standard's name)
    """Machine limits of a floating dtype (`finfo`): Python floats, as the standard says."""

    bits: int
    eps: float
    max: float
    min: float
    smallest_normal: float
    dtype: np.dtype


@dataclass(frozen=True)
class iinfo_object:  # noqa: N801
    """Machine limits of an integer dtype (`iinfo`)."""

    bits: int
    max: int
    min: int
    dtype: np.dtype


def _bf16_finfo():
    """ml_dtypes' finfo of bfloat16 (numpy's finfo does not know the type); a bfloat16 dtype
    exists only once ml_dtypes is imported, so this import costs nothing then."""
    import ml_dtypes

    return ml_dtypes.finfo(dt.bfloat16)


def finfo(type, /) -> finfo_object:
    """Limits of a floating dtype (or of a tensor's): bits, eps, max, min, smallest_normal.
    For a complex dtype, the limits of its real part."""
    d = _dtype_of(type, "finfo")
    if not (dt.is_float(d) or dt.is_complex(d)):
        raise TypeError(f"finfo: {d} is not a floating-point dtype (use iinfo)")
    # of a complex dtype: its real part's (finfo(complex64).dtype is float32)
    f = _bf16_finfo() if dt.is_bf16(d) else np.finfo(d)
    return finfo_object(int(f.bits), float(f.eps), float(f.max), float(f.min),
                        float(f.smallest_normal), np.dtype(f.dtype))  # fmt: skip


def iinfo(type, /) -> iinfo_object:
    """Limits of an integer dtype (or of a tensor's): bits, max, min."""
    d = _dtype_of(type, "iinfo")
    if d.kind not in "iu":
        raise TypeError(f"iinfo: {d} is not an integer dtype (use finfo)")
    i = np.iinfo(d)
    return iinfo_object(int(i.bits), int(i.max), int(i.min), d)


# ----------------------------------------------------------------------------- promotion

_KINDS = {
    "bool": lambda d: d.kind == "b",
    "signed integer": lambda d: d.kind == "i",
    "unsigned integer": lambda d: d.kind == "u",
    "integral": lambda d: d.kind in "iu",
    "real floating": dt.is_float,  # bfloat16 too (numpy files it under "V"), as in torch
    "complex floating": lambda d: d.kind == "c",
    "numeric": lambda d: d.kind in "iufc" or dt.is_bf16(d),
}


def isdtype(dtype, kind) -> bool:
    """Whether `dtype` is of `kind`: a dtype, one of 'bool', 'signed integer', 'unsigned
    integer', 'integral', 'real floating', 'complex floating', 'numeric', or a tuple of them."""
    d = _dtype_of(dtype, "isdtype") if not isinstance(dtype, Tensor) else None
    if d is None:
        raise TypeError("isdtype: expected a dtype, got a tensor (pass x.dtype)")
    if isinstance(kind, tuple):
        return builtins.any(isdtype(d, k) for k in kind)
    if isinstance(kind, str):
        if kind not in _KINDS:
            raise ValueError(f"isdtype: unknown kind {kind!r}; one of {', '.join(_KINDS)}")
        return _KINDS[kind](d)
    return d == _dtype_of(kind, "isdtype")


def _promote_defined(a: np.dtype, b: np.dtype) -> np.dtype | None:
    """The standard's promotion of two dtypes, None where it leaves the pair undefined."""
    if a == b:
        return a
    ka, kb = ("f" if dt.is_bf16(d) else d.kind for d in (a, b))
    if "b" in (ka, kb):
        return None
    if ka in "iu" and kb in "iu":
        if ka == kb:
            return a if a.itemsize >= b.itemsize else b
        u, i = (a, b) if ka == "u" else (b, a)
        if i.itemsize > u.itemsize:
            return i
        return {1: dt.int16, 2: dt.int32, 4: dt.int64}.get(u.itemsize)  # uint64 + int: undefined
    if ka in "fc" and kb in "fc":
        return np.result_type(a, b)
    return None


def result_type(*arrays_and_dtypes) -> np.dtype:
    """The dtype of an operation on these tensors, dtypes and Python scalars (the standard's
    promotion table, Python scalars weak). Pairs the standard leaves undefined (int with
    float, bool with a number) follow numpy, as lazymath's operators do."""
    if not arrays_and_dtypes:
        raise ValueError("result_type: at least one tensor or dtype is required")
    dtypes_, scalars = [], []
    for x in arrays_and_dtypes:
        if isinstance(x, (bool, int, float, complex)) and not isinstance(x, np.generic):
            scalars.append(x)
        else:
            dtypes_.append(_dtype_of(x, "result_type"))
    if not dtypes_:
        raise ValueError("result_type: at least one tensor or dtype is required (got only "
                         "Python scalars)")  # fmt: skip
    out = dtypes_[0]
    for d in dtypes_[1:]:
        p = _promote_defined(out, d)
        out = p if p is not None else dt.result_type(out, d)
    for s in scalars:  # weak: the tensor's kind wins where it can hold the value's kind
        out = dt.result_type(out, s)
    return out


def can_cast(from_, to, /) -> bool:
    """Whether `from_` (a dtype or tensor) promotes to `to` under lazymath's promotion rules,
    i.e. `result_type(from_, to) == to`.

    The standard asks for "according to type promotion rules" and leaves the mixed-kind pairs
    (bool with a number, int with float) to the library. lazymath's operators and
    `result_type` promote those as numpy does (bool + float64 -> float64), so `can_cast`
    answers the same way: True for bool -> float64 or int8 -> float32, False for any
    narrowing (float -> int, complex -> float, uint64 -> int64)."""
    a = _dtype_of(from_, "can_cast")
    b = _dtype_of(to, "can_cast")
    p = _promote_defined(a, b)
    if p is None:  # a pair the standard leaves undefined: the same answer as result_type
        p = dt.result_type(a, b)
    return p == b
