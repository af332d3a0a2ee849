"""Simulated NPU timeline: kernels on streams, ordered by events, placed on the device's clock.

The cost model (backend) gives each kernel its cycles per pipe and, where known, the busy
intervals of each pipe inside the kernel (double buffering makes MTE2 overlap Vector, ...). This
module composes kernels into a device timeline, in program (enqueue) order:

- a kernel starts when its stream is free, every event it waits for has been reached and, when
  the kernel says how many AI cores it occupies, when enough cores of its kind are free;
- an event is reached when the kernel before its record on that stream ends;
- per-pipe busy intervals are the kernel's own intervals shifted to its start.

Costs are duck-typed so the runtime does not import the backend: `total` (cycles; also accepted:
`total_cycles`, `cycles`, or a plain number), `pipes` (pipe -> cycles) and `intervals` (pipe ->
[(start, end)], or [(pipe, start, end)], or objects with .pipe/.start/.end). Without intervals
each pipe is busy from the kernel's start for its cycles. Optional `cores` (or `block_dim`)
says how many AI cores the kernel occupies; without it cores are not a constraint.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field

# canonical pipe names, in the order trace tracks show them
PIPES = ("MTE2", "MTE1", "Cube", "Vector", "MTE3", "FixPipe", "Scalar")
_PIPE_ALIASES = {
    "mte2": "MTE2", "mte1": "MTE1", "mte3": "MTE3",
    "cube": "Cube", "m": "Cube", "mmad": "Cube", "mad": "Cube",
    "vector": "Vector", "v": "Vector", "vec": "Vector",
    "fixpipe": "FixPipe", "fix": "FixPipe", "fix_pipe": "FixPipe",
    "scalar": "Scalar", "s": "Scalar",
}  # fmt: skip


def canonical_pipe(name: object) -> str:
    """`"vector"`, `"V"`, `Pipe.VECTOR` ... -> `"Vector"`; unknown names pass through."""
    text = getattr(name, "name", None) or getattr(name, "value", None) or name
    text = str(text)
    return _PIPE_ALIASES.get(text.lower(), text)


def cost_total(cost: object) -> int:
    """Total cycles of a duck-typed kernel cost (0 when unknown)."""
    if cost is None:
        return 0
    if isinstance(cost, (int, float)):
        return int(cost)
    for attr in ("total", "total_cycles", "cycles"):
        value = getattr(cost, attr, None)
        if isinstance(value, (int, float)):
            return int(round(value))
    pipes = cost_pipes(cost)
    return max(pipes.values(), default=0)


def cost_pipes(cost: object) -> dict[str, int]:
    """Cycles per canonical pipe name."""
    pipes = getattr(cost, "pipes", None)
    if not pipes:
        return {}
    out: dict[str, int] = {}
    for k, v in pipes.items():
        name = canonical_pipe(k)
        out[name] = out.get(name, 0) + int(round(v))
    return out


def cost_intervals(cost: object) -> dict[str, list[tuple[int, int]]]:
    """Busy intervals per canonical pipe, relative to the kernel's start."""
    raw = getattr(cost, "intervals", None)
    out: dict[str, list[tuple[int, int]]] = {}
    if raw:
        items: Iterable
        if isinstance(raw, dict):
            items = ((p, s, e) for p, spans in raw.items() for s, e in spans)
        else:
            items = (
                (iv.pipe, iv.start, iv.end) if hasattr(iv, "pipe") else tuple(iv) for iv in raw
            )
        for p, s, e in items:
            if e > s:
                out.setdefault(canonical_pipe(p), []).append((int(round(s)), int(round(e))))
        for spans in out.values():
            spans.sort()
        return out
    for p, cycles in cost_pipes(cost).items():
        if cycles > 0:
            out[p] = [(0, int(cycles))]
    return out


def cost_cores(cost: object) -> int:
    """AI cores the kernel occupies (`cores`, `block_dim`, `core_num` or `blocks`), else 0."""
    for attr in ("cores", "block_dim", "core_num", "blocks"):
        value = getattr(cost, attr, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return 0


@dataclass(frozen=True)
class SimKernel:
    """One kernel as the simulator sees it (program order is the order of the sequence)."""

    name: str
    stream: int
    cost: object = None
    waits: tuple[Hashable, ...] = ()  # event ids awaited before the kernel starts
    record: Hashable | None = None  # event id recorded after the kernel
    unit: str = "vector"  # cube / vector / mix / aicpu: which cores it occupies
    cores: int = 0  # AI cores occupied (0: take it from the cost, else unconstrained)


@dataclass
class KernelSlot:
    """Where one kernel landed on the simulated device."""

    index: int
    name: str
    stream: int
    start: int  # cycles
    end: int
    unit: str
    cores: int
    pipes: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # absolute cycles
    cycles_by_pipe: dict[str, int] = field(default_factory=dict)

    @property
    def cycles(self) -> int:
        return self.end - self.start


@dataclass
class Timeline:
    """The composed device timeline; times in cycles, `seconds()` converts with the clock."""

    kernels: list[KernelSlot]
    events: dict[Hashable, int]  # event id -> cycle it is reached
    clock_hz: float
    makespan: int
    stream_busy: dict[int, list[tuple[int, int]]]
    pipe_busy: dict[str, list[tuple[int, int]]]  # union of all kernels' busy spans per pipe
    # (start, cycles) of every record/wait op in order: a wait spans the time its stream was
    # blocked; a record is a point
    sync_spans: list[tuple[int, int]] = field(default_factory=list)

    def seconds(self, cycles: float) -> float:
        return cycles / self.clock_hz

    @property
    def makespan_s(self) -> float:
        return self.makespan / self.clock_hz

    @property
    def serial_cycles(self) -> int:
        """Sum of kernel durations: what one stream would take."""
        return sum(k.cycles for k in self.kernels)

    def utilization(self) -> dict[str, float]:
        """Fraction of the makespan each pipe is busy (on at least one core)."""
        if self.makespan <= 0:
            return {p: 0.0 for p in self.pipe_busy}
        return {p: sum(e - s for s, e in spans) / self.makespan for p, spans in _pipe_order(self)}

    def __str__(self) -> str:
        us = 1e6 / self.clock_hz
        lines = [f"{'kernel':24} {'stream':>6} {'start us':>10} {'end us':>10} {'cycles':>10}"]
        for k in self.kernels:
            lines.append(
                f"{k.name[:24]:24} {k.stream:>6} {k.start * us:>10.3f} {k.end * us:>10.3f} "
                f"{k.cycles:>10}"
            )
        util = ", ".join(f"{p} {u:.0%}" for p, u in self.utilization().items())
        lines.append(
            f"makespan {self.makespan} cycles = {self.makespan * us:.3f} us "
            f"(serial {self.serial_cycles * us:.3f} us); utilization: {util or '-'}"
        )
        return "\n".join(lines)


def _pipe_order(tl: Timeline):
    rank = {p: i for i, p in enumerate(PIPES)}
    return sorted(tl.pipe_busy.items(), key=lambda kv: (rank.get(kv[0], len(rank)), kv[0]))


class _Cores:
    """Occupancy of one pool of AI cores over time (list scheduling with a capacity)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.spans: list[tuple[int, int, int]] = []

    def _peak(self, a: int, b: int) -> int:
        live = [(s, e, n) for s, e, n in self.spans if s < b and e > a]
        if not live:
            return 0
        points = {a} | {s for s, _, _ in live if s > a}
        return max(sum(n for s, e, n in live if s <= t < e) for t in points)

    def fits(self, t: int, dur: int, need: int) -> bool:
        return dur <= 0 or self._peak(t, t + dur) + need <= self.capacity

    def candidates(self, t0: int) -> list[int]:
        return [e for _, e, _ in self.spans if e > t0]

    def add(self, s: int, e: int, need: int) -> None:
        if e > s and need > 0:
            self.spans.append((s, e, need))


def _core_needs(spec, unit: str, cores: int) -> dict[str, int]:
    if cores <= 0 or spec is None or unit == "aicpu":
        return {}
    if getattr(spec, "coupled", True):
        return {"core": min(cores, spec.cube_cores)}
    if unit == "cube":
        return {"aic": min(cores, spec.cube_cores)}
    if unit == "mix":
        return {"aic": min(cores, spec.cube_cores), "aiv": min(2 * cores, spec.vector_cores)}
    return {"aiv": min(cores, spec.vector_cores)}


def _core_pools(spec) -> dict[str, _Cores]:
    if spec is None:
        return {}
    if getattr(spec, "coupled", True):
        return {"core": _Cores(spec.cube_cores)}
    return {"aic": _Cores(spec.cube_cores), "aiv": _Cores(spec.vector_cores)}


# ops for simulate_ops: ("kernel", SimKernel) | ("record", stream, event_id) | ("wait", stream, id)
Op = tuple


def simulate(kernels: Sequence[SimKernel], spec, *, clock_hz: float | None = None) -> Timeline:
    """Compose kernels (program order; waits before, record after each) into a Timeline."""
    ops: list[Op] = []
    for k in kernels:
        ops.extend(("wait", k.stream, w) for w in k.waits)
        ops.append(("kernel", k))
        if k.record is not None:
            ops.append(("record", k.stream, k.record))
    return simulate_ops(ops, spec, clock_hz=clock_hz)


def simulate_ops(
    ops: Iterable[Op], spec, *, clock_hz: float | None = None, record_ops: bool = False
) -> Timeline:
    """Same as `simulate` for a raw stream command log (what the profiler records).

    An event awaited before any record of it counts as reached at cycle 0 (it belongs to work
    outside this timeline). Re-recorded event ids take the latest record, like ACL events.
    With `record_ops`, `Timeline.sync_spans` holds where each record/wait landed.
    """
    clock = clock_hz or (spec.clock_hz if spec is not None else 1e9)
    stream_free: dict[int, int] = {}
    events: dict[Hashable, int] = {}
    pools = _core_pools(spec)
    slots: list[KernelSlot] = []
    stream_busy: dict[int, list[tuple[int, int]]] = {}
    pipe_spans: dict[str, list[tuple[int, int]]] = {}
    sync_spans: list[tuple[int, int]] = []
    for op in ops:
        kind = op[0]
        if kind == "wait":
            _, s, eid = op
            before = stream_free.get(s, 0)
            stream_free[s] = after = max(before, events.get(eid, 0))
            if record_ops:
                sync_spans.append((before, after - before))
            continue
        if kind == "record":
            _, s, eid = op
            events[eid] = t = stream_free.get(s, 0)
            if record_ops:
                sync_spans.append((t, 0))
            continue
        k: SimKernel = op[1]
        dur = cost_total(k.cost)
        cores = k.cores or cost_cores(k.cost)
        needs = _core_needs(spec, k.unit, cores)
        start = stream_free.get(k.stream, 0)
        if needs and dur > 0:
            start = _earliest(pools, needs, start, dur)
            for name, n in needs.items():
                pools[name].add(start, start + dur, n)
        end = start + dur
        stream_free[k.stream] = end
        rel = cost_intervals(k.cost)
        pipes = {p: [(start + s, start + e) for s, e in spans] for p, spans in rel.items()}
        for p, spans in pipes.items():
            pipe_spans.setdefault(p, []).extend(spans)
        if dur > 0:
            stream_busy.setdefault(k.stream, []).append((start, end))
        slots.append(
            KernelSlot(
                index=len(slots), name=k.name, stream=k.stream, start=start, end=end,
                unit=k.unit, cores=cores, pipes=pipes, cycles_by_pipe=cost_pipes(k.cost),
            )
        )  # fmt: skip
    makespan = max((s.end for s in slots), default=0)
    return Timeline(
        kernels=slots,
        events=events,
        clock_hz=clock,
        makespan=makespan,
        stream_busy=stream_busy,
        pipe_busy={p: merge_intervals(v) for p, v in pipe_spans.items()},
        sync_spans=sync_spans,
    )


def _earliest(pools: dict[str, _Cores], needs: dict[str, int], t0: int, dur: int) -> int:
    cands = {t0}
    for name in needs:
        cands.update(pools[name].candidates(t0))
    for t in sorted(cands):
        if all(pools[name].fits(t, dur, n) for name, n in needs.items()):
            return t
    return max(cands)  # unreachable: after the last span ends every pool is empty


def merge_intervals(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Union of half-open intervals, sorted and non-overlapping."""
    out: list[tuple[int, int]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def _pool_words(spec, unit: str) -> tuple[int, str]:
    """(capacity, name) of the pool of AI cores a kernel of `unit` occupies."""
    if spec is None:
        return 0, "cores"
    if getattr(spec, "coupled", True):
        return spec.cube_cores, "AI cores"
    if unit == "cube":
        return spec.cube_cores, "Cube cores (AIC)"
    return spec.vector_cores, "Vector cores (AIV)"


def explain_overlap(tl: Timeline, unconstrained: Timeline, spec) -> str:
    """Why kernels on different streams did or did not run side by side on the simulated
    device: `tl` is the timeline with core limits, `unconstrained` the same work simulated
    without them (`simulate(..., spec=None)`: only streams and events order it)."""
    busy = [k for k in tl.kernels if k.cycles > 0]
    streams = sorted({k.stream for k in busy})
    us = 1e6 / tl.clock_hz
    if len(streams) <= 1:
        return ("one stream: the kernels run one after another (no independent branches to put "
                "on a second stream)")  # fmt: skip
    saved = tl.serial_cycles - tl.makespan
    lost = tl.makespan - unconstrained.makespan
    if saved > 0:
        text = (f"streams overlapped: makespan {tl.makespan * us:.3f} us against "
                f"{tl.serial_cycles * us:.3f} us one after another "
                f"({saved * us:.3f} us saved)")  # fmt: skip
        if lost > 0:
            text += f"; with unlimited cores {lost * us:.3f} us more"
        return text
    if lost > 0:
        cap, pool = _pool_words(spec, busy[0].unit)
        users = ", ".join(f"{k.name} {min(k.cores, cap) if cap else k.cores}" for k in busy[:4])
        more = ", ..." if len(busy) > 4 else ""
        name = getattr(spec, "name", "device")
        return (f"streams did not overlap: the branches are independent, but each kernel "
                f"occupies (nearly) all {cap} {pool} of the simulated {name} ({users}{more}), "
                f"so a kernel on one stream waits for the cores the other holds; kernels with "
                f"fewer blocks (fewer rows or tiles than cores) would run side by side "
                f"(unlimited cores: {unconstrained.makespan * us:.3f} us instead of "
                f"{tl.makespan * us:.3f} us)")  # fmt: skip
    return ("streams did not overlap: the kernels on different streams wait for each other "
            "through events (each branch needs the other's result), so they run in "
            "turn")  # fmt: skip
