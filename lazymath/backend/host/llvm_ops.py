"""The scalar semantics of the vector instructions in LLVM IR: one element of each op.

`binary_op`, `unary_op`, `scalar_op`, `compare` and `convert` build one element of a vector
instruction from compute-type values (numpy's rules: floor division and modulo, integer pow,
NaN-propagating max/min, shifts, one-rounding conversions); `_reduce_identity`/`_combine` are
the reductions' fold; `host_math` is the C library fallback. The vector lowering
(`lower_vector`) and the Cube epilogue (`lower_cube`) both evaluate through these, so an op
means the same on either unit. Split out of `lower_llvm` (issue 36): nothing here needs the
lowering context's class, only its helpers (``ctx.builder``, ``ctx.call_intrinsic``, ...),
so the module imports no other lowering module.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
from llvmlite import ir

from lazymath.backend.host.bfloat16 import bf16_to_f32, f32_to_bf16

if TYPE_CHECKING:
    from lazymath.backend.host.lower_ctx import LowerCtx

I1 = ir.IntType(1)
I8 = ir.IntType(8)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
F16 = ir.HalfType()
F32 = ir.FloatType()
F64 = ir.DoubleType()
PTR = ir.PointerType()


def kind(dtype: str) -> str:
    """numpy kind letter: 'f' float, 'i' signed, 'u' unsigned, 'b' bool (bfloat16: 'f', which
    numpy files under 'V')."""
    return "f" if dtype == "bfloat16" else np.dtype(dtype).kind


_NARROW = ("float16", "bfloat16")  # stored narrow, computed as float


def widen(b: ir.IRBuilder, dtype: str, v: ir.Value) -> ir.Value:
    """Storage value -> compute value (float16/bfloat16 -> float, exact; others unchanged)."""
    if dtype == "float16":
        return b.fpext(v, F32)
    if dtype == "bfloat16":
        return bf16_to_f32(b, v)
    return v


def narrow(b: ir.IRBuilder, dtype: str, v: ir.Value) -> ir.Value:
    """Compute value -> storage value (float -> float16/bfloat16, rounded to nearest even)."""
    if dtype == "float16":
        return b.fptrunc(v, F16)
    if dtype == "bfloat16":
        return f32_to_bf16(b, v)
    return v


def _suffix(t: ir.Type) -> str:
    if isinstance(t, ir.VectorType):
        return f"v{t.count}{_suffix(t.element)}"
    if t == F32:
        return "f32"
    if t == F64:
        return "f64"
    if t == F16:
        return "f16"
    return f"i{t.width}"


def _fcmp(b, op, x, y):
    return b.fcmp_unordered(op, x, y) if op == "!=" else b.fcmp_ordered(op, x, y)


def _isnan(b, x):
    return b.fcmp_unordered("uno", x, x)


def _icmp(b, k, op, x, y):
    return b.icmp_signed(op, x, y) if k == "i" else b.icmp_unsigned(op, x, y)


def _int_div_guard(ctx, k, x, y):
    """Divisor with 0 and (MIN, -1) replaced by 1 so the host never traps; mask of y == 0."""
    b = ctx.builder
    zero, one = ir.Constant(y.type, 0), ir.Constant(y.type, 1)
    yz = b.icmp_signed("==", y, zero)
    bad = yz
    if k == "i":
        mn = ir.Constant(y.type, -(1 << (y.type.width - 1)))
        bad = b.or_(bad, b.and_(b.icmp_signed("==", x, mn),
                                b.icmp_signed("==", y, ir.Constant(y.type, -1))))  # fmt: skip
    return b.select(bad, one, y), yz


def _int_divmod(ctx, k, x, y, want: str):
    """Python/numpy integer floor division or modulo; division by zero gives 0 like numpy."""
    b = ctx.builder
    ys, yz = _int_div_guard(ctx, k, x, y)
    zero = ir.Constant(x.type, 0)
    if k != "i":
        q, r = b.udiv(x, ys), b.urem(x, ys)
        res = q if want == "div" else r
        return b.select(yz, zero, res)
    q, r = b.sdiv(x, ys), b.srem(x, ys)
    if want == "trunc":
        return b.select(yz, zero, q)
    sign_differs = b.icmp_signed("!=", b.icmp_signed("<", r, zero), b.icmp_signed("<", ys, zero))
    adj = b.and_(b.icmp_signed("!=", r, zero), sign_differs)
    if want == "div":
        res = b.select(adj, b.sub(q, ir.Constant(x.type, 1)), q)
    else:
        res = b.select(adj, b.add(r, ys), r)
    return b.select(yz, zero, res)


def _float_divmod(ctx, x, y, want: str):
    """numpy's npy_divmod: floor_divide / remainder for floats, branch-free."""
    b = ctx.builder
    t = x.type
    z = ir.Constant(t, 0.0)
    one = ir.Constant(t, 1.0)
    mod = b.frem(x, y)
    yz = b.fcmp_ordered("==", y, z)
    div = b.fdiv(b.fsub(x, mod), y)
    modnz = b.fcmp_unordered("!=", mod, z)
    flip = b.and_(modnz, b.xor(b.fcmp_ordered("<", y, z), b.fcmp_ordered("<", mod, z)))
    mod2 = b.select(flip, b.fadd(mod, y), mod)
    div2 = b.select(flip, b.fsub(div, one), div)
    if want == "mod":
        signed0 = ctx.call_intrinsic("copysign", t, z, y)
        res = b.select(modnz, mod2, signed0)
        return b.select(yz, mod, res)
    fl = ctx.call_intrinsic("floor", t, div2)
    fl = b.select(b.fcmp_ordered(">", b.fsub(div2, fl), ir.Constant(t, 0.5)), b.fadd(fl, one), fl)
    q = b.fdiv(x, y)
    res = b.select(b.fcmp_unordered("!=", div2, z), fl, ctx.call_intrinsic("copysign", t, z, q))
    res = b.select(yz, q, res)
    # the Array API's table where an operand is infinite: floor(x / y) (inf // 2 = inf, not
    # npy_divmod's nan; -1 // inf = -0, not -1), as graph.ops.floor_divide_ref
    inf = ir.Constant(t, float("inf"))
    fabs = lambda v: ctx.call_intrinsic("fabs", t, v)  # noqa: E731
    anyinf = b.or_(b.fcmp_ordered("==", fabs(x), inf), b.fcmp_ordered("==", fabs(y), inf))
    return b.select(anyinf, q, res)  # floor(q) == q: q is +-inf, +-0 or NaN there


def _int_pow(ctx, k, x, y):
    """x ** y for integers by square-and-multiply (wraps like numpy).

    A small while loop over the exponent's bits (at most its width): cheap to compile and fast
    for the small exponents integer powers use; its loop keeps the enclosing loop scalar.
    """
    b = ctx.builder
    t = x.type
    one, zero = ir.Constant(t, 1), ir.Constant(t, 0)
    pre = b.block
    ctx._nblocks += 1
    q = ctx._nblocks
    head = ctx.func.append_basic_block(f"ipow{q}")
    body = ctx.func.append_basic_block(f"ipowbody{q}")
    done = ctx.func.append_basic_block(f"ipowdone{q}")
    b.branch(head)
    b.position_at_end(head)
    r, base, e = b.phi(t), b.phi(t), b.phi(t)
    r.add_incoming(one, pre)
    base.add_incoming(x, pre)
    e.add_incoming(y, pre)
    b.cbranch(b.icmp_signed("!=", e, zero), body, done)
    b.position_at_end(body)
    bit = b.icmp_signed("!=", b.and_(e, one), zero)
    r.add_incoming(b.select(bit, b.mul(r, base), r), body)
    base.add_incoming(b.mul(base, base), body)
    e.add_incoming(b.lshr(e, one), body)
    b.branch(head)
    b.position_at_end(done)
    res = r
    if k == "i":  # negative exponents: numpy raises; give the integer truncation of x**y
        neg = b.icmp_signed("<", y, zero)
        m1 = ir.Constant(t, -1)
        odd = b.icmp_signed("!=", b.and_(y, one), zero)
        alt_m1 = b.select(b.icmp_signed("==", x, m1), b.select(odd, m1, one), zero)
        alt = b.select(b.icmp_signed("==", x, one), one, alt_m1)
        res = b.select(neg, alt, res)
    return res


def _maxmin(ctx, k, op, x, y):
    b = ctx.builder
    if k == "f":  # numpy: a if (a > b or isnan(a)) else b
        c = b.or_(b.fcmp_ordered(">" if op == "max" else "<", x, y), _isnan(b, x))
        return b.select(c, x, y)
    return b.select(_icmp(b, k, ">" if op == "max" else "<", x, y), x, y)


def binary_op(ctx: LowerCtx, op: str, dtype: str, x: ir.Value, y: ir.Value) -> ir.Value:
    """One element of VBinary `op` on compute-type values of `dtype`."""
    b = ctx.builder
    k = kind(dtype)
    f = k == "f"
    if op == "vadd":
        return b.fadd(x, y) if f else (b.or_(x, y) if k == "b" else b.add(x, y))
    if op == "vsub":
        return b.fsub(x, y) if f else (b.xor(x, y) if k == "b" else b.sub(x, y))
    if op == "vmul":
        return b.fmul(x, y) if f else (b.and_(x, y) if k == "b" else b.mul(x, y))
    if op == "vdiv":
        return b.fdiv(x, y) if f else _int_divmod(ctx, k, x, y, "trunc" if k == "i" else "div")
    if op in ("vmax", "vmin"):
        return _maxmin(ctx, k, op[1:], x, y)
    if op in ("vand", "vor", "vxor") and not f:
        return {"vand": b.and_, "vor": b.or_, "vxor": b.xor}[op](x, y)
    if op in ("vfloordiv", "vmod"):
        if f:
            return _float_divmod(ctx, x, y, "div" if op == "vfloordiv" else "mod")
        return _int_divmod(ctx, k, x, y, "div" if op == "vfloordiv" else "mod")
    if op == "vpow":
        if f:
            return ctx.call_intrinsic("pow", x.type, x, y)
        return _int_pow(ctx, k, x, y)
    if op in ("vshl", "vshr") and k in "iu":
        # numpy: a count outside [0, width) shifts every bit out (LLVM would make it poison)
        t = x.type
        width = ir.Constant(t, t.width)
        out = b.icmp_unsigned(">=", y, width)  # negative counts are huge unsigned
        safe = b.select(out, ir.Constant(t, 0), y)
        if op == "vshl":
            return b.select(out, ir.Constant(t, 0), b.shl(x, safe))
        if k == "u":
            return b.select(out, ir.Constant(t, 0), b.lshr(x, safe))
        return b.ashr(x, b.select(out, ir.Constant(t, t.width - 1), y))
    raise NotImplementedError(f"vector binary {op} on {dtype}")


def unary_op(ctx: LowerCtx, op: str, dtype: str, x: ir.Value) -> ir.Value:
    b = ctx.builder
    k = kind(dtype)
    t = x.type
    if op == "vcopy":
        return x
    if k == "f":
        if op in ("vexp", "vln"):
            native_dt = "float64" if dtype == "float64" else "float32"
            return b.call(ctx.native(op, native_dt), [x])
        if op == "vabs":
            return ctx.call_intrinsic("fabs", t, x)
        if op == "vrelu":
            z = ir.Constant(t, 0.0)
            return b.select(b.or_(b.fcmp_ordered(">", x, z), _isnan(b, x)), x, z)
        if op == "vsqrt":
            return ctx.call_intrinsic("sqrt", t, x)
        if op == "vrsqrt":
            return b.fdiv(ir.Constant(t, 1.0), ctx.call_intrinsic("sqrt", t, x))
        if op == "vrec":
            return b.fdiv(ir.Constant(t, 1.0), x)
        if op == "vneg":
            return b.fneg(x)
        intr = {"vfloor": "floor", "vceil": "ceil", "vrint": "roundeven", "vtrunc": "trunc"}
        if op in intr:
            return ctx.call_intrinsic(intr[op], t, x)
    else:
        zero = ir.Constant(t, 0)
        if op in ("vfloor", "vceil", "vrint", "vtrunc"):
            return x
        if op == "vabs":
            if k != "i":
                return x
            return b.select(b.icmp_signed("<", x, zero), b.sub(zero, x), x)
        if op == "vneg":
            return b.sub(zero, x)
        if op == "vnot":
            return b.xor(x, ir.Constant(t, 1 if k == "b" else -1))
        if op == "vrelu":
            return b.select(_icmp(b, k, ">", x, zero), x, zero)
        if op == "vrec":
            return _int_divmod(ctx, k, ir.Constant(t, 1), x, "trunc" if k == "i" else "div")
    raise NotImplementedError(f"vector unary {op} on {dtype}")


def scalar_op(ctx: LowerCtx, op: str, dtype: str, x: ir.Value, s) -> ir.Value:
    b = ctx.builder
    k = kind(dtype)
    c = ctx.const(dtype, s)
    if op == "vadds":
        return binary_op(ctx, "vadd", dtype, x, c)
    if op == "vmuls":
        return binary_op(ctx, "vmul", dtype, x, c)
    if op == "vmaxs":
        return binary_op(ctx, "vmax", dtype, x, c)
    if op == "vmins":
        return binary_op(ctx, "vmin", dtype, x, c)
    if op in ("vshl", "vshr") and k in "iu":
        width = x.type.width
        if int(s) >= width:  # shifting out every bit (LLVM would make it poison)
            if op == "vshl" or k == "u":
                return ir.Constant(x.type, 0)
            return b.ashr(x, ir.Constant(x.type, width - 1))
        sh = ir.Constant(x.type, int(s))
        if op == "vshl":
            return b.shl(x, sh)
        return b.ashr(x, sh) if k == "i" else b.lshr(x, sh)
    raise NotImplementedError(f"vector scalar op {op} on {dtype}")


_CMP = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


def compare(ctx: LowerCtx, cmp: str, dtype: str, x: ir.Value, y: ir.Value) -> ir.Value:
    b = ctx.builder
    k = kind(dtype)
    op = _CMP[cmp]
    c = _fcmp(b, op, x, y) if k == "f" else _icmp(b, k, op, x, y)
    return b.zext(c, I8)


def convert(ctx: LowerCtx, src_dt: str, dst_dt: str, x: ir.Value, mode: str) -> ir.Value:
    """Storage-type value of src_dt -> storage-type value of dst_dt (one rounding)."""
    b = ctx.builder
    ks, kd = kind(src_dt), kind(dst_dt)
    ts, td = ctx.storage_type(src_dt), ctx.storage_type(dst_dt)
    if mode == "bits":
        return b.bitcast(x, td)
    if src_dt == "bfloat16" and dst_dt != "bfloat16":  # exact to float, then float's rules
        return convert(ctx, "float32", dst_dt, bf16_to_f32(b, x), mode)
    if dst_dt == "bfloat16" and src_dt != "bfloat16":
        # one rounding, as ml_dtypes: exact (or rounded to odd) to float first, then to nearest
        # even; float64 and int64 go through double like the float16 path below
        if src_dt in ("float16", "float32"):
            f = b.fpext(x, F32) if ts == F16 else x
        else:
            d = x if ts == F64 else convert(ctx, src_dt, "float64", x, mode)
            f = _f64_to_f32_odd(ctx, d)
        return f32_to_bf16(b, f)
    if ks == "f" and mode in ("rint", "floor", "ceil") and kd != "f":
        x = ctx.call_intrinsic({"rint": "roundeven"}.get(mode, mode), ts, x)
    if kd == "b":
        if ks == "f":
            c = b.fcmp_unordered("!=", x, ir.Constant(ts, 0.0))
        else:
            c = b.icmp_signed("!=", x, ir.Constant(ts, 0))
        return b.zext(c, I8)
    if td == F16 and (ts == F64 or ks != "f"):
        # no libcall (__truncdfhf2 / __floatdihf are not in every process): exact to double,
        # round-to-odd to float, then one correctly rounded float -> half step
        if ks != "f":
            x = b.sitofp(x, F64) if ks == "i" else b.uitofp(x, F64)
        return b.fptrunc(_f64_to_f32_odd(ctx, x), F16)
    if ks == "f" and kd == "f":
        if ts == td:
            return x
        return b.fpext(x, td) if _fbits(ts) < _fbits(td) else b.fptrunc(x, td)
    if ks == "f":  # x86 / numpy semantics: through int32 or int64, NaN and overflow -> MIN
        if ts == F16:  # exact; half cannot hold the 2^31 / 2^63 range limits
            x, ts = b.fpext(x, F32), F32
        if kd == "u" and td.width == 64:
            big = ir.Constant(ts, 2.0**63)
            hi = b.fcmp_ordered(">=", x, big)
            lo_v = _cvtt(ctx, x, I64)
            hi_v = b.xor(_cvtt(ctx, b.fsub(x, big), I64), ir.Constant(I64, -(2**63)))
            return b.select(hi, hi_v, lo_v)
        wide = I64 if td.width == 64 or (kd == "u" and td.width == 32) else I32
        v = _cvtt(ctx, x, wide)
        return v if wide == td else b.trunc(v, td)
    if kd == "f":
        return b.sitofp(x, td) if ks == "i" else b.uitofp(x, td)
    if ts.width == td.width:
        return x
    if ts.width > td.width:
        return b.trunc(x, td)
    return b.sext(x, td) if ks == "i" else b.zext(x, td)


def _cvtt(ctx: LowerCtx, x: ir.Value, t: ir.IntType) -> ir.Value:
    """cvttss2si: truncate toward zero; NaN or out of range gives the minimum integer.

    A bad lane is replaced by 0.0 before a plain `fptosi` (defined for every lane then) and
    its result by the minimum afterwards: LLVM vectorizes this to one vcvttps2dq and a blend.
    `llvm.fptosi.sat` (same values) is scalarized by the x86 backend in vector loops: the
    znver4 listing of exp(sin(x)*0.5+1)*x had 64 vcvttss2si and 128 vucomiss + cmov in one
    loop of the sin (its large-argument path); after this change 5 vcvttss2si (scalar
    remainders) and 10 vcvttps2dq."""
    b = ctx.builder
    ft = x.type
    w = t.width
    bad = b.or_(b.fcmp_unordered("uno", x, x),
                b.or_(b.fcmp_ordered(">=", x, ir.Constant(ft, 2.0 ** (w - 1))),
                      b.fcmp_ordered("<", x, ir.Constant(ft, -(2.0 ** (w - 1))))))  # fmt: skip
    v = b.fptosi(b.select(bad, ir.Constant(ft, 0.0), x), t)
    return b.select(bad, ir.Constant(t, -(1 << (w - 1))), v)


def _f64_to_f32_odd(ctx: LowerCtx, d: ir.Value) -> ir.Value:
    """double -> float rounded to odd, so a following float -> half rounding is correct."""
    b = ctx.builder
    f = b.fptrunc(d, F32)
    back = b.fpext(f, F64)
    inexact = b.fcmp_unordered("!=", back, d)
    away = b.fcmp_ordered(
        ">", ctx.call_intrinsic("fabs", F64, back), ctx.call_intrinsic("fabs", F64, d)
    )
    bits = b.bitcast(f, I32)
    bits = b.select(away, b.sub(bits, ir.Constant(I32, 1)), bits)
    bits = b.select(inexact, b.or_(bits, ir.Constant(I32, 1)), bits)
    return b.bitcast(bits, F32)


def _fbits(t: ir.Type) -> int:
    return {F16: 16, F32: 32, F64: 64}[t]


def _reduce_identity(ctx: LowerCtx, op: str, dt: str) -> ir.Constant:
    k = kind(dt)
    if op == "vcadd":
        return ctx.const(dt, 0)
    if op == "vcmul":
        return ctx.const(dt, 1)
    if k == "f":
        return ctx.const(dt, float("-inf") if op == "vcmax" else float("inf"))
    info = np.iinfo(dt) if k != "b" else None
    if op == "vcmax":
        return ctx.const(dt, 0 if k == "b" else info.min)
    return ctx.const(dt, 1 if k == "b" else info.max)


def _combine(ctx: LowerCtx, op: str, dt: str, acc: ir.Value, x: ir.Value) -> ir.Value:
    b = ctx.builder
    k = kind(dt)
    if op == "vcadd":
        return (
            b.fadd(acc, x, flags=("reassoc",)) if k == "f" else binary_op(ctx, "vadd", dt, acc, x)
        )
    if op == "vcmul":
        return (
            b.fmul(acc, x, flags=("reassoc",)) if k == "f" else binary_op(ctx, "vmul", dt, acc, x)
        )
    if k == "f":  # NaN-propagating, recognised by the loop vectorizer as a reduction
        return ctx.call_intrinsic("maximum" if op == "vcmax" else "minimum", acc.type, acc, x)
    if k == "b":
        return b.or_(acc, x) if op == "vcmax" else b.and_(acc, x)
    nm = ("s" if k == "i" else "u") + ("max" if op == "vcmax" else "min")
    return ctx.call_intrinsic(nm, acc.type, acc, x)


LIBM_UNARY = ("log1p", "expm1", "log2", "log10", "sinh", "cosh", "asinh", "acosh", "atanh",
              "asin", "acos", "atan", "erf", "erfc")  # fmt: skip
LIBM_BINARY = ("atan2", "hypot")


def host_math(ctx: LowerCtx, fn: str, t: ir.Type, xs) -> ir.Value:
    """One element of a math function by the C library (float or double `t`): the fallback of
    the composites vmath does not expand (issue 16's functions on float64, asin/acos/atan/atan2
    on every float dtype), and the Cube epilogue's scalar form of them."""
    b = ctx.builder
    suffix = "f" if t == F32 else ""
    if fn in LIBM_UNARY:
        return b.call(ctx.libm(fn + suffix, t), [xs[0]])
    if fn in LIBM_BINARY:
        return b.call(ctx.libm(fn + suffix, t, 2), [xs[0], xs[1]])
    if fn == "logaddexp":  # max + log1p(exp(-|a - b|)); a + log(2) where a == b
        a, c = xs
        mx = _maxmin(ctx, "f", "max", a, c)
        d = b.fneg(ctx.call_intrinsic("fabs", t, b.fsub(a, c)))
        e = b.call(ctx.native("vexp", "float64" if t == F64 else "float32"), [d])
        r = b.fadd(mx, b.call(ctx.libm("log1p" + suffix, t), [e]))
        return b.select(b.fcmp_ordered("==", a, c), b.fadd(a, ir.Constant(t, math.log(2))), r)
    raise NotImplementedError(f"host math function {fn}")
