"""What a picture shows, independent of how it is drawn: a small graph of view nodes and edges.

Two builders turn lazymath's own structures into a `VGraph`:

- `from_graph`: the captured graph as written (every node reachable from the tensors, realized
  leaves and constants included), no kernels;
- `from_schedule`: the graph after fusion and partition: each kernel is a cluster, a node
  computed inside a kernel appears inside its cluster (a node recomputed in two kernels appears
  in both), constants sit in the kernel that folds them in, values crossing a kernel boundary
  through GM are heavy "buffer" edges, and fusion refusals from the log are dashed edges.

The DOT writer and the HTML report only read a `VGraph`, and `collapse.py` rewrites one into a
smaller one, so the builders never worry about size and the writers never about semantics.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lazymath.graph.custom import UnknownKernelError, get
from lazymath.graph.node import Node, toposort
from lazymath.graph.ops import kind
from lazymath.units import fmt_bytes

# kinds of graph node that fold into a chain of cheap per-element work
CHAINABLE_KINDS = frozenset({"elementwise", "view"})
# fusion-log entries that record a refusal to fuse (drawn as dashed edges)
REFUSAL_KINDS = frozenset({"refuse", "materialize", "split"})


def tensor_nodes(tensors) -> list:
    """The graph nodes behind `tensors` (realized or not); TypeError for anything else."""
    out = []
    for t in tensors:
        n = getattr(t, "_node", None)  # a Tensor (viz does not import the tensor layer)
        if type(n) is not Node:
            raise TypeError(f"visualize() takes lazymath Tensors, got {type(t).__name__}")
        out.append(n)
    if not out:
        raise TypeError("visualize() needs at least one tensor")
    return out


@dataclass(frozen=True, slots=True)
class Member:
    """One graph node inside a collapsed view node (what the HTML view expands to)."""

    op: str
    shape: str
    loc: str


@dataclass(slots=True)
class VNode:
    id: str
    role: str  # op | input | const | output | chain | region | kernel | group
    lines: tuple[str, ...]  # label lines: op, then "shape dtype"
    tooltip: str  # the user's file:line that created the value
    cluster: int | None = None  # kernel index
    chainable: bool = False  # elementwise/view op: may fold into a collapsed chain
    members: tuple[Member, ...] = ()  # collapsed nodes: what is inside, in order
    notes: tuple[str, ...] = ()  # extra facts (refusal reasons, recompute notes)

    @property
    def size(self) -> int:
        """Graph nodes this view node stands for."""
        return len(self.members) or 1

    def as_members(self) -> tuple[Member, ...]:
        if self.members:
            return self.members
        return (Member(self.lines[0], self.lines[1] if len(self.lines) > 1 else "", self.tooltip),)


@dataclass(slots=True)
class VEdge:
    src: str
    dst: str
    kind: str  # internal | buffer | refused | recompute
    label: str  # shape/dtype (+ byte size on buffer edges)
    tooltip: str = ""
    nbytes: int = 0
    constraint: bool = True  # False: does not affect the layout ranks (refusal overlays)


@dataclass(frozen=True, slots=True)
class VCluster:
    index: int
    name: str
    unit: str
    bound: str
    stream: int
    tooltip: str

    @property
    def title(self) -> str:
        return f"{self.name} | {self.bound}-bound | stream {self.stream}"


@dataclass(slots=True)
class VGraph:
    stage: str  # "graph" | "kernels"
    nodes: dict[str, VNode] = field(default_factory=dict)  # insertion order is topological
    edges: list[VEdge] = field(default_factory=list)
    clusters: dict[int, VCluster] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # what collapsing did, empty schedules, ...
    collapsed: int = 0  # graph nodes hidden inside collapsed view nodes

    def add(self, node: VNode) -> VNode:
        old = self.nodes.get(node.id)
        if old is not None:
            return old
        self.nodes[node.id] = node
        return node

    @property
    def graph_nodes(self) -> int:
        """How many graph-node occurrences the picture stands for (collapsed ones included)."""
        return sum(n.size for n in self.nodes.values())


# ----------------------------------------------------------------------------- formatting


def fmt_shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


_DTYPE_NAMES: dict = {}


def dtype_name(dt) -> str:
    """`dt.name`, cached (numpy computes it on every access, ~20 us)."""
    name = _DTYPE_NAMES.get(dt)
    if name is None:
        name = _DTYPE_NAMES[dt] = dt.name
    return name


def fmt_value(n: Node) -> str:
    """'(64, 32) float16': what an edge carries and a node's second label line."""
    return f"{fmt_shape(n.shape)} {dtype_name(n.dtype)}"


def _short(x: object, limit: int = 28) -> str:
    s = str(x)
    return s if len(s) <= limit else s[: limit - 1] + "…"


def op_label(n: Node) -> str:
    """The first label line: the op and the argument that matters for reading the graph."""
    op, arg = n.op, n.arg
    if op == "const":
        v = n.realized.item() if n.realized is not None else arg
        return f"const {v:.6g}" if isinstance(v, float) else f"const {_short(v, 14)}"
    if n.realized is not None:
        return "input" if op == "buffer" else f"{op} (realized)"
    if op == "reduce" and isinstance(arg, tuple) and len(arg) == 2:
        return f"{arg[0]} axis={_short(arg[1], 16)}"
    if op == "permute":
        return f"permute {_short(arg, 20)}"
    if op == "leaky_relu":
        return f"leaky_relu({_short(arg, 10)})"
    if op in ("pad", "concat", "conv1d", "fft") and arg is not None:
        return f"{op} {_short(arg, 20)}"
    if op == "custom" and isinstance(arg, tuple):  # a user kernel (`lazymath.kernel`): its name
        try:
            name = get(arg[0]).name
        except UnknownKernelError:
            name = str(arg[0]).split(":")[0].rsplit(".", 1)[-1]
        return f"{name}[{arg[2]}] (kernel)" if len(arg) > 2 else f"{name} (kernel)"
    return op


def _loc(n: Node) -> str:
    return getattr(n, "loc", "") or "<unknown>"


class _Ids:
    """Small stable numbers for graph nodes (DOT ids must not be Python object ids)."""

    def __init__(self) -> None:
        self._ids: dict[int, int] = {}

    def __call__(self, n: Node) -> int:
        i = self._ids.get(id(n))
        if i is None:
            i = self._ids[id(n)] = len(self._ids)
        return i


def _leaf_node(vid: str, n: Node, cluster: int | None = None) -> VNode:
    role = "const" if n.op == "const" else "input"
    lines = (op_label(n),) if role == "const" else (op_label(n), fmt_value(n))
    return VNode(vid, role, lines, _loc(n), cluster)


def _op_node(vid: str, n: Node, cluster: int | None = None) -> VNode:
    return VNode(vid, "op", (op_label(n), fmt_value(n)), _loc(n), cluster,
                 chainable=kind(n.op) in CHAINABLE_KINDS)  # fmt: skip


def _output_node(vid: str, n: Node, i: int, requested: bool, note: str = "") -> VNode:
    head = f"output {i}" if requested else "live tensor"
    lines = (head + note, fmt_value(n))
    return VNode(vid, "output", lines, _loc(n))


# ----------------------------------------------------------------------------- stage "graph"


def from_graph(roots: list[Node]) -> VGraph:
    """The captured graph as written: every node reachable from `roots`, realized leaves and
    constants included, one view node per graph node."""
    vg = VGraph("graph")
    ids = _Ids()
    order = toposort(roots)
    for n in order:
        vid = f"n{ids(n)}"
        if n.is_leaf:
            vg.add(_leaf_node(vid, n))
            continue
        vg.add(_op_node(vid, n))
        seen: set[int] = set()
        for s in n.srcs:
            if id(s) in seen:
                continue
            seen.add(id(s))
            vg.edges.append(VEdge(f"n{ids(s)}", vid, "internal", fmt_value(s)))
    for i, r in enumerate(dict.fromkeys(roots)):
        oid = f"out{i}"
        note = " (realized)" if r.realized is not None else ""
        vg.add(_output_node(oid, r, i, True, note))
        vg.edges.append(VEdge(f"n{ids(r)}", oid, "internal", fmt_value(r)))
    return vg


# ----------------------------------------------------------------------------- stage "kernels"


def from_schedule(sched, requested: list[Node]) -> VGraph:
    """The graph after fusion: clusters per kernel, buffer edges between them, refusals."""
    vg = VGraph("kernels")
    ids = _Ids()
    producer: dict[int, int] = {}  # id(node) -> index of the kernel that writes it to GM
    member_of: list[set[int]] = []
    first_kernel: dict[int, int] = {}  # id(node) -> first kernel computing it
    for ki, k in enumerate(sched.kernels):
        g = k.group
        member_of.append({id(n) for n in g.member_nodes})
        for n in g.member_nodes:
            first_kernel.setdefault(id(n), ki)
        for n in g.outputs:
            producer.setdefault(id(n), ki)

    def vid_in(ki: int, n: Node) -> str:
        return f"k{ki}n{ids(n)}"

    for ki, k in enumerate(sched.kernels):
        g = k.group
        vg.clusters[ki] = VCluster(ki, k.name, k.unit, k.bound, k.stream, _cluster_tooltip(k))
        for n in g.member_nodes:
            vid = vid_in(ki, n)
            vg.add(_op_node(vid, n, ki))
            seen: set[int] = set()
            for s in n.srcs:
                if id(s) in seen:
                    continue
                seen.add(id(s))
                if id(s) in member_of[ki]:
                    vg.edges.append(VEdge(vid_in(ki, s), vid, "internal", fmt_value(s)))
                elif s.op == "const":
                    cid = f"k{ki}c{ids(s)}"
                    vg.add(_leaf_node(cid, s, ki))
                    vg.edges.append(VEdge(cid, vid, "internal", fmt_value(s)))
                elif id(s) in producer:
                    src = vid_in(producer[id(s)], s)
                    vg.edges.append(_buffer_edge(src, vid, s, "written to GM by "
                                                 f"{sched.kernels[producer[id(s)]].name}, read by "
                                                 f"{k.name}"))  # fmt: skip
                else:
                    iid = f"in{ids(s)}"
                    vg.add(_leaf_node(iid, s))
                    vg.edges.append(_buffer_edge(iid, vid, s, f"read from GM by {k.name}"))

    req = {id(n) for n in requested}
    outs = list(dict.fromkeys(list(sched.outputs) + list(requested)))
    for i, o in enumerate(outs):
        oid = f"out{i}"
        if o.realized is not None:
            vg.add(_output_node(oid, o, i, id(o) in req, " (realized)"))
            iid = f"in{ids(o)}"
            vg.add(_leaf_node(iid, o))
            vg.edges.append(VEdge(iid, oid, "internal", fmt_value(o)))
            continue
        vg.add(_output_node(oid, o, i, id(o) in req))
        ki = producer.get(id(o), first_kernel.get(id(o)))
        if ki is not None:
            vg.edges.append(_buffer_edge(vid_in(ki, o), oid, o,
                                         f"written to GM by {sched.kernels[ki].name}"))  # fmt: skip
    if not sched.kernels:
        vg.notes.append("nothing pending: the tensors are already realized")
    _add_refusals(vg, sched, ids, producer, first_kernel, member_of)
    return vg


def _cluster_tooltip(k) -> str:
    waits = ",".join(f"e{w}" for w in k.waits) or "-"
    rec = f"e{k.records}" if k.records is not None else "-"
    return (
        f"{k.name}: {k.unit} {k.kind} kernel, {k.bound}-bound\n"
        f"ops: {' '.join(k.ops)}\nflops {k.flops}, bytes {k.bytes}\n"
        f"stream {k.stream}, waits {waits}, records {rec}\ncreated at {k.source_loc}"
    )


def _buffer_edge(src: str, dst: str, n: Node, where: str) -> VEdge:
    b = n.nbytes
    return VEdge(src, dst, "buffer", f"{fmt_value(n)}\n{fmt_bytes(b)}",
                 f"{fmt_value(n)}, {fmt_bytes(b)} ({b} bytes) {where}", b)  # fmt: skip


def _add_refusals(vg: VGraph, sched, ids: _Ids, producer, first_kernel, member_of) -> None:
    """Dashed edges for the fusion log's refusals; recompute notes on the recomputed nodes."""

    def where(n: Node | None, avoid: int | None = None) -> tuple[str | None, int | None]:
        if n is None:
            return None, None
        ki = producer.get(id(n))
        if ki is None or ki == avoid:
            cands = [i for i, m in enumerate(member_of) if id(n) in m and i != avoid]
            ki = cands[0] if cands else first_kernel.get(id(n))
        if ki is not None:
            return f"k{ki}n{ids(n)}", ki
        iid = f"in{ids(n)}"
        return (iid if iid in vg.nodes else None), None

    for e in sched.fusion_log:
        p_node, c_node = getattr(e, "producer", None), getattr(e, "consumer", None)
        reason = f"{e.what}: {e.reason}"
        if e.what == "recompute":
            for ki, m in enumerate(member_of):
                if p_node is not None and id(p_node) in m:
                    v = vg.nodes.get(f"k{ki}n{ids(p_node)}")
                    if v is not None:
                        v.notes += (reason,)
            continue
        if e.what not in REFUSAL_KINDS or p_node is None:
            continue
        p, pk = where(p_node)
        c, ck = where(c_node, avoid=pk)
        if p is None:
            continue
        if c is not None and ck is not None and ck == pk:
            continue  # the two ended up fused after all (a later planning round)
        if c is None and c_node is None:
            marked = False
            for edge in vg.edges:
                if edge.src == p and edge.kind in ("buffer", "refused"):
                    _mark_refused(edge, reason)
                    marked = True
            if not marked and p in vg.nodes:
                vg.nodes[p].notes += (reason,)
            continue
        if c is None:
            continue
        crossing = [e for e in vg.edges if e.src == p and e.kind in ("buffer", "refused")]
        hit = [e for e in crossing if e.dst == c] or [
            e for e in crossing if ck is not None and vg.nodes[e.dst].cluster == ck
        ]
        for edge in hit[:1]:
            _mark_refused(edge, reason)
        if not hit:
            label = fmt_value(p_node)
            vg.edges.append(VEdge(p, c, "refused", label, reason, 0, constraint=False))


def _mark_refused(edge: VEdge, reason: str) -> None:
    edge.kind = "refused"
    edge.tooltip = reason + ("\n" + edge.tooltip if edge.tooltip else "")
