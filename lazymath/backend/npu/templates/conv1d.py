"""The depthwise conv1d (groups = C_in = C_out) as one Vector kernel, the zero padding
handled by the bounds of its loads (no pad kernel, no padded copy of x).

A built-in kernel written with the user-kernel builder (like the Vector FFT in ``fft.py``),
registered as `graph.custom.BUILTIN["conv1d_depthwise"]`, so fusion, the caches, the
interpreter, the cost model and `lm.schedule` treat it like any kernel, and elementwise
consumers fuse into its epilogue slot (`relu(conv1d(x, w, b, groups=C)) * s` is one kernel).

Per row (n, c) of x (rows split over the blocks), per chunk of T output positions: the input
span the chunk needs, [l0 - pad, l0 + T - 1 + (K - 1) * dilation - pad], is zeroed in UB and
the part of it inside x is copied in (bounds computed at run time, so only the first and last
chunks of a row see padding); the accumulator starts at the bias (broadcast from the row's
scalar) and each tap j adds w[c, j] * span[j * dilation :][:T] (`VBrcb` of the tap's weight
fused into the `VFma` loop). A strided convolution copies each tap's inputs (a strided GM read,
bounds from the tap's first and last valid output) instead of one span. float16 is widened to
float32 in UB and rounded once on the way out; the fused epilogue runs on the output tile before
the copy out.
"""

from __future__ import annotations

import hashlib
import math
import pathlib

import numpy as np

from lazymath.backend.npu import isa, userkernel
from lazymath.backend.npu.ir_reference import eval_expr
from lazymath.graph import custom

NAME = "conv1d_depthwise"
CHUNK = 2048  # output positions per UB pass (a few 8 KiB float32 tiles)


def _kernel(k, x, w, *rest, k_taps, dilation, pad, lout, chunk, bias, stride=1):
    """x (N, C, L), w (C, 1, K), [bias (C,)], out (N, C, lout); a row is one (n, c)."""
    out = rest[-1]
    b = rest[0] if bias else None
    rows, length = math.prod(x.shape[:-1]), x.shape[-1]
    c_count = w.shape[0]
    dt = x.dtype
    f32 = "float32"
    span_max = chunk + (k_taps - 1) * dilation if stride == 1 else chunk
    span = k.ub(f32, span_max, "span")
    acc = k.ub(f32, chunk, "acc")
    wv = k.ub(f32, chunk, "wv")
    wrow = k.ub(f32, max(k_taps, 8), "wrow")
    brow = k.ub(f32, 8, "brow")
    if dt != f32:
        stage = k.ub(dt, span_max, "stage")
        wstage = k.ub(dt, max(k_taps, 16), "wstage")
        bstage = k.ub(dt, 16, "bstage")
        otile = k.ub(dt, chunk, "otile")
    else:
        otile = acc
    n_chunks = -(-lout // chunk)
    start, stop = k.block_range(rows)
    with k.loop(start, stop) as r:
        c = k.let(r % c_count, "c")
        # the row's taps (and bias) as float32 scalars in UB
        if dt != f32:
            k.copy_in(wstage, w[c * k_taps], k_taps)
            k.vconv(wrow, wstage, k_taps)
            if b is not None:
                k.copy_in(bstage, b[c], 1)
                k.vconv(brow, bstage, 1)
        else:
            k.copy_in(wrow, w[c * k_taps], k_taps)
            if b is not None:
                k.copy_in(brow, b[c], 1)
        with k.loop(n_chunks) as ci:
            l0 = k.let(ci * chunk, "l0")
            t = k.let(isa.imin(chunk, lout - l0), "t")

            def load(dst, lo, hi, at, step):  # x[at : at + (hi - lo) * step : step] -> dst
                if dt != f32:
                    k.copy_in(stage, x[at], hi - lo, step)
                    k.vconv(dst, stage, hi - lo)
                else:
                    k.copy_in(dst, x[at], hi - lo, step)

            if b is not None:
                k.emit(isa.VBrcb(acc[0], brow[0], t, 1))
            else:
                k.vdup(acc, 0.0, t)
            if stride == 1:  # one span of x serves every tap
                need = k.let(t + (k_taps - 1) * dilation, "need")
                p0 = k.let(l0 - pad, "p0")  # x position of span[0]
                lo = k.let(isa.imax(p0, 0), "lo")
                hi = k.let(isa.imin(p0 + need, length), "hi")
                k.vdup(span, 0.0, need)
                with k.if_(hi, ">", lo):
                    load(span[lo - p0], lo, hi, r * length + lo, 1)
            for j in range(k_taps):
                if stride == 1:
                    tap = span[j * dilation]
                else:  # tap j's inputs x[l * stride + j * dilation - pad], l in [first, last]
                    first = max(0, -(-(pad - j * dilation) // stride))
                    last = (length - 1 + pad - j * dilation) // stride
                    lo = k.let(isa.imax(l0, first), "lo")
                    hi = k.let(isa.imin(l0 + t, last + 1), "hi")
                    k.vdup(span, 0.0, t)
                    with k.if_(hi, ">", lo):
                        at = r * length + lo * stride + j * dilation - pad
                        load(span[lo - l0], lo, hi, at, stride)
                    tap = span[0]
                k.emit(isa.VBrcb(wv[0], wrow[j], t, 1))
                k.vfma(acc, tap, wv, acc, t)
            if dt != f32:
                k.vconv(otile, acc, t, "rint")
            k.epilogue(otile, t)
            k.copy_out(out[r * lout + l0], otile, t)


class DepthwiseConv1d:
    """The definition object the layers call (the interface of `lowlevel.Kernel`): inputs
    x (N, C, L), w (C, 1, K)[, bias (C,)], all of the output dtype; output (N, C, L_out);
    params k_taps, dilation, pad (left), lout, bias."""

    name = NAME
    unit = "vector"
    epilogue = True
    unit_reason = (
        "the built-in depthwise conv1d: K multiply-adds per output on the Vector unit, the "
        "zero padding in the bounds of its loads (backend/npu/templates/conv1d.py)"
    )

    def __init__(self, key: str):
        self.key = key

    def build(self, ir, spec, name: str):
        return userkernel.build_program(name, "vector", _kernel, _tiling, ir, spec, check=False)

    def flop_count(self, ir) -> int:
        p = dict(ir.params)
        return math.prod(ir.outputs[0].shape) * (2 * p["k_taps"] + int(p["bias"]))

    def evaluate(self, srcs, arg, dtype, shape) -> np.ndarray:
        p = dict(arg[1])
        x = np.asarray(srcs[0], np.float32)
        x = x.reshape(-1, x.shape[-1])
        w = np.asarray(srcs[1], np.float32).reshape(-1, p["k_taps"])
        rows, length = x.shape
        kk, d, pad, lout = p["k_taps"], p["dilation"], p["pad"], p["lout"]
        st = p.get("stride", 1)
        c = w.shape[0]
        out = np.zeros((rows, lout), np.float32)
        if p["bias"]:
            out += np.asarray(srcs[2], np.float32)[np.arange(rows) % c][:, None]
        wr = w[np.arange(rows) % c]
        for j in range(kk):
            pos = np.arange(lout) * st + j * d - pad
            ok = (pos >= 0) & (pos < length)
            if length:
                out += np.where(ok, x[:, np.clip(pos, 0, length - 1)], 0) * wr[:, j : j + 1]
        return out.astype(dtype).reshape(shape)

    def reference_run(self, ir, arrays) -> None:
        srcs = [a.reshape(-1)[: math.prod(v.shape)].reshape(v.shape)
                for a, v in zip(arrays, ir.inputs)]  # fmt: skip
        v = ir.outputs[0]
        out = self.evaluate(srcs, (self.key, ir.params), np.dtype(srcs[0].dtype), v.shape)
        if ir.epilogue:  # the consumers fused into the epilogue slot
            out = eval_expr(ir.epilogue, [], v.shape, out)[ir.epilogue_result]
        out = np.broadcast_to(np.asarray(out).astype(v.dtype, copy=False), v.shape)
        arrays[len(ir.inputs)].reshape(-1)[: math.prod(v.shape)] = out.reshape(-1)


def _tiling(spec, x, *rest, lout, **params) -> dict:
    chunk = max(8, min(CHUNK, -(-lout // 8) * 8))
    rows = math.prod(x.shape[:-1])
    return {"blocks": max(1, min(rows, spec.vector_cores)), "chunk": chunk}


_SRC = pathlib.Path(__file__).read_bytes()
KEY = f"{__name__}.{NAME}:{hashlib.sha256(_SRC).hexdigest()[:16]}"
custom.register(KEY, DepthwiseConv1d(KEY))
custom.BUILTIN[NAME] = KEY
