"""The public functions that look at or prepare compilation without running anything:
`schedule`, `explain`, `precompile`, `cache_info`, `clear_cache`, `show_config` (`lm.<name>`)."""

from __future__ import annotations

import sys

from lazymath import engine, settings
from lazymath._version import __version__
from lazymath.backend import autotune as tuning
from lazymath.backend.compile import build_program, host_blocks
from lazymath.backend.host import gemm, roofline
from lazymath.backend.native import host as host_cpu
from lazymath.backend.native.kernel_cache import cache_info as kernel_cache_info
from lazymath.backend.native.kernel_cache import clear_cache as clear_kernels
from lazymath.backend.npu.cost import estimate
from lazymath.functions import tensor
from lazymath.fusion.grouping import aicpu_reason
from lazymath.fusion.schedule import Schedule, ridge_point
from lazymath.graph import custom
from lazymath.graph.walk import nodes_of, plan_outputs
from lazymath.realize import schedule_of
from lazymath.runtime import api as rt_api
from lazymath.runtime.timeline import SimKernel, explain_overlap, simulate
from lazymath.tensor import Tensor
from lazymath.units import fmt_bytes as _fmt_bytes

__all__ = [
    "schedule",
    "explain",
    "precompile",
    "cache_info",
    "clear_cache",
    "show_config",
    "Explanation",
]


def schedule(*tensors, spec=None):
    """Compile without executing: the fused kernels, their units, costs, streams and plan."""
    return schedule_of(nodes_of(tensors), spec)


def explain(*tensors, spec=None) -> Explanation:
    """Everything `lm.schedule` shows (kernel table, memory plan, fusion log, vector math and
    host GEMM plans) and why: each kernel's unit (AI CPU reasons included), its roofline class
    spelled out, its simulated AI cores next to its host blocks, its host roofline (memory and
    compute bounds on this machine, which one binds: `lm.profile` adds the measured time and
    its fraction of the roof), each fusion decision with the user's lines, and whether the
    streams overlap in the simulated timeline (and if not, why). Nothing runs but the host
    probes of the roofline (once per host, cached). The result is a str (print it, search
    it) that a REPL shows as text and Jupyter as HTML. A model or function compiled with
    lazymath.torch (once that is imported) is explained by `lazymath.torch.explain`: its FX
    graphs, graph breaks and each lazymath segment."""
    if len(tensors) == 1 and spec is None:
        for hook in EXPLAIN_HOOKS:
            text = hook(tensors[0])
            if text is not None:
                return text

    sched = schedule(*tensors, spec=spec)
    if not isinstance(sched, Schedule):  # a distributed plan explains itself
        return Explanation(str(sched), sched)
    return Explanation(str(sched) + "\n\n" + _decisions(sched), sched)


# Explainers of non-tensor objects, installed by add-ons (lazymath.torch: a compiled torch
# model): hook(obj) -> an Explanation, or None when obj is not theirs
EXPLAIN_HOOKS: list = []


class Explanation(str):
    """`lm.explain`'s text: a str whose repr is the text itself (no quotes, no \\n in a REPL)
    and which renders as preformatted HTML in Jupyter. `.schedule` is what it explains."""

    schedule: object

    def __new__(cls, text: str, sched=None):
        self = super().__new__(cls, text)
        self.schedule = sched
        return self

    def __repr__(self) -> str:
        return str.__str__(self)

    def _repr_html_(self) -> str:
        from html import escape

        return f"<pre style='white-space: pre; font-size: 12px'>{escape(str(self))}</pre>"

    def _repr_pretty_(self, p, cycle) -> None:  # IPython's plain-text display
        p.text(str.__str__(self))


def _unit_reason(sk) -> str:
    """Why the kernel runs on its unit."""
    g = sk.group
    if sk.unit == "aicpu":
        for n in getattr(g, "member_nodes", None) or []:
            why = aicpu_reason(n)
            if why:
                return f"AI CPU: {why}"
        return "AI CPU: an op or dtype the AI Core kernels do not cover"
    kind = sk.kind
    if kind == "custom":
        for n in getattr(g, "member_nodes", None) or []:  # a library kernel says why
            why = n.op == "custom" and getattr(custom.get(n.arg[0]), "unit_reason", None)
            if why:
                return f"{sk.unit}: {why}"
        return f"{sk.unit}: a user kernel (lm.kernel) written for this unit"
    if sk.unit == "mix":
        g = sk.group
        cols, rows = getattr(g, "col_sums", None), getattr(g, "row_reds", None)
        if cols or rows:  # only the split 910B makes these MIX
            what = " and ".join(
                w for w, on in (("sum the product's columns", cols),
                                ("reduce the product's rows", rows)) if on
            )  # fmt: skip
            return (
                f"mix (Cube + Vector, AIC + AIV): a matmul whose Vector cores {what}, "
                "tiles handed over through GM with cross-core flags"
            )
        if getattr(sk.ir, "b_im2col", None) is not None and not getattr(sk.group, "has_prologue",
                                                                         False):  # fmt: skip
            return (
                "mix (Cube + Vector, AIC + AIV): conv1d's implicit GEMM whose Vector cores run "
                "the epilogue (bias, elementwise ops FixPipe cannot do), tiles handed over "
                "through GM with cross-core flags"
            )
        if not getattr(sk.group, "has_prologue", False):
            return (
                "mix (Cube + Vector, AIC + AIV): a matmul whose Vector cores run its epilogue "
                "(an activation FixPipe cannot do, with bias and residual adds) while the Cube "
                "computes the next tile, tiles handed over through GM with cross-core flags"
            )
        return ("mix (Cube + Vector): a matmul whose operand is computed by a Vector prologue "
                "in the same kernel")  # fmt: skip
    if sk.unit == "cube":
        epi = [op for op in sk.ops if op != "matmul"]
        tail = f"; epilogue {' '.join(epi)} on the L0C tile before write-out" if epi else ""
        return f"Cube: a matmul on the 16x16x16 fractal multiply-accumulate unit{tail}"
    what = {"rows": "a row kernel (reductions over rows and the elementwise ops around them)",
            "reduce": "a reduction", "elementwise": "elementwise ops"}.get(kind, kind)  # fmt: skip
    return f"Vector: {what} (the Cube unit only multiplies matrices)"


def _bound_reason(sk, spec) -> str:
    if sk.unit == "aicpu":
        return f"{_fmt_num(sk.flops)}FLOP, {_fmt_num(sk.bytes)}B on the host CPU (no roofline)"
    ridge = ridge_point(sk.unit, spec)
    if not sk.bytes:
        return "compute-bound (moves no bytes)"
    ai = sk.flops / sk.bytes
    unit = "Cube" if sk.unit in ("cube", "mix") else "Vector"
    rel = ">=" if sk.bound == "compute" else "<"
    return (f"{sk.bound}-bound: {_fmt_num(sk.flops)}FLOP / {_fmt_num(sk.bytes)}B = {ai:.3g} "
            f"FLOP/byte {rel} the {unit} unit's ridge point {ridge:.3g} FLOP/byte on "
            f"{spec.name}")  # fmt: skip


def _kernel_costs(sched):
    """(cost or None, host blocks or None) per kernel: the ISA program built from the kernel IR
    (templates only, no LLVM) and the cost model's cycles; None where that is not possible."""
    out = []
    for sk in sched.kernels:
        if sk.unit == "aicpu" or sk.ir is None or sk.kind == "custom":
            out.append((None, None))
            continue
        try:
            program = build_program(sk.ir, sched.spec, sk.name)
            hb = host_blocks(sk.ir, program, spec=sched.spec)
            out.append((estimate(program, sched.spec), hb))
        except Exception:  # noqa: BLE001 - an explanation never fails on a costing problem
            out.append((None, None))
    return out


def _host_roofs():
    """This host's roofline parameters (None if they cannot be had: explain never fails)."""
    try:
        return roofline.host_roofs(host_cpu.target())
    except Exception:  # noqa: BLE001
        return None


def _host_roof(sk, blocks, roofs):
    """The kernel's host roofline at its host block count (None for AI CPU kernels)."""
    if roofs is None or sk.unit == "aicpu" or sk.ir is None:
        return None
    try:
        return roofline.kernel_roof(sk.ir, blocks or 0, roofs)
    except Exception:  # noqa: BLE001
        return None


EXPLAIN_SIM_MAX_KERNELS = 200  # above this, explain skips the simulated timeline (cost)


def _decisions(sched) -> str:
    spec = sched.spec
    costs = (_kernel_costs(sched) if len(sched.kernels) <= EXPLAIN_SIM_MAX_KERNELS
             else [(None, None)] * len(sched.kernels))  # fmt: skip
    sims = [SimKernel(sk.name, sk.stream, cost, tuple(sk.waits), sk.records, sk.unit)
            for sk, (cost, _) in zip(sched.kernels, costs)]  # fmt: skip
    tl = simulate(sims, spec) if sims else None
    free = simulate(sims, None, clock_hz=spec.clock_hz) if sims else None
    lines = ["why each kernel runs where it does:"]
    roofs = _host_roofs()
    for i, (sk, (cost, host)) in enumerate(zip(sched.kernels, costs)):
        at = f"  (created at {sk.source_loc})" if sk.source_loc else ""
        lines.append(f"  {sk.name}{at}")
        lines.append(f"    unit:  {_unit_reason(sk)}")
        lines.append(f"    bound: {_bound_reason(sk, spec)}")
        roof = _host_roof(sk, host, roofs)
        if roof is not None:
            lines.append(f"    host:  {roof.describe()}")
        if cost is not None:
            slot = tl.kernels[i]
            cap, pool = _pool(spec, sk.unit)
            streams = getattr(cost, "streams", None)
            if streams and not spec.coupled:  # MIX: one AIC and its AIVs per block
                cap, pool = spec.cube_cores, f"Cube cores, each with {len(streams) - 1} AIV"
            lines.append(
                f"    cores: {_plural(slot.cores, 'block')} on the simulated {spec.name} "
                f"({min(slot.cores, cap)} of its {cap} {pool}), "
                f"{cost.total / spec.clock_hz * 1e6:.3f} us, bound by the {cost.bound} pipe; "
                f"{_plural(host, 'block')} on this host (threads over its cores)"
            )  # fmt: skip
            if streams:
                ends = ", ".join(f"{c} {t / spec.clock_hz * 1e6:.3f} us"
                                 for c, t in streams.items())  # fmt: skip
                lines.append(f"    streams: {ends} (the AIC and AIV programs run concurrently, "
                             "joined by cross-core flags)")  # fmt: skip
    lines.append("fusion decisions:")
    if not sched.fusion_log:
        lines.append("  none logged: every op fused into the kernels above, no refusal")
    for e in sched.fusion_log:
        where = e.location(full=True) if hasattr(e, "location") else ""
        lines.append(f"  {e.what} {' -> '.join(e.nodes)}")
        lines.append(f"    why: {e.reason}")
        if where:
            lines.append(f"    at:  {where}")
    lines.append("streams:")
    busy = {sk.stream for sk, (c, _) in zip(sched.kernels, costs) if c is not None}
    if tl is None:
        lines.append("  no kernels")
    elif sched.n_streams > 1 and len(busy) <= 1:
        lines.append(f"  {sched.n_streams} streams, but only {len(busy)} with simulated AI "
                     "Core work (AI CPU and user kernels are not in the simulated "
                     "timeline)")  # fmt: skip
    else:
        lines.append("  " + explain_overlap(tl, free, spec))
    if roofs is not None:
        lines.append(roofs.describe())
    return "\n".join(lines)


def _fmt_num(x: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.1f} {unit}"
    return f"{x:.0f} "


def _plural(n, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _pool(spec, unit: str) -> tuple[int, str]:
    if spec.coupled:
        return spec.cube_cores, "AI cores"
    if unit == "cube":
        return spec.cube_cores, "Cube cores"
    return spec.vector_cores, "Vector cores"


def cache_info() -> dict:
    """Counters and sizes of the caches: kernels compiled, memory and disk hits, disk files and
    bytes, the directory, program-cache hits/misses and programs held (this process)."""
    info = dict(kernel_cache_info())
    info.update(engine.PROGRAMS.stats())
    return info


def clear_cache() -> None:
    """Forget every cached program and kernel, and delete the kernel files of the disk cache
    directory in force (LAZYMATH_CACHE_DIR)."""
    engine.PROGRAMS.clear()
    clear_kernels()
    import gc

    gc.collect()  # kernels in reference cycles: their code is freed now, not at some later GC


def precompile(fn, *example_inputs, autotune: bool = False) -> int:
    """Trace `fn` on inputs of the examples' shapes/dtypes and compile every kernel it needs
    into the kernel cache (memory and disk), without executing. Returns the kernel count.

    `autotune=True` times the host GEMM candidates of every matmul kernel not measured before
    (as LAZYMATH_AUTOTUNE=1 does) and stores the winners for later processes."""
    if autotune:
        with tuning.forced():
            return precompile(fn, *example_inputs)
    args = [a if isinstance(a, Tensor) else tensor(a) for a in example_inputs]
    out = fn(*args)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    roots = nodes_of(outs)
    if not roots:
        return 0
    spec = engine.device_spec()
    backend = engine.backend_name()
    outputs, key, leaves, order = plan_outputs(roots)
    prog = engine.compile_program(outputs, leaves, order, spec, backend, tiered=False)
    engine.PROGRAMS.put(engine.program_key(key, spec, backend), prog)
    return len(prog.kernels)


# optional packages show_config reports (distribution name, what lazymath uses it for)
_OPTIONAL = (
    ("dask", "lazymath.distributed"),
    ("distributed", "lazymath.distributed"),
    ("matplotlib", "benchmark plots"),
    ("threadpoolctl", "benchmarks: numpy's BLAS"),
    ("numexpr", "benchmark peer"),
    ("scipy", "benchmark peer"),
    ("torch", "benchmark peer"),
    ("jax", "benchmark peer"),
    ("hypothesis", "tests"),
)


def _version_of(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None
    except Exception:  # a broken installation's metadata: say so rather than fail
        return "?"


def _config() -> dict:
    """Everything `show_config` prints, as nested dicts (`show_config(mode="dicts")`)."""
    import platform
    import shutil

    import numpy as np

    versions = {"lazymath": __version__, "python": platform.python_version(),
                "numpy": np.__version__, "llvmlite": _version_of("llvmlite")}  # fmt: skip
    try:
        import llvmlite.binding as llvm

        versions["LLVM"] = ".".join(map(str, llvm.llvm_version_info))
    except Exception as e:  # noqa: BLE001 - reported, not raised
        versions["LLVM"] = f"unavailable ({e})"
    try:
        target = host_cpu.describe() + f"\n  gemm: {gemm.host_gemm(host_cpu.target()).describe()}"
    except Exception as e:  # a bad LAZYMATH_TARGET_CPU: show why, keep the rest
        target = f"host target: error: {e}"
    dev = rt_api._CURRENT
    if dev is None:
        device = {"device": "none yet (the first realize makes npu:0 with the ascend910 preset)"}
    else:
        s = dev.spec
        device = {
            "device": f"{dev} ({s.name}: {'coupled' if s.coupled else 'split'} layout, "
            f"{s.cube_cores} Cube + {s.vector_cores} Vector cores, "
            f"{s.clock_hz / 1e9:g} GHz)",
            "scheduler": dev.scheduler,
        }
    cache = {}
    try:
        info = kernel_cache_info()
        cache = {
            "dir": info["disk_dir"],
            "disk": (
                f"{info['disk_files']} kernel files, {_fmt_bytes(info['disk_bytes'])}"
                if info["disk_enabled"]
                else "off (LAZYMATH_CACHE=0)"
            ),  # fmt: skip
            "memory": f"{info['memory_entries']} kernels, {len(engine.PROGRAMS)} programs",
        }
    except Exception as e:  # noqa: BLE001
        cache = {"error": str(e)}
    rows = {}
    for st in settings.SETTINGS:
        try:
            value = st.get()
        except ValueError as e:
            value = f"invalid: {e}"
        rows[st.name] = {"value": value, "source": st.source()}
    dot = shutil.which("dot")
    optional = {"graphviz (dot)": dot or None}
    for dist, _why in _OPTIONAL:
        optional[dist] = _version_of(dist)
    return {"versions": versions, "host": target, "device": device, "cache": cache,
            "settings": rows, "optional": optional}  # fmt: skip


def _format_config(c: dict) -> str:
    v = c["versions"]
    lines = ["lazymath " + v["lazymath"],
             "  " + ", ".join(f"{k} {x}" for k, x in v.items() if k != "lazymath"),
             *c["host"].splitlines()]  # fmt: skip
    for k, x in c["device"].items():
        lines.append(f"{k}: {x}")
    lines.append("kernel cache: " + ", ".join(f"{k} {x}" for k, x in c["cache"].items()))
    lines.append("settings (value, where it comes from):")
    width = max(len(n) for n in c["settings"])
    for name, row in c["settings"].items():
        val = row["value"]
        shown = "-" if val is None or val == "" else str(val)
        lines.append(f"  {name:<{width}}  {shown}   ({row['source']})")
    lines.append("optional:")
    for what, ver in c["optional"].items():
        why = dict(_OPTIONAL).get(what, "pictures (lm.visualize, lm.report)")
        lines.append(f"  {what:<16} {ver or 'not found'}  ({why})")
    return "\n".join(lines)


def show_config(mode: str = "stdout", file=None):
    """Print what lazymath runs with: versions (lazymath, Python, numpy, llvmlite, LLVM), the host
    target the kernels are compiled for, the current device and scheduler, the kernel cache
    (directory, files, size), every LAZYMATH_* setting with its value and where it comes from
    (default, env or `lazymath.settings.override`), and which optional packages are installed.

    `mode="dicts"` returns the same as nested dicts instead of printing (as numpy's
    `show_config`). Paste the printout into bug reports."""
    if mode not in ("stdout", "dicts"):
        raise ValueError(f"show_config: mode must be 'stdout' or 'dicts', not {mode!r}")
    c = _config()
    if mode == "dicts":
        return c
    print(_format_config(c), file=file if file is not None else sys.stdout)
    return None
