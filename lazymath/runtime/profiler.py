"""Profiler: measured host timeline + simulated NPU timeline, as a table and a Chrome trace.

`with profile() as p:` activates a profiler. While it is active the runtime records every stream
command as it is enqueued (kernel launch, event record, event wait) and the executing thread
stamps each command's host start/end with `perf_counter_ns`; nothing else has to cooperate.
The realize path only brackets each realize with `realize(label, **info)` so the commands are
grouped per realize; each group's command log is replayed through `timeline.simulate_ops` to
place the kernels on the simulated device (cost per pipe, streams, events, cores).

`p.kernels` lists one `KernelRecord` per kernel (unit, stream, measured host time, simulated
cycles and time, bound class); `p.summary()` prints a table; `p.save("trace.json")` writes a
Chrome trace-event file (open in ui.perfetto.dev or chrome://tracing) with a "host (measured)"
process (a realize track and one track per stream) and an "NPU (simulated)" process (one track
per stream and one per pipe), event record -> wait drawn as flow arrows.

When no profiler is active the runtime pays one global lookup per command.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from dataclasses import dataclass, field
from time import perf_counter_ns

from lazymath.runtime.device import ASCEND910
from lazymath.runtime.timeline import PIPES, SimKernel, Timeline, explain_overlap, simulate_ops

_ACTIVE: Profiler | None = None  # read by the runtime on every enqueue
_EPS_US = 0.001  # width of event marker slices in the trace (1 ns)


@dataclass(slots=True, eq=False)
class KernelRecord:
    """One kernel launch: what ran, where, how long on the host and on the simulated NPU."""

    name: str
    unit: str | None
    stream: int
    blocks: int = 1
    bound: str | None = None
    source_loc: str | None = None
    realize: int | None = None
    cost: object = None
    cores: int = 0
    enqueue_ns: int = 0
    host_start_ns: int = 0  # stamped by the executing thread
    host_end_ns: int = 0
    sim_start_cycles: int | None = None  # filled by the simulation (or given explicitly)
    sim_end_cycles: int | None = None
    cycles_by_pipe: dict[str, int] = field(default_factory=dict)
    pipe_intervals: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # absolute
    clock_hz: float = 1e9
    waits: tuple[int, ...] = ()  # profiler event ids awaited on this stream before the kernel
    records: tuple[int, ...] = ()  # profiler event ids recorded right after it
    segment: int = 0
    explicit: bool = False
    kernel: object = None  # the launched kernel; its cost is read at finalize, not at launch
    roof: object = None  # the host roofline (backend roofline.KernelRoof) of native kernels

    @property
    def roof_us(self) -> float | None:
        """The kernel's host roof (the tighter of its memory and compute bounds), us."""
        return self.roof.roof_s * 1e6 if self.roof is not None else None

    @property
    def roof_fraction(self) -> float | None:
        """Host roof / measured host time: 1.0 = at the roof of this machine."""
        return self.roof.fraction(self.host_us / 1e6) if self.roof is not None else None

    @property
    def host_us(self) -> float:
        """Measured host time of the kernel (all blocks), microseconds."""
        return max(0, self.host_end_ns - self.host_start_ns) / 1e3

    @property
    def host_ms(self) -> float:
        return self.host_us / 1e3

    @property
    def sim_cycles(self) -> int:
        if self.sim_start_cycles is None or self.sim_end_cycles is None:
            return 0
        return self.sim_end_cycles - self.sim_start_cycles

    @property
    def sim_us(self) -> float:
        """Simulated device time of the kernel, microseconds."""
        return self.sim_cycles / self.clock_hz * 1e6

    @property
    def sim_s(self) -> float:
        return self.sim_cycles / self.clock_hz


@dataclass(slots=True, eq=False)
class SyncRecord:
    """An event record or wait on a stream."""

    kind: str  # "record" | "wait"
    event: int  # profiler-wide event id (one per recording)
    stream: int
    label: str | None = None
    realize: int | None = None
    enqueue_ns: int = 0
    host_start_ns: int = 0  # waits: when the stream started waiting
    host_ns: int = 0  # when the record was reached / the wait was satisfied
    sim_start_cycles: int = 0
    sim_cycles: int = 0
    segment: int = 0


@dataclass(slots=True, eq=False)
class RealizeRecord:
    """One realize bracketed by the realize path."""

    index: int
    label: str
    info: dict
    host_start_ns: int = 0
    host_end_ns: int = 0
    segment: int = 0
    timeline: Timeline | None = None

    @property
    def host_us(self) -> float:
        return max(0, self.host_end_ns - self.host_start_ns) / 1e3


class _NullScope:
    __slots__ = ()

    def __enter__(self):
        return None

    def __exit__(self, *exc) -> None:
        return None


_NULL_SCOPE = _NullScope()


class _RealizeScope:
    __slots__ = ("prof", "label", "info", "rec")

    def __init__(self, prof: Profiler, label: str, info: dict) -> None:
        self.prof, self.label, self.info, self.rec = prof, label, info, None

    def __enter__(self) -> RealizeRecord:
        self.rec = self.prof.record_realize(self.label, **self.info)
        return self.rec

    def __exit__(self, *exc) -> None:
        self.prof.end_realize(self.rec)


def realize(label: str = "", **info):
    """Bracket one realize: `with profiler.realize("k0+k1", cache_hit=True): ...`.

    A no-op context (no allocation) when no profiler is active.
    """
    prof = _ACTIVE
    if prof is None:
        return _NULL_SCOPE
    return _RealizeScope(prof, label, info)


def active() -> Profiler | None:
    """The active profiler, if any."""
    return _ACTIVE


def profile(spec=None) -> Profiler:
    """`with profile() as p:` (exposed as `lm.profile`)."""
    return Profiler(spec)


class Profiler:
    """Collects kernel and event records while active; see the module docstring."""

    def __init__(self, spec=None) -> None:
        self.spec = spec
        self.t0_ns = perf_counter_ns()
        self.t1_ns = 0
        self._ops: list = []  # KernelRecord | SyncRecord in enqueue order
        self._realizes: list[RealizeRecord] = []
        self._current: RealizeRecord | None = None
        self._segment = 0
        self._seg_spec: dict[int, object] = {}
        self._event_ids: dict = {}  # mark or ("user", realize, id) -> int
        self._streams: dict[int, object] = {}
        self._prev: Profiler | None = None
        self._final = False
        self._lock = threading.Lock()

    # -- activation ---------------------------------------------------------------------------

    def __enter__(self) -> Profiler:
        global _ACTIVE
        self._prev = _ACTIVE
        self.t0_ns = perf_counter_ns()
        _ACTIVE = self
        return self

    def __exit__(self, *exc) -> None:
        global _ACTIVE
        _ACTIVE = self._prev
        for stream in list(self._streams.values()):
            stream._quiesce()  # every recorded command has its host times (errors stay queued)
        self.t1_ns = perf_counter_ns()
        self._final = False

    # -- recording API (runtime and realize path) ---------------------------------------------

    def record_realize(self, label: str = "", **info) -> RealizeRecord:
        """Start a realize group; returns its record (pass it to `end_realize`)."""
        with self._lock:
            self._segment += 1
            rec = RealizeRecord(
                index=len(self._realizes), label=label, info=dict(info), segment=self._segment
            )
            rec.host_start_ns = perf_counter_ns()
            self._realizes.append(rec)
            self._current = rec
            self._final = False
        return rec

    def end_realize(self, rec: RealizeRecord | None, **info) -> None:
        if rec is None:
            return
        for stream in list(self._streams.values()):
            stream._quiesce()  # host times of the realize's kernels are complete
        rec.host_end_ns = perf_counter_ns()
        rec.info.update(info)
        with self._lock:
            if self._current is rec:
                self._current = None
                self._segment += 1

    def record_kernel(
        self,
        name: str,
        unit: str | None,
        stream: int,
        host_start_ns: int,
        host_end_ns: int,
        sim_start_cycles: int | None = None,
        sim_end_cycles: int | None = None,
        cycles_by_pipe: dict[str, int] | None = None,
        bound: str | None = None,
        waits: tuple[int, ...] = (),
        records: tuple[int, ...] | int | None = None,
        *,
        cost: object = None,
        blocks: int = 1,
        source_loc: str | None = None,
    ) -> KernelRecord:
        """Record a kernel that did not go through `launch` (e.g. run inline by the caller).

        With `sim_start_cycles`/`sim_end_cycles` the simulated placement is taken as given;
        otherwise it is simulated from `cost` (or `cycles_by_pipe`) with `waits`/`records`
        (caller-chosen event ids, scoped to the current realize) ordering it against others.
        """
        rec = KernelRecord(
            name=name,
            unit=unit,
            stream=stream,
            blocks=blocks,
            bound=bound,
            source_loc=source_loc,
            cost=cost,
            enqueue_ns=host_start_ns,
            host_start_ns=host_start_ns,
            host_end_ns=host_end_ns,
            sim_start_cycles=sim_start_cycles,
            sim_end_cycles=sim_end_cycles,
            cycles_by_pipe=dict(cycles_by_pipe or {}),
            explicit=sim_start_cycles is not None,
        )
        if cost is None and cycles_by_pipe:
            rec.cost = _PipeCost(cycles_by_pipe)
        if isinstance(records, int):
            records = (records,)
        realize_idx = self._current.index if self._current is not None else None
        for w in waits:
            self._append(
                SyncRecord(
                    "wait",
                    self._user_event(w),
                    stream,
                    enqueue_ns=host_start_ns,
                    host_start_ns=host_start_ns,
                    host_ns=host_start_ns,
                )
            )
        self._append(rec)
        for r in records or ():
            self._append(
                SyncRecord(
                    "record",
                    self._user_event(r, new=True),
                    stream,
                    enqueue_ns=host_end_ns,
                    host_ns=host_end_ns,
                )
            )
        rec.realize = realize_idx
        return rec

    def _user_event(self, eid: int, new: bool = False) -> int:
        key = ("user", self._current.index if self._current else None, eid)
        if new or key not in self._event_ids:
            self._event_ids[key] = len(self._event_ids)
        return self._event_ids[key]

    # hooks called by the runtime on the enqueuing thread -------------------------------------

    def _append(self, rec) -> None:
        rec.segment = self._segment
        cur = self._current
        rec.realize = cur.index if cur is not None else None
        self._ops.append(rec)
        self._final = False

    def _note_stream(self, stream) -> None:
        if id(stream) not in self._streams:
            self._streams[id(stream)] = stream
        if self._segment not in self._seg_spec:
            self._seg_spec[self._segment] = getattr(stream.device, "spec", None)

    def _on_launch(self, kernel, blocks: int, stream, unit, bound, loc) -> KernelRecord:
        # cheap: the kernel's cost (which a backend may compute lazily, ~10 ms the first time)
        # is only read in _finalize, so profiling does not delay launches
        self._note_stream(stream)
        rec = KernelRecord(
            name=getattr(kernel, "name", None) or type(kernel).__name__,
            unit=unit,
            stream=stream.index,
            blocks=blocks,
            bound=bound,
            source_loc=loc,
            enqueue_ns=perf_counter_ns(),
            kernel=kernel,
        )
        self._append(rec)
        return rec

    @staticmethod
    def _resolve(rec: KernelRecord) -> None:
        """Fill cost, unit, bound and cores of a launched kernel from the kernel object."""
        kernel, rec.kernel = rec.kernel, None
        try:  # a lazily computed cost must never break the profile
            cost = getattr(kernel, "cost", None)
        except Exception:
            cost = None
        program = getattr(kernel, "program", None)  # backend kernels: the ISA program
        rec.cost = cost
        try:
            rec.roof = getattr(kernel, "host_roof", None)
        except Exception:
            rec.roof = None
        rec.unit = rec.unit or getattr(kernel, "unit", None) or getattr(program, "unit", None)
        rec.bound = rec.bound or getattr(kernel, "bound", None) or getattr(cost, "bound", None)
        rec.cores = _int(getattr(kernel, "cores", 0)) or _int(getattr(program, "device_blocks", 0))

    def _event_id(self, mark) -> int:
        eid = self._event_ids.get(mark)
        if eid is None:
            eid = self._event_ids[mark] = len(self._event_ids)
        return eid

    def _on_record(self, stream, mark, event) -> SyncRecord:
        self._note_stream(stream)
        rec = SyncRecord(
            "record",
            self._event_id(mark),
            stream.index,
            label=event.name,
            enqueue_ns=perf_counter_ns(),
        )
        self._append(rec)
        return rec

    def _on_wait(self, stream, mark, event) -> SyncRecord:
        self._note_stream(stream)
        now = perf_counter_ns()
        rec = SyncRecord(
            "wait", self._event_id(mark), stream.index, label=event.name, enqueue_ns=now
        )
        if mark.done:
            rec.host_start_ns = rec.host_ns = now
        self._append(rec)
        return rec

    # -- results -------------------------------------------------------------------------------

    @property
    def kernels(self) -> list[KernelRecord]:
        """Every kernel recorded, in launch order, with measured and simulated times."""
        self._finalize()
        return [op for op in self._ops if isinstance(op, KernelRecord)]

    @property
    def events(self) -> list[SyncRecord]:
        self._finalize()
        return [op for op in self._ops if isinstance(op, SyncRecord)]

    @property
    def realizes(self) -> list[RealizeRecord]:
        self._finalize()
        return list(self._realizes)

    def timelines(self) -> dict[int, Timeline]:
        """Simulated timeline per command group (segment id -> Timeline)."""
        self._finalize()
        return dict(self._timelines)

    def _finalize(self) -> None:
        if self._final:
            return
        groups: dict[int, list] = {}
        for op in self._ops:
            if isinstance(op, KernelRecord) and op.kernel is not None:
                self._resolve(op)
            groups.setdefault(op.segment, []).append(op)
        self._timelines: dict[int, Timeline] = {}
        self._overlap: dict[int, str] = {}
        for seg, ops in groups.items():
            spec = self._seg_spec.get(seg) or self.spec or _default_spec()
            sim_ops, kernels = [], []
            for op in ops:
                if isinstance(op, KernelRecord):
                    op.clock_hz = spec.clock_hz if spec is not None else 1e9
                    if op.explicit:
                        continue
                    kernels.append(op)
                    sim_ops.append(
                        (
                            "kernel",
                            SimKernel(
                                op.name,
                                op.stream,
                                op.cost,
                                unit=op.unit or "vector",
                                cores=op.cores,
                            ),
                        )
                    )
                else:
                    sim_ops.append((op.kind, op.stream, op.event))
            tl = simulate_ops(sim_ops, spec, record_ops=True)
            for rec, slot in zip(kernels, tl.kernels):
                rec.sim_start_cycles, rec.sim_end_cycles = slot.start, slot.end
                rec.pipe_intervals = slot.pipes
                rec.cycles_by_pipe = rec.cycles_by_pipe or dict(slot.cycles_by_pipe)
            syncs = [op for op in ops if isinstance(op, SyncRecord)]
            for rec, (s, e) in zip(syncs, tl.sync_spans):
                rec.sim_start_cycles, rec.sim_cycles = s, e
            self._timelines[seg] = tl
            if len({k.stream for k in kernels}) > 1:  # did the streams overlap? why (not)?
                free = simulate_ops(sim_ops, None, clock_hz=op_clock(spec))
                self._overlap[seg] = explain_overlap(tl, free, spec)
        for r in self._realizes:
            r.timeline = self._timelines.get(r.segment)
        # which events each kernel waited for / recorded (for the table)
        pending_waits: dict[int, list[int]] = {}
        last_kernel: dict[int, KernelRecord] = {}
        for op in self._ops:
            if isinstance(op, KernelRecord):
                op.waits = tuple(pending_waits.pop(op.stream, ()))
                op.records = ()
                last_kernel[op.stream] = op
            elif op.kind == "wait":
                pending_waits.setdefault(op.stream, []).append(op.event)
            else:
                k = last_kernel.get(op.stream)
                if k is not None and k.segment == op.segment:
                    k.records = k.records + (op.event,)
        self._final = True

    def summary(self, print_: bool = True, file=None) -> str:
        """Per-kernel table plus per-realize totals; printed unless `print_=False`."""
        text = _Summary(self._summary_text())
        if print_:
            print(text, file=file or sys.stdout)
        return text

    def _summary_text(self) -> str:
        ks = self.kernels
        head = (
            f"{'kernel':26} {'unit':6} {'strm':>4} {'blk':>3} {'cores':>5} {'host us':>9} "
            f"{'sim cyc':>9} "
            f"{'sim us':>8} {'bound':7} {'roof us':>8} {'roof':>4} {'host':7} "
            f"{'waits':8} {'records'}"
        )
        lines = [head, "-" * len(head)]
        # blk: host blocks (threads on this machine); cores: AI cores the kernel occupies on
        # the simulated device (its NPU block count), what the simulated timeline schedules;
        # roof us / roof / host: the host roofline (the tighter of the kernel's memory and
        # compute bounds on this machine), measured time's fraction of it and which roof it is
        for k in ks:
            ev = lambda ids: ",".join(f"e{i}" for i in ids) or "-"  # noqa: E731
            roof, frac = k.roof_us, k.roof_fraction
            hb = k.roof.bound if k.roof is not None else "-"
            lines.append(
                f"{k.name[:26]:26} {k.unit or '-':6} {k.stream:>4} {k.blocks:>3} "
                f"{k.cores or '-':>5} "
                f"{k.host_us:>9.1f} {k.sim_cycles:>9} {k.sim_us:>8.3f} {k.bound or '-':7} "
                f"{'-' if roof is None else f'{roof:.1f}':>8} "
                f"{'-' if frac is None else f'{frac:.0%}':>4} {hb:7} "
                f"{ev(k.waits):8} {ev(k.records)}"
            )
        lines.append("-" * len(head))
        for r in self._realizes:
            lines.append(self._realize_line(r))
            note = getattr(self, "_overlap", {}).get(r.segment)
            if note:
                lines.append(f"  {note}")
        n_events = len({op.event for op in self._ops if isinstance(op, SyncRecord)})
        streams = sorted({k.stream for k in ks})
        host_total = sum(k.host_us for k in ks)
        sim_total = sum(tl.makespan_s for tl in self._timelines.values()) * 1e6
        lines.append(
            f"total: {_n(len(ks), 'kernel')} on {len(streams)} stream(s) {streams}, "
            f"{_n(n_events, 'event')}; "
            f"kernel host time {host_total:.1f} us (sum); simulated device time "
            f"{sim_total:.3f} us (sum of makespans)"
        )
        return "\n".join(lines)

    def _realize_line(self, r: RealizeRecord) -> str:
        tl = r.timeline
        ks = [op for op in self._ops if isinstance(op, KernelRecord) and op.segment == r.segment]
        n_ev = len(
            {op.event for op in self._ops if isinstance(op, SyncRecord) and op.segment == r.segment}
        )
        streams = sorted({k.stream for k in ks})
        extra = " ".join(f"{k}={v}" for k, v in r.info.items())
        if tl is not None and tl.makespan:
            sim = (
                f"simulated {tl.makespan_s * 1e6:.3f} us "
                f"(serial {tl.seconds(tl.serial_cycles) * 1e6:.3f} us)"
            )
        else:
            sim = "simulated -"
        label = f" {r.label}" if r.label else ""
        return (
            f"realize {r.index}{label}: {_n(len(ks), 'kernel')}, streams {streams}, "
            f"{_n(n_ev, 'event')}, "
            f"host {r.host_us:.1f} us, {sim}{(' ' + extra) if extra else ''}"
        )

    # -- Chrome trace --------------------------------------------------------------------------

    def chrome_trace(self) -> dict:
        """The trace as a dict in Chrome trace-event format (see `save`)."""
        self._finalize()
        t0 = self.t0_ns
        host_pid, npu_pid = 1, 2
        ev: list[dict] = []
        meta = ev.append

        def us(ns: int) -> float:
            return (ns - t0) / 1e3

        meta(
            {
                "ph": "M",
                "name": "process_name",
                "pid": host_pid,
                "args": {"name": "host (measured)"},
            }
        )
        meta({"ph": "M", "name": "process_sort_index", "pid": host_pid, "args": {"sort_index": 0}})
        meta(
            {"ph": "M", "name": "process_name", "pid": npu_pid, "args": {"name": "NPU (simulated)"}}
        )
        meta({"ph": "M", "name": "process_sort_index", "pid": npu_pid, "args": {"sort_index": 1}})
        streams = sorted({op.stream for op in self._ops})
        pipes = sorted(
            {p for op in self._ops if isinstance(op, KernelRecord) for p in op.pipe_intervals},
            key=lambda p: (PIPES.index(p) if p in PIPES else len(PIPES), p),
        )
        pipe_tid = {p: 100 + i for i, p in enumerate(pipes)}

        def thread(pid: int, tid: int, name: str, order: int) -> None:
            meta({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
            meta(
                {
                    "ph": "M",
                    "name": "thread_sort_index",
                    "pid": pid,
                    "tid": tid,
                    "args": {"sort_index": order},
                }
            )

        thread(host_pid, 0, "realize", 0)
        for s in streams:
            thread(host_pid, 1 + s, f"stream {s}", 1 + s)
            thread(npu_pid, 1 + s, f"stream {s}", 1 + s)
        for p, tid in pipe_tid.items():
            thread(npu_pid, tid, p, tid)

        # simulated time base: each command group starts no earlier than its host start and
        # after the previous group's simulated end
        seg_offset: dict[int, float] = {}
        sim_cursor = 0.0
        seg_first: dict[int, int] = {}
        for op in self._ops:
            seg_first.setdefault(op.segment, op.enqueue_ns)
        for r in self._realizes:
            seg_first[r.segment] = r.host_start_ns
        for seg in sorted(self._timelines):
            tl = self._timelines[seg]
            start = max(us(seg_first.get(seg, t0)), sim_cursor)
            seg_offset[seg] = start
            sim_cursor = start + tl.makespan_s * 1e6

        def sim_us(op, cycles: float, clock: float) -> float:
            return seg_offset.get(op.segment, 0.0) + cycles / clock * 1e6

        for r in self._realizes:
            if r.host_end_ns:
                ev.append(
                    {
                        "ph": "X",
                        "name": r.label or f"realize {r.index}",
                        "cat": "realize",
                        "pid": host_pid,
                        "tid": 0,
                        "ts": us(r.host_start_ns),
                        "dur": max(r.host_us, _EPS_US),
                        "args": dict(r.info),
                    }
                )

        clock_of_seg = {seg: tl.clock_hz for seg, tl in self._timelines.items()}
        flow_src: dict[int, list[tuple[dict, dict]]] = {}  # event id -> [(host s, npu s)]
        flows: list[dict] = []
        flow_id = 0
        for op in self._ops:
            clock = clock_of_seg.get(op.segment, 1e9)
            if isinstance(op, KernelRecord):
                args = {
                    "unit": op.unit,
                    "blocks": op.blocks,
                    "bound": op.bound,
                    "sim_cycles": op.sim_cycles,
                    "host_us": round(op.host_us, 3),
                    "realize": op.realize,
                }
                if op.source_loc:
                    args["source"] = op.source_loc
                if op.host_end_ns:
                    ev.append(
                        {
                            "ph": "X",
                            "name": op.name,
                            "cat": "kernel",
                            "pid": host_pid,
                            "tid": 1 + op.stream,
                            "ts": us(op.host_start_ns),
                            "dur": max(op.host_us, _EPS_US),
                            "args": args,
                        }
                    )
                if op.sim_start_cycles is not None:
                    ev.append(
                        {
                            "ph": "X",
                            "name": op.name,
                            "cat": "kernel",
                            "pid": npu_pid,
                            "tid": 1 + op.stream,
                            "ts": sim_us(op, op.sim_start_cycles, clock),
                            "dur": max(op.sim_us, _EPS_US),
                            "args": {**args, "cycles_by_pipe": op.cycles_by_pipe},
                        }
                    )
                continue
            name = f"{op.kind} e{op.event}" + (f" ({op.label})" if op.label else "")
            # marker slices (flows bind to slices); a record marker ends at the record point so
            # it nests inside the kernel before it, a wait marker spans the blocked time
            if op.kind == "record":
                h = (us(op.host_ns) - _EPS_US, _EPS_US)
                n = (sim_us(op, op.sim_start_cycles, clock) - _EPS_US, _EPS_US)
            else:
                hs = us(op.host_start_ns or op.host_ns)
                he = us(op.host_ns)
                h = (hs, he - hs) if he - hs > 2 * _EPS_US else (he - _EPS_US, _EPS_US)
                ns_, ne = (
                    sim_us(op, op.sim_start_cycles, clock),
                    sim_us(op, op.sim_start_cycles + op.sim_cycles, clock),
                )
                n = (ns_, ne - ns_) if ne - ns_ > 2 * _EPS_US else (ne - _EPS_US, _EPS_US)
            marks = []
            for pid, (ts, dur) in ((host_pid, h), (npu_pid, n)):
                slice_ = {
                    "ph": "X",
                    "name": name,
                    "cat": "event",
                    "pid": pid,
                    "tid": 1 + op.stream,
                    "ts": ts,
                    "dur": dur,
                    "args": {"event": op.event, "stream": op.stream},
                }
                ev.append(slice_)
                marks.append(slice_)
            if op.kind == "record":
                flow_src.setdefault(op.event, []).append((marks[0], marks[1]))
                continue
            # flow points sit exactly at their marker slice's start, with its pid, tid and cat:
            # Perfetto binds them to the enclosing slice (bp "e"), Chrome DevTools to the slice
            # with equal (cat, pid, tid, ts)
            for src_host, src_npu in flow_src.get(op.event, [])[-1:]:
                for src, dst in ((src_host, marks[0]), (src_npu, marks[1])):
                    flow_id += 1
                    common = {"name": f"e{op.event}", "cat": "event", "id": flow_id}
                    flows.append(
                        {
                            **common,
                            "ph": "s",
                            "pid": src["pid"],
                            "tid": src["tid"],
                            "ts": src["ts"],
                        }
                    )
                    flows.append(
                        {
                            **common,
                            "ph": "f",
                            "bp": "e",
                            "pid": dst["pid"],
                            "tid": dst["tid"],
                            "ts": dst["ts"],
                        }
                    )

        # per-pipe tracks: one slice per kernel and busy span, clipped so slices never overlap
        for p, tid in pipe_tid.items():
            spans = []
            for op in self._ops:
                if isinstance(op, KernelRecord):
                    clock = clock_of_seg.get(op.segment, 1e9)
                    for s, e in op.pipe_intervals.get(p, ()):
                        spans.append((sim_us(op, s, clock), sim_us(op, e, clock), op.name, e - s))
            spans.sort()
            cursor = float("-inf")
            for s, e, name, cycles in spans:
                s = max(s, cursor)
                if e - s <= 0:
                    continue
                ev.append(
                    {
                        "ph": "X",
                        "name": name,
                        "cat": "pipe",
                        "pid": npu_pid,
                        "tid": tid,
                        "ts": s,
                        "dur": e - s,
                        "args": {"pipe": p, "cycles": cycles},
                    }
                )
                cursor = e
        ev.extend(flows)
        util = {}
        for seg, tl in self._timelines.items():
            util[str(seg)] = {p: round(u, 4) for p, u in tl.utilization().items()}
        return {
            "traceEvents": ev,
            "displayTimeUnit": "ns",
            "otherData": {"generator": "lazymath.runtime.profiler", "pipe_utilization": util},
        }

    def save(self, path: str | os.PathLike) -> str:
        """Write the Chrome/Perfetto trace JSON to `path` (atomically); returns the path."""
        path = os.fspath(path)
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"profile.save: cannot write {path!r}: the folder "
                                    f"{folder!r} does not exist (create it first)")  # fmt: skip
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(self.chrome_trace(), f)
        os.replace(tmp, path)
        return path


class _Summary(str):
    """The summary text; its repr is short so `p.summary()` in a REPL prints the table once."""

    def __repr__(self) -> str:
        return f"<profile summary, {self.count(chr(10)) + 1} lines>"


@dataclass(frozen=True)
class _PipeCost:
    """A cost built from explicit cycles per pipe (record_kernel without a cost object)."""

    pipes: dict

    @property
    def total(self) -> int:
        return max(self.pipes.values(), default=0)


def _int(x) -> int:
    return x if isinstance(x, int) else 0


def _default_spec():
    return ASCEND910


__all__ = [
    "KernelRecord",
    "Profiler",
    "RealizeRecord",
    "SyncRecord",
    "active",
    "profile",
    "realize",
]


def op_clock(spec) -> float:
    return spec.clock_hz if spec is not None else 1e9


def _n(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"
