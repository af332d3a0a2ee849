"""Group graph nodes into kernels.

1. Decide which nodes are written to GM ("materialized"): the realize outputs, every node of a
   materializing kind (reduce, matmul, ...), AI CPU/AI Core boundaries, matmul operands whose
   producers are too heavy for the GM -> L1 load, and multi-consumer nodes that are not cheap to
   recompute (`rules.RECOMPUTE_MAX_OPS`).
2. Each materialized node starts a group with its cone: the unmaterialized nodes above it.
3. Merge: elementwise groups that consume a reduce/matmul result over the same iteration space
   become its epilogue; elementwise groups of the same shape that share an input or feed each
   other become one multi-output kernel. Merges never create a cycle between kernels.
4. Build each group's kernel IR (`build.py`); a view chain that does not compose or a cap that
   overflows materializes one more node and planning restarts.

Every refusal appends (kind, nodes, reason) to the fusion log.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from lazymath.backend.npu.kernel_ir import (
    ROW_REDUCE_OPS,
    CustomKernel,
    ElementwiseKernel,
    MatmulKernel,
    ReduceKernel,
    RowKernel,
    contiguous_view,
    im2col_operand,
)
from lazymath.dtypes import AICORE, is_bf16
from lazymath.fusion import rules
from lazymath.fusion.build import (
    CapExceeded,
    ExprBuilder,
    NeedMaterialize,
    RowExprBuilder,
    aicpu_kernel,
    folded_leaf,
    is_identity_load,
)
from lazymath.fusion.views import VIEW_OPS
from lazymath.graph import custom, dft
from lazymath.graph.node import Node, make, toposort
from lazymath.graph.ops import ELEMENTWISE, kind


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


class Planner:
    def __init__(self, outputs: list[Node], spec, forced: set[int], log: list[LogEntry],
                 copied: frozenset[int] = frozenset()):  # fmt: skip
        self.outputs = outputs
        self.copied = copied  # ids of user arrays the plan reads through a contiguous copy
        self.spec = spec
        self.forced = forced
        self.log = log
        self.order = toposort(outputs)
        self.pending = [n for n in self.order if n.realized is None]
        self.pos = {id(n): i for i, n in enumerate(self.pending)}
        self.by_id = {id(n): n for n in self.pending}
        self._boundary_cache: dict = {}
        self.consumers: dict[int, list[Node]] = {id(n): [] for n in self.pending}
        for n in self.pending:
            for s in n.srcs:
                if id(s) in self.consumers and n not in self.consumers[id(s)]:
                    self.consumers[id(s)].append(n)
        self.out_ids = {id(o) for o in outputs}
        self.aicpu = {id(n): _is_aicpu(n) for n in self.pending}
        if not getattr(spec, "bfloat16", True):
            _refuse_bfloat16(self.pending, self.aicpu, spec)
        self.mix_epi: set[int] = set()  # 910B matmuls whose epilogue runs in a MIX kernel

    # ------------------------------------------------------------------ materialization
    def materialized(self) -> set[int]:
        M = set(self.out_ids) | (self.forced & set(self.pos))
        self._row_regions()
        for n in self.pending:
            why = dft.plan_note(n)  # an irfft's plan, recorded on the node computing it
            if why is not None:
                self.log.append(LogEntry("fft", (describe(n),), why, n))
            reg = self.region_of.get(id(n))
            if reg is not None:
                # a region node read outside its region is written to GM (a root of the
                # region's kernel); its reductions otherwise stay in the kernel
                if any(self.region_of.get(id(c)) != reg for c in self.consumers[id(n)]):
                    M.add(id(n))
                self._aicpu_boundary(n, M)  # an AI CPU source (a complex cast) stays outside
                continue
            if kind(n.op) in rules.MATERIALIZING_KINDS:
                M.add(id(n))
                self._log_kind_refusals(n)
                if n.op in ("fft", "complex_join"):  # the FFT plan chosen at the call, and why
                    why = n.arg[4] if n.op == "fft" else n.arg[0]
                    self.log.append(LogEntry("fft", (describe(n),), why, n))
            if n.op == "custom":  # a user kernel reads dense inputs from GM
                defn = custom.get(n.arg[0])
                for i, s in enumerate(n.srcs):
                    if _strided_ok(defn, i):  # read in place through its views (`build`)
                        s = _peel_views(s)
                    if id(s) in self.pos and id(s) not in M and _dense_leaf(s) is None:
                        M.add(id(s))
                        self.log.append(LogEntry("materialize", (describe(s), describe(n)),
                                                 rules.FUSE[("elementwise", "custom")][1],
                                                 s, n))  # fmt: skip
            self._aicpu_boundary(n, M)
        if not self.spec.coupled:
            self._fixpipe_chains(M)
        self._operand_prologues(M)
        self._cap_cones(M)
        self._multi_consumers(M)
        return M

    def _aicpu_boundary(self, n: Node, M: set[int]) -> None:
        """AI CPU and AI Core nodes never share a kernel: a source on the other unit is
        written to GM."""
        for s in n.srcs:
            if id(s) in self.aicpu and self.aicpu[id(s)] != self.aicpu[id(n)] and id(s) not in M:
                M.add(id(s))
                why = rules.FUSE[("elementwise", "aicpu")][1]
                self.log.append(LogEntry("materialize", (describe(s), describe(n)), why, s, n))

    # ------------------------------------------------------------------ row regions
    def _row_regions(self) -> None:
        """Find row regions (`rules.ROW_FUSION`): reductions over the same axes of the same
        shape, the elementwise ops that read their results broadcast back over the rows, and
        the elementwise ops (and broadcast views) around them, connected. Each becomes one
        row kernel. A region that would read its own result through another kernel is
        dropped."""
        self.region_of: dict[int, int] = {}
        self.regions: list[tuple] = []
        # reductions already explored inside a region with no broadcast consumer, by (key,
        # shape): starting again from one of them finds the same region (the walk is symmetric
        # and its acceptance test depends only on those), so it is not walked again (a graph of
        # 80 reduced chains summed together walked one 5,000-node region 80 times: 8 s)
        plain: set[tuple] = set()
        for r in self.pending:
            if r.op != "reduce" or id(r) in self.region_of or id(r) in self.forced:
                continue
            key = self._row_key(r)
            if key is None or (id(r), key, r.shape) in plain:
                continue
            S, A = key
            kd = tuple(1 if d in A else S[d] for d in range(len(S)))
            shapes = {S, kd, r.shape}
            members = {id(r)}
            nodes = [r]
            stack = [r]
            while stack:
                n = stack.pop()
                for m in (*self.consumers[id(n)], *n.srcs):
                    if (id(m) in members or id(m) not in self.pos or id(m) in self.region_of
                            or id(m) in self.forced or self.aicpu[id(m)]):  # fmt: skip
                        continue
                    if m.op == "reduce":
                        ok = self._row_key(m) == key
                    elif m.op in ELEMENTWISE:
                        ok = m.shape in shapes
                    elif m.op in ("reshape", "expand"):
                        ok = m.shape in shapes and m.srcs[0].shape in shapes
                    else:
                        ok = False
                    if ok:
                        members.add(id(m))
                        nodes.append(m)
                        stack.append(m)
            reds = [n for n in nodes if n.op == "reduce"]
            broadcast = [n for n in nodes if n.op in ELEMENTWISE and n.shape == S
                         and self._depends(list(n.srcs), {id(x) for x in reds})]  # fmt: skip
            if not broadcast:  # a plain reduction (+ epilogue): the reduce template's job
                plain.update((id(x), key, r.shape) for x in reds if x.shape == r.shape)
                continue
            boundary = [s for n in nodes for s in n.srcs
                        if id(s) not in members and id(s) in self.pos]  # fmt: skip
            if self._depends(boundary, members):
                self.log.append(LogEntry("refuse", (describe(r),), "row fusion: the rows' "
                    "inputs depend on their own results through another kernel", r))  # fmt: skip
                continue
            idx = len(self.regions)
            self.regions.append((S, A, r))
            for n in nodes:
                self.region_of[id(n)] = idx

    def _row_key(self, r: Node):
        """(source shape, normalized axes) of a reduction a row kernel can hold, else None."""
        op, axes = r.arg
        src = r.srcs[0]
        if op not in ROW_REDUCE_OPS or self.aicpu[id(r)] or not src.shape:
            return None
        nd = len(src.shape)
        A = tuple(sorted({a % nd for a in axes}))
        if not A or any(b - a != 1 for a, b in zip(A, A[1:])):
            return None  # the reduced axes must be adjacent (one run per row)
        red = 1
        for a in A:
            red *= src.shape[a]
        if red <= 1 or 0 in src.shape:
            return None
        return src.shape, A

    def _log_kind_refusals(self, n: Node) -> None:
        """Record the FUSE-table refusals between a materializing node and its consumers."""
        pk = "aicpu" if self.aicpu[id(n)] else kind(n.op)
        consumers, stack, seen = [], list(self.consumers[id(n)]), set()
        while stack:  # look through views: sum(x)[None] @ B is a reduce feeding a matmul
            c = stack.pop()
            if id(c) in seen:
                continue
            seen.add(id(c))
            if c.op in VIEW_OPS:
                stack.extend(self.consumers[id(c)])
            else:
                consumers.append(c)
        for c in consumers:
            ck = "aicpu" if self.aicpu[id(c)] else kind(c.op)
            ok, why = rules.FUSE.get((pk, ck), (True, ""))
            if not ok and (pk, ck) not in (("elementwise", "aicpu"), ("aicpu", "elementwise")):
                self.log.append(LogEntry("refuse", (describe(n), describe(c)), why, n, c))

    def _cap_cones(self, M: set[int]) -> None:
        """Split oversized cones up front, before grouping: when a node's fused expression
        would pass half the op cap, or its distinct GM inputs the input cap, its largest
        unmaterialized source is written to GM instead.

        Without this a 10,000-op chain (or a sum of 80 tensors) would be split one cap
        overflow, and one planning restart, at a time."""
        op_limit = rules.MAX_KERNEL_OPS // 2
        in_limit = rules.MAX_KERNEL_INPUTS - 1  # room for one more input in a merge
        ops: dict[int, int] = {}
        ins: dict[int, frozenset] = {}

        def parts(n):
            o, i = (1 if n.op in ELEMENTWISE else 0), set()
            for s in n.srcs:
                if s.op == "const" or folded_leaf(s):
                    continue
                if id(s) in M or s.realized is not None or id(s) not in ops:
                    i.add(id(s))
                else:
                    o += ops[id(s)]
                    i |= ins[id(s)]
            return o, i

        for n in self.pending:
            o, i = parts(n)
            if n.op in ELEMENTWISE or n.op in VIEW_OPS:
                while o > op_limit or len(i) > in_limit:
                    inner = [s for s in n.srcs if id(s) in ops and id(s) not in M
                             and s.realized is None and s.op != "const"]  # fmt: skip
                    if not inner:
                        break
                    big = max(inner, key=lambda s: (len(ins[id(s)]), ops[id(s)]))
                    M.add(id(big))
                    what = "ops" if o > op_limit else "GM inputs"
                    cap = op_limit if o > op_limit else in_limit
                    self.log.append(LogEntry("split", (describe(big), describe(n)),
                        f"fused expression would exceed {cap} {what} (per-kernel caps: "
                        f"{rules.MAX_KERNEL_OPS} ops, {rules.MAX_KERNEL_INPUTS} inputs); "
                        "written to GM here", big, n))  # fmt: skip
                    o, i = parts(n)
            ops[id(n)] = min(o, 1 << 20)
            ins[id(n)] = frozenset(i) if len(i) <= 4 * in_limit else frozenset()

    def _mix_epilogue(self, n: Node) -> bool:
        """910B: does matmul `n`'s epilogue run on the AIVs of a MIX kernel? conv1d's implicit
        GEMM always; another matmul when `rules.MATMUL_MIX_EPILOGUE` and an expensive op is
        among its elementwise consumers (breadth first, at most MAX_KERNEL_OPS nodes)."""
        if im2col_matmul(n):
            return True
        if not rules.MATMUL_MIX_EPILOGUE:
            return False
        seen, todo = {id(n)}, [n]
        while todo and len(seen) <= rules.MAX_KERNEL_OPS:
            c = todo.pop(0)
            for d in self.consumers.get(id(c), []):
                if id(d) in seen or kind(d.op) != "elementwise" or self.aicpu[id(d)]:
                    continue
                if d.op in rules.EXPENSIVE_OPS:
                    return True
                seen.add(id(d))
                todo.append(d)
        return False

    def _fixpipe_chains(self, M: set[int]) -> None:
        """910B: a Cube kernel keeps only FixPipe-capable epilogue ops (relu, cast), unless its
        epilogue runs on the AIVs of a MIX kernel (`_mix_epilogue`)."""
        for n in self.pending:
            if n.op != "matmul" or self.aicpu[id(n)]:
                continue
            if self._mix_epilogue(n):  # conv1d's implicit GEMM, an activation's epilogue
                self.mix_epi.add(id(n))
                continue
            c = n
            while True:
                cons = self.consumers[id(c)]
                if len(cons) != 1 or (c is not n and id(c) in self.out_ids):
                    break
                d = cons[0]
                if d.op not in rules.FIXPIPE_OPS or len(d.srcs) != 1:
                    break
                c = d
                if id(c) in M:
                    break
            M.add(id(c))
            nxt = [d for d in self.consumers[id(c)]
                   if kind(d.op) == "elementwise" and d.op not in rules.FIXPIPE_OPS]  # fmt: skip
            if nxt:
                self.log.append(LogEntry("refuse", (describe(c), describe(nxt[0])),
                    "ascend910b: the Cube core has no UB, only FixPipe ops (relu, cast) stay in "
                    "the Cube kernel; the rest runs in a Vector kernel that meets it in GM (a MIX "
                    f"kernel would need {rules.MIX_EPILOGUE_NEEDS.split(': ')[0]})",
                    c, nxt[0]))  # fmt: skip

    def _cone(self, top: Node, M: set[int]) -> tuple[set[int], int, list[Node]]:
        """(buffer leaves, op count, nodes) of the unmaterialized cone rooted at `top`."""
        leaves: set[int] = set()
        nodes: list[Node] = []
        seen = set()
        stack = [top]
        ops = 0
        while stack:
            n = stack.pop()
            if id(n) in seen:
                continue
            seen.add(id(n))
            if n.op == "const" or folded_leaf(n):
                continue
            if n.realized is not None or (id(n) in M and n is not top):
                leaves.add(id(n))
                continue
            nodes.append(n)
            if n.op in ELEMENTWISE:
                ops += 1
            stack.extend(n.srcs)
        return leaves, ops, nodes

    def _operand_prologues(self, M: set[int]) -> None:
        for n in self.pending:
            if n.op != "matmul" or self.aicpu[id(n)]:
                continue
            for s in n.srcs:
                t = s
                while ((t.op in VIEW_OPS or t.op == "im2col") and t.realized is None
                       and id(t) not in M):  # fmt: skip
                    t = t.srcs[0]  # (im2col: conv1d's windows, built by the B packing)
                if t.realized is not None or t.op == "const" or id(t) in M:
                    continue
                leaves, ops, nodes = self._cone(t, M)
                if ops and not self.spec.coupled:  # 910B: the Cube core has no Vector unit
                    M.add(id(t))
                    self.log.append(LogEntry("materialize", (describe(t), describe(n)),
                        rules.SPLIT_PROLOGUE, t, n))  # fmt: skip
                    continue
                heavy = sorted({x.op for x in nodes if x.op in rules.EXPENSIVE_OPS})
                if len(leaves) > 1 or ops > rules.OPERAND_PROLOGUE_MAX_OPS or heavy:
                    M.add(id(t))
                    why = (f"reads {len(leaves)} buffers" if len(leaves) > 1 else
                           f"has {ops} ops > {rules.OPERAND_PROLOGUE_MAX_OPS}"
                           if ops > rules.OPERAND_PROLOGUE_MAX_OPS else
                           f"has {', '.join(heavy)}, which needs the Vector unit's math "
                           "library")  # fmt: skip
                    self.log.append(LogEntry("materialize", (describe(t), describe(n)),
                        f"matmul operand producer {why}; too heavy for the GM -> L1 load, "
                        "so it runs as its own kernel", t, n))  # fmt: skip

    def _multi_consumers(self, M: set[int]) -> None:
        ops: dict[int, int] = {}
        expensive: dict[int, bool] = {}
        for n in self.pending:
            inner = [s for s in n.srcs if id(s) in ops and id(s) not in M]
            ops[id(n)] = min((1 if n.op in ELEMENTWISE else 0) + sum(ops[id(s)] for s in inner),
                             1 << 20)  # fmt: skip
            expensive[id(n)] = n.op in rules.EXPENSIVE_OPS or any(expensive[id(s)] for s in inner)
        region_of = self.region_of
        # kernels are counted per region: every root of a row region is the same kernel
        roots: dict[int, frozenset] = {}
        for n in reversed(self.pending):
            if id(n) in M:
                reg = region_of.get(id(n))
                roots[id(n)] = frozenset((id(n) if reg is None else ("rows", reg),))
                continue
            r: frozenset = frozenset()
            for c in self.consumers[id(n)]:
                r = r | roots[id(c)]
            if len(r) > 1:
                cheap = ops[id(n)] <= rules.RECOMPUTE_MAX_OPS and not expensive[id(n)]
                if not cheap:
                    M.add(id(n))
                    roots[id(n)] = frozenset((id(n),))
                    why = "an expensive op" if expensive[id(n)] else f"{ops[id(n)]} ops"
                    self.log.append(
                        LogEntry(
                            "materialize",
                            (describe(n),),
                            f"consumed by {len(r)} kernels and its cone has {why} (recompute limit "
                            f"{rules.RECOMPUTE_MAX_OPS} cheap ops): computed once, written to GM",
                            n,
                        )
                    )
                    continue
                if n.op in ELEMENTWISE:
                    self.log.append(LogEntry("recompute", (describe(n),),
                        f"consumed by {len(r)} kernels; {ops[id(n)]} cheap op(s), recomputed in "
                        "each instead of a GM round trip", n))  # fmt: skip
            roots[id(n)] = r

    # ------------------------------------------------------------------ groups
    def groups(self) -> list[Group]:
        M = self.materialized()
        self.M = M
        groups: list[Group] = []
        self.group_of_root: dict[int, Group] = {}
        for n in self.pending:
            if id(n) not in M:
                continue
            _, _, cone = self._cone(n, M)
            members = {id(x) for x in cone}
            k = kind(n.op)
            if id(n) in self.region_of:
                gk = "rows"
            elif k == "custom":
                gk = "custom"
            elif self.aicpu[id(n)] or n.op == "im2col":  # im2col on its own: the reference
                gk = "aicpu"
            elif k in ("reduce", "matmul"):
                gk = k
            else:
                gk = "elementwise"
            g = Group(gk, n if gk in ("reduce", "matmul", "custom") else None, [n], members)
            if gk == "aicpu" and k not in ("elementwise", "view"):
                g.core = n
            groups.append(g)
            self.group_of_root[id(n)] = g
        groups = self._merge_rows(groups)
        groups = self._merge_custom_siblings(groups)
        # the unmerged kernels (each a cone over GM values: a DAG), kept to split a merged
        # kernel back into should a merge below ever close a cycle (_toposort_groups)
        self.unmerged = [replace(g, roots=list(g.roots), members=set(g.members),
                                 epi_roots=list(g.epi_roots)) for g in groups]  # fmt: skip
        groups = self._merge_epilogues(groups)
        groups = self._merge_col_sums(groups)
        groups = self._merge_softmax(groups)
        groups = self._merge_elementwise(groups)
        groups = self._merge_aicpu(groups)
        return self._toposort_groups(groups)

    def _merge_rows(self, groups: list[Group]) -> list[Group]:
        """The groups rooted in one row region are one kernel."""
        first: dict[int, Group] = {}
        out = []
        for g in groups:
            if g.kind != "rows":
                out.append(g)
                continue
            reg = self.region_of[id(g.roots[0])]
            host = first.get(reg)
            if host is None:
                first[reg] = g
                out.append(g)
                continue
            host.roots = host.roots + g.roots
            host.members = host.members | g.members
            self.group_of_root[id(g.roots[0])] = host
        for reg, g in first.items():
            others = [b for b in self._boundary(g)]
            if self._depends(others, {id(r) for r in g.roots}):
                r = self.regions[reg][2]
                raise NeedMaterialize(r, "row fusion would make the row kernel read its own "
                                      "result through another kernel")  # fmt: skip
        return out

    def _merge_aicpu(self, groups: list[Group]) -> list[Group]:
        """AI CPU kernels are numpy on the host: an AI CPU kernel whose only producer is another
        AI CPU kernel joins it (one launch, no GM round trip). Depending on a single producer
        group cannot create a cycle. Every value a kernel writes counts as its product (an
        epilogue value of a reduction too: counting only roots let an AI CPU comparison that
        reads both a complex slice's abs and `argmax(abs) - ...`, the argmax kernel's
        epilogue, join the abs kernel the argmax reads: a cycle, issue 38)."""
        owner = _products(groups)
        dead = set()
        for g in groups:
            if g.kind != "aicpu":
                continue
            bound = [b for b in self._boundary(g) if b.realized is None]
            if any(id(b) not in owner for b in bound):
                continue  # a value no kernel is known to write: do not merge on a guess
            producers = {id(owner[id(b)]): owner[id(b)] for b in bound
                         if owner[id(b)] is not g}  # fmt: skip
            if len(producers) != 1:
                continue
            (p,) = producers.values()
            if p.kind != "aicpu" or id(p) in dead:
                continue
            p.members |= g.members
            p.roots = p.roots + g.roots
            p.core = None
            for r in g.roots:
                self.group_of_root[id(r)] = p
            for k, v in list(owner.items()):
                if v is g:
                    owner[k] = p
            dead.add(id(g))
        return [g for g in groups if id(g) not in dead]

    def _boundary(self, g: Group) -> list[Node]:
        """Non-member, non-const nodes read by members of g (cached until g changes)."""
        key = (id(g), len(g.members))
        hit = self._boundary_cache.get(key)
        if hit is not None and hit[0] is g.members:
            return hit[1]
        out, seen = [], set()
        for i in self._members_sorted(g):
            for s in i.srcs:
                if id(s) not in g.members and s.op != "const" and id(s) not in seen:
                    seen.add(id(s))
                    out.append(s)
        self._boundary_cache[key] = (g.members, out)
        return out

    def _members_sorted(self, g: Group) -> list[Node]:
        by_id = self.by_id
        return [by_id[i] for i in sorted(g.members, key=self.pos.__getitem__)]

    def _depends(self, start: list[Node], targets: set[int]) -> bool:
        """Does any node in `start` (transitively) read a node in `targets`?"""
        stack, seen = list(start), set()
        while stack:
            n = stack.pop()
            if id(n) in targets:
                return True
            if id(n) in seen or n.realized is not None:
                continue
            seen.add(id(n))
            stack.extend(n.srcs)
        return False

    def _merge_epilogues(self, groups: list[Group]) -> list[Group]:
        alive = []
        for g in groups:
            if g.kind != "elementwise":
                alive.append(g)
                continue
            merged = False
            e = g.roots[0]
            for b in self._boundary(g):
                host = self.group_of_root.get(id(b))
                if host is None or host.kind not in ("reduce", "matmul", "custom"):
                    continue
                if b is not host.core:
                    continue
                if host.kind == "custom" and (len(b.arg) > 2 or not custom.get(b.arg[0]).epilogue):
                    continue  # a user kernel without an epilogue slot: a boundary
                core = host.core
                # (a consumer over a reshape of the whole result, e.g. a grouped conv1d's
                # (N, G, C/G, L) -> (N, C, L), is tried: the build checks the layout)
                if ([d for d in e.shape if d != 1] != [d for d in core.shape if d != 1]
                        and not (host.kind == "matmul" and _reshapes(e, core))):  # fmt: skip
                    self.log.append(
                        LogEntry(
                            "refuse",
                            (describe(core), describe(e)),
                            "consumer runs over a different (broadcast) iteration space",
                            core,
                            e,
                        )
                    )
                    continue
                if (host.kind == "matmul" and not self.spec.coupled
                        and id(core) not in self.mix_epi):  # fmt: skip
                    bad = {n.op for n in self._members_sorted(g) if n.op in ELEMENTWISE} - \
                        rules.FIXPIPE_OPS  # fmt: skip
                    if bad:
                        continue  # logged by _fixpipe_chains
                others = [x for x in self._boundary(g) if x is not core]
                host_roots = {id(r) for r in host.roots} | {id(core)}
                if self._depends(others, host_roots):
                    self.log.append(LogEntry("refuse", (describe(core), describe(e)),
                        "the consumer also reads a value computed from this result in another "
                        "kernel; fusing would create a cycle", core, e))  # fmt: skip
                    continue
                trial = Group(host.kind, core, host.roots, host.members | g.members,
                              host.epi_roots + [e])  # fmt: skip
                try:
                    self.build(trial)
                except NeedMaterialize as ex:
                    self.log.append(LogEntry("refuse", (describe(core), describe(e)),
                                             ex.reason, core, e))  # fmt: skip
                    continue
                except CapExceeded as ex:
                    self.log.append(
                        LogEntry(
                            "refuse",
                            (describe(core), describe(e)),
                            f"fused kernel would exceed a cap: {ex}",
                            core,
                            e,
                        )
                    )
                    continue
                host.members = trial.members
                host.epi_roots = trial.epi_roots
                self.group_of_root[id(e)] = host
                if host.kind == "custom":  # fused into the author's epilogue slot after all
                    self.log[:] = [x for x in self.log if not (
                        x.what == "refuse" and x.producer is core
                        and x.consumer is not None and id(x.consumer) in g.members)]  # fmt: skip
                merged = True
                break
            if not merged:
                alive.append(g)
        return alive

    def _merge_col_sums(self, groups: list[Group]) -> list[Group]:
        """A sum over m of a matmul's product (or of its epilogue) joins the matmul kernel
        (`rules.MATMUL_COL_SUM`): the vector unit adds each output tile's rows into a column
        accumulator in UB (the coupled 910's own, the AIVs' of a MIX kernel on the split
        910B), so the product is not read back from GM by a second kernel. Likewise a sum / max
        / min over n (`rules.MATMUL_ROW_REDUCE`): each output tile reduces its rows, the N
        panels' partials meet in a GM workspace."""
        if not rules.MATMUL_COL_SUM:
            return groups
        out = []
        absorbed: set[int] = set()  # reduce groups merged into their matmul (gone)
        for g in groups:
            r = g.core
            host = None
            # the reduction's own epilogue (a mean's scale and cast): one value per row
            post = None
            if g.kind == "reduce" and g.roots == [r] and len(g.epi_roots) <= 1:
                post = g.epi_roots[0] if g.epi_roots else r
            if post is not None and post.shape == r.shape:
                op, axes = r.arg
                src = r.srcs[0]
                nd = len(src.shape)
                ax = tuple(sorted({a % nd for a in axes})) if nd else ()
                b = [x for x in self._boundary(g)]
                hosts = [self.group_of_root.get(id(x)) for x in b]
                cand = [h for h in hosts if h is not None and h.kind == "matmul"]
                col = op == "sum" and ax == (nd - 2,) and post is r
                row = rules.MATMUL_ROW_REDUCE and ax == (nd - 1,) and nd >= 2
                row = row and (op == "sum" or (op in ("max", "min") and src.shape[-1] > 0))
                if ((col or row) and nd >= 2 and len(cand) == 1
                        and src.dtype.name in ("float16", "bfloat16", "float32")
                        and src.shape == cand[0].core.shape):  # fmt: skip
                    host = cand[0]
                    # the host's own epilogue values are computed inside it: no cycle
                    others = [x for x in b if x is not host.core
                              and all(x is not e for e in host.epi_roots)]  # fmt: skip
                    if self._depends(others, {id(x) for x in host.roots} | {id(host.core)}):
                        host = None
            if host is None:
                out.append(g)
                continue
            members = host.members | g.members | {id(r)}
            # an epilogue value written only for this reduction (the 910B's FixPipe chain
            # stops at relu/cast; the AIVs of the MIX kernel compute the rest) is not written
            merging = (host, g)
            epi_roots = [e for e in host.epi_roots
                         if self._read_outside(e, members, groups, merging, absorbed)]  # fmt: skip
            # the raw row value is written too when it is wanted besides its epilogue
            both = post is not r and (id(r) in self.out_ids or any(
                id(c) not in g.members for c in self.consumers.get(id(r), [])))  # fmt: skip
            new_rows = [] if col else [r, r] if both else [r]
            cols, rows = host.col_sums + [r] * col, host.row_reds + new_rows
            routs = host.row_outs + ([] if col else [r, post] if both else [post])
            trial = Group(host.kind, host.core, host.roots, members, epi_roots, cols,
                          row_reds=rows, row_outs=routs)  # fmt: skip
            what = "column sum" if col else f"row {op}"
            try:
                self.build(trial)
            except (NeedMaterialize, CapExceeded) as ex:
                self.log.append(LogEntry("refuse", (describe(host.core), describe(r)),
                                         f"{what} in the matmul epilogue: {ex}",
                                         host.core, r))  # fmt: skip
                out.append(g)
                continue
            inner = {id(host.core)} | {id(e) for e in host.epi_roots}
            absorbed.add(id(g))
            host.members, host.col_sums, host.row_reds = trial.members, cols, rows
            host.row_outs = routs
            self.group_of_root[id(post)] = host
            host.epi_roots = epi_roots
            self.group_of_root[id(r)] = host
            self.log[:] = [e for e in self.log if not (
                e.what == "refuse" and id(e.producer) in inner
                and (e.consumer is r or id(e.consumer) in g.members))]  # fmt: skip
            if not col:
                self.log.append(LogEntry("fuse", (describe(host.core), describe(r)),
                    f"row {op} in the matmul epilogue: each output tile reduces its rows, the "
                    "N panels' partials meet in a GM workspace (the last panel to arrive "
                    "combines them in panel order)", host.core, r))  # fmt: skip
        return out

    def _read_outside(self, e: Node, members: set[int], groups: list[Group], merging: tuple,
                      absorbed: set[int]) -> bool:  # fmt: skip
        """Whether epilogue value `e` must still be written when a reduction or softmax joins
        its matmul's kernel (`members`): the user wants it, a consumer is outside the kernel,
        or another kernel reads it from GM. The last is not implied by the consumers: a view
        (reshape) of `e` or a cheap op recomputed in several kernels is a member of each, so
        `((a @ b).reshape(1, m, n) * c).reshape(m, n)` feeding both a column sum and another
        matmul (a Linear's backward: the bias and input gradients) had every consumer
        "inside", and the second matmul read a buffer nobody wrote (KeyError in the engine)."""
        if id(e) in self.out_ids:
            return True
        if any(id(c) not in members for c in self.consumers.get(id(e), [])):
            return True
        skip = {id(h) for h in merging} | absorbed
        return any(id(h) not in skip and any(b is e for b in self._boundary(h)) for h in groups)

    def _merge_softmax(self, groups: list[Group]) -> list[Group]:
        """softmax(x, axis=-1) of a matmul's product (or of its epilogue), as a row kernel whose
        only input is that product, joins the matmul kernel (`rules.MATMUL_SOFTMAX`): a row
        spans every N panel, so each output tile writes exp(x - its row max) and publishes its
        (row max, row sum); the last panel of a row block rescales the block's rows by
        exp(max_p - max) / sum (the online softmax of split rows)."""
        if not rules.MATMUL_SOFTMAX:
            return groups
        out = []
        gr = self.group_of_root
        absorbed: set[int] = set()  # row groups merged into their matmul (gone)
        for g in groups:
            if g.kind != "rows":
                out.append(g)
                continue
            n_log = len(self.log)
            try:
                self.build(g)
            except (NeedMaterialize, CapExceeded):
                del self.log[n_log:]
                out.append(g)
                continue
            del self.log[n_log:]  # the final build logs the row kernel again if it stays
            mm = [b for b in g.inputs if getattr(gr.get(id(b)), "kind", None) == "matmul"]
            x = _softmax_source(g) if len(g.roots) == 1 and len(g.outputs) == 1 else None
            src = g.inputs[0] if len(g.inputs) == 1 and x is not None else None
            host = gr.get(id(src)) if src is not None else None
            if (host is None or host.kind != "matmul" or src is None
                    or not (src is host.core or any(src is e for e in host.epi_roots))
                    or src.shape != host.core.shape):  # fmt: skip
                if mm:
                    m = mm[0]
                    self.log.append(LogEntry("refuse", (describe(m), describe(g.roots[0])),
                        "row kernel over a matmul product: of the row chains only softmax(x, -1) "
                        "with no other output (and sum/max/min over the last axis) has an online "
                        "form across the matmul's N panels; this one runs as its own row kernel",
                        m, g.roots[0]))  # fmt: skip
                out.append(g)
                continue
            (o,) = g.outputs
            members = host.members | g.members
            merging = (host, g)
            epi_roots = [e for e in host.epi_roots
                         if self._read_outside(e, members, groups, merging, absorbed)]  # fmt: skip
            trial = Group(host.kind, host.core, host.roots, members, epi_roots, host.col_sums,
                          row_reds=host.row_reds, row_outs=host.row_outs,
                          softmax=host.softmax + [(x, o)])  # fmt: skip
            try:
                self.build(trial)
            except (NeedMaterialize, CapExceeded) as ex:
                self.log.append(LogEntry("refuse", (describe(host.core), describe(o)),
                                         f"softmax in the matmul epilogue: {ex}",
                                         host.core, o))  # fmt: skip
                out.append(g)
                continue
            inner = {id(host.core)} | {id(e) for e in host.epi_roots}
            absorbed.add(id(g))
            host.members, host.epi_roots, host.softmax = members, epi_roots, trial.softmax
            for r in g.roots:
                self.group_of_root[id(r)] = host
            self.log[:] = [e for e in self.log if not (
                e.what == "refuse" and id(e.producer) in inner
                and id(e.consumer) in g.members)]  # fmt: skip
            self.log.append(LogEntry("fuse", (describe(host.core), describe(o)),
                "softmax over the last axis in the matmul epilogue (online form): each output "
                "tile writes exp(x - its row max) and publishes its row max and sum; the last "
                "N panel of a row block to arrive rescales the block's rows in GM",
                host.core, o))  # fmt: skip
        return out

    def _merge_elementwise(self, groups: list[Group]) -> list[Group]:
        ew = [g for g in groups if g.kind == "elementwise"]
        for i, g1 in enumerate(ew):
            if g1 is None:
                continue
            for j in range(i + 1, len(ew)):
                g2 = ew[j]
                if g2 is None or g2.shape != g1.shape:
                    continue
                b1 = {id(x) for x in self._boundary(g1)}
                b2 = self._boundary(g2)
                shares = any(id(x) in b1 for x in b2)
                feeds = [x for x in b2 if any(x is r for r in g1.roots)]
                if not shares and not feeds:
                    continue
                r1 = {id(r) for r in g1.roots}
                r2 = {id(r) for r in g2.roots}
                others2 = [x for x in b2 if id(x) not in r1]
                if self._depends(others2, r1) or self._depends(self._boundary(g1), r2):
                    continue
                trial = Group("elementwise", None, g1.roots + g2.roots, g1.members | g2.members)
                if feeds:
                    trial.members |= r1
                try:
                    self.build(trial)
                except (NeedMaterialize, CapExceeded) as ex:
                    self.log.append(
                        LogEntry(
                            "refuse",
                            (describe(g1.roots[0]), describe(g2.roots[0])),
                            f"multi-output merge refused: {ex}",
                        )
                    )
                    continue
                g1.roots, g1.members = trial.roots, trial.members
                for r in g2.roots:
                    self.group_of_root[id(r)] = g1
                ew[j] = None
        keep = {id(g) for g in ew if g is not None}
        return [g for g in groups if g.kind != "elementwise" or id(g) in keep]

    def _toposort_groups(self, groups: list[Group]) -> list[Group]:
        """Launch order: the kernel DAG sorted topologically (Kahn), ties broken by where each
        kernel's first output appears in the user's program."""
        while True:
            order, stuck = self._kahn(groups)
            if not stuck:
                return order
            groups = self._split_cycle(groups, stuck)

    def _split_cycle(self, groups: list[Group], stuck: list[Group]) -> list[Group]:
        """A merge closed a cycle between kernels (none is known to: this is the safety net).
        Split the merged kernel on the cycle that holds the most unmerged kernels back into
        them, log it, and let the caller sort again; the unmerged kernels form a DAG, so
        repeating this terminates acyclic."""
        made = _products(stuck)
        succ = {id(g): set() for g in stuck}
        for g in stuck:
            for b in self._boundary(g):
                p = made.get(id(b))
                if p is not None and p is not g:
                    succ[id(p)].add(id(g))

        def on_cycle(g: Group) -> bool:
            todo, seen = list(succ[id(g)]), set()
            while todo:
                i = todo.pop()
                if i == id(g):
                    return True
                if i not in seen:
                    seen.add(i)
                    todo.extend(succ[i])
            return False

        cyc = [g for g in stuck if on_cycle(g)] or stuck
        parts: dict[int, list[Group]] = {}
        for g in cyc:
            mine = _products([g])
            parts[id(g)] = [u for u in self.unmerged if id(u.roots[0]) in mine]
        g = max(cyc, key=lambda x: len(parts[id(x)]))
        if len(parts[id(g)]) <= 1:
            raise RuntimeError("cycle between kernels that are not merges")  # pragma: no cover
        back = [replace(u, roots=list(u.roots), members=set(u.members),
                        epi_roots=list(u.epi_roots)) for u in parts[id(g)]]  # fmt: skip
        for u in back:
            for r in u.roots:
                self.group_of_root[id(r)] = u
        self.log.append(LogEntry("split", tuple(describe(u.roots[0]) for u in back),
            f"merging these {len(back)} kernels into one {g.kind} kernel made a cycle between "
            "kernels (it would read its own output through another kernel); they run "
            "separately", g.roots[0]))  # fmt: skip
        return [x for x in groups if x is not g] + back

    def _kahn(self, groups: list[Group]) -> tuple[list[Group], list[Group]]:
        """(the groups in launch order, []) or (a partial order, the groups left on or after
        a cycle)."""
        import heapq

        produced = _products(groups)
        first = {id(g): min(self.pos[id(r)] for r in g.roots) for g in groups}
        succ: dict[int, set[int]] = {id(g): set() for g in groups}
        indeg = {id(g): 0 for g in groups}
        for g in groups:
            for b in self._boundary(g):
                p = produced.get(id(b))
                if p is not None and p is not g and id(g) not in succ[id(p)]:
                    succ[id(p)].add(id(g))
                    indeg[id(g)] += 1
        by_id = {id(g): g for g in groups}
        ready = [(first[i], i) for i, d in indeg.items() if d == 0]
        heapq.heapify(ready)
        out = []
        while ready:
            _, i = heapq.heappop(ready)
            out.append(by_id[i])
            for j in succ[i]:
                indeg[j] -= 1
                if indeg[j] == 0:
                    heapq.heappush(ready, (first[j], j))
        done = {id(g) for g in out}
        return out, [g for g in groups if id(g) not in done]

    # ------------------------------------------------------------------ IR
    def written(self, g: Group) -> list[Node]:
        """Nodes of g that must reach GM: its roots, plus a fused core that is still needed."""
        read_by = getattr(self, "read_by", None)
        roots = [r for r in g.roots if r is not g.core]
        if read_by is not None and len(roots) + len(g.epi_roots) > 1:
            # a root merged into a consumer's kernel is computed there; write it only if
            # the user wants it or another kernel reads it
            roots = [r for r in roots
                     if id(r) in self.out_ids or read_by.get(id(r), set()) - {id(g)}]  # fmt: skip
            if not roots and not g.epi_roots:
                roots = [r for r in g.roots if r is not g.core][:1]
        outs = roots + list(g.epi_roots)
        if g.core is not None:
            read_elsewhere = getattr(self, "read_by", {}).get(id(g.core), set()) - {id(g)}
            need = (
                id(g.core) in self.out_ids
                or bool(read_elsewhere)
                or any(id(c) not in g.members for c in self.consumers.get(id(g.core), []))
                or not (g.epi_roots or g.col_sums or g.row_reds or g.softmax)
            )
            if need:
                outs.insert(0, g.core)
        seen, uniq = set(), []
        last = g.col_sums + g.row_outs + [o for _, o in g.softmax]
        for o in outs:
            if id(o) not in seen and all(o is not c for c in last):
                seen.add(id(o))
                uniq.append(o)
        return uniq + last  # kernel_args order: the row / column results last

    def build(self, g: Group) -> None:
        g.outputs = self.written(g)
        g.member_nodes = self._members_sorted(g)
        if g.kind == "aicpu":
            g.inputs = self._boundary(g)
            g.ir = aicpu_kernel(g.member_nodes, g.inputs, g.outputs, self.copied)
            return
        internal = set(g.members)
        if g.kind == "elementwise":
            shape = g.roots[0].shape
            b = ExprBuilder(shape, internal, copied=self.copied)
            results = tuple(b.value(r) for r in g.outputs)
            g.ir = ElementwiseKernel(shape, tuple(b.inputs),
                                     tuple(contiguous_view(o.dtype.name, shape) for o in g.outputs),
                                     tuple(b.ops), results)  # fmt: skip
            g.inputs = list(b.input_nodes)
            return
        if g.kind == "rows":
            self._build_rows(g, internal)
            return
        if g.kind == "custom":
            self._build_custom(g)
            return
        core = g.core
        if g.kind == "reduce":
            op, axes = core.arg
            src = core.srcs[0]
            pro = ExprBuilder(src.shape, internal, copied=self.copied)
            pres = pro.value(src)
            if op in ("argmax", "argmin"):
                acc_dtype = "int64"
            elif op in ("sum", "prod") and core.dtype.name == "float16":
                acc_dtype = "float32"
            else:
                acc_dtype = core.dtype.name
            epi = ExprBuilder(
                core.shape, internal, acc=core, acc_dtype=acc_dtype, copied=self.copied
            )
            results = tuple(self._epi_value(epi, o, core) for o in g.outputs)
            g.ir = ReduceKernel(
                src.shape,
                tuple(axes),
                op,
                tuple(pro.inputs),
                tuple(pro.ops),
                pres,
                acc_dtype,
                core.shape,
                tuple(epi.inputs),
                tuple(epi.ops),
                results,
                tuple(contiguous_view(o.dtype.name, core.shape) for o in g.outputs),
            )
            g.inputs = list(pro.input_nodes) + list(epi.input_nodes)
            g.has_prologue = any(o.op not in ("load",) for o in pro.ops)
            return
        # matmul
        a_src, b_src = core.srcs
        operands, prologues, nodes = [], [], []
        im2col = b_src.op == "im2col" and id(b_src) in internal
        for s in (a_src, b_src.srcs[0] if im2col else b_src):
            ob = ExprBuilder(s.shape, internal, copied=self.copied)
            res = ob.value(s)
            if len(ob.inputs) != 1:
                # only constants: materialize via a tiny elementwise kernel
                raise NeedMaterialize(_peel_views(s), "matmul operand without a buffer input")
            if im2col and s is not a_src:  # implicit GEMM: B is x (N, C, L), its windows packed
                operands.append(im2col_operand(ob.inputs[0], b_src.arg))
            else:
                operands.append(ob.inputs[0])
            prologues.append(None if is_identity_load(ob.ops, res) else
                             tuple(ob.ops[: res + 1]))  # fmt: skip
            nodes.append(ob.input_nodes[0])
        batch = core.shape[:-2]
        m, n = core.shape[-2:]
        k = a_src.shape[-1]
        epi = ExprBuilder(core.shape, internal, acc=core, acc_dtype="float32", copied=self.copied)
        n_out = len(g.outputs) - len(g.col_sums) - len(g.row_reds) - len(g.softmax)
        results = tuple(self._epi_value(epi, o, core) for o in g.outputs[:n_out])
        col_sums = tuple(epi.value(r.srcs[0]) for r in g.col_sums)
        row_reds = tuple((r.arg[0], epi.value(r.srcs[0])) for r in g.row_reds)
        posts = []
        for r, o in zip(g.row_reds, g.row_outs):
            if o is r:
                posts.append(None)
                continue
            pb = ExprBuilder(r.shape, internal, acc=r, acc_dtype="float32", copied=self.copied)
            pb.value(o)
            if pb.inputs:  # only the row value and constants
                raise NeedMaterialize(r, "a row reduction's epilogue reads another input")
            posts.append(tuple(pb.ops))
        softmax = tuple(epi.value(x) for x, _ in g.softmax)
        g.ir = MatmulKernel(
            batch,
            m,
            n,
            k,
            operands[0],
            operands[1],
            prologues[0],
            prologues[1],
            core.dtype.name,
            tuple(epi.inputs),
            tuple(epi.ops),
            results,
            tuple(contiguous_view(o.dtype.name, core.shape) for o in g.outputs[:n_out]),
            col_sums=col_sums,
            col_sum_outputs=tuple(contiguous_view(r.dtype.name, r.shape) for r in g.col_sums),
            row_reds=row_reds,
            row_red_outputs=tuple(contiguous_view(o.dtype.name, o.shape) for o in g.row_outs),
            row_posts=tuple(posts) if any(p is not None for p in posts) else (),
            softmax=softmax,
            softmax_outputs=tuple(contiguous_view(o.dtype.name, o.shape) for _, o in g.softmax),
            b_im2col=b_src.arg[:4] if im2col else None,
        )
        g.inputs = nodes + list(epi.input_nodes)
        g.has_prologue = any(p is not None for p in prologues)

    def _build_custom(self, g: Group) -> None:
        """A user kernel: its sources as dense GM views (offset 0, C order); all its outputs
        (a multi-output kernel's sibling nodes, `lowlevel.Kernel.__call__`) are written."""
        n = g.core
        key, params = n.arg[0], n.arg[1]
        defn = custom.get(key)
        views_in, nodes_in = [], []
        views_of = {id(x) for x in g.member_nodes if x.op in VIEW_OPS}
        for i, s in enumerate(n.srcs):
            if _strided_ok(defn, i):
                # the views between s and a buffer compose into one strided operand, read in
                # place (the heads of one qkv matmul: no dense copy of q, k and v first)
                b = ExprBuilder(s.shape, views_of, copied=self.copied)
                v = b.value(s)
                if b.ops[v].op == "load" and defn.strided_input(i, b.inputs[0]):
                    views_in.append(b.inputs[0])
                    nodes_in.append(b.input_nodes[0])
                    continue
                raise NeedMaterialize(s, f"user kernel {defn.name} reads its input {i} through "
                                      "a view only with a dense last dimension and no negative "
                                      "stride")  # fmt: skip
            b = ExprBuilder(s.shape, set(), copied=self.copied)
            v = b.value(s)
            ok = b.ops[v].op == "load" and b.inputs[0].contiguous and b.inputs[0].offset == 0
            if not ok:
                raise NeedMaterialize(s, f"user kernel {defn.name} reads dense inputs "
                                      "(C order, offset 0)")  # fmt: skip
            views_in.append(contiguous_view(s.dtype.name, s.shape))
            nodes_in.append(_dense_leaf(s) or s)
        epilogue, result = (), -1
        if len(n.arg) > 2:  # several outputs: every sibling node is written
            g.outputs = list(defn.output_nodes(n))
        elif g.epi_roots:  # consumers fused into the author's epilogue slot
            if len(g.outputs) != 1:
                raise NeedMaterialize(n, f"user kernel {defn.name} writes one output: its "
                                      "value is also read elsewhere")  # fmt: skip
            e = g.epi_roots[0]
            epi = ExprBuilder(n.shape, set(g.members), acc=n, acc_dtype=n.dtype.name,
                              copied=self.copied)  # fmt: skip
            result = self._epi_value(epi, e, n)
            if epi.inputs or e.dtype != n.dtype:
                raise NeedMaterialize(e, f"user kernel {defn.name}'s epilogue slot takes "
                                      "elementwise ops on its value and constants, in its "
                                      "output dtype")  # fmt: skip
            epilogue = tuple(epi.ops)
        outs = g.outputs if len(n.arg) > 2 else [n]
        g.ir = CustomKernel(key, defn.name, defn.unit, tuple(views_in),
                            tuple(contiguous_view(o.dtype.name, o.shape) for o in outs),
                            params, epilogue, result)  # fmt: skip
        g.inputs = nodes_in

    def _merge_custom_siblings(self, groups: list[Group]) -> list[Group]:
        """The outputs of one call of a multi-output user kernel are one kernel."""
        first: dict = {}
        out = []
        for g in groups:
            n = g.core
            if g.kind != "custom" or len(n.arg) <= 2:
                out.append(g)
                continue
            k = (n.arg[0], n.arg[1], n.srcs)
            host = first.get(k)
            if host is None:
                first[k] = g
                out.append(g)
                continue
            host.roots = host.roots + g.roots
            host.members = host.members | g.members
            for r in g.roots:
                self.group_of_root[id(r)] = host
        return out

    def _build_rows(self, g: Group, internal: set[int]) -> None:
        from lazymath.backend.npu.templates import rows as rows_template

        reg = self.region_of[id(g.roots[0])]
        S, A, first = self.regions[reg]
        kd = tuple(1 if d in A else S[d] for d in range(len(S)))
        out_shape = tuple(S[d] for d in range(len(S)) if d not in A)
        b = RowExprBuilder(S, A, internal, copied=self.copied)
        results, row_out, views_out = [], [], []
        for o in g.outputs:
            if o.shape == S:
                results.append(b.value(o))
                row_out.append(False)
            else:
                chain: tuple = ()
                if o.shape != kd:
                    chain = (make("reshape", o.dtype, kd, (o,), loc=o.loc),)
                top = make("expand", o.dtype, S, (chain[0] if chain else o,), loc=o.loc)
                results.append(b.value(o, (top, *chain)))
                row_out.append(True)
            views_out.append(contiguous_view(o.dtype.name, o.shape))
        g.ir = RowKernel(S, A, tuple(b.inputs), tuple(b.ops), tuple(results), tuple(views_out),
                         tuple(row_out), out_shape)  # fmt: skip
        g.inputs = list(b.input_nodes)
        mode, why = rules.row_form(rows_template, g.ir, self.spec)
        if mode is None:
            raise NeedMaterialize(first, f"row fusion refused: {why}")
        reds = [n for n in g.member_nodes if n.op == "reduce"]
        self.log.append(LogEntry("rows", tuple(describe(n) for n in reds), why, first))

    @staticmethod
    def _epi_value(epi: ExprBuilder, out: Node, core: Node) -> int:
        if out.shape == core.shape:
            return epi.value(out)
        virtual = make("reshape", out.dtype, core.shape, (out,), loc=out.loc)
        return epi.value(out, (virtual,))


def _softmax_source(g: Group) -> Node | None:
    """The node x when row group `g` computes exactly softmax(x) over the last axis
    (exp(x - max) / sum(exp(x - max)), float16 sums cast back allowed; elementwise ops before
    the max are part of x), else None."""
    ir = g.ir
    e = ir.expr if ir is not None else ()
    if (not e or len(ir.results) != 1 or ir.row_outputs != (False,) or len(ir.in_shape) < 2
            or ir.axes != (len(ir.in_shape) - 1,)):  # fmt: skip
        return None
    red = [i for i, op in enumerate(e) if op.op == "reduce"]
    if len(red) != 2 or e[red[0]].arg != "max" or e[red[1]].arg != "sum":
        return None
    i0 = red[0]
    x = e[i0].srcs[0]
    tail = e[i0 + 1 :]
    ops = [op.op for op in tail]
    if ops not in (["sub", "exp", "reduce", "div"], ["sub", "exp", "reduce", "cast", "div"]):
        return None
    sub, ex = tail[0], tail[1]
    s = i0 + 3 + (ops[3] == "cast")
    div = tail[-1]
    if (sub.srcs != (x, i0) or ex.srcs != (i0 + 1,) or tail[2].srcs != (i0 + 2,)
            or div.srcs != (i0 + 2, s) or ir.results != (len(e) - 1,)):  # fmt: skip
        return None
    if not e[x].dtype.startswith("float"):
        return None
    maxes = [n for n in g.member_nodes if n.op == "reduce" and n.arg[0] == "max"]
    return maxes[0].srcs[0] if len(maxes) == 1 else None


def _reshapes(e: Node, core: Node) -> bool:
    """`e` (the root of an elementwise group) has as many elements as `core` and reaches it
    through elementwise ops and reshapes (the epilogue is built over `core`'s shape through a
    virtual reshape; the build refuses a layout that does not compose)."""
    if e.size != core.size:
        return False
    stack, seen = [e], set()
    while stack:
        n = stack.pop()
        if n is core:
            return True
        if id(n) in seen:
            continue
        seen.add(id(n))
        if n.op in ELEMENTWISE or n.op == "reshape":
            stack.extend(n.srcs)
    return False


def im2col_matmul(n: Node) -> bool:
    """`n` is conv1d's implicit GEMM: a matmul whose B operand is (a view of) an im2col. On the
    split 910B its epilogue runs on the AIVs of a MIX kernel (the Cube core has no UB)."""
    if n.op != "matmul":
        return False
    b = n.srcs[1]
    while b.op in VIEW_OPS and b.realized is None:
        b = b.srcs[0]
    return b.op == "im2col" and b.realized is None


def _dense_leaf(s: Node) -> Node | None:
    """The realized C-contiguous array that `s` reshapes (a dense GM input read in place by a
    user kernel, e.g. a vector seen as one row), None if `s` is anything else."""
    b = s
    while b.op == "reshape" and b.realized is None:
        b = b.srcs[0]
    if b is s or b.realized is None or not b.realized.flags.c_contiguous:
        return None
    return b


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


def plan(outputs: list[Node], spec, max_restarts: int = 64):
    """Group `outputs`' pending graph into kernels. Returns (groups in launch order, log).

    The log holds the final attempt's decisions plus the reasons for nodes that earlier,
    abandoned attempts forced to GM (so nothing in it refers to a discarded plan)."""
    forced: set[int] = set()
    copied: set[int] = set()
    keep_alive: list[Node] = []
    forced_log: list[LogEntry] = []
    for _ in range(max_restarts):
        log: list[LogEntry] = []
        p = Planner(outputs, spec, forced, log, frozenset(copied))
        try:
            groups = p.groups()
            p.read_by = {}
            for g in groups:
                for b in p._boundary(g):
                    p.read_by.setdefault(id(b), set()).add(id(g))
            for g in groups:
                p.build(g)
            return groups, forced_log + _dedupe(log), p
        except NeedMaterialize as e:
            node = e.node
            if node.realized is not None:
                # the user's array is not touched: the plan says "copy this input contiguous"
                # (Schedule.copy_inputs) and the runtime makes the copy at each run
                if id(node) in copied:
                    raise
                copied.add(id(node))
                forced_log.append(
                    LogEntry(
                        "materialize",
                        (describe(node),),
                        f"input copied to contiguous memory: {e.reason}",
                        node,
                    )
                )
            else:
                if id(node) in forced:
                    raise
                forced.add(id(node))
                keep_alive.append(node)
                forced_log.append(LogEntry("materialize", (describe(node),), e.reason, node))
        except CapExceeded as e:
            victim = _split_point(p, e)
            forced.add(id(victim))
            keep_alive.append(victim)
            forced_log.append(LogEntry("split", (describe(victim),),
                                       f"{e}; the kernel is split here", victim))  # fmt: skip
    raise RuntimeError("fusion planning did not converge")


def _dedupe(log: list[LogEntry]) -> list[LogEntry]:
    seen, out = set(), []
    for e in log:
        key = (e.what, e.nodes, e.reason)
        if key not in seen:
            seen.add(key)
            out.append(e)
    return out


def _split_point(p: Planner, e: CapExceeded) -> Node:
    """Pick the node that splits the oversized cone roughly in half."""
    best, best_size = None, -1
    for g_root in p.pending:
        if id(g_root) in p.forced or id(g_root) in getattr(p, "M", set()):
            continue
        if g_root.op not in ELEMENTWISE:
            continue
        _, ops, _ = p._cone(g_root, getattr(p, "M", set()))
        target = rules.MAX_KERNEL_OPS // 2
        if ops <= target and ops > best_size:
            best, best_size = g_root, ops
    if best is None:
        raise RuntimeError(f"cannot split kernel: {e}")
    return best
