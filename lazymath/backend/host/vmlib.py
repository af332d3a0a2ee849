"""The vector math runtime library: vmath composites as out-of-line vector subroutines.

    addr = vmlib.address("lazymath_vm_sin_float32")   # loads (disk) or compiles it once

One C function per (op, dtype) and host target a kernel calls (`vmath.VMathCall` lowers to a
call; a forced LAZYMATH_TARGET_CPU adds ``.<cpu>`` to the name, `vmath.call_symbol`)::

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

import ctypes
import os
import threading
from concurrent.futures import Future

from lazymath import settings
from lazymath.backend.host.lower_llvm import I64, PTR, LowerCtx, _names_in
from lazymath.backend.native import elfload, host, jit, kernel_cache, tiering, workers
from lazymath.backend.npu import isa, vmath

PREFIX = "lazymath_vm_"
CELL_PREFIX = "lazymath_vmp_"
# == vmath.COMPOSITE_OPS / vmath._F64_OPS (a test checks): the plan below runs on the warm path,
# which must not import vmath (llvmlite.ir and the interpreter/cost tables)
CALL_OPS = ("sin", "cos", "tan", "tanh", "sigmoid", "exp2", "pow", "floor_divide", "remainder",
            "log1p", "expm1", "log2", "log10", "sinh", "cosh", "asinh", "acosh", "atanh", "hypot",
            "logaddexp", "asin", "acos", "atan", "atan2", "erf", "erfc")  # fmt: skip
HOST_ONLY: tuple = ()  # == vmath.HOST_ONLY: the host libm, never called
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
            if o.op in CALL_OPS and o.dtype in _FLOATS and o.op not in HOST_ONLY:
                if o.dtype != "float64" or o.op in F64_OPS:
                    out.append(o.op)
    return out


def call_mode_setting() -> str:
    """LAZYMATH_VMATH_CALLS: auto (the rule of `call_plan`), always (every composite is a
    library call), never (every composite inlined)."""
    return settings.VMATH_CALLS.get()


def call_plan(ir, setting: str | None = None) -> tuple[bool, str]:
    """(call the library?, reason), the reason labelled when LAZYMATH_HOST_MATH lowers the
    kernel's sin/cos/tan with the host-only float64 reduction (`_call_plan`)."""
    calls, why = _call_plan(ir, setting)

    if why and vmath.host_math_enabled() and {"sin", "cos", "tan"} & set(_composites_in(ir)):
        why += ("; sin/cos/tan reduce in float64 (LAZYMATH_HOST_MATH=1: a faster host-only "
                "lowering, not what an NPU can run)")  # fmt: skip
    return calls, why


def _call_plan(ir, setting: str | None = None) -> tuple[bool, str]:
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
_published: set[str] = set()  # names llvm.add_symbol knows
_stats = {"compiled": 0, "disk_hits": 0}


def parse_symbol(symbol: str) -> tuple[str, str] | None:
    """(op, dtype) of a library symbol, or None."""
    parts = _split(symbol)
    return None if parts is None else parts[:2]


def _split(symbol: str) -> tuple[str, str, str] | None:
    """(op, dtype, target) of a library symbol (target "" = native, see
    `vmath.call_symbol`), or None."""
    if not symbol.startswith(PREFIX):
        return None
    base, dot, target = symbol[len(PREFIX) :].partition(".")
    op, _, dtype = base.rpartition("_")
    if op not in CALL_OPS or dtype not in _FLOATS:
        return None
    if dot and not (target and all(c.isalnum() or c in "-_" for c in target)):
        return None
    return op, dtype, target


def program(op: str, dtype: str) -> isa.Program:
    """The subroutine as an ISA program in the kernel calling convention: args[0] = dst,
    args[1..] = sources, BLOCK_IDX = n (the wrapper built by `library_ir` passes it)."""

    arity = vmath._ARITY.get(op, 1)
    dst = isa.Buffer("dst", "GM", dtype, 0, arg=0)
    srcs = tuple(isa.Buffer(f"src{k}", "GM", dtype, 0, arg=1 + k) for k in range(arity))
    call = vmath.VMathCall(op, dtype, isa.Ref(dst), tuple(isa.Ref(s) for s in srcs), isa.BLOCK_IDX)
    body, bufs = vmath.expand_call(call, prefix="s")
    return isa.Program(f"vm_{op}_{dtype}", (dst, *srcs), tuple(bufs), tuple(body), 1, 1)


def _constant_buffers(prog: isa.Program) -> tuple[dict, list]:
    """The composite's coefficient chunks and gather tables: buffers that only the constant
    vector_dups before the chunk loop write. Returns ({name: [(offset, n, value)]}, rest of
    the body). A kernel that inlines the composite fills them once (hoisted out of its tile
    loop); the subroutine would fill them on every call, so they become constant data."""

    pre = []
    k = 0
    while k < len(prog.body) and isinstance(prog.body[k], isa.VDup):
        pre.append(prog.body[k])
        k += 1
    rest = list(prog.body[k:])
    written = set()
    for instr, _ in isa.walk(rest):
        for f in ("dst", "out"):
            r = getattr(instr, f, None)
            if isinstance(r, isa.Ref):
                written.add(r.buf.name)
    fills: dict = {}
    for i in pre:
        ok = (isinstance(i.scalar, (int, float)) and isinstance(i.n, int)
              and isinstance(i.dst.off, int) and i.dst.buf.scope == "UB")  # fmt: skip
        if not ok or i.dst.buf.name in written:
            return {}, list(prog.body)
        fills.setdefault(i.dst.buf.name, []).append((i.dst.off, i.n, i.scalar))
    used = _names_in(rest)
    return {n: v for n, v in fills.items() if used[n]}, rest


def library_ir(op: str, dtype: str) -> str:
    """LLVM IR text of the library function for (op, dtype) on the host target in force: the
    program lowered like a kernel (its coefficient chunks and tables as constant data), inside
    a C-callable wrapper."""
    import numpy as np
    from llvmlite import ir

    symbol = vmath.call_symbol(op, dtype)
    impl = f"{symbol}.body"
    prog = program(op, dtype)
    consts, body_instrs = _constant_buffers(prog)
    ctx = LowerCtx(prog, None, None, impl)
    b = ctx.builder
    for buf in prog.args:
        slot = b.gep(ctx.func.args[2], [ir.Constant(I64, buf.arg)], source_etype=PTR)
        ctx.base[buf.name] = b.load(slot, typ=PTR, name=f"{buf.name}.base")
    for buf in prog.buffers:
        st = ctx.storage_type(buf.dtype)
        t = ir.ArrayType(st, max(buf.size, 1))
        if buf.name in consts:
            vals = np.zeros(max(buf.size, 1), dtype=buf.dtype)
            for off, n, v in consts[buf.name]:
                vals[off : off + n] = v  # numpy rounds like the lowering's constants
            g = ir.GlobalVariable(ctx.module, t, name=f"{symbol}.{buf.name}")
            g.linkage = "internal"
            g.global_constant = True
            g.align = 64
            g.initializer = _array_constant(t, st, vals)
            ctx.base[buf.name] = g
            continue
        if buf.name not in ctx.global_refs:
            continue  # a constant chunk nothing reads
        a = b.alloca(t, name=buf.name)
        a.type = PTR
        a.align = 64
        ctx.base[buf.name] = a
    ctx.lower_body(body_instrs)
    b.ret_void()
    mod = ctx.module
    fnbody = mod.get_global(impl)
    fnbody.linkage = "internal"
    fnbody.attributes.add("alwaysinline")
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [PTR, PTR, PTR, I64]), name=symbol)
    fn.attributes.add("nounwind")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    argv = b.alloca(ir.ArrayType(PTR, 3), name="argv")
    for k in range(3):
        b.store(fn.args[k], b.gep(argv, [ir.Constant(I64, 0), ir.Constant(ir.IntType(32), k)]))
    b.call(fnbody, [fn.args[3], ir.Constant(I64, 1), b.bitcast(argv, PTR)])
    b.ret_void()
    return str(mod)


def _array_constant(t, st, vals):
    """`ir.Constant(t, [ir.Constant(st, v) for v in vals])` printed the same, with each
    distinct value formatted once (coefficient chunks repeat one value per chunk: llvmlite's
    per-element float formatting was most of the library's IR printing time)."""
    from llvmlite import ir

    conv = float if vals.dtype.kind == "f" else int
    memo: dict = {}  # by bit pattern (-0.0 == 0.0 as floats)
    items = []
    for v, bits in zip(vals.tolist(), vals.view(f"u{vals.dtype.itemsize}").tolist()):
        text = memo.get(bits)
        if text is None:
            c = ir.Constant(st, conv(v))
            text = memo[bits] = f"{c.type} {c.get_reference()}"
        items.append(text)
    return ir.FormattedConstant(t, "[" + ", ".join(items) + "]")


def _disk_key(op: str, dtype: str, target: str) -> str:
    return kernel_cache.disk_key(repr(("vmlib", op, dtype)), jit.host_key(target))


class _Fn:
    """One library function in this process: its pointer cell and the code it points to."""

    def __init__(self, symbol: str, op: str, dtype: str, target: str = "") -> None:
        self.symbol, self.op, self.dtype, self.target = symbol, op, dtype, target
        self.key = _disk_key(op, dtype, target)
        self.module = f"lmvm_{self.key[:24]}"
        self.cell = ctypes.c_void_p(0)  # the address kernels call through (never freed)
        self.cell_address = ctypes.addressof(self.cell)
        self.tier = -1  # -1 no code yet, 0 quick code, 2 optimized
        self.addr = 0
        self.ready = threading.Event()
        self.error: BaseException | None = None

    def link(self, obj: bytes | None, tier: int, symbol: str, module: str,
             addr: int = 0) -> None:  # fmt: skip
        """Load `obj` (or take `addr`) and point the cell at it, unless better code is in."""
        if obj is not None:
            addr, _how = jit.load_cached(obj, symbol, module)
        with _cell_lock:
            if tier > self.tier:
                self.tier, self.addr = tier, addr
                self.cell.value = addr
        self.ready.set()


_fns: dict[str, _Fn] = {}
_cell_lock = threading.Lock()  # never held while taking another lock


def cell_symbol(symbol: str) -> str:
    """The data symbol kernels load the function's address from (see `_Fn`)."""
    return CELL_PREFIX + symbol[len(PREFIX) :]


def resolve(name: str) -> int | None:
    """Address of a library symbol for the loaders (elfload, MCJIT): a function's pointer cell
    (``lazymath_vmp_*``, created on first use; `request` fills it) or a function itself."""
    if name.startswith(CELL_PREFIX):
        symbol = PREFIX + name[len(CELL_PREFIX) :]
        if parse_symbol(symbol) is None:
            return None
        fn = _request(symbol)
        publish(name, fn.cell_address)
        return fn.cell_address
    if parse_symbol(name) is None:
        return None
    return address(name)


jit.register_library("lazymath_vm", resolve)  # PREFIX and CELL_PREFIX


def address(symbol: str) -> int | None:
    """Address of library function `symbol` (None if it is not one), waiting for its code:
    loaded from the disk cache, or compiled on the compile workers (quick code first when
    tiered compilation is on, the optimized code replaces it and goes to the disk cache)."""
    if parse_symbol(symbol) is None:
        return None
    fn = _request(symbol)
    fn.ready.wait()
    if fn.tier < 0:
        raise fn.error or RuntimeError(f"vector math library function {symbol} failed")
    return fn.addr


def request(symbols) -> None:
    """Start loading (or compiling) library functions without waiting (`address` waits)."""
    for s in symbols:
        if parse_symbol(s) is not None:
            _request(s)


def _request(symbol: str) -> _Fn:
    with _lock:
        fn = _fns.get(symbol)
        if fn is not None:
            return fn
        fn = _orphans.pop(symbol, None)  # keeps its cell: kernels may already point at it
        if fn is None:
            fn = _Fn(symbol, *_split(symbol))
        _fns[symbol] = fn
    try:
        addr = _load(fn)
        if addr is not None:
            fn.link(None, 2, symbol, fn.module, addr)
            return fn
        _compile(fn)
    except BaseException as e:
        fn.error = e
        fn.ready.set()
        with _lock:
            _fns.pop(symbol, None)  # a later request tries again
        raise
    return fn


def _compile(fn: _Fn) -> None:
    for_target(fn.target, _compile_here, fn)


def for_target(target: str | None, work, *args) -> None:
    """Run `work(*args)` with `target` (an LLVM CPU name; None: the host's) in force. A library
    function of another target than the one in force (requested by a kernel of that target
    being linked, e.g. its tier-up finishing after a switch) is generated for its own; vmlib
    and uklib both compile through here."""
    if host.requested() == target:
        work(*args)
        return
    with settings.override(LAZYMATH_TARGET_CPU=target or "native"):
        work(*args)


def _compile_here(fn: _Fn) -> None:
    text = library_ir(fn.op, fn.dtype)
    if tiering.tiered_setting():
        sym0 = f"{fn.symbol}_t0"
        quick = workers.submit(text.replace(f'@"{fn.symbol}"', f'@"{sym0}"'),
                               f"{fn.module}_t0", 0, codegen=0)  # fmt: skip
        quick.add_done_callback(lambda f: _linked(fn, f, 0, sym0, f"{fn.module}_t0"))
    tiering.started()
    final = workers.submit(text, fn.module, 3, background=tiering.tiered_setting())
    tiering.watch_background(final, lambda: workers.submit(text, fn.module, 3, vectorize=False,
                                                          background=tiering.tiered_setting()),
                             lambda f: _linked(fn, f, 2, fn.symbol, fn.module),
                             f"vector math library function {fn.symbol}")  # fmt: skip


def _linked(fn: _Fn, fut: Future, tier: int, symbol: str, module: str) -> None:
    """A compile finished (on a worker thread): link the code, point the cell at it; the
    optimized code also goes to the disk cache."""
    try:
        obj = fut.result()
        fn.link(obj, tier, symbol, module)
        if tier == 2:
            _stats["compiled"] += 1
            kernel_cache.disk_store(fn.key, {"symbol": fn.symbol, "kind": "vmlib",
                                             "name": fn.symbol}, obj)  # fmt: skip
    except BaseException as e:  # noqa: BLE001 - whoever waits for the function gets it
        if fn.tier < 0:
            fn.error = e
            fn.ready.set()
        else:
            import warnings

            warnings.warn(f"lazymath: optimizing {fn.symbol} failed ({type(e).__name__}: {e}); "
                          "kernels keep calling its quickly compiled code", RuntimeWarning,
                          stacklevel=1)  # fmt: skip
    finally:
        if tier == 2:
            tiering.finished()


def _load(fn: _Fn) -> int | None:
    """The function from its disk-cache file, or None (no usable file)."""
    cached = kernel_cache.disk_load(fn.key)
    if cached is None:
        return None
    try:
        if cached.header.get("symbol") != fn.symbol:
            raise ValueError("library entry names another symbol")
        addr, _how = jit.load_cached(cached.obj, fn.symbol, fn.module)
    except (elfload.ElfLoadError, ValueError, KeyError, TypeError, RuntimeError):
        kernel_cache.reject(fn.key)
        return None
    _stats["disk_hits"] += 1
    return addr


def publish(name: str, addr: int) -> None:
    """Tell LLVM (if loaded) where `name` is, so MCJIT links kernels that use it."""
    import sys

    binding = sys.modules.get("llvmlite.binding")
    if binding is None or name in _published:
        return
    if binding.address_of_symbol(name) != addr:
        binding.add_symbol(name, addr)
    _published.add(name)


def symbols_of(program: isa.Program) -> list[str]:
    """Library symbols a program calls."""

    out = []
    for instr, _ in isa.walk(program.body):
        if isinstance(instr, vmath.VMathCall):
            s = vmath.call_symbol(instr.op, instr.dtype)
            if s not in out:
                out.append(s)
    return out


def stats() -> dict:
    return {"vmlib_compiled": _stats["compiled"], "vmlib_disk_hits": _stats["disk_hits"],
            "vmlib_loaded": len(_fns)}  # fmt: skip


_orphans: dict[str, _Fn] = {}  # a forked child's functions whose compile stayed in the parent


def _after_fork_in_child() -> None:
    """A function whose compile was running in the parent at fork time never gets its code in
    the child (the workers are gone): it is compiled again on its next request, through the
    same pointer cell. Fresh locks (they may have been held)."""
    global _lock, _cell_lock
    _lock = threading.RLock()
    _cell_lock = threading.Lock()
    for symbol, fn in list(_fns.items()):
        if fn.tier < 0:
            fn.ready = threading.Event()
            fn.error = None
            _orphans[symbol] = _fns.pop(symbol)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
