"""compile_kernel: KernelIR -> template -> isa.Program -> native code (or the interpreter).

    k = compile_kernel(ir, get_spec("ascend910"))
    print(k.isa_text)            # the NPU program
    print(k.llvm_ir)             # what LLVM receives (lazy on a disk-cache hit)
    print(k.asm)                 # host assembly (computed on demand)
    k(*flat_arrays)              # run every block (kernel_args order)
    argv = k.make_argv(arrays); k.run_block(argv, i, k.blocks)   # the runtime's primitive

Templates are a table by `ir.kind`; each module exposes ``build(ir, spec, name) -> Program``.
The matmul template belongs to the Cube work and is imported lazily.

A disk-cache hit runs neither the template nor LLVM: the file holds the ISA program (encoded by
`isa_codec`, whose reader can only build lazymath's ISA values; no pickle) next to the object code,
which `jit.load_cached` maps with `elfload`. The template module is imported only when a lazy
report (`llvm_ir`, `asm`, `cost`) needs the lowerings/costs it registers.
"""

from __future__ import annotations

import ctypes
import dataclasses
import importlib
import math
import os
import sys
import threading
import weakref

import numpy as np

from lazymath import settings
from lazymath._lazy import deferred
from lazymath._threads import block_pool, launch_blocks, num_threads
from lazymath.backend.host import gemm, lower_cube, lower_llvm, vmlib  # noqa: F401  lower_cube: the Cube lowerings
from lazymath.backend.native import elfload, host, isolate, jit, kernel_cache, tiering, workers
from lazymath.backend.native.tiering import TIER_STATS, wait_tiering  # noqa: F401 - wait_tiering: public
from lazymath.backend.npu import cost, interp, isa, isa_codec, isa_cube, vmath
from lazymath.backend.npu.kernel_ir import kernel_args, view_extent
from lazymath.backend.npu.templates.common import CALLS
from lazymath.runtime.device import get_spec

# Loaded with the first matmul or the first report, not with the compiler: autotune and uklib
# (the GEMM microkernel library) are 13 ms of parsing an elementwise first realize would pay,
# roofline 16 ms (without bytecode files, as the benchmarks and CI run).
autotune = deferred("lazymath.backend.autotune")
uklib = deferred("lazymath.backend.host.uklib")
roofline = deferred("lazymath.backend.host.roofline")

TEMPLATES: dict[str, str] = {
    "elementwise": "lazymath.backend.npu.templates.elementwise",
    "reduce": "lazymath.backend.npu.templates.reduce",
    "matmul": "lazymath.backend.npu.templates.matmul",
    "rows": "lazymath.backend.npu.templates.rows",
    "custom": "lazymath.backend.npu.userkernel",  # user kernels (`lazymath.kernel`)
}
BACKENDS = ("llvm", "interp")


def default_backend() -> str:
    """$LAZYMATH_BACKEND if it compiles kernels ("llvm" or "interp"), else "llvm" (the
    "reference" and "irref" backends never compile; a kernel compiled under them is native)."""
    b = settings.BACKEND.get()
    return b if b in BACKENDS else "llvm"


MIN_FLOPS_PER_WORKER = 4_000_000  # ~50 us of host microkernel work per extra host thread


def host_blocks(ir, program: isa.Program, workers: int | None = None, spec=None) -> int:
    """Host mapping: how many host blocks (BLOCK_NUM) run a program; the block pool runs them
    on at most one thread per host core, each thread claiming the next block when it is done.

    Template programs carry the device's block count and take their items GetBlockIdx()
    style (a contiguous range of items per BLOCK_IDX of BLOCK_NUM), so any count is correct:
    at most one thread per host core and per device block, and one for tiny work (a host
    hand-off costs tens of microseconds). A big matmul gets more blocks than threads (given
    `spec`: `templates.matmul.host_blocks`), and so does a big Vector template kernel (up to
    BLOCKS_PER_THREAD per thread, each of at least BLOCK_WORK elements: dynamic claiming then
    evens out a thread that lost its core; user kernels keep one block per thread). It
    changes neither the program nor its simulated cost. User kernels (`lm.kernel`) read
    BLOCK_IDX/BLOCK_NUM the same way."""
    kind = getattr(ir, "kind", None)
    if kind not in _HOST_MAPPED:
        return program.blocks
    workers = workers or num_threads()
    if kind == "matmul":
        if program.unit != "cube":
            return program.blocks
        flops = 2 * math.prod(ir.batch) * max(ir.m, 1) * max(ir.n, 1) * max(ir.k, 1)
        threads = max(1, min(workers, program.blocks, flops // MIN_FLOPS_PER_WORKER))
        if spec is None or threads == 1:
            return threads
        split = importlib.import_module(TEMPLATES["matmul"]).host_blocks
        return split(ir, spec, threads, flops // MIN_FLOPS_PER_WORKER)
    elems = _vector_elems(ir)
    if elems < SMALL_VECTOR_WORK:
        return 1
    # more blocks than threads when each still has BLOCK_WORK elements: the pool's threads
    # claim blocks dynamically, so a thread whose core is taken (another process, a peer
    # library's spinning pool) costs the blocks it did not run, not half the kernel
    split = 1 if kind == "custom" else min(BLOCKS_PER_THREAD,
                                           max(1, elems // (workers * BLOCK_WORK)))  # fmt: skip
    return max(1, min(workers * split, program.blocks))


_HOST_MAPPED = frozenset({"matmul", "elementwise", "reduce", "rows", "custom"})
SMALL_VECTOR_WORK = 32 * 1024  # elements a Vector kernel touches below which one thread runs it
BLOCKS_PER_THREAD = 4  # at most, for big Vector kernels (a stolen core costs ~1/4 of its share)
BLOCK_WORK = 256 * 1024  # elements per block at least (~50 us of streaming work) to split more


def _vector_elems(ir) -> int:
    """Elements a Vector kernel reads or writes (its host work measure)."""
    if ir.kind == "elementwise":
        return math.prod(ir.shape)
    if ir.kind == "reduce":
        return max(math.prod(ir.in_shape), math.prod(ir.out_shape))
    if ir.kind == "custom":
        return sum(math.prod(v.shape) for v in (*ir.inputs, *ir.outputs))
    return math.prod(ir.in_shape)


def _after_fork_in_child() -> None:
    """The compiler's locks may be held in a forked child (the block pool resets itself,
    lazymath/_threads.py; the parent's background tier-ups, tiering.py)."""
    kernel_cache._lock = threading.RLock()
    interp = sys.modules.get("lazymath.backend.npu.interp")
    if interp is not None:
        interp._ATOMIC = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def replace_family_code(family: list, addr: int, symbol: str, tier: int) -> None:
    """`CompiledKernel.replace_code` for every live kernel of `family`; with none alive the
    new function is dropped at once and its code released (unmapped)."""
    cf = jit.held_cfunc(addr, symbol)
    for ref in list(family):
        k = ref()
        if k is not None:
            k._addr, k._cfunc, k.tier = addr, cf, tier


class CompiledKernel:
    """A kernel ready to launch: its program, native function (or interpreter) and reports."""

    def __init__(self, name: str, ir, program: isa.Program, spec, backend: str,
                 addr: int | None = None, symbol: str | None = None,
                 llvm_ir: str | None = None, code_symbol: str | None = None) -> None:  # fmt: skip
        """`addr`: native code whose symbol (`code_symbol`, default `symbol`) the caller holds
        one user of (`jit.load_cached(..., hold=True)`); the kernel's function owns it."""
        self.name = name
        self.ir = ir
        self.program = program
        self.spec = spec
        self.backend = backend
        self.blocks = host_blocks(ir, program, spec=spec)
        self.symbol = symbol
        self._addr = addr
        self._llvm_ir = llvm_ir
        self._asm: str | None = None
        self._cost = None
        self._args = kernel_args(ir)
        self._cfunc = None
        self.tier = 2  # 0: quickly compiled code an optimized version replaces (tiering)
        self._family = [weakref.ref(self)]  # copies sharing this code (see `renamed`)
        if addr is not None:
            self._cfunc = jit.held_cfunc(addr, code_symbol or symbol)

    # ----------------------------------------------------------------- reports
    @property
    def isa_text(self) -> str:
        return str(self.program)

    @property
    def llvm_ir(self) -> str | None:
        """LLVM IR text fed to the optimizer (None for the interpreter backend)."""
        if self.backend != "llvm":
            return None
        if self._llvm_ir is None:
            _register_template(self.ir.kind)
            self._llvm_ir = str(
                lower_llvm.lower_program(self.program, self.spec, symbol=self.symbol)
            )
        return self._llvm_ir

    @property
    def asm(self) -> str | None:
        """Host assembly after O3 (computed on first access)."""
        if self.backend != "llvm":
            return None
        if self._asm is None:
            self._asm = jit.get_jit().assembly(self.llvm_ir)
        return self._asm

    @property
    def cost(self):
        """Simulated NPU cycles per pipe (`cost.KernelCost`)."""
        if self._cost is None:
            _register_template(self.ir.kind)
            self._cost = cost.estimate(self.program, self.spec)
        return self._cost

    @property
    def host_roof(self):
        """This kernel's host roofline (`roofline.KernelRoof`: memory and compute bounds on
        this machine at its block count), None where the model has no rule; computed on first
        access (the first one in a process measures the host, ~0.2 s, see roofline.py).
        None on the interpreter backend too: its times say nothing about the host's roofs."""
        if self.backend != "llvm":
            return None
        if self.__dict__.get("_roof", False) is False:
            try:
                roofs = roofline.host_roofs(host.target())
                self._roof = roofline.kernel_roof(self.ir, self.blocks, roofs)
            except Exception:  # noqa: BLE001 - a report never breaks a launch or a profile
                self._roof = None
        return self._roof

    def renamed(self, name: str) -> CompiledKernel:
        """The same native code under another kernel name (memory-cache hits)."""
        k = object.__new__(CompiledKernel)
        k.__dict__.update(self.__dict__)
        k.name = name
        k.program = dataclasses.replace(self.program, name=name)
        self._family[:] = [r for r in self._family if r() is not None]
        self._family.append(weakref.ref(k))  # shares this kernel's function (and its hold)
        return k

    def replace_code(self, addr: int, symbol: str, tier: int = 2) -> None:
        """Run the native code at `addr` (`symbol`, one user held by the caller, see
        `__init__`) from now on, in this kernel and every renamed copy (tiered compilation:
        the optimized code replaces the quick one). Code lifetime follows the ctypes function
        object (`jit.held_cfunc`): the old code is released once, when the last reference to
        its function is gone -- a launch already running holds one, so it finishes on mapped
        code."""
        replace_family_code(self._family, addr, symbol, tier)

    # ----------------------------------------------------------------- running
    def make_argv(self, arrays) -> ctypes.Array:
        """ctypes array of base pointers, one per kernel_args entry (flat base arrays, typed or
        raw uint8 bytes), plus a fresh zeroed GM workspace when the program asks for one."""
        if len(arrays) != len(self._args):
            n = len(self._args)
            raise ValueError(f"kernel {self.name} takes {n} arrays, got {len(arrays)}")
        ptrs = [a.ctypes.data for a in arrays]
        ws = None
        if self.program.workspace:
            ws = np.zeros(self.program.workspace, np.uint8)
            ptrs.append(ws.ctypes.data)
        argv = (ctypes.c_void_p * len(ptrs))(*ptrs)
        argv._lm_ws = ws  # keeps the workspace alive as long as the argv
        if self.backend == "interp":  # raw device bytes (DeviceBuffer) viewed as the arg dtype
            flat = [np.asarray(a).reshape(-1) for a in arrays]
            flat = [a.view(v.dtype) if a.dtype == np.uint8 and v.dtype != "uint8" else a
                    for a, v in zip(flat, self._args)]  # fmt: skip
            argv._lm_arrays = flat + ([ws] if ws is not None else [])
        return argv

    def argv_from_addresses(self, addresses) -> ctypes.Array:
        """Like make_argv from cached raw base addresses (ints, kernel_args order); native
        backend only. Saves the ~2.5 us per `arr.ctypes.data` of a replayed launch."""
        if self.backend != "llvm":
            raise ValueError("argv_from_addresses needs the llvm backend (interp reads arrays)")
        ptrs = list(addresses)
        ws = None
        if self.program.workspace:
            ws = np.zeros(self.program.workspace, np.uint8)
            ptrs.append(ws.ctypes.data)
        argv = (ctypes.c_void_p * len(ptrs))(*ptrs)
        argv._lm_ws = ws
        return argv

    def run_block(self, argv, block_idx: int, block_num: int) -> None:
        """Run one block (the runtime's launch primitive; releases the GIL on llvm)."""
        if self._cfunc is not None:
            self._cfunc(block_idx, block_num, argv)
            return
        interp.run(self.program, self._interp_arrays(argv), block_idx, block_num)

    def _interp_arrays(self, argv) -> list[np.ndarray]:
        arrays = getattr(argv, "_lm_arrays", None)
        if arrays is not None:
            return arrays
        out = []
        if self.program.workspace:
            raw = (ctypes.c_char * self.program.workspace).from_address(argv[len(self._args)])
            ws = np.frombuffer(raw, dtype=np.uint8)
        for k, v in enumerate(self._args):
            n = view_extent(v)
            dt = np.dtype(v.dtype)
            if n == 0 or not argv[k]:
                out.append(np.zeros(0, dt))
                continue
            raw = (ctypes.c_char * (n * dt.itemsize)).from_address(argv[k])
            out.append(np.frombuffer(raw, dtype=dt, count=n))
        if self.program.workspace:
            out.append(ws)
        return out

    def __call__(self, *arrays) -> None:
        """Run all blocks, in parallel on the process's block pool (lazymath/_threads.py)."""
        launch_blocks(block_pool(), self, self.make_argv(arrays), self.blocks)

    def __repr__(self) -> str:
        return f"<CompiledKernel {self.name} {self.ir.kind} blocks={self.blocks} {self.backend}>"


def _register_template(kind: str) -> None:
    """Import the template module of `kind`: it registers its instructions' lowerings, costs
    and interpreter rules. A kernel loaded from the disk cache did not run its template, so its
    lazy reports (llvm_ir, cost) import it here, on demand."""
    modname = TEMPLATES.get(kind)
    if modname is not None:
        importlib.import_module(modname)


def build_program(ir, spec, name: str, calls: bool | None = None) -> isa.Program:
    """Run the template for `ir.kind` and check the program against `spec`. `calls`: call the
    vector math library for composites instead of inlining them (default: `vmath.call_plan`)."""
    try:
        modname = TEMPLATES[ir.kind]
    except KeyError:
        raise NotImplementedError(f"no kernel template for kind {ir.kind!r}") from None
    if calls is None:
        calls = vmath_calls(ir)
    token = CALLS.set(bool(calls))
    try:
        program = importlib.import_module(modname).build(ir, spec, name)
    finally:
        CALLS.reset(token)
    return program.check(spec)


def vmath_calls(ir) -> bool:
    """Does the kernel call the vector math library (`vmath.call_plan`: the rule and reason)?"""
    return vmlib.call_plan(ir)[0]


def compile_kernel(ir, spec, backend: str | None = None, name: str | None = None) -> CompiledKernel:
    """Compile (or fetch from the kernel cache) the kernel for `ir` on device `spec`."""
    return compile_kernels([(ir, name)], spec, backend)[0]


def compile_kernels(items, spec, backend: str | None = None, tiered: bool = False,
                    origins: list | None = None) -> list[CompiledKernel]:  # fmt: skip
    """`compile_kernel` for several independent kernels [(ir, name), ...], compiled in
    parallel: templates and lowering run here, LLVM on the compile workers (`workers`, one
    thread per core), so kernel k+1 is lowered while kernel k is optimized.

    `tiered` (the realize path): a kernel whose optimization would take long starts on
    quickly compiled code, replaced in the background by the optimized code (`_tier_first`);
    without it every kernel returns with its final code, stored in the disk cache.

    `origins`, if given, receives one word per item saying where its code came from:
    "memory" (kernel cache in memory, or the same kernel earlier in `items`), "disk" (disk
    cache), "compiled", or "compiled (tier 0)" (quick code, optimized in the background)."""
    with workers.responsive():  # the workers get the GIL back quickly between their LLVM calls
        return _compile_kernels(items, spec, backend, tiered, origins)


def _compile_kernels(items, spec, backend, tiered, origins) -> list[CompiledKernel]:
    spec = get_spec(spec)
    backend = backend or default_backend()
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; backends: {', '.join(BACKENDS)}")
    out: list = [None] * len(items)
    origin: list = [None] * len(items)
    pending: list = []  # (index, sig, job)
    first: dict = {}  # sig -> index of the first item compiling it (duplicates wait for it)
    dups: list = []
    for idx, (ir, name) in enumerate(items):
        name = name or f"k_{ir.kind}"
        calls = vmath_calls(ir)
        sig = (ir.kind, ir, spec.key(), backend, calls) + _math_key()
        if backend == "llvm":  # native code is per host target (LAZYMATH_TARGET_CPU)
            sig += (host.requested(),)
        hit = kernel_cache.memory_get(sig)
        if hit is not None:
            out[idx] = hit if hit.name == name else hit.renamed(name)
            origin[idx] = "memory"
            continue
        if sig in first:
            dups.append((idx, first[sig], name))
            continue
        first[sig] = idx
        if backend == "interp":
            program = build_program(ir, spec, name, calls)
            kernel = CompiledKernel(name, ir, program, spec, backend)
            kernel_cache.count("compiled")
            origin[idx] = "compiled"
        else:
            kernel = _start_llvm(ir, spec, name, calls, tiered)
            if isinstance(kernel, _Job):
                pending.append((idx, sig, kernel))
                continue
            origin[idx] = "disk" if kernel.__dict__.get("from_disk") else "compiled (child process)"
        kernel_cache.memory_put(sig, kernel)
        out[idx] = kernel
    for idx, sig, job in pending:
        kernel = job.finish()
        kernel_cache.memory_put(sig, kernel)
        out[idx] = kernel
        origin[idx] = "compiled (tier 0)" if kernel.tier == 0 else "compiled"
    for idx, src, name in dups:
        k = out[src]
        out[idx] = k if k.name == name else k.renamed(name)
        origin[idx] = "memory"
    if origins is not None:
        origins[:] = origin
    return out


TINY_KERNEL_ELEMENTS = 16384


def _is_tiny(ir) -> bool:
    """Vector kernels over fewer than TINY_KERNEL_ELEMENTS elements run in microseconds; their
    compile time dominates, so they take the quick LLVM pipeline (tiered compilation)."""
    if ir.kind == "elementwise":
        work = math.prod(ir.shape)
    elif ir.kind in ("reduce", "rows"):
        work = math.prod(ir.in_shape)
    else:
        return False
    return work < TINY_KERNEL_ELEMENTS


def _load_program(blob: bytes | None, name: str) -> isa.Program:
    """The ISA program stored with a cached kernel, renamed to `name` (`isa_codec`: builds
    only lazymath's ISA values, never runs code)."""
    if not blob:
        raise ValueError("cache entry has no program")
    program = isa_codec.decode(blob)
    if program.blocks < 1:
        raise ValueError("cache entry's program has no blocks")
    return program if program.name == name else dataclasses.replace(program, name=name)


def _host_mapping(ir) -> tuple:
    """Host code generation choices beyond the target (the GEMM plan of a matmul)."""
    if ir.kind != "matmul":
        return ()
    return (
        gemm.host_gemm().key
        + (() if gemm.K_STEP_MERGE else ("k-steps",))
        + (() if gemm.ND_A else ("pack-a",))
        + (() if gemm.ND_PACK else ("nz-a",))
    )


def _disk_key(ir, spec, calls: bool | None = None) -> tuple[str, bool]:
    """(disk-cache key, quick pipeline?) -- computed without LLVM (see jit.host_key)."""
    if calls is None:
        calls = vmath_calls(ir)
    quick = _is_tiny(ir)
    sig = repr(
        (
            ir.kind,
            ir,
            spec.key(),
            "quick" if quick else "O3",
            "vmcalls" if calls else "",
            _host_mapping(ir),
        )
        + _math_key()
    )
    return kernel_cache.disk_key(sig, jit.host_key()), quick


def _math_key() -> tuple:
    """LAZYMATH_HOST_MATH changes the vector math sequences in the program (cache keys)."""
    return ("hostmath",) if vmath.host_math_enabled() else ()


def _load_llvm(ir, spec, name: str, key: str) -> CompiledKernel | None:
    """The kernel from its disk-cache file, or None (no file, or a file that cannot be used:
    counted as rejected and deleted, never executed). Needs neither the template nor LLVM:
    the program is stored with the object code, which `jit.load_cached` maps with elfload."""
    cached = kernel_cache.disk_load(key)
    if cached is None:
        return None
    try:
        program = _load_program(cached.parts.get("program"), name)
        symbol = cached.header["symbol"]
        if not isinstance(symbol, str):
            raise ValueError("symbol is not a string")
        _link_library(program)
        uk = cached.header.get("uklib") or []
        if not isinstance(uk, list) or not all(isinstance(s, str) for s in uk):
            raise ValueError("uklib is not a list of symbols")
        _link_uk(uk)
        addr, how = jit.load_cached(cached.obj, symbol, f"lmmod_{key[:24]}", hold=True)
    except (elfload.ElfLoadError, ValueError, KeyError, TypeError, AttributeError,
            RuntimeError) as e:  # fmt: skip
        kernel_cache.reject(key, f"{type(e).__name__}: {e}")  # recompiled and replaced
        return None
    kernel_cache.count("disk_hits")
    if how != "memory":
        kernel_cache.count("elf_loads" if how == "elf" else "mcjit_loads")
    kernel = CompiledKernel(name, ir, program, spec, "llvm", addr, symbol)
    kernel.from_disk = True  # (for compile_kernels' `origins`)
    return kernel


def _start_llvm(ir, spec, name: str, calls: bool = False, tiered: bool = False):
    """A disk-cache hit (a CompiledKernel: no LLVM), or a `_Job`: the template ran, the
    program is lowered to LLVM IR and the compile workers are optimizing it."""
    if ir.kind == "matmul":  # lowered with its host GEMM plan (`autotune.choice`)
        if not gemm.overridden():
            with gemm.plan_override(autotune.choice(ir, spec, _autotune_candidate)):
                return _start_llvm(ir, spec, name, calls, tiered)
    key, quick = _disk_key(ir, spec, calls)
    kernel = _load_llvm(ir, spec, name, key)
    if kernel is not None:
        return kernel
    program = build_program(ir, spec, name, calls)
    how = isolate.mode()
    isolated = how == "always" or (how == "auto" and isolate.crashed_before(key))
    uk_lib = tiered and _cube_gemm(ir, program) and tiering.tiered_setting()
    early = _main_ukernels_to_request(program) if uk_lib and not isolated else []
    workers.warm()  # the workers load LLVM while the lowering runs here
    for s in early:  # the longest compile of a cold matmul: it runs while the kernel is lowered
        uklib.request(s)
    if calls:
        vmlib.request(vmlib.symbols_of(program))  # load or compile the library meanwhile
    symbol = f"lm_{ir.kind}_{key[:24]}"
    uk_symbols: list[str] = []
    if uk_lib:
        text0 = _lower_with_uk_library(program, spec, symbol, uk_symbols, request=not isolated)
    else:
        text0 = str(lower_llvm.lower_program(program, spec, symbol=symbol))
    job = _Job(ir, spec, name, key, program, symbol, text0, 1 if quick else 3)
    # the workers mark the key while LLVM runs on it (`isolate.compiling`): a process that
    # dies in LLVM leaves the mark, and the next process compiles that kernel in a child
    if (not isolated and tiered and (uk_symbols or _tier_first(ir, text0))
            and "reassoc" not in text0):  # fmt: skip
        job.tier0 = workers.submit(_renamed_ir(text0, symbol, job.symbol0), job.module0, 0,
                                   marker=isolate.tier0_marker(key),
                                   **_tier0_options(ir, bool(uk_symbols)))  # fmt: skip
    if uk_symbols:  # microkernels declared as `uklib` calls (requested while lowering)
        job.uk_symbols = uk_symbols
        if job.tier0 is not None or isolated or not UK_OUT_OF_LINE:
            job.text = uklib.inline(text0, uk_symbols)  # the kernel whole (optimized code)
        else:
            job.calls_uk = True
    if isolated:
        return job.isolated(how)
    if job.tier0 is None:
        job.final = workers.submit(job.text, job.module, job.level, marker=key)
    return job


def _cube_gemm(ir, program) -> bool:
    """Does the kernel run GEMM microkernels (a matmul, or a user/built-in kernel with Cube
    Mmads: the fused attention)?"""
    if ir.kind == "matmul":
        return True
    return ir.kind == "custom" and any(isinstance(i, isa_cube.Mmad) for i in program.instructions())


def _lower_with_uk_library(program, spec, symbol: str, uk_symbols: list,
                           request: bool = True) -> str:  # fmt: skip
    """LLVM IR of a tier-0 matmul kernel whose GEMM microkernels are calls into `uklib` (their
    symbols appended to `uk_symbols`): the kernel's own code is then small and quick to
    compile, the microkernels compile once per process (or load from disk) on another worker.
    With `request`, each microkernel is requested (`uklib.request`) the moment the lowering
    meets it: its compile runs on a worker while the rest of the kernel is lowered and
    printed here (the main microkernel is the longest compile of a cold matmul)."""
    if not uklib.ENABLED:
        return str(lower_llvm.lower_program(program, spec, symbol=symbol))

    def met(s: str) -> None:
        uk_symbols.append(s)
        if request:
            uklib.request(s)

    token = gemm.UK_LIBRARY.set(met)
    try:
        return str(lower_llvm.lower_program(program, spec, symbol=symbol))
    finally:
        gemm.UK_LIBRARY.reset(token)


def _main_ukernels_to_request(program) -> list[str]:
    """The GEMM microkernels a tier-0 matmul program's lowering will call (predicted,
    `lower_llvm.predicted_calls`: lower_cube.main_ukernels) that are not loaded or compiling
    yet: their compiles start before the lowering (which meets them ~70% of the way through)."""
    if not uklib.ENABLED:
        return []
    try:
        names = lower_llvm.predicted_calls(program)
    except Exception:  # noqa: BLE001 - only a head start: the lowering requests what it meets
        return []
    return [s for s in names if uklib.parse(s) and not uklib.requested(s)]


def _compile_llvm(ir, spec, name: str, calls: bool = False) -> CompiledKernel:
    """One kernel with its final code, now (no tiering): a disk-cache hit or a compile
    (`autotune` times candidate GEMM plans through this)."""
    k = _start_llvm(ir, spec, name, calls, tiered=False)
    return k.finish() if isinstance(k, _Job) else k


def _autotune_candidate(ir, spec) -> CompiledKernel:
    """One candidate GEMM plan's kernel for `autotune.choice` (run under its plan_override)."""
    return _compile_llvm(ir, spec, "autotune", vmath_calls(ir))


def _link_library(program) -> None:
    """Load the vector math library functions `program` calls before its code is linked
    (outside the loader's lock: a library compile must not wait for it)."""
    for instr, _ in isa.walk(program.body):
        if type(instr).__name__ == "VMathCall":
            for s in vmlib.symbols_of(program):
                vmlib.address(s)
            return


def _link_uk(symbols) -> None:
    """Wait for the `uklib` microkernels a kernel's code calls (outside the loader's lock,
    like `_link_library`)."""
    if not symbols:
        return
    for s in symbols:
        if uklib.parse(s) is None:
            raise ValueError(f"{s!r} is not a GEMM microkernel library symbol")
        uklib.address(s)


def _renamed_ir(text: str, symbol: str, new: str) -> str:
    return text.replace(f'@"{symbol}"', f'@"{new}"')


# A kernel that cannot start on tier-0 code (its float sums carry `reassoc`: the first code
# must be the final one) but runs GEMM microkernels -- the fused attention, a user kernel with
# Mmads -- keeps them out of line in its final code, calling the `uklib` functions: they are
# ~85 % of its IR (GPT block attention: 508 of 590 KB, 1.37 s at O3 on the cold path), are
# shared with every matmul kernel of the process and disk-cached, and compute the same FMAs
# in the same order as inlined (bit-identical; steady attention time unchanged, 16.2 ms).
UK_OUT_OF_LINE = True
TIER_IR_CHARS = 24_000  # LLVM IR text above which a kernel starts on its quick tier-0 code
# ... unless its arrays are so large that tier-0 code costs more: at 1M float32 the tier-0 code
# of sin+exp+log ran ~4x slower than O3 (benchmarks/elementwise.py "three": 23.9 vs 5.5 ms) for
# as long as the background compile took, so only kernels up to 64K elements start on tier 0
TIER_MAX_ELEMENTS = 1 << 16


def _work_elements(ir) -> int:
    """Elements whose loops tier-0 code runs slower (scalar, unoptimized). A matmul's inner
    loops are explicitly vectorized GEMM microkernels (`gemm`): its tier-0 code measured within
    ~10% of O3 (2048^3 float16), so only its small epilogue counts."""
    if ir.kind == "elementwise":
        return math.prod(ir.shape)
    if ir.kind in ("reduce", "rows"):
        return math.prod(ir.in_shape)
    if ir.kind == "custom":  # a user kernel (a Stockham FFT, ...): its largest array
        return max((math.prod(v.shape) for v in (*ir.inputs, *ir.outputs)), default=0)
    return 0


def _tier0_options(ir, uk_library: bool = False) -> dict:
    """How a kernel's tier-0 code is generated (`workers.Compiler.compile` keywords): LLVM's
    -O0 code generator (~5-10x faster than the default on these modules). A matmul whose
    microkernels are `uklib` calls (its "driver": packing, loops, fix-pipe) gets a short IR
    clean-up first (SROA, InstCombine, SimplifyCFG): its packing loops then run as fast as
    with the full code generator (2048^3 float16: the driver compiles in ~12 instead of ~40
    ms). A matmul with its microkernels inside keeps the full code generator: they need the
    real register allocator to run at speed (tier-0 code is what the first, long call runs)."""
    if ir.kind != "matmul":
        return {"codegen": 0}
    return {"codegen": 0, "cleanup": True} if uk_library else {"codegen": 3}


def _tier_first(ir, text: str) -> bool:
    """Start this kernel on tier-0 code (no IR optimization: code generation only, ~10x faster
    to build) and replace it in the background with the optimized code? For kernels whose
    optimization takes long (big IR: tenths of a second to seconds) over arrays small enough
    that the slower tier-0 code costs less than the compile it saves. Never for a kernel
    whose result may depend on the optimizer: float reductions carry `reassoc` (the
    vectorizer splits the sum into lanes); everything else is IEEE, the same at every level."""
    if not tiering.tiered_setting() or len(text) <= TIER_IR_CHARS:
        return False
    if "reassoc" in text:  # float reductions: O3 vectorizes (reorders) the sum, tier 0 not
        return False
    return _work_elements(ir) <= TIER_MAX_ELEMENTS


class _Job:
    """A kernel being compiled by the workers (see `_start_llvm`)."""

    def __init__(self, ir, spec, name, key, program, symbol, text, level) -> None:
        self.ir, self.spec, self.name, self.key = ir, spec, name, key
        self.cache_dir = kernel_cache.cache_dir()  # where `_store` writes (see disk_store)
        self.program, self.symbol, self.text, self.level = program, symbol, text, level
        self.module = f"lmmod_{key[:24]}"
        self.symbol0 = f"{symbol}_t0"
        self.module0 = f"{self.module}_t0"
        self.tier0 = None  # Future of the tier-0 object (tiered kernels)
        self.text0 = text  # the tier-0 code's IR (its microkernels may be `uklib` calls)
        self.uk_symbols: list[str] = []  # `uklib` functions the tier-0 code calls
        self.final = None  # Future of the final object
        self.calls_uk = False  # the final code calls `uk_symbols` in the library

    def finish(self) -> CompiledKernel:
        """Wait for the code, link it in, store it; a tiered kernel starts on tier 0 and its
        final code is compiled in the background (`_tier_up`)."""
        _link_library(self.program)
        if self.tier0 is not None:
            try:
                obj0 = _result(self.tier0, self, 0)
            except isolate.CompilerCrashed:  # LLVM killed the compile server twice (it warned)
                return self._interpreted()
            if self.uk_symbols:
                for s in self.uk_symbols:  # waited for here, outside the loader's lock
                    uklib.address(s)
            addr, _ = jit.load_cached(obj0, self.symbol0, self.module0, hold=True)
            kernel_cache.count("compiled")
            kernel = CompiledKernel(self.name, self.ir, self.program, self.spec, "llvm", addr,
                                    self.symbol, self.text, code_symbol=self.symbol0)  # fmt: skip
            kernel.tier = 0
            TIER_STATS["tiered"] += 1
            tiering.started()
            fut = workers.submit(self.text, self.module, self.level, marker=self.key,
                                 background=True)  # fmt: skip
            # the callback holds the kernel's family weakly: a kernel evicted (and collected)
            # before its optimized code is ready gets none mapped; the code still goes to disk
            tiering.watch_background(
                fut,
                lambda: workers.submit(
                    self.text,
                    self.module,
                    self.level,
                    vectorize=False,
                    marker=self.key,
                    background=True,
                ),  # fmt: skip
                lambda f, fam=kernel._family: self._tier_up(fam, f),
                f"kernel {self.name}",
            )
            return kernel
        try:
            obj = _result(self.final, self)
        except isolate.CompilerCrashed:
            return self._interpreted()
        if self.calls_uk:
            _link_uk(self.uk_symbols)
        addr, _ = jit.load_cached(obj, self.symbol, self.module, hold=True)
        kernel_cache.count("compiled")
        self._store(obj)
        return CompiledKernel(self.name, self.ir, self.program, self.spec, "llvm", addr,
                              self.symbol, self.text)  # fmt: skip

    def _interpreted(self) -> CompiledKernel:
        """The kernel on the numpy interpreter: LLVM could not compile it (`isolate`)."""
        kernel_cache.count("compiled")
        return CompiledKernel(self.name, self.ir, self.program, self.spec, "interp")

    def isolated(self, how: str) -> CompiledKernel:
        """Compile in a child process (`isolate`): LAZYMATH_COMPILE_ISOLATE=1, or a previous
        process died in LLVM on this kernel. The child's object is linked like a disk-cache
        hit; if LLVM fails there even with the vectorizers off, the interpreter runs it."""
        why = ("LAZYMATH_COMPILE_ISOLATE=1" if how == "always"
               else "a previous process died compiling it")  # fmt: skip
        obj = isolate.compile_in_child(self.text, self.module, self.level, why,
                                       jit._compile_timeout())  # fmt: skip
        kernel_cache.count("compiled")
        if obj is None:  # the marker stays: later processes go straight to the child too
            return CompiledKernel(self.name, self.ir, self.program, self.spec, "interp")
        _link_library(self.program)
        addr, _ = jit.load_cached(obj, self.symbol, self.module, hold=True)
        self._store(obj)
        isolate.clear(self.key)
        return CompiledKernel(self.name, self.ir, self.program, self.spec, "llvm", addr,
                              self.symbol, self.text)  # fmt: skip

    def _store(self, obj: bytes | None) -> None:
        if obj is None:
            return
        try:
            blob = isa_codec.encode_checked(self.program)
        except isa_codec.CodecError as e:  # not storable: this kernel stays memory-only
            kernel_cache.note_unstorable(self.name, str(e))
            return
        header = {"symbol": self.symbol, "kind": self.ir.kind, "name": self.name}
        if self.calls_uk:
            header["uklib"] = list(self.uk_symbols)
        kernel_cache.disk_store(self.key, header, obj, {"program": blob}, self.cache_dir)

    def _tier_up(self, family: list, fut) -> None:
        """Background: the optimized code replaces the tier-0 code in every copy of the
        kernel (memory-cache hits share it) and goes to the disk cache. Same IR, IEEE
        arithmetic at every level: results do not change. The tier-0 code is released when
        its function object goes (`jit.held_cfunc`); if every copy is gone already (evicted),
        the optimized code is only stored, never mapped."""
        try:
            obj = fut.result()
            self._store(obj)
            if any(r() is not None for r in family):
                addr, _ = jit.load_cached(obj, self.symbol, self.module, hold=True)
                replace_family_code(family, addr, self.symbol, 2)
            TIER_STATS["tiered_up"] += 1
        except Exception as e:  # noqa: BLE001 - the tier-0 code stays, correct and slower
            import warnings

            warnings.warn(f"lazymath: optimizing kernel {self.name} in the background failed "
                          f"({type(e).__name__}: {e}); it keeps its quickly compiled code",
                          RuntimeWarning, stacklevel=1)  # fmt: skip
        finally:
            tiering.finished()


def _result(fut, job: _Job, level: int | None = None) -> bytes:
    """The worker's object code, under the compile watchdog: LLVM 22's loop vectorizer has been
    seen to spin for good on rare kernels, and a C call cannot be interrupted. After
    LAZYMATH_COMPILE_TIMEOUT seconds (default 300) the stuck worker is abandoned (the pool gets
    a new thread) and the kernel is compiled again with the vectorizers off, with a warning."""
    from concurrent.futures import TimeoutError as FutTimeout

    timeout = jit._compile_timeout()
    try:
        return fut.result(timeout=isolate.watchdog_timeout(timeout))
    except FutTimeout:
        pass
    import warnings

    warnings.warn(
        f"lazymath: LLVM did not finish optimizing kernel {job.name} within {timeout:g} s "
        "(a known LLVM loop-vectorizer hang); compiling it again with the vectorizers off. "
        "The stuck compiler thread keeps one core busy until the process exits.",
        RuntimeWarning,
        stacklevel=4,
    )
    workers.abandon(fut)
    options: dict = {}
    if level == 0:  # the tier-0 compile (its own symbol and module)
        text, module = _renamed_ir(job.text0, job.symbol, job.symbol0), job.module0
        options = _tier0_options(job.ir, bool(job.uk_symbols))
    else:
        text, module, level = job.text, job.module, job.level
    fut = workers.submit(text, module, level, vectorize=False, marker=job.key, **options)
    try:
        return fut.result(timeout=isolate.watchdog_timeout(timeout))
    except FutTimeout:
        workers.abandon(fut)
        raise RuntimeError(
            f"lazymath: LLVM did not finish compiling kernel {job.name} within {timeout:g} s, "
            "even with the vectorizers off (LAZYMATH_COMPILE_TIMEOUT)"
        ) from None
