"""Native code for kernels: one MCJIT engine per process, and loading cached object code.

Two ways code gets into the process:

- `Jit` (one MCJIT engine, `get_jit()`): LLVM IR text -> O3 -> native code, used on a kernel
  cache miss. Its object cache hook hands `kernel_cache` the object code MCJIT emitted, to
  persist on disk.
- `load_cached(obj, symbol, module_name)`: object code from the disk cache. By default it goes
  through `elfload`, a small ELF relocatable-object loader, so a warm process whose kernels are
  all cached never imports ``llvmlite.binding`` (~40 MiB of RSS for LLVM's relocated C++ data,
  plus the engine). ``LAZYMATH_ELFLOAD=0`` sends it through MCJIT instead (debugging), and an
  object the loader does not support (`ElfUnsupportedError`) falls back to MCJIT; a malformed
  one (`ElfFormatError`) is reported to the caller, which recompiles and never executes it.
  Off Linux x86-64 (other object formats) cached objects go to MCJIT as before.

Why keep MCJIT for fresh kernels: a miss has LLVM loaded anyway, MCJIT is the path LLVM tests,
and the assembly/IR views need the same engine. Freshly compiled and cached kernels run the same
bytes (the object MCJIT emitted is what is stored).

Why one engine: MCJIT engines are heavy (a target machine, a memory manager) and every kernel
of the process can live in the same one; symbols are unique per kernel signature. Native code
is produced at O3 for the host CPU name and features, with the new pass manager's loop and SLP
vectorizers on. The engine's object cache hooks also fire for its empty backing module, so
objects are keyed by module name and unknown names are ignored.

Everything touching the engine is serialised by one lock: MCJIT is not thread safe. Compiled
functions are plain C function pointers; calling them through ctypes releases the GIL.

`host_key()` -- what native code depends on besides the kernel -- is computed without LLVM: the
llvmlite version and its shared library's size (which pin the LLVM build), the CPU model and
flags from /proc/cpuinfo (which determine LLVM's host CPU name and features) and the core count
(templates size their block split by it), plus the effective target (`host.target().key`:
``LAZYMATH_TARGET_CPU`` or native).
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
import threading
import weakref
from collections.abc import Callable

import llvmlite  # the package only: its version, no LLVM shared library

from lazymath import settings
from lazymath._lazy import deferred
from lazymath.backend.native import host
from lazymath.backend.npu import cancel

# The loader of object code: not imported by the compile server (isolate), which only compiles
# (its boot waits on every module it imports; elfload and dataclasses are ~9 ms of it)
elfload = deferred("lazymath.backend.native.elfload")

KERNEL_CFUNC = ctypes.CFUNCTYPE(
    None, ctypes.c_int64, ctypes.c_int64, ctypes.POINTER(ctypes.c_void_p)
)
# The same function without argtypes (`cf.raw`, set on every kernel function made here), for
# a replayed launch: called with ready ctypes int64 arguments (runtime.replay.ONE_BLOCK) it
# skips the per-call argument conversion, ~0.6 -> ~0.3 us a launch (of a 4 us lm.jit replay).
# It owns nothing: a caller keeps the kernel function itself in a local across the call (the
# code lives as long as that function object, `held_cfunc`).
_KERNEL_RAW = ctypes.CFUNCTYPE(None)

llvm = None  # llvmlite.binding, imported by the first Jit (a compile miss)


def _binding():
    global llvm
    if llvm is None:
        import llvmlite.binding as binding

        llvm = binding
    return llvm


# ----------------------------------------------------------------------------- host key

_host_keys: dict[str, tuple] = {}


def _cpu_identity() -> tuple:
    """Vendor, family, model, stepping and flags of the first CPU (Linux), else platform's
    processor string: everything LLVM's host CPU name and feature detection look at."""
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read().split("\n\n", 1)[0]
    except OSError:
        return (platform.processor(),)
    fields = {}
    for line in text.splitlines():
        k, _, v = line.partition(":")
        fields[k.strip()] = v.strip()
    keep = ("vendor_id", "cpu family", "model", "stepping", "flags", "CPU implementer",
            "CPU architecture", "CPU variant", "CPU part", "Features")  # fmt: skip
    ident = tuple((k, fields[k]) for k in keep if k in fields)
    return ident or (platform.processor(),)


def _llvm_build() -> tuple:
    """llvmlite's shared library size and mtime: a rebuilt llvmlite against another LLVM with
    the same version string still changes the key (stat only, the library is not loaded)."""
    root = os.path.dirname(llvmlite.__file__)
    for name in ("libllvmlite.so", "libllvmlite.dylib", "llvmlite.dll"):
        try:
            st = os.stat(os.path.join(root, "binding", name))
        except OSError:
            continue
        return (name, st.st_size, int(st.st_mtime))
    return ()


def host_key(name: str | None = None) -> tuple:
    """What native code depends on besides the kernel (no llvmlite.binding import), for the
    target in force or the LAZYMATH_TARGET_CPU value `name`."""
    if name is None:
        name = host.requested()
    key = _host_keys.get(name)
    if key is None:
        key = _host_keys[name] = (llvmlite.__version__, _llvm_build(), sys.platform,
                                  platform.machine(), _cpu_identity(), os.cpu_count(),
                                  host.target(name).key)  # fmt: skip
    return key


# ----------------------------------------------------------------------------- runtime symbols
# Data the kernels link against that lives in this process rather than in a library. The GEMM
# workspace key is created here (gemm._register_ws_key asks `runtime_symbol` for it): one
# pthread key in malloc'ed memory whose destructor frees each thread's workspace. It is created
# without LLVM and registered with LLVM when the Jit loads it, so MCJIT code, code loaded by
# elfload and gemm all share one key.

WS_KEY_SYMBOL = "lazymath_gemm_ws_key"  # == gemm.WS_KEY_SYMBOL (a test checks it)


def _make_ws_key() -> int:
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    addr = libc.malloc(ctypes.sizeof(ctypes.c_uint))
    if not addr:
        raise MemoryError("malloc failed for the GEMM workspace key")
    key = ctypes.c_uint.from_address(addr)
    free = ctypes.cast(libc.free, ctypes.c_void_p)
    if libc.pthread_key_create(ctypes.byref(key), free) != 0:
        raise OSError("pthread_key_create failed: no per-thread GEMM workspace")
    return addr


# The cancel flag kernels poll in their tile loops (lower_llvm.LowerCtx.cancelled), shared with
# the interpreter and set by the engine on Ctrl-C (`backend.npu.cancel`).
CANCEL_SYMBOL = cancel.CANCEL_SYMBOL
CANCEL = cancel.CANCEL

# float16 <-> float32/float64 conversions on targets without F16C (LAZYMATH_TARGET_CPU=x86-64,
# or a VM whose CPU model hides AVX): LLVM lowers `fpext half`/`fptrunc ... to half` to these
# compiler-runtime calls, which the Python process does not export. GCC's runtime library
# (libgcc_s, present wherever glibc is: it implements pthread cancellation) defines them with
# the ABI LLVM calls (half in an XMM register, GCC >= 12). Without them MCJIT called address 0
# (a segfault) and elfload refused the object.
HALF_LIBCALLS = ("__extendhfsf2", "__truncsfhf2", "__truncdfhf2")


def _libgcc_symbol(name: str) -> int:
    try:
        lib = ctypes.CDLL("libgcc_s.so.1")
    except OSError as e:
        raise OSError(
            f"float16 on this target needs {name} from libgcc_s.so.1, which is not loadable "
            f"({e}); install libgcc (e.g. apt install libgcc-s1) or use a target with F16C"
        ) from None
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


RUNTIME_SYMBOLS = {WS_KEY_SYMBOL: _make_ws_key,
                   CANCEL_SYMBOL: lambda: ctypes.addressof(CANCEL),
                   **{n: (lambda n=n: _libgcc_symbol(n)) for n in HALF_LIBCALLS}}  # fmt: skip
_runtime: dict[str, int] = {}
_runtime_lock = threading.Lock()
# Libraries compiled through this JIT that kernels link against, by symbol prefix: vmlib
# (``lazymath_vm*``, the vector math functions and their pointer cells) and uklib
# (``lazymath_uk_*``, the GEMM microkernels of tier-0 matmul kernels) register their resolver
# when imported (the compile driver imports both), so the JIT does not import its own clients.
LIBRARIES: dict[str, Callable[[str], int | None]] = {}


def register_library(prefix: str, resolve: Callable[[str], int | None]) -> None:
    """Route the symbols starting with `prefix` to `resolve` (None: not one of its symbols)."""
    LIBRARIES[prefix] = resolve


def runtime_symbol(name: str) -> int | None:
    """Address of a process-local symbol kernels reference (None if `name` is not one): a
    registered library's (`LIBRARIES`), the one LLVM knows if it is loaded and has it, else
    ours (created on first use)."""
    for prefix, resolve in LIBRARIES.items():
        if name.startswith(prefix):
            return resolve(name)
    with _runtime_lock:
        addr = _runtime.get(name)
        if addr:
            return addr
        binding = None
        if "llvmlite.binding" in sys.modules:
            # a compile worker may be importing it right now: its module is in sys.modules
            # before it is complete; the import statement waits for the import to finish
            binding = _binding()
            addr = binding.address_of_symbol(name)
        if not addr:
            maker = RUNTIME_SYMBOLS.get(name)
            if maker is None:
                return None
            addr = maker()
            if binding is not None:
                binding.add_symbol(name, addr)
        _runtime[name] = addr
        return addr


def _publish_runtime_symbols() -> None:
    """Make every runtime symbol known to LLVM (called when the Jit loads LLVM)."""
    binding = _binding()
    for name in RUNTIME_SYMBOLS:
        addr = runtime_symbol(name)
        if addr and binding.address_of_symbol(name) != addr:
            binding.add_symbol(name, addr)


# ----------------------------------------------------------------------------- loaded code

_native_lock = threading.RLock()
_native: dict[str, tuple[int, bytes | None]] = {}  # symbol -> (address, object code)
_elf_objects: list[elfload.LoadedObject] = []  # code mapped by elfload (until released)
# Code lifetime: every CompiledKernel holding a symbol's address counts as a user
# (`retain`/`release`); when the last one is gone (evicted from the kernel and program caches,
# lm.clear_cache()) the code is freed: elfload's mapping unmapped, MCJIT's module removed from
# the engine (its IR freed). Nothing else calls kernel code by address.
_users: dict[str, int] = {}
_free: dict[str, object] = {}  # symbol -> callable that frees its code


def retain(symbol: str) -> None:
    with _native_lock:
        _users[symbol] = _users.get(symbol, 0) + 1


def release(symbol: str) -> None:
    """One user of `symbol`'s code is gone; the last one frees it."""
    with _native_lock:
        n = _users.get(symbol, 0) - 1
        if n > 0:
            _users[symbol] = n
            return
        _users.pop(symbol, None)
        free = _free.pop(symbol, None)
        if free is None:
            return
        _native.pop(symbol, None)
        try:
            free()
        except Exception:  # noqa: BLE001 - interpreter shutdown: the process frees it anyway
            pass


def _unmap(lo: elfload.LoadedObject) -> None:
    try:
        _elf_objects.remove(lo)
    except ValueError:
        pass
    elfload._munmap(lo.base, lo.size)


def loaded_code() -> dict:
    """Symbols with loaded code and how many kernels use each (tests, cache_info)."""
    with _native_lock:
        return {"symbols": len(_native), "elf_objects": len(_elf_objects),
                "elf_bytes": sum(lo.size for lo in _elf_objects)}  # fmt: skip


# elfload understands x86-64 ELF only; elsewhere MCJIT emits objects it must not judge
ELF_HOST = sys.platform.startswith("linux") and platform.machine().lower() in ("x86_64", "amd64")


def elfload_enabled() -> bool:
    """elfload for disk-cache hits (``LAZYMATH_ELFLOAD=0`` forces MCJIT, for debugging)."""
    if not ELF_HOST:
        return False
    return settings.ELFLOAD.get()


def loaded_address(symbol: str) -> int | None:
    with _native_lock:
        hit = _native.get(symbol)
        return hit[0] if hit else None


def load_cached(obj: bytes, symbol: str, module_name: str,
                hold: bool = False) -> tuple[int, str]:  # fmt: skip
    """Load cached object code; returns (address of `symbol`, "elf" | "mcjit" | "memory").
    `hold`: count one user of the code (`retain`) under the same lock, so it cannot be freed
    between loading and use; the caller hands it to `held_cfunc`.

    Raises elfload.ElfFormatError for bytes that are not a sane object defining `symbol`, or
    that need a symbol nobody defines (never executed, and never handed to MCJIT, which would
    abort the process on it), and whatever MCJIT raises on the fallback path.
    """
    with _native_lock:
        out = _load_cached(obj, symbol, module_name)
        if hold:
            retain(symbol)
        return out


def held_cfunc(addr: int, symbol: str):
    """The kernel function at `addr`, owning one user of `symbol`'s code (taken by the caller,
    see `load_cached(hold=True)`): released exactly once, when the function object is gone --
    every kernel sharing it dropped and no launch running on it (a call holds a reference)."""
    cf = as_cfunc(addr)
    weakref.finalize(cf, release, symbol).atexit = False  # at exit the process frees it all
    return cf


def _load_cached(obj: bytes, symbol: str, module_name: str) -> tuple[int, str]:
    with _native_lock:
        hit = _native.get(symbol)
        if hit is not None:
            return hit[0], "memory"
        if not ELF_HOST:  # Mach-O / COFF / other ELF machines: MCJIT as before
            return get_jit().load_object(obj, symbol, module_name), "mcjit"
        parsed = elfload.validate(obj, symbol)
        if elfload_enabled():
            try:
                lo = elfload.load(obj, resolve=runtime_symbol, entry=symbol)
            except elfload.ElfUnsupportedError:
                pass  # MCJIT below (after the symbol check)
            else:
                _elf_objects.append(lo)
                addr = lo.address(symbol)
                _native[symbol] = (addr, obj)
                _free[symbol] = lambda lo=lo: _unmap(lo)
                return addr, "elf"
        jit = get_jit()
        binding = _binding()
        for name in elfload.undefined_names(parsed):
            if not (runtime_symbol(name) or elfload.process_symbol(name)
                    or binding.address_of_symbol(name)):  # fmt: skip
                raise elfload.ElfFormatError(f"undefined symbol {name!r} is defined nowhere")
        return jit.load_object(obj, symbol, module_name), "mcjit"


# The quick (speed level 1) pipeline of tiny kernels runs no LoopUnrollPass (the partial and
# runtime unrolling after vectorization; full unrolling of constant trip counts stays): it was
# ~20% of their optimization (time-passes of 10 stacked softmaxes on 64x64, one "rows" kernel
# of 73 KB IR: LoopVectorize 26%, LoopUnroll 20%), and their first call 1.11-1.26 -> 0.69-0.75 s.
# Unrolling never reorders floating point (the vectorizer's reduction order is decided before
# it): the same bits (tests/backend/test_compile_tiers.py).
QUICK_LOOP_UNROLLING = False


class Jit:
    """The process-wide MCJIT engine of one host target (use `get_jit()`)."""

    def __init__(self, target=None) -> None:
        llvm = _binding()
        self.target = target or host.target()
        _publish_runtime_symbols()
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        self.lock = _native_lock  # one lock for the engine and the table of loaded code
        self._swap_lock = threading.Lock()
        self._retired: list = []  # optimizers whose contexts hold live modules
        self.cpu_name = self.target.llvm_cpu
        self.cpu_features = self.target.llvm_features()
        target = llvm.Target.from_default_triple()
        self.target_machine = target.create_target_machine(
            cpu=self.cpu_name, features=self.cpu_features, opt=3, jit=True
        )
        self.triple = llvm.get_process_triple()
        self.data_layout = str(self.target_machine.target_data)
        backing = llvm.parse_assembly("")
        backing.triple = self.triple
        self.engine = llvm.create_mcjit_compiler(backing, self.target_machine)
        self._inject: dict[str, bytes] = {}  # module name -> object code to load instead
        self._emitted: dict[str, bytes] = {}  # module name -> object code LLVM just produced
        self.engine.set_object_cache(self._notify, self._getbuffer)
        self._optimizer = _Optimizer(self, context=None, vectorize=True)
        self._modules: list = []  # keep modules alive: their code is referenced by callers

    @property
    def host_key(self) -> tuple:
        """The module-level `host_key()` (kept as an attribute for older callers)."""
        return host_key()

    def _notify(self, module, buffer: bytes) -> None:
        self._emitted[module.name] = bytes(buffer)

    def _getbuffer(self, module):
        return self._inject.pop(module.name, None)

    def optimize(self, ir_text: str, module_name: str, quick: bool = False):
        """Parse, verify and run the O3 pipeline (speed level 1 when `quick`); returns the
        llvm ModuleRef. Guarded by the compile watchdog (`_optimize_guarded`)."""
        return self._optimize_guarded(ir_text, module_name, quick)

    def _optimize_guarded(self, ir_text: str, module_name: str, quick: bool):
        """Run the optimizer on a worker thread and wait at most LAZYMATH_COMPILE_TIMEOUT
        seconds (default 300).

        Why: LLVM 22's loop vectorizer has been seen to spin for good (deep recursion in
        vputils::isSingleScalar) on rare kernels. A C call cannot be interrupted, so on a
        timeout the stuck thread is abandoned (it keeps its optimizer: LLVM context, pass
        builders and lock), the kernel is optimized again with the vectorizers off in a fresh
        LLVM context, and later compiles use a fresh optimizer. The process keeps working; the
        abandoned thread keeps a core busy, which the warning says."""
        timeout = _compile_timeout()
        opt = self._optimizer
        if opt is None:  # dropped in a forked child (it was busy in the parent at fork time)
            with self._swap_lock:
                if self._optimizer is None:
                    self._optimizer = _Optimizer(self, context=_binding().create_context(),
                                                 vectorize=True)  # fmt: skip
                opt = self._optimizer
        mod = _run_with_timeout(lambda: opt.run(ir_text, module_name, quick), timeout)
        if mod is not _TIMED_OUT:
            return mod
        import warnings

        with self._swap_lock:
            if self._optimizer is opt:  # replace the stuck optimizer (once per hang)
                self._retired.append(opt)
                self._optimizer = _Optimizer(self, context=_binding().create_context(),
                                             vectorize=True)  # fmt: skip
        warnings.warn(
            f"lazymath: LLVM did not finish optimizing kernel {module_name} within {timeout:g} s "
            "(a known LLVM loop-vectorizer hang); compiling it again with the vectorizers off. "
            "The stuck compiler thread keeps one core busy until the process exits.",
            RuntimeWarning,
            stacklevel=3,
        )
        safe = _Optimizer(self, context=_binding().create_context(), vectorize=False)
        self._retired.append(safe)  # its context must outlive the module it makes
        mod = _run_with_timeout(lambda: safe.run(ir_text, module_name, quick), timeout)
        if mod is _TIMED_OUT:
            raise RuntimeError(
                f"lazymath: LLVM did not finish compiling kernel {module_name} within "
                f"{timeout:g} s, even with the vectorizers off (LAZYMATH_COMPILE_TIMEOUT)"
            )
        return mod

    def compile(self, ir_text: str, symbol: str, module_name: str,
                quick: bool = False) -> tuple[int, bytes | None]:  # fmt: skip
        """Compile IR text; return (address of `symbol`, object code for the disk cache).

        The optimizer runs outside the engine lock (it has its own, see `_Optimizer`), so a
        compile that hangs in LLVM cannot block loading or compiling other kernels."""
        with self.lock:
            if symbol in _native:
                return _native[symbol]
        mod = self._optimize_guarded(ir_text, module_name, quick)
        with self.lock:
            if symbol in _native:  # another thread compiled it meanwhile
                return _native[symbol]
            return self._add(mod, symbol, module_name)

    def load_object(self, obj: bytes, symbol: str, module_name: str) -> int:
        """Load cached object code (no LLVM optimisation or codegen runs)."""
        with self.lock:
            if symbol in _native:
                return _native[symbol][0]
            stub = _binding().parse_assembly("")
            stub.name = module_name
            stub.triple = self.triple
            stub.data_layout = self.data_layout
            self._inject[module_name] = obj
            try:
                addr, _ = self._add(stub, symbol, module_name, obj)
            finally:
                self._inject.pop(module_name, None)
            return addr

    def _add(self, mod, symbol: str, module_name: str,
             obj: bytes | None = None) -> tuple[int, bytes | None]:  # fmt: skip
        self.engine.add_module(mod)
        self.engine.finalize_object()
        self._modules.append(mod)
        _free[symbol] = lambda mod=mod: self._remove(mod)
        addr = self.engine.get_function_address(symbol)
        if not addr:
            raise RuntimeError(f"JIT: symbol {symbol} not found after loading {module_name}")
        emitted = self._emitted.pop(module_name, None)
        obj = emitted if emitted is not None else obj
        with _native_lock:
            _native[symbol] = (addr, obj)
        return addr, obj

    def _remove(self, mod) -> None:
        """Take a released kernel's module out of the engine (its IR is freed with it)."""
        with self.lock:
            try:
                self._modules.remove(mod)
            except ValueError:
                return
            self.engine.remove_module(mod)

    def assembly(self, ir_text: str) -> str:
        """Host assembly of the optimized module (debug output; computed on demand)."""
        mod = self.optimize(ir_text, "asm_view")
        with self.lock:
            return self.target_machine.emit_assembly(mod)

    def optimized_ir(self, ir_text: str) -> str:
        return str(self.optimize(ir_text, "ir_view"))


class _Optimizer:
    """An LLVM context (None: the global one) with its own pass builders and lock.

    LLVM contexts and pass builders (which hold analysis managers) are not thread safe, so
    each optimizer serializes its runs; the compile watchdog replaces an optimizer whose run
    never returned instead of waiting on its lock forever."""

    def __init__(self, jit: Jit, context, vectorize: bool) -> None:
        llvm = _binding()
        self.jit = jit
        self.context = context
        self.lock = threading.Lock()
        pto = llvm.PipelineTuningOptions(speed_level=3)
        pto.loop_vectorization = vectorize
        pto.slp_vectorization = vectorize
        pto.loop_interleaving = True
        pto.loop_unrolling = True
        self.pb = llvm.create_pass_builder(jit.target_machine, pto)
        # Tiered compilation: tiny kernels run in microseconds, so their O3 compile dominates;
        # they get the speed-level-1 pipeline (vectorizers still on), ~2x faster to build,
        # without the partial/runtime unrolling after vectorization (`QUICK_LOOP_UNROLLING`).
        quick = llvm.PipelineTuningOptions(speed_level=1)
        quick.loop_vectorization = vectorize
        quick.slp_vectorization = vectorize
        quick.loop_unrolling = QUICK_LOOP_UNROLLING
        self.pb_quick = llvm.create_pass_builder(jit.target_machine, quick)

    def run(self, ir_text: str, module_name: str, quick: bool):
        with self.lock:
            mod = _binding().parse_assembly(ir_text, context=self.context)
            mod.name = module_name
            mod.triple = self.jit.triple
            mod.data_layout = self.jit.data_layout
            mod.verify()
            pb = self.pb_quick if quick else self.pb
            pb.getModulePassManager().run(mod, pb)
            return mod


_TIMED_OUT = object()


def _compile_timeout() -> float:
    return settings.COMPILE_TIMEOUT.get()


def _run_with_timeout(fn, timeout: float):
    """fn() on a daemon thread; its result, or _TIMED_OUT. Exceptions propagate."""
    box: list = []

    def work() -> None:
        try:
            box.append((True, fn()))
        except BaseException as e:  # re-raised on the caller's thread
            box.append((False, e))

    t = threading.Thread(target=work, name="lazymath-llvm-opt", daemon=True)
    t.start()
    t.join(timeout)
    if not box:
        return _TIMED_OUT
    ok, value = box[0]
    if not ok:
        raise value
    return value


_JITS: dict[str, Jit] = {}  # LAZYMATH_TARGET_CPU value -> its engine ("" = host)
_JIT_LOCK = threading.Lock()


def get_jit(name: str | None = None) -> Jit:
    """The engine generating code for the effective host target (one per target: tests switch
    LAZYMATH_TARGET_CPU to run the AVX2 path on an AVX-512 host in one process); `name` picks
    a target (a LAZYMATH_TARGET_CPU value) instead of the one in effect."""
    if name is None:
        name = host.requested()
    jit = _JITS.get(name)
    if jit is None:
        with _JIT_LOCK:
            jit = _JITS.get(name)
            if jit is None:
                jit = _JITS[name] = Jit(host.target(name))
    return jit


def _after_fork_in_child() -> None:
    """fork() copies locks in whatever state other threads held them: a child forked while a
    parent thread compiled would wait forever on the optimizer's, the engine's or llvmlite's
    lock. The child gets fresh locks; an optimizer that was busy at fork time (its LLVM
    context mid-run) is dropped and the next compile makes a fresh one in a new context."""
    global _native_lock, _runtime_lock, _JIT_LOCK
    _native_lock = threading.RLock()
    _runtime_lock = threading.Lock()
    _JIT_LOCK = threading.Lock()
    loader = sys.modules.get("lazymath.backend.native.elfload")
    if loader is not None:  # (not loaded: nothing was mapped, no lock to renew)
        loader._sym_lock = threading.Lock()
    binding = sys.modules.get("llvmlite.binding")
    if binding is not None:
        ffi_lock = getattr(getattr(binding.ffi, "lib", None), "_lock", None)
        if ffi_lock is not None and hasattr(ffi_lock, "_lock"):
            ffi_lock._lock = threading.RLock()
    for j in list(_JITS.values()):  # one engine per target
        j.lock = _native_lock
        j._swap_lock = threading.Lock()
        opt = j._optimizer
        if opt is not None:
            if opt.lock.locked():
                j._retired.append(opt)
                j._optimizer = None
            else:
                opt.lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def as_cfunc(addr: int):
    """ctypes function `void f(int64 block_idx, int64 block_num, void **args)` (and its `raw`
    twin without argtypes, for ready ctypes int64 arguments)."""
    cf = KERNEL_CFUNC(addr)
    cf.raw = _KERNEL_RAW(addr)
    return cf
