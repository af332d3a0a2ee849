"""Compile and run pending graphs: the program cache, compile on a miss, validation.

A realize computes the graph's structural signature (op structure, shapes, dtypes, strides,
constants, device spec; never the data) and looks it up in the program cache. A miss runs the
fusion layer and compiles every kernel through the backend (kernel cache in memory and on disk)
into a `runtime.replay.Program`; a hit only replays it (binds the new input arrays, allocates
outputs and launches: no graph passes, no networkx, no LLVM, no planner). Running a program
is the runtime's job (`runtime/replay.py`); what a realize prints is `debug.py`'s.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict

import numpy as np

from lazymath import debug, settings
from lazymath._lazy import deferred
from lazymath._threads import run_blocks
from lazymath.backend.npu import cancel as _cancel
from lazymath.backend.npu import ir_reference
from lazymath.backend.npu.host_kernels import AicpuRunner, IrRefKernel
from lazymath.graph import custom
from lazymath.graph import node as gn
from lazymath.graph.walk import commit, plan_outputs
from lazymath.runtime import api as _rt_api
from lazymath.runtime.device import get_spec
from lazymath.runtime.replay import Program, Slot
from lazymath.units import fmt_bytes

# Loaded on the first cache miss, in this order: the compile workers first, so the compile
# server boots while fusion and the compile driver (~100 ms of source to parse, llvmlite) load
# and the graph is fused and lowered; hoisted to plain imports, they made the first relu realize
# 300 -> 380 ms (benchmarks/import_time.py). A replayed program never loads fusion at all.
workers = deferred("lazymath.backend.native.workers")
fusion = deferred("lazymath.fusion")
compile_driver = deferred("lazymath.backend.compile")
host = deferred("lazymath.backend.native.host")
autotune = deferred("lazymath.backend.autotune")
# Handed to fusion's planner (which imports no backend): it decides whether a row kernel fits
# on chip; loaded when the first row kernel is planned.
rows_template = deferred("lazymath.backend.npu.templates.rows")
vmlib = deferred("lazymath.backend.host.vmlib")  # the vector-math call plan (backend_report)
# The built-in kernels written with the kernel builder: loaded by the first graph that uses one
# (graph.custom.builtin), not by every first realize.
custom.provide("conv1d_depthwise", deferred("lazymath.backend.npu.templates.conv1d"))
custom.provide("fft_stockham", deferred("lazymath.backend.npu.templates.fft"))

# ----------------------------------------------------------------------------- validation


def _launch(ck, args) -> None:
    argv = ck.make_argv(args)
    run_blocks(ck.run_block, argv, getattr(ck, "blocks", 1))


def _run_validated(sk, ck, args) -> None:
    """LAZYMATH_VALIDATE=1: run the kernel, re-run its IR through the numpy oracle, compare."""
    _launch(ck, args)
    if sk.kind == "aicpu":
        return
    ref = [a.copy() for a in args]
    ir_reference.run(sk.ir, ref)
    n_out = len(sk.ir.outputs)
    for got, want, v in zip(args[-n_out:], ref[-n_out:], sk.ir.outputs):
        g, w = got.reshape(-1), want.reshape(-1)
        if np.dtype(v.dtype).kind == "f":
            tol = 2e-2 if v.dtype == "float16" else 1e-4
            rtol = atol = tol
            if sk.kind == "custom":  # a user kernel's own tolerance (`lm.kernel(rtol=, atol=)`)
                d = custom.get(sk.ir.key)
                rtol = tol if d.rtol is None else d.rtol
                atol = tol if d.atol is None else d.atol
            bad = ~np.isclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=atol,
                              equal_nan=True)  # fmt: skip
        else:
            bad = g != w
        if bad.any():
            i = int(np.argmax(bad))
            raise AssertionError(
                f"LAZYMATH_VALIDATE: kernel {sk.name} (created at {sk.source_loc}) differs from "
                f"the reference at flat index {i}: got {g[i]!r}, expected {w[i]!r} "
                f"({int(bad.sum())} of {bad.size} elements differ)"
            )


# ----------------------------------------------------------------------------- caches

_BACKEND = settings.BACKEND
_DEBUG = settings.DEBUG
_VALIDATE = settings.VALIDATE


class ProgramCache:
    """Compiled programs by `program_key` (graph signature, device, backend, host target), least
    recently used evicted beyond LAZYMATH_PROGRAM_CACHE_LIMIT (with the arenas they keep, and the
    kernels only they use), with hit/miss/eviction counters.

    Threads realizing the same graph at once must all find its program. The old lookup took
    the program out of the dict and put it back to mark it recently used, and a thread switch
    in between (the pop is a call, after which CPython may switch threads) let another thread
    miss, compile the graph again and split the hit counts. `get` reads an OrderedDict and
    moves the key to the recent end in place (`move_to_end`, one C call): the key is never
    absent, so a lookup needs no lock, which keeps the hit path as cheap as before (a lock
    around it cost ~2% of a small cached realize). The counters are plain `+=` on int
    attributes, which CPython with the GIL does not interrupt (no thread switch between the
    load and the store). Changes of the set of programs (put, pop, clear) take the lock."""

    def __init__(self) -> None:
        self._programs: OrderedDict = OrderedDict()  # least recently used first
        self._lock = threading.Lock()
        self.hits = self.misses = self.evictions = 0

    def get(self, key) -> Program | None:
        """The program of `key`, now the most recently used (counted as a hit), or None (a
        miss)."""
        programs = self._programs
        prog = programs.get(key)
        if prog is None:
            self.misses += 1
            return None
        try:
            programs.move_to_end(key)
        except KeyError:  # evicted or cleared since the get: it still runs this time
            pass
        self.hits += 1
        prog.hits += 1
        return prog

    def put(self, key, prog: Program) -> None:
        """Cache `prog` under `key`, evicting the least recently used beyond the limit."""
        limit = settings.PROGRAM_CACHE_LIMIT.get()
        evicted = []
        with self._lock:
            self._programs[key] = prog
            while len(self._programs) > limit:
                evicted.append(self._programs.popitem(last=False))
                self.evictions += 1
        del evicted  # their code and arenas are released here, outside the lock

    def pop(self, key) -> Program | None:
        """Remove one program (not counted)."""
        with self._lock:
            return self._programs.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            old, self._programs = self._programs, OrderedDict()
        del old

    def items(self) -> list[tuple]:
        """(key, program) pairs, least recently used first (a snapshot)."""
        with self._lock:
            return list(self._programs.items())

    def programs(self) -> list[Program]:
        return [p for _k, p in self.items()]

    def __len__(self) -> int:
        return len(self._programs)

    def stats(self) -> dict:
        """Programs held and the hit, miss and eviction counts of this process."""
        return {"programs": len(self._programs), "program_hits": self.hits,
                "program_misses": self.misses, "program_evictions": self.evictions}  # fmt: skip


PROGRAMS = ProgramCache()


def host_fft_rates() -> tuple[int, int]:
    """(cores, float32 vector lanes) of the host target: what the FFT plan's cost model scales
    its per-core, per-lane rates by (graph.dft)."""
    t = host.target()
    return t.cores, t.lanes("float32")


def tuned_choice(parts: tuple, labels: list[str], run):
    """A measured choice among `labels` (backend.autotune.measured_choice): a stored record, a
    fresh measurement when autotuning is on, else None."""
    return autotune.measured_choice(parts, labels, run)


def backend_name() -> str:
    """$LAZYMATH_BACKEND: "llvm" (default), "interp", "reference" or "irref"."""
    return _BACKEND.get()


def device_spec():
    """The current device's spec (what programs are compiled for)."""
    return (_rt_api._CURRENT or _rt_api.current_device()).spec


def scalar_leaves(leaves: list[gn.Node]) -> tuple[int, ...]:
    """Positions of the 0-d leaf buffers (runtime scalars, e.g. a Python float from user code)."""
    return tuple(i for i, n in enumerate(leaves) if not n.shape and n.op == "buffer")


def plan_schedule(outputs: list[gn.Node], leaves: list[gn.Node], spec,
                  fold: tuple[int, ...] | None = None):  # fmt: skip
    """(schedule, positions of the leaves folded into it as constants).

    Runtime scalars are kernel inputs, so a new value reuses the program. Where that costs
    kernels (a form that takes no extra input, such as a matmul row reduction's epilogue or a
    pipelined row kernel, or the input cap) the plan with those scalars folded in as constants
    wins when it has fewer kernels; the program is then specialized to their values
    (`run_compiled` checks them). `fold` forces folding of those positions (a program
    compiled for new values of an already specialized graph)."""

    def folded(positions):
        with fusion.build.folding({id(leaves[i]) for i in positions}) as used:
            alt = fusion.make_schedule(
                outputs, spec, row_template=rows_template, report=backend_report
            )
        return alt, tuple(i for i in positions if id(leaves[i]) in used)

    if fold is not None:
        return folded(fold)
    sched = fusion.make_schedule(outputs, spec, row_template=rows_template, report=backend_report)
    cands = scalar_leaves(leaves)
    if not cands:
        return sched, ()
    if len(sched.kernels) > 1:
        alt, used = folded(cands)
        if len(alt.kernels) < len(sched.kernels):
            return alt, used
    # a row kernel's fixed forms (the software-pipelined ring takes no per-row or scalar
    # input) can be lost to a scalar input at the same kernel count: row kernels fold theirs
    pos = {id(leaves[i]): i for i in cands}
    special = sorted({pos[id(n)] for sk in sched.kernels if sk.kind in _FOLD_KINDS
                      for n in sk.group.inputs if id(n) in pos})  # fmt: skip
    if special:
        alt, used = folded(special)
        if len(alt.kernels) <= len(sched.kernels):
            return alt, used
    return sched, ()


_FOLD_KINDS = frozenset(("rows",))


def compile_program(outputs: list[gn.Node], leaves: list[gn.Node], order, spec, backend: str,
                    tiered: bool = True, fold: tuple[int, ...] | None = None,
                    rewrite=None):  # fmt: skip
    """Cache miss: fuse, plan, compile every kernel (independent kernels in parallel; with
    `tiered`, a kernel slow to optimize starts on quickly compiled code, see backend.compile).
    `fold`: see `plan_schedule`. `rewrite(kernels, slots, arg_slots, leaves)`, called before
    anything compiles, returns {kernel index: the IR to compile instead} and may append slots
    (and their ids to a kernel's arg_slots): lm.jit's dynamic batch compiles its kernels with
    the row count a run-time argument once, not the traced sizes first."""
    sched, folded = plan_schedule(outputs, leaves, spec, fold)
    check_capacity(sched, spec)
    copy_leaves = {i for i, n in enumerate(leaves) if id(n) in sched.copy_inputs}
    leaf_pos = {id(n): i for i, n in enumerate(leaves)}
    out_pos = {id(n): i for i, n in enumerate(outputs)}
    slots: list[Slot] = []
    slot_of: dict[int, int] = {}

    def slot(n: gn.Node) -> int:
        if id(n) in slot_of:
            return slot_of[id(n)]
        if id(n) in sched.aliases:  # written into an output's memory, typed as n
            s = Slot("alias", slot(sched.aliases[id(n)]), n.shape, n.dtype)
        elif id(n) in leaf_pos:
            s = Slot("leaf", leaf_pos[id(n)])
        elif id(n) in out_pos:
            s = Slot("out", out_pos[id(n)], n.shape, n.dtype)
        else:
            b = sched.memory.buffers[id(n)]
            s = Slot("arena", b.offset, n.shape, n.dtype)
        slots.append(s)
        slot_of[id(n)] = len(slots) - 1
        return len(slots) - 1

    arg_slots = [[slot(n) for n in sk.group.inputs] + [slot(n) for n in sk.group.outputs]
                 for sk in sched.kernels]  # fmt: skip
    irs = {} if rewrite is None else rewrite(sched.kernels, slots, arg_slots, leaves)
    ir_of = {id(sk): irs.get(i, sk.group.ir) for i, sk in enumerate(sched.kernels)}
    native = [sk for sk in sched.kernels if sk.group.kind != "aicpu"]
    compiled = {}
    origin = {}
    if backend != "irref" and native:  # independent kernels compile in parallel
        items = [(ir_of[id(sk)], sk.name) for sk in native]
        origins: list = []
        done = compile_driver.compile_kernels(items, spec, backend, tiered=tiered, origins=origins)
        compiled = {id(sk): ck for sk, ck in zip(native, done)}
        origin = {id(sk): o for sk, o in zip(native, origins)}
    prog_origins = []
    cks = []
    for sk in sched.kernels:
        g = sk.group
        if g.kind == "aicpu":
            ck = AicpuRunner(sk.name, g.ir)
            prog_origins.append("AI CPU (numpy)")
        elif backend == "irref":
            ck = IrRefKernel(sk.name, g.ir)
            prog_origins.append("irref (numpy)")
        else:
            ck = compiled[id(sk)]
            prog_origins.append(origin.get(id(sk)) or "?")
        ck.source_loc = sk.source_loc
        cks.append(ck)
    outs = [slot(o) for o in outputs]
    sched = sched.compiled_with(cks)  # the compiled stage: no graph references
    kernels = list(zip(sched.kernels, cks, arg_slots))
    label = "+".join(sk.name for sk in sched.kernels)[:120]
    inline = sched.n_events == 0 and len({sk.stream for sk in sched.kernels}) <= 1
    prog = Program(sched, kernels, slots, sched.memory.arena_bytes, outs,
                   copy_leaves=copy_leaves, label=label, inline=inline,
                   origins=prog_origins)  # fmt: skip
    prog.folded = folded
    prog.folded_values = _leaf_values(leaves, folded)
    return prog


def compile_detached(roots: list[gn.Node], backend: str, rewrite):
    """(program, its outputs, its leaves) of `roots` compiled with `rewrite` (compile_program),
    neither cached nor run: its kernels are not the graph's (lm.jit's dynamic batch: the row
    count a run-time argument), so an eager realize of the same graph must never find it."""
    outputs, _key, leaves, order = plan_outputs(roots)
    if backend == "llvm":  # as run_compiled: the compile server boots while this is fused
        workers.prestart()
    with workers.hold_background():
        prog = compile_program(outputs, leaves, order, device_spec(), backend, rewrite=rewrite)
    PROGRAMS.misses += 1  # a program compiled: the miss of the cache it does not go into
    return prog, outputs, leaves


def _leaf_values(leaves, positions) -> tuple:
    """The bytes of the 0-d leaves at `positions`: what a specialized program was built for."""
    return tuple(leaves[i].realized.tobytes() for i in positions)


def _host_memory_bytes() -> int:
    """Physical memory of this host (0 if unknown)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def check_capacity(sched, spec) -> None:
    """Refuse, before compiling or allocating anything, a plan whose peak (live intermediates
    plus outputs) exceeds the device's memory (`DeviceSpec.hbm_bytes`) or this host's physical
    memory (the emulated device's memory is host memory): MemoryError naming the largest
    tensor, its size, the peak and the capacity."""
    need = sched.planned_peak_bytes
    cap = getattr(spec, "hbm_bytes", 0) or 0
    host = _host_memory_bytes()
    if not ((cap and need > cap) or (host and need > host)):
        return
    if cap and need > cap:
        what = f"the {fmt_bytes(cap)} of device memory of the {spec.name} (DeviceSpec.hbm_bytes)"
    else:
        what = f"this host's {fmt_bytes(host)} of physical memory"
    big, where = None, ""
    for sk in sched.kernels:
        for n in getattr(sk.group, "outputs", None) or []:
            if big is None or n.nbytes > big.nbytes:
                big = n
    if big is not None:
        loc = big.loc
        where = (f"; the largest tensor is {big.op}{list(big.shape)}:{big.dtype.name} "
                 f"({fmt_bytes(big.nbytes)})" + (f" created at {loc}" if loc else ""))  # fmt: skip
    raise MemoryError(
        f"lazymath: this realize needs {fmt_bytes(need)} at its peak, more than {what}"
        f"{where}. Nothing was compiled or allocated. Realize smaller pieces (slices of the "
        "inputs, fewer outputs at once) or spread the work with lazymath.distributed."
    )


# flops + bytes from which a realize runs interruptibly (Ctrl-C). The hand-off to the realize
# thread costs a few tens of microseconds per realize, so only programs of tens of milliseconds
# take it; a shorter one sees Ctrl-C when it returns.
LONG_WORK = 1 << 32


def _program_work(prog: Program) -> int:
    w = prog.__dict__.get("_work")
    if w is None:
        w = prog.__dict__["_work"] = sum(int(k.flops) + int(k.bytes)
                                         for k in prog.schedule.kernels)  # fmt: skip
    return w


class _RealizeThread:
    """One long-lived thread that runs the main thread's long programs while the main thread
    waits interruptibly (a Python signal handler runs only on the main thread, and only between
    bytecodes: a main thread inside a native kernel would see Ctrl-C when the kernel returns).

    Long-lived rather than one thread per realize: a fresh thread's stack and thread-local GEMM
    workspace are new pages, and faulting them in cost every 2048^3 realize ~1.4 ms (3.5 %,
    measured on Zen 5: 41.3 vs 39.8 ms per fp16 relu(A @ B) * 0.5, 12 interleaved rounds)."""

    def __init__(self) -> None:
        self._jobs: list = []
        self._cv = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._jobs:
                    self._cv.wait()
                job = self._jobs.pop(0)
                job[3].append(True)  # picked: the caller that gives up must wait for it
            fn, box, done, _ = job
            try:
                box.append((True, fn()))
            except BaseException as e:  # noqa: BLE001 - re-raised on the caller's thread
                box.append((False, e))
            done.set()

    def run(self, fn):
        """fn() on the realize thread; Ctrl-C while it runs raises the cancel flag that native
        tile loops poll, waits for fn to return and re-raises the KeyboardInterrupt.

        The job is queued inside the try: a Ctrl-C that lands between queueing it and the
        wait (the realize thread may have started it already: the test's SIGINT is sent from
        inside fn) used to escape before the cancel was raised, leaving the kernels running
        for hours on the realize thread and the block pool, so the next realize waited for
        the pool forever. Now a job still queued is withdrawn, one already started is
        cancelled and waited for; further Ctrl-Cs during that wait (kernels stop within a
        tile) do not cut it short."""
        box: list = []
        done = threading.Event()
        job = (fn, box, done, [])
        try:
            with self._cv:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._loop, name="lazymath-realize",
                                                    daemon=True)  # fmt: skip
                    self._thread.start()
                self._jobs.append(job)
                self._cv.notify()
            while not done.wait(0.05):
                pass
        except BaseException:
            with self._cv:
                self._jobs[:] = [j for j in self._jobs if j is not job]  # not started: withdrawn
                started = bool(job[3])
            if started:
                _cancel.request()
                while True:
                    try:
                        done.wait()
                        break
                    except KeyboardInterrupt:  # pressed again: the kernels are stopping
                        continue
                _cancel.clear()
            raise
        ok, result = box[0]
        if not ok:
            raise result
        return result

    def after_fork(self) -> None:
        """A forked child has no realize thread (and no lock holder): start afresh."""
        self.__init__()


_REALIZE_THREAD = _RealizeThread()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_REALIZE_THREAD.after_fork)


def _run_program(prog: Program, leaves: list, validate: bool, hit: bool, on_kernel=None,
                 out=None):  # fmt: skip
    """prog.run, interruptible when long: on the main thread a long program runs on the realize
    thread while this one waits interruptibly (`_RealizeThread`); its outputs are discarded on
    Ctrl-C. A run that overlapped someone else's cancel request may have had kernels cut short:
    it runs again."""
    epoch = _cancel.EPOCH[0]  # (no calls: the hit path is traced)
    data = [n.realized for n in leaves]
    check = _run_validated if validate else None
    if (_program_work(prog) < LONG_WORK
            or threading.current_thread() is not threading.main_thread()):  # fmt: skip
        results = prog.run(data, hit, leaves, on_kernel, check, out)
    else:
        results = _REALIZE_THREAD.run(lambda: prog.run(data, hit, leaves, on_kernel, check, out))
    if _cancel.EPOCH[0] != epoch:
        return _run_program(prog, leaves, validate, hit, on_kernel, out)
    return results


def program_key(key, spec, backend: str) -> tuple:
    """The program cache's key: the graph, the device, the backend, LAZYMATH_HOST_MATH (it
    changes the vector math sequences in the kernels) and LAZYMATH_TARGET_CPU (a program holds
    native code for one target: without it a graph realized again after the target changed
    replayed the first target's kernels)."""
    target = (settings.TARGET_CPU.get() or "").strip()
    target = "" if target in ("native", "host") else target
    return (key, spec.key(), backend, target) + (("hostmath",) if settings.HOST_MATH.get() else ())


def run_compiled(roots: list[gn.Node], backend: str | None = None, out=None) -> None:
    """Realize `roots` (pending nodes) through the program cache. `out`: a C-contiguous array
    roots[0]'s value is written into when the program's output slot allows (`realize(out=)`;
    the caller checks and copies otherwise)."""
    t0 = time.perf_counter()
    spec = device_spec()
    if backend is None:
        backend = _BACKEND.get()
    outputs, key, leaves, order = plan_outputs(roots)
    if out is not None:
        out = (roots[0], out)
    full_key = program_key(key, spec, backend)
    prog = PROGRAMS.get(full_key)
    fold = None
    if prog is not None and prog.folded:  # specialized to its scalars' values: same values?
        values = _leaf_values(leaves, prog.folded)
        if values != prog.folded_values:
            fold, full_key = prog.folded, full_key + (values,)
            prog = PROGRAMS.get(full_key)
    hit = prog is not None
    if not hit:
        # background compiles (tier-ups) wait while this realize compiles and runs its first
        # call (at most native.workers.HOLD_MAX s): on a small host they would take its cores.
        # The workers load here, fusion and the compile driver only after prestart() has set
        # the compile server booting, so the two overlap (see the deferred references above).
        if backend == "llvm":  # the compile server boots while this graph is fused, lowered
            workers.prestart()
        with workers.hold_background():
            _run_miss(outputs, leaves, order, spec, backend, key, full_key, t0, fold, out)
        return
    _run_and_commit(prog, outputs, leaves, hit, t0, out)


def _run_miss(outputs, leaves, order, spec, backend: str, key, full_key, t0: float,
              fold: tuple[int, ...] | None = None, out=None) -> None:  # fmt: skip
    reason = debug.miss_reason(key, order, spec, backend)
    if fold is not None:
        reason = "new values of scalars folded into the program's kernels"
    prog = compile_program(outputs, leaves, order, spec, backend, fold=fold)
    prog.miss_reason = reason
    PROGRAMS.put(full_key, prog)
    _run_and_commit(prog, outputs, leaves, False, t0, out)


def _run_and_commit(prog, outputs, leaves, hit: bool, t0: float, out=None) -> None:
    validate = _VALIDATE.get()
    level = _DEBUG.get()
    out_dir = settings.DEBUG_DIR.get()
    on_kernel = None
    if level >= 2 and not validate:
        on_kernel = debug.kernel_printer(prog)
    if out is not None:  # (output index of roots[0], array)
        out = next(((i, out[1]) for i, n in enumerate(outputs) if n is out[0]), None)
    results = _run_program(prog, leaves, validate, hit, on_kernel, out)
    for n, v in zip(outputs, results):
        commit(n, v)
    if level or out_dir:
        debug.report(prog, hit, level, t0, out_dir, validate)


def backend_report(sched) -> list[str]:
    """The backend's lines of a schedule's printout (`Schedule.report`, handed over by
    make_schedule: fusion imports no backend): every kernel with vmath composites, inlined or
    calling the vector math runtime library (`backend.host.vmlib.call_plan`); then, when the
    kernels become native code, the host target and each matmul's host GEMM mapping
    (microkernel, panels, work split, and whether a model or a measurement chose it)."""
    lines = []
    vm = []
    for sk in sched.kernels:
        ir = sk.ir
        if ir is None or sk.kind == "aicpu":  # numpy on the host: no vector math
            continue
        why = vmlib.call_plan(ir)[1]
        if why:
            vm.append((sk.name, why))
    if vm:
        lines.append("vector math (composites inlined or called from the runtime library):")
        lines.extend(f"  {name}: {why}" for name, why in vm)
    if compile_driver.default_backend() != "llvm":
        return lines
    lines.append(host.describe().splitlines()[0])
    for k in sched.kernels:
        if k.kind == "matmul" and k.ir is not None:
            lines.append(f"  {k.name} host GEMM: {autotune.explain(k.ir, sched.spec)}")
    return lines


def schedule_of(roots: list[gn.Node], spec=None):
    """The schedule a realize of the pending nodes `roots` would run (`lm.schedule`)."""
    if not roots:
        spec = get_spec(spec) if spec is not None else device_spec()
        return fusion.make_schedule([], spec, row_template=rows_template, report=backend_report)
    outputs, _, leaves, _ = plan_outputs(roots)  # the outputs a realize would write
    spec = get_spec(spec) if spec is not None else device_spec()
    return plan_schedule(outputs, leaves, spec)[0]
