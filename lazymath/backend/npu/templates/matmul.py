"""Matmul template: a `MatmulKernel` -> Cube ISA program (GM -> L1 -> L0A/L0B -> L0C -> out).

Loop nest of one block (AscendC matmul, split into work items = (batch, N panel, M group)):

    for item in the block's contiguous range of items:
        for mt in M tiles of the group:                 # L0C tile tm x tn (ping-pong slots)
            for kc in K steps:                           # L1 panels, ping-pong
                load_nz  L1A <- A[m0:+tm, k0:+kc]       (MTE2, ND->NZ, prologue)
                load_nz  L1B <- B[k0:+kc, n0:+tn]       (MTE2, memo hint: see LoadNz)
                load_l0a L0A <- L1A                      (MTE1, ping-pong)
                for j in n0-wide slices of the panel:    # L0B ping-pong
                    load_l0b L0B <- L1B[:, j]            (MTE1)
                    mmad     L0C[:, j] (+)= L0A @ L0B    (Cube, fp32 accumulate)
            out: 910B  fixpipe L0C -> GM (relu / cast; a richer epilogue rides along, see FixPipe)
                 910   fixpipe L0C -> UB, epilogue as vector instructions, copy UB -> GM (MTE3)
                 910B with column sums: a MIX kernel (below)

Column sums, row reductions, softmax and conv1d epilogues on the split 910B: the Cube core (AIC)
has no UB, so the kernel is a MIX kernel (AscendC KERNEL_TYPE_MIX_AIC_1_2), one body for the AIC
and the Vector cores (AIV) of its group with cross-core flags between the two sides, as AscendC
writes one kernel function with ASCEND_IS_AIC / ASCEND_IS_AIV parts: `isa.mix_streams` splits it
into the AIC program and the AIV program, which the cost model runs concurrently (the host runs
the body in program order). The AIC's FixPipe writes each L0C tile to a GM workspace slot (two
per group, ping-pong; L2-resident on a real chip) and sets a cross-core flag; the AIV waits on
it, copies the tile GM -> UB in row chunks, runs the epilogue (and folds the rows into the column
accumulators exactly as the coupled 910 does after its L0C -> UB FixPipe), and sets the flag
that frees the slot. FixPipe itself has no reduction, so this is the honest form. When the AIV
work is per tile (no column sums, one N panel of row values), the group's two AIVs split each
tile's row chunks (sub-block loops over `isa.SUBBLOCK_IDX`, `MatmulTiling.aivs`).

Device-only program. `tile_matmul` reads every size from the DeviceSpec and the kernel, never from
the host: the L0C tile is half of L0C (two tiles ping-pong), the K step is what double-buffers in
L0A, the L0B slice what double-buffers in L0B, L1 holds two panels of each operand, and the items
are split so the preset's Cube cores get equal shares. `ascend910` (L0C 256 KiB) and `ascend910b`
(128 KiB) therefore get different tiles. The program's `blocks` is the device's block count; the
body reads BLOCK_IDX/BLOCK_NUM and takes a contiguous range of items, so the host mapping
(`compile.host_blocks`, the LLVM lowering in ``lower_cube``/``gemm``) may launch any number of host
threads and runs the same program: the listing and the simulated cost never depend on the host.
"""

from __future__ import annotations

from dataclasses import dataclass

from lazymath.backend.npu import cube_semantics, isa  # noqa: F401  (registers the Cube instructions' semantics)
from lazymath.backend.npu import isa_cube as cube
from lazymath.backend.npu.kernel_ir import DynamicMatmulKernel, Expr, MatmulKernel
from lazymath.backend.npu.templates import common as C

TM_CAP = 128  # L0C tile rows at most (AscendC baseM)
TN_CAP = 256  # L0C tile cols at most (AscendC baseN)
MIN_GROUP_ROWS = 64  # an M group below this wastes the Cube's B traffic more than idle cores cost
WORKSPACE_CAP = 64 << 20  # bytes of memo workspace the LoadNz hint may ask for (host side)


@dataclass(frozen=True)
class MatmulTiling:
    """Tile sizes (elements) and the work split; printed by reports and used as a cache key."""

    tm: int  # L0C tile rows (multiple of 16)
    tn: int  # L0C tile cols (multiple of 16)
    kc: int  # K per L1 panel (a multiple of kl0)
    n0: int  # L0B slice width per Mmad
    kl0: int  # K per L0A/L0B tile and per Mmad (multiple of 16)
    l1_bufs: int  # 2 = ping-pong L1 panels
    l0a_bufs: int
    l0b_bufs: int
    l0c_bufs: int
    n_panels: int
    m_groups: int
    mg_rows: int  # rows of A per M group
    items: int
    blocks: int  # = device_blocks: the program's block count
    device_blocks: int
    memo: bool  # LoadNz memo hint for the B panel (host packs it once per item range)
    epi_rows: int  # UB epilogue chunk rows (coupled path), 0 = FixPipe path
    fixpipe_only: bool  # the epilogue is relu/cast only: FixPipe does it
    # coupled 910, operand prologue: rows of the L1 panel per UB staging pass (GM -> UB,
    # vector instructions, UB -> L1); 0 = no prologue on that operand
    pro_a_rows: int = 0
    pro_b_rows: int = 0
    # split 910B MIX kernel: AIVs per AIC that split each tile's rows (sub-blocks); 1 = one AIV
    aivs: int = 1


def _round_up(x: int, a: int) -> int:
    return -(-x // a) * a


_FIXPIPE_FLOATS = ("float16", "bfloat16", "float32", "float64")


def _fixpipe_chain(expr: Expr, result: int) -> tuple[bool, bool]:
    """(FixPipe can do it, with relu): the result is acc followed only by relu and float casts
    that round at most once. FixPipe casts the float32 accumulator once, to the destination's
    dtype (NPU_FACTS: fp32 -> fp16/bf16), so a chain that rounds to a narrow float and then
    widens again (acc -> bfloat16 -> float32: a bf16 matmul feeding a float32 add) is not one
    FixPipe cast; it keeps the rounding in a Vector epilogue. relu commutes with rounding."""
    chain = []
    i = result
    while expr[i].op != "acc":
        op = expr[i]
        if op.op not in ("relu", "cast") or op.dtype not in _FIXPIPE_FLOATS:
            return False, False
        chain.append(op)
        i = op.srcs[0]
    narrow = None  # the float16/bfloat16 dtype the chain rounded to, once
    for op in reversed(chain):
        if op.op == "cast" and narrow is not None and op.dtype != narrow:
            return False, False
        if op.op == "cast" and op.dtype not in ("float32", "float64"):
            narrow = op.dtype
    return True, any(op.op == "relu" for op in chain)


def tile_matmul(k: MatmulKernel, spec) -> MatmulTiling:
    """Pick L0C/L0A/L0B/L1 tiles from the spec's capacities and split the output over the spec's
    Cube cores. Depends on the kernel and the spec only (never on the host)."""
    eb = 4 if k.in_dtype == "float32" else 2  # NPU operand bytes
    m, n, kk = max(k.m, 1), max(k.n, 1), max(k.k, 1)
    f = spec.cube_n  # 16: fractal edge
    # L0C tile (fp32): half of L0C, so FixPipe drains one tile while the Cube fills the other
    l0c_elems = spec.l0c_bytes // 4 // 2
    tm = min(TM_CAP, _round_up(m, f))
    tn_cap = min(TN_CAP, _round_up(n, f))
    while tm * tn_cap > l0c_elems:
        if tn_cap >= tm and tn_cap > f:
            tn_cap = _round_up(tn_cap // 2, f)
        else:
            tm = max(f, tm - f)
    tn = _round_up(-(-n // -(-n // tn_cap)), f)  # N panels of (nearly) equal width
    # L0 K step: an L0A tile double-buffers; an L0B slice of n0 columns double-buffers
    kl0 = min(_round_up(kk, f), spec.l0a_bytes // (2 * tm * eb) // f * f)
    while kl0 > f and (tm + tn) * kl0 * eb * 2 > spec.l1_bytes:
        kl0 -= f
    if kl0 < f or (tm + tn) * kl0 * eb * 2 > spec.l1_bytes:
        raise ValueError(f"matmul tile {tm}x{tn} does not fit {spec.name}")
    # L1 panel depth: the most L0 K steps two panels of A and B hold (fewer, longer MTE2 moves:
    # each pays the fixed copy cost once)
    total = -(-kk // kl0)
    steps = min(total, spec.l1_bytes // ((tm + tn) * kl0 * eb * 2))
    steps = -(-total // -(-total // steps))  # panels of (nearly) equal depth
    kc = steps * kl0
    n0_cap = min(tn, spec.l0b_bytes // (2 * kl0 * eb) // f * f)
    n0 = max(w for w in range(f, n0_cap + 1, f) if tn % w == 0)  # slices tile the panel exactly
    batch = C.prod(k.batch)
    n_panels = -(-n // tn)
    panels = batch * n_panels
    cores = spec.cube_cores
    # split M too when the panels do not divide evenly over the cores (3 panels on 32 cores
    # would leave 29 idle): the group count with the shortest makespan (rounds of items x rows
    # per item), fewest groups on a tie; an M group keeps at least MIN_GROUP_ROWS rows
    cap = max(1, min(-(-m // MIN_GROUP_ROWS), 16 * cores))

    def makespan(g: int) -> int:
        return -(-panels * g // cores) * _round_up(-(-m // g), f)

    if isinstance(k, DynamicMatmulKernel):  # M at run time: `_runtime_groups` splits it
        if k.batch or k.col_sums:
            raise ValueError("a dynamic matmul kernel has no stacked batch and no column sums "
                             f"(batch {k.batch}, {len(k.col_sums)} column sums)")  # fmt: skip
        # the most groups a launch may use (at the bound): one round of the cores
        m_groups = max(1, min(-(-m // MIN_GROUP_ROWS), cores // panels))
    else:
        m_groups = min(range(1, cap + 1), key=lambda g: (makespan(g), g))
    mg_rows = _round_up(-(-m // m_groups), f)
    m_groups = -(-m // mg_rows)
    items = panels * m_groups
    memo = _round_up(kk, kc) * tn * 4 <= WORKSPACE_CAP
    reds = bool(k.col_sums or k.row_reds or k.softmax)  # row / column work: the vector unit's
    simple = all(_fixpipe_chain(k.epilogue, r)[0] for r in k.results) and not reds
    epi_rows = 0
    pro_a = pro_b = 0
    b_staged = k.b_prologue is not None and not k.b_im2col  # (im2col: applied in its packing)
    staged = spec.coupled and (k.a_prologue is not None or b_staged)
    ub = spec.ub_bytes // 2 if staged else spec.ub_bytes  # prologue staging takes the other half
    # split 910B + reductions, conv1d's implicit GEMM with an epilogue, or an epilogue the
    # planner gave the AIVs (fusion.rules.MATMUL_MIX_EPILOGUE): a MIX kernel
    aivs = 1
    if not simple:
        # MIX_AIC_1_2: the AIVs of the group split each tile's rows (sub-blocks). Row values
        # over several N panels: each AIV publishes its rows' partials and counts its own
        # arrival, the last of all combines the row block (the counter is the only sync needed).
        # Column sums keep one AIV: two column accumulators (one per AIV's UB) would change the
        # summation order, i.e. the host's results, which must not depend on the device model.
        if not spec.coupled and not k.col_sums:
            aivs = max(1, spec.vector_cores // spec.cube_cores)
        epi_rows = _epi_rows(k, spec, tm, tn, ub, max(1, tm // aivs))
    if staged:  # each staged operand gets half of the prologue's half of UB
        share = ub // (int(k.a_prologue is not None) + int(b_staged))
        if k.a_prologue is not None:
            pro_a = _pro_rows(k.a_prologue, k.a.dtype, k.in_dtype, tm, kc, share)
        if b_staged:
            pro_b = _pro_rows(k.b_prologue, k.b.dtype, k.in_dtype, kc, tn, share)
    blocks = min(items, cores)
    return MatmulTiling(tm, tn, kc, n0, kl0, 2, 2, 2, 2, n_panels, m_groups, mg_rows, items,
                        blocks, blocks, memo, epi_rows, simple, pro_a, pro_b, aivs)  # fmt: skip


BLOCKS_PER_THREAD = 4  # a big matmul's host blocks per thread at most (dynamic split)
ITEM_BLOCKS_PER_THREAD = 16  # the same when M groups are tall enough to be blocks of their own
SPLIT_PANEL_ROWS = 1024  # rows of its N panel a block holds at least when it holds part of one
HALF_PANEL_ROWS = 512  # ... or this many when whole panels give < BLOCKS_PER_THREAD per thread


def host_blocks(k: MatmulKernel, spec, threads: int, max_blocks: int) -> int:
    """Host blocks (BLOCK_NUM) for `threads` host threads: a dynamic split (the host mapping's
    choice, `compile.host_blocks`; the program and its cost do not change).

    The items are (batch, N panel, M group) with the M groups innermost, and a block packs its
    first B panel and every later one it starts (the LoadNz memo). With as many blocks as
    threads, a thread that starts late, runs on a busier core or is descheduled leaves the
    others waiting at the end (up to one block's time); with more blocks the others take over
    its share. A block count that divides the N panels keeps whole panels per block, so B is
    still packed once per panel: the most blocks, up to BLOCKS_PER_THREAD per thread and
    `max_blocks`, that divides the panels; `threads` when the panels are too few. A block may
    also be a run of whole items holding at least SPLIT_PANEL_ROWS rows of its panel (up to
    ITEM_BLOCKS_PER_THREAD blocks per thread): a panel split over blocks is packed once per
    block, K x 256 elements against 2 x rows x 256 x K flops of its items (< 1.5% at 1024 rows).
    Measured at 4096^3 on 2 cores (the kernel on the pool, medians of interleaved launches,
    three runs): 32 blocks of one item fp16 214 / 204, fp32 237 GFLOPS against 8 blocks of two
    panels 204 / 192, 222 (16 blocks: 207 / 195, 221). At 2048^3 (M groups of 512 rows: runs of
    2 items, 16 blocks instead of 8 whole panels), launches interleaved in one process, median
    speed ratio 16 / 8 blocks over 21-41 rounds: fp32 1.066 and 1.020, fp16 1.010 (32 blocks:
    1.028, 0.996, 0.985). The two vCPUs of the project VM often differ in speed for a whole
    process (identical blocks took 1.2-1.5x the CPU time on one thread in about half of the
    processes, issue 11's note, session 6): more, smaller blocks let the faster thread take a
    larger share. So when whole panels give fewer than BLOCKS_PER_THREAD blocks per thread, a
    block may be a run of items of HALF_PANEL_ROWS rows: 1024^3 runs 8 blocks of 512 rows (was 4
    whole panels); ratio 8 / 4 blocks in 12 process-runs: 0.97-1.00 where the threads ran alike,
    1.10-1.29 where one was slow (fp32 0.974, 0.977, 0.989, 0.984, 1.002, 1.105; fp16 0.990,
    1.291, 0.979, 1.138, 1.113, 0.985).
    """
    t = tile_matmul(k, spec)
    panels = C.prod(k.batch) * t.n_panels
    cap = min(BLOCKS_PER_THREAD * threads, panels, max_blocks)
    best = max((d for d in range(threads + 1, cap + 1) if panels % d == 0), default=threads)
    few = -(-HALF_PANEL_ROWS // t.mg_rows)  # too few panels: runs of items of half a panel
    if best < BLOCKS_PER_THREAD * threads and few < t.m_groups:
        cap = min(BLOCKS_PER_THREAD * threads, t.items // few, max_blocks)
        best = max((d for d in range(best, cap + 1) if t.items % d == 0), default=best)
    run = -(-SPLIT_PANEL_ROWS // t.mg_rows)  # items of a block that holds part of a panel
    if run >= t.m_groups and t.mg_rows < SPLIT_PANEL_ROWS:  # it would hold whole panels
        return best
    cap = min(ITEM_BLOCKS_PER_THREAD * threads, t.items // run, max_blocks)
    return max((d for d in range(best, cap + 1) if t.items % d == 0), default=best)


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
    vals = k.results + k.col_sums + tuple(r for _, r in k.row_reds) + k.softmax
    outs = em.emit(k.epilogue, vals, loads, acc, dests)
    bufs = [acc.buf, *(r.buf for r in loads.values()), *(r.buf for r in dests.values()),
            *pool.buffers, *b.buffers]  # fmt: skip
    return em.hoisted, bufs, b.body, loads, outs


def _epi_rows(k: MatmulKernel, spec, tm: int, tn: int, ub: int | None = None,
              cap: int | None = None) -> int:  # fmt: skip
    """Rows of the L0C tile that one UB epilogue pass handles (everything must fit `ub` bytes,
    default all of UB; at most `cap` rows: a MIX kernel's AIVs each take a share of the tile)."""
    probe = _emit_epilogue(k, 32, isa.Ref(isa.Buffer("acc_ub", "UB", "float32", 32), 0))
    per_elem = sum(C.itemsize(b.dtype) for b in probe[1])
    per_elem += 4 * len(k.col_sums)  # a float32 work tile per column sum (see `_fold_rows`)
    # a constant row-reduced value is first spread over a float32 work tile
    n_out, ncs = len(k.results), len(k.col_sums)
    per_elem += 4 * sum(isinstance(o, C.Const) for o in probe[4][n_out + ncs :])
    # per column sum a row of accumulator, of partials and of converted output; per row
    # reduction the same over the tile's rows; a counter tile
    fixed = len(k.col_sums) * 3 * 4 * tn + len(k.row_reds) * 3 * 4 * tm
    fixed += 128 if k.col_sums or k.row_reds else 0
    fixed += sum(4 * 4 * tm for p in k.row_posts if p is not None)  # a row epilogue's tiles
    # softmax: float32 work and broadcast tiles (+ the output dtype's), five rows of row values
    per_elem += sum(8 + (C.itemsize(v.dtype) if v.dtype != "float32" else 0)
                    for v in k.softmax_outputs)  # fmt: skip
    fixed += len(k.softmax) * (5 * 4 * tm + 128)
    rows = ((spec.ub_bytes if ub is None else ub) - fixed) // max(per_elem * tn, 1)
    if rows < 1:
        raise ValueError(f"matmul epilogue needs {per_elem} B/element: does not fit UB")
    rows = min(tm, rows, cap or tm)
    return max(r for r in range(1, rows + 1) if tm % r == 0)  # a divisor: passes never straddle


def _fold_rows(src: isa.Ref, w: isa.Ref, cacc: isa.Ref, rows, max_rows: int, pitch: int, cols,
               tag: str) -> list:  # fmt: skip
    """cacc[:cols] += the sum of `rows` rows (pitch `pitch`) at `src`, folded pairwise on the
    Vector unit: each level adds the last half of the rows onto the first half (one vadd over
    half the tile; an odd middle row is carried), ceil(log2(max_rows)) levels, so the chunk
    costs a few long vector instructions instead of one short one per row. The first level
    writes the float32 work tile `w` (`src` may be an output tile, left intact), later ones
    fold `w` in place. Pairwise sums are also the more accurate order."""
    out: list = []
    cur, r = src, rows
    for lv in range(max(0, (max_rows - 1).bit_length())):
        h, r2 = isa.Var(f"{tag}h{lv}"), isa.Var(f"{tag}r{lv}")
        out.append(isa.Let(h, isa.floordiv(r, 2)))
        out.append(isa.VBinary("vadd", w, cur, cur + isa.mul(isa.sub(r, h), pitch),
                               isa.mul(h, pitch)))  # fmt: skip
        if cur != w:  # the middle row of an odd count moves to w as it is
            out.append(isa.VUnary("vcopy", w + isa.mul(h, pitch), cur + isa.mul(h, pitch), pitch))
        out.append(isa.Let(r2, isa.sub(r, h)))
        cur, r = w, r2
    out.append(isa.VBinary("vadd", cacc, cacc, cur, cols))
    return out


_ROW_RED = {"sum": ("vcadd", 0.0), "max": ("vcmax", float("-inf")), "min": ("vcmin", float("inf"))}
_ROW_COMBINE = {"sum": "vadd", "max": "vmax", "min": "vmin"}


def _reduce_rows(vop: str, dst: isa.Ref, src: isa.Ref, rows, cols, pitch: int, full: bool,
                 tag: str) -> list:  # fmt: skip
    """dst[r] op= reduce(src[r*pitch : r*pitch + cols]) for r < rows: one WholeReduce when the
    rows are full (cols == pitch), else one reduction per row."""
    if full:
        return [isa.VReduce(vop, dst, src, pitch, rows)]
    rr = isa.Var(f"{tag}r")
    return [isa.Loop(rr, 0, rows, 1, (isa.VReduce(vop, dst + rr, src + isa.mul(rr, pitch), cols),))]


def _row_write(racc: isa.Ref, gm: isa.Buffer, v, off, n, tm: int, jr: int, buffers: list,
               Bar, post=None, hoisted: list | None = None, first=0) -> list:  # fmt: skip
    """The float32 row values `racc[first:first + n]` to GM `gm` at `off` (view `v`), through
    the row reduction's epilogue `post` (an expression over ``acc``, e.g. a mean's scale and
    cast; computed over the whole tile) and converted to the view's dtype on the way."""
    src = racc
    out: list = [Bar()]  # the last Vector op -> the epilogue / conversion / MTE3
    dst = isa.Ref(isa.Buffer(f"rowo{jr}_ub", "UB", v.dtype, tm), 0)
    if post is not None:
        b = isa.Builder(tile=tm)
        pool = C.TilePool(tm, prefix=f"rpost{jr}_")
        em = C.ExprEmitter(b, pool, tm)
        em.const_prefix = f"rpost{jr}_"
        (res,) = em.emit(post, (len(post) - 1,), {}, racc, {0: dst})
        if isinstance(res, C.Const):
            b.emit(isa.VDup(dst, res.value, tm))
            res = dst
        if hoisted is not None:
            hoisted.extend(em.hoisted)
        for buf in [*pool.buffers, *b.buffers]:
            if buf not in buffers:
                buffers.append(buf)
        out += [*b.body, Bar()]
        src = res
    if src.buf.dtype != v.dtype:
        out += [isa.VConv(dst + first, src + first, n, "trunc"), Bar()]
        src = dst
    if src.buf is dst.buf and dst.buf not in buffers:
        buffers.append(dst.buf)
    out.append(isa.CopyOut(isa.Ref(gm, off), src + first, (n,), (v.strides[-1],)))
    return out


# ----------------------------------------------------------------------------- UB prologue (910)


def _emit_prologue(expr, src_dtype: str, out_dtype: str, tile: int, tag: str):
    """Vector instructions for an operand prologue over one UB tile (the coupled 910: the
    Cube core's Vector unit computes it between the GM -> UB and UB -> L1 moves; MTE2 does no
    arithmetic). Returns (hoisted, buffers, body, src tile, result tile)."""
    b = isa.Builder(tile=tile)
    pool = C.TilePool(tile, prefix=f"pro{tag}")
    src = isa.Ref(isa.Buffer(f"pro{tag}_in", "UB", src_dtype, tile), 0)
    dst = isa.Ref(isa.Buffer(f"pro{tag}_out", "UB", out_dtype, tile), 0)
    em = C.ExprEmitter(b, pool, tile)
    em.const_prefix = f"pro{tag}"
    (res,) = em.emit(expr, (len(expr) - 1,), {0: src}, None, {0: dst})
    if isinstance(res, C.Const):  # a constant operand: fill the tile
        b.emit(isa.VDup(dst, res.value, tile))
        res = dst
    if res.buf.dtype != out_dtype:
        b.emit(isa.VConv(dst, res, tile, "trunc"))
        res = dst
    bufs = [src.buf, dst.buf, *pool.buffers, *b.buffers]
    return em.hoisted, list(dict.fromkeys(bufs)), b.body, src, res


def _pro_rows(expr, src_dtype: str, out_dtype: str, rows: int, cols: int, ub: int) -> int:
    """Rows (a multiple of 16 dividing `rows`) of a rows x cols operand panel per UB prologue
    pass that fit `ub` bytes."""
    probe = _emit_prologue(expr, src_dtype, out_dtype, 32, "p")
    per_elem = sum(C.itemsize(b.dtype) for b in probe[1])
    fit = ub // max(per_elem * cols, 1)
    r = max((r for r in range(16, rows + 1, 16) if rows % r == 0 and r <= fit), default=0)
    if not r:
        raise ValueError(f"matmul operand prologue needs {per_elem} B/element: does not fit UB")
    return r


# ----------------------------------------------------------------------------- program


def _runtime_groups(m: isa.Var, t: MatmulTiling, f: int) -> tuple[list, tuple]:
    """M known at run time (a DynamicMatmulKernel): the M groups of the launch's `m` rows as
    the static split would pick them for a one-round split -- as many groups of at least
    MIN_GROUP_ROWS rows as fill the cores once (`t.m_groups`, the most), rows per group a
    multiple of the fractal edge `f`. Returns (the Lets, (rows per group, groups, items)); 0
    rows give 0 items."""
    grp, mgr, mgs, items = (isa.Var(s) for s in ("m_grp", "mg_rows", "m_groups", "items"))
    per = isa.ceildiv(m, grp)  # rows per group before rounding to whole fractals
    lets = [isa.Let(grp, isa.imin(t.m_groups, isa.imax(1, isa.ceildiv(m, MIN_GROUP_ROWS)))),
            isa.Let(mgr, isa.imax(f, isa.mul(isa.ceildiv(per, f), f))),
            isa.Let(mgs, isa.ceildiv(m, mgr)),
            isa.Let(items, isa.mul(mgs, t.n_panels))]  # fmt: skip
    return lets, (mgr, mgs, items)


def build(k: MatmulKernel, spec, name: str) -> isa.Program:
    """The checked Cube program for `k` on `spec` (depends on nothing else)."""
    return _program(k, spec, name, tile_matmul(k, spec)).check(spec)


def _program(k: MatmulKernel, spec, name: str, t: MatmulTiling) -> isa.Program:
    n_epi, n_out = len(k.epi_inputs), len(k.outputs)
    names = ["a", "b", *(f"epi{i}" for i in range(n_epi)), *(f"out{j}" for j in range(n_out)),
             *(f"colsum{j}" for j in range(len(k.col_sums))),
             *(f"row{op}{j}" for j, (op, _) in enumerate(k.row_reds)),
             *(f"softmax{j}" for j in range(len(k.softmax)))]  # fmt: skip
    args = C.gm_args((k.a, k.b, *k.epi_inputs, *k.outputs, *k.col_sum_outputs,
                      *k.row_red_outputs, *k.softmax_outputs), names)  # fmt: skip
    A, B = args[0], args[1]
    EPI, OUT = args[2 : 2 + n_epi], args[2 + n_epi : 2 + n_epi + n_out]
    ncs = len(k.col_sums)
    CS = args[2 + n_epi + n_out : 2 + n_epi + n_out + ncs]
    nrr = len(k.row_reds)
    RR = args[2 + n_epi + n_out + ncs : 2 + n_epi + n_out + ncs + nrr]
    SMO = args[2 + n_epi + n_out + ncs + nrr :]
    mix = not spec.coupled and t.epi_rows > 0  # AIC + AIV (910B: reductions, conv1d, epilogues)
    # M: the kernel's, or read at launch (a DynamicMatmulKernel: the tiling word after the
    # views, clamped to the bound so every static size below holds); then the M groups, the
    # items and every tail follow it, and buffers and workspace are sized at the bound
    m_rt: isa.IntExpr = k.m
    pre: list = []
    mg_rows, m_groups, n_items = t.mg_rows, t.m_groups, t.items
    if isinstance(k, DynamicMatmulKernel):
        args, rows, get = C.runtime_rows(args, k.m)
        m_rt = isa.Var("m_rt")
        lets, (mg_rows, m_groups, n_items) = _runtime_groups(m_rt, t, spec.cube_n)
        pre = [get, isa.Let(m_rt, isa.imin(isa.imax(rows, 0), k.m)), *lets]
    for j, (v, r) in enumerate(zip(k.outputs, k.results)):
        if v.dtype != k.epilogue[r].dtype:
            raise ValueError(f"output {j} is {v.dtype} but its expression is {k.epilogue[r].dtype}")
    if k.m == 0 or k.n == 0 or C.prod(k.batch) == 0:
        return isa.Program(name, args, (), (), 1, 1, unit="mix" if mix else "cube")
    tm, tn, kc, n0, kl = t.tm, t.tn, t.kc, t.n0, t.kl0
    # GM workspace (one argument, laid out here): [per-panel arrival counters | partial column
    # sums of the M groups | the AIC -> AIV tile slots of a MIX kernel]
    panels = C.prod(k.batch) * t.n_panels
    split = bool(k.col_sums) and t.m_groups > 1
    w_arg, workspace = len(args), 0
    if split:
        cnt_b = isa.Buffer("ws_count", "GM", "int64", 0, arg=w_arg)
        part_b = isa.Buffer("ws_colsums", "GM", "float32", 0, arg=w_arg)
        part_off = _round_up(panels * 8, 64)
        args = (*args, cnt_b, part_b)
        workspace = part_off + len(k.col_sums) * panels * t.m_groups * tn * 4
    # row reductions over several N panels: [per (batch, M group[, AIV]) arrival counters | the
    # panels' partial row values]
    rsplit = bool(k.row_reds or k.softmax) and t.n_panels > 1
    aivs = t.aivs if mix else 1  # AIVs splitting each tile's rows (see tile_matmul)
    nbat = C.prod(k.batch)
    if rsplit:
        rcnt_off = _round_up(workspace, 64)
        rpart_off = _round_up(rcnt_off + nbat * t.m_groups * aivs * 8, 64)
        rcnt_b = isa.Buffer("ws_rcount", "GM", "int64", 0, arg=w_arg)
        rpart_b = isa.Buffer("ws_rowred", "GM", "float32", 0, arg=w_arg)
        args = (*args, rcnt_b, rpart_b)
        n_q = nrr + 2 * len(k.softmax)  # row quantities: reductions, softmax (max, sum)
        workspace = rpart_off + n_q * nbat * t.n_panels * k.m * 4
    if mix:  # per group two tile slots (the AIC -> AIV hand-over)
        ws = isa.Buffer("ws_tiles", "GM", "float32", 0, arg=w_arg)
        args = (*args, ws)
        tiles_off = _round_up(workspace, 64)
        workspace = tiles_off + t.blocks * t.l0c_bufs * tm * tn * 4
    indt = k.in_dtype
    l1a = isa.Buffer("l1a", "L1", indt, t.l1_bufs * tm * kc)
    l1b = isa.Buffer("l1b", "L1", indt, t.l1_bufs * kc * tn)
    l0a = isa.Buffer("l0a", "L0A", indt, t.l0a_bufs * tm * kl)
    l0b = isa.Buffer("l0b", "L0B", indt, t.l0b_bufs * kl * n0)
    l0c = isa.Buffer("l0c", "L0C", "float32", t.l0c_bufs * tm * tn)
    buffers = [l1a, l1b, l0a, l0b, l0c]

    V = isa.Var
    it, mt, kci, ks, j = V("it"), V("mt"), V("kc"), V("ks"), V("j")
    bi, pn, g = V("bi"), V("pn"), V("g")
    names9 = ("n0", "nv", "gm0", "gmv", "m0", "mv", "k0", "kv", "pp")
    n0v, nv, gm0, gmv, m0, mv, k0, kv, pp = (V(s) for s in names9)
    k1, kv1, ls = V("k1"), V("kv1"), V("ls")  # L0 K step: offset in the panel, depth, L0A slot
    lo, hi, cs = V("lo"), V("hi"), V("cs")  # the block's item range, the L0C slot
    per_batch = isa.mul(t.n_panels, m_groups)
    head = [isa.Let(bi, isa.floordiv(it, per_batch)),
            isa.Let(pn, isa.floordiv(isa.mod(it, per_batch), m_groups)),
            isa.Let(g, isa.mod(it, m_groups)),
            isa.Let(n0v, isa.mul(pn, tn)), isa.Let(nv, isa.imin(tn, isa.sub(k.n, n0v))),
            isa.Let(gm0, isa.mul(g, mg_rows)),
            isa.Let(gmv, isa.imin(mg_rows, isa.sub(m_rt, gm0)))]  # fmt: skip
    bidx = C.unravel(bi, k.batch) if k.batch else []
    nb = len(k.batch)

    def base(view) -> isa.IntExpr:
        return C.dot(bidx, view.strides[:nb], view.offset)

    Set, Wait = isa.SetFlag, isa.WaitFlag
    sam, sak = k.a.strides[-2:]
    sbk, sbn = k.b.strides[-2:]
    # ---- K loop body: one L1 panel (MTE2), its L0 K steps (MTE1) and Mmads (Cube)
    # Flags (AscendC's queue protocol, one event per ping-pong slot; "free" events are set once
    # before the loops and drained after them):
    #   MTE1->MTE2 pp   L1 slot pp free          MTE2->MTE1 pp   L1 slot pp filled
    #   M->MTE1 s       L0B slot s free           MTE1->M s       L0B slot s (and L0A) loaded
    #   M->MTE1 2+s     L0A slot s free           M->FIX cs / FIX->M cs   L0C slot full / free
    nk_ = max(1, -(-k.k // kc))
    kbody: list = [isa.Let(k0, isa.mul(kci, kc)), isa.Let(kv, isa.imin(kc, isa.sub(k.k, k0)))]
    # the L1 / L0A slots alternate over the block's panels, not per tile: the next tile's first
    # panel loads while the Cube finishes this tile's last one
    panel = isa.add(isa.mul(isa.add(it, mt), nk_), kci)
    kbody.append(isa.Let(pp, isa.mod(panel, t.l1_bufs)))
    a_src = isa.Ref(A, isa.add(base(k.a), isa.add(isa.mul(m0, sam), isa.mul(k0, sak))))
    b_src = isa.Ref(B, isa.add(base(k.b), isa.add(isa.mul(k0, sbk), isa.mul(n0v, sbn))))
    i2c = {}
    if (
        k.b_im2col
    ):  # implicit GEMM (conv1d, backend/host/im2col.py): B is x over (C, L), strides (sbk,
        # sbn) = its channel and position strides; the packing builds the windows from (k0, n0)
        i2c = dict(im2col=(*k.b_im2col, k.b.shape[-1]), im2col_k0=k0, im2col_n0=n0v)
        b_src = isa.Ref(B, base(k.b))
    a_l1 = isa.Ref(l1a, isa.mul(pp, tm * kc))
    b_l1 = isa.Ref(l1b, isa.mul(pp, kc * tn))
    nk = -(-k.k // kc)
    spp = kc // kl  # L0 K steps per L1 panel
    kbody.append(Wait("MTE1", "MTE2", pp))
    pro_hoisted: list = []

    def staged(tag, expr, view, l1_ref, l1_rows, src, strides, rows, cols, r_pass, pitch):
        """GM -> UB (MTE2), the prologue's vector instructions, UB -> L1 (ND -> NZ), in passes
        of `r_pass` panel rows; serialised by pipe_barriers (single-buffered UB tiles)."""
        hoist, bufs, body, ub_in, ub_out = _emit_prologue(expr, view.dtype, indt,
                                                          r_pass * pitch, tag)  # fmt: skip
        pro_hoisted.extend(hoist)
        buffers.extend(bb for bb in bufs if bb not in buffers)
        r0, rv = V(f"p{tag}r0"), V(f"p{tag}rv")
        pbody = (isa.Let(rv, isa.imin(r_pass, isa.sub(rows, r0))),
                 isa.PipeBarrier(),  # the UB tiles' last readers are done
                 isa.CopyIn(ub_in, src + isa.mul(r0, strides[0]), (rv, cols), strides, pitch),
                 isa.PipeBarrier(),  # MTE2 -> Vector
                 *body,
                 isa.PipeBarrier(),  # Vector -> the UB -> L1 move
                 cube.LoadNz(l1_ref + isa.mul(r0, 16), l1_rows, ub_out, (pitch, 1), rv, cols,
                             16))  # fmt: skip
        return isa.Loop(r0, 0, rows, r_pass, pbody)

    if t.pro_a_rows:
        kbody.append(staged("a", k.a_prologue, k.a, a_l1, tm, a_src, (sam, sak), mv, kv,
                            t.pro_a_rows, kc))  # fmt: skip
    else:
        kbody.append(cube.LoadNz(a_l1, tm, a_src, (sam, sak), mv, kv, 16, k.a_prologue,
                                 reuse=t.n_panels))  # fmt: skip
    # memo hint: consecutive items of a block share the B panel unless the M group restarts
    new_panel = isa.sub(1, isa.mul(isa.imin(g, 1), isa.imin(isa.sub(it, lo), 1)))
    memo = dict(memo=kci, memo_fill=isa.mul(isa.sub(1, isa.imin(mt, 1)), new_panel),
                memo_slots=nk, memo_slot_elems=kc * tn) if t.memo else {}  # fmt: skip
    if t.pro_b_rows:
        kbody.append(staged("b", k.b_prologue, k.b, b_l1, kc, b_src, (sbk, sbn), kv, nv,
                            t.pro_b_rows, tn))  # fmt: skip
    else:
        kbody.append(cube.LoadNz(b_l1, kc, b_src, (sbk, sbn), kv, nv, 16, k.b_prologue,
                                 reuse=isa.ceildiv(m_rt, tm), **memo, **i2c))  # fmt: skip
    kbody.append(Set("MTE2", "MTE1", pp))
    kbody.append(Wait("MTE2", "MTE1", pp))
    mvp = isa.mul(isa.ceildiv(mv, 16), 16)
    kvp = isa.mul(isa.ceildiv(kv1, 16), 16)
    l0a_ref = isa.Ref(l0a, isa.mul(ls, tm * kl))
    l0c_ref = isa.Ref(l0c, isa.mul(cs, tm * tn))
    nj = -(-tn // n0)
    jn = isa.imin(n0, isa.sub(nv, isa.mul(j, n0)))
    step = isa.add(isa.mul(kci, spp), ks)  # L0 K step of the tile: 0 initialises L0C
    gstep = isa.add(isa.mul(panel, spp), ks)  # L0 K step of the block: the L0A slot
    jslot = isa.mod(isa.add(isa.mul(gstep, nj), j), t.l0b_bufs)  # alternates over the block
    l0b_ref = isa.Ref(l0b, isa.mul(jslot, kl * n0))
    jbody = (Wait("M", "MTE1", jslot),
             cube.LoadL0(l0b_ref, kl, b_l1 + isa.add(isa.mul(j, n0 * kc), isa.mul(k1, 16)), kc,
                         kvp, isa.mul(isa.ceildiv(jn, 16), 16)),
             Set("MTE1", "M", jslot),
             Wait("MTE1", "M", jslot),
             cube.Mmad(l0c_ref + isa.mul(j, n0 * tm), tm, l0a_ref, tm, l0b_ref, kl,
                       mv, jn, kv1, isa.imin(step, 1), indt),
             Set("M", "MTE1", jslot))  # fmt: skip
    jstop = isa.ceildiv(nv, n0) if nj > 1 else 1
    ksbody = [isa.Let(k1, isa.mul(ks, kl)), isa.Let(kv1, isa.imin(kl, isa.sub(kv, k1))),
              isa.Let(ls, isa.mod(gstep, t.l0a_bufs)),
              Wait("M", "MTE1", isa.add(ls, 2)),
              cube.LoadL0(l0a_ref, tm, a_l1 + isa.mul(k1, tm), tm, mvp, kvp),
              isa.Loop(j, 0, jstop, 1, jbody),
              Set("M", "MTE1", isa.add(ls, 2))]  # fmt: skip
    kbody.append(isa.Loop(ks, 0, isa.ceildiv(kv, kl) if spp > 1 else 1, 1, tuple(ksbody)))
    kbody.append(Set("MTE1", "MTE2", pp))
    if k.k == 0:  # no K chunk: one Mmad with k = 0 zeroes L0C
        kloop = [cube.Mmad(l0c_ref, tm, isa.Ref(l0a, 0), tm, isa.Ref(l0b, 0), kl,
                           mv, nv, 0, 0, indt)]  # fmt: skip
    else:
        kloop = [isa.Loop(kci, 0, nk, 1, tuple(kbody))]
    kloop = [Wait("FIX", "M", cs), *kloop, Set("M", "FIX", cs), Wait("M", "FIX", cs)]
    # ---- write-out
    out_body: list = []
    hoisted: list = []
    col_init: list = []  # per item: zero the column accumulators
    col_out: list = []  # per item: write the column sums (split: the panel's last M group)
    publish: list = []  # split over M groups: per item, its partial column sums to GM
    row_out: list = []  # row reductions over several N panels: the last panel combines
    gg, arrived = V("gg"), V("arrived")
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

    # in a MIX kernel the UB epilogue's barriers are the AIV's: they do not reach the AIC's pipes
    Bar = (lambda: isa.PipeBarrier("AIV")) if mix else isa.PipeBarrier  # noqa: E731
    if t.fixpipe_only:
        for jo, r in enumerate(k.results):
            relu = _fixpipe_chain(k.epilogue, r)[1]
            out_body.append(cube.FixPipe(out_ref(jo, 0), (scm[jo], scn[jo]), l0c_ref, tm,
                                         mv, nv, relu))  # fmt: skip
    elif t.epi_rows == 0:  # split 910B: the epilogue rides on FixPipe (see isa_cube.FixPipe)
        srcs = [epi_ref(i, 0) for i in range(n_epi)]
        for jo, r in enumerate(k.results):
            fp = cube.FixPipe(out_ref(jo, 0), (scm[jo], scn[jo]), l0c_ref, tm, mv, nv,
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
        sr0, sr1 = (V("sr0"), V("sr1")) if aivs > 1 else (0, mv)  # this AIV's rows of the tile
        # the rows a row block's combine covers: all of them, or (two AIVs) this AIV's share of
        # each tile, the rows whose partials it published
        cb, ce = (V("cb"), V("ce")) if aivs > 1 else (gm0, isa.add(gm0, gmv))
        # the UB epilogue runs serialised (single-buffered UB tiles)
        rbody: list = [Bar(), isa.Let(rv, isa.imin(R, isa.sub(mv, r0)))]
        if mix:  # AIV: the tile's rows from the workspace slot the AIC filled
            slot = isa.Ref(ws, isa.add(tiles_off // 4, isa.mul(
                isa.add(isa.mul(isa.BLOCK_IDX, t.l0c_bufs), cs), tm * tn)))  # fmt: skip
            rbody.append(isa.CopyIn(acc, slot + isa.mul(r0, tn), (rv, nv), (tn, 1), tn))
        else:
            rbody.append(cube.FixPipe(acc, (tn, 1), l0c_ref + isa.mul(r0, 16), tm, rv, nv))
        for i, ref in loads.items():
            src, st = epi_ref(i, r0)
            rbody.append(isa.CopyIn(ref, src, (rv, nv), st, tn))
        rbody.append(Bar())  # FixPipe / MTE2 -> Vector
        rbody += ebody
        colsums = outs[n_out : n_out + ncs]
        rowvals = outs[n_out + ncs : n_out + ncs + nrr]
        smvals = outs[n_out + ncs + nrr :]
        outs = outs[:n_out]
        for jc, o in enumerate(colsums):  # fold the chunk's rows into the column accumulator
            cacc = isa.Ref(isa.Buffer(f"colsum{jc}_ub", "UB", "float32", tn), 0)
            buffers.append(cacc.buf)
            col_init.append(isa.VDup(cacc, 0.0, tn))
            w = isa.Ref(isa.Buffer(f"colw{jc}_ub", "UB", "float32", tile), 0)  # work tile
            buffers.append(w.buf)
            if isinstance(o, C.Const):
                rbody.append(isa.VDup(w, k.epilogue[k.col_sums[jc]].arg, tile))
                o = w
            elif o.buf.dtype != "float32":
                rbody.append(isa.VConv(w, o, tile, "trunc"))
                o = w
            rbody += _fold_rows(o, w, cacc, rv, R, tn, nv, f"f{jc}_")
            v = k.col_sum_outputs[jc]
            off = isa.add(base(v), isa.mul(n0v, v.strides[-1]))
            if split:  # publish this M group's partial; the panel's last group combines
                pbase = isa.mul(isa.add(jc * panels, isa.floordiv(it, t.m_groups)), t.m_groups)
                pslot = isa.add(part_off // 4, isa.mul(isa.add(pbase, g), tn))
                publish += [Bar(), isa.CopyOut(isa.Ref(part_b, pslot), cacc, (nv,), (1,))]
                pub = isa.Ref(isa.Buffer(f"colp{jc}_ub", "UB", "float32", tn), 0)
                buffers.append(pub.buf)
                gslot = isa.add(part_off // 4, isa.mul(isa.add(pbase, gg), tn))
                col_out += [
                    Bar(), isa.VDup(cacc, 0.0, tn),
                    isa.Loop(gg, 0, t.m_groups, 1, (
                        Bar(), isa.CopyIn(pub, isa.Ref(part_b, gslot), (nv,), (1,)), Bar(),
                        isa.VBinary("vadd", cacc, cacc, pub, nv))),
                ]  # fmt: skip
            if v.dtype != "float32":
                cout = isa.Ref(isa.Buffer(f"colo{jc}_ub", "UB", v.dtype, tn), 0)
                buffers.append(cout.buf)
                col_out += [
                    Bar(),  # the last fold (Vector) -> conversion
                    isa.VConv(cout, cacc, nv, "trunc"),
                    Bar(),  # Vector -> MTE3
                    isa.CopyOut(isa.Ref(CS[jc], off), cout, (nv,), (v.strides[-1],)),
                ]
            else:
                col_out += [
                    Bar(),  # Vector -> MTE3
                    isa.CopyOut(isa.Ref(CS[jc], off), cacc, (nv,), (v.strides[-1],)),
                ]
        row_init: list = []  # per M tile: reset the row accumulators
        row_fin: list = []  # per M tile: the tile's row values to GM (final, or a partial)
        for jr, ((op, _), o) in enumerate(zip(k.row_reds, rowvals)):
            vop, ident = _ROW_RED[op]
            post = k.row_posts[jr] if k.row_posts else None
            racc = isa.Ref(isa.Buffer(f"rowred{jr}_ub", "UB", "float32", tm), 0)
            buffers.append(racc.buf)
            row_init += [isa.VDup(racc, ident, tm)]
            if isinstance(o, C.Const):
                w = isa.Ref(isa.Buffer(f"roww{jr}_ub", "UB", "float32", tile), 0)
                buffers.append(w.buf)
                rbody.append(isa.VDup(w, k.epilogue[k.row_reds[jr][1]].arg, tile))
                o = w
            if k.n % tn == 0:  # every panel full: one WholeReduce over the chunk's rows
                rbody.append(isa.VReduce(vop, racc + r0, o, tn, rv))
            else:  # rows of nv valid columns at pitch tn
                rr = V(f"rr{jr}")
                red = isa.VReduce(vop, racc + isa.add(r0, rr), o + isa.mul(rr, tn), nv)
                rbody.append(isa.Loop(rr, 0, rv, 1, (red,)))
            v = k.row_red_outputs[jr]
            if rsplit:  # this panel's partial row values; the row block's last panel combines
                rslot = isa.add(rpart_off // 4, isa.add(isa.mul(isa.add(
                    isa.mul(isa.add(jr * nbat, bi), t.n_panels), pn), k.m), m0))  # fmt: skip
                row_fin += [Bar(), isa.CopyOut(isa.Ref(rpart_b, isa.add(rslot, sr0)), racc + sr0,
                                               (isa.sub(sr1, sr0),), (1,))]  # fmt: skip
                pub = isa.Ref(isa.Buffer(f"rowp{jr}_ub", "UB", "float32", tm), 0)
                buffers.append(pub.buf)
                mc, mcv, pq = V(f"mc{jr}"), V(f"mcv{jr}"), V(f"pq{jr}")
                src = isa.add(rpart_off // 4, isa.add(isa.mul(isa.add(
                    isa.mul(isa.add(jr * nbat, bi), t.n_panels), pq), k.m), mc))  # fmt: skip
                if t.n_panels * tm <= tile:  # every panel's partials in one move (acc_ub is free)
                    src0 = isa.Ref(rpart_b, isa.add(rpart_off // 4, isa.add(isa.mul(isa.mul(
                        isa.add(jr * nbat, bi), t.n_panels), k.m), mc)))  # fmt: skip
                    part = acc + isa.mul(pq, tm)
                    add = isa.VBinary(_ROW_COMBINE[op], racc, racc, part, mcv)
                    fold = [Bar(), isa.CopyIn(acc, src0, (t.n_panels, mcv), (k.m, 1), tm), Bar(),
                            isa.Loop(pq, 0, t.n_panels, 1, (add,))]  # fmt: skip
                else:
                    fold = [isa.Loop(pq, 0, t.n_panels, 1, (
                        Bar(), isa.CopyIn(pub, isa.Ref(rpart_b, src), (mcv,), (1,)), Bar(),
                        isa.VBinary(_ROW_COMBINE[op], racc, racc, pub, mcv)))]  # fmt: skip
                comb = [isa.Let(mcv, isa.imin(tm, isa.sub(ce, mc))),
                        Bar(), isa.VDup(racc, ident, tm), *fold,
                        *_row_write(racc, RR[jr], v, isa.add(base(v), isa.mul(mc, v.strides[-1])),
                                    mcv, tm, jr, buffers, Bar, post, hoisted)]  # fmt: skip
                row_out.append(isa.Loop(mc, cb, ce, tm, tuple(comb)))
            else:  # one panel holds the whole row: the tile's row values are final
                off = isa.add(base(v), isa.mul(isa.add(m0, sr0), v.strides[-1]))
                row_fin += _row_write(racc, RR[jr], v, off, isa.sub(sr1, sr0), tm, jr, buffers,
                                      Bar, post, hoisted, sr0)  # fmt: skip
        sm_copies: list = []
        for js, o in enumerate(smvals):  # softmax over n (online across the N panels)
            v = k.softmax_outputs[js]
            ssm, ssn = v.strides[-2:]
            q = nrr + 2 * js  # its (row max, row sum) partials in the workspace

            def rp(qq, panel, row):
                return isa.Ref(rpart_b, isa.add(rpart_off // 4, isa.add(isa.mul(isa.add(
                    isa.mul(isa.add(qq * nbat, bi), t.n_panels), panel), k.m), row)))  # fmt: skip

            def sm_ref(row, col, v=v, ssm=ssm, ssn=ssn, js=js):
                return isa.Ref(SMO[js], isa.add(base(v), isa.add(isa.mul(row, ssm),
                                                                   isa.mul(col, ssn))))  # fmt: skip

            smx, ssu, srv = (isa.Ref(isa.Buffer(f"sm{js}_{w}_ub", "UB", "float32", tm), 0)
                             for w in ("max", "sum", "rec"))  # fmt: skip
            sw = isa.Ref(isa.Buffer(f"sm{js}_w_ub", "UB", "float32", tile), 0)
            sb = isa.Ref(isa.Buffer(f"sm{js}_b_ub", "UB", "float32", tile), 0)
            buffers += [smx.buf, ssu.buf, srv.buf, sw.buf, sb.buf]
            so = sw
            if v.dtype != "float32":
                so = isa.Ref(isa.Buffer(f"sm{js}_o_ub", "UB", v.dtype, tile), 0)
                buffers.append(so.buf)
            row_init += [isa.VDup(smx, float("-inf"), tm), isa.VDup(ssu, 0.0, tm)]
            if isinstance(o, C.Const):
                rbody.append(isa.VDup(sw, k.epilogue[k.softmax[js]].arg, tile))
                o = sw
            elif o.buf.dtype != "float32":
                rbody.append(isa.VConv(sw, o, tile, "trunc"))
                o = sw
            cnt = isa.mul(rv, tn)
            full = k.n % tn == 0
            rbody += [*_reduce_rows("vcmax", smx + r0, o, rv, nv, tn, full, f"sx{js}"),
                      isa.VBrcb(sb, smx + r0, tn, rv),
                      isa.VBinary("vsub", sw, o, sb, cnt),
                      isa.VUnary("vexp", sw, sw, cnt)]  # fmt: skip
            rbody += _reduce_rows("vcadd", ssu + r0, sw, rv, nv, tn, full, f"ss{js}")
            if not rsplit:  # one panel holds the whole row: normalise now
                rbody += [isa.VUnary("vrec", srv + r0, ssu + r0, rv),
                          isa.VBrcb(sb, srv + r0, tn, rv),
                          isa.VBinary("vmul", sw, sw, sb, cnt)]  # fmt: skip
            if so is not sw:
                rbody.append(isa.VConv(so, sw, cnt, "trunc"))
            sm_copies.append(isa.CopyOut(sm_ref(isa.add(m0, r0), n0v), so, (rv, nv), (ssm, ssn),
                                         tn))  # fmt: skip
            if not rsplit:
                continue
            # this panel's (row max, row sum of exp(x - max)); the last panel rescales the rows
            sm0, smv = isa.add(m0, sr0), (isa.sub(sr1, sr0),)  # this AIV's rows
            row_fin += [Bar(), isa.CopyOut(rp(q, pn, sm0), smx + sr0, smv, (1,)),
                        isa.CopyOut(rp(q + 1, pn, sm0), ssu + sr0, smv, (1,))]  # fmt: skip
            pmx, psu = (isa.Ref(isa.Buffer(f"sm{js}_p{w}_ub", "UB", "float32", tm), 0)
                        for w in ("max", "sum"))  # fmt: skip
            buffers += [pmx.buf, psu.buf]
            mc, mcv, pq, pn0, pnv = (V(f"sm{js}{w}") for w in ("mc", "mcv", "pq", "pn0", "pnv"))
            ccnt = isa.mul(mcv, tn)
            conv_in = [isa.VConv(sw, so, ccnt, "trunc")] if so is not sw else []
            conv_out = [isa.VConv(so, sw, ccnt, "trunc")] if so is not sw else []
            if t.n_panels * R <= tile:  # every panel's (max, sum) in two moves, kept in UB
                # (acc_ub and the broadcast tile are free after the tiles); same instructions
                # on the same values as one panel at a time, without 3 GM round trips per panel
                mx, su = acc + isa.mul(pq, R), sb + isa.mul(pq, R)
                stage = [Bar(), isa.CopyIn(acc, rp(q, 0, mc), (t.n_panels, mcv), (k.m, 1), R),
                         isa.CopyIn(sb, rp(q + 1, 0, mc), (t.n_panels, mcv), (k.m, 1), R),
                         Bar()]  # fmt: skip
                get_mx, get_su, pmx_in = [], [], []
                d_mx = pmx  # the max's first use writes pmx from the staged copy
            else:
                mx, su, stage, d_mx = pmx, psu, [], pmx
                get_mx = [Bar(), isa.CopyIn(pmx, rp(q, pq, mc), (mcv,), (1,)), Bar()]
                get_su = [Bar(), isa.CopyIn(pmx, rp(q, pq, mc), (mcv,), (1,)),
                          isa.CopyIn(psu, rp(q + 1, pq, mc), (mcv,), (1,)), Bar()]  # fmt: skip
                pmx_in = [isa.CopyIn(pmx, rp(q, pq, mc), (mcv,), (1,))]
            comb = [
                isa.Let(mcv, isa.imin(R, isa.sub(ce, mc))),
                Bar(), isa.VDup(smx, float("-inf"), tm), isa.VDup(ssu, 0.0, tm), *stage,
                isa.Loop(pq, 0, t.n_panels, 1, (  # the row max over the panels
                    *get_mx, isa.VBinary("vmax", smx, smx, mx, mcv))),
                isa.Loop(pq, 0, t.n_panels, 1, (  # sum = sum_p sum_p * exp(max_p - max)
                    *get_su,
                    isa.VBinary("vsub", d_mx, mx, smx, mcv), isa.VUnary("vexp", pmx, pmx, mcv),
                    isa.VBinary("vmul", pmx, pmx, su, mcv),
                    isa.VBinary("vadd", ssu, ssu, pmx, mcv))),
                isa.VUnary("vrec", srv, ssu, mcv),
                isa.Loop(pq, 0, t.n_panels, 1, (  # rows of panel p *= exp(max_p - max) / sum
                    isa.Let(pn0, isa.mul(pq, tn)), isa.Let(pnv, isa.imin(tn, isa.sub(k.n, pn0))),
                    Bar(), *pmx_in,
                    isa.CopyIn(so, sm_ref(mc, pn0), (mcv, pnv), (ssm, ssn), tn), Bar(),
                    isa.VBinary("vsub", pmx, mx, smx, mcv), isa.VUnary("vexp", pmx, pmx, mcv),
                    isa.VBinary("vmul", pmx, pmx, srv, mcv),
                    isa.VBrcb(sb, pmx, tn, mcv), *conv_in,
                    isa.VBinary("vmul", sw, sw, sb, ccnt), *conv_out,
                    Bar(), isa.CopyOut(sm_ref(mc, pn0), so, (mcv, pnv), (ssm, ssn), tn))),
            ]  # fmt: skip
            row_out.append(isa.Loop(mc, cb, ce, R, tuple(comb)))
        if row_init:
            row_init.insert(0, Bar())  # the previous tile's write-out has read them
        copies = list(sm_copies)
        for jo, o in enumerate(outs):
            if isinstance(o, C.Const):
                o = isa.Ref(isa.Buffer(f"outc{jo}_ub", "UB", k.outputs[jo].dtype, tile), 0)
                buffers.append(o.buf)
                rbody.append(isa.VDup(o, k.epilogue[k.results[jo]].arg, tile))
            copies.append(isa.CopyOut(out_ref(jo, r0), o, (rv, nv), (scm[jo], scn[jo]), tn))
        rbody += [Bar(), *copies, Bar()]  # Vector -> MTE3 -> next pass
        if mix:
            XSet, XWait = isa.CrossCoreSetFlag, isa.CrossCoreWaitFlag
            out_body += [
                XWait("FIX", isa.add(cs, 2), "AIC"),  # the AIV has read this slot's last tile
                cube.FixPipe(slot, (tn, 1), l0c_ref, tm, mv, nv),
                XSet("FIX", cs, "AIC"),  # tile in GM
                XWait("MTE2", cs, "AIV"),
            ]
        if row_fin and aivs > 1:  # (an AIV may have no rows of a short tile)
            row_fin = [isa.If(sr1, ">", sr0, tuple(row_fin))]
        aiv = [*row_init, isa.Loop(r0, sr0, sr1, R, tuple(rbody)), *row_fin]
        if mix:
            aiv.append(XSet("MTE2", isa.add(cs, 2), "AIV"))  # slot free again
        if aivs > 1:  # AIV v: chunks [v * half, (v + 1) * half) of the tile's R-row chunks
            half = isa.mul(isa.ceildiv(isa.ceildiv(mv, R), aivs), R)
            aiv = [isa.Loop(isa.SUBBLOCK_IDX, 0, aivs, 1, (
                out_body.pop(),  # its wait for the tile
                isa.Let(sr0, isa.imin(mv, isa.mul(isa.SUBBLOCK_IDX, half))),
                isa.Let(sr1, isa.imin(mv, isa.add(sr0, half))), *aiv))]  # fmt: skip
        out_body += aiv

    mbody = [
        isa.Let(m0, isa.add(gm0, isa.mul(mt, tm))),
        isa.Let(mv, isa.imin(tm, isa.sub(isa.add(gm0, gmv), m0))),
        isa.Let(cs, isa.mod(isa.add(it, mt), t.l0c_bufs)),
        *kloop,
        *out_body,
        Set("FIX", "M", cs),
    ]
    if col_init:  # zero the column accumulators after the last item's copy-out read them
        col_init.insert(0, Bar())
    if split:  # the M groups of a panel meet in GM; the last to arrive combines (in g order)
        zero = isa.Ref(isa.Buffer("cnt_zero_ub", "UB", "int64", 4), 0)
        buffers.append(zero.buf)
        cnt = isa.Ref(cnt_b, isa.floordiv(it, t.m_groups))
        col_out = [*publish, Bar(),  # partials in GM before the arrival (the AIV's, in a MIX)
                   isa.AtomicAdd(cnt, 1, arrived),
                   isa.If(arrived, "==", t.m_groups - 1, (
                       *col_out, Bar(), isa.VDup(zero, 0, 4), Bar(),
                       isa.CopyOut(cnt, zero, (1,), (1,)))),  # re-arm the counter
                   ]  # fmt: skip
    if row_out:  # the N panels of a row block meet in GM; the last to arrive combines them
        zero = isa.Ref(isa.Buffer("rcnt_zero_ub", "UB", "int64", 4), 0)
        buffers.append(zero.buf)
        slot = isa.add(isa.mul(bi, t.m_groups), g)
        if aivs > 1:  # one counter per AIV share: the shares' combines run in parallel
            slot = isa.add(isa.mul(slot, aivs), isa.SUBBLOCK_IDX)
            cmt, cm0, cmv, cs0 = V("cmt"), V("cm0"), V("cmv"), V("cs0")
            chalf = isa.mul(isa.ceildiv(isa.ceildiv(cmv, R), aivs), R)  # as the tiles split
            row_out = [isa.Loop(cmt, 0, isa.ceildiv(gmv, tm), 1, (
                isa.Let(cm0, isa.add(gm0, isa.mul(cmt, tm))),
                isa.Let(cmv, isa.imin(tm, isa.sub(isa.add(gm0, gmv), cm0))),
                isa.Let(cs0, isa.imin(cmv, isa.mul(isa.SUBBLOCK_IDX, chalf))),
                isa.Let(cb, isa.add(cm0, cs0)),
                isa.Let(ce, isa.add(cm0, isa.imin(cmv, isa.add(cs0, chalf)))),
                *row_out))]  # fmt: skip
        rcnt = isa.Ref(rcnt_b, isa.add(rcnt_off // 8, slot))
        rarr = V("rarrived")
        row_out = [Bar(),  # partials in GM before the arrival (the AIV's, in a MIX)
                   isa.AtomicAdd(rcnt, 1, rarr),
                   isa.If(rarr, "==", t.n_panels - 1, (
                       *row_out, Bar(), isa.VDup(zero, 0, 4), Bar(),
                       isa.CopyOut(rcnt, zero, (1,), (1,)))),  # re-arm the counter
                   ]  # fmt: skip
        if aivs > 1:
            row_out = [isa.Loop(isa.SUBBLOCK_IDX, 0, aivs, 1, tuple(row_out))]
    item_body = [*head, *col_init, isa.Loop(mt, 0, isa.ceildiv(gmv, tm), 1, tuple(mbody)),
                 *col_out, *row_out]  # fmt: skip
    # the block's contiguous range of items (GetBlockIdx()/GetBlockNum(): any block count works)
    rng = [
        isa.Let(lo, isa.floordiv(isa.mul(isa.BLOCK_IDX, n_items), isa.BLOCK_NUM)),
        isa.Let(hi, isa.floordiv(isa.mul(isa.add(isa.BLOCK_IDX, 1), n_items), isa.BLOCK_NUM)),
    ]
    if pre:  # run-time items: blockFactor ranges, so block 0 (the one costed) always has work
        start, stop, rng = C.block_range(n_items)
        rng += [isa.Let(lo, start), isa.Let(hi, stop)]
    free = [("MTE1", "MTE2", e) for e in range(t.l1_bufs)]
    free += [("M", "MTE1", e) for e in range(t.l0b_bufs)]
    free += [("M", "MTE1", 2 + e) for e in range(t.l0a_bufs)]
    free += [("FIX", "M", e) for e in range(t.l0c_bufs)]
    xfree = xdrain = []
    if mix:  # the AIV announces both workspace slots free; the AIC drains them at the end
        xfree = [isa.CrossCoreSetFlag("MTE2", 2 + e, "AIV") for e in range(t.l0c_bufs)]
        xdrain = [isa.CrossCoreWaitFlag("FIX", 2 + e, "AIC") for e in range(t.l0c_bufs)]
    if aivs > 1:  # each AIV fills its own constant tiles and announces its slots free
        xfree = [isa.Loop(isa.SUBBLOCK_IDX, 0, aivs, 1, (*hoisted, *xfree))]
        hoisted = []
    body = [*pre, *pro_hoisted, *hoisted, *rng, *(Set(*f) for f in free), *xfree,
            isa.Loop(it, lo, hi, 1, tuple(item_body)),
            *(Wait(*f) for f in free), *xdrain]  # fmt: skip
    return isa.Program(name, args, tuple(buffers), tuple(body), t.blocks, t.device_blocks,
                       unit="mix" if mix else "cube", workspace=workspace)  # fmt: skip
