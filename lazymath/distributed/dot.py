"""A distributed plan as a picture (Graphviz DOT): shard programs, the collectives as their own
nodes, the tails. The text form (`Plan.explain`, with the kernel table of one shard's program
as `lm.schedule` prints it) lives with the plan in plan.py."""

from __future__ import annotations

from lazymath.distributed.plan import DNode, Plan, _label


def to_dot(plan: Plan) -> str:
    """Graphviz DOT of a plan: inputs, shard programs (boxes, xN), collectives (octagons),
    tails, results (`lazymath.distributed.to_dot` also takes tensors)."""
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
