"""Evaluate kernel IR directly with numpy.

This is the oracle for the *fusion* layer: it checks that a fused kernel description means the
same as the graph it came from, independently of the ISA templates and the LLVM lowering. It is
also what `LAZYMATH_VALIDATE=1` compares compiled kernels against.
"""

from __future__ import annotations

import numpy as np

from lazymath.backend.npu.kernel_ir import (
    ArgView,
    CustomKernel,
    ElementwiseKernel,
    MatmulKernel,
    ReduceKernel,
    RowKernel,
    SOp,
)
from lazymath.graph.custom import get
from lazymath.graph.ops import ELEMENTWISE
from lazymath.graph.reference import reduce_array, windows


class _Raw:
    """Exposes raw memory (pointer, shape, strides) through the array interface, keeping the
    owning array alive; lets a view start anywhere, including before a negative-stride base."""

    def __init__(self, owner: np.ndarray, ptr: int, shape, strides, typestr: str):
        self.owner = owner
        self.__array_interface__ = {
            "data": (ptr, True),
            "shape": tuple(shape),
            "strides": tuple(strides),
            "typestr": typestr,
            "version": 3,
        }


def view_of(arr: np.ndarray, v: ArgView) -> np.ndarray:
    """The numpy view `v` describes over a buffer whose element 0 is at arr's data pointer."""
    if 0 in v.shape:
        return np.zeros(v.shape, arr.dtype)
    item = arr.dtype.itemsize
    ptr = arr.__array_interface__["data"][0] + v.offset * item
    raw = _Raw(arr, ptr, v.shape, tuple(s * item for s in v.strides), arr.dtype.str)
    return np.asarray(raw)


def _scalar(op: SOp, srcs: list[np.ndarray]):
    dtype = np.dtype(op.dtype)
    if op.op == "cast":
        return srcs[0].astype(dtype)
    fn = ELEMENTWISE[op.op].info.ref
    out = fn(*srcs, op.arg) if op.op == "leaky_relu" else fn(*srcs)
    return np.asarray(out).astype(dtype, copy=False)


def eval_expr(expr, loads: list[np.ndarray], shape, acc: np.ndarray | None = None) -> list:
    vals: list = []
    with np.errstate(all="ignore"):
        for op in expr:
            if op.op == "load":
                vals.append(loads[op.arg])
            elif op.op == "const":
                vals.append(np.full(shape, op.arg, dtype=op.dtype))
            elif op.op == "acc":
                vals.append(acc.astype(op.dtype, copy=False))
            else:
                vals.append(_scalar(op, [vals[i] for i in op.srcs]))
    return vals


def run(ir, arrays: list[np.ndarray]) -> None:
    """Execute `ir` on flat buffers `arrays` (kernel_args order), writing the outputs."""
    if isinstance(ir, ElementwiseKernel):
        n_in = len(ir.inputs)
        loads = [view_of(a, v) for a, v in zip(arrays, ir.inputs)]
        vals = eval_expr(ir.expr, loads, ir.shape)
        for out, r in zip(arrays[n_in:], ir.results):
            out.reshape(-1)[: int(np.prod(ir.shape))] = np.broadcast_to(vals[r], ir.shape).reshape(
                -1
            )
        return
    if isinstance(ir, ReduceKernel):
        n_in, n_epi = len(ir.inputs), len(ir.epi_inputs)
        loads = [view_of(a, v) for a, v in zip(arrays, ir.inputs)]
        pro = eval_expr(ir.prologue, loads, ir.in_shape)
        x = np.broadcast_to(pro[ir.prologue_result], ir.in_shape)
        if ir.op in ("sum", "prod") and ir.acc_dtype != x.dtype.name:
            x = x.astype(ir.acc_dtype)
        acc = reduce_array(x, ir.op, ir.axes, np.dtype(ir.acc_dtype))
        acc = np.asarray(acc, dtype=ir.acc_dtype).reshape(ir.out_shape)
        eloads = [view_of(a, v) for a, v in zip(arrays[n_in : n_in + n_epi], ir.epi_inputs)]
        vals = eval_expr(ir.epilogue, eloads, ir.out_shape, acc)
        size = int(np.prod(ir.out_shape))
        for out, r in zip(arrays[n_in + n_epi :], ir.results):
            out.reshape(-1)[:size] = np.broadcast_to(vals[r], ir.out_shape).reshape(-1)
        return
    if isinstance(ir, RowKernel):
        n_in = len(ir.inputs)
        shape = ir.in_shape
        axes = tuple(a % len(shape) for a in ir.axes)
        loads = [np.broadcast_to(view_of(a, v), shape) for a, v in zip(arrays, ir.inputs)]
        vals: list = []
        with np.errstate(all="ignore"):
            for op in ir.expr:
                if op.op == "reduce":
                    x = np.broadcast_to(vals[op.srcs[0]], shape).astype(op.dtype)
                    r = np.asarray(
                        reduce_array(x, op.arg, axes, np.dtype(op.dtype)), dtype=op.dtype
                    )
                    vals.append(np.broadcast_to(np.expand_dims(r, axes), shape))
                elif op.op == "load":
                    vals.append(loads[op.arg])
                elif op.op == "const":
                    vals.append(np.full(shape, op.arg, dtype=op.dtype))
                else:
                    vals.append(_scalar(op, [vals[i] for i in op.srcs]))
        kd = tuple(1 if d in axes else s for d, s in enumerate(shape))
        for out, r, row, v in zip(arrays[n_in:], ir.results, ir.row_outputs, ir.outputs):
            full = np.broadcast_to(vals[r], shape)
            val = full[tuple(slice(0, 1) if d in axes else slice(None) for d in range(len(shape)))]
            val = val.reshape(kd) if row else full
            size = int(np.prod(v.shape))
            out.reshape(-1)[:size] = np.ascontiguousarray(val).reshape(-1)
        return
    if isinstance(ir, MatmulKernel):
        a = view_of(arrays[0], ir.a)
        b = view_of(arrays[1], ir.b)
        if ir.a_prologue is not None:
            a = eval_expr(ir.a_prologue, [a], a.shape)[-1]
        if ir.b_prologue is not None:
            b = eval_expr(ir.b_prologue, [b], b.shape)[-1]
        if ir.b_im2col:  # implicit GEMM: b is x, the windows zero-padded after the prologue
            b = windows(np.broadcast_to(b, ir.b.shape), *ir.b_im2col, ir.n)
        acc = np.matmul(a.astype(np.float32), b.astype(np.float32))
        n_epi = len(ir.epi_inputs)
        eloads = [view_of(x, v) for x, v in zip(arrays[2 : 2 + n_epi], ir.epi_inputs)]
        shape = ir.batch + (ir.m, ir.n)
        vals = eval_expr(ir.epilogue, eloads, shape, acc)
        size = int(np.prod(shape))
        n_out = len(ir.outputs)
        for out, r in zip(arrays[2 + n_epi : 2 + n_epi + n_out], ir.results):
            out.reshape(-1)[:size] = np.broadcast_to(vals[r], shape).reshape(-1)
        for out, r, v in zip(arrays[2 + n_epi + n_out :], ir.col_sums, ir.col_sum_outputs):
            s = np.broadcast_to(vals[r], shape).astype(np.float32).sum(axis=-2)
            out.reshape(-1)[: int(np.prod(v.shape))] = s.astype(v.dtype).reshape(-1)
        rest = arrays[2 + n_epi + n_out + len(ir.col_sums) :]
        for j, (out, (op, r), v) in enumerate(zip(rest, ir.row_reds, ir.row_red_outputs)):
            x = np.broadcast_to(vals[r], shape).astype(np.float32)
            s = {"sum": np.sum, "max": np.max, "min": np.min}[op](x, axis=-1)
            post = ir.row_posts[j] if j < len(ir.row_posts) else None
            if post is not None:
                s = eval_expr(post, [], s.shape, s.astype(np.float32))[-1]
            out.reshape(-1)[: int(np.prod(v.shape))] = s.astype(v.dtype).reshape(-1)
        rest = rest[len(ir.row_reds) :]
        for out, r, v in zip(rest, ir.softmax, ir.softmax_outputs):
            x = np.broadcast_to(vals[r], shape).astype(np.float32)
            e = np.exp(x - x.max(axis=-1, keepdims=True))
            s = e / e.sum(axis=-1, keepdims=True)
            out.reshape(-1)[:size] = s.astype(v.dtype).reshape(-1)
        return
    if isinstance(ir, CustomKernel):  # the author's numpy reference (or the interpreter)
        get(ir.key).reference_run(ir, arrays)
        return
    raise TypeError(f"not a kernel IR: {type(ir).__name__}")
