"""One MCJIT engine per process: LLVM IR text -> optimized native code -> ctypes function.

Why one engine: MCJIT engines are heavy (a target machine, a memory manager) and every kernel
of the process can live in the same one; symbols are unique per kernel signature.

Native code is produced at O3 for the host CPU name and features, with the new pass manager's
loop and SLP vectorizers on. The engine's object cache hooks let `kernel_cache` persist the
object code on disk and feed it back on the next run so a warm process never runs LLVM. The
hooks also fire for the engine's empty backing module, so objects are keyed by module name and
unknown names are ignored.

Everything here is serialised by one lock: MCJIT is not thread safe. Compiled functions are
plain C function pointers; calling them through ctypes releases the GIL.
"""

from __future__ import annotations

import ctypes
import threading

import llvmlite
import llvmlite.binding as llvm

KERNEL_CFUNC = ctypes.CFUNCTYPE(
    None, ctypes.c_int64, ctypes.c_int64, ctypes.POINTER(ctypes.c_void_p)
)


class Jit:
    """The process-wide MCJIT engine (use `get_jit()`)."""

    def __init__(self) -> None:
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        self.lock = threading.RLock()
        self.cpu_name = llvm.get_host_cpu_name()
        self.cpu_features = llvm.get_host_cpu_features().flatten()
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
        pto = llvm.PipelineTuningOptions(speed_level=3)
        pto.loop_vectorization = True
        pto.slp_vectorization = True
        pto.loop_interleaving = True
        pto.loop_unrolling = True
        self._pto = pto
        self._pb = llvm.create_pass_builder(self.target_machine, pto)
        # Tiered compilation: tiny kernels run in microseconds, so their O3 compile dominates;
        # they get the speed-level-1 pipeline (vectorizers still on), ~2x faster to build.
        quick = llvm.PipelineTuningOptions(speed_level=1)
        quick.loop_vectorization = True
        quick.slp_vectorization = True
        self._pb_quick = llvm.create_pass_builder(self.target_machine, quick)
        self._loaded: dict[str, int] = {}  # symbol -> address (code stays for the process)
        self._objects: dict[str, bytes] = {}  # symbol -> object code (to re-store on disk)
        self._modules: list = []  # keep modules alive: their code is referenced by callers

    @property
    def host_key(self) -> tuple:
        """What native code depends on besides the kernel: versions and the host CPU."""
        return (llvmlite.__version__, llvm.llvm_version_info, self.triple, self.cpu_name,
                self.cpu_features)  # fmt: skip

    def _notify(self, module, buffer: bytes) -> None:
        self._emitted[module.name] = bytes(buffer)

    def _getbuffer(self, module):
        return self._inject.pop(module.name, None)

    def optimize(self, ir_text: str, module_name: str, quick: bool = False):
        """Parse, verify and run the O3 pipeline (speed level 1 when `quick`); returns the
        llvm ModuleRef."""
        mod = llvm.parse_assembly(ir_text)
        mod.name = module_name
        mod.triple = self.triple
        mod.data_layout = self.data_layout
        mod.verify()
        pb = self._pb_quick if quick else self._pb
        pb.getModulePassManager().run(mod, pb)
        return mod

    def compile(self, ir_text: str, symbol: str, module_name: str,
                quick: bool = False) -> tuple[int, bytes | None]:  # fmt: skip
        """Compile IR text; return (address of `symbol`, object code for the disk cache)."""
        with self.lock:
            if symbol in self._loaded:
                return self._loaded[symbol], self._objects.get(symbol)
            mod = self.optimize(ir_text, module_name, quick)
            return self._add(mod, symbol, module_name)

    def load_object(self, obj: bytes, symbol: str, module_name: str) -> int:
        """Load cached object code (no LLVM optimisation or codegen runs)."""
        with self.lock:
            if symbol in self._loaded:
                return self._loaded[symbol]
            stub = llvm.parse_assembly("")
            stub.name = module_name
            stub.triple = self.triple
            stub.data_layout = self.data_layout
            self._inject[module_name] = obj
            self._objects[symbol] = obj
            try:
                addr, _ = self._add(stub, symbol, module_name)
            finally:
                self._inject.pop(module_name, None)
            return addr

    def _add(self, mod, symbol: str, module_name: str) -> tuple[int, bytes | None]:
        self.engine.add_module(mod)
        self.engine.finalize_object()
        self._modules.append(mod)
        addr = self.engine.get_function_address(symbol)
        if not addr:
            raise RuntimeError(f"JIT: symbol {symbol} not found after loading {module_name}")
        self._loaded[symbol] = addr
        obj = self._emitted.pop(module_name, None)
        if obj is not None:
            self._objects[symbol] = obj
        return addr, obj

    def assembly(self, ir_text: str) -> str:
        """Host assembly of the optimized module (debug output; computed on demand)."""
        with self.lock:
            mod = self.optimize(ir_text, "asm_view")
            return self.target_machine.emit_assembly(mod)

    def optimized_ir(self, ir_text: str) -> str:
        with self.lock:
            return str(self.optimize(ir_text, "ir_view"))


_JIT: Jit | None = None
_JIT_LOCK = threading.Lock()


def get_jit() -> Jit:
    global _JIT
    if _JIT is None:
        with _JIT_LOCK:
            if _JIT is None:
                _JIT = Jit()
    return _JIT


def as_cfunc(addr: int):
    """ctypes function `void f(int64 block_idx, int64 block_num, void **args)`."""
    return KERNEL_CFUNC(addr)
