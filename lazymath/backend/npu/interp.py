"""Execute an `isa.Program` with numpy: the exact, inspectable consumer of the ISA.

Used by tests to check the LLVM lowering and by ``LAZYMATH_BACKEND=interp``. On-chip buffers
are numpy arrays of their dtype; GM arguments are flat numpy arrays (one per kernel argument).
Each instruction is one vectorised numpy operation over its `n` elements (never a Python loop
per element). float16 arithmetic is computed in float32 and rounded once on store, which is what
numpy (and the NPU) do. Transcendentals use numpy's own functions, so results match the LLVM
path to within the vector math library's ulp bound, not bit for bit.

Checks that the native path cannot afford: every UB/GM access is bounds-checked, pipe flags must
pair up (a wait_flag with no pending set_flag would deadlock the NPU; a set_flag never waited
for is a leak), and every Var must be bound.

Table keyed by instruction type; other modules add entries with
``@interp.register(InstrType) def fn(m: Machine, instr)``.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable

import numpy as np

from lazymath.backend.npu import cancel, isa
from lazymath.backend.npu.races import Tracker
from lazymath.dtypes import DtypeSet, is_bf16
from lazymath.graph import ops

INTERP: dict[type, Callable] = {}


class FlagError(RuntimeError):
    """Unpaired set_flag / wait_flag."""


def register(cls: type) -> Callable:
    def deco(fn: Callable) -> Callable:
        INTERP[cls] = fn
        return fn

    return deco


_NARROW = DtypeSet("float16", "bfloat16")  # computed as float32, stored narrow


def _compute_dtype(dtype) -> np.dtype:
    dt = np.dtype(dtype)
    return np.dtype(np.float32) if dt in _NARROW else dt


_FLAGS = (isa.SetFlag, isa.WaitFlag, isa.CrossCoreSetFlag, isa.CrossCoreWaitFlag)


class Machine:
    """One block's state: buffers, variables, pending flags."""

    def __init__(self, program: isa.Program, gm: list[np.ndarray], block_idx: int, block_num: int):
        self.program = program
        self.mem: dict[str, np.ndarray] = {}
        for buf in program.args:
            a = gm[buf.arg]
            flat = a.reshape(-1) if a.flags.c_contiguous else a.ravel()
            dt = np.dtype(buf.dtype)
            if flat.dtype == np.uint8 and dt != np.uint8:  # raw bytes (workspace): typed view
                flat = flat[: flat.size // dt.itemsize * dt.itemsize].view(dt)
            if flat.dtype != dt:
                raise TypeError(f"GM argument {buf.name}: expected {buf.dtype}, got {flat.dtype}")
            self.mem[buf.name] = flat
        for buf in program.buffers:
            self.mem[buf.name] = np.zeros(buf.size, dtype=buf.dtype)
        self.env: dict[isa.Var, int] = {isa.BLOCK_IDX: block_idx, isa.BLOCK_NUM: block_num}
        self.flags: Counter = Counter()
        # AIVs per AIC of a MIX kernel: an AIC cross-core set reaches each, its wait needs all
        self.aivs = isa.mix_aivs(program) if program.unit == "mix" else 1
        self.race = None  # races.Tracker when the program synchronises with flags
        if any(isinstance(i, _FLAGS) for i in program.instructions()):
            self.race = Tracker(program)

    def int(self, e: isa.IntExpr) -> int:
        return isa.eval_int(e, self.env)

    def view(self, ref: isa.Ref, n) -> np.ndarray:
        """The n elements at `ref` (a writable numpy view), bounds-checked."""
        arr = self.mem[ref.buf.name]
        off, n = self.int(ref.off), self.int(n)
        if off < 0 or n < 0 or off + n > arr.size:
            raise IndexError(
                f"kernel {self.program.name}: {ref.buf.name}[{off}:{off + n}] out of bounds "
                f"(size {arr.size})"
            )
        return arr[off : off + n]

    def load(self, ref: isa.Ref, n) -> np.ndarray:
        v = self.view(ref, n)
        return v.astype(np.float32) if v.dtype in _NARROW else v

    def scalar(self, value, dtype) -> np.generic:
        """A scalar operand, rounded to the operand dtype first (as the NPU register holds it)."""
        dt = np.dtype(dtype)
        if dt.kind in "iu":
            info = np.iinfo(dt)
            v = int(value) & ((1 << info.bits) - 1)
            if info.min < 0 and v >= 1 << (info.bits - 1):
                v -= 1 << info.bits
            return dt.type(v)
        if dt.kind == "b":
            return np.bool_(value)
        return _compute_dtype(dt).type(dt.type(value))

    def run(self, body) -> None:
        race = self.race
        for instr in body:
            if race is not None:
                race.access(self, instr)
            fn = INTERP.get(type(instr))
            if fn is None:
                raise NotImplementedError(
                    f"interp has no rule for instruction {type(instr).__name__} "
                    f"({isa.format_instr(instr)})"
                )
            fn(self, instr)


def run(program: isa.Program, gm: list[np.ndarray], block_idx: int = 0, block_num: int = 1,
        check_flags: bool = True) -> Machine:  # fmt: skip
    """Interpret one block of `program` on flat GM arrays (kernel_args order)."""
    m = Machine(program, gm, block_idx, block_num)
    with np.errstate(all="ignore"):
        m.run(program.body)
    if check_flags:
        left = {k: v for k, v in m.flags.items() if v}
        if left:
            (src, dst, ev), _ = next(iter(left.items()))
            raise FlagError(
                f"kernel {program.name}: set_flag {src}->{dst} {ev} was never waited for"
            )
    return m


# ============================================================================= vector semantics


def _int_div(a: np.ndarray, b: np.ndarray, dt: np.dtype) -> np.ndarray:
    """C-style truncated division with x/0 = 0 and MIN/-1 = MIN (no traps, like the lowering)."""
    zero = b == 0
    safe = np.where(zero, 1, b).astype(dt)
    # a - fmod(a, b) is an exact multiple of b, so floor division of it is the truncated quotient
    q = (a - np.fmod(a, safe)) // safe
    return np.where(zero, 0, q).astype(dt)


def _int_pow(a: np.ndarray, b: np.ndarray, dt: np.dtype) -> np.ndarray:
    neg = b < 0
    r = np.power(a, np.where(neg, 0, b).astype(dt))
    if dt.kind == "i" and neg.any():
        odd = (b & 1) != 0
        alt = np.where(a == 1, 1, np.where(a == -1, np.where(odd, -1, 1), 0)).astype(dt)
        r = np.where(neg, alt, r)
    return r.astype(dt)


def binary(op: str, a: np.ndarray, b: np.ndarray, dt: np.dtype) -> np.ndarray:
    k = dt.kind
    if k == "b":
        fn = {"vadd": np.logical_or, "vmax": np.logical_or, "vor": np.logical_or,
              "vmul": np.logical_and, "vmin": np.logical_and, "vand": np.logical_and,
              "vsub": np.logical_xor, "vxor": np.logical_xor}.get(op)  # fmt: skip
        if fn is None:
            raise NotImplementedError(f"vector binary {op} on bool")
        return fn(a, b)
    if op == "vdiv" and k in "iu":
        return _int_div(a, b, dt)
    if op == "vpow" and k in "iu":
        return _int_pow(a, b, dt)
    fn = {"vadd": np.add, "vsub": np.subtract, "vmul": np.multiply, "vdiv": np.divide,
          "vmax": np.maximum, "vmin": np.minimum, "vand": np.bitwise_and, "vor": np.bitwise_or,
          "vxor": np.bitwise_xor, "vfloordiv": ops.floor_divide_ref, "vmod": np.remainder,
          "vpow": np.power}.get(op)  # fmt: skip
    if op in ("vshl", "vshr") and k in "iu":
        # numpy: a count outside [0, width) shifts every bit out
        width = dt.itemsize * 8
        out = (b < 0) | (b >= width)
        safe = np.where(out, 0, b).astype(dt)
        if op == "vshl":
            return np.where(out, 0, np.left_shift(a, safe)).astype(dt)
        full = np.zeros_like(a) if k == "u" else (a >> (width - 1))
        return np.where(out, full, np.right_shift(a, safe)).astype(dt)
    if fn is None:
        raise NotImplementedError(f"vector binary {op}")
    return fn(a, b)


_FLOAT_UNARY = {"vexp": np.exp, "vln": np.log, "vabs": np.abs, "vsqrt": np.sqrt,
                "vneg": np.negative, "vfloor": np.floor, "vceil": np.ceil, "vrint": np.rint,
                "vtrunc": np.trunc}  # fmt: skip


def unary(op: str, x: np.ndarray, dt: np.dtype) -> np.ndarray:
    k = dt.kind
    if op == "vcopy":
        return x
    if k == "f":
        fn = _FLOAT_UNARY.get(op)
        if fn is not None:
            return fn(x)
        one = x.dtype.type(1)
        if op == "vrsqrt":
            return one / np.sqrt(x)
        if op == "vrec":
            return one / x
        if op == "vrelu":
            return np.maximum(x, x.dtype.type(0))
    else:
        if op in ("vfloor", "vceil", "vrint", "vtrunc"):
            return x
        if op == "vabs":
            return np.abs(x) if k == "i" else x
        if op == "vneg":
            return (np.zeros_like(x) - x) if k != "b" else x
        if op == "vnot":
            return np.logical_not(x) if k == "b" else np.invert(x)
        if op == "vrelu":
            return np.maximum(x, x.dtype.type(0))
        if op == "vrec":
            return _int_div(np.ones_like(x), x, dt)
    raise NotImplementedError(f"vector unary {op} on {dt}")


def scalar_op(op: str, x: np.ndarray, s, dt: np.dtype) -> np.ndarray:
    if op in ("vadds", "vmuls", "vmaxs", "vmins"):
        base = {"vadds": "vadd", "vmuls": "vmul", "vmaxs": "vmax", "vmins": "vmin"}[op]
        return binary(base, x, np.asarray(s), dt)
    if op in ("vshl", "vshr") and dt.kind in "iu":
        sh = int(s)
        if sh >= dt.itemsize * 8:
            return (
                np.zeros_like(x) if op == "vshl" or dt.kind == "u" else x >> (dt.itemsize * 8 - 1)
            )
        return np.left_shift(x, sh) if op == "vshl" else np.right_shift(x, sh)
    raise NotImplementedError(f"vector scalar op {op} on {dt}")


def _cvtt(r: np.ndarray, bits: int) -> np.ndarray:
    """Truncated float -> int{bits}; NaN and out of range give the minimum (cvttss2si)."""
    dt = np.int64 if bits == 64 else np.int32
    lim = 2.0 ** (bits - 1)
    bad = np.isnan(r) | (r >= lim) | (r < -lim)
    out = np.where(bad, 0, r).astype(dt)
    out[bad] = np.iinfo(dt).min
    return out


def convert(x: np.ndarray, dst_dt: np.dtype, mode: str) -> np.ndarray:
    """VConv semantics shared with the lowering: float->int saturates, NaN -> 0, one rounding."""
    src_dt = x.dtype
    if mode == "bits":
        return x.view(dst_dt)
    if is_bf16(src_dt) and dst_dt != src_dt:  # bfloat16: exact to float32, then its rules
        x, src_dt = x.astype(np.float32), np.dtype(np.float32)
    if dst_dt.kind == "b":
        return x != 0
    if src_dt.kind == "f" and dst_dt.kind in "iu":  # x86 / numpy: via int32 or int64
        r = {"trunc": np.trunc, "rint": np.rint, "floor": np.floor, "ceil": np.ceil}[mode](
            x.astype(np.float64)
        )
        bits = dst_dt.itemsize * 8
        if dst_dt.kind == "u" and bits == 64:
            hi = r >= 2.0**63
            lo_v = _cvtt(r, 64)
            hi_v = _cvtt(r - 2.0**63, 64) ^ np.int64(-(2**63))
            return np.where(hi, hi_v, lo_v).view(np.uint64).astype(dst_dt)
        wide = 64 if bits == 64 or (dst_dt.kind == "u" and bits == 32) else 32
        return _cvtt(r, wide).astype(dst_dt)
    return x.astype(dst_dt)


_CMP = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
        "gt": np.greater, "ge": np.greater_equal}  # fmt: skip


@register(isa.VBinary)
def _vbinary(m: Machine, i: isa.VBinary) -> None:
    dt = np.dtype(i.a.buf.dtype)
    m.view(i.dst, i.n)[:] = binary(i.op, m.load(i.a, i.n), m.load(i.b, i.n), dt)


@register(isa.VScalar)
def _vscalar(m: Machine, i: isa.VScalar) -> None:
    dt = np.dtype(i.src.buf.dtype)
    s = m.scalar(i.scalar, dt)
    m.view(i.dst, i.n)[:] = scalar_op(i.op, m.load(i.src, i.n), s, dt)


@register(isa.VUnary)
def _vunary(m: Machine, i: isa.VUnary) -> None:
    dt = np.dtype(i.src.buf.dtype)
    m.view(i.dst, i.n)[:] = unary(i.op, m.load(i.src, i.n), dt)


@register(isa.VFma)
def _vfma(m: Machine, i: isa.VFma) -> None:
    a, b, c = m.load(i.a, i.n), m.load(i.b, i.n), m.load(i.c, i.n)
    if a.dtype.kind == "f":  # one rounding: exact product in float64 (float32 inputs)
        wide = np.float64 if a.dtype.itemsize <= 4 else np.longdouble
        r = (a.astype(wide) * b.astype(wide) + c.astype(wide)).astype(a.dtype)
    else:
        r = a * b + c
    m.view(i.dst, i.n)[:] = r


@register(isa.VConv)
def _vconv(m: Machine, i: isa.VConv) -> None:
    x = m.view(i.src, i.n)
    m.view(i.dst, i.n)[:] = convert(x, np.dtype(i.dst.buf.dtype), i.mode)


@register(isa.VCmp)
def _vcmp(m: Machine, i: isa.VCmp) -> None:
    m.view(i.dst, i.n)[:] = _CMP[i.cmp](m.load(i.a, i.n), m.load(i.b, i.n))


@register(isa.VCmpS)
def _vcmps(m: Machine, i: isa.VCmpS) -> None:
    s = m.scalar(i.scalar, i.src.buf.dtype)
    m.view(i.dst, i.n)[:] = _CMP[i.cmp](m.load(i.src, i.n), s)


@register(isa.VSel)
def _vsel(m: Machine, i: isa.VSel) -> None:
    mask = m.view(i.mask, i.n) != 0
    m.view(i.dst, i.n)[:] = np.where(mask, m.load(i.a, i.n), m.load(i.b, i.n))


@register(isa.VDup)
def _vdup(m: Machine, i: isa.VDup) -> None:
    s = i.scalar
    if isinstance(s, (isa.Var, isa.BinInt)):
        s = m.int(s)
    m.view(i.dst, i.n)[:] = m.scalar(s, i.dst.buf.dtype)


@register(isa.VBrcb)
def _vbrcb(m: Machine, i: isa.VBrcb) -> None:
    rows, n = m.int(i.rows), m.int(i.n)
    src = m.view(i.src, rows)
    m.view(i.dst, rows * n).reshape(rows, n)[:] = src[:, None]


@register(isa.VGather)
def _vgather(m: Machine, i: isa.VGather) -> None:
    idx = m.view(i.idx, i.n).astype(np.int64)
    table = m.mem[i.table.buf.name][m.int(i.table.off) :]
    if idx.size and (idx.min() < 0 or idx.max() >= table.size):
        raise IndexError(f"kernel {m.program.name}: vgather index out of {i.table.buf.name}")
    m.view(i.dst, i.n)[:] = table[idx]


_RED = {"vcadd": np.add, "vcmul": np.multiply, "vcmax": np.maximum, "vcmin": np.minimum}


@register(isa.VReduce)
def _vreduce(m: Machine, i: isa.VReduce) -> None:
    rows, n = m.int(i.rows), m.int(i.n)
    dst = m.view(i.dst, rows)
    ddt = np.dtype(i.dst.buf.dtype)
    x = m.view(i.src, rows * n).reshape(rows, n)
    cdt = _compute_dtype(ddt)
    x = x.astype(cdt) if ddt.kind != "b" else x.astype(bool)
    if ddt.kind == "b":
        fn = {"vcadd": np.logical_or, "vcmax": np.logical_or, "vcmin": np.logical_and,
              "vcmul": np.logical_and}[i.op]  # fmt: skip
    else:
        fn = _RED[i.op]
    part = fn.reduce(x, axis=1) if n else np.full(rows, _identity(i.op, ddt), dtype=cdt)
    dst[:] = fn(dst.astype(cdt), part)


def _identity(op: str, dt: np.dtype):
    if op == "vcadd":
        return 0
    if op == "vcmul":
        return 1
    if dt.kind == "f":
        return -np.inf if op == "vcmax" else np.inf
    if dt.kind == "b":
        return op == "vcmin"
    info = np.iinfo(dt)
    return info.min if op == "vcmax" else info.max


@register(isa.VArgReduce)
def _vargreduce(m: Machine, i: isa.VArgReduce) -> None:
    rows, n = m.int(i.rows), m.int(i.n)
    if n == 0:
        return
    vals = m.view(i.dst_val, rows)
    idxs = m.view(i.dst_idx, rows)
    x = m.load(i.src, rows * n).reshape(rows, n)
    pos = (np.argmax if i.op == "vargmax" else np.argmin)(x, axis=1)
    cand = x[np.arange(rows), pos]
    cur = vals.astype(cand.dtype)
    if x.dtype.kind == "f":
        nan_c, nan_b = np.isnan(cand), np.isnan(cur)
        better = (cand > cur) if i.op == "vargmax" else (cand < cur)
        better = (better & ~nan_b) | (nan_c & ~nan_b)
    else:
        better = (cand > cur) if i.op == "vargmax" else (cand < cur)
    vals[:] = np.where(better, cand, cur)
    idxs[:] = np.where(better, pos + m.int(i.base), idxs)


_HOST = {"sin": np.sin, "cos": np.cos, "tan": np.tan, "tanh": np.tanh, "exp2": np.exp2,
         "floor_divide": ops.floor_divide_ref, "remainder": np.remainder, "pow": np.power,
         "log1p": np.log1p, "expm1": np.expm1, "log2": np.log2, "log10": np.log10,
         "sinh": np.sinh, "cosh": np.cosh, "asinh": np.arcsinh, "acosh": np.arccosh,
         "atanh": np.arctanh, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan,
         "atan2": np.arctan2, "hypot": np.hypot, "logaddexp": np.logaddexp,
         "erf": ops.OPS["erf"].ref, "erfc": ops.OPS["erfc"].ref}  # fmt: skip


@register(isa.VHostMath)
def _vhostmath(m: Machine, i: isa.VHostMath) -> None:
    xs = [m.load(s, i.n) for s in i.srcs]
    if i.fn == "sigmoid":
        x = xs[0]
        r = x.dtype.type(1) / (x.dtype.type(1) + np.exp(-x))
    else:
        r = _HOST[i.fn](*xs)
    m.view(i.dst, i.n)[:] = r


# ============================================================================= movers


def _gm_index(m: Machine, gm_ref: isa.Ref, counts, strides) -> np.ndarray:
    off = m.int(gm_ref.off)
    cs = [m.int(c) for c in counts]
    ss = [m.int(s) for s in strides]
    idx = np.asarray(off, dtype=np.int64)
    for k, (c, s) in enumerate(zip(cs, ss)):
        shape = [1] * len(cs)
        shape[k] = c
        idx = idx + (np.arange(c, dtype=np.int64) * s).reshape(shape)
    idx = np.broadcast_to(idx, cs)
    size = m.mem[gm_ref.buf.name].size
    if idx.size and (idx.min() < 0 or idx.max() >= size):
        raise IndexError(
            f"kernel {m.program.name}: GM {gm_ref.buf.name}[{idx.min()}..{idx.max()}] out of "
            f"bounds (size {size})"
        )
    return idx


def _chip_view(m: Machine, ref: isa.Ref, counts, pitch) -> tuple[np.ndarray, tuple]:
    cs = [m.int(c) for c in counts]
    if len(cs) == 1:
        return m.view(ref, cs[0]), (cs[0],)
    rows, cols = cs
    p = cols if pitch is None else m.int(pitch)
    if rows == 0 or cols == 0:
        return np.zeros((rows, cols), m.mem[ref.buf.name].dtype), (rows, cols)
    flat = m.view(ref, (rows - 1) * p + cols)
    return np.lib.stride_tricks.as_strided(
        flat, (rows, cols), (p * flat.itemsize, flat.itemsize)
    ), (rows, cols)


@register(isa.CopyIn)
def _copy_in(m: Machine, i: isa.CopyIn) -> None:
    idx = _gm_index(m, i.src, i.counts, i.strides)
    dst, _ = _chip_view(m, i.dst, i.counts, i.dst_pitch)
    dst[...] = m.mem[i.src.buf.name][idx]


@register(isa.CopyOut)
def _copy_out(m: Machine, i: isa.CopyOut) -> None:
    idx = _gm_index(m, i.dst, i.counts, i.strides)
    src, _ = _chip_view(m, i.src, i.counts, i.src_pitch)
    m.mem[i.dst.buf.name][idx] = src


# ============================================================================= control


@register(isa.Loop)
def _loop(m: Machine, i: isa.Loop) -> None:
    start, stop, step = m.int(i.start), m.int(i.stop), m.int(i.step)
    saved = m.env.get(i.var)
    flag = cancel.CANCEL
    for v in range(start, stop, step):
        if flag.value:  # Ctrl-C on a long realize: stop like native code
            break
        m.env[i.var] = v
        m.run(i.body)
    if saved is not None:
        m.env[i.var] = saved


@register(isa.Let)
def _let(m: Machine, i: isa.Let) -> None:
    m.env[i.var] = m.int(i.value)


@register(isa.If)
def _if(m: Machine, i: isa.If) -> None:
    if isa.CMP_OPS[i.cmp](m.int(i.a), m.int(i.b)):
        m.run(i.body)


@register(isa.GetValue)
def _get_value(m: Machine, i: isa.GetValue) -> None:
    v = int(m.view(i.src, 1)[0])
    if not 0 <= v <= i.bound:  # the lowering trusts the launcher; the interpreter checks it
        raise ValueError(f"kernel {m.program.name}: {isa.format_instr(i)} read {v}, outside "
                         f"0..{i.bound}")  # fmt: skip
    m.env[i.var] = v


_ATOMIC = threading.Lock()


@register(isa.AtomicAdd)
def _atomic_add(m: Machine, i: isa.AtomicAdd) -> None:
    cell = m.view(i.dst, 1)
    with _ATOMIC:  # blocks may be interpreted on several threads
        m.env[i.var] = int(cell[0])
        cell[0] += m.int(i.value)


@register(isa.SetFlag)
def _set_flag(m: Machine, i: isa.SetFlag) -> None:
    m.flags[(i.src, i.dst, m.int(i.event))] += 1
    if m.race is not None:
        m.race.set_flag(i, m.int(i.event))


@register(isa.CrossCoreSetFlag)
def _cross_set(m: Machine, i: isa.CrossCoreSetFlag) -> None:
    e = m.int(i.flag)
    n = m.aivs if i.side == "AIC" else 1  # an AIC set reaches each AIV of the group
    m.flags[("cross", i.side, e)] += n
    if m.race is not None:
        m.race.cross_set(i.pipe, i.side, e, n)


@register(isa.CrossCoreWaitFlag)
def _cross_wait(m: Machine, i: isa.CrossCoreWaitFlag) -> None:
    e = m.int(i.flag)
    key = ("cross", "AIV" if i.side == "AIC" else "AIC", e)
    n = m.aivs if i.side == "AIC" else 1  # the AIC waits for every AIV of the group
    if m.flags[key] < n:
        raise FlagError(
            f"kernel {m.program.name}: {isa.format_instr(i)} with no pending cross-core set "
            "(the NPU would deadlock)"
        )
    m.flags[key] -= n
    if m.race is not None:
        m.race.cross_wait(i.pipe, key[1], e, n)


@register(isa.WaitFlag)
def _wait_flag(m: Machine, i: isa.WaitFlag) -> None:
    key = (i.src, i.dst, m.int(i.event))
    if m.flags[key] <= 0:
        raise FlagError(
            f"kernel {m.program.name}: wait_flag {i.src}->{i.dst} {key[2]} with no pending "
            "set_flag (the NPU would deadlock)"
        )
    m.flags[key] -= 1
    if m.race is not None:
        m.race.wait_flag(i, key[2])


@register(isa.PipeBarrier)
def _barrier(m: Machine, i: isa.PipeBarrier) -> None:
    """In-order interpretation already completes every instruction before the next."""
    if m.race is not None:
        m.race.barrier(isa.AIV_PIPES if i.pipe == "AIV" else None, i.pipe)
