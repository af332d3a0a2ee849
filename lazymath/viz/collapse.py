"""Keep large pictures usable: fold view nodes together, from gentle to aggressive.

Levels, each applied only while the picture is still above `max_nodes` (the first always):
1. chains: a run of elementwise/view nodes in one kernel where each feeds only the next becomes
   one node showing the op count ("12 ops: exp → mul → … → sin");
2. regions: every connected group of elementwise/view nodes in one kernel becomes one node;
3. kernels: each kernel becomes one node (stage "graph": nodes created on the same source line);
4. lines: nodes of the same role created on the same source line (loops that build many
   kernels) become one node.
Each collapsed node keeps its members (op, shape, file:line) so the HTML view can expand it.
Merging only relabels nodes and remaps edges: O(nodes + edges) per level.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable

from lazymath.viz.model import VEdge, VGraph, VNode

CHAIN_MIN = 5  # shortest chain that collapses
MAX_NODES = 400  # above this, collapse more aggressively (dot slows down past a few hundred)
_FOLDABLE = frozenset({"op", "chain", "region"})
_BY_LINE = frozenset({"kernel", "input", "const", "op", "chain", "region", "group", "output"})


def collapse(vg: VGraph, chain_min: int = CHAIN_MIN, max_nodes: int = MAX_NODES) -> VGraph:
    """A smaller picture of `vg` (or `vg` itself when nothing needs folding)."""
    if chain_min and chain_min > 1:
        vg = merge(vg, chains(vg, chain_min), _chain_node)
    steps = [
        ("connected elementwise ops of a kernel", lambda g: merge(g, regions(g), _region_node))
    ]
    if vg.clusters:
        steps.append(("each kernel", lambda g: merge(g, by_cluster(g), _kernel_node)))
    else:
        steps.append(("ops created on the same source line",
                      lambda g: merge(g, by_line(g, roles=_FOLDABLE), _line_node)))  # fmt: skip
    steps.append(("nodes of one kind created on the same source line",
                  lambda g: merge(g, by_line(g, roles=_BY_LINE), _line_node)))  # fmt: skip
    for what, step in steps:
        if len(vg.nodes) <= max_nodes:
            break
        before = len(vg.nodes)
        vg = step(vg)
        if len(vg.nodes) < before:
            vg.notes.append(f"{before} nodes are more than {max_nodes}: folded {what} into one "
                            f"node ({len(vg.nodes)} left)")  # fmt: skip
    return vg


# ----------------------------------------------------------------------------- grouping


def _adjacency(vg: VGraph):
    succ: dict[str, set[str]] = defaultdict(set)
    pred: dict[str, set[str]] = defaultdict(set)
    for e in vg.edges:
        if e.constraint:
            succ[e.src].add(e.dst)
            pred[e.dst].add(e.src)
    return succ, pred


def _foldable(n: VNode) -> bool:
    return n.role in _FOLDABLE and (n.chainable or n.role != "op")


def chains(vg: VGraph, min_len: int) -> list[list[str]]:
    """Maximal paths u1 -> u2 -> ... of foldable nodes in one cluster, where every node but the
    last feeds only the next one and is the only such feeder of it."""
    succ, pred = _adjacency(vg)
    nodes = vg.nodes
    nxt: dict[str, str] = {}
    for v, nv in nodes.items():
        if not _foldable(nv):
            continue
        cands = [u for u in pred[v] if len(succ[u]) == 1 and _foldable(nodes[u])
                 and nodes[u].cluster == nv.cluster]  # fmt: skip
        if len(cands) == 1:
            nxt[cands[0]] = v
    has_prev = set(nxt.values())
    out = []
    for u in nodes:
        if u in nxt and u not in has_prev:
            path = [u]
            while path[-1] in nxt:
                path.append(nxt[path[-1]])
            if sum(nodes[p].size for p in path) >= min_len:
                out.append(path)
    return out


def regions(vg: VGraph) -> list[list[str]]:
    """Connected groups (of size >= 2) of foldable nodes within one cluster."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        root = x
        while parent.get(root, root) != root:
            root = parent[root]
        while parent.get(x, x) != root:  # path compression, iterative
            parent[x], x = root, parent[x]
        return root

    nodes = vg.nodes
    for e in vg.edges:
        a, b = nodes.get(e.src), nodes.get(e.dst)
        if a is None or b is None or not (_foldable(a) and _foldable(b)):
            continue
        if a.cluster != b.cluster:
            continue
        ra, rb = find(e.src), find(e.dst)
        if ra != rb:
            parent[ra] = rb
    groups: dict[str, list[str]] = defaultdict(list)
    for v, n in nodes.items():
        if _foldable(n):
            groups[find(v)].append(v)
    return [g for g in groups.values() if len(g) >= 2]


def by_cluster(vg: VGraph) -> list[list[str]]:
    groups: dict[int, list[str]] = defaultdict(list)
    for v, n in vg.nodes.items():
        if n.cluster is not None:
            groups[n.cluster].append(v)
    return [g for g in groups.values() if len(g) >= 2]


def by_line(vg: VGraph, roles: frozenset[str]) -> list[list[str]]:
    groups: dict[tuple, list[str]] = defaultdict(list)
    for v, n in vg.nodes.items():
        if n.role in roles:
            groups[(n.role, n.tooltip)].append(v)
    return [g for g in groups.values() if len(g) >= 2]


# ----------------------------------------------------------------------------- merging


def merge(vg: VGraph, groups: list[list[str]],
          make: Callable[[VGraph, list[VNode], int], VNode]) -> VGraph:  # fmt: skip
    """A new graph where each group of view nodes is one node built by `make`."""
    if not groups:
        return vg
    alias: dict[str, str] = {}
    first: dict[str, VNode] = {}
    pos = {v: i for i, v in enumerate(vg.nodes)}
    for gi, group in enumerate(groups):
        members = [vg.nodes[v] for v in sorted(group, key=pos.__getitem__)]
        node = make(vg, members, gi)
        first[members[0].id] = node
        for m in members:
            alias[m.id] = node.id
    out = VGraph(vg.stage, clusters=vg.clusters, notes=list(vg.notes), collapsed=vg.collapsed)
    for v, n in vg.nodes.items():
        if v in first:
            out.add(first[v])
        elif v not in alias:
            out.add(n)
    seen: dict[tuple[str, str, str], VEdge] = {}
    for e in vg.edges:
        s, d = alias.get(e.src, e.src), alias.get(e.dst, e.dst)
        if s == d:
            continue
        key = (s, d, e.kind)
        old = seen.get(key)
        if old is not None:
            continue
        ne = VEdge(s, d, e.kind, e.label, e.tooltip, e.nbytes, e.constraint)
        seen[key] = ne
        out.edges.append(ne)
    folded = sum(len(g) for g in groups)
    out.collapsed = vg.collapsed + folded - len(groups)
    return out


def _members(nodes: list[VNode]):
    return tuple(m for n in nodes for m in n.as_members())


def _sequence(ops: list[str]) -> str:
    if len(ops) <= 4:
        return " → ".join(ops)
    return f"{ops[0]} → {ops[1]} → … → {ops[-1]}"


def _histogram(ops: list[str]) -> str:
    counts = Counter(ops).most_common()
    text = ", ".join(f"{op}×{c}" if c > 1 else op for op, c in counts[:3])
    return text + (", …" if len(counts) > 3 else "")


def _locs(members) -> str:
    locs = list(dict.fromkeys(m.loc for m in members))
    return "\n".join(locs[:6]) + (f"\n… {len(locs) - 6} more lines" if len(locs) > 6 else "")


def _chain_node(vg: VGraph, nodes: list[VNode], gi: int) -> VNode:
    ms = _members(nodes)
    ops = [m.op for m in ms]
    last = nodes[-1].lines[-1]
    return VNode(f"chain{gi}_{nodes[0].id}", "chain", (f"{len(ms)} ops", _sequence(ops), last),
                 _locs(ms), nodes[0].cluster, True, ms)  # fmt: skip


def _region_node(vg: VGraph, nodes: list[VNode], gi: int) -> VNode:
    ms = _members(nodes)
    return VNode(f"region{gi}_{nodes[0].id}", "region",
                 (f"{len(ms)} ops", _histogram([m.op for m in ms]), nodes[-1].lines[-1]),
                 _locs(ms), nodes[0].cluster, True, ms)  # fmt: skip


def _kernel_node(vg: VGraph, nodes: list[VNode], gi: int) -> VNode:
    ms = _members(nodes)
    c = vg.clusters.get(nodes[0].cluster)
    name = c.name if c is not None else "kernel"
    return VNode(f"kernel{gi}_{nodes[0].id}", "kernel",
                 (name, f"{len(ms)} ops: {_histogram([m.op for m in ms])}"),
                 _locs(ms), nodes[0].cluster, False, ms)  # fmt: skip


def _line_node(vg: VGraph, nodes: list[VNode], gi: int) -> VNode:
    ms = _members(nodes)
    role = nodes[0].role
    what = {"input": "inputs", "const": "constants", "kernel": "kernels",
            "output": "outputs"}.get(role, "nodes")  # fmt: skip
    head = f"{len(nodes)} {what}"
    if what not in ("inputs", "outputs", "constants"):
        head += f", {len(ms)} ops"
    where = nodes[0].tooltip.rsplit("/", 1)[-1]
    return VNode(f"line{gi}_{nodes[0].id}", "output" if role == "output" else "group",
                 (head, _histogram([m.op for m in ms]), where),
                 nodes[0].tooltip, None, False, ms)  # fmt: skip
