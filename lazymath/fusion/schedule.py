"""The printable result of compilation: kernels with unit, cost class, streams and the plan.

`lm.schedule(*tensors)` returns a `Schedule` without executing anything; tests count kernels on
it and users print it. Units: ``cube`` (a Cube kernel, its epilogue on the same core), ``mix``
(a Cube kernel with a Vector prologue on an operand), ``vector``, ``aicpu`` (types or ops the
AI Core lacks, run by the numpy reference on the host CPU).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

from lazymath.backend.npu.kernel_ir import (
    AicpuKernel,
    ArgView,
    CustomKernel,
    ElementwiseKernel,
    MatmulKernel,
    ReduceKernel,
    RowKernel,
)
from lazymath.fusion.memory import MemoryPlan
from lazymath.graph.custom import get
from lazymath.graph.ops import ELEMENTWISE
from lazymath.units import fmt_bytes


def view_bytes(v: ArgView) -> int:
    """Bytes a kernel actually moves for a view: broadcast (stride 0) axes are read once."""
    n = 1
    for s, st in zip(v.shape, v.strides):
        if st != 0:
            n *= s
    return n * np.dtype(v.dtype).itemsize


def _expr_flops(expr) -> int:
    return sum(1 for o in expr if o.op not in ("load", "const", "acc", "cast"))


def kernel_cost_class(ir, unit: str, spec) -> tuple[int, int]:
    """(FLOPs, bytes moved) of one kernel, from its kernel IR (an AI CPU kernel's bytes: its
    whole inputs and outputs)."""
    if isinstance(ir, ElementwiseKernel):
        size = math.prod(ir.shape)
        return size * _expr_flops(ir.expr), sum(map(view_bytes, ir.inputs + ir.outputs))
    if isinstance(ir, ReduceKernel):
        size_in, size_out = math.prod(ir.in_shape), math.prod(ir.out_shape)
        flops = size_in * (_expr_flops(ir.prologue) + 1) + size_out * _expr_flops(ir.epilogue)
        return flops, sum(map(view_bytes, ir.inputs + ir.epi_inputs + ir.outputs))
    if isinstance(ir, RowKernel):
        flops = math.prod(ir.in_shape) * _expr_flops(ir.expr)
        return flops, sum(map(view_bytes, ir.inputs + ir.outputs))
    if isinstance(ir, MatmulKernel):
        b = math.prod(ir.batch)
        flops = 2 * b * ir.m * ir.n * ir.k + b * ir.m * ir.n * _expr_flops(ir.epilogue)
        moved = view_bytes(ir.a) + view_bytes(ir.b)
        moved += sum(map(view_bytes, ir.epi_inputs + ir.outputs + ir.col_sum_outputs))
        moved += sum(map(view_bytes, ir.row_red_outputs + ir.softmax_outputs))
        return flops, moved
    if isinstance(ir, CustomKernel):  # the author's FLOP count (`lazymath.kernel(flops=...)`)
        flops = get(ir.key).flop_count(ir)
        flops += math.prod(ir.outputs[0].shape) * _expr_flops(ir.epilogue)
        return flops, sum(map(view_bytes, ir.inputs + ir.outputs))
    if isinstance(ir, AicpuKernel):
        return _aicpu_flops(ir), sum(_full_bytes(v) for v in ir.inputs + ir.outputs)
    raise TypeError(f"no cost rule for kernel IR {type(ir).__name__}")


def _full_bytes(v: ArgView) -> int:
    return math.prod(v.shape) * np.dtype(v.dtype).itemsize


def _aicpu_flops(ir) -> int:
    """AI CPU work, approximately: elementwise ops over their sizes, matmul/conv/fft counts."""
    flops = 0
    steps = ir.steps
    for st in steps:
        size = math.prod(st.shape)
        if st.op in ELEMENTWISE:
            flops += size
        elif st.op == "matmul":
            flops += 2 * size * steps[st.srcs[0]].shape[-1]
        elif st.op == "reduce":
            flops += math.prod(steps[st.srcs[0]].shape)
        elif st.op == "conv1d":  # 2 * C_in/groups * K per output element (+ the bias add)
            cpg, k = steps[st.srcs[1]].shape[1:]
            flops += size * (2 * cpg * k + (len(st.srcs) > 2))
        elif st.op == "fft":  # the radix-2 count, 5 n log2 n per transform of length n
            ax = st.arg[2]
            length = max(st.arg[1] or steps[st.srcs[0]].shape[ax], st.shape[ax])
            flops += int(5 * (size // max(st.shape[ax], 1)) * length
                         * math.log2(max(length, 2)))  # fmt: skip
    return flops


def ridge_point(unit: str, spec) -> float:
    """FLOP/byte where the unit's peak meets HBM bandwidth (roofline ridge)."""
    if unit in ("cube", "mix"):
        return spec.peak_flops / spec.hbm_bytes_per_s
    lanes = spec.vector_bytes_per_repeat / 4  # fp32 lanes per repeat
    vec_peak = spec.vector_cores * lanes / spec.vector_cycles_per_repeat * spec.clock_hz
    return vec_peak / spec.hbm_bytes_per_s


@dataclass(eq=False, frozen=True)
class ScheduledKernel:
    """One fused kernel as planned: its unit, ops, roofline class, stream and events, and its
    kernel IR. Frozen: the compile stage returns a new record with `compiled` set
    (`Schedule.compiled_with`) rather than writing into the planned one."""

    name: str
    unit: str  # cube | mix | vector | aicpu
    kind: str  # elementwise | reduce | matmul | aicpu
    ops: list[str]
    inputs: list[str]
    outputs: list[str]
    flops: int
    bytes: int
    bound: str  # compute | memory
    ir: object
    group: object = None
    stream: int = 0
    waits: tuple[int, ...] = ()
    records: int | None = None
    compiled: object = None
    source_loc: str = ""

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes if self.bytes else float("inf")

    def as_text(self) -> str:
        """This kernel in words: a header line, then its NPU program once compiled (else its
        kernel IR)."""
        head = (
            f"{self.name}: {self.unit} {self.kind}, {' '.join(self.ops)}; "
            f"{_fmt_num(self.flops)}flop {fmt_bytes(self.bytes)} ({self.bound}-bound), "
            f"stream {self.stream}"
        )
        if self.compiled is not None:
            body = self.isa
        else:
            body = self.ir.as_text() if hasattr(self.ir, "as_text") else str(self.ir or "")
        return head + ("\n" + body if body else "")

    @property
    def isa(self) -> str:
        """The NPU program (ISA listing) of this kernel."""
        if self.compiled is None:
            return "<not compiled>"
        return getattr(self.compiled, "isa_text", "") or str(getattr(self.compiled, "program", ""))

    @property
    def llvm_ir(self) -> str:
        return getattr(self.compiled, "llvm_ir", None) or "<no LLVM IR for this kernel>"

    @property
    def asm(self) -> str:
        return getattr(self.compiled, "asm", None) or "<no assembly for this kernel>"


def _fmt_num(x: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.1f} {unit}"
    return f"{x:.0f}"


@dataclass(eq=False, frozen=True)
class Schedule:
    """The planned program: fused kernels in launch order, the memory plan, the fusion log and
    the stream/event assignment. Frozen: `lm.schedule`, `lm.explain`, the debug levels and the
    visualizations read it; the compile stage derives a new Schedule (`compiled_with`)."""

    kernels: list[ScheduledKernel]
    memory: MemoryPlan
    fusion_log: list
    spec: object
    n_streams: int = 1
    n_events: int = 0
    outputs: list = field(default_factory=list)
    # ids of user arrays (leaf nodes) the program reads through a contiguous copy: the plan
    # never replaces a user's array, it asks the runtime to copy it at each run
    copy_inputs: frozenset = frozenset()
    # id(node) -> the output node whose memory it is written to, typed as the node (a
    # complex_join that only reinterprets bytes: fusion._elide_bitcasts); the engine's slots
    aliases: dict = field(default_factory=dict)
    # The backend's lines of the printout (the vector-math call plan, the host target and each
    # matmul's host GEMM mapping): backend decisions, so the driver that made the schedule
    # hands over the function that words them (engine.backend_report); fusion imports no backend.
    report: object = None  # (Schedule) -> list[str], or None: no backend lines

    @property
    def planned_peak_bytes(self) -> int:
        return self.memory.planned_peak_bytes

    def table(self) -> str:
        head = ("kernel", "unit", "ops", "bound", "flops", "bytes", "stream", "waits")
        rows = [head]
        for k in self.kernels:
            ops = (
                " ".join(k.ops)
                if len(k.ops) <= 6
                else " ".join(k.ops[:5]) + f" ..(+{len(k.ops) - 5})"
            )
            rows.append((k.name, k.unit, ops, k.bound, _fmt_num(k.flops), _fmt_num(k.bytes),
                         str(k.stream), ",".join(f"e{w}" for w in k.waits) or "-"))  # fmt: skip
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        return "\n".join(lines)

    def __str__(self) -> str:
        lines = [self.table()]
        lines.append(
            f"planned peak {fmt_bytes(self.planned_peak_bytes)}, {len(self.kernels)} kernel"
            f"{'s' if len(self.kernels) != 1 else ''}, {self.n_events} event"
            f"{'s' if self.n_events != 1 else ''}, {self.n_streams} stream"
            f"{'s' if self.n_streams != 1 else ''} on {self.spec.name}"
        )
        if self.fusion_log:
            lines.append("fusion log:")
            lines.extend(f"  {e}" for e in self.fusion_log)
        if self.report is not None:
            lines.extend(self.report(self))
        return "\n".join(lines)

    def __repr__(self) -> str:
        # the table itself: `lm.schedule(t)` in a REPL shows what `print` shows
        return str(self)

    def _repr_html_(self) -> str:
        """Jupyter: the same text, preformatted."""
        from html import escape

        n = len(self.kernels)
        head = (f"Schedule: {n} kernel{'s' if n != 1 else ''} on {self.spec.name}, planned peak "
                f"{fmt_bytes(self.planned_peak_bytes)}")  # fmt: skip
        return (f"<div><b>{escape(head)}</b><pre style='white-space: pre; font-size: 12px'>"
                f"{escape(str(self))}</pre></div>")  # fmt: skip

    def as_text(self) -> str:
        """The whole plan in words: the table and log of `str()`, then every kernel's
        `as_text()` (its NPU program once compiled)."""
        return "\n\n".join([str(self)] + [k.as_text() for k in self.kernels])

    def compiled_with(self, compiled: list) -> Schedule:
        """The compile stage's view of this plan: each kernel carries its compiled kernel, and
        nothing refers to graph nodes any more (a cached program must not keep user inputs
        alive). `compiled` is parallel to `kernels`."""
        kernels = [
            dataclasses.replace(k, group=None, compiled=ck)
            for k, ck in zip(self.kernels, compiled, strict=True)
        ]
        log = [type(e)(e.what, e.nodes, e.reason, where=e.location()) for e in self.fusion_log]
        return dataclasses.replace(self, kernels=kernels, fusion_log=log, outputs=[], aliases={})
