"""What a realize says about itself: LAZYMATH_DEBUG lines on stderr, LAZYMATH_DEBUG_DIR files,
and why the program cache missed.

`report` prints one line per realize (level 1), the schedule table and fusion log (2), the ISA
(3), LLVM IR (4) and assembly (5) of each kernel, or with LAZYMATH_DEBUG_DIR writes every stage
of every newly compiled program to files; `kernel_printer` is the per-kernel timing line of
level 2; `miss_reason` says in words which input, constant, argument, device or backend made a
graph miss the program cache (`engine.run_compiled` stores it on the new program).
"""

from __future__ import annotations

import os
import sys
import time

from lazymath.backend.native.jit import get_jit
from lazymath.units import fmt_bytes

# structure (ops and edges, no shapes/dtypes/constants) -> the last full signature seen with it
_SKELETONS: dict = {}
_SKELETONS_MAX = 512


def _skeleton(key) -> tuple:
    parts, outs = key
    return tuple(p[0] if p[0] in ("L", "c") else (p[0], p[4]) for p in parts), outs


def miss_reason(key, order, spec, backend: str) -> str:
    """Why the program cache missed: a graph of a new structure, or which input shape / dtype /
    layout, constant, op argument, device spec or backend differs from the last graph of the
    same structure (the program a user expected to reuse)."""
    sk = _skeleton(key)
    last = _SKELETONS.get(sk)
    if len(_SKELETONS) >= _SKELETONS_MAX:
        _SKELETONS.clear()
    _SKELETONS[sk] = (key, spec, backend)
    n_ops = sum(1 for p in key[0] if p[0] not in ("L", "c"))
    if last is None:
        return f"new graph, {_plural(n_ops, 'op')}"
    old_key, old_spec, old_backend = last
    why = []
    if old_spec.key() != spec.key():
        why.append(f"device {old_spec.name} -> {spec.name}")
    if old_backend != backend:
        why.append(f"backend {old_backend} -> {backend}")
    leaf_no = 0
    ops = []  # op entries that differ: shown only when no input explains them, or an argument
    for i, (new, old) in enumerate(zip(key[0], old_key[0])):
        if new != old:
            if new[0] in ("L", "c"):
                why.append(_part_change(new, old, order[i], leaf_no))
            elif not why or (new[3] != old[3] and new[2] == old[2]):
                ops.append(_part_change(new, old, order[i], leaf_no))
        leaf_no += new[0] == "L"
    why += ops if not why else [w for w in ops if "argument" in w]
    if not why:
        return (
            "same signature as an earlier program, no longer cached (evicted beyond "
            "LAZYMATH_PROGRAM_CACHE_LIMIT, or lm.clear_cache())"
        )
    more = f" (+{len(why) - 3} more)" if len(why) > 3 else ""
    return "; ".join(why[:3]) + more


def _part_change(new, old, node, leaf_no: int) -> str:
    """One signature entry that differs, in words."""
    where = ""
    try:
        loc = node.loc
        where = f" (from {loc.rsplit('/', 1)[-1]})" if loc else ""
    except Exception:  # noqa: BLE001 - a location is a nicety
        pass
    if new[0] == "L":  # ("L", dtype, shape, strides)
        what = []
        if new[2] != old[2]:
            what.append(f"shape {old[2]} -> {new[2]}")
        if new[1] != old[1]:
            what.append(f"dtype {old[1]} -> {new[1]}")
        if not what and new[3] != old[3]:
            what.append(f"strides {old[3]} -> {new[3]}")
        return f"input {leaf_no}{where}: {', '.join(what)}"
    if new[0] == "c":  # ("c", dtype, value): constants are compiled into the kernels
        if new[1] != old[1]:
            return f"constant{where}: dtype {old[1]} -> {new[1]}"
        return f"constant{where}: {old[2]!r} -> {new[2]!r} (constants are compiled in)"
    what = []
    if new[2] != old[2]:
        what.append(f"shape {old[2]} -> {new[2]}")
    if new[1] != old[1]:
        what.append(f"dtype {old[1]} -> {new[1]}")
    if new[3] != old[3] and not what:
        what.append(f"argument {old[3]!r} -> {new[3]!r}")
    return f"{new[0]}{where}: {', '.join(what) or 'inputs changed'}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _fmt_seconds(s: float) -> str:
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.0f} us"


def kernel_printer(prog):
    """LAZYMATH_DEBUG>=2: a callback printing each kernel's line as it finishes (tinygrad's
    DEBUG=2): name, unit, time, GFLOPS and GB/s of the work the schedule counts (useful flops;
    bytes read and written once), where its code came from."""
    kernels = prog.kernels
    width = max([len(sk.name) for sk, _, _ in kernels] + [6])
    origins = prog.origins or ["?"] * len(kernels)

    def on_kernel(i: int, seconds: float) -> None:
        sk = kernels[i][0]
        where = origins[i] if not prog.hits else "replay"
        s = max(seconds, 1e-9)
        print(f"[lazymath]   {sk.name:<{width}} {sk.unit:<6} {_fmt_seconds(seconds):>9} "
              f"{sk.flops / s / 1e9:9.2f} GFLOPS {sk.bytes / s / 1e9:8.2f} GB/s  "
              f"{where}", file=sys.stderr, flush=True)  # fmt: skip

    return on_kernel


def report(prog, hit: bool, level: int, t0: float, out_dir, validate) -> None:
    """LAZYMATH_DEBUG on stderr: one line per realize (level 1), the schedule table and fusion
    log (2), the ISA (3), LLVM IR (4) and assembly (5) of each kernel; with LAZYMATH_DEBUG_DIR,
    every stage of every newly compiled program goes to files there instead."""
    sched = prog.schedule
    seconds = time.perf_counter() - t0
    names = [sk.name for sk, _, _ in prog.kernels]
    shown = ", ".join(names[:4]) + (f", +{len(names) - 4} more" if len(names) > 4 else "")
    if hit:
        how = "program hit"
    else:
        counts: dict = {}
        for o in prog.origins:
            counts[o] = counts.get(o, 0) + 1
        order = ("compiled", "compiled (tier 0)", "disk", "memory")
        words = {"disk": "loaded {} from disk", "memory": "{} from memory",
                 "compiled (tier 0)": "{} quick-compiled (tier 0)"}  # fmt: skip
        parts = [words.get(k, k + " {}").format(counts[k]) for k in order if counts.get(k)]
        parts += [f"{v} {k}" for k, v in counts.items() if k not in order]
        how = f"program miss ({prog.miss_reason or 'new graph'}); " + ", ".join(parts)
    line = (f"[lazymath] realize {_plural(len(names), 'kernel')} ({shown}): {how}; planned peak "
            f"{fmt_bytes(sched.planned_peak_bytes)}; {_fmt_seconds(seconds)}")  # fmt: skip
    if validate:
        checked = sum(1 for sk, _, _ in prog.kernels if sk.kind != "aicpu")
        line += f"; validated {checked} of {len(names)} kernels against numpy"
    if level:
        print(line, file=sys.stderr, flush=True)
    if out_dir:
        if not hit:
            _write_debug_dir(prog, line, out_dir)
        return
    chunks = []
    if level >= 2:
        chunks.append(str(sched))
    for sk, _ck, _ in prog.kernels:
        if level >= 3:
            chunks.append(f"--- ISA {sk.name}\n{sk.isa}")
        if level >= 4:
            chunks.append(f"--- LLVM IR {sk.name} (before optimization)\n{sk.llvm_ir}")
            opt = _optimized_ir(_ck)
            if opt:
                chunks.append(f"--- LLVM IR {sk.name} (optimized)\n{opt}")
        if level >= 5:
            chunks.append(f"--- assembly {sk.name}\n{sk.asm}")
    if chunks:
        print("\n".join(chunks), file=sys.stderr, flush=True)


def _optimized_ir(ck) -> str | None:
    """The kernel's LLVM IR after the O3 pipeline (None without LLVM code)."""
    text = getattr(ck, "llvm_ir", None)
    if not text or getattr(ck, "backend", None) != "llvm":
        return None
    return get_jit().optimized_ir(text)


_DEBUG_DIRS: dict = {}  # debug directory -> number of programs written there by this process


def _write_debug_dir(prog, line: str, out_dir: str) -> None:
    """LAZYMATH_DEBUG_DIR: one directory per compiled program (program_NNNN), holding
    summary.txt (the debug line, kernel table, fusion log) and, per kernel, NAME.isa, NAME.ll
    (LLVM IR before optimization), NAME.opt.ll (after) and NAME.s (host assembly). Says where on
    stderr, once per directory."""
    base = os.path.abspath(out_dir)
    n = _DEBUG_DIRS.get(base)
    if n is None:
        os.makedirs(base, exist_ok=True)
        n = sum(1 for f in os.listdir(base) if f.startswith("program_"))
        print(f"[lazymath] LAZYMATH_DEBUG_DIR: writing debug files under {base}",
              file=sys.stderr, flush=True)  # fmt: skip
    _DEBUG_DIRS[base] = n + 1
    d = os.path.join(base, f"program_{n:04d}")
    os.makedirs(d, exist_ok=True)

    def write(name: str, text) -> None:
        if text:
            with open(os.path.join(d, name), "w") as f:
                f.write(text if text.endswith("\n") else text + "\n")

    origins = prog.origins or ["?"] * len(prog.kernels)
    listing = "\n".join(f"  {sk.name}: {o}" for (sk, _, _), o in zip(prog.kernels, origins))
    write("summary.txt", f"{line}\n\n{prog.schedule}\n\nkernel code:\n{listing}")
    for sk, ck, _ in prog.kernels:
        write(f"{sk.name}.isa", sk.isa if sk.compiled is not None else None)
        if getattr(ck, "backend", None) == "llvm":
            write(f"{sk.name}.ll", ck.llvm_ir)
            write(f"{sk.name}.opt.ll", _optimized_ir(ck))
            write(f"{sk.name}.s", ck.asm)
