"""LLVM compile workers: kernels are optimized and code-generated on threads, in parallel.

    fut = workers.submit(ir_text, "lmmod_x", level=3)   # concurrent.futures.Future[bytes]
    obj = fut.result()                                   # relocatable object code
    addr, how = jit.load_cached(obj, symbol, "lmmod_x")  # elfload (or MCJIT) links it in

Why not the MCJIT engine (`jit.Jit.compile`): llvmlite serializes every call into LLVM with one
process-wide lock, and the engine's optimizer shares LLVM's global context, so two kernels can
never compile at the same time and a compile holds up anything else that touches LLVM. LLVM
itself is thread safe across contexts. Each worker thread owns an LLVM context, a target
machine (the Jit's CPU and features) and pass builders; the two long calls -- the optimization
pipeline and code generation -- run through llvmlite's C functions without its lock (short
ones, parsing and verifying a module in the worker's own context, keep it). The object the
worker emits is what MCJIT would emit for the module; it is linked in with `jit.load_cached`
(elfload: no LLVM at all) and stored in the disk cache unchanged.

Foreground and background: a compile someone waits for (a kernel's code, a library function's
quick code) is foreground; the optimized code that replaces quick code later (tiered compilation)
is background. Workers take foreground jobs first; a background job starts only when no
foreground job is queued or running, on at most n-1 workers (one stays free for the next
foreground job; all n once the oldest has waited BG_STARVED s), and not while a realize that
compiled is still running its first call (`hold_background`: the background would take a core
from it) -- unless the job has waited HOLD_MAX seconds, so background work always makes
progress. Workers load LLVM and build their
compiler as soon as they start (`warm`, called at the first disk-cache miss), while the
template and lowering run on the calling thread.

Levels: 3 the O3 pipeline, 1 speed level 1 (tiny kernels, see compile._is_tiny), 0 no IR
optimization (tiered compilation's first tier: code generation only, with LLVM's -O0 code
generator, `codegen=0` -- after a short IR clean-up for a matmul's driver, `cleanup=True` --
and the full one for the GEMM microkernels of `uklib`). Vectorizers on at 1 and 3.
Floating point is IEEE at every level (no fast-math flags anywhere): levels only change speed,
never results.
"""

from __future__ import annotations

import collections
import ctypes
import json
import os
import queue
import struct
import sys
import threading
import time
from concurrent.futures import Future

from lazymath import settings
from lazymath._lazy import deferred

# The compile server imports this module with nothing but settings and these (isolate._BOOT): the
# rest is loaded on first use. isolate (and with it the kernel cache) only in the parent process;
# jit and host when a compiler is built, so a parent's prestart() launches the server before
# anything else of the backend loads.
isolate = deferred("lazymath.backend.native.isolate")
jit = deferred("lazymath.backend.native.jit")
host = deferred("lazymath.backend.native.host")
threadpool = deferred("lazymath._threads")  # the execution threads (n_workers)

HOLD_MAX = 0.5  # seconds a background job waits at most for held realizes (`hold_background`)
BG_STARVED = 2.0  # seconds after which a waiting background job may take the last free worker


class _Jobs:
    """The workers' job queue: foreground jobs first, background jobs when the workers and
    the realizes leave room (see the module docstring)."""

    def __init__(self) -> None:
        self.cv = threading.Condition(threading.Lock())
        self.fg: collections.deque = collections.deque()
        self.bg: collections.deque = collections.deque()  # (time queued, job)
        self.fg_running = 0
        self.bg_running = 0
        self.running: dict = {}  # id(future) -> background? (jobs on a worker now)
        self.holds = 0

    def put(self, job, background: bool = False) -> None:
        with self.cv:
            if background:
                self.bg.append((time.monotonic(), job))
            else:
                self.fg.append(job)
            self.cv.notify_all()

    def _bg_wait(self) -> float | None:
        """0 if a background job may start now, else seconds to wait (None: until notified)."""
        if not self.bg or self.fg_running:
            return None
        waited = time.monotonic() - self.bg[0][0]
        # n-1 workers for background jobs, all of them once the oldest has waited BG_STARVED
        # seconds: a background compile that runs for minutes (or hangs until the watchdog
        # abandons it) must not hold up every other tier-up
        limit = n_workers() if waited >= BG_STARVED else max(1, n_workers() - 1)
        if self.bg_running >= limit:
            return None if limit == n_workers() else BG_STARVED - waited
        if not self.holds:
            return 0.0
        return max(0.0, HOLD_MAX - waited)

    def get(self):
        """The next job this worker may run (blocks until there is one)."""
        with self.cv:
            while True:
                if self.fg:
                    job, background = self.fg.popleft(), False
                    self.fg_running += 1
                    break
                wait = self._bg_wait()
                if wait == 0.0:
                    job, background = self.bg.popleft()[1], True
                    self.bg_running += 1
                    break
                self.cv.wait(wait)
            self.running[id(job[0])] = background
            return job

    def done(self, fut) -> None:
        """`fut`'s job left its worker (finished, or the worker was abandoned in it)."""
        with self.cv:
            background = self.running.pop(id(fut), None)
            if background is None:
                return
            if background:
                self.bg_running -= 1
            else:
                self.fg_running -= 1
            self.cv.notify_all()

    def hold(self, delta: int) -> None:
        with self.cv:
            self.holds += delta
            self.cv.notify_all()


_local = threading.local()
_queue = _Jobs()
_threads: list[threading.Thread] = []
_threads_lock = threading.Lock()
_abandoned = 0


class hold_background:
    """``with hold_background():`` -- background compiles do not start meanwhile (at most
    HOLD_MAX seconds per job): the engine holds them while a realize that compiled kernels
    runs its first call, so a tier-up does not take a core from it."""

    def __enter__(self):
        _queue.hold(1)
        return self

    def __exit__(self, *exc) -> None:
        _queue.hold(-1)


SWITCH_INTERVAL = 0.0005  # seconds: sys.setswitchinterval while kernels are lowered and compiled
_switch_lock = threading.Lock()
_switch_depth = 0
_switch_saved = 0.005


class responsive:
    """``with responsive():`` -- Python's thread switch interval is SWITCH_INTERVAL (0.5 ms,
    default 5 ms) inside the block (the calling thread lowers kernels while the workers
    compile). A worker calls LLVM through llvmlite a dozen times per compile and needs the GIL
    back after each call; while this thread runs Python (templates, lowering, IR printing) it
    waited up to the whole interval for it every time. Measured on the cold custom_op
    (relu(A @ B) * 0.5, 2048 float16), 9 interleaved pairs of fresh processes: the compile
    phase 105 -> 91 ms (medians). Only speed changes; nested and concurrent blocks restore
    the interval in effect before the first one."""

    def __enter__(self):
        global _switch_depth, _switch_saved
        with _switch_lock:
            if _switch_depth == 0:
                _switch_saved = sys.getswitchinterval()
                sys.setswitchinterval(min(_switch_saved, SWITCH_INTERVAL))
            _switch_depth += 1
        return self

    def __exit__(self, *exc) -> None:
        global _switch_depth
        with _switch_lock:
            if _switch_depth == 0:  # a block entered before a fork, left in the child
                return
            _switch_depth -= 1
            if _switch_depth == 0:
                sys.setswitchinterval(_switch_saved)


def n_workers() -> int:
    """Compile threads: LAZYMATH_COMPILE_THREADS, default (0) one per execution thread
    (`lazymath._threads.num_threads`: affinity, cgroup quota, LAZYMATH_NUM_THREADS,
    set_num_threads / threadpool_limits), at most 4."""
    n = settings.COMPILE_THREADS.get()
    return max(1, n or min(threadpool.num_threads(), 4))


def _loop(target: str | None, compiler: Compiler | None = None) -> None:
    if compiler is not None:  # built by `warm` on the thread that started this one
        _local.compilers = {target: compiler}
    elif target is not None and not _in_server_mode():
        try:
            _compiler(target)  # load LLVM, build this thread's compiler before the first job
        except Exception:  # noqa: BLE001,S110 - the first job reports it
            pass
    jobs = _queue
    while True:
        fut, fn, args = jobs.get()
        try:
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(*args))
            except BaseException as e:  # noqa: BLE001 - handed to whoever waits
                fut.set_exception(e)
        finally:
            jobs.done(fut)


def _start_threads(target: str | None = None, build: bool = False) -> None:
    """Daemon threads (a thread stuck in LLVM must not hold up the interpreter's exit); new
    ones build their compiler for `target` first, or with `build` get one built here."""
    with _threads_lock:
        want = n_workers() + _abandoned
        while len(_threads) < want:
            c = None
            if build and target is not None:
                c = Compiler(target)
                _compilers.append(c)
            t = threading.Thread(target=_loop, args=(target, c),
                                 name=f"lazymath-compile-{len(_threads)}", daemon=True)  # fmt: skip
            t.start()
            _threads.append(t)


def warm() -> None:
    """Start the workers now, each loading LLVM and building its compiler for the target in
    effect (a kernel is about to be compiled: that work overlaps the lowering)."""
    prestart()
    server = _in_server_mode()  # (False if no server could start)
    if len(_threads) < n_workers() + _abandoned:
        target = _requested()
        # LLVM's import, the engine's setup and the workers' compilers (an LLVM context and
        # target machine each, ~1 ms) here, uncontended: on a worker they would run beside
        # this thread's lowering and wait for the GIL at each of their calls (the workers'
        # own set-up took up to 25 ms there, delaying the first compile that much). In
        # server mode the workers only wait for the server: no compilers, and no LLVM at all
        # (the server's objects are linked by elfload; ~20 ms of llvmlite.binding and MCJIT
        # set-up off the first realize, which waits for the server's boot anyway).
        if not server:
            jit.get_jit(target)
        _start_threads(target, build=not server)


def prestart() -> None:
    """Start the compile server (server mode; once per process) if it is not running: at a
    program-cache miss on the llvm backend (`engine.run_compiled`) and at the first kernel
    compile (`warm`), so that its boot (~80 ms: Python, llvmlite, a target machine) runs on
    another core while the graph is fused and lowered (~60 ms for the first realize of a
    process) instead of after it. A miss whose kernels all come from the disk cache then
    boots a server it does not use (once per process)."""
    if _in_server_mode():
        isolate.start_server(_requested())


def _in_server_mode() -> bool:
    """Whether compiles go to the compile server (`isolate`; imported only here, lazily: the
    server process itself imports this module without the kernel cache)."""
    return isolate.mode() == "server"


def abandon(fut: Future | None = None) -> None:
    """A worker is stuck in LLVM for good on `fut`'s job (see compile's watchdog): start one
    more thread so the pool keeps its size; the stuck one keeps its core until the process
    exits, and its job no longer counts as running (it would hold up background jobs)."""
    global _abandoned
    with _threads_lock:
        _abandoned += 1
    if fut is not None:
        _queue.done(fut)
    _start_threads()


class Compiler:
    """One thread's LLVM state: context, target machine, pass builders (levels 0, 1, 3)."""

    def __init__(self, target: str | None = None) -> None:
        llvm = jit._binding()
        # the host target's CPU name and features, as the Jit of `target` has them; not the
        # Jit itself: its MCJIT engine and runtime symbols (~20 ms) are of no use to a
        # compile, and the compile server builds a Compiler before its first answer
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        ht = host.target(target)
        self.target_name = target
        self.cpu_name = ht.llvm_cpu
        self.cpu_features = ht.llvm_features()
        self.context = llvm.create_context()
        self.tm = llvm.Target.from_default_triple().create_target_machine(
            cpu=self.cpu_name, features=self.cpu_features, opt=3, jit=True
        )
        self.triple = llvm.get_process_triple()
        self.data_layout = str(self.tm.target_data)
        self.pbs: dict = {}
        self.fast_tm = None  # code generation at -O0 (`compile(..., codegen=0)`), made on use
        self.cleanup_mpm = None  # SROA + InstCombine + SimplifyCFG (`compile(..., cleanup=True)`)

    def _pb(self, level: int, vectorize: bool):
        pb = self.pbs.get((level, vectorize))
        if pb is None:
            llvm = jit._binding()
            pto = llvm.PipelineTuningOptions(speed_level=level)
            pto.loop_vectorization = vectorize
            pto.slp_vectorization = vectorize
            if level == 3:
                pto.loop_interleaving = True
                pto.loop_unrolling = True
            else:  # the quick pipeline (see jit.QUICK_LOOP_UNROLLING)
                pto.loop_unrolling = jit.QUICK_LOOP_UNROLLING
            pb = self.pbs[(level, vectorize)] = llvm.create_pass_builder(self.tm, pto)
        return pb

    def _codegen_tm(self, codegen: int):
        if codegen >= 3:
            return self.tm
        if self.fast_tm is None:
            target = jit._binding().Target.from_default_triple()
            self.fast_tm = target.create_target_machine(
                cpu=self.cpu_name, features=self.cpu_features, opt=0, jit=True
            )
        return self.fast_tm

    def _cleanup(self):
        if self.cleanup_mpm is None:
            mpm = jit._binding().create_new_module_pass_manager()
            mpm.add_sroa_pass()
            mpm.add_instruction_combine_pass()
            mpm.add_simplify_cfg_pass()
            self.cleanup_mpm = mpm
        return self.cleanup_mpm

    def compile(self, ir_text: str, module_name: str, level: int, vectorize: bool = True,
                codegen: int = 3, cleanup: bool = False) -> bytes:  # fmt: skip
        """Object code of `ir_text` (one module) optimized at `level`. `codegen` 0: LLVM's
        -O0 code generator (FastISel, fast register allocation), several times faster than
        the default (3) and producing slower code: tier 0 of elementwise and reduce kernels.
        `cleanup` (level 0): SROA, InstCombine and SimplifyCFG before code generation -- a
        few ms that let the -O0 code generator keep values in registers (tier 0 of a matmul's
        driver: its packing loops then run as fast as with the full code generator, which
        takes 3-4x longer). Every way computes the same IEEE results (no fast-math flags, so
        no pass reassociates or contracts; fma only where the IR calls llvm.fma, which every
        code generator fuses)."""
        from llvmlite.binding import ffi

        tm = self._codegen_tm(codegen)
        mod = jit._binding().parse_assembly(ir_text, context=self.context)
        mod.name = module_name
        mod.triple = self.triple
        mod.data_layout = self.data_layout
        mod.verify()
        if level > 0:
            pb = self._pb(3 if level >= 3 else 1, vectorize)
            mpm = pb.getModulePassManager()
            ffi.lib.LLVMPY_RunNewModulePassManager._cfn(mpm, mod, pb)  # without the lock
        elif cleanup:
            ffi.lib.LLVMPY_RunNewModulePassManager._cfn(self._cleanup(), mod, self._pb(1, False))
        with ffi.OutputString() as err:
            mb = ffi.lib.LLVMPY_TargetMachineEmitToMemory._cfn(tm, mod, 1, err)
            if not mb:
                raise RuntimeError(f"LLVM code generation failed for {module_name}: {err}")
        try:
            start = ffi.lib.LLVMPY_GetBufferStart(mb)
            size = ffi.lib.LLVMPY_GetBufferSize(mb)
            return ctypes.string_at(start, size)
        finally:
            ffi.lib.LLVMPY_DisposeMemoryBuffer(mb)


# Every thread's compiler, referenced here too: a forked child deletes the parent's other
# threads' state, and freeing their compilers there would dispose LLVM contexts another parent
# thread may have been using (under llvmlite's lock, inherited held): they are never freed.
_compilers: list[Compiler] = []


def _requested() -> str:

    return host.requested()


def _compiler(target: str | None = None) -> Compiler:
    """This thread's compiler for `target` (a LAZYMATH_TARGET_CPU value; None: the one in
    effect now). One per target: a process that switches targets (the tests run the forced
    AVX2 path after native code) must not generate the new target's kernels with the target
    machine a worker built for the first one."""
    if target is None:
        target = _requested()
    cs = getattr(_local, "compilers", None)
    if cs is None:
        cs = _local.compilers = {}
    c = cs.get(target)
    if c is None:
        c = cs[target] = Compiler(target)
        with _threads_lock:
            _compilers.append(c)
    return c


def _work(ir_text: str, module_name: str, level: int, vectorize: bool = True,
          marker: str | None = None, target: str | None = None,
          codegen: int = 3, cleanup: bool = False) -> bytes:  # fmt: skip
    kw = {"codegen": codegen} if codegen != 3 else {}
    if cleanup:
        kw["cleanup"] = True
    if isolate.mode() == "server":  # LLVM runs in the compile-server process
        req = {"text": ir_text, "module": module_name, "level": level, "vectorize": vectorize,
               "target": target if target is not None else _requested(), "kw": kw}  # fmt: skip
        try:
            return isolate.server_compile(req)
        except isolate.ServerUnavailable:  # (it warned) in-process from now on, as in auto
            pass
    if marker is None:
        return _compiler(target).compile(ir_text, module_name, level, vectorize, **kw)
    with isolate.compiling(marker):  # a process dying in LLVM here leaves the mark
        return _compiler(target).compile(ir_text, module_name, level, vectorize, **kw)


def server_main(target: str = "") -> None:
    """The compile server (`isolate`): builds its compiler for `target` (the parent's
    LAZYMATH_TARGET_CPU value; "" the one in effect) and says so with one byte
    (isolate._READY), then reads requests (u64 id + u64 length + JSON) on stdin and answers
    each (u64 id, status byte, u64 length, object code or error text) on stdout as it
    finishes, until stdin closes. Requests compile on threads, one per request in flight (the
    parent has at most one per compile thread), each with its own `Compiler` like a worker
    thread of the parent. Booted by isolate._BOOT: only settings and the backend's
    jit/host/workers modules are imported here (no numpy, no tensor layer)."""
    fault = settings.TEST_COMPILE_FAULT.get()  # tests: simulate LLVM failing
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    first = None
    try:
        first = Compiler(target)  # LLVM loaded, target machine built: before any job
    except Exception:  # noqa: BLE001,S110 - the first request reports it
        pass
    out.write(b"R")  # isolate._READY (isolate itself imports the kernel cache: not here)
    out.flush()
    jobs: queue.SimpleQueue = queue.SimpleQueue()
    out_lock = threading.Lock()
    idle_lock = threading.Lock()
    idle = [0]

    def serve(compiler: Compiler | None) -> None:
        if compiler is not None:
            _local.compilers = {target: compiler}
        while True:
            rid, req = jobs.get()
            if fault == "abort" or (fault == "abort-vectorized" and req["vectorize"]):
                os.abort()
            if fault == "hang" or (fault == "hang-vectorized" and req["vectorize"]):
                time.sleep(3600)
            try:
                obj = _compiler(req["target"]).compile(
                    req["text"], req["module"], int(req["level"]), bool(req["vectorize"]),
                    **req["kw"])  # fmt: skip
                status, payload = b"O", obj
            except Exception as e:  # noqa: BLE001 - reported to the parent, which raises it
                status, payload = b"E", f"{type(e).__name__}: {e}".encode()
            with out_lock:
                out.write(struct.pack("<Qc", rid, status) + struct.pack("<Q", len(payload)))
                out.write(payload)
                out.flush()
            with idle_lock:
                idle[0] += 1

    while True:
        head = inp.read(16)
        if len(head) < 16:
            os._exit(0)  # the parent closed the pipe (or exited): threads may be in LLVM
        rid, n = struct.unpack("<QQ", head)
        jobs.put((rid, json.loads(inp.read(n))))
        with idle_lock:
            spawn = idle[0] == 0
            if not spawn:
                idle[0] -= 1
        if spawn:  # every thread is busy: one more (the parent bounds how many are in flight)
            threading.Thread(target=serve, args=(first,), daemon=True).start()
            first = None


def submit(ir_text: str, module_name: str, level: int = 3, vectorize: bool = True,
           marker: str | None = None, background: bool = False,
           codegen: int = 3, cleanup: bool = False) -> Future:  # fmt: skip
    """Compile on a worker thread; the Future's result is the object code. `marker`: the
    kernel's disk key, marked as being compiled while LLVM runs (see `isolate`). The code is
    generated for the host target in effect at submission (the IR and its disk key were made
    for it), whichever target the worker compiled for before. `background`: nobody waits
    for it now (an optimized replacement of quick code): it yields to foreground compiles.
    `codegen`, `cleanup`: the code generator's level, IR clean-up at level 0
    (`Compiler.compile`)."""
    target = _requested()
    _start_threads(target)
    fut: Future = Future()
    args = (ir_text, module_name, level, vectorize, marker, target, codegen, cleanup)
    _queue.put((fut, _work, args), background)
    return fut


def compile_here(ir_text: str, module_name: str, level: int = 3, vectorize: bool = True) -> bytes:
    """Compile on the calling thread (its own LLVM state, no lock held during the work)."""
    return _work(ir_text, module_name, level, vectorize)


def child_main() -> None:
    """The isolated compiler process (`isolate.compile_in_child`): JSON request on stdin,
    object code on stdout."""
    req = json.loads(sys.stdin.buffer.read())
    fault = settings.TEST_COMPILE_FAULT.get()  # tests: simulate LLVM failing
    if fault == "abort" or (fault == "abort-vectorized" and req["vectorize"]):
        os.abort()
    if fault == "hang" or (fault == "hang-vectorized" and req["vectorize"]):
        time.sleep(3600)
    # the same compiler as the parent's workers (own context, target machine, pass builders)
    obj = compile_here(req["text"], req["module"], int(req["level"]), bool(req["vectorize"]))
    if not obj:
        sys.exit(3)
    sys.stdout.buffer.write(obj)
    sys.stdout.buffer.flush()


def _after_fork_in_child() -> None:
    """A forked child has none of the parent's worker threads (the list still names them) and
    may have inherited the queue's or the list's lock held: fresh ones; compiles the parent
    had queued or running are lost to the child (their futures never finish there)."""
    global _queue, _threads, _threads_lock, _abandoned, _switch_lock, _switch_depth
    _queue = _Jobs()
    _threads = []
    _threads_lock = threading.Lock()
    _abandoned = 0
    _switch_lock = threading.Lock()  # and the parent's `responsive` blocks are not the child's
    if _switch_depth:
        sys.setswitchinterval(_switch_saved)
        _switch_depth = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
