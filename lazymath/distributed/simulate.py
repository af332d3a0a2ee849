"""How a sharded graph would run on N NPUs: the plan's shard programs costed on the emulated
device (the backend's cost model composed by the runtime's simulated timeline), the collectives
costed from link bandwidth and latency (`runtime/multidevice.py`), phases composed in order.

    x = ld.placeholder((1024, 2048, 2048), "float16", n=64)   # shapes only, no data
    tl = ld.simulate(lm.relu(x @ B) * 0.5)                    # MultiDeviceTimeline, 64 NPUs
    print(ld.scaling_table())                                 # strong and weak scaling

Nothing executes and no data is allocated beyond what a schedule needs; the kernels are built
with the interp backend (templates and ISA, no LLVM), only to read their cost.
"""

from __future__ import annotations

import numpy as np

from lazymath import runtime
from lazymath.backend.compile import compile_kernel
from lazymath.distributed.api import Source, Tensor, _sharded_leaf, _split_sizes, plan
from lazymath.distributed.plan import Plan, Stage, shard_shape, stage_schedule
from lazymath.functions import cos, relu, sin, tensor
from lazymath.runtime.multidevice import MultiDeviceTimeline, compose, get_link

_cost_memo: dict = {}


def placeholder(shape, dtype="float32", axis: int = 0, n: int = 1):
    """A sharded tensor of this shape and dtype without data: for plans and simulations
    (`ld.simulate`, `lm.explain`), not for compute."""
    shape = tuple(int(s) for s in shape)
    axis = axis % len(shape)
    src = Source("virtual", None, axis, _split_sizes(shape[axis], n), shape, np.dtype(dtype))
    return Tensor(_sharded_leaf(src))


def program_seconds(st: Stage, i: int = 0, spec=None) -> float:
    """Simulated seconds of shard `i`'s program of `st` on one device (`spec`, default the
    current device): its kernels' costs (backend cost model) on the runtime's timeline."""
    prog = st.programs[min(i, len(st.programs) - 1)]
    shapes = tuple(
        (shard_shape(x, i) if st.sharded else x.node.shape, x.node.dtype.str) for x in st.inputs
    )
    sched = stage_schedule(st, i, spec=spec)
    if sched is None:
        return 0.0
    key = (prog.nodes, prog.outputs, shapes, sched.spec.key())
    hit = _cost_memo.get(key)
    if hit is not None:
        return hit
    kernels = []
    for sk in sched.kernels:
        if sk.unit == "aicpu":  # the AI CPU has no cycle model: counted as free (said in docs)
            continue
        ck = compile_kernel(sk.group.ir, sched.spec, backend="interp", name=sk.name)
        kernels.append(runtime.SimKernel(sk.name, sk.stream, ck.cost, unit=sk.unit))
    secs = runtime.simulate(kernels, sched.spec).makespan_s if kernels else 0.0
    _cost_memo[key] = secs
    return secs


def simulate_plan(plan: Plan, link=None, spec=None, broadcast_inputs: bool = True):
    """The plan on `plan.n` devices: replicated inputs broadcast (optional), then per level the
    collectives that feed it and its programs (the slowest shard sets the pace)."""
    steps = []
    if broadcast_inputs:
        seen = set()
        for st in plan.stages:
            for x in st.inputs:
                if x.kind == "leaf" and x.id not in seen:
                    seen.add(x.id)
                    steps.append(("broadcast", "broadcast input", x.node.nbytes))
    levels = sorted({st.level for st in plan.stages} | {c.level for c in plan.collectives})
    for level in levels:
        for c in plan.collectives:
            if c.level == level:
                nbytes = c.node.nbytes
                steps.append((c.kind, f"{c.kind}({c.arg})" if c.arg else c.kind, nbytes))
        for st in plan.stages:
            if st.level != level:
                continue
            if st.sharded:
                secs = max(program_seconds(st, i, spec) for i in _distinct(st))
            else:
                secs = program_seconds(st, 0, spec)
            steps.append(("compute", f"program {st.name}", secs))
    return compose(plan.n, steps, link)


def _distinct(st: Stage) -> list[int]:
    first: dict[int, int] = {}
    for i, p in enumerate(st.programs):
        first.setdefault(id(p), i)
    return sorted(first.values())


def simulate(*tensors, link=None, spec=None, broadcast_inputs: bool = True):
    """MultiDeviceTimeline of `tensors` (graphs over sharded tensors or placeholders) on as
    many NPUs as they have shards."""
    return simulate_plan(plan(*tensors), link, spec, broadcast_inputs)


# ----------------------------------------------------------------------------- scaling table


def _bmm(p: int, batch: int):
    a = placeholder((batch, 2048, 2048), "float16", n=p)
    b = tensor(np.empty((2048, 2048), np.float16))
    return relu(a @ b) * 0.5


def _fft_standin(p: int, rows: int):
    x = placeholder((rows, 4096), "float32", n=p)
    return sin(x) * cos(x) + x


def _kmatmul(p: int, k: int):
    a = placeholder((4096, k), "float16", axis=1, n=p)
    b = placeholder((k, 4096), "float16", axis=0, n=p)
    return a @ b


# name -> (builder(p, size), strong size, weak size per device, what one unit of size is)
WORKLOADS = {
    "batched matmul relu(A_i@B)*0.5 2048^2 f16": (_bmm, 1024, 16, "matrices"),
    "batched FFT stand-in sin*cos+x, 4096 f32": (_fft_standin, 64 * 1024, 8 * 1024, "rows"),
    "matmul K-sharded 4096xK @ Kx4096 f16": (_kmatmul, 65536, 8192, "K"),
}


def scaling(devices=(8, 64, 1024), link=None, spec=None, workloads=None) -> list[dict]:
    """Rows of the strong- and weak-scaling study (one per workload, mode and device count).
    Strong: a fixed global problem; speedup against one device. Weak: fixed work per device;
    efficiency = one device's time / N devices' time."""
    rows = []
    for name, (build, strong, weak, unit) in (workloads or WORKLOADS).items():
        base = simulate(build(1, strong), link=link, spec=spec).makespan_s
        base_w = simulate(build(1, weak), link=link, spec=spec).makespan_s
        for p in devices:
            tl = simulate(build(p, strong), link=link, spec=spec)
            rows.append(_row(name, "strong", p, f"{strong // p} {unit}", tl, base / tl.makespan_s,
                             base / (tl.makespan_s * p)))  # fmt: skip
        for p in devices:
            tl = simulate(build(p, weak * p), link=link, spec=spec)
            rows.append(_row(name, "weak", p, f"{weak} {unit}", tl, p * base_w / tl.makespan_s,
                             base_w / tl.makespan_s))  # fmt: skip
    return rows


def _row(name, mode, p, per, tl: MultiDeviceTimeline, speedup, eff) -> dict:
    return {"workload": name, "scaling": mode, "npus": p, "per_npu": per,
            "compute_ms": tl.compute_s * 1e3, "comm_ms": tl.comm_s * 1e3,
            "total_ms": tl.makespan_s * 1e3, "speedup": speedup, "efficiency": eff}  # fmt: skip


def scaling_table(devices=(8, 64, 1024), link=None, spec=None, workloads=None) -> str:
    rows = scaling(devices, link, spec, workloads)
    head = ("workload", "scaling", "NPUs", "per NPU", "compute ms", "comm ms", "total ms",
            "speedup", "efficiency")  # fmt: skip
    table = [head]
    for r in rows:
        table.append((r["workload"], r["scaling"], str(r["npus"]), r["per_npu"],
                      f"{r['compute_ms']:.3f}", f"{r['comm_ms']:.3f}", f"{r['total_ms']:.3f}",
                      f"{r['speedup']:.1f}x", f"{r['efficiency']:.0%}"))  # fmt: skip
    widths = [max(len(t[i]) for t in table) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(t, widths)).rstrip() for t in table]
    lk = get_link(link)
    lines.append(f"link {lk.name}: {lk.source}")
    return "\n".join(lines)
