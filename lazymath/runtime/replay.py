"""Replay of a compiled program on a device: bind the inputs, lease the outputs, launch.

A `Program` is what the engine caches per graph signature: its kernels (each with its
scheduled record: stream, waits, records, unit; and its compiled kernel: `run_block`,
`make_argv`, for native code `_cfunc`), the argument slots of every kernel (an input, an
intermediate at an arena offset, an output) and the arena size. `Program.run` binds a call's
input arrays to the slots and runs the kernels in one of three ways:

- the replay fast path (`_run_replay`): a single-stream program of native kernels reuses a
  context (arena + one ctypes argv per kernel with the arena addresses in place), so a call
  only writes input and output addresses and calls the kernels;
- in order on the calling thread (`run_in_order`): one stream and no events, or timed kernel
  by kernel for LAZYMATH_DEBUG>=2;
- on the device's streams, joined by events (`Device.execute`, the one stream replay loop the
  low-level API uses too), under the profiler's realize bracket.

Outputs (`_device_array`): small ones come from numpy's allocator; bigger ones are leased from
the device's memory pool and go back to it when the array dies (a weakref callback).

The schedule and kernels are duck-typed: this module imports nothing above the runtime.
"""

from __future__ import annotations

import ctypes
import itertools
import weakref
from dataclasses import dataclass, field
from sys import getrefcount as _getrefcount
from time import perf_counter

import numpy as np

from lazymath._threads import launch_blocks
from lazymath.runtime import api as _api
from lazymath.runtime import profiler as _prof
from lazymath.runtime.api import Launch
from lazymath.runtime.pool import aligned


def address_of(a: np.ndarray) -> tuple:
    """What the replay paths cache on a graph node for its realized array (`node.addr`): the
    array itself (the cache is valid while `node.realized is` it), its data address and a
    small int naming its layout (shape, dtype, strides: `layout_id`).

    Why cached: `__array_interface__` builds a dict (~0.3 us) and `shape`/`strides` build
    tuples on every read; an input reused across calls (a weight, a loop's carried value)
    then costs two attribute reads to bind and to key lm.jit's replay lookup."""
    return (a, a.__array_interface__["data"][0], layout_id(a))


def layout_id(a: np.ndarray) -> int:
    """A small int per distinct (shape, dtype, strides): equal ints, equal layouts. Ids are
    never reused (a counter), so clearing the table when it grows only costs new ids for
    layouts seen again: a key holding an old id simply stops matching."""
    k = (a.shape, a.dtype, a.strides)
    v = _LAYOUTS.get(k)
    if v is None:
        if len(_LAYOUTS) >= 1 << 16:
            _LAYOUTS.clear()
        v = _LAYOUTS[k] = next(_LAYOUT_IDS)
    return v


_LAYOUTS: dict = {}
_LAYOUT_IDS = itertools.count()

# (block_idx, block_num) of a one-block launch as ready ctypes arguments for a kernel
# function's `raw` twin (backend.native.jit.as_cfunc: no per-call argument conversion)
ONE_BLOCK = (ctypes.c_int64(0), ctypes.c_int64(1))


@dataclass
class Slot:
    kind: str  # leaf | arena | out | alias
    # leaf index / output index / arena offset / alias: the slot whose memory it is (an
    # earlier slot; the same bytes typed as this slot's shape and dtype)
    index: int
    shape: tuple = ()
    dtype: np.dtype | None = None

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * self.dtype.itemsize


@dataclass
class Program:
    """A compiled program and how to run it; cached by the engine per graph signature."""

    schedule: object  # the compiled stage (fusion.Schedule): n_events, kernels' flops/bytes
    kernels: list  # (scheduled kernel, compiled kernel, [slot ids])
    slots: list[Slot]
    arena_bytes: int
    outputs: list[int]  # slot id per output
    copy_leaves: set[int] = field(default_factory=set)  # inputs the kernels read contiguous
    hits: int = 0
    label: str = ""
    origins: list = field(default_factory=list)  # per kernel: memory / disk / compiled / ...
    miss_reason: str = ""  # why the program cache missed when this program was compiled
    folded: tuple = ()  # leaf positions of runtime scalars folded in as constants (engine)
    folded_values: tuple = ()  # their bytes: the values this program is specialized to
    inline: bool = False  # single stream, no events: launch on the caller's thread
    _events: list | None = None  # the program's events, reused by every replay
    _launches: tuple | None = None  # one runtime `Launch` per kernel, built on first use
    _replay: tuple | None = None  # fast-path plan (`_replay_plan`), built on first use
    _contexts: list = field(default_factory=list)  # idle replay contexts (arena + argvs)

    def run(self, leaves: list[np.ndarray], hit: bool = False, leaf_nodes: list | None = None,
            on_kernel=None, check=None, out=None) -> list[np.ndarray]:  # fmt: skip
        """Bind inputs, allocate the arena and outputs, launch every kernel on its stream
        (events order cross-stream work) and wait for the results.

        `leaf_nodes` (the graph nodes behind `leaves`, optional) let the replay path cache each
        input's data address on its node (`node.addr`): weights and other inputs reused across
        calls then cost nothing to bind. `on_kernel(i, seconds)` (LAZYMATH_DEBUG>=2): the
        kernels run one after another on this thread, each timed, and the callback hears of
        each as it finishes. `check(sk, ck, arrays)` (LAZYMATH_VALIDATE): runs each kernel
        itself, in schedule order, and compares it with a reference (the engine's validator:
        it needs the backend, which this layer does not import). `out` = (output index,
        array): that output is written straight into the caller's C-contiguous array when its
        slot is a plain output of the same shape and dtype (`realize(out=...)`)."""
        dev = _api._CURRENT or _api.current_device()
        inline = self.inline and _prof._ACTIVE is None
        if inline and check is None and on_kernel is None and out is None:
            plan = self._replay
            if plan is None:
                plan = self._replay = _replay_plan(self)
            if plan:
                return self._run_replay(plan, leaves, dev, leaf_nodes)
        arena = dev.malloc(self.arena_bytes) if self.arena_bytes else None
        n = len(self.slots)
        arrays: list = [None] * n
        addrs: list = [0] * n
        for i, s in enumerate(self.slots):
            if s.kind == "leaf":
                a = leaves[s.index]
                if s.index in self.copy_leaves:
                    a = np.ascontiguousarray(a)
                arrays[i] = a
                addrs[i] = a.__array_interface__["data"][0]
            elif s.kind == "arena":
                size = s.nbytes
                if arena is None:  # every intermediate is empty (a zero-size graph)
                    arrays[i] = np.empty(s.shape, s.dtype)
                    continue
                arrays[i] = arena.raw[s.index : s.index + size].view(s.dtype).reshape(s.shape)
                addrs[i] = arena.address + s.index
            elif s.kind == "alias":
                arrays[i] = arrays[s.index].view(s.dtype).reshape(s.shape)
                addrs[i] = addrs[s.index]
            elif (
                out is not None
                and s.index == out[0]
                and out[1].shape == s.shape
                and (out[1].dtype == s.dtype and out[1].flags.c_contiguous)
            ):  # `realize(out=...)`: the caller's array is this output's memory
                arrays[i], addrs[i] = out[1], out[1].__array_interface__["data"][0]
            else:
                arrays[i], addrs[i] = _output_array(dev, s)
        try:
            if check is not None:
                for sk, ck, slot_ids in self.kernels:
                    check(sk, ck, [arrays[j] for j in slot_ids])
            else:
                # built one at a time as the loop reaches each kernel: a stream worker starts
                # kernel k while this thread builds kernel k+1's argv
                argvs = (_argv(ck, arrays, addrs, slot_ids) for _sk, ck, slot_ids in self.kernels)
                if inline or on_kernel is not None:
                    # one stream, no events (or timed): in order on this thread, what a
                    # host-assisted synchronize would do, without waking a stream worker
                    run_in_order(self.launches(), argvs, dev.block_pool, on_kernel)
                else:
                    events = self._events
                    if events is None:
                        events = [_api.Event() for _ in range(self.schedule.n_events)]
                        self._events = events
                    with _prof.realize(self.label, cache_hit=hit):
                        dev.execute(self.launches(), argvs, events)
        finally:
            if arena is not None:
                dev.free(arena)
        if out is not None:  # a view: the engine makes results read-only, not the caller's array
            return [a.view() if a is out[1] else a for a in (arrays[j] for j in self.outputs)]
        return [arrays[j] for j in self.outputs]

    def launches(self) -> tuple:
        """The program as runtime `Launch` steps (stream, waits, record per kernel)."""
        steps = self._launches
        if steps is None:
            steps = self._launches = tuple(
                Launch(
                    ck,
                    ck.blocks,
                    sk.stream,
                    tuple(sk.waits),
                    sk.records,
                    sk.unit,
                    sk.bound,
                    sk.source_loc,
                )  # fmt: skip
                for sk, ck, _slots in self.kernels
            )
        return steps

    def _run_replay(self, plan: tuple, leaves: list[np.ndarray], dev,
                    leaf_nodes: list | None) -> list[np.ndarray]:  # fmt: skip
        """The replay of a cached single-stream program of native kernels, with as little
        Python per kernel as possible: a context (arena + one ctypes argv per kernel with the
        arena addresses filled in) is reused across calls, so a call only writes the input and
        output addresses into the argvs and calls the kernels.

        Contexts are taken from and returned to a list (atomic under the GIL), so threads
        replaying the same program at once each get their own."""
        leaf_slots, out_slots, calls = plan
        try:
            ctx = self._contexts.pop()
        except IndexError:
            ctx = _ReplayContext(self, dev)
        try:
            patches = ctx.patches
            for slot, li, copy in leaf_slots:
                a = leaves[li]
                if copy:
                    a = np.ascontiguousarray(a)
                    ctx.keep.append(a)
                    addr = a.__array_interface__["data"][0]
                elif leaf_nodes is not None:
                    node = leaf_nodes[li]
                    cached = node.addr
                    if cached is not None and cached[0] is a:
                        addr = cached[1]
                    else:  # the array object is part of the check: `realized` may change
                        cached = node.addr = address_of(a)
                        addr = cached[1]
                else:
                    addr = a.__array_interface__["data"][0]
                for argv, pos in patches[slot]:
                    argv[pos] = addr
            outs = []
            last, last_addr = ctx.outs, ctx.out_addrs
            for k, (slot, s, small) in enumerate(out_slots):
                if small:
                    # The previous call's output, if nobody but this context refers to it any
                    # more (the references: ctx.outs, `a`, getrefcount's argument), is reused:
                    # views, tensors and np.asarray results all hold references, so a live
                    # result is never overwritten.
                    a = last[k]
                    if a is not None and _getrefcount(a) == 3:
                        addr = last_addr[k]
                    else:
                        a = np.empty(s.shape, s.dtype)
                        a.flags.writeable = False  # realized arrays are immutable
                        addr = a.__array_interface__["data"][0]
                        last[k], last_addr[k] = a, addr
                else:
                    a, addr = _device_array(dev, s)
                    a.flags.writeable = False
                outs.append(a)
                for argv, pos in patches[slot]:
                    argv[pos] = addr
            pool = dev.block_pool
            for (ck, blocks), argv in zip(calls, ctx.argvs):
                if blocks <= 1:  # (cf held across the call: a tier-up may replace _cfunc)
                    cf = ck._cfunc
                    cf.raw(*ONE_BLOCK, argv)
                else:
                    pool.run_native(ck._cfunc, argv, blocks)
        finally:
            ctx.keep.clear()
            if self.arena_bytes <= KEEP_ARENA_BYTES:
                self._contexts.append(ctx)
            # else: the context dies here and its arena goes back to the device pool; a big
            # arena must not stay reserved for as long as the program is cached
        return outs


class BoundReplay:
    """A program's replay bound to one caller's mapping of inputs (lm.jit's stored entries):
    which call input feeds each program leaf and which leaves are fixed arrays (captured
    constants, written into the argvs once per context).

    Why a separate path from `_run_replay`: a staged function replays the same program with
    the same kind of inputs millions of times, so per call it must build no list of arrays and
    walk no slots: it writes an input's address only when it differs from what the context's
    argvs already hold, reuses a small output the caller dropped (the reference count says so),
    and calls the kernels. Contexts are popped and pushed (atomic under the GIL), so threads
    replaying at once each get their own. `make` returns None for programs that do not
    qualify (not inline, not all native, workspaces, an input the kernels read contiguous)."""

    __slots__ = ("prog", "_used", "_in_slots", "_fixed", "_outs", "_calls", "_ctxs", "_keep")

    def __init__(self, prog: Program, used, in_slots, fixed, outs, calls) -> None:
        self.prog = prog
        self._used = used  # call input positions that feed a program leaf
        self._in_slots = in_slots  # per used input: the slot ids it binds
        self._fixed = fixed  # (slot id, array): fixed leaves
        self._outs = outs  # per output: (slot id, slot, small)
        self._calls = calls  # (compiled kernel, blocks): `_cfunc` read per call (tiering)
        self._ctxs: list = []
        self._keep = prog.arena_bytes <= KEEP_ARENA_BYTES

    @classmethod
    def make(cls, prog: Program, leaf_src: list[int], fixed: list,
             in_order: bool = False) -> BoundReplay | None:  # fmt: skip
        """`leaf_src[i]`: the call input feeding program leaf i, or -1 for `fixed[i]`.
        `in_order`: also a program on several streams, its kernels then run one after another
        in schedule order on the caller's thread, as `run_in_order` and the sync scheduler do
        (a valid order: the memory plan's liveness is over it). For short programs whose
        streams' overlap gains less than their thread hand-offs cost (the torch backend's
        backward graphs of a small model: ~1 ms per call through the streams)."""
        if not prog.inline and not in_order:
            return None
        plan = prog._replay
        if plan is None:
            plan = prog._replay = _replay_plan(prog)
        if not plan:
            return None
        leaf_slots, out_slots, calls = plan
        by_input: dict[int, list[int]] = {}
        fixed_slots = []
        for slot, li, copy in leaf_slots:
            k = leaf_src[li]
            if k < 0:
                a = fixed[li]
                fixed_slots.append((slot, np.ascontiguousarray(a) if copy else a))
            elif copy:
                return None  # a strided input copied per call: the general path does that
            else:
                by_input.setdefault(k, []).append(slot)
        used = tuple(sorted(by_input))
        return cls(prog, used, tuple(tuple(by_input[k]) for k in used), tuple(fixed_slots),
                   tuple(out_slots), tuple(calls))  # fmt: skip

    def holds(self, a: np.ndarray) -> bool:
        """Whether an idle context keeps `a` as its last output (for reuse once dropped)."""
        return any(x is a for c in self._ctxs for x in c[0].outs)

    def with_blocks(self, blocks: int) -> BoundReplay:
        """The same binding launching each kernel on at most `blocks` host blocks (its own
        contexts): a dynamic-shape program's small batch, whose kernels were mapped to host
        blocks for the most rows they serve (the body splits any count, so any is correct)."""
        calls = tuple((ck, min(b, blocks)) for ck, b in self._calls)
        return BoundReplay(self.prog, self._used, self._in_slots, self._fixed, self._outs, calls)

    def _context(self, dev) -> list:
        """[runtime context, per used input (argv, pos) patches, last addresses written]."""
        ctx = _ReplayContext(self.prog, dev)
        patches = ctx.patches
        for slot, a in self._fixed:
            ctx.keep.append(a)  # alive as long as the context (the entry holds it too)
            addr = a.__array_interface__["data"][0]
            for argv, pos in patches[slot]:
                argv[pos] = addr
        in_patch = tuple(tuple(p for slot in slots for p in patches[slot])
                         for slots in self._in_slots)  # fmt: skip
        out_patch = tuple(tuple(patches[slot]) for slot, _s, _small in self._outs)
        return [ctx, in_patch, [0] * len(self._used), out_patch]

    def __call__(self, nodes: list, dev) -> list[np.ndarray]:
        """Run on the realized arrays of `nodes` (the call's input nodes, in input order); the
        outputs in program order. Each node caches its array's address (`node.addr`)."""
        addrs = []
        for node in nodes:
            a = node.realized
            cached = node.addr
            if cached is None or cached[0] is not a:
                cached = node.addr = address_of(a)
            addrs.append(cached[1])
        return self.launch(addrs, dev)

    def launch(self, addrs: list[int], dev) -> list[np.ndarray]:
        """Run on inputs at data addresses `addrs` (per call input: lm.jit's fast path read
        them from `node.addr` while building its key); the outputs in program order, small
        ones reused when the caller dropped the previous result. The caller keeps the inputs
        alive during the call."""
        try:
            c = self._ctxs.pop()
        except IndexError:
            c = self._context(dev)
        ctx, in_patch, in_addr, out_patch = c
        try:
            for j, k in enumerate(self._used):
                addr = addrs[k]
                if in_addr[j] != addr:
                    in_addr[j] = addr
                    for argv, pos in in_patch[j]:
                        argv[pos] = addr
            outs = []
            last, last_addr = ctx.outs, ctx.out_addrs
            for k, (_slot, s, small) in enumerate(self._outs):
                if small:
                    # reused when only the context still refers to the previous result (the
                    # references: ctx.outs, `a`, getrefcount's argument); see `_run_replay`
                    a = last[k]
                    if a is not None and _getrefcount(a) == 3:
                        outs.append(a)
                        continue
                    a = np.empty(s.shape, s.dtype)
                    a.flags.writeable = False  # realized arrays are immutable
                    addr = a.__array_interface__["data"][0]
                    last[k], last_addr[k] = a, addr
                else:
                    a, addr = _device_array(dev, s)
                    a.flags.writeable = False
                outs.append(a)
                for argv, pos in out_patch[k]:
                    argv[pos] = addr
            pool = dev.block_pool
            for (ck, blocks), argv in zip(self._calls, ctx.argvs):
                if blocks <= 1:  # (cf held across the call: a tier-up may replace _cfunc)
                    cf = ck._cfunc
                    cf.raw(*ONE_BLOCK, argv)
                else:
                    pool.run_native(ck._cfunc, argv, blocks)
        finally:
            if self._keep:
                self._ctxs.append(c)
        return outs

    def run_addresses(self, addrs: list[int], out_addrs: list[int], dev) -> None:
        """`run_into` from raw data addresses (per call input, per output): a caller that
        knows them (row views of one buffer, at an offset from its base) saves one
        `__array_interface__` dict per array per launch. The caller keeps the memory alive."""
        try:
            c = self._ctxs.pop()
        except IndexError:
            c = self._context(dev)
        ctx, in_patch, in_addr, out_patch = c
        try:
            for j, k in enumerate(self._used):
                addr = addrs[k]
                if in_addr[j] != addr:
                    in_addr[j] = addr
                    for argv, pos in in_patch[j]:
                        argv[pos] = addr
            last = ctx.outs
            for k, addr in enumerate(out_addrs):
                last[k] = None
                for argv, pos in out_patch[k]:
                    argv[pos] = addr
            pool = dev.block_pool
            for (ck, blocks), argv in zip(self._calls, ctx.argvs):
                if blocks <= 1:  # (cf held across the call: a tier-up may replace _cfunc)
                    cf = ck._cfunc
                    cf.raw(*ONE_BLOCK, argv)
                else:
                    pool.run_native(ck._cfunc, argv, blocks)
        finally:
            if self._keep:
                self._ctxs.append(c)

    def run_into(self, arrays: list[np.ndarray], out: list[np.ndarray], dev) -> None:
        """Run on `arrays` (per call input, C-contiguous where the program was traced so)
        writing the outputs into `out` (C-contiguous arrays of the output slots' shapes and
        dtypes, e.g. row chunks of a bigger result): lm.jit's dynamic batch and `out=`."""
        try:
            c = self._ctxs.pop()
        except IndexError:
            c = self._context(dev)
        ctx, in_patch, in_addr, out_patch = c
        try:
            for j, k in enumerate(self._used):
                addr = arrays[k].__array_interface__["data"][0]
                if in_addr[j] != addr:
                    in_addr[j] = addr
                    for argv, pos in in_patch[j]:
                        argv[pos] = addr
            last = ctx.outs
            for k, a in enumerate(out):
                last[k] = None  # the context's reusable output is replaced below
                addr = a.__array_interface__["data"][0]
                for argv, pos in out_patch[k]:
                    argv[pos] = addr
            pool = dev.block_pool
            for (ck, blocks), argv in zip(self._calls, ctx.argvs):
                if blocks <= 1:  # (cf held across the call: a tier-up may replace _cfunc)
                    cf = ck._cfunc
                    cf.raw(*ONE_BLOCK, argv)
                else:
                    pool.run_native(ck._cfunc, argv, blocks)
        finally:
            if self._keep:
                self._ctxs.append(c)


# Outputs smaller than this come from numpy's allocator: its small-block cache is several
# times cheaper per call than the device pool plus a finalizer, and at these sizes the pool's
# reuse saves nothing. Bigger outputs come from the device pool (accounted, reused warm).
SMALL_OUTPUT_BYTES = 1 << 20
KEEP_ARENA_BYTES = 1 << 20  # replay contexts keep arenas up to this size between calls


def _output_array(dev, s: Slot) -> tuple[np.ndarray, int]:
    if s.nbytes < SMALL_OUTPUT_BYTES:
        a = np.empty(s.shape, s.dtype)
        return a, a.__array_interface__["data"][0]
    return _device_array(dev, s)


def _replay_plan(prog: Program) -> tuple | None:
    """What `_run_replay` needs, or () when the program does not qualify (a kernel that is not
    native code, or one that takes a fresh workspace per launch)."""
    for _sk, ck, _slots in prog.kernels:
        if getattr(ck, "_cfunc", None) is None or ck.program.workspace:
            return ()
    leaf_slots = [(i, s.index, s.index in prog.copy_leaves)
                  for i, s in enumerate(prog.slots) if s.kind == "leaf"]  # fmt: skip
    out_slots = [(i, s, s.nbytes < SMALL_OUTPUT_BYTES)
                 for i, s in enumerate(prog.slots) if s.kind == "out"]  # fmt: skip
    order = {slot: k for k, slot in enumerate(prog.outputs)}
    out_slots.sort(key=lambda t: order[t[0]])
    if [t[0] for t in out_slots] != list(prog.outputs):  # an output slot listed twice
        return ()
    calls = [(ck, ck.blocks) for _sk, ck, _slots in prog.kernels]
    return leaf_slots, out_slots, calls


class _ReplayContext:
    """One set of launch arguments for a program: the arena and a ctypes argv per kernel,
    with the arena addresses already in place.

    A small arena (up to KEEP_ARENA_BYTES) belongs to the context, like the program's code,
    and lives as long as the program is cached; it does not count as device memory in use. A
    bigger one comes from the device pool for one call and goes back after it."""

    def __init__(self, prog: Program, dev) -> None:
        self.dev = dev
        self.arena = None
        self.own = None
        address = 0
        if 0 < prog.arena_bytes <= KEEP_ARENA_BYTES:
            self.own = aligned(prog.arena_bytes)
            address = self.own.__array_interface__["data"][0]
        elif prog.arena_bytes:
            self.arena = dev.malloc(prog.arena_bytes)
            address = self.arena.address
        self.keep: list = []  # contiguous copies of inputs, alive during one call
        self.outs: list = [None] * len(prog.outputs)  # last small outputs (reused when dropped)
        self.out_addrs: list = [0] * len(prog.outputs)
        self.patches: dict[int, list] = {}
        self.argvs = []
        for _sk, _ck, slot_ids in prog.kernels:
            argv = (ctypes.c_void_p * len(slot_ids))()
            for pos, j in enumerate(slot_ids):
                s = prog.slots[j]
                if s.kind == "alias":  # patched with the address of the slot it aliases
                    j, s = s.index, prog.slots[s.index]
                if s.kind == "arena":
                    argv[pos] = address + s.index
                else:
                    self.patches.setdefault(j, []).append((argv, pos))
            self.argvs.append(argv)
        for j in range(len(prog.slots)):
            self.patches.setdefault(j, [])

    def __del__(self) -> None:
        arena = getattr(self, "arena", None)
        if arena is not None:
            try:
                self.dev.free(arena)
            except Exception:  # interpreter shutdown
                pass


def _argv(ck, arrays, addrs, slot_ids):
    """Native kernels take raw addresses (cached per buffer, no numpy ctypes objects); the
    interpreter, AI CPU and irref kernels take the arrays themselves."""
    if getattr(ck, "_cfunc", None) is not None:
        if ck.program.workspace:
            return ck.argv_from_addresses([addrs[j] for j in slot_ids])
        return (ctypes.c_void_p * len(slot_ids))(*[addrs[j] for j in slot_ids])
    return ck.make_argv([arrays[j] for j in slot_ids])


def _device_array(dev, s: Slot) -> tuple[np.ndarray, int]:
    """An output buffer from the device pool (returned to the pool when the array dies) and
    its address."""
    if s.nbytes == 0:
        a = np.empty(s.shape, s.dtype)
        return a, a.__array_interface__["data"][0]
    buf = dev.malloc(s.nbytes)
    arr = buf.raw[: s.nbytes].view(s.dtype).reshape(s.shape)
    # a weakref with a callback, kept in a table until it fires: a fraction of the cost of
    # weakref.finalize (~15 us), which matters for outputs of multi-MiB matmuls at 60 per second
    ref = weakref.ref(arr, _return_output)
    _OUTPUT_LEASES[id(ref)] = (ref, dev, buf)
    return arr, buf.address


_OUTPUT_LEASES: dict = {}  # id(weakref to an output array) -> (the weakref, device, buffer)


def _return_output(ref) -> None:
    lease = _OUTPUT_LEASES.pop(id(ref), None)
    if lease is not None:
        try:
            lease[1].free(lease[2])
        except Exception:  # interpreter shutdown: the pool may be gone
            pass


def run_in_order(steps, argvs, pool, on_kernel=None) -> None:
    """Run `Launch` steps one after another on the calling thread, each kernel's blocks on
    `pool` (a device's `block_pool`), ignoring streams and events: right for a program on one
    stream, and for any schedule order (a valid order). `on_kernel(i, seconds)` times each."""
    if on_kernel is None:
        for step, argv in zip(steps, argvs):
            ck = step.kernel
            if step.blocks <= 1:
                ck.run_block(argv, 0, 1)
            else:
                launch_blocks(pool, ck, argv, step.blocks)
        return
    for i, (step, argv) in enumerate(zip(steps, argvs)):
        ck = step.kernel
        t = perf_counter()
        if step.blocks <= 1:
            ck.run_block(argv, 0, 1)
        else:
            launch_blocks(pool, ck, argv, step.blocks)
        on_kernel(i, perf_counter() - t)
