"""The Python Array API standard (revision 2024.12) as lazymath's namespace: the data type
functions (`finfo`, `iinfo`, `isdtype`, `result_type`, `can_cast`), the inspection namespace
(`__array_namespace_info__`) and the functions of the standard that are built from the tensor
functions rather than being op records.

`x.__array_namespace__()` returns the `lazymath` module itself; everything here is re-exported
there. Type promotion is the standard's table (it agrees with numpy 2 wherever the standard
defines a result; mixed-kind operations the standard leaves undefined follow numpy, see
`lazymath.dtypes`). The default floating dtype is float32 (the NPU's).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import dtypes as dt
from .tensor import Tensor, _current_device

__array_api_version__ = "2024.12"

_DTYPE_NAMES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                "float32", "float64", "complex64", "complex128")  # fmt: skip
# the standard's dtypes (float16 is a lazymath extra, reachable as lm.float16)


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


def finfo(type, /) -> finfo_object:
    """Limits of a floating dtype (or of a tensor's): bits, eps, max, min, smallest_normal.
    For a complex dtype, the limits of its real part."""
    d = _dtype_of(type, "finfo")
    if d.kind not in "fc":
        raise TypeError(f"finfo: {d} is not a floating-point dtype (use iinfo)")
    f = np.finfo(d)
    return finfo_object(int(f.bits), float(f.eps), float(f.max), float(f.min),
                        float(f.smallest_normal), d)  # fmt: skip


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
    "real floating": lambda d: d.kind == "f",
    "complex floating": lambda d: d.kind == "c",
    "numeric": lambda d: d.kind in "iufc",
}


def isdtype(dtype, kind) -> bool:
    """Whether `dtype` is of `kind`: a dtype, one of 'bool', 'signed integer', 'unsigned
    integer', 'integral', 'real floating', 'complex floating', 'numeric', or a tuple of them."""
    d = _dtype_of(dtype, "isdtype") if not isinstance(dtype, Tensor) else None
    if d is None:
        raise TypeError("isdtype: expected a dtype, got a tensor (pass x.dtype)")
    if isinstance(kind, tuple):
        return any(isdtype(d, k) for k in kind)
    if isinstance(kind, str):
        if kind not in _KINDS:
            raise ValueError(f"isdtype: unknown kind {kind!r}; one of {', '.join(_KINDS)}")
        return _KINDS[kind](d)
    return d == _dtype_of(kind, "isdtype")


def _promote_defined(a: np.dtype, b: np.dtype) -> np.dtype | None:
    """The standard's promotion of two dtypes, None where it leaves the pair undefined."""
    if a == b:
        return a
    ka, kb = a.kind, b.kind
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
    """Whether `from_` (a dtype or tensor) promotes to `to` under the standard's table
    (casting along the promotion lattice only: no bool -> int, int -> float, float -> int)."""
    a = _dtype_of(from_, "can_cast")
    b = _dtype_of(to, "can_cast")
    p = _promote_defined(a, b)
    return p is not None and p == b  # (np.dtype(None) is float64: never compare None)


# ----------------------------------------------------------------------------- inspection


class _Info:
    """What `__array_namespace_info__()` returns: lazymath's capabilities, devices, dtypes."""

    __slots__ = ()

    def capabilities(self) -> dict:
        """'boolean indexing' and 'data-dependent shapes' work by realizing the data they
        depend on at that call (nonzero, unique_*, x[mask]); everything else stays lazy."""
        return {"boolean indexing": True, "data-dependent shapes": True, "max dimensions": 64}

    def default_device(self):
        return _current_device()

    def devices(self) -> list:
        return [_current_device()]

    def default_dtypes(self, *, device=None) -> dict:
        """float32 (the NPU's floating type), complex64, int64 (also for indexing)."""
        return {"real floating": dt.float32, "complex floating": dt.complex64,
                "integral": dt.int64, "indexing": dt.int64}  # fmt: skip

    def dtypes(self, *, device=None, kind=None) -> dict:
        names = [n for n in _DTYPE_NAMES if kind is None or isdtype(np.dtype(n), kind)]
        return {n: np.dtype(n) for n in names}


def __array_namespace_info__() -> _Info:
    """The Array API inspection namespace: capabilities, default device and dtypes."""
    return _Info()


__all__ = ["__array_api_version__", "__array_namespace_info__", "finfo", "iinfo", "isdtype",
           "result_type", "can_cast"]  # fmt: skip
