"""lm.jit's dynamic batch, the parts that read the graph and the program (staging.py runs them).

`batch_axes` proves on the traced graph that row i of every output depends only on row i of
the batched inputs (the condition for running one program on any batch); `RowPlan` (the
program compile's rewrite hook) builds the traced graph's batch kernels (elementwise,
reductions and row kernels over the other axes, matmuls with the batch in M) as their dynamic
kinds (`DynamicElementwiseKernel`, `DynamicReduceKernel`, `DynamicRowKernel`,
`DynamicMatmulKernel`) that take the row count at run time (the tiling word), after proving
per kernel argument that row i touches only row i of a batched buffer, so each compiles once;
`RuntimeRows` holds the program compiled that way. Why a module of its own:
staging.py is the call path (signature, replay, donation); this is the analysis behind one
kind of signature.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from lazymath._lazy import deferred
from lazymath.backend.npu import kernel_ir as K
from lazymath.graph import node as gn
from lazymath.graph.ops import ELEMENTWISE
from lazymath.runtime.replay import BoundReplay, Slot

# The compile driver: `import lazymath` must not load the backend (+~100 ms, the ISA), and a
# program being compiled has loaded it by the time a dynamic batch's plan runs.
compile_driver = deferred("lazymath.backend.compile")

MAX_ROWS = 1 << 20  # rows per launch of a run-time-rows kernel at most (its get_value bound)
# ... of a program with a run-time-M matmul: its tiling, its row-value workspace (zeroed per
# launch) and its host block count are sized at the bound; a bigger batch is several launches
MATMUL_MAX_ROWS = 1 << 16


class NotBatched(Exception):
    """The traced graph mixes rows of the batch dimension (a reduction or a view across it, a
    contraction over it...): the function cannot run chunk by chunk."""


_ROW_LOCAL_VIEWS = frozenset({"permute", "reshape", "slice", "expand"})


def batch_axes(roots: list[gn.Node], batched: dict[int, int], size: int) -> dict[int, int]:
    """For each node of the graph behind `roots`, the axis that carries the batch rows (absent:
    the node does not depend on the batch), proving that row i of every output depends only on
    row i of the batched inputs: the condition for running the one program compiled at batch
    `size` on chunks of any batch. `batched`: id(leaf node) -> its batch axis. Raises
    NotBatched naming the first node that mixes rows (its op and the user's line).

    Conservative: an op not known to be row-local (window, pad, concat over the batch, custom
    kernels, convolutions) refuses, and the caller retraces per size instead."""
    axes = dict(batched)
    for n in gn.toposort(roots):
        if id(n) in axes or not n.srcs:
            continue
        src_axes = [axes.get(id(s)) for s in n.srcs]
        if all(a is None for a in src_axes):
            continue
        op = n.op
        where = f"{op} {n.shape} at {n.loc}"
        if op in ELEMENTWISE or op == "cast" or op == "where":
            out = None
            for s, a in zip(n.srcs, src_axes):
                if a is not None:
                    b = a + len(n.shape) - len(s.shape)
                    if out is not None and out != b:
                        raise NotBatched(f"{where}: operands carry the batch on different axes")
                    out = b
            for s, a in zip(n.srcs, src_axes):
                if a is None and not _uniform_at(s, out - (len(n.shape) - len(s.shape))):
                    raise NotBatched(f"{where}: an operand that is not batched has "
                                     f"{size} rows along the batch axis")  # fmt: skip
            axes[id(n)] = out
            continue
        (a,) = src_axes if len(src_axes) == 1 else (None,)
        s = n.srcs[0]
        if op == "reduce":
            if a in n.arg[1]:
                raise NotBatched(f"{where}: reduces over the batch axis")
            axes[id(n)] = a - sum(1 for r in n.arg[1] if r < a)
        elif op == "permute":
            axes[id(n)] = tuple(n.arg).index(a)
        elif op == "slice":
            if tuple(n.arg[a]) != (0, size, 1):
                raise NotBatched(f"{where}: slices the batch axis")
            axes[id(n)] = a
        elif op == "expand":
            b = a + len(n.shape) - len(s.shape)
            if n.shape[b] != size:
                raise NotBatched(f"{where}: broadcasts the batch axis")
            axes[id(n)] = b
        elif op == "reshape":
            axes[id(n)] = _reshaped_axis(s.shape, n.shape, a, where)
        elif op == "complex_join" and a != len(s.shape) - 1:
            axes[id(n)] = a
        elif op == "matmul" and len(n.srcs) == 2:
            axes[id(n)] = _matmul_axis(n, src_axes, where)
        else:
            raise NotBatched(f"{where}: not known to keep batch rows apart")
    return axes


def _uniform_at(node: gn.Node, axis: int) -> bool:
    """Whether a node that does not depend on the batch is the same along `axis` (absent, size
    1, or broadcast there by an expand): it then meets every batch row alike."""
    if axis < 0 or node.shape[axis] == 1:
        return True
    if node.op == "expand":
        s = node.srcs[0]
        k = axis - (len(node.shape) - len(s.shape))
        return k < 0 or s.shape[k] == 1
    return False


def _reshaped_axis(src: tuple, dst: tuple, a: int, where: str) -> int:
    """The batch axis after a reshape that keeps it a whole axis of its own (row-major: the
    elements before it and the axis itself span the same prefix)."""
    before = 1
    for d in src[:a]:
        before *= d
    acc = 1
    for b, d in enumerate(dst):
        if acc == before and d == src[a]:
            return b
        acc *= d
    raise NotBatched(f"{where}: reshapes the batch axis together with others")


def _matmul_axis(n: gn.Node, src_axes: list, where: str) -> int:
    """(..., M, K) @ (..., K, N): the batch may be in M, N or the stacked leading axes, never
    in the contracted K."""
    out_nd = len(n.shape)
    found = None
    for side, (s, a) in enumerate(zip(n.srcs, src_axes)):
        if a is None:
            continue
        nd = len(s.shape)
        if nd < 2 or a == (nd - 1 if side == 0 else nd - 2):
            raise NotBatched(f"{where}: contracts over the batch axis")
        if a >= nd - 2:
            b = out_nd - 2 if side == 0 else out_nd - 1
        else:
            b = a + out_nd - nd
        if found is not None and found != b:
            raise NotBatched(f"{where}: operands carry the batch on different axes")
        found = b
    for s, a in zip(n.srcs, src_axes):
        if a is None and found < out_nd - 2 and not _uniform_at(s, found - (out_nd - len(s.shape))):
            raise NotBatched(f"{where}: a stacked operand that is not batched")
    return found


class RuntimeRows:
    """The traced program with its row count a run-time kernel argument: every kernel that
    touches batch rows rebuilt as its dynamic kind (its loops, block range and
    tail tile bound by the row count it reads from one more GM argument, the tiling word),
    so one launch serves any 1..chunk rows without padding, and no kernel touches a row past
    the count (inputs and outputs are exact row views).

    The program was compiled that way (`RowPlan`, the compile's rewrite hook); `bound` is its
    entry's fast launch when the caller has one."""

    __slots__ = ("prog", "leaf_src", "fixed", "bound", "single", "small", "capacity")

    def __init__(self, prog, leaf_src, fixed, small: int, capacity: int, bound=None) -> None:
        self.prog = prog
        self.leaf_src = leaf_src
        self.fixed = fixed
        self.small = small  # batches below this many rows launch one host block per kernel
        self.capacity = capacity  # rows one native launch serves (the kernels' bound)
        self.bound = BoundReplay.make(prog, leaf_src, fixed) if bound is None else bound
        # small batches launch one host block: a thread hand-off costs more than the work
        self.single = None if self.bound is None else self.bound.with_blocks(1)


class RowPlan:
    """The `rewrite` hook of `engine.compile_program` that makes a traced program's batch
    kernels take their row count at run time (`RuntimeRows`), before anything compiles: the
    first call of a dynamic batch compiles each kernel once, as its dynamic kind (the traced
    static kernels at `chunk` rows are never built).

    Per kernel argument it proves that row i of the kernel's iteration space reads or writes
    only row i of a batched buffer (its leading stride is the buffer's row size and the rest
    of the view stays inside one row) and that buffers without the batch are the same for
    every row (stride 0); a kernel of another kind (AI CPU, custom, a reduction over the
    batch, a matmul with the batch outside M) that touches a batched buffer raises NotBatched,
    and the caller keeps the host-chunked path. It appends the tiling word's slot (a leaf
    after the program's leaves) and sets `capacity` (rows per launch) and `small`."""

    def __init__(self, row_elems: dict[int, int], chunk: int) -> None:
        self.row_elems = row_elems  # id(batched leaf node) -> its elements per batch row
        self.chunk = chunk
        self.capacity = chunk
        self.small = 1

    def __call__(self, kernels, slots: list, arg_slots: list, leaves: list) -> dict:
        chunk = self.chunk
        rows_of: dict[int, int] = {}  # slot id -> elements per batch row, for batched slots
        for j, s in enumerate(slots):
            if s.kind == "leaf" and id(leaves[s.index]) in self.row_elems:
                rows_of[j] = self.row_elems[id(leaves[s.index])]
            elif s.kind == "out":
                rows_of[j] = math.prod(s.shape[1:])
        dyn_items = []
        for i, (sk, slot_ids) in enumerate(zip(kernels, arg_slots)):
            if not any(j in rows_of for j in slot_ids):
                continue
            ir = sk.group.ir
            views, n_in, work = _batch_views(ir, chunk, sk.name)
            for pos, (v, j) in enumerate(zip(views, slot_ids)):
                if slots[j].kind == "alias":
                    raise NotBatched(f"kernel {sk.name} writes through an alias")
                if v is None:  # an operand not indexed by the rows (a matmul's B)
                    if j in rows_of:
                        raise NotBatched(f"kernel {sk.name} argument {pos} carries the batch "
                                         "where the rows are not its leading index")  # fmt: skip
                    continue
                is_out = pos >= n_in
                if is_out and j not in rows_of:  # an intermediate: batched if it has the rows
                    if slots[j].kind != "arena" or not slots[j].shape or \
                            slots[j].shape[0] != chunk:  # fmt: skip
                        raise NotBatched(f"kernel {sk.name} writes {slots[j].kind} slot {j} "
                                         "without the batch rows")  # fmt: skip
                    rows_of[j] = math.prod(slots[j].shape[1:])
                if j in rows_of:
                    if not _row_local(v, rows_of[j]):
                        raise NotBatched(f"kernel {sk.name} argument {pos} does not address "
                                         "one buffer row per batch row")  # fmt: skip
                elif v.strides[0] != 0:
                    raise NotBatched(f"kernel {sk.name} argument {pos} differs between rows "
                                     "and does not carry the batch")  # fmt: skip
            dyn_items.append((i, ir, work))
        if not dyn_items:
            raise NotBatched("no kernel reads the batch rows")
        # Rows per launch: with no batched intermediate in the arena (sized for `chunk` rows)
        # the kernels serve far more than the traced chunk, so a big batch is one launch too
        row_work = max(1, max(w for *_x, w in dyn_items))
        arena = any(slots[j].kind == "arena" for j in rows_of)
        most = MATMUL_MAX_ROWS if any(ir.kind == "matmul" for _i, ir, _w in dyn_items) else \
            MAX_ROWS  # fmt: skip
        self.capacity = capacity = chunk if arena else max(chunk, min(most, (1 << 31) // row_work))
        # below `small` rows every kernel runs one host block (the compile's host_blocks rule
        # at that size: Vector work under SMALL_VECTOR_WORK, a matmul under two workers' flops)
        small = compile_driver.SMALL_VECTOR_WORK // row_work
        for _i, ir, _w in dyn_items:
            if ir.kind == "matmul":
                flops = 2 * compile_driver.MIN_FLOPS_PER_WORKER
                small = min(small, -(-flops // (2 * ir.n * max(ir.k, 1))))
        self.small = max(small, 1)
        tiling = len(slots)
        slots.append(Slot("leaf", len(leaves)))  # the tiling word: a leaf after the leaves
        for i, _ir, _w in dyn_items:
            arg_slots[i].append(tiling)
        return {i: _dynamic_ir(ir, capacity) for i, ir, _w in dyn_items}


def _batch_views(ir, chunk: int, name: str) -> tuple[tuple, int, int]:
    """(the GM views of a kernel that may take its rows at run time, None for an operand not
    indexed by them; how many of them it reads; its elements per batch row). Its leading
    iteration dim must be the traced `chunk` rows, kept (a reduction or a row kernel over
    other axes; a matmul's M): the per-argument proof in `RuntimeRows.make` then shows that
    dim walks the batch rows. Raises NotBatched."""
    kind = type(ir)
    if kind is K.MatmulKernel:
        if ir.batch or ir.col_sums or ir.b_im2col or ir.m != chunk or chunk < 2:
            raise NotBatched(f"kernel {name} (matmul) does not have the batch rows as its M")
        reads = (ir.a, None, *ir.epi_inputs)
        views = (*reads, *ir.outputs, *ir.row_red_outputs, *ir.softmax_outputs)
        return views, len(reads), max(ir.k, ir.n, 1)
    if kind is K.ElementwiseKernel:
        shape, views, n_in = ir.shape, (*ir.inputs, *ir.outputs), len(ir.inputs)
    elif kind is K.ReduceKernel or kind is K.RowKernel:
        shape = ir.in_shape
        if shape and 0 in {a % len(shape) for a in ir.axes}:
            raise NotBatched(f"kernel {name} ({ir.kind}) reduces over the leading dim")
        epi = ir.epi_inputs if kind is K.ReduceKernel else ()
        views, n_in = (*ir.inputs, *epi, *ir.outputs), len(ir.inputs) + len(epi)
    else:
        raise NotBatched(f"kernel {name} ({getattr(ir, 'kind', '?')}) reads batch rows and "
                         "takes no run-time row count")  # fmt: skip
    if not shape or shape[0] != chunk or chunk < 2:
        raise NotBatched(f"kernel {name} ({ir.kind}) does not iterate over the batch rows first")
    return views, n_in, math.prod(shape[1:])


def _dynamic_ir(ir, capacity: int):
    """`ir` (a kernel `_batch_views` accepted) as its dynamic kind serving up to `capacity`
    rows: every view's leading dim and the iteration space's are the capacity."""

    def lead(shape: tuple) -> tuple:
        return (capacity, *shape[1:])

    def views(vs: tuple) -> tuple:
        return tuple(dataclasses.replace(v, shape=lead(v.shape)) for v in vs)

    fields = {f.name: getattr(ir, f.name) for f in dataclasses.fields(ir)}
    if type(ir) is K.MatmulKernel:
        fields.update(m=capacity, a=views((ir.a,))[0], epi_inputs=views(ir.epi_inputs),
                      outputs=views(ir.outputs), row_red_outputs=views(ir.row_red_outputs),
                      softmax_outputs=views(ir.softmax_outputs))  # fmt: skip
        return K.DynamicMatmulKernel(**fields)
    if type(ir) is K.ElementwiseKernel:
        fields.update(shape=lead(ir.shape), inputs=views(ir.inputs), outputs=views(ir.outputs))
        return K.DynamicElementwiseKernel(**fields)
    fields.update(in_shape=lead(ir.in_shape), out_shape=lead(ir.out_shape),
                  inputs=views(ir.inputs), outputs=views(ir.outputs))  # fmt: skip
    if type(ir) is K.ReduceKernel:
        fields.update(epi_inputs=views(ir.epi_inputs))
        return K.DynamicReduceKernel(**fields)
    return K.DynamicRowKernel(**fields)


def _row_local(v, row: int) -> bool:
    """Whether element (i, ...) of view `v` always lies in row i of a buffer of `row`
    elements per row (the leading stride is one row, the other axes stay inside it)."""
    if not v.shape or v.strides[0] != row:
        return False
    lo = hi = v.offset
    for n, st in zip(v.shape[1:], v.strides[1:]):
        if n > 1:
            lo += min(0, (n - 1) * st)
            hi += max(0, (n - 1) * st)
    return 0 <= lo and hi < max(row, 1)


def _rows(a: np.ndarray, start: int, n: int) -> np.ndarray:
    """Rows [start, start + n) of `a` as a C-contiguous array of exactly n rows; missing rows
    repeat the last real one (edge padding: padded rows compute on real data, so an integer
    division or a log sees nothing a real row would not)."""
    part = a[start : start + n]
    if part.shape[0] == n and part.flags.c_contiguous:
        return part
    out = np.empty((n,) + a.shape[1:], a.dtype)
    m = part.shape[0]
    out[:m] = part
    if m < n:
        out[m:] = part[m - 1] if m else 0
    return out
