"""The FFT: `lm.fft`'s transforms and their plans. A transform picks, per length and device, a
Cube DFT (one matmul per stage), a Vector Stockham or six-step kernel, or Bluestein for awkward
lengths (`graph.dft` holds the plans and their tables); measured choices come from `_Tuning`.
`lm.fft` is `_FFTExtension`, the Array API's fft extension: `_FFT`'s transforms plus fftn,
ifftn, rfftn, irfftn, hfft, ihfft, fftfreq, rfftfreq, fftshift, ifftshift built on them.
"""

from __future__ import annotations

import builtins
import contextlib
import math
import operator
import threading
import weakref

import numpy as np

from lazymath import dtypes as dt
from lazymath import settings
from lazymath._lazy import deferred, load
from lazymath.functions.base import _axes, astype
from lazymath.functions.creation import asarray, tensor, tensor_arg
from lazymath.functions.linalg import matmul
from lazymath.functions.manipulation import roll
from lazymath.functions.shapes import _slice_node, flip, pad, permute_dims, reshape
from lazymath.graph import custom, dft
from lazymath.graph import node as gn
from lazymath.tensor import Tensor, wrap

# The driver, loaded on first use (not by `import lazymath`): it registers the built-in kernel
# definitions (the Vector FFT, the depthwise conv1d) that these functions' graph nodes name.
engine = deferred("lazymath.engine")

_FFT_NORMS = (None, "backward", "ortho", "forward")
_fft_dtypes: dict = {}


def _fft_out_dtype(kind: str, d: np.dtype) -> np.dtype:
    """numpy.fft's result dtype for `kind` on a `d` input (asked of numpy once per pair:
    complex64 for float16/float32/complex64, complex128 for the rest; irfft's real result
    keeps float16/float32, float64 otherwise)."""
    key = (kind, d)
    out = _fft_dtypes.get(key)
    if out is None:
        with np.errstate(all="ignore"):
            out = np.dtype(getattr(np.fft, kind)(np.zeros(2, d)).dtype)
        _fft_dtypes[key] = out
    return out


def _fft_n(kind: str, n) -> int | None:
    if n is None:
        return None
    try:
        n = operator.index(n)
    except TypeError:
        raise TypeError(f"{kind}: n must be an int or None, got {n!r}") from None
    if n < 1:
        raise ValueError(f"{kind}: invalid number of data points ({n}): n must be >= 1")
    return n


def _fft_common(kind: str, x, n, axis, norm) -> Tensor:
    x = x if isinstance(x, Tensor) else tensor(x)
    hit = dft.fast_join(_fft_memo, kind, x, n, axis, norm, _RFFT_PACKED, _FFT_TUNING.forced)
    if hit is not None:  # the same transform of the same realized input again
        return _from_last(wrap(gn.make("complex_join", *hit[:4]), [x]), hit[4])
    if x.ndim == 0:
        raise ValueError(f"{kind}: input must have at least one dimension")
    if not isinstance(axis, (int, np.integer)):
        raise TypeError(f"{kind}: axis must be an int, got {axis!r}")
    ax = _axes(axis, x.ndim, kind)[0]
    if norm not in _FFT_NORMS:
        raise ValueError(
            f"{kind}: norm must be None, 'backward', 'ortho' or 'forward', got {norm!r}"
        )
    n = _fft_n(kind, n)
    if kind == "rfft" and dt.is_complex(x.dtype):
        raise TypeError("rfft: input must be real (use fft for complex input)")
    size = x.shape[ax]
    out_dtype = _fft_out_dtype(kind, x.dtype)
    if kind == "irfft":
        nout = n if n is not None else 2 * (size - 1)
        length = nout
    else:
        nout = n if n is not None else size
        length = nout // 2 + 1 if kind == "rfft" else nout
    if nout < 1:
        raise ValueError(f"{kind}: invalid number of data points ({nout}) along axis {ax}")
    shape = list(x.shape)
    shape[ax] = length
    double = out_dtype in (dt.complex128, dt.float64)
    rows = math.prod(d for i, d in enumerate(x.shape) if i != ax)
    ub = x._device.spec.ub_bytes if x._device is not None else None
    impl, fs, why = _fft_plan(kind, x, double, nout, x.size == 0 or math.prod(shape) == 0, rows,
                              ub)  # fmt: skip
    if impl != "aicpu":
        return _fft_cube(kind, x, n, ax, norm, out_dtype, impl, fs, f"{impl}: {why}")
    node = gn.make("fft", out_dtype, tuple(shape), (x._node,), (kind, n, ax, norm, f"aicpu: {why}"))
    return wrap(node, [x])


def _fft_plan(kind: str, x: Tensor, double: bool, n: int, empty: bool, rows: int, ub):
    """dft.plan's choice (the cost model), or the measured one: a record stored by an earlier
    autotuned compile (any process on this host target), or, with LAZYMATH_AUTOTUNE=1 / inside
    lm.precompile(..., autotune=True), a fresh measurement of every candidate plan (each built
    and realized on random rows of the same shape and dtype, timed; engine.tuned_choice)."""
    forced = _FFT_TUNING.get(kind, n, rows)
    if forced is not None and not (double or empty):  # a candidate being timed
        return (*forced, dft.describe(kind, *forced, n, rows, ub) + " [a candidate timed]")
    spec = x._device.spec if x._device is not None else None
    sig = (kind, double, n, empty, rows, ub, x._node.dtype, spec, settings.TARGET_CPU.get())
    hit = dft.MEMO.get(sig)  # this process's answer (no disk read per call; lm.precompile's
    if hit is not None and kind not in dft.FORCE and (hit[3] or not settings.AUTOTUNE.get()):
        return hit[:3]  # autotune=True clears it)
    host = engine.host_fft_rates()
    impl, fs, why = dft.plan(kind, double, n, empty, rows, ub, host)
    if double or empty or kind in dft.FORCE:
        return impl, fs, why
    impl, fs, why, measured = _fft_tuned(kind, x, n, rows, ub, spec, impl, fs, why)
    if len(dft.MEMO) > 4096:  # (a long process over many shapes)
        dft._clear()
    dft.MEMO[sig] = (impl, fs, why, measured)
    return impl, fs, why


def _fft_tuned(kind: str, x: Tensor, n: int, rows: int, ub, spec, impl, fs, why):
    """(impl, fs, why, measured): the measured plan (a stored record or a fresh measurement),
    else the model's (impl, fs, why)."""
    cands = dft.candidates(kind, n, ub)
    if len(cands) < 2:
        return impl, fs, why, False
    by_label = {dft.label(c): c for c in cands}
    nin = n // 2 + 1 if kind == "irfft" else n

    def run(lab: str):  # a callable realizing candidate `lab` on random rows (warm after one)
        c = by_label[lab]
        rng = np.random.default_rng(0)
        data = rng.standard_normal((rows, nin)).astype(np.float32)
        if dt.is_complex(x.dtype):
            data = (data + 1j * rng.standard_normal((rows, nin))).astype(np.complex64)
        elif x.dtype != dt.float32:
            data = data.astype(np.dtype(x.dtype.name))
        t = tensor(data)

        def once():
            with _FFT_TUNING.forcing(kind, n, rows, c):
                out = _fft_common(kind, t, n if kind == "irfft" else None, -1, None)
            out.realize()

        return once

    sig = ("fft-plan", kind, n, rows, x.dtype.name, spec.key())
    hit = engine.tuned_choice(sig, list(by_label), run)
    if hit is None:
        return impl, fs, why, False
    best, times, origin = hit
    impl, fs = by_label[best]
    return impl, fs, dft.explain_choice(kind, impl, fs, n, rows, ub, origin, times), True


class _Tuning(threading.local):
    """The plan forced while a candidate is timed: (kind, n, rows) -> (impl, fs)."""

    def __init__(self):
        self.forced: dict = {}

    def get(self, kind, n, rows):
        return self.forced.get((kind, n, rows))

    @contextlib.contextmanager
    def forcing(self, kind, n, rows, c):
        key = (kind, n, rows)
        old = self.forced.get(key)
        self.forced[key] = c
        try:
            yield
        finally:
            if old is None:
                self.forced.pop(key, None)
            else:
                self.forced[key] = old


_FFT_TUNING = _Tuning()


# FFT on the AI Core: DFT matmuls on real planes (a complex row as two float32 rows, real and
# imaginary) plus Vector twiddles; the plan and its tables are `graph.dft`'s. The constant
# tables are realized tensors cached per (table, length, direction, scale).
_fft_tables: dict = {}


def _fft_table(like: Tensor, fn, *args) -> Tensor:
    """The realized constant fn(*args) (a graph.dft table) on `like`'s device."""
    key = (fn.__name__, *args)
    hit = _fft_tables.get(key)
    if hit is None or hit._device is not like._device:
        hit = Tensor(gn.buffer_node(fn(*args)), like._device)
        _fft_tables[key] = hit
    return hit


def _to_last(x: Tensor, ax: int) -> Tensor:
    if ax == x.ndim - 1:
        return x
    return permute_dims(x, [i for i in range(x.ndim) if i != ax] + [ax])


def _from_last(x: Tensor, ax: int) -> Tensor:
    if ax == x.ndim - 1:
        return x
    perm = list(range(x.ndim - 1))
    perm.insert(ax, x.ndim - 1)
    return permute_dims(x, perm)


def _fit_axis(x: Tensor, m: int, axis: int) -> Tensor:
    """Crop or zero-pad `axis` to m (numpy.fft's `n`)."""
    axis %= x.ndim
    length = x.shape[axis]
    if m < length:
        spec = [(0, s, 1) for s in x.shape]
        spec[axis] = (0, m, 1)
        return _slice_node(x, tuple(spec))
    if m > length:
        widths = [(0, 0)] * x.ndim
        widths[axis] = (0, m - length)
        return pad(x, widths)
    return x


# input node -> {call key: the node of its transform's result before the join}; weak on the
# input, whose realized array the graph holds (not the node itself), so nothing outlives it
_fft_memo: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class _KeepAlive:
    """The array interface of a float32 (..., 2) view of a complex64 array that keeps the array
    itself alive: numpy collapses a view's base to the owner of the memory, and the owner of a
    device output goes back to the memory pool when the array that leases it dies."""

    def __init__(self, arr: np.ndarray) -> None:
        iface = dict(arr.__array_interface__)
        self.__array_interface__ = dict(
            shape=arr.shape + (2,), typestr=np.dtype(np.float32).str, data=(iface["data"][0], True),
            strides=None, version=3,
        )  # fmt: skip
        self.base = arr


def _complex_rows(x: Tensor, ax: int) -> Tensor:
    """complex64 `x` as float32 (other axes..., n, 2): each value's (real, imaginary) pair, the
    transform axis `ax` next to last. The memory of a realized array or of a Cube FFT's result
    is read as it is (no copy); anything else is one AI CPU copy (complex_planes)."""
    node = x._node
    nd = x.ndim
    if node.realized is not None and node.realized.flags.c_contiguous:
        arr = node.realized
        if arr.size:  # a float32 view of the same memory, holding the complex64 array alive
            view = np.asarray(_KeepAlive(arr))
            p = Tensor(gn.buffer_node(view), x._device)
            return permute_dims(p, [i for i in range(nd) if i != ax] + [ax, nd])
    axes = list(range(nd))  # x's axis i is axis axes[i] of the join
    if node.op == "permute" and node.srcs[0].op == "complex_join":
        axes = list(node.arg)
        node = node.srcs[0]
    if node.op == "complex_join" and node.realized is None:
        # its source holds (join.shape[:-1], nfull, 2) in C order
        p = reshape(wrap(node.srcs[0], [x]), node.shape[:-1] + (node.arg[1], 2))
        p = _fit_axis(p, node.shape[-1], -2)
        return permute_dims(p, [axes[i] for i in range(nd) if i != ax] + [axes[ax], nd])
    last = _to_last(x, ax)
    shape = last.shape + (2,)
    return wrap(gn.make("complex_planes", dt.float32, shape, (last._node,)), [x])


def _dft_rows(p: Tensor, fs: tuple, sign: int, scale: float, real: bool, m: int) -> Tensor:
    """The DFT of each row of `p`: p is (..., n, 2) complex rows as (real, imaginary) pairs, or
    (..., n) real rows when `real`. The result holds the transforms, complex64 in C order, as
    float32 pairs: direct, the first m frequencies of each row, shape (..., 2m), the batch axes
    kept; four-step, all n, the batch axes merged. fs: the plan's factors."""
    lead = p.shape[:-1] if real else p.shape[:-2]
    n = p.shape[-1] if real else p.shape[-2]
    if len(fs) == 1:  # direct: rows (lead) x (t, plane) @ (t, plane) x (k, plane')
        mat = _fft_table(p, dft.direct_matrix, n, sign, scale, real, m)
        return matmul(p if real else reshape(p, lead + (2 * n,)), mat)
    b = math.prod(lead)
    n1 = fs[0]
    n2 = n // n1
    # step 1: the length-n1 DFTs over t1 (t = t1 n2 + t2), the input read in place as slabs
    # (t1, (t2, plane)): z [b, t2, plane, q, k1] = slab^T @ [Re F; Im F]^T when step 3 follows
    # (its rows want t2 outer), else z [b, q, k1, t2, plane] = [Re F; Im F] @ slab (the
    # recursion's rows want k1 outer): the Vector kernel reads z without a transpose
    g = _fft_table(p, dft.first_matrix, n1, sign)
    xs = reshape(p, (b, n1, n2) if real else (b, n1, 2 * n2))
    last = len(fs) == 2
    if last:
        z = matmul(permute_dims(xs, (0, 2, 1)), permute_dims(g, (1, 0)))
        z = reshape(z, (b, n2, 1, 2, n1) if real else (b, n2, 2, 2, n1))
        part = lambda plane, q: z[:, :, plane, q]  # noqa: E731  [b, t2, k1]
    else:
        z = matmul(g, xs)
        z = reshape(z, (b, 2, n1, n2, 1) if real else (b, 2, n1, n2, 2))
        part = lambda plane, q: z[:, q, :, :, plane]  # noqa: E731  [b, k1, t2]
    if real:
        yr, yi = part(0, 0), part(0, 1)
    else:  # the complex product's four real parts
        yr = part(0, 0) - part(1, 1)
        yi = part(1, 0) + part(0, 1)
    if last:
        # step 2 (Vector): the twiddles w**(k1 t2), written as the rows R [b, q, t2, k1, plane']
        # of step 3: [[Re y', Im y'], [Im y', -Re y']]
        ta = _fft_table(p, dft.twiddles, n1, n2, sign, 0)
        tb = _fft_table(p, dft.twiddles, n1, n2, sign, 1)
        yr = reshape(yr, (b, 1, n2, n1, 1))
        yi = reshape(yi, (b, 1, n2, n1, 1))
        r = reshape(yr * ta + yi * tb, (b, 2 * n2, 2 * n1))
        # step 3: [Re F, -Im F] (n2, 2 n2) @ R: [b, k2, (k1, plane')], the result in C order
        return matmul(_fft_table(p, dft.last_matrix, n2, sign, scale), r)
    # recursively: the twiddled rows (b, k1) are length-n2 transforms, (real, imaginary) pairs
    ca = _fft_table(p, dft.twiddle_pairs, n1, n2, sign, 0)
    cb = _fft_table(p, dft.twiddle_pairs, n1, n2, sign, 1)
    rows = reshape(yr, (b, n1, n2, 1)) * ca + reshape(yi, (b, n1, n2, 1)) * cb
    out = _dft_rows(reshape(rows, (b * n1, n2, 2)), fs[1:], sign, scale, False, n2)
    return permute_dims(reshape(out, (b, n1, n2, 2)), (0, 2, 1, 3))  # [b, k2, k1, plane]


def _bluestein_rows(p: Tensor, fs: tuple, sign: int, scale: float, real: bool,
                    vector: bool = False) -> Tensor:  # fmt: skip
    """Bluestein's algorithm: the length-n DFT of each row of `p` ((..., n, 2) pairs, or (..., n)
    real) as the chirp convolution X_k = c_k sum_t (x_t c_t) b_(k-t), c_t = exp(sign i pi t^2/n),
    b = conj(c), computed through transforms of the smooth length m = prod(fs) >= 2n - 1 (the
    filter's spectrum is a constant table). Result (b, n, 2) pairs, complex64 in C order."""
    lead = p.shape[:-1] if real else p.shape[:-2]
    n = p.shape[-1] if real else p.shape[-2]
    b = math.prod(lead)
    m = math.prod(fs)

    def cmul(v: Tensor, table, *args) -> Tensor:  # v (b, k, 2) pairs times a constant vector
        t0 = _fft_table(p, table, *args, 0)
        t1 = _fft_table(p, table, *args, 1)
        return _slice_last(v, 0) * t0 + _slice_last(v, 1) * t1

    if real:
        a = reshape(p, (b, n, 1)) * _fft_table(p, dft.chirp, n, sign, 1.0, 0)
    else:
        a = cmul(reshape(p, (b, n, 2)), dft.chirp, n, sign, 1.0)
    if vector:  # the Vector Stockham FFTs zero-pad to m and keep the first n themselves
        f = _stockham_rows(a, m, -1, 1.0, False, m)
        g = cmul(f, dft.bluestein_filter, n, m, sign)
        return cmul(_stockham_rows(g, m, 1, 1.0, False, n), dft.chirp, n, sign, scale)
    a = pad(a, [(0, 0), (0, m - n), (0, 0)])
    f = reshape(_dft_rows(a, fs, -1, 1.0, False, m), (b, m, 2))
    g = cmul(f, dft.bluestein_filter, n, m, sign)
    c = reshape(_dft_rows(g, fs, 1, 1.0, False, m), (b, m, 2))
    c = _slice_node(c, ((0, b, 1), (0, n, 1), (0, 2, 1)))
    return cmul(c, dft.chirp, n, sign, scale)


def _fft_window(x: Tensor, ax: int, n: int) -> tuple | None:
    """(data, window) when `x` is the pending float32 product data * window, the window a
    realized length-n vector broadcast along the transform axis (the last): the Vector
    Stockham kernel multiplies it in its load (fft(x * window) is one kernel)."""
    node = x._node
    if (node.realized is not None or node.op != "mul" or node.dtype != dt.float32
            or ax != x.ndim - 1 or x.shape[ax] != n):  # fmt: skip
        return None
    for d, w in (node.srcs, node.srcs[::-1]):
        base = w
        while base.op in ("expand", "reshape") and base.realized is None:
            base = base.srcs[0]
        ok = base.realized is not None and base.size == n and base.shape[-1] == n
        if ok and d.shape == node.shape and d.dtype == w.dtype == dt.float32:
            wt = Tensor(base, x._device)
            return wrap(d, [x]), reshape(wt, (n,))
    return None


def _stockham_rows(p: Tensor, n: int, sign: int, scale: float, real: bool, length: int,
                   window: Tensor | None = None, shape: tuple | None = None) -> Tensor:  # fmt: skip
    """The Vector Stockham FFT (backend/templates/fft.py) of each row of `p` ((..., n, 2)
    pairs, or (..., n) real): one Vector kernel; the first `length` frequencies, (b, length, 2)
    pairs, complex64 in C order."""
    load(engine)  # the driver registers the built-in kernels

    lead = p.shape[:-1] if real else p.shape[:-2]
    b = math.prod(lead)
    m = p.shape[-1] if real else p.shape[-2]  # m < n: the kernel zero-pads the rows to n
    xs = reshape(p, (b, m) if real else (b, m, 2))
    tw = _fft_table(p, dft.stockham_tables, n, sign, 0)
    ix = _fft_table(p, dft.stockham_tables, n, sign, 1)
    params = (("length", length), ("n", n), ("real", bool(real)), ("scale", float(scale)),
              ("sign", sign)) + ((("window", True),) if window is not None else ())  # fmt: skip
    srcs = (xs._node, tw._node, ix._node) + ((window._node,) if window is not None else ())
    node = gn.make("custom", dt.float32, shape or (b, length, 2), srcs,
                   (custom.builtin("fft_stockham"), params))  # fmt: skip
    return wrap(node, [p])


def _sixstep_rows(p: Tensor, fs: tuple, sign: int, scale: float, real: bool,
                  shape: tuple | None = None) -> Tensor:  # fmt: skip
    """The six-step FFT of each row of `p` (n = n1 n2, t = t1 n2 + t2, k = k1 + n1 k2) as two
    passes of the Vector Stockham kernel reading and writing strided columns in GM (no
    transposes): pass 1, rows (b, t2): the length-n1 DFT over t1, times w_n^(t2 k1), written
    [b, t2, k1]; pass 2, rows (b, k1): the length-n2 DFT over t2, written at k1 + n1 k2.
    Result (b, n, 2) pairs, complex64 in C order."""
    load(engine)  # the driver registers the built-in kernels

    n1, n2 = fs
    n = n1 * n2
    b = math.prod(p.shape[:-1] if real else p.shape[:-2])
    key = custom.builtin("fft_stockham")
    xs = reshape(p, (b, n) if real else (b, n, 2))

    def tables(m: int) -> tuple:
        return (_fft_table(p, dft.stockham_tables, m, sign, 0)._node,
                _fft_table(p, dft.stockham_tables, m, sign, 1)._node)  # fmt: skip

    ub = p._device.spec.ub_bytes

    def tiles(m: int, rows: int, real: bool, out: bool) -> tuple:  # columns per tile, tables
        c = dft.tile_columns(m, rows, real, out, ub)
        if c == 1:
            return 1, ()
        return c, (_fft_table(p, dft.tile_tables, c, m, real, 0)._node,
                   _fft_table(p, dft.tile_tables, c, m, real, 1)._node)  # fmt: skip

    pt = _fft_table(p, dft.sixstep_twiddles, n1, n2, sign)._node
    cols, extra = tiles(n1, n2, real, False)
    lay = (b * n2, n2, n, 1, n2, n, n1, 1, n1)
    params = (("cols", cols), ("lay", lay), ("length", n1), ("n", n1), ("real", bool(real)),
              ("scale", 1.0), ("sign", sign))  # fmt: skip
    y = gn.make("custom", dt.float32, (b * n2, n1, 2), (xs._node, *tables(n1), pt, *extra),
                (key, params))  # fmt: skip
    cols, extra = tiles(n2, n1, False, True)
    lay = (b * n1, n1, n, 1, n1, n, 1, n1, n2)
    params = (("cols", cols), ("lay", lay), ("length", n2), ("n", n2), ("real", False),
              ("scale", float(scale)), ("sign", sign))  # fmt: skip
    node = gn.make("custom", dt.float32, shape or (b, n, 2), (y, *tables(n2), *extra),
                   (key, params))  # fmt: skip
    return wrap(node, [p])


_RFFT_PACKED = True  # rfft above STOCKHAM_MAX: a half-length complex FFT + one combine kernel


def _rfft_packed(p: Tensor, n: int, scale: float) -> Tensor:
    """rfft of real rows (..., n), n even: the rows read as n / 2 complex points (a free
    reshape), their complex FFT (Stockham or six-step), then one Vector kernel combining
    Z[k] and Z[n/2 - k] into the n / 2 + 1 kept frequencies. Result (b, n // 2 + 1, 2)."""
    h = n // 2
    b = math.prod(p.shape[:-1])
    z = reshape(p, (b, h, 2))
    impl, fs = dft.vector_plan(h, p._device.spec.ub_bytes)
    if impl == "stockham" and dft.RFFT_FUSED:  # one kernel: the combine on the UB-resident Z
        load(engine)  # the driver registers the built-in kernels

        tables = (
            _fft_table(p, dft.stockham_tables, h, -1, 0),
            _fft_table(p, dft.stockham_tables, h, -1, 1),
            _fft_table(p, dft.rfft_twiddles, n),
            _fft_table(p, dft.reverse_index, h),
        )
        params = (("length", h + 1), ("mode", "rfused"), ("n", h), ("real", False),
                  ("scale", float(scale)), ("sign", -1))  # fmt: skip
        node = gn.make("custom", dt.float32, (b, h + 1, 2), (z._node, *(t._node for t in tables)),
                       (custom.builtin("fft_stockham"), params))  # fmt: skip
        return wrap(node, [p])
    if impl == "stockham":
        zf = _stockham_rows(z, h, -1, 1.0, False, h)
    else:
        zf = reshape(_sixstep_rows(z, fs, -1, 1.0, False), (b, h, 2))
    tw = _fft_table(p, dft.rfft_twiddles, n)
    ix = _fft_table(p, dft.stockham_tables, 4, -1, 1)  # unused by the kernel (its signature)
    params = (("length", h + 1), ("mode", "rpost"), ("n", n), ("real", False),
              ("scale", float(scale)), ("sign", -1))  # fmt: skip
    node = gn.make("custom", dt.float32, (b, h + 1, 2), (zf._node, tw._node, ix._node),
                   (custom.builtin("fft_stockham"), params))  # fmt: skip
    return wrap(node, [p])


def _irfft_packed(x: Tensor, nout: int, ax: int, norm, out_dtype, real: bool,
                  why: str = "") -> Tensor:  # fmt: skip
    """irfft of length nout = 2h (dft.plan "packed"): one Vector kernel (mode "ipre") forms the
    spectrum Z of z_m = x_2m + i x_2m+1 from the h + 1 frequencies, and the inverse Vector FFT
    of Z (Stockham or six-step, scaled by the norm factor) is z: (b, h, 2) float32 pairs, the
    real result (b, nout) in C order."""
    load(engine)  # the driver registers the built-in kernels

    h = nout // 2
    m = h + 1
    if real:  # a real input is the real part; its imaginary part is zero
        rows = _fit_axis(astype(_to_last(x, ax), dt.float32), m, -1)
        lead = rows.shape[:-1]
    else:
        rows = _fit_axis(_complex_rows(x, ax), m, -2)
        lead = rows.shape[:-2]
    b = math.prod(lead)
    xs = reshape(rows, (b, m) if real else (b, m, 2))
    tw = _fft_table(x, dft.rfft_twiddles, nout)
    ix = _fft_table(x, dft.stockham_tables, 4, -1, 1)  # unused by the kernel (its signature)
    params = (("length", h), ("mode", "ipre"), ("n", nout), ("real", bool(real)),
              ("scale", 1.0), ("sign", 1))  # fmt: skip
    z = wrap(gn.make("custom", dt.float32, (b, h, 2), (xs._node, tw._node, ix._node),
                      (custom.builtin("fft_stockham"), params)), [x])  # fmt: skip
    scale = dft.norm_scale(norm, nout, True)
    impl, fs = dft.vector_plan(h, x._device.spec.ub_bytes)
    shape = lead + (nout,)  # the pairs of z are the real result in C order: no reshape node
    if impl == "stockham":
        zf = _stockham_rows(z, h, 1, scale, False, h, shape=shape)
    else:
        zf = _sixstep_rows(z, fs, 1, scale, False, shape=shape)
    if why:
        dft.note_plan(zf._node, why)
    return _from_last(astype(zf, out_dtype), ax)


def _slice_last(v: Tensor, i: int) -> Tensor:
    """v[..., i:i + 1]"""
    return _slice_node(v, tuple((0, d, 1) for d in v.shape[:-1]) + ((i, 1, 1),))


def _fft_cube(kind: str, x: Tensor, n, ax: int, norm, out_dtype, impl: str, fs: tuple,
              why: str) -> Tensor:  # fmt: skip
    """`kind` along `ax` as Cube DFT matmuls (see graph/dft.py)."""
    inverse = kind in ("ifft", "irfft")
    sign = 1 if inverse else -1
    size = x.shape[ax]
    real = not dt.is_complex(x.dtype)
    if kind == "irfft" and impl == "packed":
        return _irfft_packed(x, n if n is not None else 2 * (size - 1), ax, norm, out_dtype, real,
                             why)  # fmt: skip
    if kind == "irfft":
        nout = n if n is not None else 2 * (size - 1)
        m = nout // 2 + 1
        mat = _fft_table(x, dft.irfft_matrix, m, nout, dft.norm_scale(norm, nout, True), real)
        if real:  # a real input is the real part; its imaginary part is zero
            rows = _fit_axis(astype(_to_last(x, ax), dt.float32), m, -1)
        else:
            p = _fit_axis(_complex_rows(x, ax), m, -2)
            rows = reshape(p, p.shape[:-2] + (2 * m,))
        prod = matmul(rows, mat)
        dft.note_plan(prod._node, why)
        return _from_last(astype(prod, out_dtype), ax)
    nin = n if n is not None else size
    length = nin // 2 + 1 if kind == "rfft" else nin  # rfft: the first n // 2 + 1 frequencies
    other = tuple(d for i, d in enumerate(x.shape) if i != ax)
    win = _fft_window(x, ax, nin) if real and impl in ("stockham", "packed") else None
    ub = x._device.spec.ub_bytes
    vp = dft.vector_plan(nin, ub) if impl == "packed" else None
    one = vp is not None and vp[0] == "stockham" and (win is not None or size != nin)
    if vp is not None and (one or not _RFFT_PACKED):  # one kernel: the window, the zero pad
        impl, fs = vp
        what = "off" if not _RFFT_PACKED else "the window product or the zero pad in its load"
        why = (
            f"{impl}: {dft.describe(kind, impl, fs, nin, math.prod(other), ub)} (not packed: "
            f"{what})"
        )
    packed = impl == "packed"
    # direct, stockham and the packed rfft compute only the kept frequencies
    full = length if impl in ("direct", "stockham", "packed") else nin
    # a realized input keeps its transform graph (every node of it is interned: the same
    # structure), so a repeated call costs dictionary lookups instead of building ~30 nodes
    memo = _fft_memo.get(x._node) if x._node.realized is not None else None
    key = (kind, nin, ax, norm, fs, x._device, packed, packed and dft.RFFT_FUSED)
    out = None if memo is None else memo.get(key)
    if out is None:
        scale = dft.norm_scale(norm, nin, inverse)
        fit = builtins.min(nin, size) if impl == "stockham" else nin  # the kernel zero-pads
        win = win if impl == "stockham" else None
        if win is not None:
            rows = win[0]
        elif real:
            rows = _fit_axis(astype(_to_last(x, ax), dt.float32), fit, -1)
        else:
            rows = _fit_axis(_complex_rows(x, ax), fit, -2)
        if impl in ("bluestein", "bluestein-vector"):
            out = _bluestein_rows(rows, fs, sign, scale, real, impl == "bluestein-vector")._node
        elif packed:
            out = _rfft_packed(rows, nin, scale)._node
        elif impl == "stockham":
            wt = None if win is None else win[1]
            out = _stockham_rows(rows, nin, sign, scale, real, length, wt)._node
        elif impl == "six-step":
            out = _sixstep_rows(rows, fs, sign, scale, real)._node
        else:
            out = _dft_rows(rows, fs, sign, scale, real, full)._node
        while out.op == "reshape":  # the join reads its source in C order
            out = out.srcs[0]
        if x._node.realized is not None:
            if len(_fft_memo) > 64:
                _fft_memo.clear()
            _fft_memo.setdefault(x._node, {})[key] = out
    unit = "vector" if impl in ("stockham", "six-step", "bluestein-vector", "packed") else "cube"
    join = (out_dtype, other + (length,), (out,), (f"{unit} {why}", full), ax, dft.GEN)
    if x._node.realized is not None:
        _fft_memo.setdefault(x._node, {})[dft.fast_key(kind, x, n, ax, norm, _RFFT_PACKED)] = join
    return _from_last(wrap(gn.make("complex_join", *join[:4]), [x]), ax)


def _fft2_common(kind: str, x, s, axes, norm) -> Tensor:
    """numpy's fft2/ifft2: the 1-D transform over each of `axes`, last axis first, with the
    lengths `s` (crop or zero-pad, like `n`)."""
    x = x if isinstance(x, Tensor) else tensor(x)
    if norm not in _FFT_NORMS:
        raise ValueError(
            f"{kind}: norm must be None, 'backward', 'ortho' or 'forward', got {norm!r}"
        )
    if axes is None:
        axes = tuple(range(-len(s), 0)) if s is not None else tuple(range(-x.ndim, 0))
    if not isinstance(axes, (tuple, list)) or not builtins.all(
        isinstance(a, (int, np.integer)) for a in axes
    ):
        raise TypeError(f"{kind}: axes must be a sequence of ints, got {axes!r}")
    if s is None:
        for a in axes:
            _axes(a, x.ndim, kind)
        s = [None] * len(axes)
    elif not isinstance(s, (tuple, list)):
        raise TypeError(f"{kind}: s must be a sequence of ints, got {s!r}")
    elif len(s) != len(axes):
        raise ValueError(f"{kind}: s {tuple(s)} and axes {tuple(axes)} differ in length")
    base = "ifft" if kind.startswith("i") else "fft"
    for n in s:
        _fft_n(kind, n)
    out = x
    for a, n in reversed(list(zip(axes, s))):
        out = _fft_common(base, out, n, a, norm)
    return out


class _FFT:
    """lm.fft: numpy.fft semantics (`n` crops or zero-pads, `norm` backward/ortho/forward;
    complex64 results for float16/float32/complex64 inputs, complex128 for the others)."""

    @staticmethod
    def fft(x, n=None, axis=-1, norm=None) -> Tensor:
        return _fft_common("fft", x, n, axis, norm)

    @staticmethod
    def ifft(x, n=None, axis=-1, norm=None) -> Tensor:
        return _fft_common("ifft", x, n, axis, norm)

    @staticmethod
    def rfft(x, n=None, axis=-1, norm=None) -> Tensor:
        return _fft_common("rfft", x, n, axis, norm)

    @staticmethod
    def irfft(x, n=None, axis=-1, norm=None) -> Tensor:
        return _fft_common("irfft", x, n, axis, norm)

    @staticmethod
    def fft2(x, s=None, axes=(-2, -1), norm=None) -> Tensor:
        return _fft2_common("fft2", x, s, axes, norm)

    @staticmethod
    def ifft2(x, s=None, axes=(-2, -1), norm=None) -> Tensor:
        return _fft2_common("ifft2", x, s, axes, norm)


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
    axes = [_axes(a, x.ndim, f"fft.{who}")[0] for a in axes]
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
    return roll(flip(x, axis=ax), 1, axis=ax)


def _fit(x: Tensor, ax: int, n: int) -> Tensor:
    """Crop or zero-pad axis `ax` to n (numpy.fft's `n`)."""
    m = x.shape[ax]
    if n < m:
        return x[(slice(None),) * ax + (slice(0, n),)]
    if n > m:
        width = [(0, 0)] * x.ndim
        width[ax] = (0, n - m)
        return pad(x, width)
    return x


class _FFTExtension(_FFT):
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
        x = tensor_arg(x, f"fft.{kind}n")
        axes, s = _fft_s_axes(f"{kind}n", x, s, axes)
        out = x
        for a, n in reversed(list(zip(axes, s))):
            out = _fft_common(kind, out, n, a, norm)
        return out if axes else astype(x, _fft_out_dtype(kind, x.dtype))

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
        x = tensor_arg(x, "fft.rfftn")
        axes, s = _fft_s_axes("rfftn", x, s, axes)
        if not axes:
            raise ValueError("fft.rfftn: at least one axis is required")
        out = _fft_common("rfft", x, s[-1], axes[-1], norm)
        for a, n in zip(axes[:-1], s[:-1]):
            out = _fft_common("fft", out, n, a, norm)
        return out

    @staticmethod
    def irfftn(x, /, *, s=None, axes=None, norm="backward") -> Tensor:
        """ifft over all but the last of `axes`, then irfft over the last (its output length
        s[-1], by default 2 * (M - 1))."""
        x = tensor_arg(x, "fft.irfftn")
        axes, s = _fft_s_axes("irfftn", x, s, axes, last_real=True)
        if not axes:
            raise ValueError("fft.irfftn: at least one axis is required")
        out = x
        for a, n in zip(axes[:-1], s[:-1]):
            out = _fft_common("ifft", out, n, a, norm)
        return _fft_common("irfft", out, s[-1], axes[-1], norm)

    @staticmethod
    def hfft(x, /, *, n=None, axis=-1, norm="backward") -> Tensor:
        """The real spectrum of a Hermitian-symmetric signal (numpy's irfft(conj(x)) with the
        normalization swapped): irfft(x) reversed in time, which is the same thing."""
        x = tensor_arg(x, "fft.hfft")
        if norm not in _SWAP_NORM:
            raise ValueError(f"fft.hfft: norm must be 'backward', 'ortho' or 'forward', "
                             f"got {norm!r}")  # fmt: skip
        y = _fft_common("irfft", x, n, axis, _SWAP_NORM[norm])
        return _reverse_mod(y, _axes(axis, y.ndim, "fft.hfft")[0])

    @staticmethod
    def ihfft(x, /, *, n=None, axis=-1, norm="backward") -> Tensor:
        """conj(rfft(x)) with the normalization swapped: the rfft of x (cropped or padded to
        n) reversed in time."""
        x = tensor_arg(x, "fft.ihfft")
        if norm not in _SWAP_NORM:
            raise ValueError(f"fft.ihfft: norm must be 'backward', 'ortho' or 'forward', "
                             f"got {norm!r}")  # fmt: skip
        if dt.is_complex(x.dtype):
            raise TypeError("fft.ihfft: input must be real")
        if x.ndim == 0:
            raise ValueError("fft.ihfft: input must have at least one dimension")
        ax = _axes(axis, x.ndim, "fft.ihfft")[0]
        n = _fft_n("fft.ihfft", n)
        xn = _fit(x, ax, n) if n is not None else x
        if xn.shape[ax] < 1:
            raise ValueError(f"fft.ihfft: invalid number of data points ({xn.shape[ax]})")
        return _fft_common("rfft", _reverse_mod(xn, ax), None, ax, _SWAP_NORM[norm])

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
    return asarray(f.astype(d), device=device)


def _shift(x, axes, who: str, sign: int) -> Tensor:
    x = tensor_arg(x, f"fft.{who}")
    axes = _axes(axes, x.ndim, f"fft.{who}")
    if not axes:
        return x
    return roll(x, tuple(sign * (x.shape[a] // 2) for a in axes), axis=axes)


fft = _FFTExtension()
