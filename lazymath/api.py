"""The public functions that look at or prepare compilation without running anything:
`schedule`, `explain`, `precompile`, `cache_info`, `clear_cache`, `show_config` (`lm.<name>`)."""

from __future__ import annotations

import sys

from . import engine, settings
from .graph.walk import nodes_of, plan_outputs
from .realize import schedule_of
from .tensor import Tensor, tensor

__all__ = ["schedule", "explain", "precompile", "cache_info", "clear_cache", "show_config"]


def schedule(*tensors, spec=None):
    """Compile without executing: the fused kernels, their units, costs, streams and plan."""
    return schedule_of(nodes_of(tensors), spec)


def explain(*tensors, spec=None) -> str:
    return str(schedule(*tensors, spec=spec))


def cache_info() -> dict:
    from .backend.kernel_cache import cache_info as kernel_cache_info

    info = dict(kernel_cache_info())
    info["programs"] = len(engine._programs)
    info.update(engine.STATS)
    return info


def clear_cache() -> None:
    from .backend.kernel_cache import clear_cache as clear_kernels

    engine._programs.clear()
    clear_kernels()
    import gc

    gc.collect()  # kernels in reference cycles: their code is freed now, not at some later GC


def precompile(fn, *example_inputs, autotune: bool = False) -> int:
    """Trace `fn` on inputs of the examples' shapes/dtypes and compile every kernel it needs
    into the kernel cache (memory and disk), without executing. Returns the kernel count.

    `autotune=True` times the host GEMM candidates of every matmul kernel not measured before
    (as LAZYMATH_AUTOTUNE=1 does) and stores the winners for later processes."""
    if autotune:
        from .backend import autotune as tuning

        with tuning.forced():
            return precompile(fn, *example_inputs)
    args = [a if isinstance(a, Tensor) else tensor(a) for a in example_inputs]
    out = fn(*args)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    roots = nodes_of(outs)
    if not roots:
        return 0
    spec = engine._device_spec()
    backend = engine.backend_name()
    outputs, key, leaves, order = plan_outputs(roots)
    prog = engine.compile_program(outputs, leaves, order, spec, backend, tiered=False)
    engine._remember((key, spec.key(), backend), prog)
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

    from ._version import __version__
    from .backend import host
    from .backend.kernel_cache import cache_info as kernel_cache_info
    from .runtime import api as rt_api

    versions = {"lazymath": __version__, "python": platform.python_version(),
                "numpy": np.__version__, "llvmlite": _version_of("llvmlite")}  # fmt: skip
    try:
        import llvmlite.binding as llvm

        versions["LLVM"] = ".".join(map(str, llvm.llvm_version_info))
    except Exception as e:  # noqa: BLE001 - reported, not raised
        versions["LLVM"] = f"unavailable ({e})"
    try:
        target = host.describe()
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
            "memory": f"{info['memory_entries']} kernels, {len(engine._programs)} programs",
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


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


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
        shown = "-" if val is None else (str(val) if not isinstance(val, str) else val)
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
