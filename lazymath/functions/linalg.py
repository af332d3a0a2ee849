"""Linear algebra and convolution: matmul (numpy's rules for 1-D operands and batch broadcasting;
a Cube kernel), dot, conv1d (a Cube matmul over unfolded windows, or a depthwise Vector
kernel); tensordot, vecdot and `linalg`, the Array API's linalg extension (`lm.linalg`).
"""

from __future__ import annotations

import builtins
import math
import operator
from collections import namedtuple

import numpy as np

from lazymath import dtypes as dt
from lazymath._lazy import deferred, load
from lazymath.functions.base import _axes, _cast, _expand, astype, broadcast_shapes
from lazymath.functions.creation import eye, from_host, host_value, tensor, tensor_arg, zeros
from lazymath.functions.datatypes import result_type
from lazymath.functions.elementwise import abs, conj, exp, log, mul, pow, sqrt
from lazymath.functions.manipulation import dense_view, matrix_transpose
from lazymath.functions.reductions import count_nonzero, max, min, sum
from lazymath.functions.shapes import _slice_node, broadcast_to, expand_dims, permute_dims, reshape
from lazymath.graph import custom, reference
from lazymath.graph import node as gn
from lazymath.graph.ops import ELEMENTWISE, VIEWS
from lazymath.tensor import Tensor, check_devices, wrap

# The driver, loaded on first use (not by `import lazymath`): it registers the built-in kernel
# definitions (the Vector FFT, the depthwise conv1d) that these functions' graph nodes name.
engine = deferred("lazymath.engine")

# ----------------------------------------------------------------------------- matmul


def _const_operand(node):
    """A matmul operand computed from constants alone (`lm.zeros(...)` and elementwise functions
    of it: the Cube kernel would have no buffer to load) as a realized buffer; others as is."""
    stack, seen = [node], set()
    while stack:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if x.op == "const":
            continue
        if x.realized is not None or not (x.op in ELEMENTWISE or x.op in VIEWS):
            return node
        stack.extend(x.srcs)
    return gn.buffer_node(np.ascontiguousarray(reference.run([node])[id(node)]))


def matmul(a, b) -> Tensor:
    """Matrix product with numpy's rules: 1-D operands are promoted (and the added axis removed
    again), leading axes broadcast as a batch, dtypes promote.

    Runs on the Cube unit for float16/bfloat16/float32 (float16 and bfloat16 accumulate in
    float32 and round once, on the FixPipe's way out); int and float64
    matmuls run on the AI CPU, and `lm.explain` says why. Elementwise ops that consume the
    result fuse into the Cube kernel's epilogue."""
    a = a if isinstance(a, Tensor) else tensor(a)
    b = b if isinstance(b, Tensor) else tensor(b)
    check_devices("matmul", [a, b])
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(
            f"matmul: operands must have at least 1 dimension, got shapes {a.shape} and {b.shape}"
        )
    try:
        out_dtype = dt.result_type(a.dtype, b.dtype)
    except TypeError as e:
        raise TypeError(f"matmul: {e}") from None
    if out_dtype == dt.bool_:
        raise TypeError("matmul: bool operands are not supported; cast them to an integer dtype")
    a2 = reshape(a, (1, a.shape[0])) if a.ndim == 1 else a
    b2 = reshape(b, (b.shape[0], 1)) if b.ndim == 1 else b
    if a2.shape[-1] != b2.shape[-2]:
        raise ValueError(
            f"matmul: inner dimensions do not match: a has shape {a.shape}, b has shape "
            f"{b.shape} ({a2.shape[-1]} != {b2.shape[-2]}); the last axis of a must equal the "
            f"{'only' if b.ndim == 1 else 'second-to-last'} axis of b"
        )
    batch = broadcast_shapes(a2.shape[:-2], b2.shape[:-2], op="matmul (batch dimensions)")
    m, k, n = a2.shape[-2], a2.shape[-1], b2.shape[-1]
    na = _expand(_cast(_const_operand(a2._node), out_dtype), batch + (m, k))
    nb = _expand(_cast(_const_operand(b2._node), out_dtype), batch + (k, n))
    out = wrap(gn.make("matmul", out_dtype, batch + (m, n), (na, nb)), [a])
    if a.ndim == 1 and b.ndim == 1:
        return reshape(out, ())
    if a.ndim == 1:
        return reshape(out, batch + (n,))
    if b.ndim == 1:
        return reshape(out, batch + (m,))
    return out


def dot(a, b) -> Tensor:
    """numpy.dot for 1-D and 2-D operands: the same as `matmul` (for N-D operands numpy's dot
    contracts differently; use `matmul` or `tensordot` there)."""
    return matmul(a, b)


# ----------------------------------------------------------------------------- conv1d, fft


def conv1d(x, weight, bias=None, stride: int = 1, padding: int | str = 0, dilation: int = 1,
           groups: int = 1) -> Tensor:  # fmt: skip
    """torch.nn.functional.conv1d: x (N, C_in, L) or (C_in, L), weight (C_out, C_in/groups, K);
    `padding` an int, "valid" (0) or "same" (stride 1 only; the output keeps L, the odd
    padding element on the right, as torch)."""
    x = x if isinstance(x, Tensor) else tensor(x)
    w = weight if isinstance(weight, Tensor) else tensor(weight)
    unbatched = x.ndim == 2
    if unbatched:
        x = expand_dims(x, 0)
    if x.ndim != 3 or w.ndim != 3:
        raise ValueError(
            f"conv1d: expected x of shape (N, C_in, L) or (C_in, L) and weight (C_out, C_in/groups,"
            f" K), got {x.shape} and {w.shape}"
        )
    same = isinstance(padding, str) and padding == "same"
    if isinstance(padding, str):
        if padding not in ("same", "valid"):
            raise ValueError(f"conv1d: padding must be an int, 'same' or 'valid', got {padding!r}")
        padding = 0
    for name, v, lo in (("stride", stride, 1), ("padding", padding, 0), ("dilation", dilation, 1),
                        ("groups", groups, 1)):  # fmt: skip
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < lo:
            raise ValueError(f"conv1d: {name} must be an int >= {lo}, got {v!r}")
    n, cin, length = x.shape
    cout, cpg, k = w.shape
    pads = (int(padding), int(padding))
    if same:
        if stride != 1:
            raise ValueError("conv1d: padding='same' is not supported for strided convolutions")
        total = dilation * (k - 1)
        pads = (total // 2, total - total // 2)
    if cin % groups or cout % groups or cpg != cin // groups:
        raise ValueError(
            f"conv1d: weight {w.shape} does not match input channels {cin} with groups={groups} "
            f"(need C_in/groups = {cin // groups if cin % groups == 0 else '?'} and C_out % groups"
            f" == 0)"
        )
    lout = (length + pads[0] + pads[1] - dilation * (k - 1) - 1) // stride + 1
    if lout < 1:
        raise ValueError(
            f"conv1d: input length {length} (padding {pads}) is shorter than the dilated kernel"
            f" {dilation * (k - 1) + 1}"
        )
    out_dtype = dt.result_type(x.dtype, w.dtype)
    srcs = [_cast(x._node, out_dtype), _cast(w._node, out_dtype)]
    b = None
    if bias is not None:
        b = bias if isinstance(bias, Tensor) else tensor(bias)
        if b.shape != (cout,):
            raise ValueError(f"conv1d: bias must have shape ({cout},), got {b.shape}")
        srcs.append(_cast(b._node, out_dtype))
    impl = _conv1d_impl(out_dtype, n * lout * cout, cpg, cout, groups, stride)
    if impl is not None:
        out = impl(x, w, b, out_dtype, stride, pads, dilation, lout)
        return reshape(out, (cout, lout)) if unbatched else out
    node = gn.make("conv1d", out_dtype, (n, cout, lout), srcs,
                   (int(stride), pads, int(dilation), int(groups)))  # fmt: skip
    out = wrap(node, [x])
    return reshape(out, (cout, lout)) if unbatched else out


def _conv1d_impl(out_dtype, size: int, cpg: int, cout: int, groups: int, stride: int):
    """The AI Core form of a conv1d, None for the AI CPU's: a depthwise convolution (C_in/groups
    = 1 = C_out/groups) is one Vector kernel (K multiply-adds, the padding in its loads); any
    other float16/float32 one (dense, grouped, strided, dilated, padded) is an implicit GEMM on the
    Cube: one matmul whose B operand, an `im2col` node of x, is built by the GM -> L1 packing
    (no im2col buffer, no padded copy: backend/im2col.py)."""
    if out_dtype not in (dt.float16, dt.float32) or size == 0:
        return None
    if cpg == 1 and cout == groups and groups > 1:
        return _conv1d_depthwise
    return _conv1d_cube


def _conv1d_cube(x, w, b, dtype, stride, pads, dilation, lout) -> Tensor:
    """Implicit GEMM: out[n, g] = W_g (C_out/G, C/G*K) @ B[n, g] (C/G*K, L_out) with B = im2col
    of x (element (c*K + j, l) = x[n, g*C/G + c, l*stride + j*dilation - pad_left], 0 in the
    padding): the weight's own (c, j) order, so W_g is a free reshape of w; the Cube's B packing
    reads x in place (any layout) and builds the windows and the zero padding on the way to L1.
    Bias and elementwise consumers are the matmul's epilogue, an elementwise producer of x its
    prologue."""
    n, cin, _ = x.shape
    cout, cpg, k = w.shape
    groups = cin // cpg
    shape = (n, cpg * k, lout) if groups == 1 else (n, groups, cpg * k, lout)
    cols = gn.make("im2col", dtype, shape, (_cast(x._node, dtype),),
                   (int(k), int(stride), int(dilation), int(pads[0]), int(groups)))  # fmt: skip
    wg = astype(w, dtype)
    wg = reshape(wg, (cout, cpg * k) if groups == 1 else (groups, cout // groups, cpg * k))
    out = matmul(wg, wrap(cols, [x]))
    if groups > 1:  # (N, G, C_out/G, L_out) is (N, C_out, L_out) in memory
        out = reshape(out, (n, cout, lout))
    return out if b is None else out + reshape(astype(b, dtype), (cout, 1))


def _conv1d_depthwise(x, w, b, dtype, stride, pads, dilation, lout) -> Tensor:
    """Depthwise, stride 1: one Vector kernel (backend/templates/conv1d.py) over the rows
    (n, c) of x read in place, the zero padding in the bounds of its loads; elementwise
    consumers fuse into its epilogue slot."""
    load(engine)  # the driver registers the built-in kernels

    n, c, _ = x.shape
    k = w.shape[2]
    srcs = [astype(x, dtype)._node, astype(w, dtype)._node]
    if b is not None:
        srcs.append(astype(b, dtype)._node)
    params = (("bias", b is not None), ("dilation", int(dilation)), ("k_taps", int(k)),
              ("lout", int(lout)), ("pad", int(pads[0])), ("stride", int(stride)))  # fmt: skip
    node = gn.make("custom", dtype, (n, c, lout), tuple(srcs),
                   (custom.builtin("conv1d_depthwise"), params))  # fmt: skip
    return wrap(node, [x])


# ----------------------------------------------------------------------------- the linalg extension


def tensordot(x1, x2, /, *, axes=2) -> Tensor:
    """Sum products over the last `axes` axes of x1 and the first of x2, or over the given
    pairs (lazy: permute, reshape, one matmul)."""
    a, b = tensor_arg(x1, "tensordot"), tensor_arg(x2, "tensordot")
    if isinstance(axes, int):
        if axes < 0:
            raise ValueError("tensordot: axes must be non-negative")
        ax_a = list(range(a.ndim - axes, a.ndim))
        ax_b = list(range(axes))
    else:
        ax_a, ax_b = ([axes[0]] if isinstance(axes[0], int) else list(axes[0]),
                      [axes[1]] if isinstance(axes[1], int) else list(axes[1]))  # fmt: skip
        ax_a = [_axes(v, a.ndim, "tensordot")[0] for v in ax_a]
        ax_b = [_axes(v, b.ndim, "tensordot")[0] for v in ax_b]
    if len(ax_a) != len(ax_b):
        raise ValueError("tensordot: the two axes lists differ in length")
    for i, j in zip(ax_a, ax_b):
        if a.shape[i] != b.shape[j]:
            raise ValueError(f"tensordot: shape mismatch on summed axes {a.shape} {b.shape}")
    free_a = [d for d in range(a.ndim) if d not in ax_a]
    free_b = [d for d in range(b.ndim) if d not in ax_b]
    k = math.prod(a.shape[d] for d in ax_a)
    am = reshape(dense_view(permute_dims(a, free_a + ax_a)),
                   (math.prod(a.shape[d] for d in free_a), k))  # fmt: skip
    bm = reshape(dense_view(permute_dims(b, ax_b + free_b)),
                   (k, math.prod(b.shape[d] for d in free_b)))  # fmt: skip
    out = matmul(am, bm)
    return reshape(out, tuple(a.shape[d] for d in free_a) + tuple(b.shape[d] for d in free_b))


def vecdot(x1, x2, /, *, axis: int = -1) -> Tensor:
    """sum(conj(x1) * x2) along `axis`, broadcasting the others (lazy, one fused kernel)."""
    a, b = tensor_arg(x1, "vecdot"), tensor_arg(x2, "vecdot")
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError("vecdot: inputs must have at least one dimension")
    nd = builtins.max(a.ndim, b.ndim)
    if not -nd <= axis < 0 and not 0 <= axis < builtins.min(a.ndim, b.ndim):
        raise ValueError(f"vecdot: axis {axis} out of range")
    if a.shape[axis] != b.shape[axis]:
        raise ValueError(f"vecdot: sizes {a.shape[axis]} and {b.shape[axis]} differ on axis "
                         f"{axis}")  # fmt: skip
    ax = axis if axis < 0 else axis - a.ndim
    p = mul(conj(a), b)
    return astype(sum(p, ax), p.dtype, copy=False)  # the operands' dtype, not the sum's


def _float_host(x: Tensor, who: str) -> tuple[np.ndarray, np.dtype]:
    """x on the host for a numpy.linalg routine, and the dtype of the result (float16 is
    computed in float32 and rounded back)."""
    if x.dtype.kind not in "fc":
        raise TypeError(f"linalg.{who}: expected a floating-point tensor, got {x.dtype}")
    a = host_value(x, f"linalg.{who}")
    return (a.astype(np.float32) if a.dtype == np.float16 else a), x.dtype


class _Linalg:
    """The Array API `linalg` extension (`lm.linalg`).

    Lazy (graph ops that fuse): matmul, matrix_transpose, tensordot, vecdot, outer, diagonal,
    trace, vector_norm, matrix_norm ('fro', 1, -1, inf, -inf). The factorizations and solvers
    (cholesky, det, eigh, eigvalsh, inv, pinv, qr, slogdet, solve, svd, svdvals, matrix_rank,
    matrix_power, the 2/-2/'nuc' matrix norms, cross) run numpy.linalg on the host at the call
    (they realize their inputs); float16 goes through float32."""

    matmul = staticmethod(matmul)
    matrix_transpose = staticmethod(matrix_transpose)
    tensordot = staticmethod(tensordot)
    vecdot = staticmethod(vecdot)

    @staticmethod
    def outer(x1, x2, /) -> Tensor:
        a, b = tensor_arg(x1, "outer"), tensor_arg(x2, "outer")
        if a.ndim != 1 or b.ndim != 1:
            raise ValueError("linalg.outer: inputs must be 1-d")
        return mul(reshape(a, (-1, 1)), reshape(b, (1, -1)))

    @staticmethod
    def diagonal(x, /, *, offset: int = 0) -> Tensor:
        """The k-th diagonal of the last two axes (a lazy strided view)."""
        x = tensor_arg(x, "diagonal")
        if x.ndim < 2:
            raise ValueError(f"linalg.diagonal: needs at least 2 dimensions, got {x.shape}")
        m, n = x.shape[-2:]
        k = operator.index(offset)
        start = k if k >= 0 else -k * n
        count = builtins.max(0, builtins.min(m, n - k) if k >= 0 else builtins.min(m + k, n))
        flat = reshape(dense_view(x), x.shape[:-2] + (m * n,))
        if count == 0:
            return zeros(x.shape[:-2] + (0,), x.dtype)
        spec = tuple((0, s_, 1) for s_ in x.shape[:-2]) + ((start, count, n + 1),)
        return _slice_node(flat, spec)

    @staticmethod
    def trace(x, /, *, offset: int = 0, dtype=None) -> Tensor:
        return sum(_Linalg.diagonal(x, offset=offset), -1, dtype=dtype)

    @staticmethod
    def vector_norm(x, /, *, axis=None, keepdims: bool = False, ord=2) -> Tensor:  # noqa: A002
        """The p-norm over `axis` (all by default): lazy abs, power, sum."""
        x = tensor_arg(x, "vector_norm")
        if x.dtype.kind not in "fc":
            raise TypeError(f"linalg.vector_norm: expected a floating tensor, got {x.dtype}")
        a = abs(x)
        if ord == math.inf:
            return max(a, axis, keepdims)
        if ord == -math.inf:
            return min(a, axis, keepdims)
        if ord == 0:
            return astype(count_nonzero(a, axis=axis, keepdims=keepdims), a.dtype)
        if ord == 1:
            return sum(a, axis, keepdims)
        if ord == 2:
            return sqrt(sum(mul(a, a), axis, keepdims))
        p = float(ord)
        # the root as exp(log(s) / p): a pow composite on both sides of one reduce kernel
        # trips a duplicate-buffer bug of the reduce template (on main before issue 16)
        return exp(mul(log(sum(pow(a, p), axis, keepdims)), 1.0 / p))

    @staticmethod
    def matrix_norm(x, /, *, keepdims: bool = False, ord="fro") -> Tensor:  # noqa: A002
        x = tensor_arg(x, "matrix_norm")
        if x.ndim < 2:
            raise ValueError("linalg.matrix_norm: needs at least 2 dimensions")
        a = abs(x)
        if ord == "fro":
            out = sqrt(sum(mul(a, a), (-2, -1)))
        elif ord in (1, -1):
            s_ = sum(a, -2)
            out = max(s_, -1) if ord == 1 else min(s_, -1)
        elif ord in (math.inf, -math.inf):
            s_ = sum(a, -1)
            out = max(s_, -1) if ord == math.inf else min(s_, -1)
        else:
            h, d = _float_host(x, "matrix_norm")
            out = from_host(np.linalg.norm(h, ord=ord, axis=(-2, -1)).astype(
                np.finfo(d).dtype if d.kind == "c" else d), x)  # fmt: skip
        if keepdims:
            out = reshape(out, out.shape + (1, 1))
        return out

    @staticmethod
    def cross(x1, x2, /, *, axis: int = -1) -> Tensor:
        a, b = tensor_arg(x1, "cross"), tensor_arg(x2, "cross")
        if a.shape[axis] != 3 or b.shape[axis] != 3:
            raise ValueError("linalg.cross: the axis must have size 3")
        r = np.cross(host_value(a, "cross"), host_value(b, "cross"), axis=axis)
        return from_host(r.astype(result_type(a, b)), a)

    @staticmethod
    def _host_fn(name, fn, x, *, real=False):
        h, d = _float_host(tensor_arg(x, name), name)
        out = fn(h)
        if real and d.kind == "c":
            d = np.finfo(d).dtype
        if isinstance(out, tuple):  # a real part of the result stays real (svd's S, eigh's
            # eigenvalues, slogdet's logabsdet of a complex x), as the standard says
            to = {"c": d, "f": np.finfo(d).dtype}
            outs = [np.asarray(o) for o in out]
            return tuple(from_host(o.astype(to.get(o.dtype.kind, o.dtype)), x) for o in outs)
        return from_host(np.asarray(out).astype(d), x)

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
        r = (
            1e-15
            if rtol is None
            else (host_value(rtol, "pinv") if isinstance(rtol, Tensor) else rtol)
        )
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
        a, b = tensor_arg(x1, "solve"), tensor_arg(x2, "solve")
        ha, d = _float_host(a, "solve")
        hb, _ = _float_host(b, "solve")
        if b.ndim == 1:
            r = np.linalg.solve(ha, hb[..., None])[..., 0]
        else:
            r = np.linalg.solve(ha, hb)
        return from_host(r.astype(result_type(a, b)), a)

    @staticmethod
    def matrix_rank(x, /, *, rtol=None) -> Tensor:
        h, _ = _float_host(tensor_arg(x, "matrix_rank"), "matrix_rank")
        return from_host(np.asarray(np.linalg.matrix_rank(h, rtol=rtol)).astype(np.int64), x)

    @staticmethod
    def matrix_power(x, n, /) -> Tensor:
        x = tensor_arg(x, "matrix_power")
        n = operator.index(n)
        if n < 0:
            return _Linalg.matrix_power(_Linalg.inv(x), -n)
        out = None
        base = x
        while n:
            if n & 1:
                out = base if out is None else matmul(out, base)
            n >>= 1
            if n:
                base = matmul(base, base)
        if out is None:
            return broadcast_to(eye(x.shape[-1], dtype=x.dtype), x.shape)
        return out


_EighResult = namedtuple("EighResult", "eigenvalues eigenvectors")
_QRResult = namedtuple("QRResult", "Q R")
_SlogdetResult = namedtuple("SlogdetResult", "sign logabsdet")
_SVDResult = namedtuple("SVDResult", "U S Vh")


linalg = _Linalg()
