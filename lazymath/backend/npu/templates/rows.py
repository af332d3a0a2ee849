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
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from lazymath.backend.npu import isa
from lazymath.backend.npu.kernel_ir import DynamicRowKernel, RowKernel, SOp
from lazymath.backend.npu.templates import common as C
from lazymath.backend.npu.templates.reduce import identity

_VRED = {"sum": "vcadd", "prod": "vcmul", "max": "vcmax", "min": "vcmin"}
ROW_MIN = 256  # rows at least this long: one row per block (1-D loops that fuse)
MAX_BLOCK = 8192  # elements of a multi-row block (keeps blocks cache friendly and numerous)
_INPLACE_OK = C._INPLACE_OK


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


# ============================================================================= analysis


class _Info:
    """Levels, phases and geometry of a RowKernel."""

    def __init__(self, ir: RowKernel):
        self.ir = ir
        nd = len(ir.in_shape)
        self.axes = tuple(sorted({a % nd for a in ir.axes})) if nd else ()
        self.keep = [d for d in range(nd) if d not in self.axes]
        self.R = C.prod(ir.in_shape[a] for a in self.axes)
        self.K = C.prod(ir.in_shape[d] for d in self.keep)
        self.unsupported = ""
        expr = ir.expr
        # a load is row level when its view does not move along the reduced axes
        self.row_input = [
            self.R > 1 and all(v.strides[a] == 0 for a in self.axes if ir.in_shape[a] != 1)
            for v in ir.inputs
        ]
        lvl, phase = [], []
        for op in expr:
            if op.op == "load":
                lvl.append("row" if self.row_input[op.arg] else "full")
                phase.append(0)
            elif op.op == "const":
                lvl.append("const")
                phase.append(0)
            elif op.op == "reduce":
                lvl.append("row")
                phase.append(phase[op.srcs[0]] + 1)
            else:
                ls = {lvl[s] for s in op.srcs}
                lvl.append("full" if "full" in ls else "row")
                phase.append(max((phase[s] for s in op.srcs), default=0))
        self.lvl, self.phase = lvl, phase
        self.reduces = [i for i, op in enumerate(expr) if op.op == "reduce"]
        for j, (r, row) in enumerate(zip(ir.results, ir.row_outputs)):
            if row and lvl[r] == "full" and self.R != 1:
                self.unsupported = f"output {j} is per row but its value is per element"
        # geometry: the reduced axes must form one strided run in every per-element view
        full_views = [v for v, rw in zip(ir.inputs, self.row_input) if not rw]
        full_views += [v for v, rw in zip(ir.outputs, ir.row_outputs) if not rw]
        red = tuple(ir.in_shape[a] for a in self.axes)
        rshape, rstr = C.collapse(red, [tuple(v.strides[a] for a in self.axes) for v in full_views])
        if len(rshape) != 1:
            self.unsupported = "the reduced axes are not one strided run in every view"
        self.rstride = {}
        k = 0
        for i, rw in enumerate(self.row_input):
            if not rw:
                self.rstride[("in", i)] = rstr[k][0] if rstr else 0
                k += 1
        for j, rw in enumerate(ir.row_outputs):
            if not rw:
                self.rstride[("out", j)] = rstr[k][0] if rstr else 0
                k += 1
        kept = tuple(ir.in_shape[d] for d in self.keep)
        kviews = [tuple(v.strides[d] for d in self.keep) for v in ir.inputs]
        for v, rw in zip(ir.outputs, ir.row_outputs):
            kviews.append(_out_strides(v, self.keep, ir.in_shape) if rw else
                          tuple(v.strides[d] for d in self.keep))  # fmt: skip
        self.kshape, kstr = C.collapse(kept, kviews)
        # kshape with its leading extent at run time (a DynamicRowKernel: `_plan` sets it and
        # the get_value that reads the row count, `pre`)
        self.dynamic: tuple = self.kshape
        self.pre: list = []
        n_in = len(ir.inputs)
        self.in_kstr, self.out_kstr = kstr[:n_in], kstr[n_in:]


def _out_strides(v, keep, in_shape) -> tuple[int, ...]:
    if len(v.shape) == len(in_shape):  # keepdims-style view
        return tuple(v.strides[d] for d in keep)
    return tuple(v.strides)


# ============================================================================= emission


class _Emitter(C.ExprEmitter):
    """ExprEmitter whose constant tiles carry a prefix (two emitters share one program)."""

    def __init__(self, b, pool, n, prefix: str):
        super().__init__(b, pool, n)
        self.prefix = prefix

    def const_tile(self, value, dtype: str) -> isa.Ref:
        key = (repr(value), dtype)
        if key not in self.const_tiles:
            name = f"{self.prefix}c{len(self.const_tiles)}_{dtype}"
            buf = isa.Buffer(name, "UB", dtype, self.pool.tile)
            self.pool.buffers.append(buf)
            r = isa.Ref(buf, 0)
            self.hoisted.append(isa.VDup(r, value, self.pool.tile))
            self.const_tiles[key] = r
        return self.const_tiles[key]


def acc_dtype(op: SOp, src: SOp) -> str:
    """Internal accumulator of a reduce op: float16 sums in float32, float32 sums in float64,
    except a float32 sum of exp(...) (softmax's normalizer: positive terms, at most 1 after
    the max shift, so the vectorized loop's many float32 partial sums keep it within a few
    ulp; widening every term to float64 cost a third of softmax's time)."""
    if op.arg in ("sum", "prod"):
        if op.arg == "sum" and op.dtype == "float32" and src.op == "exp":
            return "float32"
        return {"float16": "float32", "float32": "float64"}.get(op.dtype, op.dtype)
    return src.dtype


class _Body:
    """Vector code for the expression over one block: full values are tiles of `rows` rows x
    `cols` elements, row values tiles of `rows` elements."""

    def __init__(self, ir: RowKernel, info: _Info, rows_t: int, cols_t: int, n_rows, n_cols):
        self.ir, self.info = ir, info
        self.rows_t, self.cols_t = rows_t, cols_t
        self.T = rows_t * cols_t
        self.b = isa.Builder(tile=self.T)
        self.pf = C.TilePool(self.T, "f")
        self.pr = C.TilePool(rows_t, "r")
        self.n_rows, self.n_cols = n_rows, n_cols
        self.n_full = n_cols if rows_t == 1 else isa.mul(n_rows, n_cols)
        self.n_row = 1 if rows_t == 1 else n_rows
        self.ef = _Emitter(self.b, self.pf, self.n_full, "f")
        self.er = _Emitter(self.b, self.pr, self.n_row, "r")
        self.extra: list[isa.Buffer] = []
        self.welford: dict[int, tuple[int, int]] = {}  # see `correct_welford`
        self.acc: dict[int, isa.Ref] = {}
        for i in info.reduces:
            op = ir.expr[i]
            dt = acc_dtype(op, ir.expr[op.srcs[0]])
            self.acc[i] = self._buf(f"acc{i}", dt, rows_t)

    def _buf(self, name: str, dtype: str, size: int) -> isa.Ref:
        r = isa.Ref(isa.Buffer(name, "UB", dtype, size), 0)
        self.extra.append(r.buf)
        return r

    def buffers(self) -> list[isa.Buffer]:
        return [*self.extra, *self.pf.buffers, *self.pr.buffers, *self.b.buffers]

    def hoisted(self) -> list:
        return [*self.ef.hoisted, *self.er.hoisted]

    def init_acc(self, which=None) -> list:
        out = []
        for i in self.info.reduces if which is None else which:
            op = self.ir.expr[i]
            out.append(isa.VDup(self.acc[i], identity(op.arg, self.acc[i].buf.dtype), self.rows_t))
        return out

    def take(self) -> list:
        body = list(self.b.body)
        self.b.body.clear()
        return body

    # ------------------------------------------------------------------ expression
    def order(self, wanted: set[int]) -> list[int]:
        """The ops in `wanted` in emission order: by phase, within a phase row ops, then
        per-element ops, then the reductions they close (each phase one fused loop)."""
        info, expr = self.info, self.ir.expr

        def key(i):
            if expr[i].op == "reduce":
                return (info.phase[expr[i].srcs[0]], 2, i)
            return (info.phase[i], 0 if info.lvl[i] == "row" else 1, i)

        return sorted(wanted, key=key)

    def emit(self, order: list[int], vals: dict, dests: dict, pinned: set[int],
             reduce_into: dict | None = None) -> None:  # fmt: skip
        """Emit `order` (op indices; loads/consts must already be in `vals`). `dests[i]` is a
        preferred destination tile of value i; `pinned` values are never freed; reductions
        fold into `reduce_into[i]` (default their accumulators) without conversion."""
        info, expr = self.info, self.ir.expr
        lvl = info.lvl
        last: dict[int, int] = {}
        brc_last: dict[int, int] = {}
        for pos, i in enumerate(order):
            for s in expr[i].srcs:
                last[s] = pos
                if lvl[s] == "row" and (lvl[i] == "full" or expr[i].op == "reduce"):
                    brc_last[s] = pos
        brc: dict[int, isa.Ref] = {}
        claimed: set[int] = set()
        for pos, i in enumerate(order):
            op = expr[i]
            if op.op in ("load", "const") or i in vals:
                continue
            full = lvl[i] == "full" or op.op == "reduce"
            rec = None
            if (op.op == "div" and lvl[i] == "full" and lvl[op.srcs[0]] == "full"
                    and lvl[op.srcs[1]] == "row" and op.dtype.startswith("float")
                    and isinstance(vals[op.srcs[1]], isa.Ref)):  # fmt: skip
                # x / row value = x * (1 / row value): one divide per row, not per element
                s1 = op.srcs[1]
                if ("rec", s1) not in brc:
                    r = self.pr.get(op.dtype)
                    self.b.emit(isa.VUnary("vrec", r, vals[s1], self.n_row))
                    t = self.pf.get(op.dtype)
                    self.b.emit(isa.VBrcb(t, r, self.n_cols, self.n_row))
                    self.pr.put(r)
                    brc[("rec", s1)] = t
                rec = brc[("rec", s1)]
                op = SOp("mul", op.dtype, op.srcs, op.arg)
            srcs = []
            for k, s in enumerate(op.srcs):
                if rec is not None and k == 1:
                    srcs.append(rec)
                    continue
                v = vals[s]
                if full and lvl[s] == "row" and not isinstance(v, C.Const):
                    if s not in brc:
                        brc[s] = self.pf.get(expr[s].dtype)
                        self.b.emit(isa.VBrcb(brc[s], v, self.n_cols, self.n_row))
                    v = brc[s]
                srcs.append(v)
            if op.op == "reduce":
                self._reduce(i, srcs[0], reduce_into, vals)
            else:
                em = self.ef if lvl[i] == "full" else self.er
                pool = em.pool
                dst = None
                if i in dests and i not in claimed:
                    dst = dests[i]
                    claimed.add(i)
                if dst is None and op.op in _INPLACE_OK:
                    for s in op.srcs:
                        v = vals[s]
                        if (last.get(s) == pos and s not in pinned and isinstance(v, isa.Ref)
                                and pool.owns(v) and v.buf.dtype == op.dtype
                                and v.buf.size == pool.tile):  # fmt: skip
                            dst = v
                            break
                if dst is None:
                    dst = pool.get(op.dtype)
                em.emit_op(op, dst, srcs, [expr[s].dtype for s in op.srcs])
                vals[i] = dst
            for s in set(op.srcs):
                v = vals[s]
                if last.get(s) == pos and s not in pinned and isinstance(v, isa.Ref) and \
                        v != vals[i]:  # fmt: skip
                    for p in (self.pf, self.pr):
                        if p.owns(v) and v not in (*self.ef.const_tiles.values(),
                                                   *self.er.const_tiles.values()):  # fmt: skip
                            p.put(v)
                if brc_last.get(s) == pos and s in brc:
                    self.pf.put(brc.pop(s))

    def _reduce(self, i: int, src, reduce_into, vals) -> None:
        expr = self.ir.expr
        op = expr[i]
        if isinstance(src, C.Const):
            src = self.ef.const_tile(src.value, expr[op.srcs[0]].dtype)
        acc = (reduce_into or {}).get(i, self.acc[i])
        rows = 1 if self.rows_t == 1 else self.n_rows
        self.b.emit(isa.VReduce(_VRED[op.arg], acc, src, self.n_cols, rows))
        if reduce_into is not None and i in reduce_into:
            vals[i] = acc
            return
        if i in self.welford:
            self.correct_welford(i, vals)
        vals[i] = self.finish_reduce(i)

    def correct_welford(self, j: int, vals) -> None:
        """acc_j = sum((G - a)^2) with a = the mean as the expression rounded it; subtract
        N (sum(G)/N - a)^2 (sum(G) from the wide accumulator) to get the squared deviations
        from the exact mean: as accurate as a two-pass variance with a float64 mean."""
        b, sh = self.welford[j]
        acc_b, acc_j = self.acc[b], self.acc[j]
        dt = acc_j.buf.dtype
        ta = self._buf(f"wa{j}", dt, self.rows_t)
        tm = self._buf(f"wm{j}", dt, self.rows_t)
        n, N = self.n_row, float(self.info.R)
        a = vals[sh]
        e = self.b.emit
        e(isa.VConv(ta, a, n, "trunc") if a.buf.dtype != dt else isa.VUnary("vcopy", ta, a, n))
        e(isa.VConv(tm, acc_b, n, "trunc") if acc_b.buf.dtype != dt else
          isa.VUnary("vcopy", tm, acc_b, n))  # fmt: skip
        e(isa.VScalar("vmuls", tm, tm, 1.0 / N, n))
        e(isa.VBinary("vsub", tm, tm, ta, n))
        e(isa.VBinary("vmul", tm, tm, tm, n))
        e(isa.VScalar("vmuls", tm, tm, N, n))
        e(isa.VBinary("vsub", acc_j, acc_j, tm, n))

    def finish_reduce(self, i: int) -> isa.Ref:
        op = self.ir.expr[i]
        acc = self.acc[i]
        if acc.buf.dtype == op.dtype:
            return acc
        conv = self.pr.get(op.dtype)
        self.b.emit(isa.VConv(conv, acc, self.n_row, "trunc"))
        return conv

    def to_dest(self, v, dst: isa.Ref, row_out: bool, src_lvl: str) -> None:
        """Copy a result value into its output tile."""
        if isinstance(v, C.Const):
            self.b.vdup(dst, v.value, self.n_row if row_out else self.n_full)
        elif row_out or src_lvl == "full":
            if v != dst:
                self.b.vcopy(dst, v, self.n_row if row_out and src_lvl != "full" else
                             (self.n_full if src_lvl == "full" else self.n_row))  # fmt: skip
        else:  # a per-row value written per element
            self.b.emit(isa.VBrcb(dst, v, self.n_cols, self.n_row))


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


def _copy_outs(ir, info, args, queues, k_idx, k0, rows_t, nr, half, rhalf, R, n_in,
               col0=0, ncols=None) -> list:  # fmt: skip
    out = []
    for j, v in enumerate(ir.outputs):
        buf = queues[("out", j)]
        ks = info.out_kstr[j]
        off = isa.add(C.dot(k_idx, ks[:-1], v.offset), isa.mul(k0, ks[-1]))
        dst_arg = args[n_in + j]
        if ir.row_outputs[j]:
            if ncols is not None:
                continue  # written after the row's last chunk
            out.append(isa.CopyOut(isa.Ref(dst_arg, off), isa.Ref(buf, rhalf),
                                   (nr if rows_t > 1 else 1,), (ks[-1],)))  # fmt: skip
            continue
        rs = info.rstride[("out", j)]
        if rows_t == 1:
            off = isa.add(off, isa.mul(col0, rs))
            out.append(isa.CopyOut(isa.Ref(dst_arg, off), isa.Ref(buf, half),
                                   (R if ncols is None else ncols,), (rs,)))  # fmt: skip
        else:
            out.append(isa.CopyOut(isa.Ref(dst_arg, off), isa.Ref(buf, half), (nr, R),
                                   (ks[-1], rs)))  # fmt: skip
    return out


def _split(index, n_chunks: int, outer: tuple[int, ...]):
    if n_chunks == 1:
        return (C.unravel(index, outer) if outer else []), 0
    if not outer:
        return [], index
    return C.unravel(isa.floordiv(index, n_chunks), outer), isa.mod(index, n_chunks)


def _count(extent: isa.IntExpr, step: int, chunk) -> isa.IntExpr:
    if step == 1 or (isinstance(extent, int) and extent % step == 0):
        return step
    return isa.imin(step, isa.sub(extent, isa.mul(chunk, step)))


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
