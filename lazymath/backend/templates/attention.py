"""Fused attention (flash attention) as one kernel on the coupled ascend910's AI core.

    o = softmax(q @ k^T * scale [+ causal]) @ v          q (BH, L, D), k (BH, S, D), v (BH, S, Dv)

A built-in kernel written with the user-kernel builder (like the depthwise conv1d), registered
as `graph.custom.BUILTIN["attention"]`; `lm.nn.scaled_dot_product_attention` records it when
the device is the coupled 910 and the call has no explicit mask and no dropout (else the
composition of registered ops runs). Per block, per work item (bh, Q tile of TQ rows):

    Q tile GM -> L1 -> L0A (resident for the whole item)
    m = -inf, l = 0, O = 0                                      (UB, float32)
    for each K/V tile of TK keys (causal: only up to the item's last query -- tiles above the
    diagonal are never loaded, and the diagonal tile is masked row by row):
        K^T tile GM -> L1 -> L0B;  S = Q K^T (Cube, L0C);  FixPipe L0C -> UB
        S *= scale; m' = max(m, rowmax S); P = exp(S - m'); a = exp(m - m')   (Vector)
        l = l a + rowsum P;  O = O a                                        (online softmax)
        P UB -> L1 -> L0A;  V tile GM -> L1 -> L0B;  O += P V (Cube, L0C -> UB)
    O /= l; UB -> GM

so the T x T scores never leave the core: the kernel's GM traffic is q, k, v read (k and v
once per Q tile) and o written, and its planned memory is that of its inputs and output
whatever T is. Tile sizes come from the DeviceSpec: TK so that a K^T or V tile fills at most
L0B, TQ so that the UB working set (S/P, O, P V, the row broadcasts) fits UB.

WIP (issue 33): the stages are serialised by pipe barriers (the cost model sees no overlap of
MTE2, Cube and Vector: no double buffering of K/V yet); float32 only (float16 would cast P to
float16 for the second matmul); no MIX form for the split 910B (its Cube core has no UB: the AIC
and AIV halves would meet through a GM workspace like the matmul template's MIX kernels).
"""

from __future__ import annotations

import hashlib
import math
import pathlib

import numpy as np

from lazymath.backend import isa, userkernel
from lazymath.graph import custom

NAME = "attention"
F32 = "float32"


def _r16(x: int) -> int:
    return -(-x // 16) * 16


def _kernel(k, q, kk, v, out, *, scale, causal, tq, tk):
    """q (..., L, D), kk (..., S, D), v (..., S, Dv), out (..., L, Dv), dense, all float32;
    the batch dimensions (equal) are flattened into BH."""
    *lead, L, D = q.shape
    bh = math.prod(lead)
    S, Dv = kk.shape[-2], v.shape[-1]
    dp, dvp = _r16(D), _r16(Dv)
    q_l1, k_l1 = k.l1(F32, tq * dp, "q_l1"), k.l1(F32, dp * tk, "k_l1")
    p_l1, v_l1 = k.l1(F32, tq * tk, "p_l1"), k.l1(F32, tk * dvp, "v_l1")
    q_l0, p_l0 = k.l0a(F32, tq * dp, "q_l0a"), k.l0a(F32, tq * tk, "p_l0a")
    b_l0 = k.l0b(F32, max(dp * tk, tk * dvp), "kv_l0b")
    s_l0c, o_l0c = k.l0c(F32, tq * tk, "s_l0c"), k.l0c(F32, tq * dvp, "o_l0c")
    s_ub, o_ub, pv_ub = k.ub(F32, tq * tk, "s"), k.ub(F32, tq * Dv, "o"), k.ub(F32, tq * Dv, "pv")
    bc = k.ub(F32, tq * max(tk, Dv), "brcb")
    m_ub, l_ub, mx = k.ub(F32, tq, "m"), k.ub(F32, tq, "l"), k.ub(F32, tq, "rowmax")
    mn, al, rs = k.ub(F32, tq, "m_new"), k.ub(F32, tq, "alpha"), k.ub(F32, tq, "rowsum")
    nq = -(-L // tq)
    start, stop = k.block_range(bh * nq)
    with k.loop(start, stop) as it:
        b = k.let(it // nq, "bh")
        q0 = k.let((it % nq) * tq, "q0")
        qv = k.let(isa.imin(tq, L - q0), "qv")
        k.pipe_barrier()
        k.load_nz(q_l1, q[b * (L * D) + q0 * D], qv, D, (D, 1), tq)
        k.pipe_barrier()
        k.load_l0(q_l0, q_l1, tq, dp, tq, tq)
        k.vdup(m_ub, -math.inf, tq)
        k.vdup(l_ub, 0.0, tq)
        k.vdup(o_ub, 0.0, tq * Dv)
        # causal (top-left aligned): query q0 + r sees keys 0 .. q0 + r; keys past the item's
        # last query are never loaded
        kv_end = k.let(isa.imin(S, q0 + qv), "kv_end") if causal else S
        with k.loop(0, kv_end, tk) as k0:
            kvn = k.let(isa.imin(tk, kv_end - k0), "kvn")
            k.pipe_barrier()
            k.load_nz(k_l1, kk[b * (S * D) + k0 * D], D, kvn, (1, D), dp)  # K^T: (D, kvn)
            k.pipe_barrier()
            k.load_l0(b_l0, k_l1, dp, tk, dp, dp)
            k.pipe_barrier()
            k.mmad(s_l0c, q_l0, b_l0, qv, kvn, D, tq, dp, tq)
            k.pipe_barrier()
            k.fixpipe(s_ub, s_l0c, qv, kvn, (tk, 1), tq)  # rows of pitch tk in UB
            k.pipe_barrier()
            n = qv * tk
            k.vmuls(s_ub, s_ub, float(scale), n)
            # -inf past the tile's keys (a partial last tile) and, causal, past each row's
            # query on the diagonal tile: key k0 + c > query q0 + r
            limit = (k0 + kvn, ">", q0 + 1) if causal else (kvn, "<", tk)
            with k.if_(*limit):
                with k.loop(0, qv) as r:
                    first = kvn
                    if causal:
                        first = k.let(isa.imin(isa.imax(q0 + r - k0 + 1, 0), kvn), "first")
                    with k.if_(first, "<", tk):
                        k.vdup(s_ub[r * tk + first], -math.inf, tk - first)
            if causal:
                with k.if_(k0 + kvn, "<=", q0 + 1):
                    with k.if_(kvn, "<", tk):
                        with k.loop(0, qv) as r:
                            k.vdup(s_ub[r * tk + kvn], -math.inf, tk - kvn)
            k.vdup(mx, -math.inf, qv)
            k.vreduce("vcmax", mx, s_ub, tk, qv)
            k.vmax(mn, m_ub, mx, qv)
            k.vsub(al, m_ub, mn, qv)
            k.vexp(al, al, qv)
            k.emit(isa.VBrcb(bc[0], mn[0], tk, qv))
            k.vsub(s_ub, s_ub, bc, n)
            k.vexp(s_ub, s_ub, n)
            k.vdup(rs, 0.0, qv)
            k.vreduce("vcadd", rs, s_ub, tk, qv)
            k.vmul(l_ub, l_ub, al, qv)
            k.vadd(l_ub, l_ub, rs, qv)
            k.emit(isa.VBrcb(bc[0], al[0], Dv, qv))
            k.vmul(o_ub, o_ub, bc, qv * Dv)
            k.vcopy(m_ub, mn, qv)
            k.pipe_barrier()
            k.load_nz(p_l1, s_ub, qv, kvn, (tk, 1), tq)  # P: UB -> L1 (A operand)
            k.load_nz(v_l1, v[b * (S * Dv) + k0 * Dv], kvn, Dv, (Dv, 1), tk)
            k.pipe_barrier()
            k.load_l0(p_l0, p_l1, tq, tk, tq, tq)
            k.load_l0(b_l0, v_l1, tk, dvp, tk, tk)
            k.pipe_barrier()
            k.mmad(o_l0c, p_l0, b_l0, qv, Dv, kvn, tq, tk, tq)
            k.pipe_barrier()
            k.fixpipe(pv_ub, o_l0c, qv, Dv, (Dv, 1), tq)
            k.pipe_barrier()
            k.vadd(o_ub, o_ub, pv_ub, qv * Dv)
        k.vrec(l_ub, l_ub, qv)
        k.emit(isa.VBrcb(bc[0], l_ub[0], Dv, qv))
        k.vmul(o_ub, o_ub, bc, qv * Dv)
        k.pipe_barrier()
        k.copy_out(out[b * (L * Dv) + q0 * Dv], o_ub, qv * Dv)


def tiles(spec, d: int, dv: int) -> tuple[int, int]:
    """(TQ, TK) for head dims d, dv on `spec`: TK the widest multiple of 16 (<= 128) whose K^T
    and V tiles fit L0B; TQ the tallest (<= 128) whose Q and P tiles fit L0A and whose UB set
    (S/P, O, P V, broadcast: float32) fits half of UB."""
    dp, dvp = _r16(d), _r16(dv)
    tk = 128
    while tk > 16 and max(dp, dvp) * tk * 4 > spec.l0b_bytes:
        tk -= 16
    tq = 128
    while tq > 16 and (
        tq * (dp + tk) * 4 > spec.l0a_bytes
        or tq * (tk + 2 * dv + max(tk, dv) + 6) * 4 > spec.ub_bytes // 2
        or tq * (tk + dvp) * 4 > spec.l0c_bytes
    ):
        tq -= 16
    return tq, tk


def _tiling(spec, q, kk, v, out, *, scale, causal) -> dict:
    tq, tk = tiles(spec, q.shape[-1], v.shape[-1])
    items = math.prod(q.shape[:-2]) * -(-q.shape[-2] // tq)
    return {"blocks": max(1, min(items, spec.cube_cores)), "tq": tq, "tk": tk}


def reference(q, k, v, scale: float, causal: bool) -> np.ndarray:
    """numpy attention in float64 (the reference executor and the tests' oracle)."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    s = q @ np.swapaxes(k, -1, -2) * scale
    if causal:
        L, S = s.shape[-2:]
        s = np.where(np.tril(np.ones((L, S), bool)), s, -np.inf)
    s = s - s.max(-1, keepdims=True)
    p = np.exp(s)
    return (p / p.sum(-1, keepdims=True)) @ v


class Attention:
    """The definition object the layers call (the interface of `lowlevel.Kernel`): inputs
    q (..., L, D), k (..., S, D), v (..., S, Dv) float32 with equal batch dimensions; output
    (..., L, Dv); params scale, causal."""

    name = NAME
    unit = "cube"
    epilogue = False
    unit_reason = (
        "the built-in fused attention: Q K^T and P V on the Cube, the online softmax (running "
        "max and sum) on the Vector unit of the same core, scores never written to GM "
        "(backend/templates/attention.py)"
    )

    def __init__(self, key: str):
        self.key = key

    def build(self, ir, spec, name: str):
        if not spec.coupled:
            raise ValueError(
                f"{spec.name}: the fused attention kernel needs UB on the Cube core (coupled "
                "910); lm.nn.scaled_dot_product_attention composes it from matmuls there"
            )
        return userkernel.build_program(name, "cube", _kernel, _tiling, ir, spec)

    def flop_count(self, ir) -> int:
        *lead, L, D = ir.inputs[0].shape
        bh = math.prod(lead)
        S, Dv = ir.inputs[1].shape[-2], ir.inputs[2].shape[-1]
        frac = 0.5 if dict(ir.params)["causal"] else 1.0
        return int(bh * L * S * (2 * D + 2 * Dv + 5) * frac)

    def evaluate(self, srcs, arg, dtype, shape) -> np.ndarray:
        p = dict(arg[1])
        return reference(*srcs[:3], p["scale"], p["causal"]).astype(dtype).reshape(shape)

    def reference_run(self, ir, arrays) -> None:
        srcs = [a.reshape(-1)[: math.prod(v.shape)].reshape(v.shape)
                for a, v in zip(arrays, ir.inputs)]  # fmt: skip
        v = ir.outputs[0]
        out = self.evaluate(srcs, (self.key, ir.params), np.dtype(v.dtype), v.shape)
        arrays[len(ir.inputs)].reshape(-1)[: math.prod(v.shape)] = out.reshape(-1)


_SRC = pathlib.Path(__file__).read_bytes()
KEY = f"{__name__}.{NAME}:{hashlib.sha256(_SRC).hexdigest()[:16]}"
custom.register(KEY, Attention(KEY))
custom.BUILTIN[NAME] = KEY
