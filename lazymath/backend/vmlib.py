"""The vector math runtime library: vmath composites as out-of-line vector subroutines.

    addr = vmlib.address("lazymath_vm_sin_float32")   # loads (disk) or compiles it once

One C function per (op, dtype) a kernel calls (`vmath.VMathCall` lowers to a call)::

    void lazymath_vm_<op>_<dtype>(T *dst, const T *src0, const T *src1, int64_t n)

It is `vmath.expand_call` of that op -- the composite strip-mined in chunks of `vmath.CHUNK`
over the first n elements -- lowered by `lower_llvm` like any program and optimized at O3
(it is compiled once per host and reused by every kernel). src1 is only read by two-operand
ops (pow, floor_divide, remainder); dst may alias a source (in-place tiles).

Caching: each function is one disk-cache entry, keyed like a kernel (host key, backend code
version), so a warm process loads it with `elfload` (no LLVM) when the first kernel that
calls it is loaded. Kernels reference the symbol by name: elfload resolves it through
`jit.runtime_symbol` (which asks `address` here), MCJIT through `llvm.add_symbol`
(`publish`, before a kernel that calls the library is added to the engine).
"""

from __future__ import annotations

import threading

from lazymath import settings
from lazymath.backend import isa, kernel_cache

PREFIX = "lazymath_vm_"
# == vmath.COMPOSITE_OPS / vmath._F64_OPS (a test checks): the plan below runs on the warm path,
# which must not import vmath (llvmlite.ir and the interpreter/cost tables)
CALL_OPS = ("sin", "cos", "tan", "tanh", "sigmoid", "exp2", "pow", "floor_divide", "remainder")
F64_OPS = ("sigmoid", "pow", "tanh")
INLINE_MAX = 2  # a kernel with at most this many composite ops inlines them (see `call_plan`)
_FLOATS = ("float16", "float32", "float64")


def _composites_in(ir) -> list[str]:
    """Composite ops vmath expands (float dtypes) in every expression of a kernel IR."""
    out = []
    for f in getattr(ir, "__dataclass_fields__", {}):
        v = getattr(ir, f)
        if not (isinstance(v, tuple) and v and hasattr(v[0], "srcs") and hasattr(v[0], "op")):
            continue
        for o in v:
            if o.op in CALL_OPS and o.dtype in _FLOATS:
                if o.dtype != "float64" or o.op in F64_OPS:
                    out.append(o.op)
    return out


def call_mode_setting() -> str:
    """LAZYMATH_VMATH_CALLS: auto (the rule of `call_plan`), always (every composite is a
    library call), never (every composite inlined)."""
    return settings.VMATH_CALLS.get()


def call_plan(ir, setting: str | None = None) -> tuple[bool, str]:
    """(call the library?, reason) for a kernel IR; the reason is empty without composites.

    The rule: inline when the kernel has at most INLINE_MAX composite ops. Such a kernel is
    short and compiles in a fraction of a second either way, and inlined constants are filled
    once per kernel (hoisted out of the tile loop) instead of once per call. With more
    composites the inlined copies make LLVM's optimizer time grow much faster than the kernel
    (each sin is dozens of blocks); calls keep compile time linear in the op count at the same
    speed per element (the subroutine runs the same fused chunk loop)."""
    ops = _composites_in(ir)
    if not ops:
        return False, ""
    setting = setting or call_mode_setting()
    counts: dict[str, int] = {}
    for o in ops:
        counts[o] = counts.get(o, 0) + 1
    what = ", ".join(f"{o} x{c}" if c > 1 else o for o, c in counts.items())
    n = len(ops)
    if setting == "always":
        return True, f"{what}: library calls (LAZYMATH_VMATH_CALLS=always)"
    if setting == "never":
        return False, f"{what}: inlined (LAZYMATH_VMATH_CALLS=never)"
    if n <= INLINE_MAX:
        return False, (f"{what}: inlined ({n} math op{'s' if n > 1 else ''} <= {INLINE_MAX}: "
                       "a short kernel compiles fast either way)")  # fmt: skip
    return True, (f"{what}: library calls ({n} math ops > {INLINE_MAX}: one call per op "
                  "keeps compile time linear)")  # fmt: skip


_lock = threading.RLock()
_loaded: dict[str, int] = {}  # symbol -> address
_published: set[str] = set()  # symbols llvm.add_symbol knows
_stats = {"compiled": 0, "disk_hits": 0}


def parse_symbol(symbol: str) -> tuple[str, str] | None:
    """(op, dtype) of a library symbol, or None."""
    if not symbol.startswith(PREFIX):
        return None
    op, _, dtype = symbol[len(PREFIX) :].rpartition("_")
    if op not in CALL_OPS or dtype not in _FLOATS:
        return None
    return op, dtype


def program(op: str, dtype: str) -> isa.Program:
    from lazymath.backend import vmath

    """The subroutine as an ISA program in the kernel calling convention: args[0] = dst,
    args[1..] = sources, BLOCK_IDX = n (the wrapper built by `library_ir` passes it)."""
    arity = vmath._ARITY.get(op, 1)
    dst = isa.Buffer("dst", "GM", dtype, 0, arg=0)
    srcs = tuple(isa.Buffer(f"src{k}", "GM", dtype, 0, arg=1 + k) for k in range(arity))
    call = vmath.VMathCall(op, dtype, isa.Ref(dst), tuple(isa.Ref(s) for s in srcs), isa.BLOCK_IDX)
    body, bufs = vmath.expand_call(call, prefix="s")
    return isa.Program(f"vm_{op}_{dtype}", (dst, *srcs), tuple(bufs), tuple(body), 1, 1)


def library_ir(op: str, dtype: str) -> str:
    """LLVM IR text of the library function for (op, dtype)."""
    from llvmlite import ir

    from lazymath.backend import vmath
    from lazymath.backend.lower_llvm import I64, PTR, lower_program

    symbol = vmath.call_symbol(op, dtype)
    impl = f"{symbol}.body"
    mod = lower_program(program(op, dtype), symbol=impl)
    body = mod.get_global(impl)
    body.linkage = "internal"
    body.attributes.add("alwaysinline")
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [PTR, PTR, PTR, I64]), name=symbol)
    fn.attributes.add("nounwind")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    argv = b.alloca(ir.ArrayType(PTR, 3), name="argv")
    for k in range(3):
        b.store(fn.args[k], b.gep(argv, [ir.Constant(I64, 0), ir.Constant(ir.IntType(32), k)]))
    b.call(body, [fn.args[3], ir.Constant(I64, 1), b.bitcast(argv, PTR)])
    b.ret_void()
    return str(mod)


def _disk_key(op: str, dtype: str) -> str:
    from lazymath.backend.jit import host_key

    return kernel_cache.disk_key(repr(("vmlib", op, dtype)), host_key())


def address(symbol: str) -> int | None:
    """Address of library function `symbol` (None if it is not one): loaded from the disk
    cache, or compiled (O3) and stored there, once per process."""
    hit = _loaded.get(symbol)
    if hit is not None:
        return hit
    parsed = parse_symbol(symbol)
    if parsed is None:
        return None
    with _lock:
        hit = _loaded.get(symbol)
        if hit is not None:
            return hit
        addr = _load_or_compile(symbol, *parsed)
        _loaded[symbol] = addr
    publish(symbol)
    return addr


def _load_or_compile(symbol: str, op: str, dtype: str) -> int:
    from lazymath.backend import elfload, jit

    key = _disk_key(op, dtype)
    module_name = f"lmvm_{key[:24]}"
    cached = kernel_cache.disk_load(key)
    if cached is not None:
        try:
            if cached.header.get("symbol") != symbol:
                raise ValueError("library entry names another symbol")
            addr, _how = jit.load_cached(cached.obj, symbol, module_name)
        except (elfload.ElfLoadError, ValueError, KeyError, TypeError, RuntimeError):
            kernel_cache.reject(key)
        else:
            _stats["disk_hits"] += 1
            return addr
    text = library_ir(op, dtype)
    addr, obj = jit.get_jit().compile(text, symbol, module_name, False)
    _stats["compiled"] += 1
    if obj is not None:
        kernel_cache.disk_store(key, {"symbol": symbol, "kind": "vmlib", "name": symbol}, obj)
    return addr


def publish(symbol: str) -> None:
    """Tell LLVM (if loaded) where `symbol` is, so MCJIT links kernels that call it."""
    import sys

    binding = sys.modules.get("llvmlite.binding")
    if binding is None or symbol in _published:
        return
    addr = _loaded.get(symbol)
    if addr is None:
        return
    if binding.address_of_symbol(symbol) != addr:
        binding.add_symbol(symbol, addr)
    _published.add(symbol)


def symbols_of(program: isa.Program) -> list[str]:
    """Library symbols a program calls."""
    from lazymath.backend import vmath

    out = []
    for instr, _ in isa.walk(program.body):
        if isinstance(instr, vmath.VMathCall):
            s = vmath.call_symbol(instr.op, instr.dtype)
            if s not in out:
                out.append(s)
    return out


def ensure(program: isa.Program) -> None:
    """Load (or compile) every library function `program` calls and publish it to LLVM."""
    for s in symbols_of(program):
        address(s)
        publish(s)


def stats() -> dict:
    return {"vmlib_compiled": _stats["compiled"], "vmlib_disk_hits": _stats["disk_hits"],
            "vmlib_loaded": len(_loaded)}  # fmt: skip
