"""Planning step 1: which nodes are written to GM ("materialized") -- the realize outputs, every
node of a materializing kind, AI CPU/AI Core boundaries, row regions' values read outside them,
FixPipe chains on the split 910B, matmul operands whose producers are too heavy for the GM -> L1
load, cones over the op cap, and multi-consumer nodes that are not cheap to recompute
(`rules.RECOMPUTE_MAX_OPS`). Each decision that refuses a fusion is logged with its `rules` reason.
"""

from __future__ import annotations

from lazymath.backend.npu.kernel_ir import (
    ROW_REDUCE_OPS,
)
from lazymath.fusion import rules
from lazymath.fusion.build import (
    folded_leaf,
)
from lazymath.fusion.group import (
    LogEntry,
    _dense_leaf,
    _peel_views,
    _strided_ok,
    describe,
)
from lazymath.fusion.views import VIEW_OPS
from lazymath.graph import custom, dft
from lazymath.graph.node import Node
from lazymath.graph.ops import ELEMENTWISE, kind


class Materialize:
    """`grouping.Planner`'s materialization step, a mixin: the methods read and write the planner's
    state (`pending`, `consumers`, `aicpu`, `log`, ...), set up by `Planner.__init__`."""

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


def im2col_matmul(n: Node) -> bool:
    """`n` is conv1d's implicit GEMM: a matmul whose B operand is (a view of) an im2col. On the
    split 910B its epilogue runs on the AIVs of a MIX kernel (the Cube core has no UB)."""
    if n.op != "matmul":
        return False
    b = n.srcs[1]
    while b.op in VIEW_OPS and b.realized is None:
        b = b.srcs[0]
    return b.op == "im2col" and b.realized is None
