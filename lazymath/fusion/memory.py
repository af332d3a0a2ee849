"""Static memory plan for one program.

Intermediate buffers (written by one kernel, read by later ones, not requested by the user) get
offsets in one arena: liveness over the kernel order, best-fit reuse of dead blocks, and in-place
reuse when an elementwise kernel's input dies at that kernel and has the output's exact size and
contiguous layout (each tile is read into UB before it is written back, so aliasing is safe).
Program outputs get their own allocations because they outlive the program.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ALIGN = 64


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass
class BufferPlan:
    node_id: int
    nbytes: int
    first: int  # producing kernel index
    last: int  # last consuming kernel index
    offset: int = -1  # arena offset (intermediates)
    is_output: bool = False
    inplace_of: int | None = None  # node id whose block this buffer reuses
    handed_over: bool = False  # this buffer's block was taken over in place by a later one


@dataclass
class MemoryPlan:
    buffers: dict[int, BufferPlan] = field(default_factory=dict)
    arena_bytes: int = 0
    planned_peak_bytes: int = 0
    reuses: int = 0
    inplace: int = 0

    def __str__(self) -> str:
        return (f"arena {self.arena_bytes} B, planned peak {self.planned_peak_bytes} B, "
                f"{self.reuses} block reuse(s), {self.inplace} in-place")  # fmt: skip


def plan_memory(kernels, output_ids: set[int], inplace_ok) -> MemoryPlan:
    """kernels: sequence of (inputs: list[(node_id, nbytes)], outputs: list[(node_id, nbytes)]).

    `inplace_ok(k, in_id, out_id)` says whether kernel k may write out_id over in_id.
    """
    plan = MemoryPlan()
    bufs = plan.buffers
    for k, (_ins, outs) in enumerate(kernels):
        for nid, nbytes in outs:
            bufs[nid] = BufferPlan(nid, nbytes, k, k, is_output=nid in output_ids)
    for k, (ins, _outs) in enumerate(kernels):
        for nid, _ in ins:
            if nid in bufs:
                bufs[nid].last = max(bufs[nid].last, k)

    free: list[tuple[int, int]] = []  # (offset, size) blocks of the arena
    top = 0
    live_bytes = 0
    out_bytes = 0
    peak = 0

    def release(b: BufferPlan) -> None:
        nonlocal free
        free.append((b.offset, _align(b.nbytes)))
        free.sort()
        merged: list[tuple[int, int]] = []
        for off, size in free:
            if merged and merged[-1][0] + merged[-1][1] == off:
                merged[-1] = (merged[-1][0], merged[-1][1] + size)
            else:
                merged.append((off, size))
        free = merged

    for k, (ins, outs) in enumerate(kernels):
        # one entry per buffer: a kernel may read the same buffer through several inputs
        # (x - max(x) reads x twice), and releasing its block twice would hand the same
        # arena bytes to two later buffers
        in_ids = dict.fromkeys(nid for nid, _ in ins)
        dying = [bufs[nid] for nid in in_ids if nid in bufs and not bufs[nid].is_output
                 and bufs[nid].last == k and bufs[nid].offset >= 0]  # fmt: skip
        for nid, nbytes in outs:
            b = bufs[nid]
            if b.is_output:
                out_bytes += nbytes
                continue
            if b.last == k and b.first == k:
                b.last = k  # written and never read here: still needs a block
            donor = next((d for d in dying if d.nbytes == nbytes and not d.handed_over
                          and inplace_ok(k, d.node_id, nid)), None)  # fmt: skip
            if donor is not None:
                b.offset = donor.offset
                b.inplace_of = donor.node_id
                donor.handed_over = True  # block handed over, not freed
                dying.remove(donor)
                plan.inplace += 1
                continue
            size = _align(nbytes)
            fit = [(s, o) for o, s in free if s >= size]
            if fit:
                s, o = min(fit)
                free.remove((o, s))
                if s > size:
                    free.append((o + size, s - size))
                    free.sort()
                b.offset = o
                plan.reuses += 1
            else:
                b.offset = top
                top += size
            live_bytes += size
        peak = max(peak, live_bytes + out_bytes)
        for d in dying:
            if not d.handed_over:
                release(d)
                live_bytes -= _align(d.nbytes)
        for nid, _ in outs:  # written here and never read later: the block is free again
            b = bufs[nid]
            if not b.is_output and b.last == k and b.offset >= 0 and not b.handed_over:
                if all(i != nid for i, _ in ins):
                    release(b)
                    live_bytes -= _align(b.nbytes)
    plan.arena_bytes = top
    plan.planned_peak_bytes = peak
    return plan
