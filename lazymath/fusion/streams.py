"""Stream assignment: independent branches on different streams, events only where needed.

Input: kernels in program order, each with the buffer ids it reads and writes. Two kernels
depend on each other when they touch a common buffer and at least one writes it:
read-after-write (RAW), write-after-read (WAR) or write-after-write (WAW). Output: a stream per
kernel plus record/wait event pairs for the cross-stream dependencies.

Greedy rule (one pass, program order):
- a kernel with dependencies goes to the stream of its latest dependency (the chain continues
  where its data was produced, with no event);
- a kernel with none goes to the least loaded stream (load = summed `weight`, ties -> lowest);
- a dependency on another stream needs an event only if that stream's work up to the producer
  is not already known complete on this stream. Knowledge is tracked with vector clocks, so a
  transitive wait (A -> B -> C) never adds a redundant event, and a kernel records at most one
  event however many consumers wait on it.

The plan is plain data (printable, comparable) and `verify_plan` checks that every dependency
is ordered, which property tests use.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KernelDeps:
    """What the assigner needs to know about one kernel."""

    reads: frozenset[int]
    writes: frozenset[int]
    name: str = ""
    weight: float = 1.0  # relative run time (cycles from the cost model when known)


@dataclass(frozen=True, slots=True)
class StreamEntry:
    """Placement of one kernel: its stream, the events it waits for first, the event it records
    after it finishes (or None)."""

    stream: int
    waits: tuple[int, ...] = ()
    record: int | None = None

    @property
    def records(self) -> int | None:
        """Alias of `record` (one event per kernel at most)."""
        return self.record


@dataclass(frozen=True, slots=True)
class StreamPlan:
    entries: tuple[StreamEntry, ...]
    n_events: int
    n_streams: int  # streams available to the assigner
    names: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, i: int) -> StreamEntry:
        return self.entries[i]

    def __iter__(self):
        return iter(self.entries)

    @property
    def kernels(self) -> tuple[StreamEntry, ...]:
        """Alias of `entries`: one placement per kernel, in program order."""
        return self.entries

    @property
    def streams(self) -> tuple[int, ...]:
        return tuple(e.stream for e in self.entries)

    @property
    def streams_used(self) -> int:
        return len({e.stream for e in self.entries})

    def __str__(self) -> str:
        lines = [f"{'kernel':24} {'stream':>6}  {'waits':12} record"]
        for i, e in enumerate(self.entries):
            name = self.names[i] if i < len(self.names) and self.names[i] else f"k{i}"
            waits = ",".join(f"e{w}" for w in e.waits) or "-"
            rec = f"e{e.record}" if e.record is not None else "-"
            lines.append(f"{name[:24]:24} {e.stream:>6}  {waits:12} {rec}")
        lines.append(
            f"{len(self.entries)} kernel{'s' if len(self.entries) != 1 else ''} on "
            f"{self.streams_used} of {self.n_streams} streams, "
            f"{self.n_events} event{'s' if self.n_events != 1 else ''}"
        )
        return "\n".join(lines)


def dependencies(kernels: Sequence[KernelDeps]) -> list[set[int]]:
    """Direct dependencies of each kernel (indices of earlier kernels), RAW + WAR + WAW."""
    last_writer: dict[int, int] = {}
    readers: dict[int, list[int]] = {}  # readers since the last write
    deps: list[set[int]] = []
    for i, k in enumerate(kernels):
        d: set[int] = set()
        for b in k.reads:  # RAW
            w = last_writer.get(b)
            if w is not None:
                d.add(w)
        for b in k.writes:
            w = last_writer.get(b)  # WAW
            if w is not None:
                d.add(w)
            d.update(readers.get(b, ()))  # WAR
        d.discard(i)
        deps.append(d)
        for b in k.reads:
            readers.setdefault(b, []).append(i)
        for b in k.writes:
            last_writer[b] = i
            readers[b] = []
    return deps


def assign_streams(kernels: Sequence[KernelDeps], n_streams: int = 2) -> StreamPlan:
    """Place kernels on at most `n_streams` streams; see the module docstring for the rule."""
    if n_streams < 1:
        raise ValueError(f"n_streams must be >= 1, got {n_streams}")
    deps = dependencies(kernels)
    load = [0.0] * n_streams
    length = [0] * n_streams  # kernels placed on each stream so far
    # clock[s][t]: number of stream t's kernels known complete at the tail of stream s
    clock = [[0] * n_streams for _ in range(n_streams)]
    stream_of: list[int] = []
    pos_of: list[int] = []  # 1-based position of the kernel on its stream
    snap: list[list[int] | None] = []  # clock of the kernel's stream right after it
    event_of: dict[int, int] = {}  # kernel index -> event it records
    waits_of: list[list[int]] = []
    n_events = 0
    for i, k in enumerate(kernels):
        d = deps[i]
        if d:
            s = stream_of[max(d)]
        else:
            s = min(range(n_streams), key=lambda t: (load[t], t))
        # latest dependency per other stream
        latest: dict[int, tuple[int, int]] = {}
        for j in d:
            t = stream_of[j]
            if t != s and (t not in latest or pos_of[j] > latest[t][1]):
                latest[t] = (j, pos_of[j])
        waits: list[int] = []
        for t, (j, pos) in sorted(latest.items(), key=lambda kv: kv[1][0]):
            if clock[s][t] >= pos:
                continue  # already ordered through an earlier wait
            ev = event_of.get(j)
            if ev is None:
                ev = event_of[j] = n_events
                n_events += 1
            waits.append(ev)
            other = snap[j]
            row = clock[s]
            for u in range(n_streams):
                if other[u] > row[u]:
                    row[u] = other[u]
        length[s] += 1
        clock[s][s] = length[s]
        stream_of.append(s)
        pos_of.append(length[s])
        snap.append(list(clock[s]))
        load[s] += k.weight
        waits_of.append(waits)
    entries = tuple(
        StreamEntry(stream_of[i], tuple(waits_of[i]), event_of.get(i)) for i in range(len(kernels))
    )
    return StreamPlan(entries, n_events, n_streams, tuple(k.name for k in kernels))


def verify_plan(kernels: Sequence[KernelDeps], plan: StreamPlan) -> None:
    """Raise AssertionError unless every dependency is ordered by stream order or events.

    Replays the plan with vector clocks built only from the plan itself (not the assigner's
    bookkeeping): kernel j happens-before kernel i iff i's stream clock covers j's position.
    """
    if len(plan) != len(kernels):
        raise AssertionError(f"plan has {len(plan)} entries for {len(kernels)} kernels")
    n = max((e.stream for e in plan), default=0) + 1
    clock = [[0] * n for _ in range(n)]
    recorded: dict[int, list[int]] = {}
    pos: list[tuple[int, int]] = []
    deps = dependencies(kernels)
    for i, e in enumerate(plan):
        row = clock[e.stream]
        for w in e.waits:
            if w not in recorded:
                raise AssertionError(f"kernel {i} waits on e{w} before it is recorded")
            for u, v in enumerate(recorded[w]):
                row[u] = max(row[u], v)
        row[e.stream] += 1
        pos.append((e.stream, row[e.stream]))
        if e.record is not None:
            recorded[e.record] = list(row)
        for j in deps[i]:
            t, p = pos[j]
            if row[t] < p:
                raise AssertionError(f"kernel {i} is not ordered after its dependency {j}")
