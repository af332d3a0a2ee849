"""Turn one fused group of graph nodes into the backend's kernel IR.

`ExprBuilder` walks from a group's roots down to its boundary (leaves, constants, buffers
written by other kernels), carrying the chain of view nodes met on the way. Elementwise nodes
become SSA scalar ops; at the boundary the view chain composes with the buffer's own strides
into one `ArgView`, so views are read in place. The walk is iterative (deep chains are fine).
An AI CPU group becomes a straight-line program of whole-array steps (`aicpu_kernel`).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

from lazymath.backend.npu.kernel_ir import AicpuKernel, AicpuStep, ArgView, SOp, contiguous_view
from lazymath.fusion import rules, views
from lazymath.graph.node import Node
from lazymath.graph.ops import ELEMENTWISE

# Runtime scalars folded back into kernels. A 0-d leaf buffer (a Python scalar from user code,
# see tensor._scalar_arg) is a kernel input by default, so a new value reuses the kernel; some
# kernel forms take no extra input (a matmul row reduction's epilogue, a pipelined row kernel)
# or hit the input cap, and the engine then re-plans with such leaves folded in as constants
# when that gives fewer kernels (`folding`); the program is then checked against the values it
# was specialized for (engine.run_compiled). Thread-local: threads compile different graphs.
_FOLD = threading.local()


@contextmanager
def folding(leaf_ids: set[int]):
    """Fold the 0-d leaves whose ids are in `leaf_ids` into the kernels built inside the block
    as constants; yields the set of ids actually folded (filled as kernels are built)."""
    prev = getattr(_FOLD, "ids", None), getattr(_FOLD, "used", None)
    _FOLD.ids, _FOLD.used = leaf_ids, set()
    try:
        yield _FOLD.used
    finally:
        _FOLD.ids, _FOLD.used = prev


def folded_leaf(node: Node) -> bool:
    """Whether `node` is a 0-d leaf folded into kernels as a constant in this plan (`folding`):
    the planner then counts it as a constant, not as an input."""
    fold = getattr(_FOLD, "ids", None)
    return bool(fold) and id(node) in fold


class NeedMaterialize(Exception):
    """A view chain cannot be composed into strides: the node must be written to GM first."""

    def __init__(self, node: Node, reason: str):
        super().__init__(reason)
        self.node = node
        self.reason = reason


class CapExceeded(Exception):
    """A fused expression grew past a per-kernel cap."""

    def __init__(self, what: str, limit: int):
        super().__init__(f"{what} exceeds the per-kernel cap of {limit}")
        self.what = what
        self.limit = limit


def base_view(node: Node, copied: frozenset[int] = frozenset()) -> views.SView:
    """How a boundary node's buffer is laid out: realized arrays keep their strides, buffers
    produced by kernels in this program are contiguous, and so are the user arrays in `copied`
    (ids of leaves the plan copies to contiguous memory before the program runs)."""
    if node.realized is not None and id(node) not in copied:
        sv = views.of_array(node.realized)
        if sv is None:
            raise NeedMaterialize(node, "array strides are not a multiple of the item size")
        return sv
    return views.contiguous(node.shape)


class ExprBuilder:
    """Builds one SSA expression over an iteration space.

    `internal` holds ids of nodes computed inside this kernel; anything else that is not a
    constant is loaded from GM. `acc` (optional) is the reduce/matmul node whose value the
    epilogue receives in registers.
    """

    def __init__(self, iter_shape, internal: set[int], acc: Node | None = None,
                 acc_dtype: str | None = None, copied: frozenset[int] = frozenset()):  # fmt: skip
        self.iter_shape = tuple(iter_shape)
        self.copied = copied
        self.internal = internal
        self.acc = acc
        self.acc_dtype = acc_dtype
        self.ops: list[SOp] = []
        self.inputs: list[ArgView] = []
        self.input_nodes: list[Node] = []
        self._input_index: dict[tuple, int] = {}
        self._memo: dict[tuple, int] = {}
        self._op_memo: dict[SOp, int] = {}

    def _emit(self, op: SOp) -> int:
        hit = self._op_memo.get(op)
        if hit is not None:
            return hit
        if len(self.ops) >= rules.MAX_KERNEL_OPS:
            raise CapExceeded("scalar ops", rules.MAX_KERNEL_OPS)
        self.ops.append(op)
        self._op_memo[op] = len(self.ops) - 1
        return len(self.ops) - 1

    def _load(self, node: Node, chain: tuple[Node, ...]) -> int:
        sv, bad = views.compose(base_view(node, self.copied), chain)
        if sv is None:
            raise NeedMaterialize(bad.srcs[0], f"reshape {bad.srcs[0].shape} -> {bad.shape} of a"
                                  " strided view needs a copy")  # fmt: skip
        key = (id(node), sv)
        idx = self._input_index.get(key)
        if idx is None:
            if len(self.inputs) >= rules.MAX_KERNEL_INPUTS:
                raise CapExceeded("GM inputs", rules.MAX_KERNEL_INPUTS)
            idx = len(self.inputs)
            self._input_index[key] = idx
            self.inputs.append(ArgView(node.dtype.name, sv.shape, sv.strides, sv.offset))
            self.input_nodes.append(node)
        return self._emit(SOp("load", node.dtype.name, (), idx))

    def value(self, root: Node, chain: tuple[Node, ...] = ()) -> int:
        """SSA index of `root` seen through `chain` (views met above it)."""
        stack = [(root, chain, False)]
        memo = self._memo
        while stack:
            node, ch, ready = stack.pop()
            key = (id(node), ch)
            if key in memo:
                continue
            if node is self.acc:
                sv, _ = views.compose(views.contiguous(node.shape), ch)
                if sv is None or not views.same_layout(sv, views.contiguous(self.iter_shape)):
                    raise NeedMaterialize(
                        node,
                        "the consumer reads the result through a view "
                        "(broadcast/transpose), over another iteration space",
                    )
                v = self._emit(SOp("acc", self.acc_dtype, ()))
                if self.acc_dtype != node.dtype.name:
                    v = self._emit(SOp("cast", node.dtype.name, (v,)))
                memo[key] = v
                continue
            if node.op == "const":
                memo[key] = self._emit(SOp("const", node.dtype.name, (), node.realized.item()))
                continue
            fold = getattr(_FOLD, "ids", None)
            if fold and id(node) in fold:  # a runtime scalar folded back (see `folding`)
                _FOLD.used.add(id(node))
                memo[key] = self._emit(SOp("const", node.dtype.name, (), node.realized.item()))
                continue
            if id(node) not in self.internal:
                memo[key] = self._load(node, ch)
                continue
            if node.op in views.VIEW_OPS:
                src = node.srcs[0]
                sub = (id(src), ch + (node,))
                if sub in memo:
                    memo[key] = memo[sub]
                elif ready:
                    raise RuntimeError("view source was not computed")  # pragma: no cover
                else:
                    stack.append((node, ch, True))
                    stack.append((src, ch + (node,), False))
                continue
            if node.op not in ELEMENTWISE:
                memo[key] = self._non_elementwise(node, ch)
                continue
            if not ready:
                stack.append((node, ch, True))
                for s in node.srcs:
                    if (id(s), ch) not in memo:
                        stack.append((s, ch, False))
                continue
            srcs = tuple(memo[(id(s), ch)] for s in node.srcs)
            arg = node.arg if node.op == "leaky_relu" else None
            memo[key] = self._emit(SOp(node.op, node.dtype.name, srcs, arg))
        return memo[(id(root), chain)]

    def _non_elementwise(self, node: Node, chain: tuple[Node, ...]) -> int:
        raise RuntimeError(f"{node.op} cannot be inside a fused expression")


def is_identity_load(expr, result: int) -> bool:
    return len(expr) == 1 and expr[result].op == "load" and expr[result].arg == 0


class RowExprBuilder(ExprBuilder):
    """ExprBuilder for a row kernel: reductions over `axes` of `iter_shape` inside the group
    become ``reduce`` ops; their results must be read broadcast over exactly those axes."""

    def __init__(self, iter_shape, axes, internal: set[int], copied: frozenset[int] = frozenset()):
        super().__init__(iter_shape, internal, copied=copied)
        self.axes = tuple(axes)
        strides, acc = [0] * len(self.iter_shape), 1
        for d in range(len(self.iter_shape) - 1, -1, -1):
            if d not in self.axes:
                strides[d] = acc
                acc *= max(self.iter_shape[d], 1)
        self._row_view = views.SView(self.iter_shape, tuple(strides), 0)

    def _non_elementwise(self, node: Node, ch: tuple[Node, ...]) -> int:
        if node.op != "reduce":
            return super()._non_elementwise(node, ch)
        sv, _ = views.compose(views.contiguous(node.shape), ch)
        if sv is None or not views.same_layout(sv, self._row_view) or sv.shape != self.iter_shape:
            raise NeedMaterialize(node, "a row reduction read other than broadcast over its rows")
        op, _axes = node.arg
        src = node.srcs[0]
        s = self.value(src, ())
        acc = node.dtype.name
        if op in ("sum", "prod") and acc == "float16":
            acc = "float32"
        v = self._emit(SOp("reduce", acc, (s,), op))
        if acc != node.dtype.name:
            v = self._emit(SOp("cast", node.dtype.name, (v,)))
        return v


def aicpu_kernel(nodes: list[Node], inputs: list[Node], outputs: list[Node],
                 copied: frozenset[int] = frozenset()) -> AicpuKernel:  # fmt: skip
    """The AI CPU program of a group: one step per member node (`nodes`, sources first), a
    ``load`` step for each boundary node it reads (`inputs`, in argument order) and a
    ``const`` step per constant. No graph node is kept in the result."""
    steps: list[AicpuStep] = []
    value: dict[int, int] = {}  # id(node) -> step index
    pos = {id(n): i for i, n in enumerate(inputs)}

    def operand(s: Node) -> int:
        v = value.get(id(s))
        if v is None:
            if s.op == "const":
                step = AicpuStep("const", s.dtype.name, (), (), s.realized.item())
            else:
                step = AicpuStep("load", s.dtype.name, tuple(s.shape), (), pos[id(s)])
            v = value[id(s)] = len(steps)
            steps.append(step)
        return v

    for n in nodes:
        srcs = tuple(operand(s) for s in n.srcs)
        value[id(n)] = len(steps)
        steps.append(AicpuStep(n.op, n.dtype.name, tuple(n.shape), srcs, n.arg))
    views_in = []
    for n in inputs:
        sv = base_view(n, copied)
        views_in.append(ArgView(n.dtype.name, sv.shape, sv.strides, sv.offset))
    return AicpuKernel(
        tuple(views_in),
        tuple(steps),
        tuple(value[id(o)] for o in outputs),
        tuple(contiguous_view(o.dtype.name, tuple(o.shape)) for o in outputs),
    )
