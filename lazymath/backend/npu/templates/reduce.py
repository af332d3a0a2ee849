"""Reduce template: ReduceKernel -> isa.Program.

The iteration space is split into kept dims K (one output element each) and reduced dims R;
each side is collapsed separately (contiguous runs merge; the flat C-order index over the
reduced axes, which argmax/argmin return, is preserved by merging). One of two tilings is
chosen by which side is contiguous in memory for the main input:

- "inner" (R innermost, e.g. sum over the last axis or over everything): a tile is
  (rows of K) x (cols of R); each step runs the prologue on the tile and reduces every row with
  one WholeReduce instruction (`VReduce` with rows) / `VArgReduce` into an accumulator tile.
- "outer" (K innermost, e.g. sum over axis 0 of a C-contiguous matrix): a tile is
  (rows of R) x (cols of K); each row of the tile is folded into an accumulator tile with a
  plain vector op (vadd/vmax/...), argmax with compare + select.

Work items are output tiles, split over blocks GetBlockIdx/GetBlockNum style; for each item
the reduction steps stream input tiles through a double-buffered queue, then the epilogue runs
on the accumulator tile and the results are copied out.

Accumulation: float16 sums/products accumulate in float32 and float32 ones in float64 (the
host has it; the result is then at least as accurate as numpy's pairwise sum), ints in the
kernel's acc_dtype. max/min propagate NaN; argmax/argmin keep the first occurrence and return
the first NaN, like numpy.
"""

from __future__ import annotations

import numpy as np

from lazymath.backend.npu import isa
from lazymath.backend.npu.kernel_ir import DynamicReduceKernel, ReduceKernel
from lazymath.backend.npu.templates import common as C
from lazymath.graph.ops import OPS, REDUCE_OPS, ReduceInstr

# sum/prod/max/min: the tile reduction and the merge of partials, from the op records
_VRED = {k: OPS[k].lowering.instr for k in REDUCE_OPS if OPS[k].lowering.combine}
_VBIN = {k: OPS[k].lowering.combine for k in REDUCE_OPS if OPS[k].lowering.combine}
assert all(isinstance(OPS[k].lowering, ReduceInstr) for k in REDUCE_OPS)
SPLIT_MAX_OUT = 1024  # outputs: up to this many, a long reduction is split over blocks


def tiling(ir: ReduceKernel, spec) -> dict:
    return _plan(ir, spec, "k")[1]


def build(ir: ReduceKernel, spec, name: str) -> isa.Program:
    return _plan(ir, spec, name)[0].check(spec)


def internal_acc_dtype(ir: ReduceKernel, mode: str = "inner") -> str:
    """float16 accumulates in float32; float32 in float64 along a contiguous reduced axis
    ("inner": numpy sums those pairwise, a wider accumulator keeps us at least as accurate);
    across rows ("outer") numpy accumulates in float32 row by row, and so do we."""
    if ir.op in ("sum", "prod"):
        wide = {"float16": "float32", "float32": "float64" if mode == "inner" else "float32"}
        return wide.get(ir.acc_dtype, ir.acc_dtype)
    if ir.op in ("argmax", "argmin"):
        return ir.prologue[ir.prologue_result].dtype
    return ir.acc_dtype


def identity(op: str, dtype: str):
    k = np.dtype(dtype).kind
    if op == "sum":
        return False if k == "b" else 0
    if op == "prod":
        return True if k == "b" else 1
    big = op in ("max", "argmax")
    if k == "f":
        return float("-inf") if big else float("inf")
    if k == "b":
        return not big
    info = np.iinfo(dtype)
    return int(info.min) if big else int(info.max)


def _plan(ir: ReduceKernel, spec, name: str):
    n_in, n_epi = len(ir.inputs), len(ir.epi_inputs)
    views = (*ir.inputs, *ir.epi_inputs, *ir.outputs)
    names = ([f"in{k}" for k in range(n_in)] + [f"epi{k}" for k in range(n_epi)]
             + [f"out{j}" for j in range(len(ir.outputs))])  # fmt: skip
    args = C.gm_args(views, names)
    axes = tuple(sorted({a % len(ir.in_shape) for a in ir.axes})) if ir.in_shape else ()
    keep = [d for d in range(len(ir.in_shape)) if d not in axes]
    out_size = C.prod(ir.out_shape)
    red_size = C.prod(ir.in_shape[d] for d in axes)
    if ir.op not in REDUCE_OPS:
        raise NotImplementedError(f"reduce op {ir.op!r}")
    if out_size == 0:
        return isa.Program(name, args, (), (), 1, 1), {"mode": "empty"}
    if red_size == 0 and ir.op not in ("sum", "prod"):
        raise ValueError(f"zero-size reduction for {ir.op}, which has no identity")
    if C.prod(ir.in_shape[d] for d in keep) != out_size:
        raise ValueError(f"out_shape {ir.out_shape} does not match in_shape {ir.in_shape} - axes")
    dynamic = isinstance(ir, DynamicReduceKernel)
    if dynamic and (0 in axes or ir.in_shape[0] < 2):
        raise ValueError(f"a dynamic reduce kernel keeps its leading dim of at least 2 rows (the "
                         f"most it serves), got in_shape {ir.in_shape} axes {ir.axes}")  # fmt: skip
    # collapse kept dims (inputs' kept strides + the out views' strides) and reduced dims
    kshape, kstr = C.collapse(
        tuple(ir.in_shape[d] for d in keep),
        [tuple(v.strides[d] for d in keep) for v in ir.inputs]
        + [_out_strides(v, ir.out_shape, keep, ir.in_shape) for v in (*ir.epi_inputs, *ir.outputs)],
    )
    rshape, rstr = C.collapse(
        tuple(ir.in_shape[d] for d in axes), [tuple(v.strides[d] for d in axes) for v in ir.inputs]
    )
    if red_size == 0:
        rshape, rstr = (0,), [(0,) for _ in ir.inputs]
    in_kstr, out_kstr = kstr[:n_in], kstr[n_in:]
    mode = _choose_mode(ir, kshape, in_kstr, rstr, out_size)
    used = sorted({op.arg for op in ir.prologue if op.op == "load"})
    used_epi = sorted({op.arg for op in ir.epilogue if op.op == "load"})
    total = C.prod(ir.in_shape)
    # candidates for splitting the reduction itself over blocks: few outputs, lots of input
    # (not at a run-time row count: the split's partials are laid out for a static item count)
    maybe_split = out_size <= SPLIT_MAX_OUT and total >= 2 * C.SMALL_WORK and not dynamic

    def bytes_at(t: int) -> int:
        return C.buffers_bytes(spec, _Emitter(ir, t, mode, used, used_epi, maybe_split).buffers())

    tile = C.fit_tile(spec, bytes_at, cap=max(red_size, 1) * out_size)
    geo = _geometry(mode, kshape, rshape, tile)
    # a reduction with fewer output items than the device has Vector cores also splits its
    # reduced axis over blocks (partials combined through a GM workspace)
    split = maybe_split and geo["items"] < spec.vector_cores and geo["steps"] >= 2
    em = _Emitter(ir, tile, mode, used, used_epi, split)
    workspace = 0
    static_items = geo["items"]
    pre = []
    if dynamic:  # the rows are read at run time: the leading kept extent follows them
        args, rows, get = C.runtime_rows(args, ir.in_shape[0])
        pre = [get]
        geo = _dynamic_geometry(geo, C.runtime_lead(rows, kshape[0], ir.in_shape[0]))
    if split:
        cap = min(spec.vector_cores, geo["steps"])
        args, em.ws, workspace = _workspace(args, em, cap * geo["items"] * geo["k_t"])
        body = em.program_body(geo, in_kstr, out_kstr, rstr, args, cap)
        blocks = device_blocks = cap
    else:
        body = em.program_body(geo, in_kstr, out_kstr, rstr, args)
        blocks = device_blocks = C.device_blocks(spec, static_items)  # (the bound's, if dynamic)
    prog = isa.Program(name, args, tuple(em.buffers()), (*pre, *body), blocks, device_blocks,
                       workspace=workspace)  # fmt: skip
    return prog, {"mode": mode, "tile": tile, "blocks": blocks, "split": split, **geo}


def _dynamic_geometry(geo: dict, lead: isa.IntExpr) -> dict:
    """`geo` (planned at the bound) with the leading kept extent `lead` known at run time:
    the tiles stay; the item count (and, when the leading dim is the tiled kept one, its
    chunk count and tail) become expressions of it."""
    geo = dict(geo)
    if geo["k_outer"]:  # whole items per leading index
        outer = geo["k_outer"]
        geo["k_outer"] = (lead, *outer[1:])
        geo["items"] = isa.mul(lead, C.prod(outer[1:]) * geo["n_kch"])
    else:  # the leading dim is the tiled one: chunks of k_t, the last one a tail
        geo["Ki"] = lead
        geo["n_kch"] = geo["items"] = isa.ceildiv(lead, geo["k_t"])
    return geo


def _workspace(args: tuple, em: _Emitter, slots: int):
    """GM scratch after the kernel args: [counter | partial values | partial indices]."""
    w = len(args)
    val_off = 64
    val_bytes = slots * C.itemsize(em.acc_dt)
    idx_off = (val_off + val_bytes + 63) // 64 * 64
    size = idx_off + (slots * 8 if em.arg else 0)
    cnt = isa.Buffer("ws_count", "GM", "int64", 0, arg=w)
    val = isa.Buffer("ws_partial", "GM", em.acc_dt, 0, arg=w)
    bufs = {"cnt": isa.Ref(cnt, 0), "val": isa.Ref(val, val_off // C.itemsize(em.acc_dt))}
    new_args = (*args, cnt, val)
    if em.arg:
        idx = isa.Buffer("ws_partial_idx", "GM", "int64", 0, arg=w)
        bufs["idx"] = isa.Ref(idx, idx_off // 8)
        new_args = (*new_args, idx)
    return new_args, bufs, size


def _pre(events) -> list:
    """Pre-set the 'buffer free' flags of the queues using `events` (AscendC InitBuffer)."""
    return [f for e in events for f in (isa.SetFlag("V", "MTE2", e), isa.SetFlag("MTE3", "V", e))]


def _post(events) -> list:
    return [f for e in events for f in (isa.WaitFlag("V", "MTE2", e), isa.WaitFlag("MTE3", "V", e))]


def _out_strides(v, out_shape, keep, in_shape) -> tuple[int, ...]:
    """Strides of an out_shape view, listed per kept dim of in_shape."""
    if len(v.strides) == len(keep):
        return tuple(v.strides)
    if len(v.shape) == len(in_shape):  # keepdims-style view: take the kept dims
        return tuple(v.strides[d] for d in keep)
    raise ValueError(
        f"epilogue/output view of shape {v.shape} does not match out_shape {out_shape}"
    )


def _choose_mode(ir, kshape, in_kstr, rstr, out_size) -> str:
    if out_size == 1 or not ir.inputs:
        return "inner"
    main = max(range(len(ir.inputs)), key=lambda k: C.itemsize(ir.inputs[k].dtype))
    sr, sk = abs(rstr[main][-1]), abs(in_kstr[main][-1])
    if sr == 0 and sk == 0:
        return "inner"
    if sr == 0:
        return "outer"
    if sk == 0:
        return "inner"
    return "inner" if sr <= sk else "outer"


ROW_MIN = 256  # a reduced (inner) or kept (outer) run this long gets one row per step


def _geometry(mode: str, kshape, rshape, tile: int) -> dict:
    ki, ri = kshape[-1], rshape[-1]
    if mode == "inner":
        cols_t = max(1, min(ri, tile))
        one = ri >= ROW_MIN or cols_t < ri
        rows_t = 1 if one else max(1, min(ki, tile // cols_t))
        n_kch, n_rch = C.ceil_div(ki, rows_t), C.ceil_div(ri, cols_t) if ri else 0
        k_t = rows_t
    else:
        cols_t = max(1, min(ki, tile))
        one = ki >= ROW_MIN or cols_t < ki or not ri
        rows_t = 1 if one else max(1, min(ri, tile // cols_t))
        n_kch, n_rch = C.ceil_div(ki, cols_t), C.ceil_div(ri, rows_t) if ri else 0
        k_t = cols_t
    k_outer, r_outer = kshape[:-1], rshape[:-1]
    return {"rows_t": rows_t, "cols_t": cols_t, "k_t": k_t, "Ki": ki, "Ri": ri,
            "n_kch": n_kch, "n_rch": n_rch, "k_outer": k_outer, "r_outer": r_outer,
            "items": C.prod(k_outer) * n_kch, "steps": C.prod(r_outer) * n_rch}  # fmt: skip


class _Emitter:
    """Builds the buffers and the body for one tile size."""

    def __init__(self, ir: ReduceKernel, tile: int, mode: str, used, used_epi, split=False):
        self.ir, self.tile, self.mode = ir, tile, mode
        self.used, self.used_epi = used, used_epi
        self.pp = isa.Var("pp")
        half = isa.mul(self.pp, tile)
        self.pool = C.TilePool(tile)
        self.b = isa.Builder(tile=tile)
        self.queues: list[isa.Buffer] = []
        self.loads = {}
        for k in used:
            buf = isa.Buffer(f"in{k}_tile", "UB", ir.inputs[k].dtype, 2 * tile)
            self.queues.append(buf)
            self.loads[k] = isa.Ref(buf, half)
        self.epi_loads = {}
        for k in used_epi:
            buf = isa.Buffer(f"epi{k}_tile", "UB", ir.epi_inputs[k].dtype, tile)
            self.queues.append(buf)
            self.epi_loads[k] = isa.Ref(buf, 0)
        self.dests = {}
        for j, v in enumerate(ir.outputs):
            buf = isa.Buffer(f"out{j}_tile", "UB", v.dtype, tile)
            self.queues.append(buf)
            self.dests[j] = isa.Ref(buf, 0)
        self.acc_dt = internal_acc_dtype(ir, mode)
        self.acc = isa.Ref(isa.Buffer("acc", "UB", self.acc_dt, tile), 0)
        self.extra = [self.acc.buf]
        self.arg = ir.op in ("argmax", "argmin")
        if self.arg:
            self.acc_idx = isa.Ref(isa.Buffer("acc_idx", "UB", "int64", tile), 0)
            self.extra.append(self.acc_idx.buf)
        # prologue (into the pool); probe its temps now so the tile size accounts for them
        # the prologue covers the step's valid elements, bound per step to `pro_n`: with a 1-D
        # copy and a single-row reduction it then fuses into one GM -> accumulator loop
        self.pro_n = isa.Var("pro_n")
        self.pro = C.ExprEmitter(self.b, self.pool, self.pro_n)
        self.pro_val = self.pro.emit(ir.prologue, (ir.prologue_result,), self.loads)[0]
        self.pro_body = list(self.b.body)
        self.b.body.clear()
        self.pro_dt = ir.prologue[ir.prologue_result].dtype
        if self.arg and (mode == "outer" or split):
            self.mask = self._buf("arg_mask", "bool")
            self.mask2 = self._buf("arg_mask2", "bool")
        if self.arg and mode == "outer":
            self.cur_idx = self._buf("cur_idx", "int64")
        if isinstance(self.pro_val, C.Const):
            self.pro_const = self._buf("pro_const", self.pro_dt)
        if split:
            self.part = self._buf("partial", self.acc_dt)
            if self.arg:
                self.part_idx = self._buf("partial_idx", "int64")
            self.zero = isa.Ref(isa.Buffer("zero64", "UB", "int64", 4), 0)
            self.extra.append(self.zero.buf)
        if mode == "outer" and not self.arg and self.pro_dt != self.acc_dt:
            self.conv = self._buf("acc_in", self.acc_dt)
        self.epi_body = self._epilogue_body()

    def _buf(self, name: str, dtype: str) -> isa.Ref:
        r = isa.Ref(isa.Buffer(name, "UB", dtype, self.tile), 0)
        self.extra.append(r.buf)
        return r

    def bytes_per_elem(self) -> int:
        """UB bytes per tile element over every declared buffer (queues count twice)."""
        return sum(C.itemsize(b.dtype) * b.size for b in self.buffers()) // self.tile

    def buffers(self) -> list[isa.Buffer]:
        return [*self.queues, *self.extra, *self.pool.buffers, *self.b.buffers]

    def _epilogue_body(self) -> list:
        ir, b = self.ir, self.b
        acc_ref = self.acc if not self.arg else self.acc_idx
        acc_dt = self.acc_dt if not self.arg else "int64"
        self.epi_n = isa.Var("epi_n")  # the item's valid outputs, bound in _finish
        if acc_dt != ir.acc_dtype:
            conv = self.pool.get(ir.acc_dtype)
            b.emit(isa.VConv(conv, acc_ref, self.epi_n, "trunc"))
            acc_ref = conv
        em = C.ExprEmitter(b, self.pool, self.epi_n)
        em.emit(ir.epilogue, ir.results, self.epi_loads, acc_ref, self.dests)
        self.epi_hoisted = em.hoisted
        body = list(b.body)
        b.body.clear()
        return body

    # ---------------------------------------------------------------- program
    def program_body(self, geo, in_kstr, out_kstr, rstr, args, split_cap: int = 0) -> list:
        """Body for the whole kernel; `split_cap` > 0 splits the reduction steps over blocks."""
        ir = self.ir
        it, st = isa.Var("it"), isa.Var("st")
        self.geo, self.in_kstr, self.out_kstr, self.rstr, self.args = (
            geo,
            in_kstr,
            out_kstr,
            rstr,
            args,
        )
        scope = [*self.pro_body, *self.epi_body]
        inv_pro, self.pro_body = C.hoist_invariant_dups(self.pro_body, scope)
        inv_epi, self.epi_body = C.hoist_invariant_dups(self.epi_body, scope)
        hoisted = [*self.pro.hoisted, *self.epi_hoisted, *inv_pro, *inv_epi]
        if not split_cap:
            item = [*self._init_acc(), self._step_loop(it, st, 0, geo["steps"]), *self._finish(it)]
            start, stop, lets = C.block_range(geo["items"])
            return [*lets, *hoisted, *_pre((0, 1, 2)), isa.Loop(it, start, stop, 1, tuple(item)),
                    *_post((0, 1, 2))]  # fmt: skip
        # ---- split: every block reduces a slice of the steps of every item into a partial
        eff, fac, s0, s1, old = (isa.Var(n) for n in ("eff", "step_factor", "step_start",
                                                      "step_stop", "arrived"))  # fmt: skip
        ws = self.ws
        k_t, items = geo["k_t"], geo["items"]

        def slot(blk, item) -> isa.IntExpr:
            return isa.mul(isa.add(isa.mul(blk, items), item), k_t)

        mine_slot = slot(isa.BLOCK_IDX, it)
        publish = [*self._init_acc(), self._step_loop(it, st, s0, s1),
                   isa.SetFlag("V", "MTE3", 3), isa.WaitFlag("V", "MTE3", 3),
                   isa.CopyOut(ws["val"] + mine_slot, self.acc, (k_t,), (1,))]  # fmt: skip
        if self.arg:
            publish.append(
                isa.CopyOut(ws["idx"] + slot(isa.BLOCK_IDX, it), self.acc_idx, (k_t,), (1,))
            )
        publish += [isa.SetFlag("MTE3", "V", 3), isa.WaitFlag("MTE3", "V", 3)]
        bb = isa.Var("part")
        fold = [isa.CopyIn(self.part, ws["val"] + slot(bb, it), (k_t,), (1,))]
        if self.arg:
            fold.append(isa.CopyIn(self.part_idx, ws["idx"] + slot(bb, it), (k_t,), (1,)))
        fold += [isa.SetFlag("MTE2", "V", 3), isa.WaitFlag("MTE2", "V", 3)]
        if self.arg:
            fold += self._arg_update(self.part, k_t, self.part_idx)
        else:
            fold.append(isa.VBinary(_VBIN[ir.op], self.acc, self.acc, self.part, k_t))
        fold += [isa.SetFlag("V", "MTE2", 3), isa.WaitFlag("V", "MTE2", 3)]
        combine = [*self._init_acc(), isa.Loop(bb, 0, eff, 1, tuple(fold)), *self._finish(it)]
        last = [*_pre((2,)), isa.Loop(it, 0, items, 1, tuple(combine)), *_post((2,)),
                isa.VDup(self.zero, 0, 4), isa.SetFlag("V", "MTE3", 3),
                isa.WaitFlag("V", "MTE3", 3),
                isa.CopyOut(ws["cnt"], self.zero, (1,), (1,))]  # re-arm the counter  # fmt: skip
        mine = [
            isa.Let(fac, isa.floordiv(isa.add(geo["steps"] - 1, eff), eff)),
            isa.Let(s0, isa.mul(isa.BLOCK_IDX, fac)),
            isa.Let(s1, isa.imin(isa.add(s0, fac), geo["steps"])),
            *hoisted, *_pre((0, 1)), isa.Loop(it, 0, items, 1, tuple(publish)), *_post((0, 1)),
            isa.PipeBarrier("ALL"),  # partials are in GM before this block says it arrived
            isa.AtomicAdd(ws["cnt"], 1, old),
            isa.If(old, "==", isa.sub(eff, 1), tuple(last)),
        ]  # fmt: skip
        return [
            isa.Let(eff, isa.imin(isa.BLOCK_NUM, split_cap)),
            isa.If(isa.BLOCK_IDX, "<", eff, tuple(mine)),
        ]

    def _step_loop(self, it, st, start, stop) -> isa.Loop:
        """All reduction steps [start, stop) of item `it` into the accumulator tile."""
        ir, pp, geo = self.ir, self.pp, self.geo
        in_kstr, rstr, args = self.in_kstr, self.rstr, self.args
        inner = self.mode == "inner"
        r = isa.Var("r")
        k_idx, k0, k_cnt = self._kept(it)
        n_rch, r_outer = geo["n_rch"], geo["r_outer"]
        r_idx, rc = _split(st, n_rch, r_outer)
        r_t = geo["cols_t"] if inner else geo["rows_t"]
        r0 = isa.mul(rc, r_t)
        r_cnt = _count(geo["Ri"], r_t, rc) if geo["Ri"] else 0
        one_row = geo["rows_t"] == 1  # a 1-D run: copy, prologue and fold fuse into one loop
        if inner:
            pro_n = r_cnt if one_row else isa.mul(k_cnt, r_cnt)
        else:
            pro_n = k_cnt if one_row else isa.mul(r_cnt, geo["cols_t"])
        step = [isa.Let(pp, isa.mod(st, 2)), isa.Let(self.pro_n, pro_n),
                isa.WaitFlag("V", "MTE2", pp)]  # fmt: skip
        for k in self.used:
            v = ir.inputs[k]
            ks, rs = in_kstr[k], rstr[k]
            off = C.dot(k_idx, ks[:-1], v.offset)
            off = isa.add(off, isa.mul(k0, ks[-1]))
            off = C.dot(r_idx, rs[:-1], off)
            off = isa.add(off, isa.mul(r0, rs[-1]))
            if one_row:  # a run of the reduced axis (inner) or of the kept axis (outer)
                counts, strides, pitch = (self.pro_n,), ((rs if inner else ks)[-1],), None
            elif inner:  # rows of K x cols of R, dense (cols == Ri whenever rows > 1)
                counts, strides, pitch = (k_cnt, r_cnt), (ks[-1], rs[-1]), None
            else:  # rows of R x cols of K, row pitch = the tile's column count
                counts, strides, pitch = (r_cnt, k_cnt), (rs[-1], ks[-1]), geo["cols_t"]
            step.append(isa.CopyIn(self.loads[k], isa.Ref(args[k], off), counts, strides, pitch))
        step += [isa.SetFlag("MTE2", "V", pp), isa.WaitFlag("MTE2", "V", pp)]
        step += self.pro_body
        step += self._fold(geo, self.pro_n if (one_row and inner) else r_cnt, k_cnt, r_idx, r0, r)
        step.append(isa.SetFlag("V", "MTE2", pp))
        return isa.Loop(st, start, stop, 1, tuple(step))

    def _kept(self, it):
        geo = self.geo
        k_idx, kc = _split(it, geo["n_kch"], geo["k_outer"])
        return k_idx, isa.mul(kc, geo["k_t"]), _count(geo["Ki"], geo["k_t"], kc)

    def _finish(self, it) -> list:
        """Epilogue on the accumulator tile and copy-out (single-buffered queues, event 2)."""
        ir, args, out_kstr = self.ir, self.args, self.out_kstr
        n_in, n_epi = len(ir.inputs), len(ir.epi_inputs)
        k_idx, k0, k_cnt = self._kept(it)
        out = [isa.WaitFlag("V", "MTE2", 2)]
        for k in self.used_epi:
            v = ir.epi_inputs[k]
            s = out_kstr[k]
            off = isa.add(C.dot(k_idx, s[:-1], v.offset), isa.mul(k0, s[-1]))
            out.append(isa.CopyIn(self.epi_loads[k], isa.Ref(args[n_in + k], off), (k_cnt,),
                                  (s[-1],)))  # fmt: skip
        out += [isa.SetFlag("MTE2", "V", 2), isa.WaitFlag("MTE2", "V", 2),
                isa.WaitFlag("MTE3", "V", 2), isa.Let(self.epi_n, k_cnt)]  # fmt: skip
        out += self.epi_body
        out += [isa.SetFlag("V", "MTE2", 2), isa.SetFlag("V", "MTE3", 2),
                isa.WaitFlag("V", "MTE3", 2)]  # fmt: skip
        for j, v in enumerate(ir.outputs):
            s = out_kstr[n_epi + j]
            off = isa.add(C.dot(k_idx, s[:-1], v.offset), isa.mul(k0, s[-1]))
            out.append(isa.CopyOut(isa.Ref(args[n_in + n_epi + j], off), self.dests[j],
                                   (k_cnt,), (s[-1],)))  # fmt: skip
        out.append(isa.SetFlag("MTE3", "V", 2))
        return out

    def _init_acc(self) -> list:
        ir = self.ir
        k_t = self.geo["k_t"]
        out = [isa.VDup(self.acc, identity(ir.op, self.acc_dt), k_t)]
        if self.arg:
            out.append(isa.VDup(self.acc_idx, 0, k_t))
        return out

    def _fold(self, geo, r_cnt, k_cnt, r_idx, r0, r) -> list:
        """Fold the prologue tile into the accumulators."""
        ir, tile = self.ir, self.tile
        val = self.pro_val
        out: list = []
        if isinstance(val, C.Const):  # constant prologue (e.g. counting): materialise it
            out.append(isa.VDup(self.pro_const, val.value, tile))
            val = self.pro_const
        if self.mode == "inner":
            if self.arg:
                base = isa.add(isa.mul(_flat(r_idx, geo["r_outer"]), geo["Ri"]), r0)
                out.append(isa.VArgReduce("v" + ir.op, self.acc, self.acc_idx, val, r_cnt, base,
                                          k_cnt))  # fmt: skip
            else:
                rows = 1 if geo["rows_t"] == 1 else k_cnt
                out.append(isa.VReduce(_VRED[ir.op], self.acc, val, r_cnt, rows))
            return out
        # outer: every reduced row of the tile is one vector op into the accumulator tile
        cols_t = geo["cols_t"]
        n = self.pro_n if geo["rows_t"] == 1 else tile
        if not self.arg and self.pro_dt != self.acc_dt:
            out.append(isa.VConv(self.conv, val, n, "trunc"))
            val = self.conv
        if geo["rows_t"] == 1:  # one row per step: straight-line, fuses with the copy
            if not self.arg:
                out.append(isa.VBinary(_VBIN[ir.op], self.acc, self.acc, val, n))
            else:
                base = isa.add(isa.mul(_flat(r_idx, geo["r_outer"]), geo["Ri"]), r0)
                out.append(isa.VDup(self.cur_idx, base, n))
                out += self._arg_update(val, n)
            return out
        row = isa.Ref(val.buf, isa.add(val.off, isa.mul(r, cols_t)))
        if not self.arg:
            body = (isa.VBinary(_VBIN[ir.op], self.acc, self.acc, row, cols_t),)
        else:  # cur_idx holds the flat reduced index of the row being folded
            base = isa.add(isa.mul(_flat(r_idx, geo["r_outer"]), geo["Ri"]), r0)
            out.append(isa.VDup(self.cur_idx, base, cols_t))
            body = (*self._arg_update(row, cols_t),
                    isa.VScalar("vadds", self.cur_idx, self.cur_idx, 1, cols_t))  # fmt: skip
        out.append(isa.Loop(r, 0, r_cnt, 1, body))
        return out

    def _arg_update(self, row: isa.Ref, n: int, idx: isa.Ref | None = None) -> list:
        """better = x > best (or <), or x is the first NaN; best/idx = select(better, ...).

        The candidate index is `idx` (a tile) or cur_idx."""
        cmp = "gt" if self.ir.op == "argmax" else "lt"
        m, m2, best = self.mask, self.mask2, self.acc
        body = [isa.VCmp(cmp, m, row, best, n)]
        if np.dtype(self.acc_dt).kind == "f":
            body += [isa.VCmp("ne", m2, row, row, n),  # x is NaN
                     isa.VBinary("vor", m, m, m2, n),
                     isa.VCmp("eq", m2, best, best, n),  # best is not NaN
                     isa.VBinary("vand", m, m, m2, n)]  # fmt: skip
        body += [isa.VSel(best, m, row, best, n),
                 isa.VSel(self.acc_idx, m, self.cur_idx if idx is None else idx, self.acc_idx,
                          n)]  # fmt: skip
        return body


def _split(index: isa.Var, n_chunks: int, outer: tuple[int, ...]):
    """(outer multi-index, chunk) of a flat item index."""
    if n_chunks == 1:
        return C.unravel(index, outer) if outer else [], 0
    if not outer:
        return [], index
    return C.unravel(isa.floordiv(index, n_chunks), outer), isa.mod(index, n_chunks)


def _flat(idx: list, sizes: tuple[int, ...]) -> isa.IntExpr:
    acc: isa.IntExpr = 0
    for i, s in zip(idx, sizes):
        acc = isa.add(isa.mul(acc, s), i)
    return acc


def _count(extent: isa.IntExpr, step: int, chunk: isa.IntExpr) -> isa.IntExpr:
    """Elements in chunk `chunk` of `extent` split by `step` (a run-time extent: a tail may
    fall in any chunk, unless the chunks are single elements)."""
    if step == 1 or (isinstance(extent, int) and extent % step == 0):
        return step
    return isa.imin(step, isa.sub(extent, isa.mul(chunk, step)))
