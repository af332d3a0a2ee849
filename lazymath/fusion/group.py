"""What the planner's steps share (`grouping.Planner`, `materialize`, `merges`): a kernel's node
set (`Group`), one fusion decision of the fusion log (`LogEntry`, `describe`, `_dedupe`), why a node
runs on the AI CPU (`aicpu_reason`, what `lm.explain` prints) or is refused on a preset without
bfloat16 (`_refuse_bfloat16`), and the node tests more than one step asks (`_products`,
`_strided_ok`, `_peel_views`, `_dense_leaf`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lazymath.dtypes import AICORE, is_bf16
from lazymath.fusion import rules
from lazymath.fusion.views import VIEW_OPS
from lazymath.graph import custom
from lazymath.graph.node import Node
from lazymath.graph.ops import kind


@dataclass(frozen=True)
class LogEntry:
    """One fusion decision worth explaining (almost always a refusal)."""

    what: str  # "materialize", "refuse", "recompute", "split"
    nodes: tuple[str, ...]  # short descriptions of the nodes involved
    reason: str
    producer: Node | None = None
    consumer: Node | None = None
    where: str = ""  # the user's lines, kept when the nodes are dropped (cached programs)

    def location(self, full: bool = False) -> str:
        """The user's lines that created the producer and the consumer ("a.py:3 -> a.py:5");
        file names only, unless `full`."""
        if self.where:
            return self.where
        locs: list[str] = []
        for n in (self.producer, self.consumer):
            if n is None:
                continue
            loc = n.loc
            if not loc or loc == "<unknown>":
                continue
            if not full:
                loc = loc.replace("\\", "/").rsplit("/", 1)[-1]
            if loc not in locs:
                locs.append(loc)
        return " -> ".join(locs)

    def __str__(self) -> str:
        where = self.location()
        at = f"  [{where}]" if where else ""
        return f"{self.what:11s} {' -> '.join(self.nodes)}: {self.reason}{at}"


def describe(n: Node) -> str:
    op = n.op
    if op == "custom":  # a user kernel: its name (`lazymath.kernel`)
        op = f"{custom.get(n.arg[0]).name}"
    elif op == "reduce" and n.arg:  # which reduction
        op = f"reduce.{n.arg[0]}"
    return f"{op}{list(n.shape)}:{n.dtype.name}"


@dataclass(eq=False)
class Group:
    kind: str  # elementwise | reduce | matmul | aicpu | rows
    core: Node | None
    roots: list[Node]
    members: set[int]
    epi_roots: list[Node] = field(default_factory=list)
    col_sums: list[Node] = field(default_factory=list)  # matmul: sums over m in the epilogue
    row_reds: list[Node] = field(default_factory=list)  # matmul: sum/max/min over n, likewise
    row_outs: list[Node] = field(default_factory=list)  # the node each row reduction writes
    softmax: list[tuple[Node, Node]] = field(default_factory=list)  # matmul: (x, softmax(x, -1))
    ir: object = None
    inputs: list[Node] = field(default_factory=list)  # boundary nodes read, in argument order
    outputs: list[Node] = field(default_factory=list)  # nodes written, in argument order
    member_nodes: list[Node] = field(default_factory=list)
    has_prologue: bool = False

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.core or self.roots[0]).shape


def _is_aicpu(n: Node) -> bool:
    return aicpu_reason(n) is not None


def aicpu_reason(n: Node) -> str | None:
    """Why node `n` runs on the AI CPU (numpy on the host) instead of an AI Core unit, or None
    if it does not (what `lm.explain` prints for an "aicpu" kernel)."""
    if n.op == "custom":  # a user kernel runs on the unit it was written for, any dtype
        return None
    k = kind(n.op)
    if k in rules.AICPU_KINDS:
        return f"{n.op} has no AI Core kernel template yet (rules.AICPU_KINDS)"
    bad = [d for d in dict.fromkeys([n.dtype] + [s.dtype for s in n.srcs]) if d not in AICORE]
    if bad:
        names = ", ".join(d.name for d in bad)
        core = ", ".join(AICORE.names)
        return (f"{names} is not an AI Core dtype (the Vector and Cube units take {core}); "
                "this op runs on the AI CPU")  # fmt: skip
    if n.op == "matmul" and n.dtype.name not in ("float16", "bfloat16", "float32"):
        article = "an" if n.dtype.name[0] in "aeiou" else "a"
        return (f"{article} {n.dtype.name} matmul: lazymath's Cube kernels take float16, "
                "bfloat16 or float32 operands (fp16 MACs, float32 at 1/4 rate, float32 "
                "accumulation; the real "
                "Cube's int8 mode is not modelled), so integer products run on the AI CPU; "
                "cast to float32 to use the Cube (exact while products and sums stay below "
                "2**24)")  # fmt: skip
    return None


def _refuse_bfloat16(pending: list[Node], aicpu: dict, spec) -> None:
    """A device without bfloat16 on its AI Cores (the 910: AscendC's Cast and Mmad take
    bfloat16_t on Atlas A2/A3 only, see NPU_FACTS.md) refuses an AI Core node that computes
    with bfloat16 -- a cast from or to it (every bfloat16 op is float32 work between casts,
    `tensor._ew_node`) or a Cube matmul -- naming the dtype, the preset, the node and the
    user's line: emulating a unit the chip does not have would make the preset's cost model
    and placement lie. Moving bfloat16 data (views, broadcasts, concatenation, a constant fill)
    is byte copies on MTE2/MTE3 and stays allowed."""
    for n in pending:
        if aicpu[id(n)] or n.op not in ("cast", "matmul", "conv1d"):
            continue
        if is_bf16(n.dtype) or any(is_bf16(s.dtype) for s in n.srcs):
            raise TypeError(
                f"bfloat16 is not supported on the {spec.name} preset: its AI Core (Vector "
                f"Cast, Cube Mmad) has no bfloat16 mode, which starts with the Atlas A2 "
                f"(ascend910b); {describe(n)} at {n.loc}. Use lm.init_device(spec='ascend910b') "
                f"or cast to float16/float32 first"
            )


def _dedupe(log: list[LogEntry]) -> list[LogEntry]:
    seen, out = set(), []
    for e in log:
        key = (e.what, e.nodes, e.reason)
        if key not in seen:
            seen.add(key)
            out.append(e)
    return out


def _products(groups: list[Group]) -> dict[int, Group]:
    """id(node) -> the group that computes and writes it: its roots, epilogue values, fused
    reductions, softmax outputs and core."""
    produced: dict[int, Group] = {}
    for g in groups:
        done = g.col_sums + g.row_reds + g.row_outs + [o for _, o in g.softmax]
        for r in g.roots + g.epi_roots + done:
            produced[id(r)] = g
        if g.core is not None:
            produced[id(g.core)] = g
    return produced


def _strided_ok(defn, i: int) -> bool:
    """Whether user kernel `defn` may read its input `i` through a strided view (a built-in
    kernel that lists it in `strided_inputs`, and checks each view with `strided_input`);
    every other user kernel reads dense inputs."""
    return i in getattr(defn, "strided_inputs", ())


def _peel_views(n: Node) -> Node:
    while n.op in VIEW_OPS and n.realized is None:
        n = n.srcs[0]
    return n


def _dense_leaf(s: Node) -> Node | None:
    """The realized C-contiguous array that `s` reshapes (a dense GM input read in place by a
    user kernel, e.g. a vector seen as one row), None if `s` is anything else."""
    b = s
    while b.op == "reshape" and b.realized is None:
        b = b.srcs[0]
    if b is s or b.realized is None or not b.realized.flags.c_contiguous:
        return None
    return b
