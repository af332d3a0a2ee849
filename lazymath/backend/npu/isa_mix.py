"""MIX kernels (split 910B): which core runs each instruction (`core_of`, `mix_cores`), the
projection of one body onto the AIC and AIV programs (`mix_streams`), and the check that
every cross-core wait has its set (`_check_mix`, one of `isa.PROGRAM_CHECKS`).

Part of the ISA's one namespace, `isa` (issue 36 split it by what it holds): use `isa.X`.
"""

from __future__ import annotations

from dataclasses import replace

from lazymath.backend.npu.isa_control import (
    AIV_PIPES,
    CROSS_CORE_FLAGS,
    FLAG_PIPE_OF,
    AtomicAdd,
    CrossCoreSetFlag,
    CrossCoreWaitFlag,
    GetValue,
    If,
    Let,
    Loop,
    PipeBarrier,
    SetFlag,
    WaitFlag,
    walk,
)
from lazymath.backend.npu.isa_registry import format_instr, pipe_of
from lazymath.backend.npu.isa_values import BLOCK_IDX, SUBBLOCK_IDX, Ref, int_range

# ----------------------------------------------------------------------------- MIX kernels
# A MIX kernel (AscendC KERNEL_TYPE_MIX_AIC_1_2, split 910B) is written as ONE body, as AscendC
# writes it as one kernel function whose core-specific parts sit under ASCEND_IS_AIC /
# ASCEND_IS_AIV: the compiler builds one binary per core kind from it. Here the core of each
# instruction follows from the instruction itself (the table below: the AIC owns L1/L0 and the
# Cube, MTE1 and FixPipe pipes, the AIV owns UB, Vector and MTE3; MTE2 and Scalar exist on both
# and go by the buffer or the flag), so the split needs no marker in the body: `mix_streams`
# projects the body onto each core (scalar control, Let / Loop / If, goes to every core whose
# instructions it encloses). The host (llvm, interp) runs the body in program order, one valid
# interleaving of the two streams (every cross-core wait comes after its set), so host results
# do not depend on the split; the device model (cost, listings, the timeline's lanes) uses the
# two programs, which run concurrently and meet only at the cross-core flags.
# Sub-blocks (KERNEL_TYPE_MIX_AIC_1_2: two AIVs per AIC): a loop over SUBBLOCK_IDX holds what
# each AIV does with its index (e.g. its half of a tile's rows); the AIV work outside such loops
# is sub-block 0's (`if GetSubBlockIdx() == 0`), and a program without them uses one AIV. With
# n AIVs an AIC cross-core set reaches each of them and an AIC wait completes when all n have
# set the flag (AscendC's mode-2 flags within a group).

MIX_CORES = ("AIC", "AIV")
AIC_PIPES = ("Scalar", "MTE2", "MTE1", "Cube", "FixPipe")
CORE_PIPES = {"AIC": AIC_PIPES, "AIV": AIV_PIPES}
_CORE_OF_PIPE = {"MTE1": "AIC", "Cube": "AIC", "FixPipe": "AIC", "Vector": "AIV", "MTE3": "AIV"}
_CORE_OF_SCOPE = {"L1": "AIC", "L0A": "AIC", "L0B": "AIC", "L0C": "AIC", "UB": "AIV"}
_CORE_OF_FLAG = {"MTE1": "AIC", "M": "AIC", "FIX": "AIC", "V": "AIV", "MTE3": "AIV"}
# a Scalar-pipe instruction with no core of its own: the split reductions' arrival counter is
# the Vector cores' (they publish and combine the partials; the AIC only multiplies)
_CORE_OF_TYPE: dict[type, str] = {AtomicAdd: "AIV"}


def core_of(instr) -> str | None:
    """The core kind ("AIC" / "AIV") of a MIX kernel that runs `instr`; None for scalar control
    (Let, GetValue, Loop, If), which each core's program has where it needs it (each core's
    scalar unit reads a run-time tiling word, as AscendC's tiling data). ValueError if the
    instruction belongs to no single core (a barrier over all pipes, a flag between pipes of
    different cores)."""
    t = type(instr)
    if t in (Let, GetValue, Loop, If):
        return None
    if t in (CrossCoreSetFlag, CrossCoreWaitFlag):
        return instr.side
    if t is PipeBarrier:
        if instr.pipe in MIX_CORES:
            return instr.pipe
        raise ValueError(f"{format_instr(instr)!r}: in a MIX kernel a barrier covers one core's "
                         "pipes (pipe_barrier AIC or AIV)")  # fmt: skip
    if t in (SetFlag, WaitFlag):
        cores = {_CORE_OF_FLAG.get(instr.src), _CORE_OF_FLAG.get(instr.dst)} - {None}
        if len(cores) != 1:
            raise ValueError(f"{format_instr(instr)!r}: a set/wait flag joins two pipes of one "
                             "core; between the AIC and the AIV use cross-core flags")  # fmt: skip
        return cores.pop()
    if t in _CORE_OF_TYPE:
        return _CORE_OF_TYPE[t]
    pipe = pipe_of(instr)
    if pipe in _CORE_OF_PIPE:
        return _CORE_OF_PIPE[pipe]
    dst = getattr(instr, "dst", None)
    if pipe == "MTE2" and isinstance(dst, Ref) and dst.buf.scope in _CORE_OF_SCOPE:
        return _CORE_OF_SCOPE[dst.buf.scope]
    raise ValueError(f"{format_instr(instr)!r}: no core of a MIX kernel runs it")


def mix_cores(body) -> dict[int, tuple[str, ...]]:
    """id(instruction) -> the cores whose program contains it, for every instruction of `body`
    (leaves: their core; Loop / If: the cores of their body; Let, GetValue: the cores of the
    body it is declared in)."""
    out: dict[int, tuple[str, ...]] = {}

    def visit(b) -> set:
        here: set = set()
        lets = []
        for i in b:
            if isinstance(i, (Loop, If)):
                inner = visit(i.body)
                out[id(i)] = tuple(c for c in MIX_CORES if c in inner)
                here |= inner
            elif isinstance(i, (Let, GetValue)):
                lets.append(i)
            else:
                c = core_of(i)
                out[id(i)] = (c,)
                here.add(c)
        for i in lets:
            out[id(i)] = tuple(c for c in MIX_CORES if c in here)
        return here

    visit(body)
    return out


def mix_aivs(program) -> int:
    """AIVs per AIC that a MIX kernel uses: the trip count of its sub-block loops (else 1)."""
    n = 1
    for i, _ in walk(program.body):
        if isinstance(i, Loop) and i.var == SUBBLOCK_IDX and isinstance(i.stop, int):
            n = max(n, i.stop)
    return n


def is_mix(program) -> bool:
    """A MIX kernel with two instruction streams (AIC + AIV) joined by cross-core flags."""
    return program.unit == "mix" and any(
        isinstance(i, (CrossCoreSetFlag, CrossCoreWaitFlag)) for i, _ in walk(program.body)
    )


def mix_streams(program) -> dict:
    """{"AIC": Program, "AIV": Program}: the instruction stream of each core kind of a MIX
    kernel (the body projected onto the core; buffers of its scopes; see the section comment)."""
    cores = mix_cores(program.body)
    subs = mix_aivs(program) > 1

    def project(body, core, sub=False):
        out: list = []
        run: list = []  # sub-block 0's AIV work outside sub-block loops

        def flush() -> None:
            if run:
                out.append(If(SUBBLOCK_IDX, "==", 0, tuple(run)))
                run.clear()

        for i in body:
            if core not in cores[id(i)]:
                continue
            if isinstance(i, Loop) and i.var == SUBBLOCK_IDX:  # each AIV: its own iteration
                flush()
                out.extend(project(i.body, core, True))
                continue
            if isinstance(i, Loop):
                i = Loop(i.var, i.start, i.stop, i.step, project(i.body, core, sub))
            elif isinstance(i, If):
                i = If(i.a, i.cmp, i.b, project(i.body, core, sub))
            if subs and core == "AIV" and not sub and not isinstance(i, (Let, GetValue, Loop, If)):
                run.append(i)
                continue
            flush()
            out.append(i)
        flush()
        return tuple(out)

    unit = {"AIC": "cube", "AIV": "vector"}
    # `replace`, not `isa.Program(...)`: the Program class sits above this module (its listing
    # calls mix_streams); the copy keeps args, blocks, device_blocks and workspace
    return {c: replace(program, name=f"{program.name}.{c.lower()}",
                       buffers=tuple(b for b in program.buffers
                                     if _CORE_OF_SCOPE.get(b.scope) == c),
                       body=project(program.body, c), unit=unit[c])
            for c in MIX_CORES}  # fmt: skip


def _check_mix(program, spec) -> None:
    """A MIX kernel: every instruction belongs to one core, a cross-core flag is raised on a
    pipe of its own core, and every cross-core wait can be matched by a set of the other core
    on a flag id it can take (and every set by a wait): the NPU would hang on a wait nobody sets.
    (Counts are the cost model's check: it walks the streams and raises on a wait left with no
    pending set.)"""
    if spec.coupled or not is_mix(program):  # (Program.check refuses cross-core flags there)
        return
    ranges: dict = {BLOCK_IDX: (0, max(program.blocks, 1) - 1)}
    sets: dict = {c: [] for c in MIX_CORES}
    waits: dict = {c: [] for c in MIX_CORES}
    aivs = max(1, spec.vector_cores // max(spec.cube_cores, 1))

    def visit(body) -> None:
        for i in body:
            core_of(i)  # raises for an instruction of no single core
            if isinstance(i, Loop) and i.var == SUBBLOCK_IDX:
                if not (isinstance(i.stop, int) and i.start == 0 and i.step == 1
                        and 1 <= i.stop <= aivs):  # fmt: skip
                    raise ValueError(f"kernel {program.name}: a sub-block loop runs 0..n, n <= "
                                     f"{aivs} (AIVs per AIC on {spec.name})")  # fmt: skip
                if any(core_of(j) not in (None, "AIV") for j, _ in walk(i.body)):
                    raise ValueError(f"kernel {program.name}: a sub-block loop holds AIV work "
                                     "only")  # fmt: skip
            if isinstance(i, Loop):
                s, t = int_range(i.start, ranges), int_range(i.stop, ranges)
                ranges[i.var] = (s[0], t[1] - 1)
                visit(i.body)
            elif isinstance(i, If):
                visit(i.body)
            elif isinstance(i, Let):
                ranges[i.var] = int_range(i.value, ranges)
            elif isinstance(i, (CrossCoreSetFlag, CrossCoreWaitFlag)):
                if i.side not in MIX_CORES:
                    raise ValueError(f"kernel {program.name}: {format_instr(i)!r}: side must be "
                                     "AIC or AIV")  # fmt: skip
                if FLAG_PIPE_OF.get(i.pipe) not in CORE_PIPES[i.side]:
                    raise ValueError(f"kernel {program.name}: {format_instr(i)!r}: pipe {i.pipe} "
                                     f"is not a pipe of the {i.side}")  # fmt: skip
                lo, hi = int_range(i.flag, ranges)
                lo, hi = max(lo, 0), min(hi, CROSS_CORE_FLAGS - 1)
                (sets if isinstance(i, CrossCoreSetFlag) else waits)[i.side].append((i, lo, hi))

    visit(program.body)
    for core in MIX_CORES:
        other = MIX_CORES[1 - MIX_CORES.index(core)]
        for mine, theirs, what in ((waits[core], sets[other], "set"),
                                   (sets[core], waits[other], "wait")):  # fmt: skip
            for i, lo, hi in mine:
                if not any(a <= hi and lo <= b for _, a, b in theirs):
                    why = "the NPU would wait forever" if what == "set" else "nobody consumes it"
                    raise ValueError(
                        f"kernel {program.name}: {format_instr(i)!r} has no matching "
                        f"cross-core {what} on the {other} (flag ids {lo:g}..{hi:g}): {why}"
                    )
