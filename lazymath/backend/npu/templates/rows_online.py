"""The row template's online two-pass form (a row wider than UB; see `rows`): which
reductions merge online (`_online_plan`: softmax's running max + rescaled sum, Chan/Welford
for mean + M2) and the program that streams each row through UB twice (`_plan_online`).
Split out of `rows` by issue 36 (move only).
"""

from __future__ import annotations

from dataclasses import dataclass

from lazymath.backend.npu import isa
from lazymath.backend.npu.kernel_ir import RowKernel
from lazymath.backend.npu.templates import common as C
from lazymath.backend.npu.templates.reduce import identity
from lazymath.backend.npu.templates.rows_emit import _Body, _copy_outs, _count, _Info

# ============================================================================= online


@dataclass
class _OnlinePlan:
    pairs: dict  # dependent reduce -> (kind "softmax" | "welford", base reduce, shift op)
    plain: list  # reductions of pass 1 that just accumulate over the chunks


def _ancestors(expr, roots, stop) -> set[int]:
    out, stack = set(), list(roots)
    while stack:
        i = stack.pop()
        if i in out or i in stop:
            continue
        out.add(i)
        stack.extend(expr[i].srcs)
    return out


def _through_casts(expr, i: int) -> int:
    while expr[i].op == "cast":
        i = expr[i].srcs[0]
    return i


def _online_plan(ir: RowKernel, info: _Info) -> _OnlinePlan | str:
    """Which reductions merge online. A reduction whose source needs an earlier reduction must
    be the sum of exp(G - max(G)) (softmax) or of (G - sum(G)/N)**2 (variance), G computed
    before any reduction; deeper chains have no two-pass form."""
    expr, lvl, phase = ir.expr, info.lvl, info.phase
    pairs, bases = {}, set()
    for j in info.reduces:
        src = expr[j].srcs[0]
        if phase[src] == 0:
            continue
        if phase[src] > 1:
            return "a reduction needs two earlier reductions in sequence"
        op = expr[j]
        s = expr[src]
        found = None
        if op.arg == "sum" and s.op == "exp" and expr[s.srcs[0]].op == "sub":
            g, sh = expr[s.srcs[0]].srcs
            b = _through_casts(expr, sh)
            if (expr[b].op == "reduce" and expr[b].arg == "max" and expr[b].srcs[0] == g
                    and expr[sh].dtype == expr[g].dtype and phase[g] == 0):  # fmt: skip
                found = ("softmax", b, sh)
        elif op.arg == "sum" and s.op == "mul" and s.srcs[0] == s.srcs[1] and \
                expr[s.srcs[0]].op == "sub":  # fmt: skip
            g, sh = expr[s.srcs[0]].srcs
            m = expr[sh]
            if m.op == "mul" and lvl[sh] == "row":
                a, c = m.srcs
                if expr[a].op == "const":
                    a, c = c, a
                b = _through_casts(expr, a)
                n = info.R
                if (expr[c].op == "const" and expr[b].op == "reduce" and expr[b].arg == "sum"
                        and expr[b].srcs[0] == g and phase[g] == 0
                        and abs(float(expr[c].arg) * n - 1) < 1e-6):  # fmt: skip
                    found = ("welford", b, sh)
        if found is None:
            return (
                "the reduction that needs an earlier one is neither softmax's sum of "
                "exp(x - max) nor a variance's sum of squared deviations from the mean"
            )
        if found[1] in bases:
            return "two reductions depend on the same earlier reduction"
        bases.add(found[1])
        pairs[j] = found
    plain = [i for i in info.reduces if i not in pairs and i not in bases]
    return _OnlinePlan(pairs, plain)


def _online_parts(ir, info, plan: _OnlinePlan, chunk: int, pp, nc):
    """Programs pieces for one row: (bd, queues, init, pass1 compute, between, pass2 compute,
    row outputs)."""
    expr = ir.expr
    bd = _Body(ir, info, 1, chunk, 1, nc)
    half = isa.mul(pp, chunk)
    queues: dict = {}
    used = sorted({op.arg for op in expr if op.op == "load"})
    for k in used:
        rw = info.row_input[k]
        queues[("in", k)] = isa.Buffer(f"in{k}_tile", "UB", ir.inputs[k].dtype,
                                       2 if rw else 2 * chunk)  # fmt: skip
    out_refs = {}
    for j, v in enumerate(ir.outputs):
        rw = ir.row_outputs[j]
        buf = isa.Buffer(f"out{j}_tile", "UB", v.dtype, 1 if rw else 2 * chunk)
        queues[("out", j)] = buf
        out_refs[j] = isa.Ref(buf, 0 if rw else half)

    def leaves() -> dict:
        vals = {}
        for i, op in enumerate(expr):
            if op.op == "load":
                rw = info.row_input[op.arg]
                vals[i] = isa.Ref(queues[("in", op.arg)], 0 if rw else half)
            elif op.op == "const":
                vals[i] = C.Const(op.arg, op.dtype)
        return vals

    everything = set(range(len(expr)))
    # ---- state per row
    st = {}
    init = []
    for j, (kind_, b, sh) in plan.pairs.items():  # noqa: B007 - sh names the mean's dtype
        gdt = expr[expr[b].srcs[0]].dtype
        adt = bd.acc[j].buf.dtype
        if kind_ == "softmax":
            names = {"M": gdt, "Mn": gdt, "cm": gdt, "sh": gdt, "shn": gdt, "mask": "bool",
                     "f0": "float32", "f1": "float32", "sc": adt, "cs": adt, "S": adt}  # fmt: skip
        else:
            names = {"cs": bd.acc[b].buf.dtype, "ncv": adt, "mc": adt, "mcb": expr[sh].dtype,
                     "back": adt, "cm2": adt, "nn": adt, "tot": adt, "delta": adt, "t": adt,
                     "mean": adt, "M2": adt}  # fmt: skip
        st[j] = {k: bd._buf(f"on{j}_{k}", dt, 1) for k, dt in names.items()}
        r = st[j]
        if kind_ == "softmax":
            init += [isa.VDup(r["M"], float("-inf"), 1), isa.VDup(r["sh"], 0, 1),
                     isa.VDup(r["S"], 0, 1)]  # fmt: skip
        else:
            init += [isa.VDup(r["nn"], 0, 1), isa.VDup(r["mean"], 0, 1), isa.VDup(r["M2"], 0, 1)]
    init += bd.init_acc(plan.plain)
    # ---- pass 1: plain reductions accumulate; pair bases reduce per chunk, then merge
    vals = leaves()
    into = {i: bd.acc[i] for i in plan.plain}
    for j, (kind_, b, _sh) in plan.pairs.items():
        into[b] = st[j]["cm"] if kind_ == "softmax" else st[j]["cs"]
    first = [i for i in info.reduces if i not in plan.pairs]
    for b in {p[1] for p in plan.pairs.values()}:
        bd.b.emit(isa.VDup(into[b], identity(expr[b].arg, into[b].buf.dtype), 1))
    order0 = bd.order(_ancestors(expr, first, set(vals)))
    bd.emit(order0, vals, {}, everything, into)
    e = bd.b.emit

    def conv(dst, src):
        if dst.buf.dtype == src.buf.dtype:
            e(isa.VUnary("vcopy", dst, src, 1))
        else:
            e(isa.VConv(dst, src, 1, "trunc"))

    for j, (kind_, _b, sh) in plan.pairs.items():
        r = st[j]

        if kind_ == "softmax":
            e(isa.VBinary("vmax", r["Mn"], r["M"], r["cm"], 1))
            e(isa.VCmpS("eq", r["mask"], r["Mn"], float("-inf"), 1))
            e(isa.VSel(r["shn"], r["mask"], bd.er.const_tile(0, r["shn"].buf.dtype), r["Mn"], 1))
            shift = r["shn"]
            acc_c = r["cs"]
        else:
            e(isa.VDup(r["ncv"], nc, 1))
            conv(r["mc"], r["cs"])
            e(isa.VBinary("vdiv", r["mc"], r["mc"], r["ncv"], 1))
            conv(r["mcb"], r["mc"])
            shift = r["mcb"]
            acc_c = r["cm2"]
        e(isa.VDup(acc_c, 0, 1))
        v2 = dict(vals)
        v2[sh] = shift
        src = expr[j].srcs[0]
        sub = _ancestors(expr, [src], set(v2))
        bd.emit(bd.order(sub | {j}), v2, {}, everything, {j: acc_c})
        if kind_ == "softmax":  # S = S * exp(min(sh - shn, 0)) + cs; M = Mn; sh = shn
            conv(r["f0"], r["sh"])
            conv(r["f1"], r["shn"])
            e(isa.VBinary("vsub", r["f0"], r["f0"], r["f1"], 1))
            e(isa.VScalar("vmins", r["f0"], r["f0"], 0.0, 1))
            e(isa.VUnary("vexp", r["f0"], r["f0"], 1))
            conv(r["sc"], r["f0"])
            e(isa.VBinary("vmul", r["S"], r["S"], r["sc"], 1))
            e(isa.VBinary("vadd", r["S"], r["S"], r["cs"], 1))
            e(isa.VUnary("vcopy", r["M"], r["Mn"], 1))
            e(isa.VUnary("vcopy", r["sh"], r["shn"], 1))
        else:  # Chan: M2_c -= n_c (mc - mcb)^2; delta = mc - mean; tot = nn + n_c;
            # mean += delta n_c / tot; M2 += M2_c + delta^2 nn n_c / tot; nn = tot
            conv(r["back"], r["mcb"])
            e(isa.VBinary("vsub", r["back"], r["mc"], r["back"], 1))
            e(isa.VBinary("vmul", r["back"], r["back"], r["back"], 1))
            e(isa.VBinary("vmul", r["back"], r["back"], r["ncv"], 1))
            e(isa.VBinary("vsub", r["cm2"], r["cm2"], r["back"], 1))
            e(isa.VBinary("vsub", r["delta"], r["mc"], r["mean"], 1))
            e(isa.VBinary("vadd", r["tot"], r["nn"], r["ncv"], 1))
            e(isa.VBinary("vmul", r["t"], r["delta"], r["ncv"], 1))
            e(isa.VBinary("vdiv", r["t"], r["t"], r["tot"], 1))
            e(isa.VBinary("vadd", r["mean"], r["mean"], r["t"], 1))
            e(isa.VBinary("vmul", r["t"], r["t"], r["delta"], 1))
            e(isa.VBinary("vmul", r["t"], r["t"], r["nn"], 1))
            e(isa.VBinary("vadd", r["M2"], r["M2"], r["cm2"], 1))
            e(isa.VBinary("vadd", r["M2"], r["M2"], r["t"], 1))
            e(isa.VUnary("vcopy", r["nn"], r["tot"], 1))
    pass1 = bd.take()
    # ---- between the passes: final reduction values and the row-level ops on them
    rv: dict = {}
    for i, op in enumerate(expr):
        if op.op == "const":
            rv[i] = C.Const(op.arg, op.dtype)
    for j, (kind_, b, _sh) in plan.pairs.items():
        r = st[j]
        if kind_ == "softmax":
            bd.b.emit(isa.VConv(bd.acc[b], r["M"], 1, "trunc") if bd.acc[b].buf.dtype !=
                      r["M"].buf.dtype else isa.VUnary("vcopy", bd.acc[b], r["M"], 1))  # fmt: skip
            bd.b.emit(isa.VUnary("vcopy", bd.acc[j], r["S"], 1))
        else:
            bd.b.emit(isa.VScalar("vmuls", r["t"], r["mean"], float(info.R), 1))
            bd.b.emit(isa.VConv(bd.acc[b], r["t"], 1, "trunc") if bd.acc[b].buf.dtype !=
                      r["t"].buf.dtype else isa.VUnary("vcopy", bd.acc[b], r["t"], 1))  # fmt: skip
            bd.b.emit(isa.VUnary("vcopy", bd.acc[j], r["M2"], 1))
    for i in info.reduces:
        rv[i] = bd.finish_reduce(i)
    row_loads = {i: isa.Ref(queues[("in", op.arg)], 0) for i, op in enumerate(expr)
                 if op.op == "load" and info.row_input[op.arg]}  # fmt: skip
    rv.update(row_loads)
    full_res = [r for r, rw in zip(ir.results, ir.row_outputs) if not rw]
    row_res = [r for r, rw in zip(ir.results, ir.row_outputs) if rw]
    need2 = _ancestors(expr, full_res + row_res, set(rv))
    row_ops = [i for i in need2 if info.lvl[i] == "row" and expr[i].op != "load"]
    bd.emit(bd.order(set(row_ops)), rv, {}, everything)
    for j, (r, rw) in enumerate(zip(ir.results, ir.row_outputs)):
        if rw:
            v = rv[r] if r in rv else None
            if v is None or info.lvl[r] == "full":
                raise NotImplementedError("row kernel: a per-row output computed per element")
            bd.to_dest(v, out_refs[j], True, "row")
    between = bd.take()
    # ---- pass 2: per-element outputs, chunk by chunk
    vals2 = leaves()
    vals2.update(rv)
    dests = {}
    for j, (r, rw) in enumerate(zip(ir.results, ir.row_outputs)):
        if not rw and info.lvl[r] == "full" and expr[r].op != "load" and r not in dests:
            dests[r] = out_refs[j]
    full_ops = [i for i in _ancestors(expr, full_res, set(vals2))]
    # the row values (rv) are computed once, between the passes: every chunk reads them, so
    # none may be freed (its tile reused) by the first chunk's last use
    bd.emit(bd.order(set(full_ops)), vals2, dests, set(ir.results) | set(rv))
    for j, (r, rw) in enumerate(zip(ir.results, ir.row_outputs)):
        if not rw and vals2[r] != out_refs[j]:
            bd.to_dest(vals2[r], out_refs[j], False, info.lvl[r] if r not in rv else "row")
    pass2 = bd.take()
    return bd, queues, init, pass1, between, pass2


def _plan_online(ir, info, spec, name, args):
    plan = _online_plan(ir, info)
    n_in = len(ir.inputs)
    R = info.R

    def bytes_at(t: int) -> int:
        bd, queues, *_ = _online_parts(ir, info, plan, t, isa.Var("pp"), isa.Var("nc"))
        return C.buffers_bytes(spec, [*queues.values(), *bd.buffers()])

    chunk = C.fit_tile(spec, bytes_at, cap=R)
    nch = C.ceil_div(R, chunk)
    items = isa.mul(info.dynamic[0], C.prod(info.kshape[1:]))
    it, c, pp, nc = (isa.Var(n) for n in ("it", "c", "pp", "nc"))
    bd, queues, init, pass1, between, pass2 = _online_parts(ir, info, plan, chunk, pp, nc)
    k_idx = C.unravel(it, info.kshape)
    half = isa.mul(pp, chunk)

    def chunk_loop(compute: list, write: bool) -> isa.Loop:
        c0 = isa.mul(c, chunk)
        # per-chunk accumulator resets go first, so the copy-in fuses with the compute
        pre = []
        while compute and isinstance(compute[0], isa.VDup) and compute[0].n == 1:
            pre.append(compute[0])
            compute = compute[1:]
        body = [isa.Let(pp, isa.mod(c, 2)), isa.Let(nc, _count(R, chunk, c)), *pre,
                isa.WaitFlag("V", "MTE2", pp)]  # fmt: skip
        for (side, k), buf in queues.items():
            if side != "in" or info.row_input[k]:
                continue
            v, ks = ir.inputs[k], info.in_kstr[k]
            rs = info.rstride[("in", k)]
            off = isa.add(C.dot(k_idx, ks, v.offset), isa.mul(c0, rs))
            body.append(isa.CopyIn(isa.Ref(buf, half), isa.Ref(args[k], off), (nc,), (rs,)))
        body += [isa.SetFlag("MTE2", "V", pp), isa.WaitFlag("MTE2", "V", pp),
                 isa.WaitFlag("MTE3", "V", pp), *compute, isa.SetFlag("V", "MTE2", pp),
                 isa.SetFlag("V", "MTE3", pp), isa.WaitFlag("V", "MTE3", pp)]  # fmt: skip
        if write:
            body += _copy_outs(ir, info, args, queues, k_idx[:-1], k_idx[-1], 1, 1, half, 0, R,
                               n_in, col0=c0, ncols=nc)  # fmt: skip
        body.append(isa.SetFlag("MTE3", "V", pp))
        return isa.Loop(c, 0, nch, 1, tuple(body))

    row = [*init]
    for (side, k), buf in queues.items():  # per-row inputs: once per row
        if side == "in" and info.row_input[k]:
            v, ks = ir.inputs[k], info.in_kstr[k]
            row += [isa.CopyIn(isa.Ref(buf, 0), isa.Ref(args[k], C.dot(k_idx, ks, v.offset)),
                               (1,), (1,)),
                    isa.SetFlag("MTE2", "V", 2), isa.WaitFlag("MTE2", "V", 2)]  # fmt: skip
    row.append(chunk_loop(pass1, False))
    row += between
    row.append(chunk_loop(pass2, True))
    outs = []
    for j, v in enumerate(ir.outputs):
        if ir.row_outputs[j]:
            ks = info.out_kstr[j]
            outs.append(isa.CopyOut(isa.Ref(args[n_in + j], C.dot(k_idx, ks, v.offset)),
                                    isa.Ref(queues[("out", j)], 0), (1,), (1,)))  # fmt: skip
    if outs:
        row += [isa.SetFlag("V", "MTE3", 2), isa.WaitFlag("V", "MTE3", 2), *outs,
                isa.SetFlag("MTE3", "V", 2), isa.WaitFlag("MTE3", "V", 2)]  # fmt: skip
    start, stop, lets = C.block_range(items)
    body = [*info.pre, *lets, *bd.hoisted(), *C.pipeline_flags_prologue(),
            isa.Loop(it, start, stop, 1, tuple(row)), *C.pipeline_flags_epilogue()]  # fmt: skip
    blocks = C.device_blocks(spec, C.prod(info.kshape))
    prog = isa.Program(name, args, (*queues.values(), *bd.buffers()), tuple(body), blocks,
                       blocks)  # fmt: skip
    return prog, {"mode": "online", "chunk": chunk, "chunks": nch, "items": items,
                  "blocks": blocks}  # fmt: skip
