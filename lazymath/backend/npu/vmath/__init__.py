"""Vector math library: composite transcendentals as NPU programs.

On the NPU only ``vexp`` and ``vln`` are instructions; AscendC builds sin, cos, tanh, ... from
native vector instructions (range reduction + polynomial) over scratch buffers. lazymath mirrors
that split: the host's scalar bodies of ``vexp``/``vln`` are LLVM functions in the host mapping
(`backend.host.vmath_native.define_native`), and this module, device-side, has

- `emit_composite(b, op, dst, srcs, n, dtype, cap=...)`: appends native vector instructions for
  sin, cos, tan, tanh, sigmoid, exp2, pow, floor_divide and remainder to an `isa.Builder`.

Accuracy contract (measured by tests/backend/test_vmath.py over the whole float32 range):
float32 log is correctly rounded; exp, tan, tanh, exp2 and float32 pow are faithful
(within 1 ulp of the correctly rounded value, 97-99.6% of them correctly rounded), sigmoid
within 2, sin and cos within 2 (one float32 reduction by pi below 2^17: measured on every
float32 there, 97.2 % / 93.5 % correctly rounded, 0.0001 % / 0.002 % 2 ulp off; above 2^17 the
Payne-Hanek path, within 1); floor_divide and remainder match numpy bit for bit; IEEE special
values (inf, nan, -0.0, denormals) match numpy. numpy's own float32 results are up to 4 (log),
2 (exp) and 1-2 (sin, cos, tan, tanh) ulp off, so the distance to numpy stays within 4 ulp.

dtypes: float32 everywhere; float16 is computed in float32 (vconv in and out, chunk by chunk);
float64 has native exp/log and composite tanh (faithful), sigmoid and pow; the other float64
composites raise NotImplementedError so the caller falls back (host libm for trig/tanh, the
native vfloordiv/vmod for floor_divide/remainder, which are exact).

Requirements on the consumers: IEEE semantics per instruction (no fast-math flags: no
reassociation, contraction, nnan/ninf/nsz), vfma fused (one rounding), vrint ties-to-even,
vshr arithmetic on int32, vconv 'bits' a reinterpretation, vgather indices relative to the
table Ref's offset.

Why the float32 trigonometric reduction is done in float64 with a table: sin of 1e30 needs
x * 2/pi mod 2 to ~60 significant bits whatever the exponent of x. Writing |x| = M * 2^(16g)
with M < 2^40, the table holds T(g) = 2^(16g)/pi mod 2 as two doubles (f0 + f1, 106 bits) per
exponent group g; M * f0 is made exact with an fma two-product and M * f1 is tiny, so two
gathers, ~12 float64 instructions and no branch give a reduction that is exact enough for every
float32 (a Payne-Hanek reduction in floating point). Gathers are slow on the host (LLVM
scalarizes them), and arguments are almost always small, so sin/cos/tan branch once per
256-element chunk: one fused pass takes max|x| (vcmax of the bits << 1), the Scalar unit reads
it (`GetValue`) and an `If` picks the gather-free reduction when every |x| < 2^17 (1/pi split in
28 + 28 + 53 bits: x*A and x*B exact, two fmas) or the table path otherwise. q is rounded with
the 1.5*2^52 magic add, whose last mantissa bit is q's parity: the sign (-1)^q is an xor on v.

The polynomials were fitted with a Remez exchange (mpmath, 60 digits) on the stated intervals;
their relative approximation error is given next to each table.

The package's modules (issue 36 split the one vmath module by what it holds): `core` (the
`_Seq` emitter, the op tables, `GetValue`), the composite families `trig` (sin, cos, tan),
`tanh` (tanh, sigmoid, exp2), `powmod` (pow, floor_divide, remainder), `wide` (issue 16's
log1p ... atan2, through float64) and `erf` (erf, erfc); this module dispatches to them
(`emit_composite`, `_OPS`) and holds the out-of-line call (`VMathCall`, `expand_call`,
`call_footprint`). Every public name (and the ones the tests read) stays `vmath.<name>`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lazymath import settings
from lazymath.backend.npu import cost, interp, isa
from lazymath.backend.npu.tiles import TileBuilder, TilePool
from lazymath.backend.npu.vmath.core import (
    _ARITY,
    _F64_OPS,
    CHUNK,
    COMPOSITE_OPS,
    HOST_ONLY,
    NATIVE_OPS,
    GetValue,
    _Seq,
    host_math_enabled,
    round_f32,
)
from lazymath.backend.npu.vmath.erf import _op_erf, _op_erfc
from lazymath.backend.npu.vmath.powmod import _op_floor_divide, _op_pow, _op_remainder
from lazymath.backend.npu.vmath.tanh import _op_exp2, _op_sigmoid, _op_tanh
from lazymath.backend.npu.vmath.trig import (
    _HALF_F0,
    _HALF_F1,
    _QUARTER_F0,
    _QUARTER_F1,
    _TRIG_G0,
    _TRIG_NPU,
    TWO_OVER_PI_24,
    _op_cos,
    _op_sin,
    _op_tan,
    _trig_by_range,
    _trig_table,
)
from lazymath.backend.npu.vmath.wide import (
    _LN2,
    _op_acos,
    _op_acosh,
    _op_asin,
    _op_asinh,
    _op_atan,
    _op_atan2,
    _op_atanh,
    _op_cosh,
    _op_expm1,
    _op_hypot,
    _op_log1p,
    _op_logaddexp,
    _op_sinh,
    _scaled_log,
)

__all__ = [
    "COMPOSITE_OPS",
    "GetValue",
    "NATIVE_OPS",
    "composite_instructions",
    "composite_scratch_bytes",
    "emit_composite",
]

# read as vmath.<name> by the templates, the host mapping and the tests
_REEXPORTED = (_F64_OPS, CHUNK, HOST_ONLY, NATIVE_OPS, round_f32, _HALF_F0, _HALF_F1,
               _QUARTER_F0, _QUARTER_F1, _TRIG_G0, TWO_OVER_PI_24)  # fmt: skip


def _check_srcs(op: str, srcs: tuple) -> None:
    if len(srcs) != _ARITY.get(op, 1):
        raise ValueError(f"vmath {op}: expected {_ARITY.get(op, 1)} sources, got {len(srcs)}")


def emit_composite(
    b: isa.Builder,
    op: str,
    dst: isa.Ref,
    srcs: tuple,
    n: isa.IntExpr,
    dtype: str,
    *,
    cap: int | None = None,
    host_math: bool | None = None,
) -> None:
    """Append native vector instructions computing dst[:n] = op(*srcs)[:n] in `dtype`.

    `cap` is the static upper bound of `n` (the tile; default ``b.tile``). Work is strip-mined
    in chunks of `CHUNK` elements so the scratch buffers (each `min(cap, CHUNK)` elements,
    from ``b.scratch``) stay in L1 between instructions. float16 is computed in float32 chunk
    by chunk (vconv in and out). Raises NotImplementedError for an (op, dtype) it does not
    expand, so the caller can fall back to a host or native instruction. `host_math` (default:
    the LAZYMATH_HOST_MATH setting) picks the float64 reduction of float32 sin/cos/tan.
    """
    if op not in COMPOSITE_OPS:
        raise NotImplementedError(f"vmath has no composite for {op!r}")
    if dtype not in ("float16", "float32", "float64"):
        raise NotImplementedError(f"vmath {op}: dtype {dtype} (floats only)")
    if dtype == "float64" and op not in _F64_OPS:
        raise NotImplementedError(f"vmath {op}: float64 is left to the host fallback")
    if op in HOST_ONLY:
        raise NotImplementedError(f"vmath {op}: no vector sequence yet (host libm)")
    _check_srcs(op, srcs)
    cap = cap or b.tile
    if not cap:
        raise ValueError("vmath.emit_composite needs cap (static bound of n) or b.tile")
    if host_math is None:
        host_math = host_math_enabled()
    chunk = min(int(cap), CHUNK)
    s = _Seq(b, chunk)
    if chunk >= cap:  # one chunk: no loop
        s.n = n
        _emit_chunk(s, op, dst, srcs, dtype, host_math)
        b.body.extend(s.pre)
        b.body.extend(s.body)
        return
    var = isa.Var(f"vm{len(b.body)}")
    s.n = isa.imin(chunk, isa.sub(n, var))
    _emit_chunk(s, op, dst + var, tuple(r + var for r in srcs), dtype, host_math)
    b.body.extend(s.pre)
    b.emit(isa.Loop(var, 0, n, chunk, tuple(s.body)))


def composite_scratch_bytes(op: str, dtype: str, cap: int) -> int:
    """UB bytes the scratch buffers of one `emit_composite` call take (for tiling decisions)."""
    b = isa.Builder(tile=cap)
    src = b.scratch(dtype, cap)
    srcs = (src,) * _ARITY.get(op, 1)
    before = len(b.buffers)
    emit_composite(b, op, src, srcs, cap, dtype, cap=cap)
    return sum(buf.nbytes for buf in b.buffers[before:])


def composite_instructions(op: str, dtype: str = "float32") -> int:
    """Instructions per chunk of `op` on its common path (the constant set-up before the loop
    excluded; of a range branch only the first, small-argument, body is counted)."""
    chunk = CHUNK
    s = _Seq(isa.Builder(tile=chunk), chunk)
    src = isa.Ref(isa.Buffer("x", "UB", dtype, chunk))
    _emit_chunk(s, op, src, (src,) * _ARITY.get(op, 1), dtype)
    ifs = [i for i in s.body if isinstance(i, isa.If)]
    rest = [i for i in s.body if not isinstance(i, isa.If)]
    return len(rest) + (len(ifs[0].body) if ifs else 0)


def _emit_chunk(s: _Seq, op: str, dst: isa.Ref, srcs: tuple, dtype: str,
                host_math: bool = False) -> None:  # fmt: skip
    """One chunk: float16 goes through float32 scratch; others write dst directly.

    sin/cos/tan of float32 branch per chunk on its largest |x| (see `_trig_by_range`);
    float16 arguments are always below the small-argument bound (|x| <= 65504 < 2^17)."""
    if dtype != "float16":
        if op in _TRIG_NPU:
            _trig_by_range(s, op, dst, srcs[0], _trig_table(host_math))
            return
        _OPS[op](s, dst, srcs, dtype)
        return
    wide = tuple(s.conv(r, "float32") for r in srcs)
    out = s.tmp("float32")
    if op in _TRIG_NPU:
        _trig_table(host_math)[op](s, out, wide[0], True)
    else:
        _OPS[op](s, out, wide, "float32")
    s.conv(out, "float16", out=dst)
    s.done(out, *wide)


_OPS = {
    "erf": _op_erf,
    "erfc": _op_erfc,
    "asin": _op_asin,
    "acos": _op_acos,
    "atan": _op_atan,
    "atan2": _op_atan2,
    "log1p": _op_log1p,
    "expm1": _op_expm1,
    "log2": _scaled_log(1.0 / _LN2),
    "log10": _scaled_log(1.0 / math.log(10.0)),
    "sinh": _op_sinh,
    "cosh": _op_cosh,
    "asinh": _op_asinh,
    "acosh": _op_acosh,
    "atanh": _op_atanh,
    "hypot": _op_hypot,
    "logaddexp": _op_logaddexp,
    "sin": _op_sin,
    "cos": _op_cos,
    "tan": _op_tan,
    "tanh": _op_tanh,
    "sigmoid": _op_sigmoid,
    "exp2": _op_exp2,
    "pow": _op_pow,
    "floor_divide": _op_floor_divide,
    "remainder": _op_remainder,
}


# ============================================================================ part 3: calls
# Out-of-line composites. A fused kernel with many transcendental ops would otherwise hand
# LLVM one copy of every composite (dozens of blocks per op: the optimizer's time grows much
# faster than the kernel). Instead `VMathCall` asks a vector subroutine of the runtime library
# (`vmlib`: one function per (op, dtype), compiled once per host and kept in the disk cache like
# a kernel) to run the composite over the tile: the kernel costs the optimizer one call per op.
#
# Semantics: a VMathCall is exactly `emit_composite(op, dst, srcs, n, dtype)` with chunks of
# CHUNK elements counted from the tile start (the inlined expansion strip-mines the same way:
# chunk = min(tile, CHUNK) and a tile shorter than CHUNK is a single chunk either way), so the
# per-chunk range branch of sin/cos/tan sees the same elements and results are bit-identical
# to the inlined form on every backend. The subroutine's scratch stays declared in the calling
# kernel (`call_footprint`): the UB footprint, and so the tiling, is the inlined one. Which
# kernels call the library and which inline: `vmlib.call_plan`.
CALL_CAP = 1 << 30  # static bound of a call's n: any tile (chunks of CHUNK, strip-mined)


@dataclass(frozen=True, slots=True)
class VMathCall:
    """dst[:n] = op(*srcs)[:n] in `dtype` by the runtime library's vector subroutine."""

    op: str
    dtype: str
    dst: isa.Ref
    srcs: tuple
    n: isa.IntExpr


isa.register_instr(
    VMathCall,
    "Vector",
    lambda i: f"vmath.{i.op}.{i.dtype} {i.dst}, {', '.join(map(str, i.srcs))}, n={i.n}",
)


def call_symbol(op: str, dtype: str, target: str | None = None) -> str:
    """The library's C symbol of (op, dtype) for a host target (default: the one in force,
    LAZYMATH_TARGET_CPU): void f(ptr dst, ptr src0, ptr src1, i64 n). Native code has no
    suffix; a forced target's is ``.<cpu>`` (a process that switches targets links each
    target's kernels to that target's library code)."""
    if target is None:  # == host.requested(), read here: vmath sits below the host target
        target = (settings.TARGET_CPU.get() or "").strip()
        target = "" if target in ("native", "host") else target
    return f"lazymath_vm_{op}_{dtype}" + (f".{target}" if target else "")


_EXPANSIONS: dict = {}


def expand_call(i: VMathCall, prefix: str = "vmx") -> tuple[list, list]:
    """(instructions, scratch buffers) equal to the call: the composite strip-mined in CHUNKs.
    Scratch buffers are named `prefix`<k> (the interpreter gives each its own memory).
    Memoized per instruction (the interpreter and the cost model expand every tile's call)."""
    key = (i, prefix)
    hit = _EXPANSIONS.get(key)
    if hit is None:
        b = isa.Builder(tile=CALL_CAP, prefix=prefix)
        emit_composite(b, i.op, i.dst, tuple(i.srcs), i.n, i.dtype, cap=CALL_CAP)
        hit = (b.body, b.buffers)
        if len(_EXPANSIONS) > 4096:
            _EXPANSIONS.clear()
        _EXPANSIONS[key] = hit
    return hit


_FOOTPRINT: dict = {}


def call_footprint(op: str, dtype: str, tile: int, arity: int) -> tuple[tuple, tuple]:
    """What the inlined composite would take from a template's tile pool, recorded once:
    ((dtype, size) of each pooled scratch, in borrowing order), ((dtype, size, key) of each
    buffer outside the pool; key: the coefficient chunk it holds, shared per expression).
    Raises NotImplementedError like `emit_composite` for what it cannot expand. The caller
    borrows (and returns) the same pool tiles and declares the others, so a kernel calling the
    library has the UB footprint, the tile and the chunking of the kernel that inlines it."""
    key = (op, dtype, tile, arity)
    hit = _FOOTPRINT.get(key)
    if hit is not None:
        return hit
    pool = TilePool(tile)
    tb = TileBuilder(pool)
    tb.shared_consts = {}
    src = pool.get(dtype)
    dst = pool.get(dtype)
    emit_composite(tb, op, dst, (src,) * arity, tile, dtype)
    pooled = tuple((r.buf.dtype, r.buf.size) for r in tb.borrowed)
    const_of = {r.buf.name: k for k, r in tb.shared_consts.items()}
    other = tuple((buf.dtype, buf.size, const_of.get(buf.name)) for buf in tb.buffers)
    _FOOTPRINT[key] = (pooled, other)
    return _FOOTPRINT[key]


@interp.register(VMathCall)
def _interp_vmath_call(m, i: VMathCall) -> None:
    import numpy as np

    body, bufs = expand_call(i, prefix=f"vmx_{i.op}_{i.dtype}_")
    for buf in bufs:
        have = m.mem.get(buf.name)
        if have is None or have.size != buf.size or have.dtype != np.dtype(buf.dtype):
            m.mem[buf.name] = np.zeros(buf.size, dtype=buf.dtype)
    saved = dict(m.env)
    try:
        m.run(body)
    finally:
        m.env = saved


@cost.register(VMathCall)
def _cost_vmath_call(ctx, i: VMathCall):
    body, _ = expand_call(i)
    saved = dict(ctx.env)
    ctx.run(body)
    ctx.env = saved
    return "Scalar", 1, 0.0
