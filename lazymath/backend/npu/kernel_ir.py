"""What the fusion layer hands to the backend: one frozen description per fused kernel.

This is the contract between layer 3 (fusion) and layer 4 (backend). A kernel is a template kind
(elementwise, reduce, matmul, rows, custom, aicpu) plus GM argument views plus small scalar
expressions in SSA form (`SOp` tuples). Templates turn these into NPU ISA programs; an AI CPU
kernel is a short straight-line numpy program instead (`AicpuKernel`, a tuple of `AicpuStep`).
Nothing here knows about graphs.

Conventions
- dtypes are numpy dtype *names* (``"float32"``), so everything is hashable and printable.
- An `ArgView` addresses a flat GM buffer: element ``idx`` of the kernel's iteration space lives
  at ``offset + sum(idx[d] * strides[d])`` elements from the buffer start. Broadcast axes have
  stride 0, flipped axes negative strides; views are read in place, never copied.
- An expression is a tuple of `SOp`; op ``i`` may only reference ops ``< i``. Binary ops get
  operands of one dtype (the fusion layer inserts ``cast``); comparisons return ``bool``.
  ``load`` reads input ``arg`` of the enclosing stage at the current index; ``acc`` is the
  reduced/accumulated value in an epilogue; ``const`` holds a Python scalar in ``arg``.
"""

from __future__ import annotations

from dataclasses import dataclass

from lazymath.graph.ops import ELEMENTWISE
from lazymath.graph.ops import REDUCE_OPS as REDUCE_OPS  # the reduce ops a ReduceKernel takes

# Scalar op vocabulary: name -> arity, the op registry's elementwise ops (`graph.ops.Op`) plus
# three leaves. ``arg`` carries the extra parameter where the op record says so (leaky_relu's
# slope); ``cast`` converts to the op's dtype; ``where(cond: bool, a, b)``.
SCALAR_OPS: dict[str, int] = {
    "load": 0,  # arg = input index
    "const": 0,  # arg = python scalar (already of the op's dtype)
    "acc": 0,  # the accumulator value (reduce/matmul epilogues only)
    **{name: op.arity for name, op in ELEMENTWISE.items()},
}

# RowKernel expressions also hold "reduce" ops (arg = one of ROW_REDUCE_OPS, one source).
ROW_REDUCE_OPS = ("sum", "prod", "max", "min")


@dataclass(frozen=True, slots=True)
class SOp:
    """One scalar SSA value of a fused expression."""

    op: str
    dtype: str
    srcs: tuple[int, ...] = ()
    arg: object = None


Expr = tuple[SOp, ...]


@dataclass(frozen=True, slots=True)
class ArgView:
    """A GM buffer as one kernel stage indexes it (see module docstring)."""

    dtype: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # in elements
    offset: int = 0  # in elements

    @property
    def contiguous(self) -> bool:
        expect = 1
        for size, stride in zip(reversed(self.shape), reversed(self.strides)):
            if size != 1 and stride != expect:
                return False
            expect *= size
        return True


def contiguous_view(dtype: str, shape: tuple[int, ...]) -> ArgView:
    strides, acc = [], 1
    for size in reversed(shape):
        strides.append(acc)
        acc *= max(size, 1)
    return ArgView(dtype, tuple(shape), tuple(reversed(strides)), 0)


@dataclass(frozen=True)
class ElementwiseKernel:
    """outputs[j][idx] = expr[results[j]] evaluated at every idx of `shape`."""

    shape: tuple[int, ...]
    inputs: tuple[ArgView, ...]
    outputs: tuple[ArgView, ...]
    expr: Expr
    results: tuple[int, ...]
    kind: str = "elementwise"


# The GM argument a dynamic-shape kernel reads its run-time extent from (one int64 word, after
# the views: AscendC passes its tiling data the same way, as one more GM address).
TILING_VIEW = ArgView("int64", (1,), (1,), 0)


@dataclass(frozen=True)
class DynamicElementwiseKernel(ElementwiseKernel):
    """An ElementwiseKernel whose leading dim is a run-time size: `shape[0]` is the most it
    serves (buffers are sized for it), the actual extent is read at launch from one more GM
    argument (`TILING_VIEW`, after the outputs; `isa.GetValue`), and every loop bound and tail
    count follows from it. Views step their rows by `strides[0]`, so rows past the extent are
    never touched: one compiled kernel serves every batch of 0..shape[0] rows.

    Why a kind of its own: the disk and memory kernel caches key on the IR's repr and value,
    so the dynamic kernel and the static one at the capacity never share code."""

    kind: str = "elementwise"


@dataclass(frozen=True)
class ReduceKernel:
    """Reduce prologue[prologue_result] over `axes` of `in_shape`, then run the epilogue.

    The prologue reads `inputs` (views over `in_shape`). The epilogue runs over `out_shape`
    (= in_shape without `axes`), reads the reduced value through ``acc`` (dtype `acc_dtype`,
    ``int64`` for argmax/argmin, whose index is flat over the reduced axes in C order) and
    `epi_inputs` (views over `out_shape`) through ``load``.
    """

    in_shape: tuple[int, ...]
    axes: tuple[int, ...]
    op: str
    inputs: tuple[ArgView, ...]
    prologue: Expr
    prologue_result: int
    acc_dtype: str
    out_shape: tuple[int, ...]
    epi_inputs: tuple[ArgView, ...]
    epilogue: Expr
    results: tuple[int, ...]
    outputs: tuple[ArgView, ...]
    kind: str = "reduce"


@dataclass(frozen=True)
class DynamicReduceKernel(ReduceKernel):
    """A ReduceKernel whose leading dim is a run-time size (lm.jit's dynamic batch): axis 0 is
    kept (never reduced), `in_shape[0]` (= `out_shape[0]`) is the most rows it serves, and the
    actual count is read at launch from `TILING_VIEW` (after the outputs), as for
    `DynamicElementwiseKernel`. Each row's reduction is tiled as at the bound, so a row's
    value does not depend on how many rows the launch has."""

    kind: str = "reduce"


def im2col_operand(x: ArgView, arg: tuple) -> ArgView:
    """The B view of an implicit-GEMM matmul (`MatmulKernel.b_im2col`): x (N, C, L) as
    (N, C, L) for groups 1, else (N, G, C/G, L) (the group a batch axis)."""
    groups = arg[4]
    if groups == 1:
        return x
    (n, c, length), (sn, sc, sl) = x.shape, x.strides
    cpg = c // groups
    return ArgView(x.dtype, (n, groups, cpg, length), (sn, cpg * sc, sc, sl), x.offset)


@dataclass(frozen=True)
class MatmulKernel:
    """C[b, m, n] = epilogue(sum_k A'[b, m, k] * B'[b, k, n]) with float32 accumulation.

    `a` is a view over batch + (m, k), `b` over batch + (k, n): transposes and broadcast batch
    axes are just strides, absorbed by the GM -> L1 packing. A' = a_prologue applied to each A
    element on its way into L1 (``load`` 0 is the raw element; None means identity), likewise B'.
    `in_dtype` is the operand dtype fed to the Cube (float16 or float32). The epilogue reads the
    float32 accumulator through ``acc`` and `epi_inputs` (views over batch + (m, n)).
    `col_sums[j]` is an epilogue value summed over m (float32 accumulation) and written to
    `col_sum_outputs[j]` (a view over batch + (n,)): a column sum of the product computed along
    the output tiles instead of a second pass over the written product.
    `row_reds[j]` = (op, value): an epilogue value reduced over n (op sum / max / min, float32
    accumulation) and written to `row_red_outputs[j]` (a view over batch + (m,)): each output
    tile reduces its rows over its columns, the N panels' partials are combined in GM.
    `softmax[j]`: an epilogue value x whose softmax over n is written to `softmax_outputs[j]`
    (over batch + (m, n)): each tile writes exp(x - its row max) and publishes (row max, row sum)
    per N panel; the row block's last panel rescales the written rows (online softmax).
    """

    batch: tuple[int, ...]
    m: int
    n: int
    k: int
    a: ArgView
    b: ArgView
    a_prologue: Expr | None
    b_prologue: Expr | None
    in_dtype: str
    epi_inputs: tuple[ArgView, ...]
    epilogue: Expr
    results: tuple[int, ...]
    outputs: tuple[ArgView, ...]
    kind: str = "matmul"
    col_sums: tuple[int, ...] = ()
    col_sum_outputs: tuple[ArgView, ...] = ()
    row_reds: tuple[tuple[str, int], ...] = ()
    row_red_outputs: tuple[ArgView, ...] = ()
    # per row reduction, None or an expression applied to the final float32 row value (``acc``)
    # before it is written, e.g. a mean's `* (1/n)` and cast
    row_posts: tuple[Expr | None, ...] = ()
    softmax: tuple[int, ...] = ()
    softmax_outputs: tuple[ArgView, ...] = ()
    # implicit GEMM (conv1d): (K, stride, dilation, pad_left) when `b` is the conv input x seen
    # over batch + (C/groups, L) and B'[.., c*K + j, l] = x[.., c, l*stride + j*dilation -
    # pad_left] (0 outside x): the GM -> L1 packing builds the windows (backend/host/im2col.py)
    b_im2col: tuple[int, int, int, int] | None = None


@dataclass(frozen=True)
class DynamicMatmulKernel(MatmulKernel):
    """A MatmulKernel whose M is a run-time size (lm.jit's dynamic batch, the batch in M): `m`
    is the most rows it serves (A, the epilogue inputs and the outputs are views over `m`
    rows), the actual M is read at launch from `TILING_VIEW` (after the views, before a
    workspace), and the M groups, tails and block range follow it. No stacked batch and no
    column sums (a sum over M would mix the rows). A row's product is tiled (K panels, float32
    accumulation order) as at the bound, so it does not depend on how many rows a launch has."""

    kind: str = "matmul"


@dataclass(frozen=True)
class RowKernel:
    """Reductions over `axes` of `in_shape` and the elementwise ops around them, as one
    expression over the rows (a row = the reduced axes at one kept index).

    ``reduce`` ops (``arg`` = sum/prod/max/min, one source) reduce their source over the row;
    their value, and every op computed only from such values, constants and loads whose view
    has stride 0 on all reduced axes, is one value per row ("row level"), read broadcast by
    the row's elements. Other ops run per element ("full level"). Inputs are views over
    `in_shape`. Output j is over `in_shape` when `row_outputs[j]` is False, otherwise over the
    kept dims (`out_shape`, or `in_shape` with the reduced axes of size 1). A reduce op's dtype
    is its accumulator's (float32 for a float16 sum); the template may accumulate wider.
    """

    in_shape: tuple[int, ...]
    axes: tuple[int, ...]
    inputs: tuple[ArgView, ...]
    expr: Expr
    results: tuple[int, ...]
    outputs: tuple[ArgView, ...]
    row_outputs: tuple[bool, ...]
    out_shape: tuple[int, ...]
    kind: str = "rows"


@dataclass(frozen=True)
class DynamicRowKernel(RowKernel):
    """A RowKernel whose leading dim is a run-time size (lm.jit's dynamic batch): axis 0 is
    kept, `in_shape[0]` is the most rows it serves, the count is read at launch from
    `TILING_VIEW` (after the outputs). A softmax or layernorm row is computed as at the
    bound whatever the count."""

    kind: str = "rows"


# kernels whose leading dim is a run-time extent: they take TILING_VIEW after their views
DYNAMIC_KINDS = (DynamicElementwiseKernel, DynamicReduceKernel, DynamicRowKernel,
                 DynamicMatmulKernel)  # fmt: skip


@dataclass(frozen=True)
class CustomKernel:
    """A user kernel (`lazymath.kernel`): the definition registered under `key` (module,
    name and source hash; `graph.custom`) builds the program from these GM views (dense,
    offset 0) and the keyword `params` (a sorted tuple of (name, value)). `unit` is "vector"
    or "cube". `outputs[0]` holds epilogue(value) when an epilogue is fused, else the value."""

    key: str
    name: str
    unit: str
    inputs: tuple[ArgView, ...]
    outputs: tuple[ArgView, ...]
    params: tuple = ()
    # consumers fused into the author's epilogue slot (`k.epilogue(tile, n)`): an expression
    # over ``acc`` (the kernel's value, its output dtype) and constants; () = none
    epilogue: Expr = ()
    epilogue_result: int = -1
    kind: str = "custom"


@dataclass(frozen=True, slots=True)
class AicpuStep:
    """One whole-array value of an AI CPU program: `op` applied to the values `srcs` (indices
    of earlier steps) with the op's parameter `arg`, giving a `dtype` array of `shape`.

    `op` is an op registry name (`graph.ops.Op`: elementwise ops, views, matmul, reduce, pad,
    concat, conv1d, fft, ...; `arg` as the graph node holds it) or one of two leaves:
    ``load`` (arg = input index: the kernel's input array as passed) and ``const`` (arg = a
    Python scalar of `dtype`, a 0-d array)."""

    op: str
    dtype: str
    shape: tuple[int, ...]
    srcs: tuple[int, ...] = ()
    arg: object = None


@dataclass(frozen=True)
class AicpuKernel:
    """A kernel for the AI CPU (numpy on the host, for the ops and dtypes the AI Core lacks):
    `steps` run in order, one numpy operation each (the reference executor's rule for the op,
    `graph.reference`), and output j is step `results[j]`, written into the contiguous view
    `outputs[j]`. `inputs[i]` is how input i is laid out in memory; the AI CPU reads it as the
    numpy array it is, and view ops (reshape, permute, expand, slice, window) are steps that
    make numpy views, so nothing is copied before an op needs it."""

    inputs: tuple[ArgView, ...]
    steps: tuple[AicpuStep, ...]
    results: tuple[int, ...]
    outputs: tuple[ArgView, ...]
    kind: str = "aicpu"

    def as_text(self) -> str:
        """The program, one step a line (``%i = op srcs [arg] -> dtype[shape]``)."""
        lines = [f"aicpu kernel: {len(self.inputs)} input(s), {len(self.steps)} step(s), "
                 f"{len(self.outputs)} output(s)"]  # fmt: skip
        for i, v in enumerate(self.inputs):
            lay = "" if v.contiguous and not v.offset else f" strides {v.strides} offset {v.offset}"
            lines.append(f"  in{i}: {v.dtype}{list(v.shape)}{lay}")
        for i, s in enumerate(self.steps):
            if s.op == "load":
                what = f"load in{s.arg}"
            elif s.op == "const":
                what = f"const {s.arg!r}"
            else:
                what = " ".join([s.op, *(f"%{j}" for j in s.srcs)])
                if s.arg is not None:
                    what += f" {s.arg!r}"
            lines.append(f"  %{i} = {what} -> {s.dtype}{list(s.shape)}")
        for j, (r, v) in enumerate(zip(self.results, self.outputs)):
            lines.append(f"  out{j} = %{r}: {v.dtype}{list(v.shape)}")
        return "\n".join(lines)


KernelIR = ElementwiseKernel | ReduceKernel | MatmulKernel | RowKernel | CustomKernel | AicpuKernel


def view_extent(v: ArgView) -> int:
    """Elements a flat buffer needs so every element of view `v` is in bounds."""
    if any(s == 0 for s in v.shape):
        return 0
    hi = v.offset + sum((n - 1) * s for n, s in zip(v.shape, v.strides) if s > 0)
    return hi + 1


def kernel_args(k: KernelIR) -> tuple[ArgView, ...]:
    """GM arguments in calling order: inputs (then epilogue inputs), then outputs.

    The compiled kernel is called with one base pointer per entry, in exactly this order.
    """
    if isinstance(k, DYNAMIC_KINDS):
        return (*_static_args(k), TILING_VIEW)
    return _static_args(k)


def _static_args(k: KernelIR) -> tuple[ArgView, ...]:
    if isinstance(k, ElementwiseKernel):
        return (*k.inputs, *k.outputs)
    if isinstance(k, ReduceKernel):
        return (*k.inputs, *k.epi_inputs, *k.outputs)
    if isinstance(k, (RowKernel, CustomKernel, AicpuKernel)):
        return (*k.inputs, *k.outputs)
    reds = (*k.col_sum_outputs, *k.row_red_outputs, *k.softmax_outputs)
    return (k.a, k.b, *k.epi_inputs, *k.outputs, *reds)
