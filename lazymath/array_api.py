"""The Python Array API standard (revision 2024.12) as lazymath's namespace: the standard's
version, its inspection namespace (`__array_namespace_info__`), the functions of the standard
that are not op records (defined in `lazymath/functions/` by family, re-exported here and by
`lazymath`) and the scans, sorts and searches.

`x.__array_namespace__()` returns the `lazymath` module itself; everything in `__all__` is
re-exported there. The data type functions and the promotion table are
`lazymath.functions.datatypes`; the default floating dtype is float32 (the NPU's).

Why cumulative_sum/prod, sort, argsort and searchsorted live here and not in
`lazymath/functions/`: their Vector kernels are `lm.kernel` programs (`lazymath.sorting`, built on
the low-level API, which sits above the tensor functions in the import layers, and loaded on
first use so that `import lazymath` does not build them).
"""

from __future__ import annotations

import math

import numpy as np

from lazymath import dtypes as dt
from lazymath import functions as F
from lazymath._lazy import deferred
from lazymath.functions.base import one_axis
from lazymath.functions.creation import from_host, host_value, tensor_arg
from lazymath.functions.datatypes import can_cast, finfo, iinfo, isdtype, result_type
from lazymath.functions.datatypes import finfo_object as finfo_object
from lazymath.functions.datatypes import iinfo_object as iinfo_object
from lazymath.functions.elementwise import conj, imag, logical_xor, nextafter, positive, real
from lazymath.functions.fft import fft
from lazymath.functions.indexing import nonzero, take, take_along_axis
from lazymath.functions.linalg import linalg, tensordot, vecdot
from lazymath.functions.manipulation import (
    broadcast_arrays,
    dense,
    dense_view,
    diff,
    isin,
    matrix_transpose,
    meshgrid,
    moveaxis,
    repeat,
    roll,
    tile,
    tril,
    triu,
    unstack,
)
from lazymath.functions.reductions import all, any, count_nonzero
from lazymath.functions.sets import UniqueAllResult as UniqueAllResult
from lazymath.functions.sets import UniqueCountsResult as UniqueCountsResult
from lazymath.functions.sets import UniqueInverseResult as UniqueInverseResult
from lazymath.functions.sets import unique_all, unique_counts, unique_inverse, unique_values
from lazymath.tensor import Tensor, default_device

# The Vector kernels of scans, sorts and searches, loaded by the first of those calls: they are
# `lm.kernel` programs (lazymath.lowlevel), which load the compile driver and the ISA, and
# `import lazymath` (which imports this module) must not.
sorting = deferred("lazymath.sorting")

__array_api_version__ = "2024.12"

_DTYPE_NAMES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                "float32", "float64", "complex64", "complex128")  # fmt: skip
# the standard's dtypes (float16 and bfloat16 are lazymath extras, lm.float16 / lm.bfloat16)


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


# ----------------------------------------------------------------------------- scans


def _cumulative(name: str, x, axis, dtype, include_initial: bool) -> Tensor:
    x = tensor_arg(x, name)
    if axis is None:
        if x.ndim > 1:
            raise ValueError(f"{name}: axis is required for tensors of more than one dimension")
        axis = 0
    if x.ndim == 0:
        raise ValueError(f"{name}: a 0-d tensor has no axis to accumulate along")
    ax = one_axis(axis, x.ndim, name)
    if dtype is None:
        dtype = F.sum(F.zeros((1,), x.dtype)).dtype  # the sum's accumulator dtype
    out_dt = dt.as_dtype(dtype)
    add = name == "cumulative_sum"
    if not sorting.vector_dtype(out_dt):  # no Vector instructions for it: the AI CPU
        a = host_value(x, name).astype(out_dt)
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
    return from_host(r, x) if isinstance(r, np.ndarray) else r


def _lines(x: Tensor, ax: int, first: bool) -> Tensor:
    """x with axis `ax` moved first (first=True) or last, dense, as a 2-d tensor."""
    perm = [i for i in range(x.ndim) if i != ax]
    perm = [ax, *perm] if first else [*perm, ax]
    y = F.permute_dims(x, perm) if perm != list(range(x.ndim)) else x
    n = x.shape[ax]
    rest = math.prod(x.shape) // n if n else math.prod(s for i, s in enumerate(x.shape) if i != ax)
    y = dense(y) if y.node.op == "permute" else y
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
    y = sorting.scan_rows(_lines(x, ax, True), op)
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
    work = sorting.order_dtype(x.dtype)  # bool, int16 and unsigned widen (the order is kept)
    n = x.shape[ax]
    if work is None or n > sorting.SORT_MAX:
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
        perm, keep = sorting.stage_tables(size)
        tabs = (F.asarray(perm, device=x.device), F.asarray(keep, device=x.device))
        tabs[0].realize()
        tabs[1].realize()
        _sort_tables[key] = tabs
    vals, idx = sorting.bitonic_sort(rows, *tabs, descending=bool(descending), pad=pad)
    vals = _unlines(vals, x.shape, ax, False)
    idx = _unlines(F.astype(idx, dt.int64), x.shape, ax, False)
    return (F.astype(vals, x.dtype, copy=False) if work != x.dtype else vals), idx


def sort(x, /, *, axis: int = -1, descending: bool = False, stable: bool = True) -> Tensor:
    """Sorted copy along `axis` (NaNs last, first when descending; stable). Lazy: a bitonic
    Vector kernel (`sorting.bitonic_sort`) for rows up to `sorting.SORT_MAX` elements (one row
    resident in UB), in x's dtype or a wider one that keeps the order (bool, int16, uint8/16/32);
    float64, uint64 and longer rows run numpy on the AI CPU at the call (they realize x)."""
    x = tensor_arg(x, "sort")
    if x.ndim == 0:
        raise ValueError("sort: a 0-d tensor has no axis")
    ax = one_axis(axis, x.ndim, "sort")
    vec = _sort_vector(x, ax, descending)
    if vec is not None:
        return vec[0]
    a = host_value(x, "sort")
    if not descending:
        return from_host(np.sort(a, axis=ax, kind="stable"), x)
    return from_host(np.take_along_axis(a, _argsort_host(a, ax, True), ax), x)


def argsort(x, /, *, axis: int = -1, descending: bool = False, stable: bool = True) -> Tensor:
    """Indices that sort `x` along `axis` (int64; stable: ties keep their order, also
    descending). The bitonic Vector kernel of `sort` (same limits: other dtypes and longer
    rows run numpy on the AI CPU at the call)."""
    x = tensor_arg(x, "argsort")
    if x.ndim == 0:
        raise ValueError("argsort: a 0-d tensor has no axis")
    ax = one_axis(axis, x.ndim, "argsort")
    vec = _sort_vector(x, ax, descending)
    if vec is not None:
        return vec[1]
    return from_host(_argsort_host(host_value(x, "argsort"), ax, descending), x)


def searchsorted(x1, x2, /, *, side: str = "left", sorter=None) -> Tensor:
    """Insertion indices of x2 into the sorted 1-d x1 (int64; NaN sorts last). Lazy: a
    vectorized binary search on the Vector unit (`sorting.search_sorted`, x1 resident in UB)
    for the AI Core dtypes and x1 up to `sorting.SEARCH_MAX` elements; other cases run numpy on
    the AI CPU at the call. `sorter` gathers x1 first (`take`: on the host)."""
    a, v = tensor_arg(x1, "searchsorted"), tensor_arg(x2, "searchsorted")
    if a.ndim != 1:
        raise ValueError(f"searchsorted: x1 must be 1-d, got shape {a.shape}")
    if side not in ("left", "right"):
        raise ValueError(f"searchsorted: side must be 'left' or 'right', got {side!r}")
    if sorter is not None:
        a = take(a, tensor_arg(sorter, "searchsorted"), axis=0)
    common = result_type(a, v)
    work = sorting.order_dtype(common) if common != dt.bool_ else None
    if work is not None and a.shape[0] <= sorting.SEARCH_MAX:
        if v.size == 0 or a.shape[0] == 0:
            return F.zeros(v.shape, dt.int64)
        a, v = F.astype(a, common, copy=False), F.astype(v, common, copy=False)
        a, v = F.astype(a, work, copy=False), F.astype(v, work, copy=False)
        r = sorting.search_sorted(a, F.reshape(dense_view(v), (-1,)), right=side == "right")
        return F.astype(F.reshape(r, v.shape), dt.int64)
    r = np.searchsorted(host_value(a, "searchsorted"), host_value(v, "searchsorted"), side=side)
    return from_host(np.asarray(r, dtype=np.int64), v)


__all__ = ["__array_api_version__", "__array_namespace_info__", "finfo", "iinfo", "isdtype",
           "result_type", "can_cast", "positive", "logical_xor", "conj", "real", "imag",
           "nextafter", "any", "all", "count_nonzero", "cumulative_sum", "cumulative_prod",
           "sort", "argsort", "searchsorted", "nonzero", "unique_all", "unique_counts",
           "unique_inverse", "unique_values", "take", "take_along_axis", "moveaxis",
           "matrix_transpose", "unstack", "broadcast_arrays", "meshgrid", "tril", "triu", "roll",
           "tile", "repeat", "diff", "isin", "tensordot", "vecdot", "linalg", "fft"]  # fmt: skip
