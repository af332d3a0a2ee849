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

import builtins
import math
import operator
from collections import namedtuple
from dataclasses import dataclass

import numpy as np

from lazymath import dtypes as dt
from lazymath import functions as F
from lazymath.functions import base as _base
from lazymath.functions import creation as _creation
from lazymath.functions import fft as _fft
from lazymath.functions import shapes as _shapes
from lazymath.tensor import Tensor, default_device, note_sync

__array_api_version__ = "2024.12"

_DTYPE_NAMES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                "float32", "float64", "complex64", "complex128")  # fmt: skip
# the standard's dtypes (float16 and bfloat16 are lazymath extras, lm.float16 / lm.bfloat16)


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


# ----------------------------------------------------------------------------- inspection


class _Info:
    """What `__array_namespace_info__()` returns: lazymath's capabilities, devices, dtypes."""

    __slots__ = ()

    def capabilities(self) -> dict:
        """'boolean indexing' and 'data-dependent shapes' work by realizing the data they
        depend on at that call (nonzero, unique_*, x[mask]); everything else stays lazy."""
        return {"boolean indexing": True, "data-dependent shapes": True, "max dimensions": 64}

    def default_device(self):
        return default_device()

    def devices(self) -> list:
        return [default_device()]

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


# ----------------------------------------------------------------------------- helpers


def _t(x, who: str) -> Tensor:
    if isinstance(x, Tensor):
        return x
    if isinstance(x, (bool, int, float, complex)):
        raise TypeError(f"{who}: expected a tensor, got a Python {type(x).__name__}")
    return F.asarray(x)


def _axis1(axis, ndim: int, who: str) -> int:
    return _base._axes(axis, ndim, who)[0]


def _host(x: Tensor, who: str) -> np.ndarray:
    """The realized value of `x` for a function that computes on the host (an implicit sync,
    counted like bool(t))."""
    note_sync(who, x)
    return x.numpy()


def _from_host(a, like: Tensor | None = None) -> Tensor:
    arr = np.array(a, copy=True, order="C")
    return _creation._from_numpy(arr, "lazymath", like._device if like is not None else None)


# ----------------------------------------------------------------------------- elementwise extras


def positive(x, /) -> Tensor:
    """+x (a new handle on the same values)."""
    x = _t(x, "positive")
    if x.dtype == dt.bool_:
        raise TypeError("positive: not supported for bool tensors")
    return F.astype(x, x.dtype, copy=True)


def logical_xor(x1, x2, /) -> Tensor:
    """Elementwise x1 != x2 of the truth values (numpy.logical_xor)."""
    a = x1 if not isinstance(x1, Tensor) else F.astype(x1, dt.bool_, copy=False)
    b = x2 if not isinstance(x2, Tensor) else F.astype(x2, dt.bool_, copy=False)
    return F.ne(a if isinstance(a, Tensor) else builtins.bool(a),
                b if isinstance(b, Tensor) else builtins.bool(b))  # fmt: skip


def conj(x, /) -> Tensor:
    """Complex conjugate: the input itself for real tensors; complex tensors (AI CPU dtypes)
    are conjugated on the host at the call."""
    x = _t(x, "conj")
    if not dt.is_complex(x.dtype):
        return x
    return _from_host(np.conj(_host(x, "conj")), x)


def real(x, /) -> Tensor:
    """The real part (float32 of complex64, float64 of complex128); real tensors unchanged.
    Complex tensors are read on the host at the call."""
    x = _t(x, "real")
    if not dt.is_complex(x.dtype):
        return x
    return _from_host(np.real(_host(x, "real")), x)


def imag(x, /) -> Tensor:
    """The imaginary part of a complex tensor (float32 for complex64, float64 for complex128).

    Complex tensors are read on the host at the call; a real input raises TypeError."""
    x = _t(x, "imag")
    if not dt.is_complex(x.dtype):
        raise TypeError(f"imag: expected a complex tensor, got {x.dtype}")
    return _from_host(np.imag(_host(x, "imag")), x)


def _pyscalar(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def nextafter(x1, x2, /) -> Tensor:
    """The next representable value after x1 toward x2 (computed on the host at the call).
    One of them may be a Python float or int (it takes the other's dtype)."""
    if not isinstance(x1, Tensor) and isinstance(x2, Tensor) and _pyscalar(x1):
        x1 = F.full(x2.shape, float(x1), dtype=x2.dtype, device=x2.device)
    if not isinstance(x2, Tensor) and isinstance(x1, Tensor) and _pyscalar(x2):
        x2 = F.full(x1.shape, float(x2), dtype=x1.dtype, device=x1.device)
    a, b = _t(x1, "nextafter"), _t(x2, "nextafter")
    if a.dtype.kind != "f" or b.dtype.kind != "f":
        raise TypeError("nextafter: real floating tensors only")
    out = result_type(a, b)
    return _from_host(np.nextafter(_host(a, "nextafter").astype(out),
                                   _host(b, "nextafter").astype(out)), a)  # fmt: skip


# ----------------------------------------------------------------------------- reductions


def any(x, /, *, axis=None, keepdims: bool = False) -> Tensor:  # noqa: A001
    """Whether any element (along `axis`) is nonzero; False over an empty axis. Lazy."""
    x = _t(x, "any")
    nz = F.astype(x, dt.bool_, copy=False)
    return F.gt(F.sum(F.astype(nz, dt.int64), axis, keepdims), 0)


def all(x, /, *, axis=None, keepdims: bool = False) -> Tensor:  # noqa: A001
    """Whether every element (along `axis`) is nonzero; True over an empty axis. Lazy."""
    x = _t(x, "all")
    z = F.logical_not(F.astype(x, dt.bool_, copy=False))
    return F.eq(F.sum(F.astype(z, dt.int64), axis, keepdims), 0)


def count_nonzero(x, /, *, axis=None, keepdims: bool = False) -> Tensor:
    """Number of nonzero elements along `axis` (int64). Lazy."""
    x = _t(x, "count_nonzero")
    return F.sum(F.astype(F.astype(x, dt.bool_, copy=False), dt.int64), axis, keepdims)


def _cumulative(name: str, x, axis, dtype, include_initial: bool) -> Tensor:
    x = _t(x, name)
    if axis is None:
        if x.ndim > 1:
            raise ValueError(f"{name}: axis is required for tensors of more than one dimension")
        axis = 0
    if x.ndim == 0:
        raise ValueError(f"{name}: a 0-d tensor has no axis to accumulate along")
    ax = _axis1(axis, x.ndim, name)
    if dtype is None:
        dtype = F.sum(F.zeros((1,), x.dtype)).dtype  # the sum's accumulator dtype
    out_dt = dt.as_dtype(dtype)
    add = name == "cumulative_sum"
    if not _sorting().vector_dtype(out_dt):  # no Vector instructions for it: the AI CPU
        a = _host(x, name).astype(out_dt)
        r = (np.cumsum if add else np.cumprod)(a, axis=ax, dtype=out_dt)  # numpy's own
        # default would widen small integers (uint8 -> uint64), not the dtype asked for
    else:
        r = _scan(F.astype(x, out_dt, copy=False), ax, "add" if add else "mul")
    if include_initial:
        shape = list(x.shape)
        shape[ax] = 1
        first = np.full(shape, 0 if add else 1, out_dt)
        if isinstance(r, np.ndarray):
            r = np.concatenate([first, r], axis=ax)
        else:
            r = F.concat([F.asarray(first, device=x.device), r], ax)
    return _from_host(r, x) if isinstance(r, np.ndarray) else r


def _sorting():
    """The Vector kernels of scans, sorts and searches (loaded on first use: they build
    `lm.kernel` objects)."""
    from lazymath import sorting

    return sorting


def _lines(x: Tensor, ax: int, first: bool) -> Tensor:
    """x with axis `ax` moved first (first=True) or last, dense, as a 2-d tensor."""
    perm = [i for i in range(x.ndim) if i != ax]
    perm = [ax, *perm] if first else [*perm, ax]
    y = F.permute_dims(x, perm) if perm != list(range(x.ndim)) else x
    n = x.shape[ax]
    rest = math.prod(x.shape) // n if n else math.prod(s for i, s in enumerate(x.shape) if i != ax)
    y = _dense(y) if y.node.op == "permute" else y
    return F.reshape(y, (n, rest) if first else (rest, n))


def _unlines(y: Tensor, x_shape: tuple, ax: int, first: bool) -> Tensor:
    """The inverse of `_lines` for a result of x's shape."""
    perm = [i for i in range(len(x_shape)) if i != ax]
    order = [ax, *perm] if first else [*perm, ax]
    y = F.reshape(y, tuple(x_shape[i] for i in order))
    inv = [order.index(i) for i in range(len(x_shape))]
    return F.permute_dims(y, inv) if inv != list(range(len(x_shape))) else y


def _scan(x: Tensor, ax: int, op: str) -> Tensor:
    """Cumulative sum/product along `ax` on the Vector unit (sorting.scan_add)."""
    if x.size == 0:
        return F.astype(x, x.dtype, copy=True)
    y = _sorting().scan_rows(_lines(x, ax, True), op)
    return _unlines(y, x.shape, ax, True)


def cumulative_sum(x, /, *, axis=None, dtype=None, include_initial: bool = False) -> Tensor:
    """Running sum along `axis` (lazy). A Vector scan kernel (`sorting.scan_add`: vectorized
    across the other axes, numpy's order of additions) for the AI Core dtypes; float64,
    int16, unsigned and complex results run numpy on the AI CPU at the call (they realize x):
    the Vector unit has no instructions for them."""
    return _cumulative("cumulative_sum", x, axis, dtype, include_initial)


def cumulative_prod(x, /, *, axis=None, dtype=None, include_initial: bool = False) -> Tensor:
    """Running product along `axis`: the scan kernel of cumulative_sum with a multiply (the
    same dtype rule: other dtypes run numpy on the AI CPU at the call)."""
    return _cumulative("cumulative_prod", x, axis, dtype, include_initial)


# ----------------------------------------------------------------------------- sorting, searching


def _argsort_host(a: np.ndarray, ax: int, descending: bool) -> np.ndarray:
    """Stable sort order: ties keep their order, also descending (the reversed stable sort
    of the reversed array, re-indexed)."""
    if not descending:
        return np.argsort(a, axis=ax, kind="stable").astype(np.int64)
    n = a.shape[ax]
    idx = np.argsort(np.flip(a, ax), axis=ax, kind="stable")
    return (n - 1 - np.flip(idx, ax)).astype(np.int64)


_sort_tables: dict = {}


def _sort_vector(x: Tensor, ax: int, descending: bool) -> tuple[Tensor, Tensor] | None:
    """(sorted, indices) by the bitonic Vector kernel, or None where it does not apply (not
    an AI Core dtype, or rows longer than sorting.SORT_MAX: the AI CPU sorts those)."""
    srt = _sorting()
    work = srt.order_dtype(x.dtype)  # bool, int16 and unsigned widen (the order is kept)
    n = x.shape[ax]
    if work is None or n > srt.SORT_MAX:
        return None
    if x.size == 0:
        return F.astype(x, x.dtype, copy=True), F.zeros(x.shape, dt.int64)
    size = 1 << (n - 1).bit_length()
    rows = _lines(F.astype(x, work, copy=False), ax, False)
    # the kernel pads rows to `size` with a value that sorts after every element (ties with
    # it go by index: the pads come last)
    if work.kind == "f":
        pad = -math.inf if descending else math.nan
    else:
        pad = int(np.iinfo(work).min if descending else np.iinfo(work).max)
    key = (size, x._device)
    tabs = _sort_tables.get(key)
    if tabs is None:
        perm, keep = srt.stage_tables(size)
        tabs = (F.asarray(perm, device=x.device), F.asarray(keep, device=x.device))
        tabs[0].realize()
        tabs[1].realize()
        _sort_tables[key] = tabs
    vals, idx = srt.bitonic_sort(rows, *tabs, descending=bool(descending), pad=pad)
    vals = _unlines(vals, x.shape, ax, False)
    idx = _unlines(F.astype(idx, dt.int64), x.shape, ax, False)
    return (F.astype(vals, x.dtype, copy=False) if work != x.dtype else vals), idx


def sort(x, /, *, axis: int = -1, descending: bool = False, stable: bool = True) -> Tensor:
    """Sorted copy along `axis` (NaNs last, first when descending; stable). Lazy: a bitonic
    Vector kernel (`sorting.bitonic_sort`) for rows up to `sorting.SORT_MAX` elements (one row
    resident in UB), in x's dtype or a wider one that keeps the order (bool, int16, uint8/16/32);
    float64, uint64 and longer rows run numpy on the AI CPU at the call (they realize x)."""
    x = _t(x, "sort")
    if x.ndim == 0:
        raise ValueError("sort: a 0-d tensor has no axis")
    ax = _axis1(axis, x.ndim, "sort")
    vec = _sort_vector(x, ax, descending)
    if vec is not None:
        return vec[0]
    a = _host(x, "sort")
    if not descending:
        return _from_host(np.sort(a, axis=ax, kind="stable"), x)
    return _from_host(np.take_along_axis(a, _argsort_host(a, ax, True), ax), x)


def argsort(x, /, *, axis: int = -1, descending: bool = False, stable: bool = True) -> Tensor:
    """Indices that sort `x` along `axis` (int64; stable: ties keep their order, also
    descending). The bitonic Vector kernel of `sort` (same limits: other dtypes and longer
    rows run numpy on the AI CPU at the call)."""
    x = _t(x, "argsort")
    if x.ndim == 0:
        raise ValueError("argsort: a 0-d tensor has no axis")
    ax = _axis1(axis, x.ndim, "argsort")
    vec = _sort_vector(x, ax, descending)
    if vec is not None:
        return vec[1]
    return _from_host(_argsort_host(_host(x, "argsort"), ax, descending), x)


def searchsorted(x1, x2, /, *, side: str = "left", sorter=None) -> Tensor:
    """Insertion indices of x2 into the sorted 1-d x1 (int64; NaN sorts last). Lazy: a
    vectorized binary search on the Vector unit (`sorting.search_sorted`, x1 resident in UB)
    for the AI Core dtypes and x1 up to `sorting.SEARCH_MAX` elements; other cases run numpy on
    the AI CPU at the call. `sorter` gathers x1 first (`take`: on the host)."""
    a, v = _t(x1, "searchsorted"), _t(x2, "searchsorted")
    if a.ndim != 1:
        raise ValueError(f"searchsorted: x1 must be 1-d, got shape {a.shape}")
    if side not in ("left", "right"):
        raise ValueError(f"searchsorted: side must be 'left' or 'right', got {side!r}")
    if sorter is not None:
        a = take(a, _t(sorter, "searchsorted"), axis=0)
    common = result_type(a, v)
    srt = _sorting()
    work = srt.order_dtype(common) if common != dt.bool_ else None
    if work is not None and a.shape[0] <= srt.SEARCH_MAX:
        if v.size == 0 or a.shape[0] == 0:
            return F.zeros(v.shape, dt.int64)
        a, v = F.astype(a, common, copy=False), F.astype(v, common, copy=False)
        a, v = F.astype(a, work, copy=False), F.astype(v, work, copy=False)
        r = srt.search_sorted(a, F.reshape(_dense_view(v), (-1,)), right=side == "right")
        return F.astype(F.reshape(r, v.shape), dt.int64)
    r = np.searchsorted(_host(a, "searchsorted"), _host(v, "searchsorted"), side=side)
    return _from_host(np.asarray(r, dtype=np.int64), v)


def nonzero(x, /) -> tuple:
    """Indices of the nonzero elements, one int64 tensor per axis. The output shape depends on
    the data: it realizes x at the call."""
    x = _t(x, "nonzero")
    if x.ndim == 0:
        raise ValueError("nonzero: 0-d tensors are not allowed (the standard's rule)")
    return tuple(_from_host(i.astype(np.int64), x) for i in np.nonzero(_host(x, "nonzero")))


def _unique(x, who: str):
    x = _t(x, who)
    a = _host(x, who).reshape(-1)
    vals, idx, inv, counts = np.unique(a, return_index=True, return_inverse=True,
                                       return_counts=True, equal_nan=False)  # fmt: skip
    return x, vals, idx, inv, counts


# the standard's named results: tuples whose fields also read by name
UniqueAllResult = namedtuple("UniqueAllResult", "values indices inverse_indices counts")
UniqueCountsResult = namedtuple("UniqueCountsResult", "values counts")
UniqueInverseResult = namedtuple("UniqueInverseResult", "values inverse_indices")


def unique_all(x, /) -> UniqueAllResult:
    """values, first indices, inverse indices (x's shape), counts. Data-dependent: realizes x."""
    x, v, i, inv, c = _unique(x, "unique_all")
    return UniqueAllResult._make((_from_host(v, x), _from_host(i.astype(np.int64), x),
                            _from_host(inv.reshape(x.shape).astype(np.int64), x),
                            _from_host(c.astype(np.int64), x)))  # fmt: skip


def unique_counts(x, /) -> UniqueCountsResult:
    """values and counts. Data-dependent: realizes x."""
    x, v, _, _, c = _unique(x, "unique_counts")
    return UniqueCountsResult._make((_from_host(v, x), _from_host(c.astype(np.int64), x)))


def unique_inverse(x, /) -> UniqueInverseResult:
    """values and inverse indices (x's shape). Data-dependent: realizes x."""
    x, v, _, inv, _ = _unique(x, "unique_inverse")
    return UniqueInverseResult._make(
        (_from_host(v, x), _from_host(inv.reshape(x.shape).astype(np.int64), x))
    )


def unique_values(x, /) -> Tensor:
    """The distinct values, sorted. Data-dependent: realizes x."""
    x, v, *_ = _unique(x, "unique_values")
    return _from_host(v, x)


# ----------------------------------------------------------------------------- indexing


def take(x, indices, /, *, axis=None) -> Tensor:
    """Elements of x at integer `indices` along `axis` (1-d x may omit it). A gather: computed
    on the host at the call (it realizes x and the indices)."""
    x, i = _t(x, "take"), _t(indices, "take")
    if i.dtype.kind not in "iu":
        raise IndexError(f"take: indices must be integers, got {i.dtype}")
    if axis is None:
        if x.ndim != 1:
            raise ValueError("take: axis is required for tensors of more than one dimension")
        axis = 0
    ax = _axis1(axis, x.ndim, "take")
    try:
        r = np.take(_host(x, "take"), _host(i, "take"), axis=ax)
    except IndexError as e:
        raise IndexError(f"take: {e}") from None
    return _from_host(r, x)


def take_along_axis(x, indices, /, *, axis: int = -1) -> Tensor:
    """Gather along `axis` with an index tensor of x's rank. Realizes both at the call."""
    x, i = _t(x, "take_along_axis"), _t(indices, "take_along_axis")
    if i.dtype.kind not in "iu" or i.ndim != x.ndim:
        raise IndexError("take_along_axis: indices must be integers of x's rank")
    ax = _axis1(axis, x.ndim, "take_along_axis")
    try:
        r = np.take_along_axis(_host(x, "take_along_axis"), _host(i, "take_along_axis"), ax)
    except (IndexError, ValueError) as e:
        raise IndexError(f"take_along_axis: {e}") from None
    return _from_host(r, x)


# ----------------------------------------------------------------------------- manipulation


def moveaxis(x, source, destination, /) -> Tensor:
    """Move axes to new positions (a lazy permutation)."""
    x = _t(x, "moveaxis")
    src = (source,) if isinstance(source, int) else tuple(source)
    dst = (destination,) if isinstance(destination, int) else tuple(destination)
    if len(src) != len(dst):
        raise ValueError("moveaxis: source and destination need the same number of axes")
    src = [_base._axes(a, x.ndim, "moveaxis")[0] for a in src]
    dst = [_base._axes(a, x.ndim, "moveaxis")[0] for a in dst]
    if len(set(src)) != len(src) or len(set(dst)) != len(dst):
        raise ValueError("moveaxis: repeated axis")
    order = [a for a in range(x.ndim) if a not in src]
    for d, s_ in sorted(zip(dst, src)):
        order.insert(d, s_)
    return F.permute_dims(x, order)


def matrix_transpose(x, /) -> Tensor:
    """Swap the last two axes (lazy)."""
    x = _t(x, "matrix_transpose")
    if x.ndim < 2:
        raise ValueError(f"matrix_transpose: needs at least 2 dimensions, got {x.shape}")
    return F.swapaxes(x, -1, -2)


def unstack(x, /, *, axis: int = 0) -> tuple:
    """The slices of x along `axis` (lazy views)."""
    x = _t(x, "unstack")
    if x.ndim == 0:
        raise ValueError("unstack: a 0-d tensor has no axis")
    ax = _axis1(axis, x.ndim, "unstack")
    return tuple(x[(slice(None),) * ax + (i,)] for i in range(x.shape[ax]))


def broadcast_arrays(*arrays) -> list:
    """The tensors broadcast to their common shape (lazy views)."""
    ts = [_t(a, "broadcast_arrays") for a in arrays]
    shape = F.broadcast_shapes(*(t.shape for t in ts), op="broadcast_arrays")
    return [F.broadcast_to(t, shape) for t in ts]


def meshgrid(*arrays, indexing: str = "xy") -> list:
    """Coordinate grids from 1-d tensors (lazy broadcasts); 'xy' swaps the first two axes."""
    if indexing not in ("xy", "ij"):
        raise ValueError(f"meshgrid: indexing must be 'xy' or 'ij', got {indexing!r}")
    ts = [_t(a, "meshgrid") for a in arrays]
    for t in ts:
        if t.ndim != 1:
            raise ValueError(f"meshgrid: inputs must be 1-d, got shape {t.shape}")
    if ts and builtins.len({t.dtype for t in ts}) > 1:
        raise TypeError("meshgrid: inputs must share a dtype")
    n = len(ts)
    shape = [t.shape[0] for t in ts]
    if indexing == "xy" and n >= 2:
        shape[0], shape[1] = shape[1], shape[0]
    out = []
    for k, t in enumerate(ts):
        pos = k
        if indexing == "xy" and n >= 2 and k < 2:
            pos = 1 - k
        r = [1] * n
        r[pos] = t.shape[0]
        out.append(F.broadcast_to(F.reshape(t, tuple(r)), tuple(shape)))
    return out


def _tri_mask(shape: tuple, k: int, lower: bool) -> Tensor:
    m, n = shape[-2], shape[-1]
    mask = np.tri(m, n, k, dtype=bool) if lower else ~np.tri(m, n, k - 1, dtype=bool)
    return F.tensor(mask)


def tril(x, /, *, k: int = 0) -> Tensor:
    """Lower triangle (elements above the k-th diagonal zeroed): a lazy where() with a mask."""
    x = _t(x, "tril")
    if x.ndim < 2:
        raise ValueError(f"tril: needs at least 2 dimensions, got {x.shape}")
    return F.where(_tri_mask(x.shape, operator.index(k), True), x, F.zeros((), x.dtype))


def triu(x, /, *, k: int = 0) -> Tensor:
    """Upper triangle (elements below the k-th diagonal zeroed): a lazy where() with a mask."""
    x = _t(x, "triu")
    if x.ndim < 2:
        raise ValueError(f"triu: needs at least 2 dimensions, got {x.shape}")
    return F.where(_tri_mask(x.shape, operator.index(k), False), x, F.zeros((), x.dtype))


def roll(x, /, shift, *, axis=None) -> Tensor:
    """Shift elements along axes, wrapping around (lazy slices and a concat)."""
    x = _t(x, "roll")
    if axis is None:
        return F.reshape(roll(F.reshape(x, (-1,)), shift, axis=0), x.shape)
    shifts = (shift,) if isinstance(shift, int) else tuple(shift)
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    if len(shifts) == 1 and len(axes) > 1:
        shifts = shifts * len(axes)
    if len(shifts) != len(axes):
        raise ValueError("roll: shift and axis must have the same length")
    out = x
    for sh, ax in zip(shifts, axes):
        ax = _base._axes(ax, x.ndim, "roll")[0]
        n = x.shape[ax]
        if n == 0:
            continue
        sh = operator.index(sh) % n
        if sh == 0:
            continue
        pre = (slice(None),) * ax
        out = F.concat([out[pre + (slice(n - sh, None),)], out[pre + (slice(0, n - sh),)]], ax)
    return out


def tile(x, repetitions, /) -> Tensor:
    """x repeated along each axis (lazy: a broadcast and a reshape)."""
    x = _t(x, "tile")
    reps = tuple(operator.index(r) for r in repetitions)
    if builtins.any(r < 0 for r in reps):
        raise ValueError(f"tile: repetitions must be non-negative, got {reps}")
    nd = builtins.max(x.ndim, len(reps))
    reps = (1,) * (nd - len(reps)) + reps
    shape = (1,) * (nd - x.ndim) + x.shape
    inter = []
    for s_ in shape:
        inter += [1, s_]
    y = F.reshape(x, tuple(inter))
    big = []
    for r, s_ in zip(reps, shape):
        big += [r, s_]
    y = F.broadcast_to(y, tuple(big))
    return F.reshape(_dense(y), tuple(r * s_ for r, s_ in zip(reps, shape)))


def _dense(x: Tensor) -> Tensor:
    """A broadcast view made dense, so a reshape can merge its axes (a fused copy)."""
    return F.add(x, F.zeros((), x.dtype)) if x.dtype != dt.bool_ else F.logical_or(x, False)


def repeat(x, repeats, /, *, axis=None) -> Tensor:
    """Each element repeated `repeats` times along `axis` (flattened if None). Lazy for an
    integer count; a tensor of counts (data-dependent shape) realizes at the call."""
    x = _t(x, "repeat")
    if axis is None:
        x, axis = F.reshape(x, (-1,)), 0
    ax = _axis1(axis, x.ndim, "repeat")
    if isinstance(repeats, Tensor) or not isinstance(repeats, (int, np.integer)):
        r = _host(_t(repeats, "repeat"), "repeat") if isinstance(repeats, Tensor) else repeats
        return _from_host(np.repeat(_host(x, "repeat"), r, axis=ax), x)
    r = operator.index(repeats)
    if r < 0:
        raise ValueError(f"repeat: repeats must be non-negative, got {r}")
    y = F.expand_dims(x, ax + 1)
    shape = list(y.shape)
    shape[ax + 1] = r
    y = F.broadcast_to(y, tuple(shape))
    out = list(x.shape)
    out[ax] *= r
    return F.reshape(_dense(y), tuple(out))


def diff(x, /, *, axis: int = -1, n: int = 1, prepend=None, append=None) -> Tensor:
    """n-th forward difference along `axis` (lazy slices and subtractions)."""
    x = _t(x, "diff")
    if x.ndim == 0:
        raise ValueError("diff: a 0-d tensor has no axis")
    ax = _axis1(axis, x.ndim, "diff")
    n = operator.index(n)
    if n < 0:
        raise ValueError(f"diff: n must be non-negative, got {n}")
    parts = [p for p in (prepend, x, append) if p is not None]
    if len(parts) > 1:
        x = F.concat([_t(p, "diff") for p in parts], ax)
    pre = (slice(None),) * ax
    for _ in range(n):
        if x.shape[ax] == 0:
            break
        x = F.sub(x[pre + (slice(1, None),)], x[pre + (slice(None, -1),)])
    return x


def isin(x1, x2, /, *, invert: bool = False) -> Tensor:
    """Whether each element of x1 is in x2 (lazy: a broadcast compare and an any())."""
    a, b = _t(x1, "isin"), _t(x2, "isin")
    flat = F.reshape(b, (-1,))
    hit = F.eq(F.expand_dims(a, -1), flat)
    found = any(hit, axis=-1)
    return F.logical_not(found) if invert else found


# ----------------------------------------------------------------------------- linear algebra


def tensordot(x1, x2, /, *, axes=2) -> Tensor:
    """Sum products over the last `axes` axes of x1 and the first of x2, or over the given
    pairs (lazy: permute, reshape, one matmul)."""
    a, b = _t(x1, "tensordot"), _t(x2, "tensordot")
    if isinstance(axes, int):
        if axes < 0:
            raise ValueError("tensordot: axes must be non-negative")
        ax_a = list(range(a.ndim - axes, a.ndim))
        ax_b = list(range(axes))
    else:
        ax_a, ax_b = ([axes[0]] if isinstance(axes[0], int) else list(axes[0]),
                      [axes[1]] if isinstance(axes[1], int) else list(axes[1]))  # fmt: skip
        ax_a = [_base._axes(v, a.ndim, "tensordot")[0] for v in ax_a]
        ax_b = [_base._axes(v, b.ndim, "tensordot")[0] for v in ax_b]
    if len(ax_a) != len(ax_b):
        raise ValueError("tensordot: the two axes lists differ in length")
    for i, j in zip(ax_a, ax_b):
        if a.shape[i] != b.shape[j]:
            raise ValueError(f"tensordot: shape mismatch on summed axes {a.shape} {b.shape}")
    free_a = [d for d in range(a.ndim) if d not in ax_a]
    free_b = [d for d in range(b.ndim) if d not in ax_b]
    k = math.prod(a.shape[d] for d in ax_a)
    am = F.reshape(_dense_view(F.permute_dims(a, free_a + ax_a)),
                   (math.prod(a.shape[d] for d in free_a), k))  # fmt: skip
    bm = F.reshape(_dense_view(F.permute_dims(b, ax_b + free_b)),
                   (k, math.prod(b.shape[d] for d in free_b)))  # fmt: skip
    out = F.matmul(am, bm)
    return F.reshape(out, tuple(a.shape[d] for d in free_a) + tuple(b.shape[d] for d in free_b))


def _dense_view(x: Tensor) -> Tensor:
    return x if x.node.op != "permute" else _dense(x)


def vecdot(x1, x2, /, *, axis: int = -1) -> Tensor:
    """sum(conj(x1) * x2) along `axis`, broadcasting the others (lazy, one fused kernel)."""
    a, b = _t(x1, "vecdot"), _t(x2, "vecdot")
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError("vecdot: inputs must have at least one dimension")
    nd = builtins.max(a.ndim, b.ndim)
    if not -nd <= axis < 0 and not 0 <= axis < builtins.min(a.ndim, b.ndim):
        raise ValueError(f"vecdot: axis {axis} out of range")
    if a.shape[axis] != b.shape[axis]:
        raise ValueError(f"vecdot: sizes {a.shape[axis]} and {b.shape[axis]} differ on axis "
                         f"{axis}")  # fmt: skip
    ax = axis if axis < 0 else axis - a.ndim
    p = F.mul(conj(a), b)
    return F.astype(F.sum(p, ax), p.dtype, copy=False)  # the operands' dtype, not the sum's


def _float_host(x: Tensor, who: str) -> tuple[np.ndarray, np.dtype]:
    """x on the host for a numpy.linalg routine, and the dtype of the result (float16 is
    computed in float32 and rounded back)."""
    if x.dtype.kind not in "fc":
        raise TypeError(f"linalg.{who}: expected a floating-point tensor, got {x.dtype}")
    a = _host(x, f"linalg.{who}")
    return (a.astype(np.float32) if a.dtype == np.float16 else a), x.dtype


class _Linalg:
    """The Array API `linalg` extension (`lm.linalg`).

    Lazy (graph ops that fuse): matmul, matrix_transpose, tensordot, vecdot, outer, diagonal,
    trace, vector_norm, matrix_norm ('fro', 1, -1, inf, -inf). The factorizations and solvers
    (cholesky, det, eigh, eigvalsh, inv, pinv, qr, slogdet, solve, svd, svdvals, matrix_rank,
    matrix_power, the 2/-2/'nuc' matrix norms, cross) run numpy.linalg on the host at the call
    (they realize their inputs); float16 goes through float32."""

    matmul = staticmethod(F.matmul)
    matrix_transpose = staticmethod(matrix_transpose)
    tensordot = staticmethod(tensordot)
    vecdot = staticmethod(vecdot)

    @staticmethod
    def outer(x1, x2, /) -> Tensor:
        a, b = _t(x1, "outer"), _t(x2, "outer")
        if a.ndim != 1 or b.ndim != 1:
            raise ValueError("linalg.outer: inputs must be 1-d")
        return F.mul(F.reshape(a, (-1, 1)), F.reshape(b, (1, -1)))

    @staticmethod
    def diagonal(x, /, *, offset: int = 0) -> Tensor:
        """The k-th diagonal of the last two axes (a lazy strided view)."""
        x = _t(x, "diagonal")
        if x.ndim < 2:
            raise ValueError(f"linalg.diagonal: needs at least 2 dimensions, got {x.shape}")
        m, n = x.shape[-2:]
        k = operator.index(offset)
        start = k if k >= 0 else -k * n
        count = builtins.max(0, builtins.min(m, n - k) if k >= 0 else builtins.min(m + k, n))
        flat = F.reshape(_dense_view(x), x.shape[:-2] + (m * n,))
        if count == 0:
            return F.zeros(x.shape[:-2] + (0,), x.dtype)
        spec = tuple((0, s_, 1) for s_ in x.shape[:-2]) + ((start, count, n + 1),)
        return _shapes._slice_node(flat, spec)

    @staticmethod
    def trace(x, /, *, offset: int = 0, dtype=None) -> Tensor:
        return F.sum(_Linalg.diagonal(x, offset=offset), -1, dtype=dtype)

    @staticmethod
    def vector_norm(x, /, *, axis=None, keepdims: bool = False, ord=2) -> Tensor:  # noqa: A002
        """The p-norm over `axis` (all by default): lazy abs, power, sum."""
        x = _t(x, "vector_norm")
        if x.dtype.kind not in "fc":
            raise TypeError(f"linalg.vector_norm: expected a floating tensor, got {x.dtype}")
        a = F.abs(x)
        if ord == math.inf:
            return F.max(a, axis, keepdims)
        if ord == -math.inf:
            return F.min(a, axis, keepdims)
        if ord == 0:
            return F.astype(count_nonzero(a, axis=axis, keepdims=keepdims), a.dtype)
        if ord == 1:
            return F.sum(a, axis, keepdims)
        if ord == 2:
            return F.sqrt(F.sum(F.mul(a, a), axis, keepdims))
        p = float(ord)
        # the root as exp(log(s) / p): a pow composite on both sides of one reduce kernel
        # trips a duplicate-buffer bug of the reduce template (on main before issue 16)
        return F.exp(F.mul(F.log(F.sum(F.pow(a, p), axis, keepdims)), 1.0 / p))

    @staticmethod
    def matrix_norm(x, /, *, keepdims: bool = False, ord="fro") -> Tensor:  # noqa: A002
        x = _t(x, "matrix_norm")
        if x.ndim < 2:
            raise ValueError("linalg.matrix_norm: needs at least 2 dimensions")
        a = F.abs(x)
        if ord == "fro":
            out = F.sqrt(F.sum(F.mul(a, a), (-2, -1)))
        elif ord in (1, -1):
            s_ = F.sum(a, -2)
            out = F.max(s_, -1) if ord == 1 else F.min(s_, -1)
        elif ord in (math.inf, -math.inf):
            s_ = F.sum(a, -1)
            out = F.max(s_, -1) if ord == math.inf else F.min(s_, -1)
        else:
            h, d = _float_host(x, "matrix_norm")
            out = _from_host(np.linalg.norm(h, ord=ord, axis=(-2, -1)).astype(
                np.finfo(d).dtype if d.kind == "c" else d), x)  # fmt: skip
        if keepdims:
            out = F.reshape(out, out.shape + (1, 1))
        return out

    @staticmethod
    def cross(x1, x2, /, *, axis: int = -1) -> Tensor:
        a, b = _t(x1, "cross"), _t(x2, "cross")
        if a.shape[axis] != 3 or b.shape[axis] != 3:
            raise ValueError("linalg.cross: the axis must have size 3")
        r = np.cross(_host(a, "cross"), _host(b, "cross"), axis=axis)
        return _from_host(r.astype(result_type(a, b)), a)

    @staticmethod
    def _host_fn(name, fn, x, *, real=False):
        h, d = _float_host(_t(x, name), name)
        out = fn(h)
        if real and d.kind == "c":
            d = np.finfo(d).dtype
        if isinstance(out, tuple):  # a real part of the result stays real (svd's S, eigh's
            # eigenvalues, slogdet's logabsdet of a complex x), as the standard says
            to = {"c": d, "f": np.finfo(d).dtype}
            outs = [np.asarray(o) for o in out]
            return tuple(_from_host(o.astype(to.get(o.dtype.kind, o.dtype)), x) for o in outs)
        return _from_host(np.asarray(out).astype(d), x)

    @staticmethod
    def cholesky(x, /, *, upper: bool = False) -> Tensor:
        out = _Linalg._host_fn("cholesky", np.linalg.cholesky, x)
        return matrix_transpose(conj(out)) if upper else out

    @staticmethod
    def det(x, /) -> Tensor:
        return _Linalg._host_fn("det", np.linalg.det, x)

    @staticmethod
    def inv(x, /) -> Tensor:
        return _Linalg._host_fn("inv", np.linalg.inv, x)

    @staticmethod
    def pinv(x, /, *, rtol=None) -> Tensor:
        r = 1e-15 if rtol is None else (_host(rtol, "pinv") if isinstance(rtol, Tensor) else rtol)
        return _Linalg._host_fn("pinv", lambda a: np.linalg.pinv(a, rcond=r), x)

    @staticmethod
    def eigh(x, /):
        w, v = _Linalg._host_fn("eigh", np.linalg.eigh, x)
        return _EighResult._make((w, v))

    @staticmethod
    def eigvalsh(x, /) -> Tensor:
        return _Linalg._host_fn("eigvalsh", np.linalg.eigvalsh, x, real=True)

    @staticmethod
    def qr(x, /, *, mode: str = "reduced"):
        return _QRResult._make(
            _Linalg._host_fn("qr", lambda a: tuple(np.linalg.qr(a, mode=mode)), x)
        )

    @staticmethod
    def slogdet(x, /):
        """(sign, logabsdet): `sign` in x's dtype, `logabsdet` real (float32 for complex64)."""
        sd = _Linalg._host_fn("slogdet", lambda a: tuple(np.linalg.slogdet(a)), x)
        return _SlogdetResult._make(sd)

    @staticmethod
    def svd(x, /, *, full_matrices: bool = True):
        return _SVDResult._make(_Linalg._host_fn(
            "svd", lambda a: tuple(np.linalg.svd(a, full_matrices=full_matrices)), x))  # fmt: skip

    @staticmethod
    def svdvals(x, /) -> Tensor:
        return _Linalg._host_fn("svdvals", lambda a: np.linalg.svd(a, compute_uv=False), x,
                                real=True)  # fmt: skip

    @staticmethod
    def solve(x1, x2, /) -> Tensor:
        a, b = _t(x1, "solve"), _t(x2, "solve")
        ha, d = _float_host(a, "solve")
        hb, _ = _float_host(b, "solve")
        if b.ndim == 1:
            r = np.linalg.solve(ha, hb[..., None])[..., 0]
        else:
            r = np.linalg.solve(ha, hb)
        return _from_host(r.astype(result_type(a, b)), a)

    @staticmethod
    def matrix_rank(x, /, *, rtol=None) -> Tensor:
        h, _ = _float_host(_t(x, "matrix_rank"), "matrix_rank")
        return _from_host(np.asarray(np.linalg.matrix_rank(h, rtol=rtol)).astype(np.int64), x)

    @staticmethod
    def matrix_power(x, n, /) -> Tensor:
        x = _t(x, "matrix_power")
        n = operator.index(n)
        if n < 0:
            return _Linalg.matrix_power(_Linalg.inv(x), -n)
        out = None
        base = x
        while n:
            if n & 1:
                out = base if out is None else F.matmul(out, base)
            n >>= 1
            if n:
                base = F.matmul(base, base)
        if out is None:
            eye = F.eye(x.shape[-1], dtype=x.dtype)
            return F.broadcast_to(eye, x.shape)
        return out


_EighResult = namedtuple("EighResult", "eigenvalues eigenvectors")
_QRResult = namedtuple("QRResult", "Q R")
_SlogdetResult = namedtuple("SlogdetResult", "sign logabsdet")
_SVDResult = namedtuple("SVDResult", "U S Vh")


linalg = _Linalg()


# ----------------------------------------------------------------------------- fft extension

_SWAP_NORM = {None: "forward", "backward": "forward", "ortho": "ortho", "forward": "backward"}


def _fft_s_axes(who: str, x: Tensor, s, axes, last_real: bool = False) -> tuple[list, list]:
    """The (axes, lengths) of an n-dimensional transform: axes None is every axis (the last
    len(s) if only s is given, as numpy), -1 in s is the input's length (for irfftn's last
    axis: 2 * (M - 1))."""
    if axes is None:
        axes = range(x.ndim) if s is None else range(x.ndim - len(s), x.ndim)
    if isinstance(axes, (int, np.integer)) or not isinstance(axes, (tuple, list, range)):
        raise TypeError(f"fft.{who}: axes must be a sequence of ints, got {axes!r}")
    axes = [_base._axes(a, x.ndim, f"fft.{who}")[0] for a in axes]
    if s is None:
        s = [-1] * len(axes)
    elif not isinstance(s, (tuple, list)):
        raise TypeError(f"fft.{who}: s must be a sequence of ints, got {s!r}")
    elif len(s) != len(axes):
        raise ValueError(f"fft.{who}: s {tuple(s)} and axes {tuple(axes)} differ in length")
    out = []
    for i, (a, n) in enumerate(zip(axes, s)):
        n = operator.index(n)
        if n == -1:
            m = x.shape[a]
            n = 2 * (m - 1) if last_real and i == len(axes) - 1 else m
        out.append(n)
    return axes, out


def _reverse_mod(x: Tensor, ax: int) -> Tensor:
    """y[t] = x[(-t) mod n] along ax (for real signals: the conjugate of the spectrum)."""
    return roll(F.flip(x, axis=ax), 1, axis=ax)


def _fit(x: Tensor, ax: int, n: int) -> Tensor:
    """Crop or zero-pad axis `ax` to n (numpy.fft's `n`)."""
    m = x.shape[ax]
    if n < m:
        return x[(slice(None),) * ax + (slice(0, n),)]
    if n > m:
        width = [(0, 0)] * x.ndim
        width[ax] = (0, n - m)
        return F.pad(x, width)
    return x


class _FFTExtension(_fft._FFT):
    """The Array API `fft` extension (`lm.fft`): numpy.fft semantics. fft, ifft, rfft, irfft,
    fft2, ifft2 are lazymath's transforms (Cube DFT matmuls and Vector twiddles, or the AI CPU:
    see docs/fft_conv.md); the rest are built on them, lazily: fftn/ifftn/rfftn/irfftn apply the
    1-d transform axis by axis, hfft/ihfft use that the spectrum of a real signal reversed in
    time (t -> -t mod n, a flip and a roll) is the conjugate spectrum, fftshift/ifftshift are
    rolls, fftfreq/rfftfreq are constants. Results: complex64 for float16/float32/complex64
    inputs, complex128 for float64/complex128 (real results: float32 / float64)."""

    @staticmethod
    def _complex_n(kind: str, x, s, axes, norm) -> Tensor:
        """fftn / ifftn: the 1-d transform `kind` axis by axis, last axis first."""
        x = _t(x, f"fft.{kind}n")
        axes, s = _fft_s_axes(f"{kind}n", x, s, axes)
        out = x
        for a, n in reversed(list(zip(axes, s))):
            out = _fft._fft_common(kind, out, n, a, norm)
        return out if axes else F.astype(x, _fft._fft_out_dtype(kind, x.dtype))

    @staticmethod
    def fftn(x, /, *, s=None, axes=None, norm="backward") -> Tensor:
        """The n-dimensional DFT over `axes` (all by default; s crops or zero-pads each)."""
        return _FFTExtension._complex_n("fft", x, s, axes, norm)

    @staticmethod
    def ifftn(x, /, *, s=None, axes=None, norm="backward") -> Tensor:
        """The n-dimensional inverse DFT over `axes` (all by default)."""
        return _FFTExtension._complex_n("ifft", x, s, axes, norm)

    @staticmethod
    def rfftn(x, /, *, s=None, axes=None, norm="backward") -> Tensor:
        """rfft over the last of `axes`, then fft over the others."""
        x = _t(x, "fft.rfftn")
        axes, s = _fft_s_axes("rfftn", x, s, axes)
        if not axes:
            raise ValueError("fft.rfftn: at least one axis is required")
        out = _fft._fft_common("rfft", x, s[-1], axes[-1], norm)
        for a, n in zip(axes[:-1], s[:-1]):
            out = _fft._fft_common("fft", out, n, a, norm)
        return out

    @staticmethod
    def irfftn(x, /, *, s=None, axes=None, norm="backward") -> Tensor:
        """ifft over all but the last of `axes`, then irfft over the last (its output length
        s[-1], by default 2 * (M - 1))."""
        x = _t(x, "fft.irfftn")
        axes, s = _fft_s_axes("irfftn", x, s, axes, last_real=True)
        if not axes:
            raise ValueError("fft.irfftn: at least one axis is required")
        out = x
        for a, n in zip(axes[:-1], s[:-1]):
            out = _fft._fft_common("ifft", out, n, a, norm)
        return _fft._fft_common("irfft", out, s[-1], axes[-1], norm)

    @staticmethod
    def hfft(x, /, *, n=None, axis=-1, norm="backward") -> Tensor:
        """The real spectrum of a Hermitian-symmetric signal (numpy's irfft(conj(x)) with the
        normalization swapped): irfft(x) reversed in time, which is the same thing."""
        x = _t(x, "fft.hfft")
        if norm not in _SWAP_NORM:
            raise ValueError(f"fft.hfft: norm must be 'backward', 'ortho' or 'forward', "
                             f"got {norm!r}")  # fmt: skip
        y = _fft._fft_common("irfft", x, n, axis, _SWAP_NORM[norm])
        return _reverse_mod(y, _base._axes(axis, y.ndim, "fft.hfft")[0])

    @staticmethod
    def ihfft(x, /, *, n=None, axis=-1, norm="backward") -> Tensor:
        """conj(rfft(x)) with the normalization swapped: the rfft of x (cropped or padded to
        n) reversed in time."""
        x = _t(x, "fft.ihfft")
        if norm not in _SWAP_NORM:
            raise ValueError(f"fft.ihfft: norm must be 'backward', 'ortho' or 'forward', "
                             f"got {norm!r}")  # fmt: skip
        if dt.is_complex(x.dtype):
            raise TypeError("fft.ihfft: input must be real")
        if x.ndim == 0:
            raise ValueError("fft.ihfft: input must have at least one dimension")
        ax = _base._axes(axis, x.ndim, "fft.ihfft")[0]
        n = _fft._fft_n("fft.ihfft", n)
        xn = _fit(x, ax, n) if n is not None else x
        if xn.shape[ax] < 1:
            raise ValueError(f"fft.ihfft: invalid number of data points ({xn.shape[ax]})")
        return _fft._fft_common("rfft", _reverse_mod(xn, ax), None, ax, _SWAP_NORM[norm])

    @staticmethod
    def fftfreq(n, /, *, d=1.0, dtype=None, device=None) -> Tensor:
        """[0, 1, ..., -(n // 2), ..., -1] / (d * n) in `dtype` (default float32)."""
        n = operator.index(n)
        if n < 1:
            raise ValueError(f"fft.fftfreq: n must be >= 1, got {n}")
        return _freq(np.fft.fftfreq(n, d), dtype, device, "fftfreq")

    @staticmethod
    def rfftfreq(n, /, *, d=1.0, dtype=None, device=None) -> Tensor:
        """[0, 1, ..., n // 2] / (d * n) in `dtype` (default float32)."""
        n = operator.index(n)
        if n < 1:
            raise ValueError(f"fft.rfftfreq: n must be >= 1, got {n}")
        return _freq(np.fft.rfftfreq(n, d), dtype, device, "rfftfreq")

    @staticmethod
    def fftshift(x, /, *, axes=None) -> Tensor:
        """The zero frequency moved to the middle: a roll by n // 2 along each of `axes`."""
        return _shift(x, axes, "fftshift", 1)

    @staticmethod
    def ifftshift(x, /, *, axes=None) -> Tensor:
        """fftshift's inverse: a roll by -(n // 2)."""
        return _shift(x, axes, "ifftshift", -1)


def _freq(f: np.ndarray, dtype, device, who: str) -> Tensor:
    d = dt.float32 if dtype is None else dt.as_dtype(dtype)
    if d.kind != "f":
        raise TypeError(f"fft.{who}: dtype must be a real floating dtype, got {d}")
    return F.asarray(f.astype(d), device=device)


def _shift(x, axes, who: str, sign: int) -> Tensor:
    x = _t(x, f"fft.{who}")
    axes = _base._axes(axes, x.ndim, f"fft.{who}")
    if not axes:
        return x
    return roll(x, tuple(sign * (x.shape[a] // 2) for a in axes), axis=axes)


fft = _FFTExtension()

__all__ = ["__array_api_version__", "__array_namespace_info__", "finfo", "iinfo", "isdtype",
           "result_type", "can_cast", "positive", "logical_xor", "conj", "real", "imag",
           "nextafter", "any", "all", "count_nonzero", "cumulative_sum", "cumulative_prod",
           "sort", "argsort", "searchsorted", "nonzero", "unique_all", "unique_counts",
           "unique_inverse", "unique_values", "take", "take_along_axis", "moveaxis",
           "matrix_transpose", "unstack", "broadcast_arrays", "meshgrid", "tril", "triu", "roll",
           "tile", "repeat", "diff", "isin", "tensordot", "vecdot", "linalg", "fft"]  # fmt: skip
