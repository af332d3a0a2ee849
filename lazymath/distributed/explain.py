"""A distributed plan as text and as a picture: shard programs (with the kernel table of one
shard's program, as `lm.schedule` prints it), the collectives as their own nodes, the tails."""

from __future__ import annotations

import numpy as np

from ..api import schedule
from ..tensor import Tensor
from .plan import DNode, Plan, Stage, rebuild, shard_shape


def _label(d: DNode) -> str:
    n = d.node
    what = {
        "shard": "sharded input",
        "leaf": "input",
        "local": "input (sliced per shard)",
        "allreduce": f"allreduce({d.arg})",
        "allgather": "allgather",
        "scatter": "scatter",
        "op": n.op if n is not None else "?",
    }.get(d.kind, d.kind)
    shape = "x".join(map(str, n.shape)) if n is not None and n.shape else "scalar"
    dtype = n.dtype.name if n is not None else ""
    return f"{what} {dtype}[{shape}] {d.place}"


def stage_schedule(st: Stage, i: int = 0, spec=None):
    """The lazymath schedule of shard `i`'s program (compiled on placeholder inputs of the
    shard's shapes: nothing runs)."""
    prog = st.programs[min(i, len(st.programs) - 1)]
    inputs = []
    for x in st.inputs:
        shape = shard_shape(x, i) if st.sharded else x.node.shape
        inputs.append(np.empty(shape, x.node.dtype))
    outs = [n for n in rebuild(prog, inputs) if n.realized is None]
    if not outs:
        return None
    return schedule(*[Tensor(n) for n in outs], spec=spec)


def tree_depth(n: int) -> int:
    depth = 0
    while n > 1:
        n = (n + 1) // 2
        depth += 1
    return depth


def explain_plan(plan: Plan) -> str:
    p = plan
    colls = p.collectives
    lines = [
        f"distributed plan: {p.n} shard{'s' if p.n != 1 else ''}, {len(p.stages)} stage"
        f"{'s' if len(p.stages) != 1 else ''}, {len(colls)} collective"
        f"{'s' if len(colls) != 1 else ''}"
    ]
    by_level: dict[int, list] = {}
    for st in p.stages:
        by_level.setdefault(st.level, []).append(("stage", st))
    for c in colls:
        by_level.setdefault(c.level, []).insert(0, ("coll", c))
    for level in sorted(by_level):
        for kind, x in by_level[level]:
            if kind == "coll":
                lines.append(_coll_line(x, p.n))
                continue
            st: Stage = x
            distinct = len({id(pr) for pr in st.programs})
            tasks = len(st.programs)
            same = (
                "the same program on every shard"
                if distinct == 1
                else f"{distinct} distinct programs (uneven shards)"
            )
            head = (f"program {st.name}: {tasks} task{'s' if tasks != 1 else ''}"
                    + (f", {same}" if st.sharded else " (replicated values, once)"))  # fmt: skip
            lines.append(head)
            for x_in in st.inputs:
                lines.append(f"  in   {_label(x_in)}")
            for x_out in st.outputs:
                lines.append(f"  out  {_label(x_out)}")
            try:
                sched = stage_schedule(st)
            except Exception as e:  # explain must not fail because a kernel cannot compile
                sched = f"(schedule unavailable: {type(e).__name__}: {e})"
            if sched is not None:
                text = str(sched)
                lines.extend("    " + t for t in text.splitlines())
    outs = ", ".join(_label(d) for d in p.roots)
    lines.append(f"results: {outs}")
    return "\n".join(lines)


def _coll_line(c: DNode, n: int) -> str:
    nbytes = c.node.nbytes if c.node is not None else 0
    if c.kind == "allreduce":
        return (f"collective allreduce({c.arg}) over {n} shards: binary tree of {max(n - 1, 0)} "
                f"combine tasks, depth {tree_depth(n)}, {nbytes} bytes per partial")  # fmt: skip
    if c.kind == "allgather":
        return f"collective allgather over {n} shards: {nbytes} bytes gathered"
    return f"collective scatter to {n} shards: {nbytes} bytes sliced"


def to_dot(plan) -> str:
    """Graphviz DOT of a plan (or of the tensors' plan): inputs, shard programs (boxes, xN),
    collectives (octagons), tails, results."""
    if not isinstance(plan, Plan):
        from .api import plan as make

        plan = make(*(plan if isinstance(plan, (list, tuple)) else [plan]))
    p = plan
    out = ["digraph plan {", '  rankdir=TB; node [fontname="Helvetica", fontsize=10];']
    ids: dict = {}

    def nid(key) -> str:
        if key not in ids:
            ids[key] = f"n{len(ids)}"
        return ids[key]

    for st in p.stages:
        shape = "box3d" if st.sharded else "box"
        color = "#cfe2ff" if st.sharded else "#e2e3e5"
        ops = []
        for e in st.programs[0].nodes:
            if e[0] == "op" and e[1] not in ops:
                ops.append(e[1])
        label = f"{st.name}" + (f" x{len(st.programs)}" if st.sharded else "")
        label += "\\n" + " ".join(ops[:8]) + (" .." if len(ops) > 8 else "")
        out.append(f'  {nid(("st", st.name))} [shape={shape}, style=filled, '
                   f'fillcolor="{color}", label="{label}"];')  # fmt: skip
    live = p._live
    for d in p.dnodes:
        if d.id not in live:
            continue
        if d.is_collective:
            out.append(f'  {nid(d.id)} [shape=octagon, style=filled, fillcolor="#ffd8a8", '
                       f'label="{d.kind}{"(" + d.arg + ")" if d.kind == "allreduce" else ""}'
                       f'\\n{p.n} shards"];')  # fmt: skip
        elif d.kind in ("shard", "leaf"):
            out.append(f'  {nid(d.id)} [shape=ellipse, label="{_label(d)}"];')
    producer = p.producer

    def node_of(d: DNode) -> str:
        if d.id in producer:
            return nid(("st", producer[d.id][0].name))
        if d.kind == "local":
            return node_of(d.srcs[0])
        return nid(d.id)

    edges = set()
    for st in p.stages:
        for x in st.inputs:
            edges.add((node_of(x), nid(("st", st.name))))
    for d in p.dnodes:
        if d.id in live and d.is_collective:
            edges.add((node_of(d.srcs[0]), nid(d.id)))
    for i, d in enumerate(p.roots):
        r = f"r{i}"
        out.append(f'  {r} [shape=note, label="result {i}\\n{_label(d)}"];')
        edges.add((node_of(d), r))
    out.extend(f"  {a} -> {b};" for a, b in sorted(edges))
    out.append("}")
    return "\n".join(out)
