"""Cycle cost model of an `isa.Program` on a DeviceSpec: busy cycles per pipe and a timeline.

Model (constants from the spec, see ../shared/NPU_FACTS.md):
- the Scalar unit walks the program in order and issues each instruction into the in-order
  queue of its pipe (1 cycle per issued instruction, 2 per loop iteration);
- Vector: ``latency(op) + ceil(bytes / 256) * cycles_per_repeat - 1`` cycles;
- movers: ``fixed + bytes / bytes_per_cycle`` busy cycles, and the data is there (for a
  set_flag) after the GM read / write latency on top;
- pipes run in parallel and synchronise only through set_flag / wait_flag (and pipe_barrier),
  so double buffering shows up as overlap: while Vector computes tile i, MTE2 loads tile i+1.
  A program with no flags at all is treated as fully serialised (barrier after every
  instruction), never as free overlap.

Loops have static trip counts, so the walk simulates the first iterations, measures the
steady-state period (two iterations: ping-pong buffers alternate), advances the state by whole
periods and simulates the tail: cost is independent of the trip count. Blocks run in parallel on
separate cores; the estimate is for block 0 of ``program.device_blocks`` (it has the largest
share), i.e. the kernel's makespan.

MIX kernels (AIC + AIV on the split 910B, `isa.is_mix`): each core kind has its own Scalar unit,
its own instruction stream and its own pipes (`isa.mix_streams`), so the model keeps one pipe
state per core and charges each instruction to its core (`isa.core_of`); the only coupling is
the cross-core flags: a set fires when the setting pipe is done plus the GM write latency (the
tile it announces is in the GM workspace), a wait stalls the waiting core's pipe until then. The
body is walked once in program order (a valid interleaving: every wait comes after its set), so
the two streams advance concurrently in simulated time and the kernel ends when the later
stream ends. Pipes of a MIX cost are named per core ("AIC.Cube", "AIV.Vector", ...);
`KernelCost.streams` has each core's end time. (Before, the whole body was one Scalar stream:
the AIC's loop and the AIV's epilogue were issued one after the other and every AIV barrier
stalled the AIC, so each 910B MIX kernel was modelled slower than its Cube + Vector kernels.)

Costs of other instruction types are registered with ``@cost.register(InstrType)`` and return
``(pipe, busy_cycles, latency_cycles)``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from lazymath.backend.npu import isa

COST: dict[type, Callable] = {}
MAX_INTERVALS = 4096  # per pipe; beyond this the timeline is summarised
EXPLICIT_TRIPS = 6  # loops up to this many iterations are simulated one by one
MAX_WALK_PERIODS = 2048  # a loop without a steady state is walked up to this many periods


def register(cls: type) -> Callable:
    """`@register(Instr) def fn(ctx: CostCtx, instr) -> (pipe, busy, latency)`."""

    def deco(fn: Callable) -> Callable:
        COST[cls] = fn
        return fn

    return deco


@dataclass
class KernelCost:
    """Cycles of one kernel on the NPU (block 0 of `blocks` parallel blocks)."""

    name: str
    pipes: dict[str, float]  # busy cycles per pipe
    total: float  # makespan of the block, cycles
    intervals: dict[str, list[tuple[float, float]]]  # busy intervals per pipe (timeline)
    blocks: int
    clock_hz: float
    truncated: bool = False  # the interval lists summarise the tail of very long loops
    unknown: list[str] = field(default_factory=list)  # instruction types without a cost rule
    streams: dict[str, float] = field(default_factory=dict)  # MIX: core -> its stream's end

    @property
    def seconds(self) -> float:
        return self.total / self.clock_hz

    @property
    def bound(self) -> str:
        """The busiest pipe (what limits this kernel)."""
        return max(self.pipes, key=self.pipes.get) if self.pipes else "Scalar"

    def utilization(self) -> dict[str, float]:
        return {p: (c / self.total if self.total else 0.0) for p, c in self.pipes.items()}

    def __str__(self) -> str:
        head = f"kernel {self.name}: {self.total:,.0f} cycles ({self.seconds * 1e6:.2f} us at "
        head += f"{self.clock_hz / 1e9:g} GHz) on {self.blocks} blocks, bound by {self.bound}"
        lines = [head]
        if self.streams:
            lines.append("  streams  " + ", ".join(f"{c} {t:,.0f} cycles"
                                                   for c, t in self.streams.items()))  # fmt: skip
        for p, c in sorted(self.pipes.items(), key=lambda kv: -kv[1]):
            if c:
                lines.append(f"  {p:11} {c:14,.0f} cycles  {100 * c / max(self.total, 1):5.1f}%")
        return "\n".join(lines)


_FLAG_PIPE = isa.FLAG_PIPE_OF


class _State:
    """Pipe clocks, pending flags and accumulated busy time."""

    __slots__ = ("free", "done", "scalar", "flags", "busy")

    def __init__(self) -> None:
        self.free = {p: 0.0 for p in isa.PIPES}
        self.done = {p: 0.0 for p in isa.PIPES}
        self.scalar = 0.0
        self.flags: dict[tuple, deque] = {}
        self.busy = {p: 0.0 for p in isa.PIPES}

    def tick(self, cycles: int) -> None:
        """The Scalar unit issues for `cycles` (busy["Scalar"] counts issue, not stalls)."""
        self.scalar += cycles
        self.busy["Scalar"] += cycles

    def snapshot(self) -> tuple:
        return (dict(self.free), dict(self.done), self.scalar,
                {k: list(v) for k, v in self.flags.items()}, dict(self.busy))  # fmt: skip


class CostCtx:
    """What cost functions see: the spec and IntExpr evaluation in the current iteration."""

    def __init__(self, program: isa.Program, spec, block_num: int, values: dict | None = None):
        self.program = program
        self.values = values or {}  # run-time values (isa.GetValue) by variable name
        self.spec = spec
        self.env: dict = {isa.BLOCK_IDX: 0, isa.BLOCK_NUM: block_num, isa.SUBBLOCK_IDX: 0}
        self.state = _State()
        self.mix = isa.is_mix(program)
        self.core = ""  # MIX: the core whose state is `state`
        self.states = {"": self.state}
        self.cores: dict[int, tuple] = {}
        self.cross: dict[tuple, deque] = {}  # MIX: (setter, flag, AIV index) -> fire times
        self.aivs = 1  # MIX: AIVs per AIC the kernel uses (its sub-block loops)
        self.sub = False  # MIX: inside a sub-block loop (AIV work of AIV `SUBBLOCK_IDX`)
        keys = list(isa.PIPES)
        if self.mix:
            self.aivs = isa.mix_aivs(program)
            names = ["AIC", *(["AIV"] if self.aivs == 1 else
                              [f"AIV{v}" for v in range(self.aivs)])]  # fmt: skip
            self.states = {c: _State() for c in names}
            self.cores = isa.mix_cores(program.body)
            keys = [f"{c}.{p}" for c in names for p in isa.CORE_PIPES[c[:3]]]
        self.intervals: dict[str, list] = {p: [] for p in keys}
        self.truncated = False
        self.unknown: set[str] = set()
        self.last_arrival = _last_arrivals(program.body)
        self.serial = not any(isinstance(i, (isa.SetFlag, isa.WaitFlag, isa.CrossCoreSetFlag,
                                             isa.CrossCoreWaitFlag))
                              for i, _ in isa.walk(program.body))  # fmt: skip

    def int(self, e) -> int:
        return isa.eval_int(e, self.env)

    # ---------------------------------------------------------------- one instruction
    def issue(self, pipe: str, busy: float, latency: float = 0.0) -> None:
        s = self.state
        s.tick(1)
        start = max(s.free[pipe], s.scalar)
        if self.serial:
            start = max(start, *s.done.values(), *s.free.values())
        end = start + busy
        s.free[pipe] = end
        s.done[pipe] = max(s.done[pipe], end + latency)
        s.busy[pipe] += busy
        if busy > 0:
            self._record(f"{self.core}.{pipe}" if self.core else pipe, start, end)

    def _aiv(self) -> str:
        """The state of the AIV running now: sub-block `SUBBLOCK_IDX` (0 outside its loops)."""
        return "AIV" if self.aivs == 1 else f"AIV{self.env[isa.SUBBLOCK_IDX]}"

    def _use(self, instr) -> None:
        """MIX: charge what follows to the core that runs `instr`."""
        core = self.cores[id(instr)][0]
        self.core = self._aiv() if core == "AIV" else core
        self.state = self.states[self.core]

    def _scalar(self, instr, cycles: int) -> None:
        """Scalar cycles of control (Let, a loop iteration) on every core that runs it (each
        AIV runs the control flow around its sub-block sections)."""
        if not self.mix:
            self.state.tick(cycles)
            return
        for c in self.cores[id(instr)]:
            if c == "AIV" and not self.sub and self.aivs > 1:
                for v in range(self.aivs):
                    self.states[f"AIV{v}"].tick(cycles)
            else:
                self.states[self._aiv() if c == "AIV" else c].tick(cycles)

    def _subblocks(self, loop: isa.Loop) -> None:
        """A sub-block loop: iteration v is AIV v's own work (no loop on either core)."""
        for v in range(self.int(loop.start), self.int(loop.stop)):
            self.env[isa.SUBBLOCK_IDX] = v
            self.sub = True
            self.run(loop.body)
        self.env[isa.SUBBLOCK_IDX] = 0
        self.sub = False

    def _record(self, pipe: str, start: float, end: float) -> None:
        iv = self.intervals[pipe]
        if iv and abs(iv[-1][1] - start) < 1e-9:
            iv[-1] = (iv[-1][0], end)
        elif len(iv) < MAX_INTERVALS:
            iv.append((start, end))
        else:
            self.truncated = True
            iv[-1] = (iv[-1][0], max(iv[-1][1], end))

    def run(self, body) -> None:
        for instr in body:
            t = type(instr)
            if t is isa.Loop:
                if self.mix and instr.var == isa.SUBBLOCK_IDX:
                    self._subblocks(instr)
                else:
                    self._loop(instr)
            elif t is isa.If:
                if isa.CMP_OPS[instr.cmp](self.int(instr.a), self.int(instr.b)):
                    self.run(instr.body)
            elif t is isa.Let:
                self.env[instr.var] = self.int(instr.value)
                self._scalar(instr, 1)
            else:
                if self.mix:
                    self._use(instr)
                self._leaf(instr, t)

    def _leaf(self, instr, t: type) -> None:
        if t is isa.SetFlag:
            p = _FLAG_PIPE[instr.src]
            s = self.state
            when = max(s.free[p], s.done[p], s.scalar)
            s.flags.setdefault((instr.src, instr.dst, self.int(instr.event)), deque()).append(when)
            s.tick(1)
        elif t is isa.WaitFlag:
            s = self.state
            key = (instr.src, instr.dst, self.int(instr.event))
            q = s.flags.get(key)
            if not q:  # the NPU would wait forever: not a 1-cycle instruction
                raise ValueError(
                    f"kernel {self.program.name}: wait_flag {key[0]}->{key[1]} {key[2]} "
                    "with no pending set_flag (the NPU would deadlock)"
                )
            when = q.popleft()
            p = _FLAG_PIPE[instr.dst]
            if p == "Scalar":
                s.scalar = max(s.scalar, when)
            else:
                s.free[p] = max(s.free[p], when)
            s.tick(1)
        elif t is isa.CrossCoreSetFlag:  # MIX: the other core kind of the group
            p = _FLAG_PIPE[instr.pipe]
            s = self.state
            when = max(s.free[p], s.done[p], s.scalar) + self.spec.gm_write_latency
            f = self.int(instr.flag)
            # an AIC set reaches each AIV of the group; an AIV's set is its own
            to = range(self.aivs) if instr.side == "AIC" else (self.env[isa.SUBBLOCK_IDX],)
            for v in to:
                self.cross.setdefault((instr.side, f, v), deque()).append(when)
            s.tick(1)
        elif t is isa.CrossCoreWaitFlag:  # stalls this core's pipe, not the other core
            s = self.state
            setter = "AIV" if instr.side == "AIC" else "AIC"
            f = self.int(instr.flag)
            # the AIC waits for every AIV of the group; an AIV for the AIC's set to it
            frm = range(self.aivs) if instr.side == "AIC" else (self.env[isa.SUBBLOCK_IDX],)
            qs = [self.cross.get((setter, f, v)) for v in frm]
            if not all(qs):
                raise ValueError(
                    f"kernel {self.program.name}: {isa.format_instr(instr)} with no pending "
                    "cross-core set (the NPU would deadlock)"
                )
            p = _FLAG_PIPE[instr.pipe]
            s.free[p] = max(s.free[p], *(q.popleft() for q in qs))
            s.tick(1)
        elif t is isa.PipeBarrier:
            s = self.state
            # one core's pipes (a MIX state holds only its core's work: all of them)
            ps = isa.AIV_PIPES if instr.pipe == "AIV" and not self.mix else isa.PIPES
            t_all = max(*(s.free[p] for p in ps), *(s.done[p] for p in ps), s.scalar)
            for p in ps:
                s.free[p] = s.done[p] = t_all
            s.scalar = t_all
        elif t is isa.GetValue:  # a run-time size: the caller's value, else the bound
            self.env[instr.var] = self.values.get(instr.var.name, instr.bound)
            self.issue("Scalar", 1, self.spec.gm_read_latency)
        elif t is isa.AtomicAdd:  # assume this block arrives last: it pays for the combine
            last = self.last_arrival.get(id(instr))
            self.env[instr.var] = (
                self.int(last) if last is not None else self.env[isa.BLOCK_NUM] - 1
            )
            self.issue("Scalar", 1, self.spec.gm_read_latency)
        else:
            fn = COST.get(t)
            if fn is None:
                self.unknown.add(t.__name__)
                self.issue(isa.PIPE_OF.get(t, "Scalar"), 1)
                return
            pipe, busy, lat = fn(self, instr)
            self.issue(pipe, busy, lat)

    # ---------------------------------------------------------------- loops
    def _iteration(self, loop: isa.Loop, v: int) -> None:
        self.env[loop.var] = v
        self._scalar(loop, 2)
        self.run(loop.body)

    def _snapshot(self) -> tuple:
        return (tuple(st.snapshot() for st in self.states.values()),
                {k: list(v) for k, v in self.cross.items()})  # fmt: skip

    def _loop(self, loop: isa.Loop) -> None:
        start, stop, step = self.int(loop.start), self.int(loop.stop), self.int(loop.step)
        values = range(start, stop, step)
        n = len(values)
        if n <= EXPLICIT_TRIPS:
            for v in values:
                self._iteration(loop, v)
            return
        for k in range(2):
            self._iteration(loop, values[k])
        snap1, marks1 = self._snapshot(), {p: len(iv) for p, iv in self.intervals.items()}
        for k in range(2, 4):
            self._iteration(loop, values[k])
        snap3, marks3 = self._snapshot(), {p: len(iv) for p, iv in self.intervals.items()}
        middle = n - 5  # iterations 4 .. n-2 are steady state; n-1 may be a tail
        periods, rest = divmod(middle, 2)
        if periods >= 2:  # a second period proves the steady state before it is repeated
            for k in range(4, 6):
                self._iteration(loop, values[k])
            snap5 = self._snapshot()
            steady = _same_period(snap1, snap3, snap5) or periods > MAX_WALK_PERIODS
            if not (steady and self._advance(snap3, snap5, periods - 1, marks3)):
                for k in range(6, 4 + 2 * periods):  # no steady state: walk on
                    self._iteration(loop, values[k])
        elif not self._advance(snap1, snap3, periods, marks1):
            for k in range(4, 4 + 2 * periods):  # flags do not repeat with period 2: walk on
                self._iteration(loop, values[k])
        for k in range(4 + 2 * periods, n):
            self._iteration(loop, values[k])

    def _advance(self, a: tuple, b: tuple, periods: int, marks: dict) -> bool:
        """Move the state forward by `periods` copies of the (a -> b) period. False if the
        flag queues do not have the same shape at both points (no steady state)."""
        if periods <= 0:
            return True
        (states_a, cross_a), (states_b, cross_b) = a, b
        queues = [(cross_a, cross_b)] + [(sa[3], sb[3]) for sa, sb in zip(states_a, states_b)]
        for qa, qb in queues:
            if qa.keys() != qb.keys() or any(len(qa[k]) != len(qb[k]) for k in qa):
                return False
        shifts: dict[str, float] = {}
        for (core, s), sa, sb in zip(self.states.items(), states_a, states_b):
            free_a, done_a, sc_a, flags_a, busy_a = sa
            free_b, done_b, sc_b, flags_b, busy_b = sb
            for p in isa.PIPES:
                s.free[p] += periods * (free_b[p] - free_a[p])
                s.done[p] += periods * (done_b[p] - done_a[p])
                s.busy[p] += periods * (busy_b[p] - busy_a[p])
                shifts[f"{core}.{p}" if core else p] = free_b[p] - free_a[p]
            s.scalar += periods * (sc_b - sc_a)
            _shift_queues(s.flags, flags_a, periods)
        _shift_queues(self.cross, cross_a, periods)
        # timeline: repeat the period's intervals shifted by the period of each pipe
        for p, iv in self.intervals.items():
            period_iv = iv[marks[p] :]
            shift = shifts[p]
            if not period_iv or shift <= 0:
                continue
            room = MAX_INTERVALS - len(iv)
            reps = min(periods, room // max(len(period_iv), 1))
            for r in range(1, reps + 1):
                iv.extend((x + r * shift, y + r * shift) for x, y in period_iv)
            if reps < periods:
                self.truncated = True
                last_end = period_iv[-1][1] + periods * shift
                iv.append((period_iv[0][0] + (reps + 1) * shift, last_end))
        return True


def _same_period(a: tuple, b: tuple, c: tuple) -> bool:
    """Whether the (a -> b) and (b -> c) periods of a loop advanced every pipe's busy time and
    clock by the same amounts. Not so when the body's work depends on the loop variable (the
    causal attention's items: item i streams i + 1 K/V tiles), and then repeating the first
    period undercounts: the fused attention's causal Cube time came out at 0.14 of the full
    one's instead of about half."""

    def close(x: float, y: float) -> bool:
        return abs(x - y) <= 1e-6 * max(1.0, abs(x), abs(y))

    for sa, sb, sc in zip(a[0], b[0], c[0]):
        for i in (0, 1, 4):  # free, done, busy per pipe
            if any(not close(sb[i][p] - sa[i][p], sc[i][p] - sb[i][p]) for p in sa[i]):
                return False
        if not close(sb[2] - sa[2], sc[2] - sb[2]):  # the Scalar clock
            return False
    return True


def _last_arrivals(body) -> dict:
    """id(AtomicAdd) -> the count its combine tests (`If(var == count)` after it in the same
    body): the split reductions' handshake. The modelled block is taken to arrive last at every
    counter it increments, so it pays for each combine it could do: exact when a block holds one
    item (the usual split), an upper bound when it holds several (the last arrival at a counter
    depends on timing the model does not know). The kernel cannot end before the last arrival's
    combine, so the combine belongs in the makespan. (The rule before, `old == BLOCK_NUM - 1`,
    charged the combine only when the block count equalled the arrivals: it never charged the
    row combine of softmax(A @ B) / row sums over several N panels.)"""
    out: dict = {}
    stack = [body]
    while stack:
        b = stack.pop()
        for j, i in enumerate(b):
            if isinstance(i, (isa.Loop, isa.If)):
                stack.append(i.body)
            elif isinstance(i, isa.AtomicAdd):
                for nxt in b[j + 1 :]:
                    if isinstance(nxt, isa.If) and nxt.a == i.var and nxt.cmp == "==":
                        out[id(i)] = nxt.b
                        break
    return out


def _shift_queues(queues: dict, old: dict, periods: int) -> None:
    """Pending flag times move on by `periods` copies of their own period."""
    for k, q in queues.items():
        before = old.get(k)
        if before is None or len(before) != len(q):
            continue
        queues[k] = deque(t + periods * (t - t0) for t, t0 in zip(q, before))


# ============================================================================= estimates


def estimate(program: isa.Program, spec, block_num: int | None = None,
             values: dict | None = None) -> KernelCost:  # fmt: skip
    """Simulated cycles of `program` on `spec` (block 0 of `block_num` blocks). `values`: the
    run-time values a dynamic-shape program reads (`isa.GetValue`, by variable name; absent:
    the instruction's bound, the largest size the program serves)."""
    blocks = block_num or program.device_blocks or program.blocks or 1
    ctx = CostCtx(program, spec, blocks, values)
    ctx.run(program.body)
    if left := [k for k, q in ctx.cross.items() if q]:
        raise ValueError(
            f"kernel {program.name}: cross-core flag(s) "
            + ", ".join(f"{side} {flag}" for side, flag, _ in left)
            + " set but never waited for (a flag left pending at the kernel's end)"
        )
    pipes: dict[str, float] = {}
    ends: dict[str, float] = {}
    for core, s in ctx.states.items():
        ends[core] = max(*s.free.values(), *s.done.values(), s.scalar) if program.body else 0.0
        for p in isa.CORE_PIPES[core[:3]] if core else isa.PIPES:
            pipes[f"{core}.{p}" if core else p] = s.busy[p]
        if not core:  # one stream: Scalar is its clock (issue and stalls, as before)
            pipes["Scalar"] = max(s.busy["Scalar"], s.scalar)
    total = max(ends.values())
    return KernelCost(program.name, pipes, total, ctx.intervals, blocks, spec.clock_hz,
                      ctx.truncated, sorted(ctx.unknown),
                      ends if ctx.mix else {})  # fmt: skip


def vector_cycles(spec, op: str, nbytes: float) -> float:
    """latency + ceil(bytes / 256) * cycles_per_repeat - 1 (Huawei's model)."""
    lat = spec.vector_latency.get(op, spec.vector_latency.get("default", 10))
    repeats = math.ceil(nbytes / spec.vector_bytes_per_repeat) if nbytes > 0 else 0
    return lat + repeats * spec.vector_cycles_per_repeat - 1 if repeats else 0.0


def _isz(ref: isa.Ref) -> int:
    return np.dtype(ref.buf.dtype).itemsize


def _vec(ctx: CostCtx, op: str, n, *refs) -> tuple:
    nbytes = ctx.int(n) * max(_isz(r) for r in refs)
    return "Vector", vector_cycles(ctx.spec, op, nbytes), 0.0


register(isa.VBinary)(lambda c, i: _vec(c, i.op, i.n, i.dst, i.a, i.b))
register(isa.VScalar)(lambda c, i: _vec(c, i.op, i.n, i.dst, i.src))
register(isa.VUnary)(lambda c, i: _vec(c, i.op, i.n, i.dst, i.src))
register(isa.VFma)(lambda c, i: _vec(c, "vmla", i.n, i.dst, i.a, i.b, i.c))
register(isa.VConv)(lambda c, i: _vec(c, "vconv", i.n, i.dst, i.src))
register(isa.VCmp)(lambda c, i: _vec(c, "vcmp", i.n, i.a, i.b))
register(isa.VCmpS)(lambda c, i: _vec(c, "vcmp", i.n, i.src))
register(isa.VSel)(lambda c, i: _vec(c, "vsel", i.n, i.dst, i.a, i.b))
register(isa.VDup)(lambda c, i: _vec(c, "vdup", i.n, i.dst))
register(isa.VBrcb)(lambda c, i: _vec(c, "vbrcb", isa.mul(i.n, i.rows), i.dst))
register(isa.VGather)(lambda c, i: _vec(c, "vgather", i.n, i.dst, i.idx))


@register(isa.VReduce)
def _vreduce(ctx: CostCtx, i: isa.VReduce):
    rows, n = ctx.int(i.rows), ctx.int(i.n)
    return "Vector", vector_cycles(ctx.spec, i.op, rows * n * _isz(i.src)) + rows, 0.0


@register(isa.VArgReduce)
def _vargreduce(ctx: CostCtx, i: isa.VArgReduce):
    rows, n = ctx.int(i.rows), ctx.int(i.n)  # compare + two selects per repeat
    return "Vector", 3 * vector_cycles(ctx.spec, "vcmp", rows * n * _isz(i.src)) + rows, 0.0


@register(isa.VHostMath)
def _vhostmath(ctx: CostCtx, i: isa.VHostMath):
    one = vector_cycles(ctx.spec, "default", ctx.int(i.n) * _isz(i.dst))
    return "Vector", 16 * one, 0.0


def in_l2(ctx: CostCtx, ref: isa.Ref) -> bool:
    """Whether GM accesses through `ref` are served by L2: `ref` is in the launch's GM workspace
    and the whole workspace fits in half of L2. A workspace is where a MIX kernel's AIC and AIVs
    hand tiles to each other (written and read back within one tile period, microseconds) or a
    split reduction keeps its partials, so it stays in L2 and moves at L2's rates (NPU_FACTS.md:
    110 B/cycle read, 86 write per core) rather than HBM's 32. (Before, every hand-off was charged
    at the HBM rate: the fused attention's S tile alone cost its AIC 4x its Cube time.)"""
    prog = ctx.program
    if not prog.workspace or ref.buf.scope != "GM" or prog.workspace > ctx.spec.l2_bytes // 2:
        return False
    return ref.buf.arg == max(b.arg for b in prog.args)  # the workspace is the last argument


def _copy_bytes(ctx: CostCtx, ref: isa.Ref, counts, strides) -> float:
    """Bytes the GM side moves: a non-unit inner stride fetches a 32-byte burst per element."""
    isz = _isz(ref)
    cs = [ctx.int(c) for c in counts]
    inner = abs(ctx.int(strides[-1]))
    n = math.prod(cs)
    if inner == 1:
        return n * isz
    if inner == 0:
        return (n // max(cs[-1], 1)) * isz if cs[-1] else 0
    return n * min(32, max(isz, inner * isz))


@register(isa.CopyIn)
def _copy_in(ctx: CostCtx, i: isa.CopyIn):
    spec = ctx.spec
    nbytes = _copy_bytes(ctx, i.src, i.counts, i.strides)
    if i.dst.buf.scope == "L1":
        rate = spec.l2_read_bpc if in_l2(ctx, i.src) else spec.gm_read_bpc
        return "MTE2", spec.copy_l1_fixed + nbytes / rate, spec.gm_read_latency
    return "MTE2", spec.copy_ub_fixed + nbytes / spec.ub_gm_bpc, spec.gm_read_latency


@register(isa.CopyOut)
def _copy_out(ctx: CostCtx, i: isa.CopyOut):
    spec = ctx.spec
    nbytes = _copy_bytes(ctx, i.dst, i.counts, i.strides)
    return "MTE3", spec.copy_ub_fixed + nbytes / spec.ub_gm_bpc, spec.gm_write_latency
