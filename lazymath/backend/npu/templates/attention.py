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

WIP (issue 33): this coupled form's stages are serialised by pipe barriers (no overlap of
MTE2, Cube and Vector); float32 only. The split 910B's MIX form (`_kernel_mix`, below) is
pipelined: its stages are joined by flags, K/V and the hand-off tiles have ping-pong slots.
"""

from __future__ import annotations

import hashlib
import math
import pathlib

import ml_dtypes
import numpy as np

from lazymath.backend.npu import isa, userkernel
from lazymath.graph import custom

NAME = "attention"
F32 = "float32"


def _r16(x: int) -> int:
    return -(-x // 16) * 16


def _base(t, b):
    """Flat GM offset of row 0 of batch item `b` (the flattened batch index, a scalar
    expression) of input `t` (..., R, C), and its row stride. A dense input gives b * R * C
    and C; a strided view (`Attention.strided_inputs`: q/k/v heads split by a permute of one
    qkv buffer) its own strides and offset, batch dimensions that merge taken as one."""
    *lead, R, C = t.shape
    rs = t.strides[-2] if R > 1 else C
    dims: list[list[int]] = []  # [size, stride], outermost first, mergeable runs joined
    for n, st in zip(lead, t.strides[:-2]):
        if n == 1:
            continue
        if dims and dims[-1][1] == n * st:
            dims[-1] = [dims[-1][0] * n, st]
        else:
            dims.append([n, st])
    off = None
    inner = 1
    for i, (n, st) in enumerate(reversed(dims)):
        idx = b if len(dims) == 1 else (b // inner if i == len(dims) - 1 else (b // inner) % n
                                        if inner > 1 else b % n)  # fmt: skip
        term = idx * st
        off = term if off is None else off + term
        inner *= n
    if t.offset:
        off = t.offset if off is None else off + t.offset
    return (0 if off is None else off), rs


def _kernel(k, q, kk, v, out, *, scale, causal, tq, tk):
    """q (..., L, D), kk (..., S, D), v (..., S, Dv), out (..., L, Dv), all float32; the batch
    dimensions (equal) are flattened into BH. out is dense; q, kk and v may be strided views
    with a dense last dimension (`_base` addresses their rows)."""
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
        qb, qrs = _base(q, b)
        kb, krs = _base(kk, b)
        vb, vrs = _base(v, b)
        k.load_nz(q_l1, q[qb + q0 * qrs], qv, D, (qrs, 1), tq)
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
            k.load_nz(k_l1, kk[kb + k0 * krs], D, kvn, (1, krs), dp)  # K^T: (D, kvn)
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
            k.load_nz(v_l1, v[vb + k0 * vrs], kvn, Dv, (vrs, 1), tk)
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


# ----------------------------------------------------------------------------- split 910B: MIX
FLT_MAX = float(np.finfo(np.float32).max)
# The AIC runs two K/V tiles ahead of its P V products: iteration j computes S_j (and loads
# K/V_{j+1}) and then P_{j-2} V_{j-2}, so the AIVs always have the next S waiting. Slots that
# lead needs: S and P hand-offs (GM) and V tiles (L1) NS each, P V hand-offs NPV, alphas NA.
NS, NPV, NA = 4, 3, 3
_S_READY, _P_READY, _PV_READY = 0, NS, 2 * NS  # cross-core flag ids (+ the slot)
# the AIC's "slot free" flags, set once per work item before its K/V loop and waited after it:
# K^T L1 slots 0/1, P slots 2/3, V slots 4.. (MTE1 -> MTE2), the K^T and P/V L0 operands (Cube ->
# MTE1, events 0/1), the S and P V accumulators (FixPipe -> Cube, events 0/1)
# an AIV's: S / P / mask UB slots 0/1 (MTE3 -> MTE2: P copied out), pv_ub (V -> MTE2 event 2)
_AIV_FREE = (("MTE3", "MTE2", 0), ("MTE3", "MTE2", 1), ("V", "MTE2", 2))
_FREE = tuple((src, dst, ev) for src, dst, n in (("MTE1", "MTE2", 4 + NS), ("M", "MTE1", 2),
                                                  ("FIX", "M", 2)) for ev in range(n))  # fmt: skip


def _kernel_mix(k, q, kk, v, *rest, scale, causal, masked, mdiv, mmod, tq, tk, aivs, nblk):
    """The split 910B form: one MIX kernel (AscendC KERNEL_TYPE_MIX_AIC_1_2). Per work item
    (bh, Q tile) the AIC keeps Q in L0A and, per K/V tile j, computes S_j = Q K_j^T and hands it
    to the AIVs through a GM workspace slot (FixPipe, flag S_READY); each AIV (its share of the
    tile's rows, a sub-block loop) runs the online softmax on S_j -- scale, additive mask,
    causal/tail -inf, running max (-FLT_MAX floor: a fully masked row stays 0, not NaN), P_j =
    exp(S_j - m), l = l a + rowsum -- and hands P_j (in the input dtype) back (P_READY); the
    AIC computes P_j V_j into another slot (PV_READY) and the AIV folds O = O a_j + P_j V_j.
    Pipelined (issue 33's Cube utilisation): iteration j of the AIC computes S_j, loading
    K/V_{j+1} first (into the other L1 slot: MTE2 streams while the Cube and FixPipe work),
    and then P_{j-2} V_{j-2}, so it runs two tiles ahead and the AIVs find the next S waiting.
    Within a core, no pipe_barrier in the K/V loop: each stage waits for its input by a
    set/wait flag and for its output slot by a "slot free" flag the slot's last reader sets
    (`_FREE`, `_AIV_FREE`: set once per item before the loop, waited after it), so MTE2, MTE1,
    Cube and FixPipe (AIC) and MTE2, Vector and MTE3 (AIV: S_{j+1} streams into the other UB
    slot while the Vector unit works on S_j) overlap. Between the cores the GM hand-off slots
    (NS of S and P, NPV of P V) are reused only after the data flags order it: the AIC's
    FixPipe of S_{j+4} follows (through MTE2's in-order queue: it loaded K_{j+4} after it
    waited for P_j) the AIV's P_j, which the AIV wrote after reading S_j; the race checker
    proves every such order when the program is built.
    Float32 accumulation in L0C; S, P V and the softmax state float32; P in the input dtype
    (bf16/fp16 Cube rate, as torch's kernels round P to the input dtype)."""
    mask, out = (rest[0], rest[1]) if masked else (None, rest[0])
    dt = q.dtype.name
    *lead, L, D = q.shape
    bh = math.prod(lead)
    S, Dv = kk.shape[-2], v.shape[-1]
    dp, dvp = _r16(D), _r16(Dv)
    hr = -(-tq // aivs)  # rows per AIV
    # L1: Q, and two slots (ping-pong) each of K^T and P, three of V; L0B: K^T and V side by
    # side
    kt, pt, vt = dp * tk, tq * tk, tk * dvp  # elements of one K^T / P / V tile
    q_l1, k_l1 = k.l1(dt, tq * dp, "q_l1"), k.l1(dt, 2 * kt, "k_l1")
    p_l1, v_l1 = k.l1(dt, 2 * pt, "p_l1"), k.l1(dt, NS * vt, "v_l1")
    q_l0, p_l0 = k.l0a(dt, tq * dp, "q_l0a"), k.l0a(dt, tq * tk, "p_l0a")
    k_l0, v_l0 = k.l0b(dt, kt, "k_l0b"), k.l0b(dt, vt, "v_l0b")
    s_l0c, o_l0c = k.l0c(F32, tq * tk, "s_l0c"), k.l0c(F32, tq * dvp, "o_l0c")
    # K/V tiles of one head are read by every Q tile of it (causal: by about half): after the
    # first, L2 hits (the items of one head run one after the other on one core)
    reuse = max(1, (-(-L // tq) + 1) // 2 if causal else -(-L // tq))
    ws_s = k.workspace_tensor(F32, nblk * NS * tq * tk, "ws_scores")
    ws_p = k.workspace_tensor(dt, nblk * NS * tq * tk, "ws_probs")
    ws_pv = k.workspace_tensor(F32, nblk * NPV * tq * Dv, "ws_pv")
    # AIV: work tiles of its hr rows; the online state (m, l, O, a) of all tq rows, each AIV
    # using its share (one UB per AIV on the device; one after the other on the host)
    # two slots (ping-pong, offset e * hr * tk) of S / P / mask: S_{j+1} streams in while the
    # Vector unit works on S_j and MTE3 writes P_{j-1} out
    s_ub = k.ub(F32, 2 * hr * tk, "s")
    p_ub = k.ub(dt, hr * max(2 * tk, Dv), "p") if dt != F32 else s_ub
    m_ub = k.ub(F32, 2 * hr * tk, "mask") if masked else None
    pv_ub = k.ub(F32, hr * Dv, "pv")
    bc = k.ub(F32, hr * max(tk, Dv), "brcb")
    o_ub = k.ub(F32, aivs * hr * Dv, "o")
    mrow, lrow = k.ub(F32, aivs * hr, "m"), k.ub(F32, aivs * hr, "l")
    al = [k.ub(F32, aivs * hr, f"alpha{e}") for e in range(NA)]
    mx, mn, rs = k.ub(F32, hr, "rowmax"), k.ub(F32, hr, "m_new"), k.ub(F32, hr, "rowsum")
    nq = -(-L // tq)
    slot_s = k.let(isa.BLOCK_IDX * (NS * tq * tk), "slot_s")
    slot_pv = k.let(isa.BLOCK_IDX * (NPV * tq * Dv), "slot_pv")
    V = isa.SUBBLOCK_IDX

    def aiv_rows(qv):
        """(r0, rv): this AIV's first row of the tile and its row count (may be <= 0)."""
        r0 = k.let(V * hr, "r0")
        return r0, k.let(isa.imin(hr, qv - r0), "rv")

    start, stop = k.block_range(bh * nq)
    with k.loop(start, stop) as it:
        b = k.let(it // nq, "bh")
        q0 = k.let((it % nq) * tq, "q0")
        qv = k.let(isa.imin(tq, L - q0), "qv")
        kv_end = k.let(isa.imin(S, q0 + qv), "kv_end") if causal else S
        nkv = k.let((kv_end + (tk - 1)) // tk, "nkv")
        # no barrier between items: the last item's drained "slot free" flags already order
        # its MTE1 read of q_l1 before this MTE2 write and its Cube reads of q_l0 before this
        # MTE1 write, so this item's Q and first K/V load while the last one's P V and the
        # AIVs' epilogue finish
        qb, qrs = _base(q, b)
        kb, krs = _base(kk, b)
        vb, vrs = _base(v, b)
        k.load_nz(q_l1, q[qb + q0 * qrs], qv, D, (qrs, 1), tq)
        k.set_flag("MTE2", "MTE1", 4)
        k.wait_flag("MTE2", "MTE1", 4)
        k.load_l0(q_l0, q_l1, tq, dp, tq, tq)
        for src, dst, ev in _FREE:  # every AIC slot starts free
            k.set_flag(src, dst, ev)
        with k.loop(0, aivs, name=V):
            r0, rv = aiv_rows(qv)
            for src, dst, ev in _AIV_FREE:  # this AIV's UB slots start free
                k.set_flag(src, dst, ev)
            with k.if_(rv, ">", 0):
                k.vdup(mrow[r0], -math.inf, rv)
                k.vdup(lrow[r0], 0.0, rv)
                k.vdup(o_ub[r0 * Dv], 0.0, rv * Dv)

        def load_kv(jj, ee):
            """MTE2: K_jj^T into L1 slot ee = jj % 2 and V_jj into slot jj % NS (V_jj is
            loaded three iterations before P_jj V_jj reads it)."""
            kj = k.let(jj * tk, "kj")
            kvj = k.let(isa.imin(tk, kv_end - kj), "kvj")
            k.wait_flag("MTE1", "MTE2", ee)
            k.load_nz(k_l1[ee * kt], kk[kb + kj * krs], D, kvj, (1, krs), dp,
                      reuse=reuse)  # K^T (D, kvn)  # fmt: skip
            ev3 = k.let(jj % NS, "ev3")
            k.wait_flag("MTE1", "MTE2", ev3 + 4)
            k.load_nz(v_l1[ev3 * vt], v[vb + kj * vrs], kvj, Dv, (vrs, 1), tk, reuse=reuse)
            k.set_flag("MTE2", "MTE1", ee)

        with k.if_(nkv, ">", 0):
            load_kv(0, 0)
        with k.loop(0, nkv + 2) as j:
            with k.if_(j, "<", nkv):  # S_j on the AIC, the online softmax on the AIVs
                e = k.let(j % 2, "e")
                e3 = k.let(j % NS, "e3")
                ea = k.let(j % NA, "ea")
                k0 = k.let(j * tk, "k0")
                kvn = k.let(isa.imin(tk, kv_end - k0), "kvn")
                # MTE2 -> MTE1 -> Cube -> FixPipe, each stage waiting for its input and for
                # its output slot to be free (flags, no barrier). K/V_{j+1} are loaded first,
                # so MTE2 streams them in while the Cube multiplies and FixPipe drains S_j,
                # and S_{j+1} does not wait behind P_{j-1} in MTE2's queue
                with k.if_(j + 1, "<", nkv):
                    load_kv(j + 1, (j + 1) % 2)
                k.wait_flag("MTE2", "MTE1", e)
                k.wait_flag("M", "MTE1", 0)
                k.load_l0(k_l0, k_l1[e * kt], dp, tk, dp, dp)
                k.set_flag("MTE1", "MTE2", e)
                k.set_flag("MTE1", "M", 0)
                k.wait_flag("MTE1", "M", 0)
                k.wait_flag("FIX", "M", 0)
                k.mmad(s_l0c, q_l0, k_l0, qv, kvn, D, tq, dp, tq)
                k.set_flag("M", "MTE1", 0)
                k.set_flag("M", "FIX", 0)
                k.wait_flag("M", "FIX", 0)
                k.fixpipe(ws_s[slot_s + e3 * (tq * tk)], s_l0c, qv, kvn, (tk, 1), tq)
                k.set_flag("FIX", "M", 0)
                k.cross_set("AIC", "FIX", e3 + _S_READY)
                with k.loop(0, aivs, name=V):
                    r0, rv = aiv_rows(qv)
                    k.cross_wait("AIV", "MTE2", e3 + _S_READY)
                    with k.if_(rv, ">", 0):
                        _softmax_step(k, locals(), scale, causal, masked, mdiv, mmod)
                    k.cross_set("AIV", "MTE3", e3 + _P_READY)
            with k.if_(j, ">=", 2):  # P_i V_i (i = j - 2) on the AIC, folded into O by the AIVs
                i2 = k.let((j - 2) % 2, "i2")  # its P slot in L1
                i4 = k.let((j - 2) % NS, "i4")  # its P hand-off slot (GM) and V slot (L1)
                i3 = k.let((j - 2) % NPV, "i3")  # its P V hand-off slot (GM)
                ia = k.let((j - 2) % NA, "ia")  # its alpha
                k1 = k.let((j - 2) * tk, "k1")
                kvn1 = k.let(isa.imin(tk, kv_end - k1), "kvn1")
                k.cross_wait("AIC", "MTE2", i4 + _P_READY)
                k.wait_flag("MTE1", "MTE2", i2 + 2)
                k.load_nz(p_l1[i2 * pt], ws_p[slot_s + i4 * (tq * tk)], qv, kvn1, (tk, 1), tq)
                k.set_flag("MTE2", "MTE1", i2 + 2)
                k.wait_flag("MTE2", "MTE1", i2 + 2)
                k.wait_flag("M", "MTE1", 1)
                k.load_l0(p_l0, p_l1[i2 * pt], tq, tk, tq, tq)
                k.load_l0(v_l0, v_l1[i4 * vt], tk, dvp, tk, tk)
                k.set_flag("MTE1", "MTE2", i2 + 2)
                k.set_flag("MTE1", "MTE2", i4 + 4)
                k.set_flag("MTE1", "M", 1)
                k.wait_flag("MTE1", "M", 1)
                k.wait_flag("FIX", "M", 1)
                k.mmad(o_l0c, p_l0, v_l0, qv, Dv, kvn1, tq, tk, tq)
                k.set_flag("M", "MTE1", 1)
                k.set_flag("M", "FIX", 1)
                k.wait_flag("M", "FIX", 1)
                k.fixpipe(ws_pv[slot_pv + i3 * (tq * Dv)], o_l0c, qv, Dv, (Dv, 1), tq)
                k.set_flag("FIX", "M", 1)
                k.cross_set("AIC", "FIX", i3 + _PV_READY)
                with k.loop(0, aivs, name=V):
                    r0, rv = aiv_rows(qv)
                    k.cross_wait("AIV", "MTE2", i3 + _PV_READY)
                    with k.if_(rv, ">", 0):
                        k.wait_flag("V", "MTE2", 2)  # the last fold has read pv_ub
                        k.copy_in(pv_ub, ws_pv[slot_pv + i3 * (tq * Dv) + r0 * Dv], rv * Dv)
                        k.set_flag("MTE2", "V", 2)
                        k.wait_flag("MTE2", "V", 2)
                        for ee in range(NA):  # O = O a_i + P_i V_i
                            with k.if_(ia, "==", ee):
                                k.emit(isa.VBrcb(bc[0], al[ee][r0], Dv, rv))
                        k.vfma(o_ub[r0 * Dv], o_ub[r0 * Dv], bc, pv_ub, rv * Dv)
                        k.set_flag("V", "MTE2", 2)
        for src, dst, ev in _FREE:  # the AIC's slots drained
            k.wait_flag(src, dst, ev)
        with k.loop(0, aivs, name=V):  # O / l, in the output dtype, to GM
            r0, rv = aiv_rows(qv)
            for src, dst, ev in _AIV_FREE:  # drained
                k.wait_flag(src, dst, ev)
            k.pipe_barrier("AIV")  # P's last copy-out has read p_ub
            with k.if_(rv, ">", 0):
                k.vmaxs(lrow[r0], lrow[r0], 1e-30, rv)  # a fully masked row: 0 / tiny = 0
                k.vrec(lrow[r0], lrow[r0], rv)
                k.emit(isa.VBrcb(bc[0], lrow[r0], Dv, rv))
                k.vmul(o_ub[r0 * Dv], o_ub[r0 * Dv], bc, rv * Dv)
                res = o_ub[r0 * Dv]
                if dt != F32:
                    k.vconv(p_ub, o_ub[r0 * Dv], rv * Dv)
                    res = p_ub
                k.pipe_barrier("AIV")
                k.copy_out(out[b * (L * Dv) + (q0 + r0) * Dv], res, rv * Dv)
                k.pipe_barrier("AIV")


def _softmax_step(k, env: dict, scale, causal, masked, mdiv, mmod) -> None:
    """One AIV's online-softmax step on its rv rows of S_j (see `_kernel_mix`), in UB slot
    e = j % 2 of S / P / mask: MTE2 -> Vector -> MTE3 joined by flags, the slot's reuse
    ordered by MTE3 -> MTE2 (P_{j-2} copied out before S_j lands in its slot)."""
    s_ub, p_ub, m_ub, bc = env["s_ub"], env["p_ub"], env["m_ub"], env["bc"]
    mrow, lrow, al, mx, mn, rs = (env[n] for n in ("mrow", "lrow", "al", "mx", "mn", "rs"))
    r0, rv, e, k0, kvn = env["r0"], env["rv"], env["e"], env["k0"], env["kvn"]
    q0, b, tk, tq, L, S = env["q0"], env["b"], env["tk"], env["tq"], env["L"], env["S"]
    ws_s, ws_p, slot_s, mask, hr = env["ws_s"], env["ws_p"], env["slot_s"], env["mask"], env["hr"]
    e3 = env["e3"]  # the GM hand-off slot (S_j in, P_j out)
    n = rv * tk
    so = k.let(e * (hr * tk), "so")  # this step's slot
    s0 = s_ub[so]
    k.wait_flag("MTE3", "MTE2", e)
    k.copy_in(s0, ws_s[slot_s + e3 * (tq * tk) + r0 * tk], (rv, kvn), (tk, 1), tk)
    if masked:  # the additive float32 mask's rows (batch-broadcast: its batch index)
        mb = (b // mdiv) % mmod if mmod > 1 else 0
        k.copy_in(m_ub[so], mask[mb * (L * S) + (q0 + r0) * S + k0], (rv, kvn), (S, 1), tk)
    k.set_flag("MTE2", "V", e)
    k.wait_flag("MTE2", "V", e)
    k.vmuls(s0, s0, float(scale), n)
    if masked:
        k.vadd(s0, s0, m_ub[so], n)
    # -inf past the tile's keys (a partial last tile) and, causal, past each row's query:
    # key k0 + c > query q0 + r0 + r (top-left aligned)
    if causal:
        with k.if_(k0 + kvn, ">", q0 + r0 + 1):
            with k.loop(0, rv) as r:
                first = k.let(isa.imin(isa.imax(q0 + r0 + r - k0 + 1, 0), kvn), "first")
                with k.if_(first, "<", tk):
                    k.vdup(s_ub[so + r * tk + first], -math.inf, tk - first)
        with k.if_(k0 + kvn, "<=", q0 + r0 + 1):
            with k.if_(kvn, "<", tk):
                with k.loop(0, rv) as r:
                    k.vdup(s_ub[so + r * tk + kvn], -math.inf, tk - kvn)
    else:
        with k.if_(kvn, "<", tk):
            with k.loop(0, rv) as r:
                k.vdup(s_ub[so + r * tk + kvn], -math.inf, tk - kvn)
    k.vdup(mx, -math.inf, rv)
    k.vreduce("vcmax", mx, s0, tk, rv)
    k.vmax(mn, mrow[r0], mx, rv)
    k.vmaxs(mn, mn, -FLT_MAX, rv)  # all -inf so far: exp(-inf - -FLT_MAX) = 0, not NaN
    for ee in range(NA):  # a_j = exp(m - m'), kept for the fold of P_j V_j
        with k.if_(env["ea"], "==", ee):
            k.vsub(al[ee][r0], mrow[r0], mn, rv)
            k.vexp(al[ee][r0], al[ee][r0], rv)
            k.vmul(lrow[r0], lrow[r0], al[ee][r0], rv)
    k.emit(isa.VBrcb(bc[0], mn[0], tk, rv))
    k.vsub(s0, s0, bc, n)
    k.vexp(s0, s0, n)
    k.vdup(rs, 0.0, rv)
    k.vreduce("vcadd", rs, s0, tk, rv)
    k.vadd(lrow[r0], lrow[r0], rs, rv)
    k.vcopy(mrow[r0], mn, rv)
    p0 = s0
    if p_ub is not s_ub:
        p0 = p_ub[so]
        k.vconv(p0, s0, n)
    k.set_flag("V", "MTE3", e)
    k.wait_flag("V", "MTE3", e)
    k.copy_out(ws_p[slot_s + e3 * (tq * tk) + r0 * tk], p0, (rv, kvn), (tk, 1), tk)
    k.set_flag("MTE3", "MTE2", e)


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


def reference(q, k, v, scale: float, causal: bool, mask=None) -> np.ndarray:
    """numpy attention in float64 (the reference executor and the tests' oracle); `mask`
    additive, broadcasting to the scores; a fully masked row gives zeros (torch's CPU
    kernels)."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    s = q @ np.swapaxes(k, -1, -2) * scale
    if mask is not None:
        s = s + np.asarray(mask, np.float64)
    if causal:
        L, S = s.shape[-2:]
        s = np.where(np.tril(np.ones((L, S), bool)), s, -np.inf)
    mx = s.max(-1, keepdims=True)
    p = np.exp(s - np.where(mx == -np.inf, 0.0, mx))
    tot = p.sum(-1, keepdims=True)
    return (p / np.where(tot == 0, 1.0, tot)) @ v


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
        "(backend/npu/templates/attention.py)"
    )

    def __init__(self, key: str):
        self.key = key

    strided_inputs = (0, 1, 2)  # q, k, v: see `strided_input`

    def strided_input(self, i: int, view) -> bool:
        """Whether input `i` may be read in place through `view` (an ArgView of another
        kernel's buffer) instead of a dense copy: q, k and v whose last dimension is dense
        (stride 1) and whose other strides are >= 0 (rows > 0), as `_base` addresses them, so
        the heads split from one qkv matmul by a view and a permute are not copied first.
        The MIX form's mask stays dense."""
        if i > 2:
            return False
        *_, R, C = view.shape
        st = view.strides
        return ((C == 1 or st[-1] == 1) and all(x >= 0 for x in st)
                and (R == 1 or st[-2] > 0))  # fmt: skip

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
        srcs = [userkernel.strided_array(a.reshape(-1), v) for a, v in zip(arrays, ir.inputs)]
        v = ir.outputs[0]
        out = self.evaluate(srcs, (self.key, ir.params), np.dtype(v.dtype), v.shape)
        arrays[len(ir.inputs)].reshape(-1)[: math.prod(v.shape)] = out.reshape(-1)


def tiles_mix(spec, d: int, dv: int, dtype: str, masked: bool) -> tuple[int, int, int]:
    """(TQ, TK, AIVs) of the MIX kernel on a split `spec` for head dims d, dv and input
    `dtype`: TK the widest multiple of 16 (<= 128) whose K^T and V tiles fit L0B side by side
    (the next K^T loads while P V reads V); TQ the tallest (<= 128) whose Q + P tiles fit L0A,
    S + P V fit L0C, the L1 panels (Q, and two ping-pong slots each of K^T, P and V) fit L1
    and one AIV's set (its TQ / AIVs rows of S, P, mask, broadcast; the online state of all
    TQ rows) fits its UB."""
    isz = np.dtype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype).itemsize
    dp, dvp = _r16(d), _r16(dv)
    aivs = max(1, min(2, spec.vector_cores // max(spec.cube_cores, 1)))
    tk = 128
    while tk > 16 and (dp + dvp) * tk * isz > spec.l0b_bytes:
        tk -= 16

    def ub(tq: int) -> int:
        hr = -(-tq // aivs)
        w = max(tk, dv)
        per_row = 2 * tk * 4 + (max(2 * tk, dv) * isz if isz != 4 else 0) + w * 4 + dv * 4
        per_row += 2 * tk * 4 if masked else 0  # S, P, mask: two slots each
        return hr * per_row + aivs * hr * (dv * 4 + 4 * 4) + hr * 3 * 4 + 64 * 16

    tq = 128
    while tq > 16 and (
        tq * (dp + tk) * isz > spec.l0a_bytes
        or tq * (tk + dvp) * 4 > spec.l0c_bytes
        or (tq * dp + 2 * (dp * tk + tq * tk) + NS * tk * dvp) * isz > spec.l1_bytes
        or ub(tq) > spec.ub_bytes
    ):
        tq -= 16
    return tq, tk, aivs


def _tiling_mix(spec, q, kk, v, *rest, scale, causal, masked, mdiv, mmod) -> dict:
    tq, tk, aivs = tiles_mix(spec, q.shape[-1], v.shape[-1], q.dtype.name, masked)
    items = math.prod(q.shape[:-2]) * -(-q.shape[-2] // tq)
    blocks = max(1, min(items, spec.cube_cores))
    return {"blocks": blocks, "tq": tq, "tk": tk, "aivs": aivs, "nblk": blocks}


class AttentionMix(Attention):
    """The split 910B's fused attention: one MIX kernel (`_kernel_mix`). Inputs q, k, v (float32,
    float16 or bfloat16, one dtype, equal batch dimensions) and, with params masked=True, an
    additive float32 mask (Mb, L, S) whose batch index for q's flattened batch index bh is
    (bh // mdiv) % mmod (a batch-broadcast mask is not copied per head); output (..., L, Dv)
    in the input dtype."""

    unit = "mix"
    unit_reason = (
        "the built-in fused attention on the split 910B, one MIX kernel: Q K^T and P V on the "
        "Cube core (AIC), the online softmax (running max and sum, mask, causal) on its two "
        "Vector cores (AIV), tiles handed over through a GM workspace and cross-core flags, "
        "scores never written beyond the two per-core slots (backend/npu/templates/attention.py)"
    )

    def build(self, ir, spec, name: str):
        if spec.coupled:
            raise ValueError(
                f"{spec.name}: the MIX attention kernel is for split devices (AIC + AIV); the "
                "coupled 910 runs the one-core kernel"
            )
        return userkernel.build_program(name, "mix", _kernel_mix, _tiling_mix, ir, spec)

    def evaluate(self, srcs, arg, dtype, shape) -> np.ndarray:
        p = dict(arg[1])
        mask = None
        if p["masked"]:
            m = np.asarray(srcs[3], np.float64)
            lead = srcs[0].shape[:-2]
            bhn = math.prod(lead)
            idx = (np.arange(bhn) // p["mdiv"]) % p["mmod"]
            mask = m[idx].reshape(*lead, *m.shape[-2:])
        out = reference(*srcs[:3], p["scale"], p["causal"], mask)
        return out.astype(dtype).reshape(shape)


_SRC = pathlib.Path(__file__).read_bytes()
KEY = f"{__name__}.{NAME}:{hashlib.sha256(_SRC).hexdigest()[:16]}"
custom.register(KEY, Attention(KEY))
custom.BUILTIN[NAME] = KEY
MIX_NAME = "attention_mix"
MIX_KEY = f"{__name__}.{MIX_NAME}:{hashlib.sha256(_SRC).hexdigest()[:16]}"
custom.register(MIX_KEY, AttentionMix(MIX_KEY))
custom.BUILTIN[MIX_NAME] = MIX_KEY
