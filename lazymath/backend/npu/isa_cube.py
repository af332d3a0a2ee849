"""Cube-side instructions of the NPU ISA: the matmul data path GM -> L1 -> L0A/L0B -> L0C -> out.

Layouts. Every Cube-side tile is stored "NZ": a matrix is cut into fractal columns C0 = 16
elements wide, and element (r, c) of an R x C tile whose padded row count is Rp lives at
``((c // 16) * Rp + r) * 16 + c % 16``. L1 A (M x K), L1 B (K x N), L0A, L0B and L0C (M x N) all
use it; each instruction names the Rp of the tiles it touches (``*_rows``). The real hardware
keeps L0A in ZZ and L0B in ZN order (a permutation of the same fractals that only Mmad reads);
the emulator keeps NZ everywhere, which is what the host microkernel wants (a 6x16 micro-tile of
L0C is contiguous, a 16-column B micro-panel is contiguous) and changes no result.

On the host the Cube buffers hold float32 even for float16 operands: MTE2 widens with F16C on
the way in (the declared NPU buffer keeps its float16 dtype and byte count for the capacity
check). MTE1 is a pointer step on the host (the CPU cache plays L0) where a static walk proves
the alias unobservable (``lower_cube.aliasable_l0``), a copy otherwise.

`Program.check` bounds every Cube access statically (`check_bounds`): a program that passes it
cannot touch an on-chip element outside its buffers on any consumer.

Lowerings for LLVM, the numpy interpreter and the cost model are registered in ``lower_cube``.
"""

from __future__ import annotations

from dataclasses import dataclass

from lazymath.backend.npu import isa
from lazymath.backend.npu.kernel_ir import Expr

C0 = 16  # fractal width (elements) of every NZ tile


def nz_index(r: int, c: int, rows_p: int) -> int:
    """Element offset of (r, c) in an NZ tile with padded row count `rows_p`."""
    return ((c // C0) * rows_p + r) * C0 + c % C0


@dataclass(frozen=True, slots=True)
class LoadNz:
    """MTE2 GM -> L1 with ND -> NZ: dst[NZ(r, c)] = prologue(src[src.off + r*sr + c*sc]).

    Valid region rows x cols; rows are zero-filled up to a multiple of `row_pad` and columns up
    to a multiple of C0 so Mmad never sees an edge. Strides may be 0 (broadcast) or negative
    (flipped views); a transposed operand is just swapped strides. `prologue` is an elementwise
    expression applied on the way in (``load`` 0 = the raw element), evaluated in its own dtypes.

    `reuse` (cost hint): how many loads of the whole launch read the same GM tile (a matmul
    reads each A tile once per N panel, each B tile once per M tile); the cost model charges the
    first at the HBM rate and the rest at the L2 rate (they run close in time on the other
    cores).

    `memo` (host hint, optional): this load's source does not depend on the inner loops, so the
    host may keep the packed panel in slot `memo` of its thread workspace and repack only when
    `memo_fill` is non-zero (the Goto/BLIS "pack B once per panel"). The NPU and the interpreter
    ignore it and always copy, as a real MTE2 does (the L2 cache catches the re-read).
    """

    dst: isa.Ref
    dst_rows: int
    src: isa.Ref
    strides: tuple[int, int]
    rows: isa.IntExpr
    cols: isa.IntExpr
    row_pad: int = 1
    prologue: Expr | None = None
    memo: isa.IntExpr | None = None
    memo_fill: isa.IntExpr = 1
    memo_slots: int = 0  # how many slots the block's workspace holds
    memo_slot_elems: int = 0  # elements per slot (the L1 panel size)
    reuse: isa.IntExpr = 1  # cost hint: LoadNz of the launch reading this GM tile (L2 hits)
    # implicit GEMM (conv1d's im2col in the packing, ``backend/host/im2col.py``): (K, stride,
    # dilation, pad_left, length); then X[r, c] = src[src.off + ch*sr + p*sc] with ch, j =
    # divmod(im2col_k0 + r, K), p = (im2col_n0 + c)*stride + j*dilation - pad_left, and 0 where
    # p falls outside [0, length) (the zero padding; the prologue applies to x's elements only)
    im2col: tuple[int, int, int, int, int] | None = None
    im2col_k0: isa.IntExpr = 0
    im2col_n0: isa.IntExpr = 0


@dataclass(frozen=True, slots=True)
class LoadL0:
    """MTE1 L1 -> L0A / L0B: copy an NZ block of `rows` x `cols` (padded counts) between tiles
    with padded row counts `src_rows` / `dst_rows`. (Hardware: NZ -> ZZ for A, NZ -> ZN for B.)"""

    dst: isa.Ref
    dst_rows: int
    src: isa.Ref
    src_rows: int
    rows: isa.IntExpr
    cols: isa.IntExpr


@dataclass(frozen=True, slots=True)
class Mmad:
    """Cube: C[0:m, 0:n] (+)= A[0:m, 0:k] @ B[0:k, 0:n]; float32 accumulation in L0C.

    A in L0A (Rp = a_rows), B in L0B (Rp = b_rows), C in L0C (Rp = c_rows), all NZ. `accumulate`
    (IntExpr, 0/1) chooses C += A@B over C = A@B (the first K chunk initialises L0C). Operands are
    `in_dtype` (float16 or float32) on the NPU; padding beyond m/n/k up to 16 is zero.
    """

    c: isa.Ref
    c_rows: int
    a: isa.Ref
    a_rows: int
    b: isa.Ref
    b_rows: int
    m: isa.IntExpr
    n: isa.IntExpr
    k: isa.IntExpr
    accumulate: isa.IntExpr
    in_dtype: str = "float16"


@dataclass(frozen=True, slots=True)
class FixPipe:
    """L0C -> GM (910B FixPipe) or L0C -> UB (910): dst[m*sm + n*sn] = cast(relu?(C[NZ(m, n)])).

    rows x cols valid elements; the cast goes to dst's dtype. To UB the strides describe a dense
    row-major tile (sm = pitch, sn = 1).

    `epilogue` (910B only, optional): an elementwise expression that FixPipe itself cannot do
    (FixPipe has only relu and cast). A Cube core of the split 910B has no UB, so the fusion layer
    normally puts such ops in a separate Vector kernel; when a kernel still carries one, the
    template keeps it here and the host applies it on the tile before the single write. The
    cost model charges it as an extra Vector pass over the tile (a MIX kernel). ``acc`` is the
    float32 accumulator, ``load`` i reads `epi_srcs[i]` at (batch, m, n) through `epi_strides`.
    """

    dst: isa.Ref
    strides: tuple[int, int]
    src: isa.Ref
    src_rows: int
    rows: isa.IntExpr
    cols: isa.IntExpr
    relu: bool = False
    epilogue: Expr | None = None
    result: int = -1
    epi_srcs: tuple[isa.Ref, ...] = ()
    epi_strides: tuple[tuple[int, int], ...] = ()


def _fmt_load_nz(i: LoadNz) -> str:
    pro = " +prologue" if i.prologue else ""
    memo = f" memo[{i.memo}] fill={i.memo_fill}" if i.memo is not None else ""
    st = ",".join(map(str, i.strides))
    if i.im2col:
        kk, s_, d_, pl, length = i.im2col
        memo += (f" im2col(K={kk} stride={s_} dilation={d_} pad={pl} L={length}"
                 f" k0={i.im2col_k0} n0={i.im2col_n0})")  # fmt: skip
    return (f"load_nz {i.dst} (rp={i.dst_rows}) <- {i.src} [{i.rows}x{i.cols}] stride ({st})"
            f" pad_rows={i.row_pad}{pro}{memo}")  # fmt: skip


def _fmt_load_l0(i: LoadL0) -> str:
    return f"load_{i.dst.buf.scope.lower()} {i.dst} <- {i.src} [{i.rows}x{i.cols}]"


def _fmt_mmad(i: Mmad) -> str:
    acc = "+=" if i.accumulate == 1 else ("=" if i.accumulate == 0 else f"(+)[{i.accumulate}]=")
    return f"mmad.{i.in_dtype} {i.c} {acc} {i.a} @ {i.b}  m={i.m} n={i.n} k={i.k}"


def _fmt_fixpipe(i: FixPipe) -> str:
    extra = " relu" if i.relu else ""
    if i.epilogue:
        extra += f" +epilogue({len(i.epilogue)} ops)"
    to = i.dst.buf.scope.lower()
    return (f"fixpipe_l0c_to_{to}.{i.dst.buf.dtype} {i.dst} <- {i.src} [{i.rows}x{i.cols}]"
            f" stride ({i.strides[0]},{i.strides[1]}){extra}")  # fmt: skip


isa.register_instr(LoadNz, "MTE2", _fmt_load_nz)
isa.register_instr(LoadL0, "MTE1", _fmt_load_l0)
isa.register_instr(Mmad, "Cube", _fmt_mmad)
isa.register_instr(FixPipe, "FixPipe", _fmt_fixpipe)


# ----------------------------------------------------------------------------- static bounds


def _pad(x: float, a: int) -> float:
    return -(-x // a) * a


def _nz_span(r: Ref_, off, rows, cols, rows_p: int, ranges, what: str, program) -> None:
    """Raise unless an NZ block of rows x cols (upper bounds, already padded) at `off` with padded
    row count `rows_p` stays inside its buffer and inside its fractal columns."""
    lo, hi = isa.int_range(off, ranges)
    if rows <= 0 or cols <= 0:
        return
    if rows > rows_p:
        raise ValueError(f"kernel {program.name}: {what}: up to {rows:g} rows in an NZ tile of "
                         f"{rows_p} padded rows")  # fmt: skip
    last = hi + nz_index(int(rows) - 1, int(cols) - 1, rows_p) if hi < float("inf") else hi
    if lo < 0 or last >= r.buf.size:
        raise ValueError(f"kernel {program.name}: {what}: {r.buf.name}[{lo:g}..{last:g}] may fall "
                         f"outside its {r.buf.size} elements")  # fmt: skip


Ref_ = isa.Ref


def check_bounds(program: isa.Program, spec) -> None:
    """Every Cube instruction's on-chip accesses stay inside their buffers, for every value the
    loop variables and Lets can take (interval arithmetic over the program's integer skeleton;
    loop variables range over [start, last value]). What the host adds (Mmad's micro-tiles of
    MR rows, 16-column groups) stays inside the same padded tiles by construction (gemm)."""
    inf = float("inf")
    ranges: dict = {isa.BLOCK_IDX: (0, inf), isa.BLOCK_NUM: (1, inf)}

    def hi(e) -> float:
        return isa.int_range(e, ranges)[1]

    def visit(body) -> None:
        for i in body:
            if isinstance(i, isa.Loop):
                s, t, st = (isa.int_range(x, ranges) for x in (i.start, i.stop, i.step))
                last = t[1] - 1
                if s[0] == s[1] and st[0] == st[1] and st[0] > 0 and last < inf:
                    last = s[0] + (last - s[0]) // st[0] * st[0]
                ranges[i.var] = (s[0], last)
                visit(i.body)
            elif isinstance(i, isa.If):
                visit(i.body)
            elif isinstance(i, isa.Let):
                ranges[i.var] = isa.int_range(i.value, ranges)
            elif isinstance(i, isa.AtomicAdd):
                ranges[i.var] = (-inf, inf)
            elif isinstance(i, LoadNz):
                rows = _pad(hi(i.rows), i.row_pad)
                _nz_span(i.dst, i.dst.off, rows, _pad(hi(i.cols), C0), i.dst_rows, ranges,
                         "load_nz destination", program)  # fmt: skip
            elif isinstance(i, LoadL0):
                rows, cols = hi(i.rows), _pad(hi(i.cols), C0)
                _nz_span(i.src, i.src.off, rows, cols, i.src_rows, ranges, "load_l0 source",
                         program)  # fmt: skip
                _nz_span(i.dst, i.dst.off, rows, cols, i.dst_rows, ranges,
                         "load_l0 destination", program)  # fmt: skip
            elif isinstance(i, Mmad):
                m, n, k = hi(i.m), _pad(hi(i.n), C0), _pad(hi(i.k), C0)
                _nz_span(i.a, i.a.off, m, k, i.a_rows, ranges, "mmad A", program)
                _nz_span(i.b, i.b.off, k, n, i.b_rows, ranges, "mmad B", program)
                _nz_span(i.c, i.c.off, m, n, i.c_rows, ranges, "mmad C", program)
            elif isinstance(i, FixPipe):
                _nz_span(i.src, i.src.off, hi(i.rows), _pad(hi(i.cols), C0), i.src_rows, ranges,
                         "fixpipe source", program)  # fmt: skip
                if i.dst.buf.scope != "GM":
                    sm, sn = i.strides
                    last = hi(i.dst.off) + (hi(i.rows) - 1) * sm + (hi(i.cols) - 1) * sn
                    if isa.int_range(i.dst.off, ranges)[0] < 0 or last >= i.dst.buf.size:
                        raise ValueError(f"kernel {program.name}: fixpipe destination "
                                         f"{i.dst.buf.name} may overflow")  # fmt: skip

    visit(program.body)


isa.PROGRAM_CHECKS.append(check_bounds)


def cube_cycles(m: int, n: int, k: int, in_dtype: str, spec) -> int:
    """Cube cycles of one Mmad: ceil(M/16)*ceil(K/16)*ceil(N/16) fractal steps (fp16), times the
    spec's fp32 slowdown for float32 operands (AscendC tiling guide: 128x64x256 fp16 -> 512)."""
    steps = -(-m // spec.cube_m) * -(-k // spec.cube_k) * -(-n // spec.cube_n)
    return steps * (spec.cube_fp32_slowdown if in_dtype == "float32" else 1)
