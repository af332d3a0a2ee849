"""Linear algebra and convolution: matmul (numpy's rules for 1-D operands and batch broadcasting;
a Cube kernel), dot, conv1d (a Cube matmul over unfolded windows, or a depthwise Vector
kernel).
"""

from __future__ import annotations

import numpy as np

from lazymath import dtypes as dt
from lazymath._lazy import deferred, load
from lazymath.functions.base import _cast, _expand, astype, broadcast_shapes
from lazymath.functions.creation import tensor
from lazymath.functions.shapes import expand_dims, reshape
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
                   (custom.BUILTIN["conv1d_depthwise"], params))  # fmt: skip
    return wrap(node, [x])
