"""The Cube instructions (`isa_cube`) in the three device-side consumers of a program: the
numpy interpreter (exact semantics on the declared buffers: NZ layouts, float16 buffers round
like the NPU's), the race checker (the GM span each instruction may touch) and the cycle cost
model (pipe, busy and latency cycles per instruction).

They register themselves into `interp`, `races` and `cost` when this module is imported; every
module that builds Cube programs imports it, so a Cube program is never interpreted, checked or
costed without them. The LLVM lowering of the same instructions is the host mapping's
(`backend.host.lower_cube`).

conv1d's implicit GEMM (`LoadNz` with ``im2col`` set, see `backend.host.im2col` for the whole
scheme) is here as its numpy element rule (`gather`) and its read footprint (`footprint`).
"""

from __future__ import annotations

import numpy as np

from lazymath.backend.npu import cost, interp, isa, races
from lazymath.backend.npu import isa_cube as cube
from lazymath.backend.npu.ir_reference import eval_expr
from lazymath.backend.npu.kernel_ir import Expr

# ============================================================================= im2col (numpy)


def _positions(geom, k0: int, n0: int, rows: int, cols: int):
    kw, stride, dil, pad, length = geom
    kk = k0 + np.arange(rows)
    ch, j = kk // kw, kk % kw
    pos = (n0 + np.arange(cols))[None, :] * stride + (j * dil - pad)[:, None]
    return ch, pos, (pos >= 0) & (pos < length)


def gather(flat: np.ndarray, off: int, strides, geom, k0: int, n0: int, rows: int,
           cols: int) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """(values, inside) of the rows x cols panel (the interpreter's load): values at clamped
    positions where `inside` is False (the caller applies the prologue, then zeroes those)."""
    sc, sl = strides
    ch, pos, ok = _positions(geom, k0, n0, rows, cols)
    length = geom[4]
    if length == 0 or rows == 0 or cols == 0:
        return np.zeros((rows, cols), flat.dtype), ok
    idx = off + ch[:, None] * sc + np.clip(pos, 0, length - 1) * sl
    if idx.min() < 0 or idx.max() >= flat.size:
        raise IndexError("im2col GM read out of bounds")
    return flat[idx], ok


def footprint(off: int, strides, geom, k0: int, n0: int, rows: int, cols: int) -> tuple[int, int]:
    """[lo, hi) of the GM elements the panel may read (race checker)."""
    sc, sl = strides
    if rows <= 0 or cols <= 0 or geom[4] == 0:
        return off, off
    ch = _positions(geom, k0, n0, rows, cols)[0]  # whole rows of x: the lanes outside x
    corners = [off + c * sc + q * sl for c in (ch.min(), ch.max()) for q in (0, geom[4] - 1)]
    return int(min(corners)), int(max(corners)) + 1  # read position 0 (then zeroed)


# ============================================================================= interpreter


def _nz_grid(rows: int, cols: int, rows_p: int) -> np.ndarray:
    r = np.arange(rows)[:, None]
    c = np.arange(cols)[None, :]
    return ((c // cube.C0) * rows_p + r) * cube.C0 + c % cube.C0


def _gm_tile(m: interp.Machine, ref: isa.Ref, rows: int, cols: int, strides) -> np.ndarray:
    base = m.int(ref.off)
    idx = base + np.arange(rows)[:, None] * strides[0] + np.arange(cols)[None, :] * strides[1]
    flat = m.mem[ref.buf.name]
    if idx.size and (idx.min() < 0 or idx.max() >= flat.size):
        raise IndexError(f"GM read out of bounds in {ref.buf.name}")
    return flat[idx]


def _eval(expr: Expr, loads: list[np.ndarray], shape, acc=None) -> list[np.ndarray]:
    return eval_expr(expr, loads, shape, acc)


@interp.register(cube.LoadNz)
def _i_load_nz(m: interp.Machine, i: cube.LoadNz) -> None:
    rows, cols = m.int(i.rows), m.int(i.cols)
    if i.memo is not None:  # the hint lets the host skip this copy: check its claim
        memo = m.__dict__.setdefault("memo", {})
        key = (i.dst.buf.name, m.int(i.memo))
        what = (m.int(i.src.off), rows, cols)
        if m.int(i.memo_fill):
            memo[key] = what
        elif memo.get(key) != what:
            raise ValueError(
                f"kernel {m.program.name}: {cube._fmt_load_nz(i)} skips its repack on the host "
                f"but memo slot {key[1]} holds {memo.get(key)}, not {what}"
            )
    inside = None
    if i.im2col:  # implicit GEMM: x's windows, 0 in the padding (backend/host/im2col.py)
        x, inside = gather(m.mem[i.src.buf.name], m.int(i.src.off), i.strides, i.im2col,
                                  m.int(i.im2col_k0), m.int(i.im2col_n0), rows, cols)  # fmt: skip
    else:
        x = _gm_tile(m, i.src, rows, cols, i.strides)
    if i.prologue:
        x = np.broadcast_to(_eval(i.prologue, [x], x.shape)[-1], x.shape)
    if inside is not None:
        x = np.where(inside, x, np.zeros((), x.dtype))
    rp = -(-rows // i.row_pad) * i.row_pad
    cp = -(-cols // cube.C0) * cube.C0
    tile = np.zeros((rp, cp), dtype=i.dst.buf.dtype)
    tile[:rows, :cols] = x
    dst = m.mem[i.dst.buf.name]
    dst[m.int(i.dst.off) + _nz_grid(rp, cp, i.dst_rows)] = tile


@interp.register(cube.LoadL0)
def _i_load_l0(m: interp.Machine, i: cube.LoadL0) -> None:
    rows, cols = m.int(i.rows), m.int(i.cols)
    src = m.mem[i.src.buf.name][m.int(i.src.off) + _nz_grid(rows, cols, i.src_rows)]
    m.mem[i.dst.buf.name][m.int(i.dst.off) + _nz_grid(rows, cols, i.dst_rows)] = src


@interp.register(cube.Mmad)
def _i_mmad(m: interp.Machine, i: cube.Mmad) -> None:
    mm, nn, kk = m.int(i.m), m.int(i.n), m.int(i.k)
    a = m.mem[i.a.buf.name][m.int(i.a.off) + _nz_grid(mm, kk, i.a_rows)].astype(np.float32)
    bm = m.mem[i.b.buf.name][m.int(i.b.off) + _nz_grid(kk, nn, i.b_rows)].astype(np.float32)
    cidx = m.int(i.c.off) + _nz_grid(mm, nn, i.c_rows)
    c = m.mem[i.c.buf.name]
    prod = a @ bm
    c[cidx] = (c[cidx] + prod) if m.int(i.accumulate) else prod


@interp.register(cube.FixPipe)
def _i_fixpipe(m: interp.Machine, i: cube.FixPipe) -> None:
    rows, cols = m.int(i.rows), m.int(i.cols)
    acc = m.mem[i.src.buf.name][m.int(i.src.off) + _nz_grid(rows, cols, i.src_rows)]
    acc = acc.astype(np.float32)
    if i.relu:
        acc = np.where(acc > 0, acc, np.float32(0)) + np.where(np.isnan(acc), acc, 0)
    if i.epilogue:
        loads = [_gm_tile(m, r, rows, cols, s) for r, s in zip(i.epi_srcs, i.epi_strides)]
        acc = np.broadcast_to(_eval(i.epilogue, loads, acc.shape, acc)[i.result], acc.shape)
    dst = m.mem[i.dst.buf.name]
    idx = (m.int(i.dst.off) + np.arange(rows)[:, None] * i.strides[0]
           + np.arange(cols)[None, :] * i.strides[1])  # fmt: skip
    with np.errstate(all="ignore"):
        dst[idx] = acc.astype(dst.dtype)


# ----------------------------------------------------------------------------- race footprints


def _nz(m: interp.Machine, ref: isa.Ref, rows: int, cols: int, rows_p: int) -> tuple:
    """(name, lo, hi) covering an NZ block (rows x cols, cols padded to the fractal width)."""
    off = m.int(ref.off)
    if rows <= 0 or cols <= 0:
        return (ref.buf.name, off, off)
    cp = -(-cols // cube.C0) * cube.C0
    return (ref.buf.name, off, off + cube.nz_index(rows - 1, cp - 1, rows_p) + 1)


@races.register(cube.LoadNz)
def _fp_load_nz(m: interp.Machine, i: cube.LoadNz):
    rows, cols = m.int(i.rows), m.int(i.cols)
    rp = -(-rows // i.row_pad) * i.row_pad
    if i.im2col:
        lo, hi = footprint(m.int(i.src.off), i.strides, i.im2col, m.int(i.im2col_k0),
                                  m.int(i.im2col_n0), rows, cols)  # fmt: skip
        read = (i.src.buf.name, lo, hi)
    else:
        read = races.strided(m, i.src, (rows, cols), i.strides)
    return [read], [_nz(m, i.dst, rp, cols, i.dst_rows)]


@races.register(cube.LoadL0)
def _fp_load_l0(m: interp.Machine, i: cube.LoadL0):
    rows, cols = m.int(i.rows), m.int(i.cols)
    return [_nz(m, i.src, rows, cols, i.src_rows)], [_nz(m, i.dst, rows, cols, i.dst_rows)]


@races.register(cube.Mmad)
def _fp_mmad(m: interp.Machine, i: cube.Mmad):
    mm, nn, kk = m.int(i.m), m.int(i.n), m.int(i.k)
    c = _nz(m, i.c, mm, nn, i.c_rows)
    reads = [_nz(m, i.a, mm, kk, i.a_rows), _nz(m, i.b, kk, nn, i.b_rows)]
    return reads + ([c] if m.int(i.accumulate) else []), [c]


@races.register(cube.FixPipe)
def _fp_fixpipe(m: interp.Machine, i: cube.FixPipe):
    rows, cols = m.int(i.rows), m.int(i.cols)
    reads = [_nz(m, i.src, rows, cols, i.src_rows)]
    reads += [races.strided(m, r, (rows, cols), s) for r, s in zip(i.epi_srcs, i.epi_strides)]
    return reads, [races.strided(m, i.dst, (rows, cols), i.strides)]


# ============================================================================= cost
# ``cost.register`` entries: (ctx, instr) -> (pipe, busy cycles, latency cycles).


def _bytes(dtype: str, n: int) -> int:
    return n * np.dtype(dtype).itemsize


@cost.register(cube.LoadNz)
def cost_load_nz(ctx: cost.CostCtx, i: cube.LoadNz) -> tuple:
    """MTE2 GM -> L1 with ND -> NZ: fixed cost + bytes at the GM read rate, GM read latency."""
    spec = ctx.spec
    nbytes = _bytes(i.src.buf.dtype, ctx.int(i.rows) * ctx.int(i.cols))
    if i.src.buf.scope == "UB":  # 910: a prologue's result, UB -> L1 at the UB port's rate
        return "MTE2", spec.copy_l1_fixed + nbytes / spec.ub_gm_bpc, 0.0
    # the first of `reuse` reads comes from HBM, the rest from L2 (a run-time M: an expression)
    first = 1.0 / max(ctx.int(i.reuse), 1)
    if cost.in_l2(ctx, i.src):  # a MIX hand-off slot: written just before, still in L2
        first = 0.0
    busy = nbytes * (first / spec.gm_read_bpc + (1 - first) / spec.l2_read_bpc)
    return "MTE2", spec.copy_l1_fixed + busy, spec.gm_read_latency


@cost.register(cube.LoadL0)
def cost_load_l0(ctx: cost.CostCtx, i: cube.LoadL0) -> tuple:
    spec = ctx.spec
    rate = spec.l1_to_l0a_bpc if i.dst.buf.scope == "L0A" else spec.l1_to_l0b_bpc
    return "MTE1", _bytes(i.dst.buf.dtype, ctx.int(i.rows) * ctx.int(i.cols)) / rate, 0.0


@cost.register(cube.Mmad)
def cost_mmad(ctx: cost.CostCtx, i: cube.Mmad) -> tuple:
    """ceil(M/16)*ceil(K/16)*ceil(N/16) cycles for fp16, x4 for fp32 (isa_cube.cube_cycles)."""
    m, n, k = ctx.int(i.m), ctx.int(i.n), ctx.int(i.k)
    return "Cube", float(cube.cube_cycles(m, n, k, i.in_dtype, ctx.spec)), 0.0


@cost.register(cube.FixPipe)
def cost_fixpipe(ctx: cost.CostCtx, i: cube.FixPipe) -> tuple:
    spec = ctx.spec
    n = ctx.int(i.rows) * ctx.int(i.cols)
    to_gm = i.dst.buf.scope == "GM"
    rate = spec.gm_write_bpc if to_gm else spec.l0c_to_ub_bpc
    if to_gm and cost.in_l2(ctx, i.dst):  # into the workspace (a MIX hand-off): stays in L2
        rate = spec.l2_write_bpc
    busy = spec.l0c_out_fixed + _bytes("float32", n) / rate
    if i.epilogue:  # 910B MIX fallback: charge one Vector pass per epilogue op over the tile
        for op in i.epilogue:
            busy += cost.vector_cycles(spec, "default", _bytes("float32", n)) if op.srcs else 0
    return "FixPipe", busy, spec.gm_write_latency if to_gm else 0.0
