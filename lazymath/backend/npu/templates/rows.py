"""Row template: RowKernel -> isa.Program (softmax, log_softmax, layernorm, var/std, ...).

A RowKernel is reductions over the same axes plus the elementwise ops that consume their
results broadcast back over the rows (see `kernel_ir.RowKernel`). Two forms:

- **row-resident** (the block of rows fits UB with double-buffered queues): a block of
  `rows_t` rows is copied GM -> UB once, then the expression runs in phases, each phase the
  elementwise ops whose reductions are complete followed by the reductions they feed
  (WholeReduce `VReduce`); a row's reduction result reaches the row's elements through `VBrcb`.
  Outputs are copied UB -> GM once. With one row per block every phase is one fused loop over
  the row (copy-in + prologue + reduce, then ... + copy-out), the broadcast a register.
  Rows of >= ROW_MIN elements are software-pipelined when the ring fits UB (`_plan_pipelined`):
  step s runs phase p of row s - p for every p, each row's buffers in a ring slot, so on the
  device MTE2, Vector and MTE3 work on different rows at once and on the host the phases of
  three rows are one loop (memory traffic overlapping the exp).
- **online two-pass** (a row is wider than UB): pass 1 streams the row through UB in chunks and
  folds every reduction; a reduction that needs an earlier one (the sum of exp(x - max) of a
  softmax, the sum of squared deviations of a variance) is computed per chunk against the
  chunk's own statistic and merged: running max + rescaled sum for softmax, Chan/Welford for
  mean + M2. Pass 2 streams the row again and computes the outputs. The input is read twice.

`choose(ir, spec)` says which form applies and why (the fusion layer logs it, and refuses to
fuse when neither does). Accumulation as in the reduce template: float16 sums in float32,
float32 sums in float64.

This module holds the two resident forms and the choice; the analysis and emission they share
with the online form are in `rows_emit`, the online form in `rows_online` (issue 36 split them
out of this module, by what they hold).
"""

from __future__ import annotations

from dataclasses import replace

from lazymath.backend.npu import isa
from lazymath.backend.npu.kernel_ir import DynamicRowKernel, RowKernel, SOp
from lazymath.backend.npu.templates import common as C
from lazymath.backend.npu.templates.rows_emit import _Body, _copy_outs, _count, _Info, _split
from lazymath.backend.npu.templates.rows_online import _online_plan, _plan_online

ROW_MIN = 256  # rows at least this long: one row per block (1-D loops that fuse)
MAX_BLOCK = 8192  # elements of a multi-row block (keeps blocks cache friendly and numerous)


def tiling(ir: RowKernel, spec) -> dict:
    return _plan(ir, spec, "k")[1]


def build(ir: RowKernel, spec, name: str) -> isa.Program:
    return _plan(ir, spec, name)[0].check(spec)


def choose(ir: RowKernel, spec) -> tuple[str | None, str]:
    """("resident" | "online" | None, why) for `ir` on `spec`."""
    info = _Info(ir)
    if info.unsupported:
        return None, info.unsupported
    nb = _resident_bytes(ir, info, spec, 1)
    ub = spec.ub_bytes
    if nb <= ub:
        rt = _rows_per_block(ir, info, spec)
        piped = _plan_pipelined(ir, info, spec, "k", _args(ir)) if rt == 1 and PIPELINE else None
        if piped is not None:
            prog, t = piped
            need = prog.scope_bytes(spec).get("UB", 0)
            return "resident", (
                f"row-resident, software-pipelined over {t['pipelined']} rows (one row per "
                f"stage, a ring of {t['slots']} row buffers per UB buffer): a row of "
                f"{info.R} elements needs {need // 1024} KiB of UB (UB {ub // 1024} KiB); "
                "input read once"
            )
        return "resident", (
            f"row-resident: a block of {rt} row(s) x {info.R} elements needs "
            f"{_resident_bytes(ir, info, spec, rt) // 1024} KiB of UB with double-buffered "
            f"queues (UB {ub // 1024} KiB); input read once"
        )
    why = f"a row of {info.R} elements needs {nb // 1024} KiB of UB > {ub // 1024} KiB"
    plan = _online_plan(ir, info)
    if isinstance(plan, str):
        return None, f"{why}, and no online form: {plan}"
    kinds = sorted({p[0] for p in plan.pairs.values()}) or ["plain"]
    return "online", (
        f"online two-pass ({', '.join(kinds)}): {why}; the row streams through UB in chunks "
        "twice (reductions, then outputs)"
    )


# ============================================================================= resident


def _resident_parts(ir: RowKernel, info: _Info, rows_t: int, pp, n_rows):
    """(body, queues, emitted compute, hoisted) of the resident form for one block."""
    R = info.R
    bd = _Body(ir, info, rows_t, R, n_rows, R)
    plan = _online_plan(ir, info)
    pinned = set(ir.results)
    if not isinstance(plan, str):
        for j, (kind_, b, sh) in plan.pairs.items():
            if kind_ == "welford" and isinstance(ir.expr[sh], SOp):
                bd.welford[j] = (b, sh)
                pinned.add(sh)
    T = bd.T
    half, rhalf = isa.mul(pp, T), isa.mul(pp, rows_t)
    queues: dict = {}
    vals: dict = {}
    used = sorted({op.arg for op in ir.expr if op.op == "load"})
    for k in used:
        rw = info.row_input[k]
        buf = isa.Buffer(f"in{k}_tile", "UB", ir.inputs[k].dtype, 2 * (rows_t if rw else T))
        queues[("in", k)] = buf
    dests: dict = {}
    out_refs = {}
    for j, v in enumerate(ir.outputs):
        rw = ir.row_outputs[j]
        buf = isa.Buffer(f"out{j}_tile", "UB", v.dtype, 2 * (rows_t if rw else T))
        queues[("out", j)] = buf
        out_refs[j] = isa.Ref(buf, rhalf if rw else half)
    for i, op in enumerate(ir.expr):
        if op.op == "load":
            vals[i] = isa.Ref(queues[("in", op.arg)], rhalf if info.row_input[op.arg] else half)
        elif op.op == "const":
            vals[i] = C.Const(op.arg, op.dtype)
    # a result computed by an op goes straight to its output tile when the levels agree
    for j, r in enumerate(ir.results):
        op = ir.expr[r]
        same = (info.lvl[r] == "row") == ir.row_outputs[j]
        if op.op not in ("load", "const", "reduce") and same and r not in dests:
            dests[r] = out_refs[j]
    wanted = {i for i, op in enumerate(ir.expr) if op.op not in ("load", "const")}
    order = bd.order(wanted)
    bd.emit(order, vals, dests, pinned)
    for j, r in enumerate(ir.results):
        v = vals[r]
        if dests.get(r) is out_refs[j] and v == out_refs[j]:
            continue
        bd.to_dest(v, out_refs[j], ir.row_outputs[j], info.lvl[r])
    return bd, queues, bd.take()


def _resident_bytes(ir, info, spec, rows_t: int) -> int:
    bd, queues, _ = _resident_parts(ir, info, rows_t, isa.Var("pp"), isa.Var("n_rows"))
    return C.buffers_bytes(spec, [*queues.values(), *bd.buffers()])


def _rows_per_block(ir, info, spec) -> int:
    Ki = info.kshape[-1]
    if info.R >= ROW_MIN or Ki == 1:
        return 1
    cap = max(1, min(Ki, MAX_BLOCK // max(info.R, 1)))
    b1 = _resident_bytes(ir, info, spec, 1)
    b2 = _resident_bytes(ir, info, spec, 2)
    slope = max(b2 - b1, 1)
    rt = max(1, min(cap, 1 + (spec.ub_bytes - b1) // slope))
    while rt > 1 and _resident_bytes(ir, info, spec, rt) > spec.ub_bytes:
        rt = max(1, int(rt * 0.9))
    return rt


def _args(ir: RowKernel):
    n_in = len(ir.inputs)
    names = [f"in{k}" for k in range(n_in)] + [f"out{j}" for j in range(len(ir.outputs))]
    return C.gm_args((*ir.inputs, *ir.outputs), names)


def _plan(ir: RowKernel, spec, name: str):
    info = _Info(ir)
    n_in = len(ir.inputs)
    args = _args(ir)
    if info.K == 0:
        return isa.Program(name, args, (), (), 1, 1), {"mode": "empty"}
    if info.R == 0:
        raise ValueError("row kernel over an empty row")
    if info.unsupported:
        raise NotImplementedError(f"row kernel: {info.unsupported}")
    mode, _ = choose(ir, spec)
    if isinstance(ir, DynamicRowKernel):  # the row count is read at run time (tiling word)
        if 0 in info.axes or ir.in_shape[0] < 2:
            raise ValueError(f"a dynamic row kernel keeps its leading dim of at least 2 rows "
                             f"(the most it serves), got in_shape {ir.in_shape} axes "
                             f"{ir.axes}")  # fmt: skip
        args, rows, get = C.runtime_rows(args, ir.in_shape[0])
        info.dynamic = (C.runtime_lead(rows, info.kshape[0], ir.in_shape[0]), *info.kshape[1:])
        info.pre = [get]
    if mode == "online":
        return _plan_online(ir, info, spec, name, args)
    if mode is None:
        raise NotImplementedError("row kernel: the row does not fit UB and has no online form")
    rows_t = _rows_per_block(ir, info, spec)
    if rows_t == 1 and PIPELINE:
        piped = _plan_pipelined(ir, info, spec, name, args)
        if piped is not None:
            return piped
    Ki, k_outer = info.kshape[-1], info.kshape[:-1]
    n_kch = C.ceil_div(Ki, rows_t)
    blocks = C.device_blocks(spec, C.prod(k_outer) * n_kch)  # (the bound's, if dynamic)
    Ki, k_outer = info.dynamic[-1], info.dynamic[:-1]
    if not k_outer:  # (the leading dim is the chunked one: at run time, chunks and tail follow)
        n_kch = isa.ceildiv(Ki, rows_t)
    items = isa.mul(k_outer[0], C.prod(k_outer[1:]) * n_kch) if k_outer else n_kch
    it, pp, nr = isa.Var("it"), isa.Var("pp"), isa.Var("n_rows")
    bd, queues, compute = _resident_parts(ir, info, rows_t, pp, nr)
    T = bd.T
    k_idx, kc = _split(it, n_kch, k_outer)
    k0 = isa.mul(kc, rows_t)
    k_cnt = _count(Ki, rows_t, kc)
    half, rhalf = isa.mul(pp, T), isa.mul(pp, rows_t)
    R = info.R
    loop = [isa.Let(pp, isa.mod(it, 2))]
    if rows_t > 1:
        loop.append(isa.Let(nr, k_cnt))
    loop += bd.init_acc()
    loop.append(isa.WaitFlag("V", "MTE2", pp))
    for (side, k), buf in queues.items():
        if side != "in":
            continue
        v, ks = ir.inputs[k], info.in_kstr[k]
        off = isa.add(C.dot(k_idx, ks[:-1], v.offset), isa.mul(k0, ks[-1]))
        if info.row_input[k]:
            loop.append(isa.CopyIn(isa.Ref(buf, rhalf), isa.Ref(args[k], off), (nr if rows_t > 1
                                   else 1,), (ks[-1],)))  # fmt: skip
        elif rows_t == 1:
            loop.append(isa.CopyIn(isa.Ref(buf, half), isa.Ref(args[k], off), (R,),
                                   (info.rstride[("in", k)],)))  # fmt: skip
        else:
            loop.append(isa.CopyIn(isa.Ref(buf, half), isa.Ref(args[k], off), (nr, R),
                                   (ks[-1], info.rstride[("in", k)])))  # fmt: skip
    loop += [isa.SetFlag("MTE2", "V", pp), isa.WaitFlag("MTE2", "V", pp),
             isa.WaitFlag("MTE3", "V", pp)]  # fmt: skip
    loop += compute
    loop += [isa.SetFlag("V", "MTE2", pp), isa.SetFlag("V", "MTE3", pp),
             isa.WaitFlag("V", "MTE3", pp)]  # fmt: skip
    loop += _copy_outs(ir, info, args, queues, k_idx, k0, rows_t, nr, half, rhalf, R, n_in)
    loop.append(isa.SetFlag("MTE3", "V", pp))
    start, stop, lets = C.block_range(items)
    body = [*info.pre, *lets, *bd.hoisted(), *C.pipeline_flags_prologue(),
            isa.Loop(it, start, stop, 1, tuple(loop)), *C.pipeline_flags_epilogue()]  # fmt: skip
    prog = isa.Program(name, args, (*queues.values(), *bd.buffers()), tuple(body), blocks,
                       blocks)  # fmt: skip
    return prog, {"mode": "resident", "rows_t": rows_t, "items": items, "blocks": blocks}


# ============================================================================= pipelined


PIPELINE = True  # software-pipeline one-row blocks across rows when the ring fits UB


def _stages(compute: list, R: int) -> list[list] | None:
    """One row's compute split at its reductions: stage p runs after the p-th group of
    reductions closed (stage 0 reads the input, the last one writes the outputs). None when
    an instruction is not a plain vector instruction (loops, library calls)."""
    stages: list[list] = [[]]
    after_reduce = False
    for ins in compute:
        if isinstance(ins, (isa.Loop, isa.If, isa.Let)) or not hasattr(ins, "n"):
            return None
        if isinstance(ins, isa.VReduce):
            if ins.n != R or ins.rows != 1:
                return None
            after_reduce = True
        elif after_reduce:
            stages.append([])
            after_reduce = False
        stages[-1].append(ins)
    if after_reduce:
        stages.append([])
    return stages


def _remap(ins, ring: dict, slot):
    """`ins` with every ringed UB ref moved to `slot` of its ring."""
    changes = {}
    for f in ins.__dataclass_fields__:
        v = getattr(ins, f)
        if isinstance(v, isa.Ref) and v.buf.name in ring:
            buf, size = ring[v.buf.name]
            changes[f] = isa.Ref(buf, isa.add(v.off, isa.mul(slot, size)))
        elif isinstance(v, tuple) and any(isinstance(x, isa.Ref) for x in v):
            out = []
            for x in v:
                if isinstance(x, isa.Ref) and x.buf.name in ring:
                    buf, size = ring[x.buf.name]
                    x = isa.Ref(buf, isa.add(x.off, isa.mul(slot, size)))
                out.append(x)
            changes[f] = tuple(out)
    return replace(ins, **changes) if changes else ins


def _plan_pipelined(ir: RowKernel, info: _Info, spec, name: str, args):
    """Resident form with one row per step, software-pipelined across rows (AscendC's queues
    with depth P): step s runs stage p of row s - p for every p, each row's UB buffers in slot
    (row % P) of a ring. On the device MTE2 brings row s in while the Vector unit works on rows
    s-1.. and MTE3 writes row s-P+1 out; on the host the stages' loops over the row are one
    fused loop (reads of GM, exp, writes of GM interleaved), where the three separate loops of
    the unpipelined form leave memory idle during the compute. None when the kernel does not
    qualify (per-row inputs, outputs written before the last stage, chains deeper than the
    pipe pair's event ids) or the ring does not fit UB: the caller builds the plain form."""
    R = info.R
    if R < ROW_MIN or any(info.row_input):
        return None
    bd, queues, compute = _resident_parts(ir, info, 1, 0, isa.Var("n_rows"))
    stages = _stages(compute, R)
    if stages is None:
        return None
    P = len(stages)
    if P < 2 or P > spec.event_ids_per_pipe_pair:
        return None
    out_names = {queues[("out", j)].name for j in range(len(ir.outputs))}
    for st in stages[:-1]:
        if any(r.buf.name in out_names for ins in st for r in isa.refs_of(ins)):
            return None
    rows_out = set(ir.row_outputs)
    if len(rows_out) != 1:
        return None
    row_outputs = ir.row_outputs[0]
    consts = {r.buf.name for r in (*bd.ef.const_tiles.values(), *bd.er.const_tiles.values())}
    # a full input that does not move along the kept axes (layernorm's gamma) is the same
    # for every row: copied into UB once, before the rows
    invariant = [k for (side, k) in queues if side == "in" and not any(info.in_kstr[k])]
    inits = bd.init_acc()

    def elem(ins) -> bool:
        return isinstance(ins.n, int) and ins.n == R

    # Q = P - 1 slots suffice: the rows sharing a slot in a step are s (stage 0) and s - P + 1
    # (stage P-1), whose accesses come first in program order (row parts and element parts
    # both run from stage P-1 down) -- unless stage 0's row part (accumulator resets) writes
    # a buffer stage P-1's element part still reads. Fewer slots: less UB (the 910B fits a
    # 4096-float softmax) and a smaller host working set.
    w0 = {i.dst.buf.name for i in [*inits, *(i for i in stages[0] if not elem(i))]}
    last = {r.buf.name for i in stages[-1] if elem(i) for r in isa.refs_of(i)}
    Q = P - 1 if P >= 3 and not (w0 & last) else P
    ring: dict = {}
    for (side, k), buf in queues.items():
        size = buf.size // 2
        if side == "in" and k in invariant:  # size 0: every slot is the same window
            ring[buf.name] = (isa.Buffer(buf.name, "UB", buf.dtype, size), 0)
            continue
        ring[buf.name] = (isa.Buffer(buf.name, "UB", buf.dtype, Q * size), size)
    for buf in bd.buffers():
        if buf.name not in consts:
            ring[buf.name] = (isa.Buffer(buf.name, "UB", buf.dtype, Q * buf.size), buf.size)
    rqueues = {k: ring[b.name][0] for k, b in queues.items()}
    buffers = [ring[b.name][0] if b.name in ring else b for b in (*queues.values(), *bd.buffers())]
    if C.buffers_bytes(spec, buffers) > spec.ub_bytes:
        return None
    n_in = len(ir.inputs)
    Ki, k_outer = info.dynamic[-1], info.dynamic[:-1]

    def stage(p: int, s) -> tuple[list, list]:
        """(row part, element part) of stage p in step s (row s - p)."""
        slot = isa.mod(isa.add(s, (Q - p % Q) % Q), Q)
        row = isa.sub(s, p)
        k_idx, kc = _split(row, Ki, k_outer)
        rowp = [_remap(i, ring, slot) for i in stages[p] if not elem(i)]
        elp = [_remap(i, ring, slot) for i in stages[p] if elem(i)]
        if p == 0:
            rowp = [_remap(i, ring, slot) for i in inits] + rowp
            ins = [isa.WaitFlag("V", "MTE2", slot)]
            for (side, k), buf in rqueues.items():
                if side == "in" and k not in invariant:
                    v, ks = ir.inputs[k], info.in_kstr[k]
                    off = isa.add(C.dot(k_idx, ks[:-1], v.offset), isa.mul(kc, ks[-1]))
                    ins.append(isa.CopyIn(isa.Ref(buf, isa.mul(slot, R)), isa.Ref(args[k], off),
                                          (R,), (info.rstride[("in", k)],)))  # fmt: skip
            ins += [isa.SetFlag("MTE2", "V", slot), isa.WaitFlag("MTE2", "V", slot)]
            elp = ins + elp
        if p == P - 1:
            outs = _copy_outs(ir, info, args, rqueues, k_idx, kc, 1, 1, isa.mul(slot, R), slot,
                              R, n_in)  # fmt: skip
            pre = [isa.WaitFlag("MTE3", "V", slot)]
            post = [isa.SetFlag("V", "MTE3", slot), isa.WaitFlag("V", "MTE3", slot), *outs,
                    isa.SetFlag("MTE3", "V", slot), isa.SetFlag("V", "MTE2", slot)]  # fmt: skip
            if row_outputs:
                rowp = pre + rowp + post
            else:
                elp = pre + elp + post
        return rowp, elp

    def step(s, guarded: bool) -> tuple:
        parts = [stage(p, s) for p in range(P - 1, -1, -1)]
        if not guarded:
            return tuple([i for rp, _ in parts for i in rp] + [i for _, ep in parts for i in ep])
        body = []
        for p, (rp, ep) in zip(range(P - 1, -1, -1), parts):
            row = isa.sub(s, p)
            body.append(isa.If(row, ">=", start, (isa.If(row, "<", stop, tuple(rp + ep)),)))
        return tuple(body)

    items = isa.mul(info.dynamic[0], C.prod(info.kshape[1:]))
    start, stop, lets = C.block_range(items)
    s0, s1, s2 = isa.Var("s_head"), isa.Var("s"), isa.Var("s_tail")
    warm = isa.add(start, P - 1)
    loops = [
        isa.Loop(s0, start, isa.imin(warm, isa.add(stop, P - 1)), 1, step(s0, True)),
        isa.Loop(s1, warm, stop, 1, step(s1, False)),
        isa.Loop(s2, isa.imax(stop, warm), isa.add(stop, P - 1), 1, step(s2, True)),
    ]
    pro = [isa.SetFlag("V", "MTE2", q) for q in range(Q)]
    pro += [isa.SetFlag("MTE3", "V", q) for q in range(Q)]
    epi = [isa.WaitFlag("V", "MTE2", q) for q in range(Q)]
    epi += [isa.WaitFlag("MTE3", "V", q) for q in range(Q)]
    once = []
    for k in invariant:
        v = ir.inputs[k]
        once.append(isa.CopyIn(isa.Ref(rqueues[("in", k)], 0), isa.Ref(args[k], v.offset), (R,),
                               (info.rstride[("in", k)],)))  # fmt: skip
    if once:
        once = [*once, isa.SetFlag("MTE2", "V", 0), isa.WaitFlag("MTE2", "V", 0)]
    body = [*info.pre, *lets, *bd.hoisted(), *once, *pro, *loops, *epi]
    blocks = C.device_blocks(spec, C.prod(info.kshape))
    prog = isa.Program(name, args, tuple(buffers), tuple(body), blocks, blocks)
    return prog, {"mode": "resident", "rows_t": 1, "items": items, "blocks": blocks,
                  "pipelined": P, "slots": Q}  # fmt: skip
