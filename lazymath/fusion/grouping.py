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

from dataclasses import replace

from lazymath.backend.npu.kernel_ir import (
    CustomKernel,
    ElementwiseKernel,
    MatmulKernel,
    ReduceKernel,
    RowKernel,
    contiguous_view,
    im2col_operand,
)
from lazymath.fusion import rules
from lazymath.fusion.build import (
    CapExceeded,
    ExprBuilder,
    NeedMaterialize,
    RowExprBuilder,
    aicpu_kernel,
    is_identity_load,
)
from lazymath.fusion.group import (
    Group,
    LogEntry,
    _dedupe,
    _dense_leaf,
    _is_aicpu,
    _peel_views,
    _products,
    _refuse_bfloat16,
    _strided_ok,
    describe,
)
from lazymath.fusion.group import aicpu_reason as aicpu_reason  # lm.explain's (api.py)
from lazymath.fusion.materialize import Materialize
from lazymath.fusion.merges import Merges
from lazymath.fusion.views import VIEW_OPS
from lazymath.graph import custom
from lazymath.graph.node import Node, make, toposort
from lazymath.graph.ops import ELEMENTWISE, kind


class Planner(Materialize, Merges):
    """One planning attempt over `outputs`' pending graph: its state (the pending nodes in order,
    consumers, AI CPU placement, the fusion log), the groups (`groups`: materialize, cones,
    merges, launch order) and their kernel IR (`build`). The steps live in `materialize.py` and
    `merges.py` (mixins over this state); `plan` restarts an attempt when a build asks for one
    more node in GM."""

    def __init__(self, outputs: list[Node], spec, forced: set[int], log: list[LogEntry],
                 copied: frozenset[int] = frozenset(), *, row_template):  # fmt: skip
        self.outputs = outputs
        self.row_template = row_template  # the backend's row template (`plan`'s argument)
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

    def _build_rows(self, g: Group, internal: set[int]) -> None:
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
        mode, why = rules.row_form(self.row_template, g.ir, self.spec)
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


def plan(outputs: list[Node], spec, max_restarts: int = 64, *, row_template):
    """Group `outputs`' pending graph into kernels. Returns (groups in launch order, log).

    `row_template` is the backend's row template (backend/npu/templates/rows.py, or a deferred
    reference to it): whether a row kernel fits on chip is its decision, since it plans the
    pipelined program to measure the UB, and fusion does not import the backend; the driver
    hands it over like `spec`. The log holds the final attempt's decisions plus the reasons for
    nodes that earlier, abandoned attempts forced to GM (so nothing in it refers to a discarded
    plan)."""
    forced: set[int] = set()
    copied: set[int] = set()
    keep_alive: list[Node] = []
    forced_log: list[LogEntry] = []
    for _ in range(max_restarts):
        log: list[LogEntry] = []
        p = Planner(outputs, spec, forced, log, frozenset(copied), row_template=row_template)
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
