"""The row template's analysis and emission, shared by its forms (issue 36 split them out of
`rows`, by what they hold): `_Info` (levels, phases and geometry of a RowKernel), `_Body` (the
vector code of one block: phases, reductions, Welford corrections, the write to a destination)
and the block geometry helpers (`_split`, `_count`, `_copy_outs`). The forms themselves are in
`rows` (row-resident, software-pipelined) and `rows_online` (online two-pass).
"""

from __future__ import annotations

from lazymath.backend.npu import isa
from lazymath.backend.npu.kernel_ir import RowKernel, SOp
from lazymath.backend.npu.templates import common as C
from lazymath.backend.npu.templates.reduce import identity

_VRED = {"sum": "vcadd", "prod": "vcmul", "max": "vcmax", "min": "vcmin"}
_INPLACE_OK = C._INPLACE_OK


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
