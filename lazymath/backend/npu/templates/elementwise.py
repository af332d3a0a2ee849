"""Elementwise template: ElementwiseKernel -> isa.Program (CopyIn -> Compute -> CopyOut per tile).

Shape of the program (AscendC's Init + Process with double-buffered queues)::

    block_factor = ceil(items / block_num); this block runs items [start, stop)
    for it in start..stop:                     # one item = one UB tile
        pp = it % 2                            # ping-pong half of every queue buffer
        wait V->MTE2 pp; copy_gm_to_ub in*[pp]; set MTE2->V pp
        wait MTE2->V pp; wait MTE3->V pp; <vector instructions>; set V->MTE2 pp; set V->MTE3 pp
        wait V->MTE3 pp; copy_ub_to_gm out*[pp]; set MTE3->V pp

The iteration space is first collapsed (contiguous views -> 1-D). A tile is a chunk of the last
dim, or whole rows of the last two dims when the last dim is shorter than a tile; outer dims
are recovered from the item index with div/mod, so strided, broadcast (stride 0) and flipped
(negative stride) views are read in place. Vector instructions process exactly the tile's valid
elements (static except in a tail tile); composites size their scratch from the static tile
bound. A 1-D tile's copy-in, vector instructions and copy-out share one trip count, so the
lowering fuses them into a single GM -> registers -> GM loop.

A `DynamicElementwiseKernel` (a run-time leading dim, lm.jit's dynamic batch) reads its extent
with `get_value` from one more GM argument (the tiling word) at the top of the program: the
leading dim is never merged with the others, the tile is fitted for the most rows it serves
(`shape[0]`), and the item count, the block range and the tail tile's counts are expressions of
the run-time extent, so one program serves every batch.
"""

from __future__ import annotations

from lazymath.backend.npu import isa
from lazymath.backend.npu.kernel_ir import DynamicElementwiseKernel, ElementwiseKernel
from lazymath.backend.npu.templates import common as C


def tiling(ir: ElementwiseKernel, spec) -> dict:
    """Tile size and geometry (for reports)."""
    return _plan(ir, spec, "k")[1]


def build(ir: ElementwiseKernel, spec, name: str) -> isa.Program:
    """The checked program for `ir` on `spec` (raises BufferOverflowError if it cannot fit)."""
    return _plan(ir, spec, name)[0].check(spec)


def _plan(ir: ElementwiseKernel, spec, name: str):
    views = (*ir.inputs, *ir.outputs)
    n_in = len(ir.inputs)
    names = [f"in{k}" for k in range(n_in)] + [f"out{j}" for j in range(len(ir.outputs))]
    args = C.gm_args(views, names)
    dynamic = isinstance(ir, DynamicElementwiseKernel)
    if dynamic:
        if not ir.shape or ir.shape[0] < 1:
            raise ValueError(f"a dynamic elementwise kernel needs a leading dim of at least 1 "
                             f"row (the most it serves), got shape {ir.shape}")  # fmt: skip
        args += (isa.Buffer("tiling", "GM", "int64", 0, arg=len(views)),)
    total = C.prod(ir.shape)
    for j, (v, r) in enumerate(zip(ir.outputs, ir.results)):
        if v.dtype != ir.expr[r].dtype:
            raise ValueError(f"output {j} is {v.dtype} but its expression is {ir.expr[r].dtype}")
    if total == 0:
        return isa.Program(name, args, (), (), 1, 1), {"tile": 0, "items": 0, "blocks": 1}
    if dynamic:  # the leading dim stays an axis of its own: its extent is read at run time
        rest, rest_strides = C.collapse(ir.shape[1:], [v.strides[1:] for v in views])
        keep = rest != (1,)
        shape = (ir.shape[0], *(rest if keep else ()))
        strides = [(v.strides[0], *(st if keep else ())) for v, st in zip(views, rest_strides)]
    else:
        shape, strides = C.collapse(ir.shape, [v.strides for v in views])
    used = sorted({op.arg for op in ir.expr if op.op == "load"})
    # UB footprint as a function of the tile: queues (double-buffered) + temporaries + scratch

    def bytes_at(t: int) -> int:
        _, temps, _, queues = _emit(ir, args, used, t, isa.Var("pp"))
        return C.buffers_bytes(spec, [*queues.values(), *temps])

    tile = C.fit_tile(spec, bytes_at, cap=total)
    geo = _geometry(shape, tile)
    blocks = C.device_blocks(spec, geo["items"])  # for the most rows (the device's choice)
    pre = []
    if dynamic:
        rows = isa.Var("rows")
        pre = [isa.GetValue(rows, isa.Ref(args[-1], 0), shape[0])]
        geo = _dynamic_geometry(geo, shape, rows)
    body, bufs = _program_body(ir, args, strides, used, tile, geo)
    prog = isa.Program(name, args, tuple(bufs), (*pre, *body), blocks, blocks)
    info = {"tile": tile, "blocks": blocks, **geo, "shape": shape}
    return prog, info


def _geometry(shape: tuple[int, ...], tile: int) -> dict:
    cols = shape[-1]
    if len(shape) == 1 or cols >= tile:
        cols_t = min(tile, cols)
        nch = C.ceil_div(cols, cols_t)
        outer = shape[:-1]
        return {"mode": "1d", "cols_t": cols_t, "rows_t": 1, "nch": nch, "outer": outer,
                "items": C.prod(outer) * nch, "C": cols, "R": 1}  # fmt: skip
    rows = shape[-2]
    rows_t = min(rows, tile // cols)
    nch = C.ceil_div(rows, rows_t)
    outer = shape[:-2]
    return {"mode": "2d", "cols_t": cols, "rows_t": rows_t, "nch": nch, "outer": outer,
            "items": C.prod(outer) * nch, "C": cols, "R": rows}  # fmt: skip


def _dynamic_geometry(geo: dict, shape: tuple[int, ...], rows: isa.Var) -> dict:
    """`geo` (planned for shape[0] rows) with the leading extent `rows` read at run time: the
    tile stays; the chunk count (when the leading dim is the one chunked) and the item count
    become expressions of `rows`."""
    geo = dict(geo)
    lead = "C" if len(shape) == 1 else ("R" if geo["mode"] == "2d" and len(shape) == 2 else "")
    if lead:  # the leading dim is the tiled one: chunks of it, the last one a tail
        step = geo["cols_t"] if lead == "C" else geo["rows_t"]
        geo[lead] = rows
        geo["nch"] = isa.ceildiv(rows, step)
        geo["items"] = geo["nch"]
    else:  # the leading dim is the first outer dim: whole items per row
        outer = geo["outer"]
        geo["outer"] = (rows, *outer[1:])
        geo["items"] = isa.mul(rows, C.prod(outer[1:]) * geo["nch"])
    return geo


def _emit(ir: ElementwiseKernel, args, used, tile: int, pp: isa.Var, n: isa.IntExpr = None):
    """Vector instructions for one tile of `n` (<= tile) elements; returns
    (hoisted, buffers, compute, queues)."""
    b = isa.Builder(tile=tile)
    pool = C.TilePool(tile)
    half = isa.mul(pp, tile)
    queues = {}
    loads = {}
    for k in used:
        buf = isa.Buffer(f"in{k}_tile", "UB", ir.inputs[k].dtype, 2 * tile)
        queues[("in", k)] = buf
        loads[k] = isa.Ref(buf, half)
    dests = {}
    for j, v in enumerate(ir.outputs):
        buf = isa.Buffer(f"out{j}_tile", "UB", v.dtype, 2 * tile)
        queues[("out", j)] = buf
        dests[j] = isa.Ref(buf, half)
    em = C.ExprEmitter(b, pool, tile if n is None else n)
    em.emit(ir.expr, ir.results, loads, None, dests)
    buffers = [*pool.buffers, *b.buffers]
    invariant, body = C.hoist_invariant_dups(b.body)
    # only fills of tile-independent buffers may leave the loop; a fill addressed through the
    # ping-pong half (e.g. a constant written straight into an output tile) must stay inside
    keep = [i for i in invariant if _mentions(i, half)]
    invariant = [i for i in invariant if not _mentions(i, half)]
    hoisted = [i for i in em.hoisted if not _mentions(i, half)]
    body = [*keep, *[i for i in em.hoisted if _mentions(i, half)], *body]
    return [*hoisted, *invariant], buffers, body, queues


def _mentions(instr, expr) -> bool:
    """Does `instr` (a dataclass) use `expr` or any variable inside it in an address?"""
    names = set()
    stack = [expr]
    while stack:
        e = stack.pop()
        if isinstance(e, isa.Var):
            names.add(e.name)
        elif isinstance(e, isa.BinInt):
            stack += [e.a, e.b]
    if not names:
        return False
    stack = [instr]
    while stack:
        x = stack.pop()
        if isinstance(x, isa.Var):
            if x.name in names:
                return True
        elif isinstance(x, (isa.BinInt, isa.Ref)) or hasattr(x, "__dataclass_fields__"):
            stack += [getattr(x, f) for f in x.__dataclass_fields__]
        elif isinstance(x, (tuple, list)):
            stack += list(x)
    return False


def _program_body(ir, args, strides, used, tile, geo):
    pp = isa.Var("pp")
    it = isa.Var("it")
    n_in = len(ir.inputs)
    nch, outer = geo["nch"], geo["outer"]
    if isinstance(nch, int) and nch == 1:
        outer_idx, chunk = it, 0
    elif not outer:
        outer_idx, chunk = 0, it
    else:
        outer_idx, chunk = isa.floordiv(it, nch), isa.mod(it, nch)
    idx = C.unravel(outer_idx, outer) if outer else []
    n_outer = len(outer)
    half = isa.mul(pp, tile)

    def gm_ref(view_k: int):
        st = strides[view_k]
        view = (*ir.inputs, *ir.outputs)[view_k]
        base = C.dot(idx, st[:n_outer], view.offset)
        if geo["mode"] == "1d":
            off = isa.add(base, isa.mul(chunk, geo["cols_t"] * st[-1]))
            return isa.Ref(args[view_k], off), (st[-1],)
        off = isa.add(base, isa.mul(chunk, geo["rows_t"] * st[-2]))
        return isa.Ref(args[view_k], off), (st[-2], st[-1])

    if geo["mode"] == "1d":
        counts = (_count(geo["C"], geo["cols_t"], chunk),)
        n = counts[0]
    else:
        counts = (_count(geo["R"], geo["rows_t"], chunk), geo["C"])
        n = isa.mul(counts[0], geo["C"])
    # vector instructions cover exactly the valid elements, so that a 1-D tile's
    # copy-in -> compute -> copy-out has one trip count and lowers to one fused loop
    hoisted, temps, compute, queues = _emit(ir, args, used, tile, pp, n)

    loop = [isa.Let(pp, isa.mod(it, 2)), isa.WaitFlag("V", "MTE2", pp)]
    for k in used:
        ref, st = gm_ref(k)
        loop.append(isa.CopyIn(isa.Ref(queues[("in", k)], half), ref, counts, st))
    loop += [isa.SetFlag("MTE2", "V", pp), isa.WaitFlag("MTE2", "V", pp),
             isa.WaitFlag("MTE3", "V", pp)]  # fmt: skip
    loop += compute
    loop += [isa.SetFlag("V", "MTE2", pp), isa.SetFlag("V", "MTE3", pp),
             isa.WaitFlag("V", "MTE3", pp)]  # fmt: skip
    for j in range(len(ir.outputs)):
        ref, st = gm_ref(n_in + j)
        loop.append(isa.CopyOut(ref, isa.Ref(queues[("out", j)], half), counts, st))
    loop.append(isa.SetFlag("MTE3", "V", pp))

    start, stop, lets = C.block_range(geo["items"])
    body = [*lets, *hoisted, *C.pipeline_flags_prologue(),
            isa.Loop(it, start, stop, 1, tuple(loop)), *C.pipeline_flags_epilogue()]  # fmt: skip
    buffers = [*queues.values(), *temps]
    return body, buffers


def _count(extent: int, step: int, chunk: isa.IntExpr) -> isa.IntExpr:
    """Elements in chunk `chunk` of `extent` split by `step`: static unless there is a tail."""
    if step == 1 or (isinstance(extent, int) and extent % step == 0):
        return step  # (a chunk of one row or element is always whole, even at a run-time extent)
    return isa.imin(step, isa.sub(extent, isa.mul(chunk, step)))
