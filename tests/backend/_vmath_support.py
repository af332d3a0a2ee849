"""Test helpers for the vector math library (vmath).

- `jit_native(op, dtype)`: a standalone MCJIT loop ``y[i] = native(x[i])`` around
  `vmath.define_native`, so the LLVM bodies of vexp/vln are tested and timed on their own.
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

from lazymath.backend import vmath

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
    fn = vmath.define_native(mod, op, dtype)
    assert vmath.define_native(mod, op, dtype) is fn  # defined once per module
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
