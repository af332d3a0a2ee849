"""Matmul template: a `MatmulKernel` -> Cube ISA program (GM -> L1 -> L0A/L0B -> L0C -> out).

Loop nest of one block (AscendC matmul, split into work items = (batch, N panel, M group)):

    for item in block's items:
        for mt in M tiles of the group:                 # L0C tile tm x tn
            for kc in K chunks:                          # L1 panels, ping-pong
                load_nz  L1A <- A[m0:+tm, k0:+kc]       (MTE2, ND->NZ, prologue)
                load_nz  L1B <- B[k0:+kc, n0:+tn]       (MTE2, memo: host packs once per item)
                load_l0a L0A <- L1A                      (MTE1)
                for j in n0-wide slices of the panel:    # L0B ping-pong
                    load_l0b L0B <- L1B[:, j]            (MTE1)
                    mmad     L0C[:, j] (+)= L0A @ L0B    (Cube, fp32 accumulate)
            out: 910B  fixpipe L0C -> GM (relu / cast; a richer epilogue rides along, see FixPipe)
                 910   fixpipe L0C -> UB, epilogue as vector instructions, copy UB -> GM (MTE3)

The tiling function reads every capacity from the DeviceSpec and never exceeds one; on the host
the same sizes are cache-friendly (L1 panels ~ L2, a 16-column micro-panel of L1B ~ L1d, the
6x16 L0C micro-tile ~ 12 ymm registers).

Work split (host threads = blocks): an item owns one N panel of equal width for a group of rows,
so its B panel (K x tn, packed once into the thread's heap workspace) is read from GM exactly
once per launch, and only A is re-packed once per N panel; M is split into groups only when the
panels would not divide evenly over the workers, so every thread gets the same amount of work.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from lazymath.backend import isa, lower_cube  # noqa: F401  (registers the Cube lowerings)
from lazymath.backend import isa_cube as cube
from lazymath.backend.gemm import MR
from lazymath.backend.kernel_ir import Expr, MatmulKernel
from lazymath.backend.templates import common as C

TM_MAX = 96  # L0C tile rows: 16 host micro-panels share each B micro-panel
TN_MAX = 256  # L0C tile cols = one work item's B panel width
MIN_FLOPS_PER_WORKER = 4_000_000  # ~50 us of microkernel work per extra host thread
WORKSPACE_CAP = 64 << 20  # bytes of per-thread host heap workspace for memoised B panels


@dataclass(frozen=True)
class MatmulTiling:
    """Tile sizes (elements) and the work split; printed by reports and used as a cache key."""

    tm: int  # L0C tile rows (multiple of the host microkernel's 6 rows)
    tn: int  # L0C tile cols (multiple of 16)
    kc: int  # K per L1 panel and per Mmad (multiple of 16)
    n0: int  # L0B slice width per Mmad
    l1_bufs: int  # 2 = ping-pong L1 panels
    l0b_bufs: int
    n_panels: int
    m_groups: int
    mg_rows: int  # rows of A per M group
    items: int
    blocks: int
    device_blocks: int
    memo: bool  # host packs each B panel once per item
    epi_rows: int  # UB epilogue chunk rows (coupled path), 0 = FixPipe path
    fixpipe_only: bool  # the epilogue is relu/cast only: FixPipe does it


def _round_up(x: int, a: int) -> int:
    return -(-x // a) * a


def _fixpipe_chain(expr: Expr, result: int) -> tuple[bool, bool]:
    """(FixPipe can do it, with relu): the result is acc followed only by relu and float casts."""
    relu = False
    i = result
    while True:
        op = expr[i]
        if op.op == "acc":
            return True, relu
        if op.op == "relu" and op.dtype.startswith("float"):
            relu = True
        elif not (op.op == "cast" and op.dtype.startswith("float")):
            return False, False
        i = op.srcs[0]


def tile_matmul(k: MatmulKernel, spec, workers: int | None = None) -> MatmulTiling:
    """Pick L0C/L1/L0 tiles from the spec's capacities and split the output over blocks."""
    workers = workers or os.cpu_count() or 1
    # a host thread hand-off costs tens of microseconds: tiny products stay on one block
    flops = 2 * C.prod(k.batch) * max(k.m, 1) * max(k.n, 1) * max(k.k, 1)
    workers = max(1, min(workers, flops // MIN_FLOPS_PER_WORKER))
    eb = 4 if k.in_dtype == "float32" else 2  # NPU operand bytes
    m, n, kk = max(k.m, 1), max(k.n, 1), max(k.k, 1)
    # N panels of (nearly) equal width, so the work items of a launch are equally long
    tn = _round_up(-(-n // -(-n // TN_MAX)), 16)
    tm = min(TM_MAX, _round_up(m, MR))
    while tm * tn * 4 > spec.l0c_bytes:
        if tn > 64:
            tn = _round_up(tn // 2, 16)
        else:
            tm = max(MR, tm - 2 * MR)
    kc = min(256, _round_up(kk, 16))

    def fits(kc: int, l1_bufs: int) -> bool:
        return (tm + tn) * kc * eb * l1_bufs <= spec.l1_bytes and tm * kc * eb <= spec.l0a_bytes

    while kc > 16 and not fits(kc, 2):
        kc -= 16
    l1_bufs = 2 if fits(kc, 2) else 1
    if not fits(kc, l1_bufs):
        raise ValueError(f"matmul tile {tm}x{tn}x{kc} does not fit {spec.name}")
    # L0B slice: the widest multiple of 16 columns that double-buffers in L0B
    n0 = min(tn, max(16, spec.l0b_bytes // (kc * eb * 2) // 16 * 16))
    l0b_bufs = 2 if kc * n0 * eb * 2 <= spec.l0b_bytes else 1
    batch = C.prod(k.batch)
    n_panels = -(-n // tn)
    panels = batch * n_panels
    # split M too when the panels do not divide evenly over the workers (3 panels on 2 threads
    # would leave one idle a third of the time); B is then packed once per M group
    m_groups = 1
    if panels % workers and panels < 16 * workers:
        m_groups = workers // math.gcd(panels, workers)
    m_groups = max(1, min(m_groups, -(-m // MR)))
    mg_rows = _round_up(-(-m // m_groups), MR)
    m_groups = -(-m // mg_rows)
    items = panels * m_groups
    memo = _round_up(kk, kc) * tn * 4 <= WORKSPACE_CAP and m_groups * n_panels >= 1
    simple = all(_fixpipe_chain(k.epilogue, r)[0] for r in k.results)
    epi_rows = 0
    if spec.coupled and not simple:
        epi_rows = _epi_rows(k, spec, tm, tn)
    return MatmulTiling(tm, tn, kc, n0, l1_bufs, l0b_bufs, n_panels, m_groups, mg_rows, items,
                        items, min(items, spec.cube_cores), memo, epi_rows, simple)  # fmt: skip


# ----------------------------------------------------------------------------- UB epilogue (910)


def _emit_epilogue(k: MatmulKernel, tile: int, acc: isa.Ref):
    """Vector instructions for the epilogue over one UB tile.

    Returns (hoisted, buffers, body, loads, outs)."""
    b = isa.Builder(tile=tile)
    pool = C.TilePool(tile, prefix="epi")
    used = sorted({op.arg for op in k.epilogue if op.op == "load"})
    loads = {}
    for i in used:
        loads[i] = isa.Ref(isa.Buffer(f"epi_in{i}", "UB", k.epi_inputs[i].dtype, tile), 0)
    dests = {}
    for j, v in enumerate(k.outputs):
        dests[j] = isa.Ref(isa.Buffer(f"out{j}_ub", "UB", v.dtype, tile), 0)
    em = C.ExprEmitter(b, pool, tile)
    outs = em.emit(k.epilogue, k.results, loads, acc, dests)
    bufs = [acc.buf, *(r.buf for r in loads.values()), *(r.buf for r in dests.values()),
            *pool.buffers, *b.buffers]  # fmt: skip
    return em.hoisted, bufs, b.body, loads, outs


def _epi_rows(k: MatmulKernel, spec, tm: int, tn: int) -> int:
    """Rows of the L0C tile that one UB epilogue pass handles (everything must fit UB)."""
    probe = _emit_epilogue(k, 32, isa.Ref(isa.Buffer("acc_ub", "UB", "float32", 32), 0))
    per_elem = sum(C.itemsize(b.dtype) for b in probe[1])
    rows = spec.ub_bytes // max(per_elem * tn, 1)
    if rows < 1:
        raise ValueError(f"matmul epilogue needs {per_elem} B/element: does not fit UB")
    return min(tm, rows)


# ----------------------------------------------------------------------------- program


def build(k: MatmulKernel, spec, name: str, workers: int | None = None) -> isa.Program:
    """The checked Cube program for `k` on `spec`."""
    return _program(k, spec, name, tile_matmul(k, spec, workers)).check(spec)


def _program(k: MatmulKernel, spec, name: str, t: MatmulTiling) -> isa.Program:
    n_epi, n_out = len(k.epi_inputs), len(k.outputs)
    names = ["a", "b", *(f"epi{i}" for i in range(n_epi)), *(f"out{j}" for j in range(n_out))]
    args = C.gm_args((k.a, k.b, *k.epi_inputs, *k.outputs), names)
    A, B = args[0], args[1]
    EPI, OUT = args[2 : 2 + n_epi], args[2 + n_epi :]
    for j, (v, r) in enumerate(zip(k.outputs, k.results)):
        if v.dtype != k.epilogue[r].dtype:
            raise ValueError(f"output {j} is {v.dtype} but its expression is {k.epilogue[r].dtype}")
    if k.m == 0 or k.n == 0 or C.prod(k.batch) == 0:
        return isa.Program(name, args, (), (), 1, 1, unit="cube")
    tm, tn, kc, n0 = t.tm, t.tn, t.kc, t.n0
    indt = k.in_dtype
    l1a = isa.Buffer("l1a", "L1", indt, t.l1_bufs * tm * kc)
    l1b = isa.Buffer("l1b", "L1", indt, t.l1_bufs * kc * tn)
    l0a = isa.Buffer("l0a", "L0A", indt, tm * kc)
    l0b = isa.Buffer("l0b", "L0B", indt, t.l0b_bufs * kc * n0)
    l0c = isa.Buffer("l0c", "L0C", "float32", tm * tn)
    buffers = [l1a, l1b, l0a, l0b, l0c]

    V = isa.Var
    it, mt, kci, j = V("it"), V("mt"), V("kc"), V("j")
    bi, pn, g = V("bi"), V("pn"), V("g")
    names9 = ("n0", "nv", "gm0", "gmv", "m0", "mv", "k0", "kv", "pp")
    n0v, nv, gm0, gmv, m0, mv, k0, kv, pp = (V(s) for s in names9)
    per_batch = t.n_panels * t.m_groups
    head = [isa.Let(bi, isa.floordiv(it, per_batch)),
            isa.Let(pn, isa.floordiv(isa.mod(it, per_batch), t.m_groups)),
            isa.Let(g, isa.mod(it, t.m_groups)),
            isa.Let(n0v, isa.mul(pn, tn)), isa.Let(nv, isa.imin(tn, isa.sub(k.n, n0v))),
            isa.Let(gm0, isa.mul(g, t.mg_rows)),
            isa.Let(gmv, isa.imin(t.mg_rows, isa.sub(k.m, gm0)))]  # fmt: skip
    bidx = C.unravel(bi, k.batch) if k.batch else []
    nb = len(k.batch)

    def base(view) -> isa.IntExpr:
        return C.dot(bidx, view.strides[:nb], view.offset)

    sam, sak = k.a.strides[-2:]
    sbk, sbn = k.b.strides[-2:]
    # ---- K loop body
    kbody: list = [isa.Let(k0, isa.mul(kci, kc)), isa.Let(kv, isa.imin(kc, isa.sub(k.k, k0)))]
    kbody.append(isa.Let(pp, isa.mod(kci, t.l1_bufs)))
    a_src = isa.Ref(A, isa.add(base(k.a), isa.add(isa.mul(m0, sam), isa.mul(k0, sak))))
    b_src = isa.Ref(B, isa.add(base(k.b), isa.add(isa.mul(k0, sbk), isa.mul(n0v, sbn))))
    a_l1 = isa.Ref(l1a, isa.mul(pp, tm * kc))
    b_l1 = isa.Ref(l1b, isa.mul(pp, kc * tn))
    nk = -(-k.k // kc)
    kbody.append(cube.LoadNz(a_l1, tm, a_src, (sam, sak), mv, kv, MR, k.a_prologue))
    memo = dict(memo=kci, memo_fill=isa.sub(1, isa.imin(mt, 1)), memo_slots=nk,
                memo_slot_elems=kc * tn) if t.memo else {}  # fmt: skip
    kbody.append(cube.LoadNz(b_l1, kc, b_src, (sbk, sbn), kv, nv, 16, k.b_prologue, **memo))
    mvp = isa.mul(isa.ceildiv(mv, MR), MR)
    kvp = isa.mul(isa.ceildiv(kv, 16), 16)
    kbody.append(cube.LoadL0(isa.Ref(l0a, 0), tm, a_l1, tm, mvp, kvp))
    nj = -(-tn // n0)
    jn = isa.imin(n0, isa.sub(nv, isa.mul(j, n0)))
    l0b_ref = isa.Ref(l0b, isa.mul(isa.mod(j, t.l0b_bufs), kc * n0))
    jbody = (cube.LoadL0(l0b_ref, kc, b_l1 + isa.mul(j, n0 * kc), kc, kvp,
                         isa.mul(isa.ceildiv(jn, 16), 16)),
             cube.Mmad(isa.Ref(l0c, isa.mul(j, n0 * tm)), tm, isa.Ref(l0a, 0), tm, l0b_ref, kc,
                       mv, jn, kv, isa.imin(kci, 1), indt))  # fmt: skip
    jstop = isa.ceildiv(nv, n0) if nj > 1 else 1
    kbody.append(isa.Loop(j, 0, jstop, 1, jbody))
    if k.k == 0:  # no K chunk: one Mmad with k = 0 zeroes L0C
        kloop = [cube.Mmad(isa.Ref(l0c, 0), tm, isa.Ref(l0a, 0), tm, isa.Ref(l0b, 0), kc,
                           mv, nv, 0, 0, indt)]  # fmt: skip
    else:
        kloop = [isa.Loop(kci, 0, nk, 1, tuple(kbody))]
    # ---- write-out
    out_body: list = []
    hoisted: list = []
    scm = [v.strides[-2] for v in k.outputs]
    scn = [v.strides[-1] for v in k.outputs]

    def out_ref(jo: int, row0: isa.IntExpr) -> isa.Ref:
        v = k.outputs[jo]
        off = isa.add(base(v), isa.add(isa.mul(isa.add(m0, row0), scm[jo]), isa.mul(n0v, scn[jo])))
        return isa.Ref(OUT[jo], off)

    def epi_ref(i: int, row0: isa.IntExpr) -> tuple[isa.Ref, tuple[int, int]]:
        v = k.epi_inputs[i]
        sm, sn = v.strides[-2:]
        off = isa.add(base(v), isa.add(isa.mul(isa.add(m0, row0), sm), isa.mul(n0v, sn)))
        return isa.Ref(EPI[i], off), (sm, sn)

    if t.fixpipe_only:
        for jo, r in enumerate(k.results):
            relu = _fixpipe_chain(k.epilogue, r)[1]
            out_body.append(cube.FixPipe(out_ref(jo, 0), (scm[jo], scn[jo]), isa.Ref(l0c, 0), tm,
                                         mv, nv, relu))  # fmt: skip
    elif t.epi_rows == 0:  # split 910B: the epilogue rides on FixPipe (see isa_cube.FixPipe)
        srcs = [epi_ref(i, 0) for i in range(n_epi)]
        for jo, r in enumerate(k.results):
            fp = cube.FixPipe(out_ref(jo, 0), (scm[jo], scn[jo]), isa.Ref(l0c, 0), tm, mv, nv,
                              False, k.epilogue, r, tuple(s for s, _ in srcs),
                              tuple(s for _, s in srcs))  # fmt: skip
            out_body.append(fp)
    else:  # coupled 910: L0C -> UB, vector epilogue, UB -> GM
        R = t.epi_rows
        tile = R * tn
        acc = isa.Ref(isa.Buffer("acc_ub", "UB", "float32", tile), 0)
        hoisted, ebufs, ebody, loads, outs = _emit_epilogue(k, tile, acc)
        buffers += [b for b in dict.fromkeys(ebufs)]
        r0, rv = V("r0"), V("rv")
        rbody: list = [
            isa.Let(rv, isa.imin(R, isa.sub(mv, r0))),
            cube.FixPipe(acc, (tn, 1), isa.Ref(l0c, isa.mul(r0, 16)), tm, rv, nv),
        ]
        for i, ref in loads.items():
            src, st = epi_ref(i, r0)
            rbody.append(isa.CopyIn(ref, src, (rv, nv), st, tn))
        rbody += ebody
        for jo, o in enumerate(outs):
            if isinstance(o, C.Const):
                o = isa.Ref(isa.Buffer(f"outc{jo}_ub", "UB", k.outputs[jo].dtype, tile), 0)
                buffers.append(o.buf)
                rbody.append(isa.VDup(o, k.epilogue[k.results[jo]].arg, tile))
            rbody.append(isa.CopyOut(out_ref(jo, r0), o, (rv, nv), (scm[jo], scn[jo]), tn))
        out_body.append(isa.Loop(r0, 0, mv, R, tuple(rbody)))

    mbody = [
        isa.Let(m0, isa.add(gm0, isa.mul(mt, tm))),
        isa.Let(mv, isa.imin(tm, isa.sub(isa.add(gm0, gmv), m0))),
        *kloop,
        *out_body,
    ]
    item_body = [*head, isa.Loop(mt, 0, isa.ceildiv(gmv, tm), 1, tuple(mbody))]
    body = [*hoisted, isa.Loop(it, isa.BLOCK_IDX, t.items, isa.BLOCK_NUM, tuple(item_body))]
    return isa.Program(name, args, tuple(buffers), tuple(body), t.blocks, t.device_blocks,
                       unit="cube")  # fmt: skip
