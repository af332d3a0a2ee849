"""The reference executor: numpy, node by node.

It is the correctness oracle for every compiled path (tests compare kernels against it and
`LAZYMATH_VALIDATE=1` re-runs kernels through it), and the implementation of AI CPU kernels.
It follows the NPU's numerics where numpy's differ: float16 matmul/conv multiply and accumulate
in float32 and round once at the end (numpy's own float16 matmul is also ~1000x slower), and
so does bfloat16 (ml_dtypes' numpy loops would accumulate sums in bfloat16).
Views stay views (numpy slicing/transposes), copies happen only where numpy would copy.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from lazymath.dtypes import is_bf16
from lazymath.graph import custom
from lazymath.graph.node import Node, toposort
from lazymath.graph.ops import ELEMENTWISE

# Counts evaluate() calls; tests use it to prove that building a graph computes nothing.
CALLS = {"nodes": 0}


def _matmul(a: np.ndarray, b: np.ndarray, out_dtype: np.dtype) -> np.ndarray:
    if a.dtype == np.float16 or is_bf16(a.dtype):  # exact products, float32 accumulation
        return np.matmul(a.astype(np.float32), b.astype(np.float32)).astype(a.dtype)
    return np.matmul(a, b).astype(out_dtype, copy=False)


def _slice(x: np.ndarray, spec) -> np.ndarray:
    idx = []
    for start, count, step in spec:
        stop = start + step * count
        idx.append(slice(start, stop if stop >= 0 else None, step))
    return x[tuple(idx)]


def reduce_array(x: np.ndarray, op: str, axes: tuple[int, ...], out_dtype: np.dtype) -> np.ndarray:
    if op in ("argmax", "argmin"):
        # flat index over the reduced axes (C order), like numpy's single-axis argmax
        keep = [d for d in range(x.ndim) if d not in axes]
        moved = np.transpose(x, keep + list(axes))
        n = 1
        for d in axes:
            n *= x.shape[d]
        flat = moved.reshape(moved.shape[: len(keep)] + (n,))  # not -1: the input may be empty
        return getattr(np, op)(flat, axis=-1).astype(np.int64)
    if op in ("sum", "prod") and (x.dtype == np.float16 or is_bf16(x.dtype)):
        # the NPU accumulates float16 (and bfloat16) in float32
        r = getattr(np, op)(x.astype(np.float32), axis=axes)
        return np.asarray(r).astype(x.dtype)
    fn = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}[op]
    return np.asarray(fn(x, axis=axes)).astype(out_dtype, copy=False)


def _conv1d(x, w, bias, stride, padding, dilation, groups, out_dtype):
    """torch.nn.functional.conv1d semantics, x (N, Cin, L), w (Cout, Cin/groups, K)."""
    acc = np.float32 if x.dtype == np.float16 or is_bf16(x.dtype) else out_dtype
    x = x.astype(acc, copy=False)
    w = w.astype(acc, copy=False)
    n, cin, _ = x.shape
    cout, cpg, k = w.shape
    pads = (padding, padding) if isinstance(padding, int) else tuple(padding)  # (left, right)
    if any(pads):
        x = np.pad(x, ((0, 0), (0, 0), pads))
    lp = x.shape[2]
    lout = (lp - dilation * (k - 1) - 1) // stride + 1
    out = np.zeros((n, cout, max(lout, 0)), dtype=acc)
    opg = cout // groups
    for g in range(groups):
        xs = x[:, g * cpg : (g + 1) * cpg, :]
        for j in range(k):
            start = j * dilation
            seg = xs[:, :, start : start + stride * (lout - 1) + 1 : stride]  # (n, cpg, lout)
            wj = w[g * opg : (g + 1) * opg, :, j]  # (opg, cpg)
            out[:, g * opg : (g + 1) * opg, :] += np.einsum("oc,ncl->nol", wj, seg)
    if bias is not None:
        out += bias.astype(acc, copy=False)[None, :, None]
    return out.astype(out_dtype, copy=False)


def windows(x: np.ndarray, k: int, stride: int, dilation: int, pad: int, lout: int) -> np.ndarray:
    """x (..., C, L) -> (..., C*K, L_out): element (c*K + j, l) = x[..., c, l*stride +
    j*dilation - pad], 0 outside x (conv1d's zero-padded im2col)."""
    *lead, c, length = x.shape
    pos = np.arange(lout)[None, :] * stride + np.arange(k)[:, None] * dilation - pad  # (K, Lout)
    ok = (pos >= 0) & (pos < length)
    if length:
        cols = np.where(ok, x[..., np.clip(pos, 0, length - 1)], x.dtype.type(0))
    else:
        cols = np.zeros((*lead, c, k, lout), x.dtype)
    return cols.astype(x.dtype, copy=False).reshape(*lead, c * k, lout)


def im2col(
    x: np.ndarray, k: int, stride: int, dilation: int, pad: int, groups: int, lout: int
) -> np.ndarray:
    """The `im2col` node: x (N, C, L) -> (N, C*K, L_out) for groups 1, else (N, G, C/G*K, L_out)
    (`windows` of each group's channels)."""
    if groups == 1:
        return windows(x, k, stride, dilation, pad, lout)
    n, c, length = x.shape
    return windows(x.reshape(n, groups, c // groups, length), k, stride, dilation, pad, lout)


def _fft(x, kind, n, axis, norm, out_dtype):
    fn = {"fft": np.fft.fft, "ifft": np.fft.ifft, "rfft": np.fft.rfft, "irfft": np.fft.irfft}[kind]
    return fn(x, n=n, axis=axis, norm=norm).astype(out_dtype, copy=False)


def evaluate(node: Node, srcs: list[np.ndarray]) -> np.ndarray:
    """Compute one node from its sources' values (always an ndarray: numpy reductions to 0-d
    return numpy scalars, which have no strides for a backend to bind)."""
    CALLS["nodes"] += 1
    return np.asarray(_evaluate(node, srcs))


def fold(node: Node, srcs: list[np.ndarray]) -> np.ndarray:
    """Constant folding at graph-build time: the same numpy rule as `evaluate`, but not counted
    in CALLS (CALLS counts realize-time work; folding a scalar is part of building)."""
    return np.asarray(_evaluate(node, srcs))


def _evaluate(node: Node, srcs: list[np.ndarray]) -> np.ndarray:
    op, arg = node.op, node.arg
    with np.errstate(all="ignore"):
        if op in ELEMENTWISE:
            if op == "cast":
                x = srcs[0]
                if is_bf16(x.dtype) and node.dtype.kind in "iu":  # as the kernels: via float32
                    x = x.astype(np.float32)  # (ml_dtypes clamps where numpy's float32 wraps)
                return x.astype(node.dtype)
            fn = ELEMENTWISE[op].info.ref
            out = fn(*srcs, arg) if op == "leaky_relu" else fn(*srcs)
            return np.asarray(out).astype(node.dtype, copy=False)
        if op == "reshape":
            return np.reshape(srcs[0], node.shape)
        if op == "permute":
            return np.transpose(srcs[0], arg)
        if op == "expand":
            return np.broadcast_to(srcs[0], node.shape)
        if op == "slice":
            return _slice(srcs[0], arg)
        if op == "window":
            strides, off = arg
            flat = np.ascontiguousarray(srcs[0])[off:]
            size = flat.dtype.itemsize
            return np.lib.stride_tricks.as_strided(
                flat, node.shape, tuple(s * size for s in strides), writeable=False
            )
        if op == "im2col":
            return im2col(srcs[0], *arg, node.shape[-1])
        if op == "reduce":
            return reduce_array(srcs[0], arg[0], arg[1], node.dtype)
        if op == "matmul":
            return _matmul(srcs[0], srcs[1], node.dtype)
        if op == "pad":
            widths, value = arg
            return np.pad(srcs[0], widths, constant_values=value).astype(node.dtype, copy=False)
        if op == "concat":
            return np.concatenate(srcs, axis=arg).astype(node.dtype, copy=False)
        if op == "conv1d":
            stride, padding, dilation, groups = arg
            bias = srcs[2] if len(srcs) > 2 else None
            return _conv1d(srcs[0], srcs[1], bias, stride, padding, dilation, groups, node.dtype)
        if op == "fft":
            return _fft(srcs[0], *arg[:4], node.dtype)
        if op == "complex_planes":  # (..., n) complex64 -> (..., n, 2) float32, the same bytes
            x = np.ascontiguousarray(srcs[0], np.complex64)
            return x.view(np.float32).reshape(node.shape)
        if op == "complex_join":  # arg = (why, nfull): srcs[0] in C order is (..., nfull, 2)
            p = np.asarray(srcs[0], np.float32).reshape(node.shape[:-1] + (arg[1], 2))
            p = np.ascontiguousarray(p[..., : node.shape[-1], :])
            return p.view(node.dtype).reshape(node.shape)
        if op == "custom":  # a user kernel: its numpy reference (or its program, interpreted)
            return custom.get(arg[0]).evaluate(srcs, arg, node.dtype, node.shape)
    raise NotImplementedError(f"reference executor has no rule for op {op!r}")


def run(roots: Iterable[Node]) -> dict[int, np.ndarray]:
    """Evaluate every pending node reachable from `roots`; returns id(node) -> value."""
    values: dict[int, np.ndarray] = {}
    for node in toposort(roots):
        if node.realized is not None:
            values[id(node)] = node.realized
            continue
        try:
            values[id(node)] = evaluate(node, [values[id(s)] for s in node.srcs])
        except Exception as e:
            # name the user's line that created the failing node, not this frame
            _add_note(
                e, f"while computing {node.op} {node.dtype} {node.shape} created at {node.loc}"
            )
            raise
    return values


def _add_note(e: BaseException, note: str) -> None:
    if hasattr(e, "add_note"):  # Python >= 3.11
        e.add_note(note)
    elif e.args and isinstance(e.args[0], str):
        e.args = (f"{e.args[0]} ({note})",) + e.args[1:]
