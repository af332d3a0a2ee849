"""bfloat16 Mmads on the host with AVX512_BF16 dot products (vdpbf16ps): the host mapping of the
910B Cube's bf16 MACs. Split out of ``gemm`` (whose float32 packed GEMM it reuses) by family.

vdpbf16ps multiplies 16 pairs of bfloat16 and adds both products to 16 float32 accumulators
(two K steps per instruction, twice the float32 FMA's work). The L1/L0 host shadows stay float32
NZ panels (MTE2 packs and widens as for float16, so the proofs and redirections of lower_cube hold
unchanged); the Mmad's operands reach the dot-product microkernel as bfloat16:

- A in the NZ index layout of its float32 panel (the K pairs (k, k+1) of a row are adjacent: one
  32-bit broadcast), narrowed per Mmad (`emit_narrow_a`), or read in place from GM when the
  panel is whole (`emit_mmad_bf16`'s `a_nd`, cube_proofs.nd_panels);
- B pair-interleaved (a 64-byte line holds 16 columns x 2 k, `emit_narrow_b_pairs`), with the
  float32 panel's element offsets. lower_cube narrows a B panel into its pair twin once per L1
  fill (`b_pairs`: a memoised B panel is then narrowed once per work item, not once per M
  tile: the per-Mmad narrowing of B cost 3-4 ms of the 2048^3 kernel); elsewhere the Mmad
  narrows it into scratch.

O(MK + KN) exact conversions (the panels hold bfloat16 values) for the tile's O(MNK) MACs.
Elsewhere (no AVX512_BF16, or a target forced without it) bfloat16 Mmads run ``gemm``'s float32
FMA microkernels on the widened panels.
"""

from __future__ import annotations

from llvmlite import ir

from lazymath.backend.host.gemm import (
    C0,
    F32,
    I16,
    I32,
    I64,
    MR,
    UK_FNTYPE,
    GemmPlan,
    Val,
    acc_init,
    as_i64,
    c64,
    ceil_div,
    column_blocks,
    for_range,
    gep,
    get_intrinsic,
    host_gemm,
    imin,
    imul,
    k_loop,
    prefetch,
    prefetch_c,
    splat,
    vload,
)
from lazymath.backend.native import host


class _BFloatType(ir.types._BaseFloatType):
    """LLVM's ``bfloat`` (llvmlite has no class for it): the element type of the dpbf16ps
    intrinsic's operands (LLVM >= 17 takes <32 x bfloat>, earlier releases <16 x i32>)."""

    null = "0.0"
    intrinsic_name = "bf16"

    def __str__(self) -> str:
        return "bfloat"


_BFloatType._create_instance()
V32BF = ir.VectorType(_BFloatType(), 32)
V16F = ir.VectorType(F32, 16)
V16I = ir.VectorType(I32, 16)


def bf16_dot_available(target=None) -> bool:
    """Whether bfloat16 Mmads use vdpbf16ps on `target` (default: the effective host target,
    so LAZYMATH_TARGET_CPU=znver3/haswell forces the float32 FMA path)."""
    if target is None:
        target = host.target()
    return bool(target.bf16) and target.vector_regs >= 32 and BF16_DOT


BF16_DOT = True  # tests compare both paths on one host; part of the disk key via the target


V16BF = ir.VectorType(_BFloatType(), 16)
V16H = ir.VectorType(I16, 16)


def _narrow16(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """<16 x float> of bfloat16 values -> <16 x i16> bits with one vcvtneps2bf16 (the dot
    path runs only where AVX512_BF16 exists). Exact here: the panels hold bfloat16 values;
    the instruction flushes denormals, which vdpbf16ps reads as zero anyway."""
    cvt = get_intrinsic(b.module, "llvm.x86.avx512bf16.cvtneps2bf16.512", V16BF, [V16F])
    return b.bitcast(b.call(cvt, [v]), V16H)


def emit_narrow_a(b: ir.IRBuilder, dst: ir.Value, src: ir.Value, n: Val) -> None:
    """dst[0:n] (i16 bfloat16 bits) = src[0:n] (float32, bfloat16 values): the A panel in the
    same NZ index layout. `n` is a multiple of 16 (whole fractal rows)."""
    with for_range(b, 0, ceil_div(b, n, C0), name="na") as i:
        v = vload(b, gep(b, src, b.mul(i, c64(C0))), V16F, 4)
        b.store(_narrow16(b, v), gep(b, dst, b.mul(i, c64(C0)), I16), align=2)


_PAIRS = ir.Constant(ir.VectorType(I32, 32), [j // 2 + (j % 2) * 16 for j in range(32)])


def emit_narrow_b_pairs(b: ir.IRBuilder, dst: ir.Value, src: ir.Value, b_rows: int,
                        nfc: Val, ncb: Val) -> None:  # fmt: skip
    """B (float32 NZ: fractal column f, row k at (f * b_rows + k) * 16) -> bfloat16 pairs:
    (B[2p, c], B[2p + 1, c]) at ((f * b_rows / 2 + p) * 16 + c) * 2 + {0, 1} (i16 index), for
    the rows of `nfc` K fractal columns and `ncb` column fractals. Element offsets of a K
    fractal column (16 rows) and of a column fractal are the same as the float32 panel's."""
    with for_range(b, 0, ncb, name="nf") as f:
        col = b.mul(f, c64(b_rows * C0))
        with for_range(b, 0, b.mul(as_i64(nfc), c64(C0 // 2)), name="np") as p:
            row0 = gep(b, src, b.add(col, b.mul(p, c64(2 * C0))))
            lo = _narrow16(b, vload(b, row0, V16F, 4))
            hi = _narrow16(b, vload(b, gep(b, row0, C0), V16F, 4))
            both = b.shuffle_vector(lo, hi, _PAIRS)
            b.store(both, gep(b, dst, b.add(col, b.mul(p, c64(2 * C0))), I16), align=4)


_INTERLEAVE = ir.Constant(ir.VectorType(I32, 32), [j // 2 + (j % 2) * 16 for j in range(32)])
_LANES = ir.Constant(ir.VectorType(I64, C0), list(range(C0)))
PAIR_BLOCK = 4  # pairs (8 rows of a row-major B) per block of `emit_pack_pairs`


def pack_pairs_direct(sr: int, sc: int) -> bool:
    """Whether `emit_pack_pairs` has a fast path for a bfloat16 B of element strides (sr, sc):
    row-major (two 16-wide row loads per line) or transposed (16 adjacent K pairs, one 32-bit
    load each: a linear layer's weight.T)."""
    return sc == 1 or sr == 1


def emit_pack_pairs(b: ir.IRBuilder, dst: ir.Value, dst_rows: int, src: ir.Value, sr: int,
                    sc: int, rows: Val, cols: Val) -> None:  # fmt: skip
    """B[0:rows, 0:cols] (bfloat16 in GM, B[k, n] = src[k*sr + n*sc]) straight into the pair
    layout of `emit_narrow_b_pairs` (i16 index f*dst_rows*16 + (k//2)*32 + 2*(n%16) + k%2 for
    column fractal f = n//16), zeros in the fractal padding: what packing the float32 NZ panel
    and narrowing it gives, bit for bit for normal values (vdpbf16ps reads denormal inputs as
    zero either way), without the float32 panel. Packing and narrowing B took 3.7 % of the
    2048^3 kernel's samples (perf, one process on this Zen 4 host).

    Whole lines (16 columns x 2 rows inside the operand) take the fast path of
    `pack_pairs_direct`; the lines of a K or column tail are built lane by lane, each element
    loaded only when it is inside (a clamped index, then a select)."""
    et = I16
    nfc, ncb = ceil_div(b, rows, C0), ceil_div(b, cols, C0)
    full_cb = cols // C0 if isinstance(cols, int) else b.sdiv(cols, c64(C0))
    full_p = rows // 2 if isinstance(rows, int) else b.sdiv(rows, c64(2))
    npairs = imul(b, nfc, C0 // 2)
    v16 = ir.VectorType(I16, C0)

    def line_at(f: ir.Value, p: ir.Value) -> ir.Value:
        return gep(b, dst, b.add(b.mul(f, c64(dst_rows * C0)), b.mul(p, c64(2 * C0))), et)

    def fast(f: ir.Value, p: ir.Value) -> None:
        col0 = b.mul(f, c64(C0))
        if sc == 1:
            at = gep(b, src, b.add(b.mul(p, c64(2 * sr)), col0), et)
            lo = b.load(at, typ=v16, align=2)
            hi = b.load(gep(b, at, sr, et), typ=v16, align=2)
            b.store(b.shuffle_vector(lo, hi, _INTERLEAVE), line_at(f, p), align=4)
            return
        v = ir.Constant(V16I, ir.Undefined)
        at = gep(b, src, b.add(b.mul(p, c64(2)), b.mul(col0, c64(sc))), et)
        for c in range(C0):
            pair = b.load(gep(b, at, c * sc, et), typ=I32, align=2)
            v = b.insert_element(v, pair, ir.Constant(I32, c))
        b.store(v, line_at(f, p), align=4)

    def edge(f: ir.Value, p: ir.Value) -> None:
        cvec = b.add(splat(b, b.mul(f, c64(C0)), C0), _LANES)
        cin = b.icmp_signed("<", cvec, splat(b, as_i64(cols), C0))
        halves = []
        for j in (0, 1):
            k = b.add(b.mul(p, c64(2)), c64(j))
            ok = b.and_(cin, splat(b, b.icmp_signed("<", k, as_i64(rows)), C0))
            idx = b.add(splat(b, b.mul(k, c64(sr)), C0), b.mul(cvec, splat(b, c64(sc), C0)))
            idx = b.select(ok, idx, ir.Constant(idx.type, [0] * C0))
            h = ir.Constant(v16, ir.Undefined)
            for c in range(C0):
                e = b.load(gep(b, src, b.extract_element(idx, ir.Constant(I32, c)), et), typ=et)
                h = b.insert_element(h, e, ir.Constant(I32, c))
            halves.append(b.select(ok, h, ir.Constant(v16, [0] * C0)))
        b.store(b.shuffle_vector(halves[0], halves[1], _INTERLEAVE), line_at(f, p), align=4)

    p_blk = 0  # row-major: pairs in blocks of PAIR_BLOCK, every column fractal per block
    if sc == 1:
        # (column fractal by column fractal, the loads walk the panel at its row stride, a
        # multiple of 4 KiB for square operands: every row in one L1 set; the first version
        # did that and its packing cost as much as pack + narrow)
        p_blk = imul(b, b.sdiv(as_i64(full_p), c64(PAIR_BLOCK)) if not isinstance(full_p, int)
                     else full_p // PAIR_BLOCK, PAIR_BLOCK)  # fmt: skip
        with for_range(b, 0, p_blk, PAIR_BLOCK, name="ppb") as p0:
            with for_range(b, 0, full_cb, name="ppf") as f:
                for j in range(PAIR_BLOCK):
                    fast(f, b.add(p0, c64(j)))
    with for_range(b, 0, full_cb, name="ppf") as f:
        with for_range(b, p_blk, full_p, name="ppp") as p:
            fast(f, p)
        with for_range(b, full_p, npairs, name="ppe") as p:
            edge(f, p)
    with for_range(b, full_cb, ncb, name="ppt") as f:
        with for_range(b, 0, npairs, name="ppq") as p:
            edge(f, p)


def get_ukernel_bf16(mod: ir.Module, mr: int, nr: int, pf_lines: int = 1,
                     nd: bool = False) -> ir.Function:  # fmt: skip
    """``ukernel(a, b, c, nfc, a_fc, b_fc, c_fc, accumulate, pf_b, pf_c)`` as `get_ukernel`'s
    (same arguments, element offsets in i16 for a and b), C(mr x nr) (+)= A B with vdpbf16ps:
    per K pair, nr/16 B vectors (32 bfloat16: 16 columns x 2 k, one cache line each), mr 32-bit
    A broadcasts and mr*nr/16 dot products into as many float32 accumulators. The 8 pairs of a
    K fractal column are unrolled (half the float32 kernel's k steps per column). Products of
    bfloat16 are exact in float32; each instruction adds the pair's two products in turn,
    flushing denormal inputs and results to zero (Intel SDM), so a sum may differ from the
    float32 FMA kernel's in its last bits, never by more than rounding order allows.

    `nd`: A is the bfloat16 operand row-major in GM (read in place, cube_proofs.nd_panels):
    `a_fc` is then its row stride in elements and a K fractal column is 16 elements further
    along the row; a row's K pairs are adjacent either way (one 32-bit broadcast, 2-byte
    aligned: the row stride may be odd)."""
    name = f"lm_ukernel_bf16_{mr}x{nr}_pf{pf_lines}" + ("_nd" if nd else "")
    if name in mod.globals:
        return mod.globals[name]
    nf = nr // C0
    fn = ir.Function(mod, UK_FNTYPE, name=name)
    fn.linkage = "internal"
    for i in range(3):
        fn.args[i].add_attribute("noalias")
    a, bp, c, nfc, astride, bstride, cstride, accf, pfb, pfc = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    dp = get_intrinsic(mod, "llvm.x86.avx512bf16.dpbf16ps.512", V16F, [V16F, V32BF, V32BF])

    def c_at(r: int, f: int) -> ir.Value:
        base = c if f == 0 else gep(b, c, b.mul(cstride, c64(f)))
        return gep(b, base, r * C0)

    prefetch_c(b, pfc, cstride, nf, mr)
    slots = [(r, f) for r in range(mr) for f in range(nf)]
    init = acc_init(b, fn, accf, lambda: [c_at(*s) for s in slots], V16F, 32)
    head, end, (kv, pa, pb, ppf), accs = k_loop(b, fn, nfc, (a, bp, pfb), init, V16F)
    fcp = [ppf] + [gep(b, ppf, b.mul(bstride, c64(f)), I16) for f in range(1, nf)]
    for kk in range(min(pf_lines, C0 // 2)):
        for f in range(nf):
            prefetch(b, gep(b, fcp[f], kk * 2 * C0, I16), 2)
    fcb = [pb] + [gep(b, pb, b.mul(bstride, c64(f)), I16) for f in range(1, nf)]
    cur = list(accs)
    for p in range(C0 // 2):
        bv = [b.bitcast(vload(b, gep(b, fcb[f], p * 2 * C0, I16), V16I, 64), V32BF)
              for f in range(nf)]  # fmt: skip
        for r in range(mr):
            if nd:
                pr = gep(b, pa, b.add(b.mul(astride, c64(r)), c64(2 * p)), I16)
                s = b.load(pr, typ=I32, align=2)
            else:
                s = b.load(gep(b, pa, r * C0 + 2 * p, I16), typ=I32, align=4)
            v = b.bitcast(splat(b, s, 16), V32BF)
            for f in range(nf):
                i = r * nf + f
                cur[i] = b.call(dp, [cur[i], v, bv[f]])
    blk = b.block
    kv.add_incoming(b.add(kv, c64(1)), blk)
    pa.add_incoming(gep(b, pa, c64(C0) if nd else astride, I16), blk)
    pb.add_incoming(gep(b, pb, C0 * C0, I16), blk)
    ppf.add_incoming(gep(b, ppf, C0 * C0, I16), blk)
    for ph, v in zip(accs, cur):
        ph.add_incoming(v, blk)
    b.branch(head)
    b.position_at_end(end)
    for i, (r, f) in enumerate(slots):
        b.store(accs[i], c_at(r, f), align=32)
    b.ret_void()
    return fn


def emit_mmad_bf16(b: ir.IRBuilder, c: ir.Value, c_rows: int, a: ir.Value, a_rows: int,
                   bmat: ir.Value, b_rows: int, m: Val, n: Val, k: Val, accumulate: Val,
                   a16: ir.Value, b16: ir.Value | None, plan: GemmPlan | None = None,
                   a_nd: Val | None = None, b_pairs: bool = False) -> None:  # fmt: skip
    """`emit_mmad` for a bfloat16 Mmad with vdpbf16ps: narrow the float32 NZ panels A
    (a_rows x k) and B (k x n) into the scratch `a16` / `b16` (i16; as many elements as the
    float32 buffers the panels live in, which bound a_rows * k and k * n), then the same loop nest
    as `emit_mmad` (B micro-panels of the plan's nr columns outer, MR-row A micro-panels inner,
    narrower edge widths, a tail microkernel for the rows past the last whole MR) over the
    dot-product microkernels. One K pass (the plan's host K panel is for float32 panels; a
    bfloat16 B micro-panel of the Mmad's K is half the bytes).

    `a_nd` (row stride in elements): `a` is then the bfloat16 A operand row-major in GM, read
    in place by the `_nd` microkernels with no narrowing (lower_cube proves the panel whole):
    narrowing a 128 x 512 float32 A panel for every Mmad cost 16 of 101 ms of the 2048^3
    kernel on one Zen 4 core.

    `b_pairs`: `bmat` is already B's bfloat16 pair layout (lower_cube narrowed the L1 panel
    into its twin when it was filled; `b16` unused): a B panel reused by the M tiles of a work
    item is then narrowed once, not once per Mmad."""
    plan = plan or host_gemm()
    nr = plan.uk.nr if plan.uk.vw == 16 else 64
    n_ir = -(-(m if isinstance(m, int) else a_rows) // MR)
    q = min(C0 // 2, max(1, -(-(C0 // 2) // max(n_ir, 1))))
    acc = (
        b.zext(accumulate, I32) if not isinstance(accumulate, int) else ir.Constant(I32, accumulate)
    )
    nfc = ceil_div(b, k, C0)
    ncb = ceil_div(b, n, C0)
    if a_nd is None:
        emit_narrow_a(b, a16, a, imul(b, nfc, a_rows * C0))
        afc, arow, akc = c64(a_rows * C0), c64(C0), c64(a_rows * C0)
    else:
        a16 = a
        afc = arow = as_i64(a_nd)  # row stride; a K fractal column is C0 along the row
        akc = c64(C0)
    if b_pairs:
        b16 = bmat
    else:
        emit_narrow_b_pairs(b, b16, bmat, b_rows, nfc, ncb)
    full_rows = min(a_rows, c_rows) // MR
    tail_rows = min(a_rows, c_rows) % MR
    bfc, cfc = c64(b_rows * C0), c64(c_rows * C0)
    kcf = bf16_k_panel(nr) // C0
    nd = a_nd is not None
    if isinstance(nfc, int) and nfc <= kcf:
        _bf16_panel(b, c, a16, b16, b_rows, m, acc, nfc, ncb, nr, q, full_rows, tail_rows, bfc,
                    cfc, afc, arow, nd)  # fmt: skip
        return
    with for_range(b, 0, nfc, kcf, name="kb") as kb:
        nk = imin(b, c64(kcf), b.sub(as_i64(nfc), kb))
        acc_k = b.select(b.icmp_signed(">", kb, c64(0)), ir.Constant(I32, 1), acc)
        _bf16_panel(b, c, gep(b, a16, b.mul(kb, akc), I16), gep(b, b16, b.mul(kb, c64(C0 * C0)),
                    I16), b_rows, m, acc_k, nk, ncb, nr, q, full_rows, tail_rows, bfc, cfc,
                    afc, arow, nd)  # fmt: skip


def bf16_k_panel(nr: int, target=None) -> int:
    """Host K panel of the dot-product kernels: the K depth whose bfloat16 B micro-panel (nr
    columns x K, 2 bytes) takes about two thirds of the host L1d, so the A micro-panels that
    reuse it read it from L1 (a whole 512-deep Mmad's 64 KiB micro-panel streamed from L2:
    584 GFLOPS at 2048 on this Zen 5 host)."""
    if target is None:
        target = host.target()
    return max(C0, min(1024, (2 * target.l1d // 3) // (2 * nr) // C0 * C0))


def _bf16_panel(b, c, a16, b16, b_rows, m, acc, nfc, ncb, nr, q, full_rows, tail_rows, bfc,
                cfc, afc, arow, nd) -> None:  # fmt: skip
    """One host K panel of `emit_mmad_bf16`: B micro-panels outer, A micro-panels inner
    (`arow`: A's row step in elements, C0 in NZ, the row stride in place)."""
    nf = nr // C0

    def run(fc0: ir.Value, width: int) -> None:
        ukf = get_ukernel_bf16(b.module, MR, width, q, nd)
        pb = gep(b, b16, b.mul(fc0, bfc), I16)
        pb_next = gep(b, pb, (width // C0) * b_rows * C0, I16)
        pc_col = gep(b, c, b.mul(fc0, cfc))
        groups = ceil_div(b, m, MR)
        with for_range(b, 0, imin(b, groups, full_rows), name="ir") as ir_:
            off = b.mul(ir_, c64(MR * C0))
            pc = gep(b, pc_col, off)
            line = b.and_(b.mul(ir_, c64(q)), c64(C0 // 2 - 1))
            pf_b = gep(b, pb_next, b.mul(line, c64(2 * C0)), I16)
            pa = gep(b, a16, b.mul(b.mul(ir_, c64(MR)), arow), I16)
            b.call(ukf, [pa, pb, pc, as_i64(nfc), afc, bfc, cfc, acc, pf_b,
                         gep(b, pc, MR * C0)])  # fmt: skip
        if tail_rows:
            uk_tail = get_ukernel_bf16(b.module, tail_rows, width, q, nd)
            with b.if_then(b.icmp_signed(">", as_i64(groups), c64(full_rows))):
                off = full_rows * MR * C0
                pa = gep(b, a16, b.mul(c64(full_rows * MR), arow), I16)
                b.call(uk_tail, [pa, pb, gep(b, pc_col, off), as_i64(nfc),
                                 afc, bfc, cfc, acc, pb_next, gep(b, pc_col, off)])  # fmt: skip

    column_blocks(b, ncb, nf, nr, run)
