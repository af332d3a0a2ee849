"""Tensors from data and constants: `tensor`, `asarray`, `from_dlpack`, `full` and its kin,
`arange`, `linspace`, `eye` and `random`; plus `_from_numpy` (a realized tensor owning a numpy
array) and `_as_tensor_or_scalar`, how every function takes a non-tensor operand; `tensor_arg`
(a tensor argument: array-likes converted, Python scalars refused), `host_value` (a realized
value for a host computation, counted as a sync) and `from_host` (its result as a tensor).

Constants are free in the graph (a `const` node broadcast by `expand`); data is copied into a
read-only array, so nothing outside can change a graph input behind its back.
"""

from __future__ import annotations

import builtins
import math
import operator
import sys

import numpy as np

from lazymath import dtypes as dt
from lazymath.functions.base import _shape_arg, astype
from lazymath.graph import node as gn
from lazymath.tensor import Tensor, default_device, device_arg, note_sync
from lazymath.units import fmt_bytes as _fmt_bytes


def tensor(data, dtype=None) -> Tensor:
    """Copy `data` (array, nested list, scalar, anything with __dlpack__ or __array__) into a
    new realized tensor (numpy's dtype inference: a Python float gives float64)."""
    if isinstance(data, Tensor):
        return data if dtype is None else astype(data, dtype)
    if hasattr(data, "__dlpack__") and not isinstance(data, np.ndarray):
        try:
            data = _bf16_from_dlpack(data, None) if _bf16_producer(data) else np.from_dlpack(data)
        except Exception:  # fall back to the array protocol (e.g. non-CPU capsules)
            data = np.asarray(data)
    try:
        arr = np.array(
            data, dtype=None if dtype is None else dt.as_dtype(dtype), copy=True, order="C"
        )
    except (TypeError, ValueError) as e:
        raise TypeError(f"tensor(): cannot convert {type(data).__name__} to a tensor: {e}") from e
    return _from_numpy(arr, "tensor()")


def _from_numpy(arr: np.ndarray, who: str, device=None) -> Tensor:
    """A realized tensor owning `arr` (C-contiguous; made read-only: the tensor is immutable)."""
    if arr.dtype.kind in "OUSV" and not dt.is_bf16(arr.dtype):
        raise TypeError(f"{who}: non-numeric data of dtype {arr.dtype} is not supported")
    if not arr.dtype.isnative and arr.dtype.newbyteorder("=") in dt.SUPPORTED:
        arr = arr.astype(arr.dtype.newbyteorder("="))  # byte-swapped data: same values, native
    if arr.dtype not in dt.SUPPORTED:
        dt.as_dtype(arr.dtype)  # raises with the supported list
    # np.array(order="C") is contiguous already; np.ascontiguousarray would turn 0-d into 1-d
    # the tensor owns this copy; read-only so that t.numpy() cannot mutate a graph input
    arr.flags.writeable = False
    return Tensor(gn.buffer_node(arr), device)


_PY_SCALARS = (bool, int, float, complex)


def _default_dtype_of(obj) -> np.dtype | None:
    """The Array API default dtype of Python data (float -> float32, complex -> complex64,
    int -> int64, bool -> bool), None for anything else (it keeps its own dtype)."""
    if isinstance(obj, np.generic):
        return None
    if isinstance(obj, _PY_SCALARS):
        kind = type(obj)
    elif isinstance(obj, (list, tuple)):
        kinds = set()
        stack = [obj]
        while stack:
            o = stack.pop()
            if isinstance(o, (list, tuple)):
                stack.extend(o)
            elif isinstance(o, _PY_SCALARS) and not isinstance(o, np.generic):
                kinds.add(type(o))
            elif isinstance(o, Tensor) and o.ndim == 0:
                kinds.add({"b": bool, "i": int, "u": int, "c": complex}.get(o.dtype.kind, float))
            else:
                return None
        kind = next((k for k in (complex, float, int, bool) if k in kinds), float)
    else:
        return None
    return {bool: dt.bool_, int: dt.int64, float: dt.float32, complex: dt.complex64}[kind]


def asarray(obj, /, dtype=None, device=None, copy=None) -> Tensor:
    """Array API `asarray`: a tensor from a tensor, a DLPack or buffer-protocol object, a numpy
    array, a Python scalar or a nested sequence.

    Python data takes the default dtypes (float32, complex64, int64, bool; see
    `__array_namespace_info__().default_dtypes()`), arrays keep theirs. `copy=True` always
    copies, `copy=False` never does (ValueError where a copy is needed: a dtype change, a
    non-contiguous or foreign-device source, Python data), `copy=None` shares realized
    tensors and copies host arrays (the tensor must not change behind the graph's back)."""
    if copy not in (None, True, False):
        raise ValueError(f"asarray: copy must be None, True or False, got {copy!r}")
    want = None if dtype is None else dt.as_dtype(dtype)
    if isinstance(obj, Tensor):
        dev = obj._device if device is None else device_arg(device, "asarray")
        out = obj if want is None or want == obj.dtype else None
        if out is None:
            if copy is False:
                raise ValueError(f"asarray: converting {obj.dtype} to {want} needs a copy")
            out = astype(obj, want)
        if copy or dev is not out._device:
            # tensors are immutable (in-place operators rebind), so a new handle is a copy
            out = Tensor(out._node, dev)
        return out
    dev = None if device is None else device_arg(device, "asarray")
    if hasattr(obj, "__dlpack__") and not isinstance(obj, np.ndarray):
        try:
            return from_dlpack(obj, copy=copy, dtype=want, device=dev)
        except BufferError:
            if copy is False:
                raise
    if want is None:
        want = _default_dtype_of(obj)
        if want is not None and copy is False:
            raise ValueError("asarray: Python data always needs a copy (copy=False given)")
    if copy is False:
        try:
            arr = np.asarray(obj, dtype=want)
        except (TypeError, ValueError) as e:
            raise TypeError(f"asarray: cannot convert {type(obj).__name__}: {e}") from e
        if not arr.flags.c_contiguous or (
            not np.shares_memory(arr, obj) if isinstance(obj, np.ndarray) else False
        ):
            raise ValueError("asarray: copy=False but the data is not C-contiguous or needs a "
                             "dtype conversion")  # fmt: skip
        view = arr.view()
        view.flags.writeable = False
        return _from_numpy(view, "asarray", dev)
    # A Python float beyond a floating target's range rounds to inf (IEEE 754, as torch.asarray and
    # np.float32(3.5e38) do): asarray(3.4028235677973366e+38) with the float32 default is inf, not
    # an error (the Array API suite converts its scalars so). Other overflows stay errors.
    floating = want is not None and (
        np.dtype(want).kind in "fc" or np.dtype(want).name == "bfloat16"
    )
    try:
        with np.errstate(over="ignore" if floating else "raise"):
            arr = np.array(obj, dtype=want, copy=True, order="C")
    except OverflowError as e:
        raise OverflowError(f"asarray: {e}") from None
    except (TypeError, ValueError, FloatingPointError) as e:
        raise TypeError(f"asarray: cannot convert {type(obj).__name__} to a tensor: {e}") from e
    if arr.dtype == object and want is None and isinstance(obj, (int, list, tuple)):
        raise OverflowError("asarray: a Python int does not fit int64")
    return _from_numpy(arr, "asarray", dev)


def from_dlpack(x, /, *, device=None, copy=None, dtype=None) -> Tensor:
    """A tensor from any DLPack producer (torch, numpy, JAX, ...), zero-copy where allowed.

    copy=None shares a C-contiguous CPU buffer and copies otherwise; copy=False shares or
    raises BufferError; copy=True always copies. A shared buffer is read through, never
    written: lazymath treats it as immutable, so writing it through the producer afterwards
    changes what later realizes of the tensor read (the producer's contract, as with numpy's
    views)."""
    if copy not in (None, True, False):
        raise ValueError(f"from_dlpack: copy must be None, True or False, got {copy!r}")
    if not hasattr(x, "__dlpack__"):
        raise TypeError(f"from_dlpack: {type(x).__name__} does not implement __dlpack__")
    dev = None if device is None else device_arg(device, "from_dlpack")
    if hasattr(x, "__dlpack_device__"):
        kind, _ = x.__dlpack_device__()
        if int(kind) not in (1, 3):  # kDLCPU, kDLCUDAHost
            if copy is False:
                raise BufferError(
                    f"from_dlpack: the producer's device {x.__dlpack_device__()} is not the "
                    "host; it cannot be shared (copy=False)"
                )
            raise BufferError(
                f"from_dlpack: the producer's buffer is on device {x.__dlpack_device__()}, "
                "not the host; move it to the CPU first"
            )
    try:
        arr = _bf16_from_dlpack(x, copy) if _bf16_producer(x) else np.from_dlpack(x, copy=copy)
    except TypeError:  # an older producer without the copy= keyword
        if copy is False:
            raise
        arr = np.from_dlpack(x)
        if copy:
            arr = arr.copy()
    if arr.dtype not in dt.SUPPORTED:
        raise TypeError(f"from_dlpack: unsupported dtype {arr.dtype}")
    if dtype is not None and arr.dtype != dtype:
        if copy is False:
            raise ValueError(f"from_dlpack: converting {arr.dtype} to {dtype} needs a copy")
        arr = arr.astype(dtype)
    if not arr.flags.c_contiguous:
        if copy is False:
            raise BufferError(
                f"from_dlpack: the producer's buffer is not C-contiguous (strides "
                f"{arr.strides}); lazymath shares only contiguous buffers (copy=False)"
            )
        arr = np.ascontiguousarray(arr)
    elif arr.base is not None or not arr.flags.owndata:
        arr = arr.view()  # our own read-only view; the producer's flags stay as they were
    return _from_numpy(arr, "from_dlpack", dev)


def _bf16_producer(x) -> bool:
    """Whether `x` is a bfloat16 array of another framework (torch, JAX): DLPack has a
    bfloat16 code, but numpy's importer does not take it ("Unsupported dtype in DLTensor")."""
    return str(getattr(x, "dtype", "")) in ("torch.bfloat16", "bfloat16")


def _bf16_from_dlpack(x, copy) -> np.ndarray:
    """A bfloat16 producer's buffer as an ml_dtypes array: torch's through DLPack as int16
    bits (the same bytes, zero-copy where DLPack allows it), others (JAX) through
    __array__, which gives ml_dtypes' bfloat16 already."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return np.from_dlpack(x.view(torch.int16), copy=copy).view(dt.bfloat16)
    arr = np.asarray(x)
    if arr.dtype != dt.bfloat16:
        raise TypeError(f"from_dlpack: {type(x).__name__} of dtype {x.dtype} did not convert "
                        f"to bfloat16 (got {arr.dtype})")  # fmt: skip
    return np.array(arr, copy=True) if copy else arr


def full(shape, fill_value, dtype=None, *, device=None) -> Tensor:
    """A constant tensor (free in the graph). Without `dtype` the fill value decides: a Python
    bool, int, float, complex gives bool, int64, float32, complex64 (the Array API defaults)."""
    shape = _shape_arg(shape)
    if isinstance(fill_value, Tensor):
        if fill_value.ndim:
            raise ValueError(f"full: fill_value must be a scalar, got shape {fill_value.shape}")
        fill_value = fill_value.item()
    if dtype is None:
        dtype = _default_dtype_of(fill_value)
        if dtype is None:
            dtype = np.asarray(fill_value).dtype
    dtype = dt.as_dtype(dtype)
    if isinstance(fill_value, complex) and dtype.kind != "c":
        raise TypeError(f"full: a complex fill value needs a complex dtype, not {dtype}")
    try:
        c = gn.const_node(fill_value, dtype)
    except OverflowError:
        raise OverflowError(f"full: {fill_value!r} does not fit dtype {dtype}") from None
    dev = None if device is None else device_arg(device, "full")
    return Tensor(gn.make("expand", dtype, shape, (c,)) if shape else c, dev)


def zeros(shape, dtype=None, *, device=None) -> Tensor:
    """A lazy tensor of zeros (float32 by default): a constant broadcast in the graph, so it
    costs no memory until a kernel writes it out."""
    return full(shape, 0, dt.float32 if dtype is None else dtype, device=device)


def ones(shape, dtype=None, *, device=None) -> Tensor:
    """A lazy tensor of ones (float32 by default); a broadcast constant, like `zeros`."""
    return full(shape, 1, dt.float32 if dtype is None else dtype, device=device)


def empty(shape, dtype=None, *, device=None) -> Tensor:
    """Like numpy.empty; lazymath fills with zeros (a free constant in the graph)."""
    return full(shape, 0, dt.float32 if dtype is None else dtype, device=device)


def zeros_like(x: Tensor, /, dtype=None, *, device=None) -> Tensor:
    """Zeros with `x`'s shape, and its dtype and device unless given."""
    return full(x.shape, 0, dtype or x.dtype, device=device or x.device)


def ones_like(x: Tensor, /, dtype=None, *, device=None) -> Tensor:
    """Ones with `x`'s shape, and its dtype and device unless given."""
    return full(x.shape, 1, dtype or x.dtype, device=device or x.device)


def empty_like(x: Tensor, /, dtype=None, *, device=None) -> Tensor:
    """Like numpy.empty_like; lazymath fills with zeros."""
    return full(x.shape, 0, dtype or x.dtype, device=device or x.device)


def full_like(x: Tensor, /, fill_value, dtype=None, *, device=None) -> Tensor:
    """`fill_value` with `x`'s shape, and its dtype and device unless given; a value that
    does not fit the dtype raises OverflowError here."""
    return full(x.shape, fill_value, dtype or x.dtype, device=device or x.device)


def arange(start, /, stop=None, step=1, dtype=None, *, device=None) -> Tensor:
    """Array API / numpy arange: [start, stop) by step; ``arange(n)`` is ``arange(0, n)``.

    Without `dtype`: int64 when start, stop and step are all integers, else float32 (the
    default floating dtype). The length is ceil((stop - start) / step)."""
    if stop is None:
        start, stop = 0, start
    for name, v in (("start", start), ("stop", stop), ("step", step)):
        if isinstance(v, (complex, np.complexfloating)) or not isinstance(
            v, (int, float, np.integer, np.floating)
        ):
            raise TypeError(f"arange: {name} must be a real number, got {v!r}")
    if step == 0:
        raise ValueError("arange: step must not be zero")
    ints = builtins.all(isinstance(v, (int, np.integer)) and not isinstance(v, bool)
                        for v in (start, stop, step))  # fmt: skip
    want = dt.as_dtype(dtype) if dtype is not None else (dt.int64 if ints else dt.float32)
    n = builtins.max(0, math.ceil((stop - start) / step)) if not ints else builtins.max(
        0, -(-(stop - start) // step))  # fmt: skip
    if n > 2**31:
        raise ValueError(f"arange: {n} elements is too many")
    if ints and want.kind in "iu":
        arr = (start + step * np.arange(n, dtype=np.int64)).astype(want)
    else:
        arr = (float(start) + float(step) * np.arange(n, dtype=np.float64)).astype(want)
    return _from_numpy(arr, "arange", None if device is None else device_arg(device, "arange"))


def linspace(start, stop, /, num=50, dtype=None, *, device=None, endpoint=True) -> Tensor:
    """num evenly spaced values over [start, stop] (or [start, stop) without endpoint);
    float32 without `dtype` (complex64 for complex endpoints)."""
    num = operator.index(num)
    if num < 0:
        raise ValueError(f"linspace: num must be non-negative, got {num}")
    cplx = isinstance(start, complex) or isinstance(stop, complex)
    want = dt.as_dtype(dtype) if dtype is not None else (dt.complex64 if cplx else dt.float32)
    arr = np.linspace(start, stop, num, endpoint=endpoint)
    with np.errstate(all="ignore"):
        arr = arr.astype(want)
    return _from_numpy(arr, "linspace", None if device is None else device_arg(device, "linspace"))


def eye(n_rows, n_cols=None, /, k=0, dtype=None, *, device=None) -> Tensor:
    """numpy.eye: ones on the `k`-th diagonal of an `n_rows` x `n_cols` matrix (square by
    default), float32 unless `dtype` says otherwise. Built on the host: it is an input of the
    graph, not a kernel."""
    dtype = dt.float32 if dtype is None else dt.as_dtype(dtype)
    arr = np.eye(operator.index(n_rows), None if n_cols is None else operator.index(n_cols),
                 operator.index(k), dtype=dtype)  # fmt: skip
    return _from_numpy(arr, "eye", None if device is None else device_arg(device, "eye"))


def _host_memory_available() -> int:
    """Bytes this host can still allocate (MemAvailable; 0 where /proc/meminfo is missing)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


class _Random:
    """lm.random: deterministic given `seed` (numpy's PCG64, float32 draws cast to `dtype`).

    The values are generated on the host at the call (a realized input of the graph), straight
    into the tensor's own buffer in chunks: one copy of the result at the peak, Ctrl-C works
    between chunks, a size that cannot fit the device's or the host's memory is refused before
    any work, and a generation that takes more than a few seconds reports its progress on
    stderr (`lm.random.randn(1 << 16, 1 << 16)` is 16 GiB: about a minute on one core)."""

    CHUNK = 1 << 22  # elements per draw: 16 MiB of float32, large enough to amortize the call
    PROGRESS_AFTER_S = 2.0

    @staticmethod
    def rand(*shape, seed=None, dtype=dt.float32) -> Tensor:
        """Uniform samples in [0, 1) of `shape` (given as ints or one tuple)."""
        return _Random._draw("rand", shape, seed, dtype, lambda rng, out: rng.random(
            dtype=np.float32, out=out))  # fmt: skip

    @staticmethod
    def randn(*shape, seed=None, dtype=dt.float32) -> Tensor:
        """Standard normal samples of `shape` (given as ints or one tuple)."""
        return _Random._draw("randn", shape, seed, dtype, lambda rng, out: rng.standard_normal(
            dtype=np.float32, out=out))  # fmt: skip

    @staticmethod
    def _draw(who: str, shape, seed, dtype, fill) -> Tensor:
        import time

        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        shape = _shape_arg(shape)
        dtype = dt.as_dtype(dtype)
        if not (dt.is_float(dtype) or dt.is_complex(dtype)):
            raise TypeError(f"lm.random.{who}: dtype must be a floating dtype, got {dtype}")
        n = math.prod(shape)
        nbytes = n * dtype.itemsize
        staging = 0 if dtype == np.float32 else builtins.min(n, _Random.CHUNK) * 4
        spec = getattr(default_device(), "spec", None)
        cap = getattr(spec, "hbm_bytes", 0) or 0
        avail = _host_memory_available()
        for limit, what in ((cap, f"the device memory of the {getattr(spec, 'name', 'device')}"),
                            (avail, "the memory this host has available")):  # fmt: skip
            if limit and nbytes + staging > limit:
                raise MemoryError(
                    f"lm.random.{who}{shape}: the result is {_fmt_bytes(nbytes)} of {dtype}, "
                    f"more than {what} ({_fmt_bytes(limit)}); nothing was generated. Draw "
                    "smaller pieces (e.g. one block of rows at a time, each with its own seed)."
                )
        rng = np.random.default_rng(seed)
        out = np.empty(shape, dtype=dtype)
        flat = out.reshape(-1)
        t0 = last = time.perf_counter()
        for lo in range(0, n, _Random.CHUNK):
            hi = builtins.min(lo + _Random.CHUNK, n)
            if dtype == np.float32:
                fill(rng, flat[lo:hi])
            else:
                tmp = np.empty(hi - lo, np.float32)
                fill(rng, tmp)
                flat[lo:hi] = tmp
            now = time.perf_counter()
            if now - t0 > _Random.PROGRESS_AFTER_S and (now - last > 5.0 or hi == n):
                last = now
                print(f"lazymath: lm.random.{who}{shape}: {_fmt_bytes(hi * dtype.itemsize)} "
                      f"of {_fmt_bytes(nbytes)} generated on the host ({now - t0:.0f} s)",
                      file=sys.stderr, flush=True)  # fmt: skip
        return _from_numpy(out, f"lm.random.{who}")


random = _Random()


# ----------------------------------------------------------------------------- helpers


def _as_tensor_or_scalar(x, op: str):
    if isinstance(x, Tensor):
        return x
    if isinstance(x, (bool, int, float, complex, np.generic)):
        if isinstance(x, np.generic):
            return tensor(np.asarray(x))
        return x
    if isinstance(x, (np.ndarray, list, tuple)) or hasattr(x, "__array__"):
        return tensor(x)
    raise TypeError(f"{op}: unsupported operand type {type(x).__name__}")


def tensor_arg(x, who: str) -> Tensor:
    if isinstance(x, Tensor):
        return x
    if isinstance(x, (bool, int, float, complex)):
        raise TypeError(f"{who}: expected a tensor, got a Python {type(x).__name__}")
    return asarray(x)


def host_value(x: Tensor, who: str) -> np.ndarray:
    """The realized value of `x` for a function that computes on the host (an implicit sync,
    counted like bool(t))."""
    note_sync(who, x)
    return x.numpy()


def from_host(a, like: Tensor | None = None) -> Tensor:
    arr = np.array(a, copy=True, order="C")
    return _from_numpy(arr, "lazymath", like._device if like is not None else None)
