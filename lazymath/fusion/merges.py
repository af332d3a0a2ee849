"""Planning step 3, the merge rules: after every materialized node has its group (its cone),
elementwise groups that consume a reduce/matmul result over the same iteration space become its
epilogue (`_merge_epilogues`; sums over a matmul's rows or columns and a softmax over its rows
fused into it: `_merge_col_sums`, `_merge_softmax`), row-region pieces join (`_merge_rows`),
elementwise groups of one shape that share an input or feed each other become one multi-output
kernel (`_merge_elementwise`), and AI CPU groups and user kernels' siblings join theirs. A merge
never creates a cycle between kernels; each refusal is logged with its `rules` reason.
"""

from __future__ import annotations

from lazymath.fusion import rules
from lazymath.fusion.build import (
    CapExceeded,
    NeedMaterialize,
)
from lazymath.fusion.group import (
    Group,
    LogEntry,
    _products,
    describe,
)
from lazymath.graph import custom
from lazymath.graph.node import Node
from lazymath.graph.ops import ELEMENTWISE


class Merges:
    """`grouping.Planner`'s merge rules, a mixin: the methods read and write the planner's state
    (`group_of_root`, `M`, `log`, ...), set up by `Planner.__init__` and `Planner.groups`."""

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
