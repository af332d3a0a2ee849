"""Test helpers for the vector math library (vmath).

- `jit_native(op, dtype)`: a standalone MCJIT loop ``y[i] = native(x[i])`` around
  `vmath_native.define_native`, so the LLVM bodies of vexp/vln are tested and timed on their own.
- `run_builder(b, inputs)`: a tiny numpy evaluator of the vector instructions a Builder holds
  (float semantics of each instruction as the ISA documents them), so composite sequences are
  checked without the project's interpreter or lowering.
- `ulp_dist(a, b)`: distance in representable floats (0 = identical bits, 1 = neighbours).
"""

from __future__ import annotations

import ctypes

import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir

from lazymath.backend.host import vmath_native
from lazymath.backend.npu import isa, vmath

_ENGINE = None
_CACHE: dict = {}


def _engine():
    global _ENGINE
    if _ENGINE is None:
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        target = llvm.Target.from_default_triple()
        tm = target.create_target_machine(
            cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=3
        )
        backing = llvm.parse_assembly("")
        _ENGINE = (llvm.create_mcjit_compiler(backing, tm), tm, [])
    return _ENGINE


def jit_ir(module: ir.Module, symbol: str) -> int:
    """Optimize (O3, loop + SLP vectorizer) and JIT `module`; return the address of `symbol`."""
    engine, tm, keep = _engine()
    mod = llvm.parse_assembly(str(module))
    mod.verify()
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    engine.add_module(mod)
    engine.finalize_object()
    keep.append(mod)
    return engine.get_function_address(symbol)


def jit_native(op: str, dtype: str):
    """Return f(x: ndarray) -> ndarray computing the native vmath `op` element by element."""
    key = (op, dtype)
    if key in _CACHE:
        return _CACHE[key]
    ft = ir.FloatType() if dtype == "float32" else ir.DoubleType()
    mod = ir.Module(name=f"vmath_test_{op}_{dtype}")
    mod.triple = llvm.get_process_triple()
    fn = vmath_native.define_native(mod, op, dtype)
    assert vmath_native.define_native(mod, op, dtype) is fn  # defined once per module
    i64 = ir.IntType(64)
    ptr = ir.PointerType()
    sym = f"run_{op}_{dtype}"
    loop = ir.Function(mod, ir.FunctionType(ir.VoidType(), [ptr, ptr, i64]), name=sym)
    entry, body, done = (loop.append_basic_block(s) for s in ("entry", "body", "done"))
    b = ir.IRBuilder(entry)
    xs, ys, n = loop.args
    b.cbranch(b.icmp_signed(">", n, ir.Constant(i64, 0)), body, done)
    b.position_at_end(body)
    i = b.phi(i64)
    i.add_incoming(ir.Constant(i64, 0), entry)
    v = b.load(b.gep(xs, [i], source_etype=ft), typ=ft)
    b.store(b.call(fn, [v]), b.gep(ys, [i], source_etype=ft))
    nxt = b.add(i, ir.Constant(i64, 1))
    i.add_incoming(nxt, body)
    b.cbranch(b.icmp_signed("<", nxt, n), body, done)
    b.position_at_end(done)
    b.ret_void()
    cf = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(jit_ir(mod, sym))

    def run(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=dtype)
        y = np.empty_like(x) if out is None else out
        cf(x.ctypes.data, y.ctypes.data, x.size)
        return y

    run.cfunc = cf
    _CACHE[key] = run
    return run


def ordered(a: np.ndarray) -> np.ndarray:
    """Map float bits to integers that are monotone in the float value (+0 and -0 both 0)."""
    a = np.asarray(a)
    ib = {4: np.int32, 8: np.int64, 2: np.int16}[a.dtype.itemsize]
    i = a.view(ib).astype(np.int64)
    mag = i & np.int64((1 << (8 * a.dtype.itemsize - 1)) - 1)
    return np.where(i < 0, -mag, mag)


def ulp_dist(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Representable floats between a and b (equal NaN-ness counts 0, NaN vs number huge)."""
    a, b = np.asarray(a), np.asarray(b)
    d = np.abs(ordered(a) - ordered(b))
    na, nb = np.isnan(a), np.isnan(b)
    d = np.where(na & nb, 0, d)
    return np.where(na ^ nb, np.int64(1) << 40, d)


def correctly_rounded(fn, x: np.ndarray) -> np.ndarray:
    """fn evaluated in float64 (or longdouble for float64 inputs), rounded to x.dtype."""
    wide = np.float64 if x.dtype != np.float64 else np.longdouble
    with np.errstate(all="ignore"):
        return fn(x.astype(wide)).astype(x.dtype)


def float32_sample(n: int, seed: int = 0) -> np.ndarray:
    """n float32 bit patterns spread uniformly over all exponents and signs (finite only)."""
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 1 << 32, size=n, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    return x[np.isfinite(x)]


# ----------------------------------------------------------------------------- numpy evaluator
def _fma_jit(dtype: str):
    """Exact fused multiply-add on arrays (numpy has none): a JIT'd llvm.fma loop."""
    key = ("fma", dtype)
    if key in _CACHE:
        return _CACHE[key]
    ft = ir.FloatType() if dtype == "float32" else ir.DoubleType()
    sfx = "f32" if dtype == "float32" else "f64"
    mod = ir.Module(name=f"vmath_test_fma_{dtype}")
    mod.triple = llvm.get_process_triple()
    i64, ptr = ir.IntType(64), ir.PointerType()
    intr = ir.Function(mod, ir.FunctionType(ft, [ft] * 3), name=f"llvm.fma.{sfx}")
    sym = f"fma_{dtype}"
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [ptr] * 4 + [i64]), name=sym)
    entry, body, done = (fn.append_basic_block(s) for s in ("entry", "body", "done"))
    b = ir.IRBuilder(entry)
    a_, b_, c_, d_, n = fn.args
    b.cbranch(b.icmp_signed(">", n, ir.Constant(i64, 0)), body, done)
    b.position_at_end(body)
    i = b.phi(i64)
    i.add_incoming(ir.Constant(i64, 0), entry)
    vals = [b.load(b.gep(p, [i], source_etype=ft), typ=ft) for p in (a_, b_, c_)]
    b.store(b.call(intr, vals), b.gep(d_, [i], source_etype=ft))
    nxt = b.add(i, ir.Constant(i64, 1))
    i.add_incoming(nxt, body)
    b.cbranch(b.icmp_signed("<", nxt, n), body, done)
    b.position_at_end(done)
    b.ret_void()
    cf = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * 4), ctypes.c_int64)(jit_ir(mod, sym))

    def run(a, b2, c):
        a, b2, c = (np.ascontiguousarray(v, dtype=dtype) for v in (a, b2, c))
        out = np.empty_like(a)
        cf(a.ctypes.data, b2.ctypes.data, c.ctypes.data, out.ctypes.data, a.size)
        return out

    _CACHE[key] = run
    return run


def _ieval(e, env: dict) -> int:
    if isinstance(e, int):
        return e
    if isinstance(e, isa.Var):
        return env[e]
    a, b = _ieval(e.a, env), _ieval(e.b, env)
    return _INT_OPS[e.op](a, b)


_INT_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
            "//": lambda a, b: a // b, "%": lambda a, b: a % b, "min": min, "max": max}  # fmt: skip


_UNARY = {
    "vabs": np.abs, "vneg": np.negative, "vfloor": np.floor, "vceil": np.ceil,
    "vrint": np.rint, "vtrunc": np.trunc, "vsqrt": np.sqrt, "vcopy": lambda x: x.copy(),
    "vrec": lambda x: np.divide(np.ones_like(x), x), "vnot": lambda x: ~x,
}  # fmt: skip
_BIN = {
    "vadd": np.add, "vsub": np.subtract, "vmul": np.multiply, "vdiv": np.divide,
    "vmax": np.maximum, "vmin": np.minimum, "vand": np.bitwise_and, "vor": np.bitwise_or,
    "vxor": np.bitwise_xor, "vshl": np.left_shift, "vshr": np.right_shift,
}  # fmt: skip
_CMP = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
        "gt": np.greater, "ge": np.greater_equal}  # fmt: skip


def _conv(x: np.ndarray, dt: str, mode: str) -> np.ndarray:
    d = np.dtype(dt)
    if mode == "bits":
        return x.view(d)
    if x.dtype.kind == "f" and d.kind in "iu":  # saturating like llvm.fptosi.sat
        r = {"rint": np.rint, "floor": np.floor, "ceil": np.ceil}.get(mode, np.trunc)(x)
        info = np.iinfo(d)
        r = np.where(np.isnan(r), 0, np.clip(r, info.min, info.max))
        return r.astype(d)
    if d.kind == "b":
        return x != 0
    return x.astype(d)


class Memory:
    """Buffer name -> numpy array; on-chip buffers are created on first use."""

    def __init__(self, arrays: dict):
        self.arrays = dict(arrays)

    def arr(self, buf: isa.Buffer) -> np.ndarray:
        if buf.name not in self.arrays:
            self.arrays[buf.name] = np.zeros(buf.size, dtype=buf.dtype)
        return self.arrays[buf.name]

    def get(self, ref: isa.Ref, n: int, env: dict) -> np.ndarray:
        o = _ieval(ref.off, env)
        return self.arr(ref.buf)[o : o + n]

    def put(self, ref: isa.Ref, n: int, env: dict, val) -> None:
        o = _ieval(ref.off, env)
        a = self.arr(ref.buf)
        a[o : o + n] = np.asarray(val).astype(a.dtype, copy=False)


def _wide(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float32) if x.dtype == np.float16 else x


def run_instrs(body, mem: Memory, env: dict | None = None) -> None:
    """Execute vector instructions (and Loop/Let/If/GetValue) with numpy, ISA float semantics."""
    env = {} if env is None else env
    with np.errstate(all="ignore"):
        for ins in body:
            if isinstance(ins, isa.Loop):
                start, stop, step = (_ieval(v, env) for v in (ins.start, ins.stop, ins.step))
                for v in range(start, stop, step):
                    run_instrs(ins.body, mem, {**env, ins.var: v})
                continue
            if isinstance(ins, isa.Let):
                env[ins.var] = _ieval(ins.value, env)
                continue
            if isinstance(ins, isa.If):
                if isa.CMP_OPS[ins.cmp](_ieval(ins.a, env), _ieval(ins.b, env)):
                    run_instrs(ins.body, mem, env)
                continue
            if isinstance(ins, vmath.GetValue):
                env[ins.var] = int(mem.get(ins.src, 1, env)[0])
                continue
            if isinstance(ins, (isa.SetFlag, isa.WaitFlag)):
                continue
            if isinstance(ins, isa.VReduce):  # single row: dst[0] = op(dst[0], reduce(src))
                n = _ieval(ins.n, env)
                src, acc = _wide(mem.get(ins.src, n, env)), mem.get(ins.dst, 1, env)
                red = {"vcmax": np.max, "vcmin": np.min, "vcadd": np.sum}[ins.op]
                both = np.concatenate([acc.astype(src.dtype), src])
                mem.put(ins.dst, 1, env, [red(both)])
                continue
            n = _ieval(ins.n, env)
            g = lambda r, n=n: _wide(mem.get(r, n, env))  # noqa: E731
            if isinstance(ins, isa.VBinary):
                out = _BIN[ins.op](g(ins.a), g(ins.b))
            elif isinstance(ins, isa.VScalar):
                x = g(ins.src)
                if ins.op in ("vshl", "vshr"):
                    out = (x << ins.scalar) if ins.op == "vshl" else (x >> ins.scalar)
                else:
                    op = {"vadds": np.add, "vmuls": np.multiply, "vmaxs": np.maximum,
                          "vmins": np.minimum}[ins.op]  # fmt: skip
                    out = op(x, np.asarray(ins.scalar, dtype=x.dtype))
            elif isinstance(ins, isa.VUnary):
                x = g(ins.src)
                if ins.op in ("vexp", "vln"):
                    dt = "float64" if x.dtype == np.float64 else "float32"
                    out = jit_native(ins.op, dt)(x.astype(dt))
                else:
                    out = _UNARY[ins.op](x)
            elif isinstance(ins, isa.VFma):
                a = g(ins.a)
                out = _fma_jit("float64" if a.dtype == np.float64 else "float32")(
                    a, g(ins.b), g(ins.c)
                )
            elif isinstance(ins, isa.VConv):
                x = mem.get(ins.src, n, env)
                out = _conv(x, ins.dst.buf.dtype, ins.mode)
            elif isinstance(ins, isa.VCmp):
                out = _CMP[ins.cmp](g(ins.a), g(ins.b))
            elif isinstance(ins, isa.VCmpS):
                x = g(ins.src)
                out = _CMP[ins.cmp](x, np.asarray(ins.scalar, dtype=x.dtype))
            elif isinstance(ins, isa.VSel):
                out = np.where(mem.get(ins.mask, n, env) != 0, g(ins.a), g(ins.b))
            elif isinstance(ins, isa.VDup):
                out = np.full(n, ins.scalar, dtype=ins.dst.buf.dtype)
            elif isinstance(ins, isa.VGather):
                idx = mem.get(ins.idx, n, env).astype(np.int64)
                tab = mem.arr(ins.table.buf)
                out = tab[_ieval(ins.table.off, env) + idx]
            else:
                raise NotImplementedError(type(ins).__name__)
            mem.put(ins.dst, n, env, out)


def run_composite(op: str, *xs: np.ndarray, cap: int | None = None, dtype: str | None = None):
    """Emit `op` for arrays xs with vmath.emit_composite and evaluate it with numpy."""
    dtype = dtype or str(xs[0].dtype)
    n = xs[0].size
    cap = cap or max(n, 1)
    b = isa.Builder(tile=cap)
    ins = [isa.Buffer(f"in{i}", "UB", dtype, cap) for i in range(len(xs))]
    out = isa.Buffer("out", "UB", dtype, cap)
    nv = isa.Var("n")
    vmath.emit_composite(b, op, isa.Ref(out), tuple(isa.Ref(r) for r in ins), nv, dtype, cap=cap)
    res = np.empty(n, dtype=dtype)
    for s in range(0, n, cap):
        m = min(cap, n - s)
        mem = Memory({f"in{i}": np.resize(x[s : s + m].astype(dtype), cap) for i, x in
                      enumerate(xs)})  # fmt: skip
        mem.arrays["out"] = np.zeros(cap, dtype=dtype)
        run_instrs(b.body, mem, {nv: m})
        res[s : s + m] = mem.arrays["out"][:m]
    return res
