"""Layer 3, compile: fuse a pending graph into kernels, label each with its NPU unit and
roofline class, plan memory and streams. The fusion policy is the table in `rules`; grouping
in `grouping`, kernel IR construction in `build`, strides in `views`, the arena in `memory`,
stream assignment in `streams`, the printable result in `schedule`.
"""

from __future__ import annotations

from lazymath.fusion.grouping import plan
from lazymath.fusion.memory import plan_memory
from lazymath.fusion.rules import FIXPIPE_OPS
from lazymath.fusion.schedule import Schedule, ScheduledKernel, kernel_cost_class, ridge_point
from lazymath.fusion.streams import KernelDeps, assign_streams
from lazymath.graph.node import Node
from lazymath.graph.ops import ELEMENTWISE, VIEWS

__all__ = ["Schedule", "ScheduledKernel", "make_schedule"]


def _unit(g, spec=None) -> str:
    if g.kind == "aicpu":
        return "aicpu"
    if g.kind == "custom":
        return g.ir.unit
    if g.kind == "matmul":  # column sums on a split device: the AIVs fold the tiles (MIX)
        split_cols = (
            bool(g.col_sums or g.row_reds or g.softmax) and spec is not None and not spec.coupled
        )
        # (an epilogue beyond FixPipe's on a split device -- conv1d's implicit GEMM, an
        # activation's (rules.MATMUL_MIX_EPILOGUE) -- runs on the AIVs)
        split_epi = (spec is not None and not spec.coupled and g.ir is not None
                     and any(n.op in ELEMENTWISE and n.op not in FIXPIPE_OPS
                             for n in g.member_nodes))  # fmt: skip
        return "mix" if g.has_prologue or split_cols or split_epi else "cube"
    return "vector"


def _ops(g) -> list[str]:
    ops = []
    for n in g.member_nodes:
        if n.op in ELEMENTWISE:
            ops.append(n.op)
        elif n.op == "reduce":
            ops.append(n.arg[0])
        elif n.op == "custom":
            if g.ir.name not in ops:  # a multi-output call: one kernel
                ops.append(g.ir.name)
        elif n.op not in VIEWS:
            ops.append(n.op)
    return ops or ["copy"]


def _inplace_ok(groups):
    def ok(k: int, in_id: int, out_id: int) -> bool:
        g = groups[k]
        if g.kind != "elementwise":
            return False
        ir = g.ir
        for node, view in zip(g.inputs, ir.inputs):
            if id(node) == in_id:
                # the input must be read exactly in output order (same contiguous layout)
                if view != ir.outputs[0] or view.offset != 0:
                    return False
        return True

    return ok


def make_schedule(
    outputs: list[Node], spec, n_streams: int = 2, *, row_template, report=None
) -> Schedule:
    """Fuse and plan; no backend compilation, no execution. The result is frozen: later
    stages (compile, replay, the visualizations) read it and build their own objects.
    The driver hands over the backend's parts (fusion imports no backend): `row_template`, the
    row template, decides row kernels (`grouping.plan`); `report`, the backend's lines of the
    printout (`Schedule.report`)."""
    groups, log, planner = plan(outputs, spec, row_template=row_template)
    groups, aliases = _elide_bitcasts(groups, outputs)
    rows = []
    for i, g in enumerate(groups):
        unit = _unit(g, spec)
        ops = _ops(g)
        flops, nbytes = kernel_cost_class(g.ir, unit, spec)
        bound = "compute" if nbytes and flops / nbytes >= ridge_point(unit, spec) else "memory"
        if not nbytes:
            bound = "compute"
        name = f"k{i}_" + "_".join(dict.fromkeys(ops))[:40]
        src = (g.core or g.outputs[0]).loc if (g.core or g.outputs) else ""
        rows.append((name, unit, ops, flops, nbytes, bound, src))
    out_ids = {id(o) for o in outputs}
    alias_ids = {k: id(v) for k, v in aliases.items()}
    mem = plan_memory(
        [([(alias_ids.get(id(n), id(n)), n.nbytes) for n in g.inputs],
          [(alias_ids.get(id(n), id(n)), n.nbytes) for n in g.outputs]) for g in groups],
        out_ids,
        _inplace_ok(groups),
    )  # fmt: skip
    sp = _stream_plan(mem, groups, rows, n_streams, alias_ids)
    kernels = [
        ScheduledKernel(
            name=name, unit=unit, kind=g.kind, ops=ops,
            inputs=[f"{n.op}{list(n.shape)}:{n.dtype.name}" for n in g.inputs],
            outputs=[f"{n.op}{list(n.shape)}:{n.dtype.name}" for n in g.outputs],
            flops=flops, bytes=nbytes, bound=bound, ir=g.ir, group=g, source_loc=src,
            stream=ks.stream, waits=tuple(ks.waits), records=ks.records,
        )
        for g, (name, unit, ops, flops, nbytes, bound, src), ks in zip(groups, rows, sp.kernels)
    ]  # fmt: skip
    return Schedule(
        kernels, mem, log, spec,
        n_streams=len({k.stream for k in kernels}) or 1, n_events=sp.n_events,
        outputs=list(outputs), copy_inputs=planner.copied, aliases=aliases, report=report,
    )  # fmt: skip


def _elide_bitcasts(groups, outputs) -> tuple[list, dict]:
    """Drop the AI CPU kernels of `complex_join` outputs that only reinterpret bytes: a join
    that crops nothing reads its source (float32 (real, imaginary) pairs in C order, computed
    by an AI Core kernel of this schedule) as complex64, so that kernel writes into the
    output's memory directly and the join (a memcpy) disappears. Returns the remaining groups
    and {id(source): join} (the engine gives the source the join's buffer, typed as the
    source)."""
    out_ids = {id(o) for o in outputs}
    produced = {id(n) for g in groups if g.kind != "aicpu" for n in g.outputs}
    aliases: dict = {}
    keep = []
    for g in groups:
        j = g.outputs[0] if g.kind == "aicpu" and len(g.outputs) == 1 else None
        if (j is not None and j.op == "complex_join" and id(j) in out_ids
                and j.arg[1] == j.shape[-1] and len(g.inputs) == 1):  # fmt: skip
            s = g.inputs[0]
            if (s is j.srcs[0] and id(s) in produced and id(s) not in out_ids
                    and id(s) not in aliases and s.nbytes == j.nbytes):  # fmt: skip
                aliases[id(s)] = j
                continue
        keep.append(g)
    return keep, aliases


def _stream_plan(mem, groups, rows, n_streams: int, alias_ids: dict | None = None):
    """Streams and events from buffer hazards. Buffers are identified by *memory*, not by
    node: arena blocks reused by a later buffer (best fit or in place) are the same memory,
    so the hazard check sees write-after-read across streams on a reused block."""
    segs = _arena_segments(mem)

    alias_ids = alias_ids or {}

    def ids(n) -> list:
        nid = alias_ids.get(id(n), id(n))
        return segs.get(nid) or [("node", nid)]

    deps = []
    for g, (name, _unit, _ops, flops, nbytes, _bound, _src) in zip(groups, rows):
        reads = frozenset(x for n in g.inputs for x in ids(n))
        writes = frozenset(x for n in g.outputs for x in ids(n))
        deps.append(KernelDeps(reads=reads, writes=writes, name=name,
                               weight=float(max(flops, nbytes, 1))))  # fmt: skip
    return assign_streams(deps, n_streams)


def _arena_segments(mem) -> dict[int, list]:
    """node id -> the arena segments its buffer covers (segments split at every buffer edge,
    so two buffers share a segment exactly when their byte ranges overlap)."""
    spans = {nid: (b.offset, b.offset + max(b.nbytes, 1)) for nid, b in mem.buffers.items()
             if not b.is_output and b.offset >= 0}  # fmt: skip
    edges = sorted({e for span in spans.values() for e in span})
    index = {e: i for i, e in enumerate(edges)}
    return {nid: [("arena", i) for i in range(index[a], index[b])] for nid, (a, b) in spans.items()}
