"""Race detection for the interpreter: cross-pipe hazards that no set_flag/wait_flag orders.

The NPU runs each pipe's queue in order and the pipes in parallel; only a set_flag on pipe P
followed by the matching wait_flag on pipe Q (or a pipe_barrier) orders P's earlier work before
Q's later work. The interpreter runs everything in program order, so a missing flag changes no
value there, and the LLVM lowering (sequential host code) drops flags: without this checker a
racy program passes both. The tracker keeps a vector clock per pipe (how far each pipe knows
every other pipe has progressed: a wait joins the clock its set captured) and, per buffer, the
recent accesses with their pipe, instruction index and element range. A read after a write, a
write after a read or a write after a write by another pipe that the current pipe's clock does
not cover raises `RaceError` naming both instructions.

A program without any flag is the serialised model (the cost model charges it as if a barrier
followed every instruction) and is not checked. Scalar-pipe instructions (loop control, the
atomic counter of split reductions) are issued in program order and are not tracked.
Footprints are registered per instruction type (`register`): (reads, writes) as lists of
(buffer name, first element, end element); an instruction without one is not tracked.

In a MIX kernel (`isa.is_mix`) each core kind has its own pipes: the tracker names them per core
("AIC.MTE2", "AIV.MTE2", ... by `isa.core_of`), a core's barrier joins only its own pipes and
only the cross-core flags carry clocks between the cores. (With one set of pipe names the AIC's
MTE2 -> MTE1 -> M -> FIX chain carried the AIV's MTE2 reads to the AIC's FixPipe, so a missing
"workspace slot free" flag went unnoticed.)
"""

from __future__ import annotations

from collections.abc import Callable

from lazymath.backend.npu import isa

FOOTPRINT: dict[type, Callable] = {}
KEEP = 64  # accesses remembered per buffer


class RaceError(RuntimeError):
    """A cross-pipe read/write hazard with no flag between the two instructions."""


def register(cls: type) -> Callable:
    """`@register(Instr) def fp(m, instr) -> (reads, writes)`, ranges as (name, lo, hi)."""

    def deco(fn: Callable) -> Callable:
        FOOTPRINT[cls] = fn
        return fn

    return deco


def _pipe(flag_pipe: str) -> str:
    return isa.FLAG_PIPE_OF.get(flag_pipe, flag_pipe)


class Tracker:
    def __init__(self, program: isa.Program):
        self.program = program
        self.mix = isa.is_mix(program)
        pipes = isa.PIPES
        if self.mix:
            pipes = tuple(f"{c}.{p}" for c in isa.MIX_CORES for p in isa.CORE_PIPES[c])
        self.clock: dict[str, dict[str, int]] = {p: {} for p in pipes}
        self.count: dict[str, int] = dict.fromkeys(pipes, 0)
        self.pending: dict[tuple, list] = {}
        self.seen: dict[str, list] = {}  # buffer -> [(pipe, idx, is_write, lo, hi, text)]
        # MIX: each AIV has its own UB on the device (one UB on the host, the AIVs' sub-block
        # sections one after the other): a UB buffer's accesses are tracked per AIV, so AIV 1
        # reusing a slot AIV 0 just used is no race (it was a false one once an AIV's MTE2,
        # Vector and MTE3 overlapped through flags instead of barriers)
        self.ub = {b.name for b in program.buffers if b.scope == "UB"} if self.mix else set()

    def _on(self, core: str | None, pipe: str) -> str:
        """The tracked pipe: per core in a MIX kernel."""
        return f"{core}.{pipe}" if self.mix else pipe

    def set_flag(self, i: isa.SetFlag, event: int) -> None:
        src = self._on(self.mix and isa.core_of(i), _pipe(i.src))
        self.pending.setdefault((i.src, i.dst, event), []).append(dict(self.clock[src]))

    def wait_flag(self, i: isa.WaitFlag, event: int) -> None:
        q = self.pending.get((i.src, i.dst, event))
        if not q:
            return  # the interpreter's own flag check reports the unpaired wait
        snap = q.pop(0)
        mine = self.clock[self._on(self.mix and isa.core_of(i), _pipe(i.dst))]
        for p, v in snap.items():
            if mine.get(p, 0) < v:
                mine[p] = v

    def cross_set(self, pipe: str, side: str, flag: int, n: int = 1) -> None:
        """CrossCoreSetFlag (MIX kernels): like set_flag, from a pipe of core `side` (`n`
        receivers: an AIC's set reaches each AIV). The AIVs of a group share the "AIV" pipe
        names here (their UBs are separate on a device, one on the host): a race between the
        two AIVs is not tracked."""
        src = self._on(side, _pipe(pipe))
        self.pending.setdefault(("cross", side, flag), []).extend(
            dict(self.clock[src]) for _ in range(n)
        )

    def cross_wait(self, pipe: str, setter: str, flag: int, n: int = 1) -> None:
        q = self.pending.get(("cross", setter, flag))
        if not q:
            return
        mine = self.clock[self._on("AIV" if setter == "AIC" else "AIC", _pipe(pipe))]
        for snap in q[:n]:
            for p, v in snap.items():
                if mine.get(p, 0) < v:
                    mine[p] = v
        del q[:n]

    def barrier(self, pipes=None, core: str | None = None) -> None:
        """Join the clocks of `pipes` (default all: PIPE_ALL on one core); in a MIX kernel the
        pipes of `core` ("AIC" / "AIV")."""
        if self.mix and core in isa.MIX_CORES:
            pipes = [f"{core}.{p}" for p in isa.CORE_PIPES[core]]
        pipes = list(self.clock) if pipes is None else pipes
        joined: dict[str, int] = {}
        for q in pipes:
            for p, v in self.clock[q].items():
                joined[p] = max(joined.get(p, 0), v)
        for p in pipes:
            self.clock[p] = dict(joined)

    def access(self, m, instr) -> None:
        fp = FOOTPRINT.get(type(instr))
        pipe = isa.PIPE_OF.get(type(instr), "Scalar")
        if fp is None or pipe == "Scalar":
            return
        reads, writes = fp(m, instr)
        if self.mix:
            core = isa.core_of(instr)
            pipe = f"{core}.{pipe}"
            if core == "AIV" and self.ub:
                v = m.env.get(isa.SUBBLOCK_IDX, 0)
                reads, writes = ([(f"{n}@{v}" if n in self.ub else n, lo, hi) for n, lo, hi in rs]
                                 for rs in (reads, writes))  # fmt: skip
        self.count[pipe] += 1
        idx = self.count[pipe]
        mine = self.clock[pipe]
        mine[pipe] = idx
        text = None
        for ranges, is_write in ((reads, False), (writes, True)):
            for name, lo, hi in ranges:
                if hi <= lo:
                    continue
                for q, qidx, qw, qlo, qhi, qtext in self.seen.get(name, ()):
                    if q == pipe or not (qw or is_write) or qhi <= lo or hi <= qlo:
                        continue
                    if mine.get(q, 0) < qidx:
                        what = ("writes" if is_write else "reads") + f" {name}[{lo}:{hi}]"
                        had = "wrote" if qw else "read"
                        raise RaceError(
                            f"kernel {self.program.name}: race on {name}: {pipe} "
                            f"'{isa.format_instr(instr)}' {what}, which {q} '{qtext}' {had} "
                            f"({name}[{qlo}:{qhi}]) with no set_flag/wait_flag {q}->{pipe} (or "
                            "pipe_barrier) between them"
                        )
        for ranges, is_write in ((reads, False), (writes, True)):
            for name, lo, hi in ranges:
                if hi <= lo:
                    continue
                if text is None:
                    text = isa.format_instr(instr)
                lst = self.seen.setdefault(name, [])
                lst.append((pipe, idx, is_write, lo, hi, text))
                if len(lst) > KEEP:
                    del lst[0]


# ----------------------------------------------------------------------------- footprints


def _lin(m, ref: isa.Ref, n) -> tuple:
    off = m.int(ref.off)
    return (ref.buf.name, off, off + m.int(n))


def _vec(*read_fields: str, write_fields: tuple = ("dst",)) -> Callable:
    def fp(m, i):
        reads = [_lin(m, getattr(i, f), i.n) for f in read_fields]
        return reads, [_lin(m, getattr(i, f), i.n) for f in write_fields]

    return fp


register(isa.VBinary)(_vec("a", "b"))
register(isa.VScalar)(_vec("src"))
register(isa.VUnary)(_vec("src"))
register(isa.VFma)(_vec("a", "b", "c"))
register(isa.VConv)(_vec("src"))
register(isa.VCmp)(_vec("a", "b"))
register(isa.VCmpS)(_vec("src"))
register(isa.VSel)(_vec("mask", "a", "b"))
register(isa.VDup)(_vec())


@register(isa.VGather)
def _gather(m, i):
    t0 = m.int(i.table.off)
    return [_lin(m, i.idx, i.n), (i.table.buf.name, t0, m.mem[i.table.buf.name].size)], [
        _lin(m, i.dst, i.n)
    ]


@register(isa.VHostMath)
def _hostmath(m, i):
    return [_lin(m, r, i.n) for r in i.srcs], [_lin(m, i.dst, i.n)]


@register(isa.VReduce)
def _reduce(m, i):
    rows, n = m.int(i.rows), m.int(i.n)
    d = _lin(m, i.dst, rows)
    return [_lin(m, i.src, rows * n), d], [d]


@register(isa.VArgReduce)
def _argreduce(m, i):
    rows, n = m.int(i.rows), m.int(i.n)
    dv, di = _lin(m, i.dst_val, rows), _lin(m, i.dst_idx, rows)
    return [_lin(m, i.src, rows * n), dv, di], [dv, di]


def strided(m, ref: isa.Ref, counts, strides) -> tuple:
    """(name, lo, hi) covering a strided GM access."""
    off = m.int(ref.off)
    lo = hi = off
    for c, s in zip(counts, strides):
        c, s = m.int(c), m.int(s)
        if c <= 0:
            return (ref.buf.name, off, off)
        span = (c - 1) * s
        lo, hi = lo + min(0, span), hi + max(0, span)
    return (ref.buf.name, lo, hi + 1)


def pitched(m, ref: isa.Ref, counts, pitch) -> tuple:
    """(name, lo, hi) of a dense (pitched) on-chip tile."""
    cs = [m.int(c) for c in counts]
    off = m.int(ref.off)
    if any(c <= 0 for c in cs):
        return (ref.buf.name, off, off)
    if len(cs) == 1:
        return (ref.buf.name, off, off + cs[0])
    p = cs[1] if pitch is None else m.int(pitch)
    return (ref.buf.name, off, off + (cs[0] - 1) * p + cs[1])


@register(isa.CopyIn)
def _copy_in(m, i):
    return [strided(m, i.src, i.counts, i.strides)], [pitched(m, i.dst, i.counts, i.dst_pitch)]


@register(isa.CopyOut)
def _copy_out(m, i):
    return [pitched(m, i.src, i.counts, i.src_pitch)], [strided(m, i.dst, i.counts, i.strides)]
