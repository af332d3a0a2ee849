"""Measured choice of the host GEMM plan for a matmul kernel signature.

Without autotuning the model picks (`gemm.model_plan`: the host target's first candidate).
With ``LAZYMATH_AUTOTUNE=1``, or inside ``lm.precompile(..., autotune=True)``, the first compile
of a matmul signature (shapes, dtypes, layouts, epilogue: the kernel IR, on one device preset)
times each candidate of `gemm.candidate_plans` (microkernel shape and host K panel): each is
compiled, then one block's share of the work runs on random inputs (the blocks of a launch do
equal work), candidates interleaved, best CPU time of a few rounds. The winner and every
candidate's time go to a small JSON record in the disk cache, keyed like a kernel (signature,
host key with the effective target, backend source version), so a later process reads the
record and times nothing; the kernel it compiles is the winner's (the plan is part of the
kernel's disk key).

`choice(ir, spec)` is what lowering uses; `explain(ir, spec)` is the line ``lm.explain`` prints.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

import numpy as np

from lazymath import settings
from lazymath.backend.host import gemm, gemm_bf16
from lazymath.backend.native import host, jit, kernel_cache
from lazymath.backend.npu.kernel_ir import view_extent
from lazymath.graph import dft

ROUNDS = 5  # timings per candidate (the best counts), interleaved with the other candidates
MIN_S = 0.005  # seconds of work per timing (repetitions of one block)

stats = {"timed": 0, "records_read": 0, "records_written": 0}  # candidates timed, records used
_memory: dict[str, gemm.GemmPlan] = {}
_choices: dict[str, tuple] = {}  # measured_choice's records read or made in this process
_lock = threading.RLock()
_local = threading.local()


def enabled() -> bool:
    if getattr(_local, "force", False):
        return True
    return bool(settings.AUTOTUNE.get())


@contextlib.contextmanager
def forced() -> Iterator[None]:
    """Autotune every matmul compiled on this thread inside the block (lm.precompile), and
    every FFT plan chosen in it (the tensor layer's per-process plan memo is dropped)."""
    old = getattr(_local, "force", False)
    _local.force = True
    dft.MEMO.clear()
    try:
        yield
    finally:
        _local.force = old


def record_key(*parts) -> str:
    """The disk key of a measured choice: `parts` (the signature) with the host key (effective
    target) and the backend source version, like a kernel's."""
    return kernel_cache.disk_key(repr(("autotune", *parts)), jit.host_key())


def _key(ir, spec) -> str:
    return record_key(ir.kind, ir, spec.key())


def _path(key: str):
    return kernel_cache.cache_dir() / "autotune" / f"{key}.json"


def read_record(key: str) -> dict | None:
    """The stored record under `key` (a JSON object), None when there is none (or no disk)."""
    if not kernel_cache.disk_enabled():
        return None
    try:
        rec = json.loads(_path(key).read_text())
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) else None


def write_record(key: str, rec: dict) -> None:
    """Store `rec` under `key` (atomically; a read-only cache stores nothing)."""
    if not kernel_cache.disk_enabled():
        return
    path = _path(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(rec))
        os.replace(tmp, path)
        stats["records_written"] += 1
    except OSError:
        pass  # a read-only cache: the next process measures again


def _read(key: str) -> gemm.GemmPlan | None:
    rec = read_record(key)
    if rec is None:
        return None
    try:
        plan = gemm.parse_plan(f"{rec['plan']}:{int(rec['kc'])}")
        times = {str(k): float(v) for k, v in rec["times"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    stats["records_read"] += 1
    return replace(plan, origin=_origin(times))


def _write(key: str, plan: gemm.GemmPlan, times: dict[str, float]) -> None:
    write_record(key, {"plan": plan.uk.name, "kc": plan.kc, "times": times})


def _label(plan: gemm.GemmPlan) -> str:
    return f"{plan.uk.name}:{plan.kc}"


def measured_choice(parts: tuple, labels: list[str], run) -> tuple[str, dict, str] | None:
    """A choice among `labels` by measurement (the FFT plans use it; the GEMM plans above time
    kernel blocks instead): the stored record for signature `parts` if there is one (this
    process or an earlier one), else, when autotuning is on, a fresh timing: `run(label)`
    returns a callable doing the whole job once; each is called once to warm up (compile),
    then timed interleaved (ROUNDS rounds, at least MIN_S of work per timing, best wall time
    of the rounds: the job may use the host's threads). The winner and the times are stored.
    Returns (winner, {label: seconds}, origin) or None (no record, autotuning off)."""
    key = record_key(*parts)
    with _lock:
        hit = _choices.get(key)
        if hit is not None:
            return hit
        rec = read_record(key)
        if rec is not None:
            try:
                best = str(rec["choice"])
                times = {str(k): float(v) for k, v in rec["times"].items()}
            except (KeyError, TypeError, ValueError, AttributeError):
                rec = None
            else:
                if best in labels:
                    stats["records_read"] += 1
                    hit = _choices[key] = (best, times, "measurement (stored record)")
                    return hit
        if not enabled():
            return None
        jobs = [run(lab) for lab in labels]
        reps = []
        for job in jobs:
            job()  # warm-up: compiles, page faults
            t = time.perf_counter()
            job()
            reps.append(max(1, min(50, int(MIN_S / max(time.perf_counter() - t, 1e-6)))))
        best_t = [float("inf")] * len(jobs)
        for _ in range(ROUNDS):
            for i, job in enumerate(jobs):
                t = time.perf_counter()
                for _ in range(reps[i]):
                    job()
                best_t[i] = min(best_t[i], (time.perf_counter() - t) / reps[i])
        stats["timed"] += len(jobs)
        times = dict(zip(labels, best_t))
        best = labels[best_t.index(min(best_t))]
        write_record(key, {"choice": best, "times": times})
        hit = _choices[key] = (best, times, "measurement (autotune)")
        return hit


def _origin(times: dict[str, float]) -> str:
    best = min(times, key=times.get)
    parts = [f"{k} {v * 1e3:.3g} ms{'*' if k == best else ''}" for k, v in times.items()]
    return "measured: " + ", ".join(parts)


def choice(ir, spec, build: Callable) -> gemm.GemmPlan:
    """The host GEMM plan for matmul kernel `ir` on `spec`: a stored or fresh measurement when
    autotuning is on (or a record exists), else the model's. `build(ir, spec)` compiles one
    candidate (under `gemm.plan_override`) to a CompiledKernel: the compile driver passes its
    own, since it asks this module for the plan (autotune does not import it back)."""
    key = _key(ir, spec)
    with _lock:
        plan = _memory.get(key)
        if plan is not None:
            return plan
        plan = _read(key)
        if plan is None and enabled():
            plan = _measure(ir, spec, key, build)
        if plan is None:
            return gemm.model_plan()
        _memory[key] = plan
        return plan


def explain(ir, spec) -> str:
    """`plan.describe()` of the plan in force, without measuring."""
    key = _key(ir, spec)
    plan = _memory.get(key) or _read(key) or gemm.model_plan()
    if getattr(ir, "in_dtype", "") == "bfloat16":  # the Mmad's host mapping (lower_cube._mmad)
        if gemm_bf16.bf16_dot_available():
            return (f"bfloat16 vdpbf16ps dot products (AVX512_BF16), MR x {plan.uk.nr} tiles, "
                    "one K pass")  # fmt: skip
        return "bfloat16 widened to float32 panels (no AVX512_BF16): " + plan.describe()
    return plan.describe()


def _inputs(kernel) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    out = []
    for v in kernel._args:
        n = max(view_extent(v), 1)
        if np.dtype(v.dtype).kind == "f" or v.dtype == "bfloat16":
            out.append(rng.uniform(-1, 1, n).astype(v.dtype))
        else:
            out.append(np.zeros(n, v.dtype))
    return out


def _measure(ir, spec, key: str, build: Callable) -> gemm.GemmPlan:
    """Compile every candidate, time them interleaved (ROUNDS rounds, each candidate once per
    round, at least MIN_S of work per timing; best of the rounds) and store and return the
    fastest. Timings are CPU time of the calling thread, which runs the block: on a shared
    machine wall time mostly measures the scheduler, and interleaving lets a change of load
    (caches, a busy sibling hyperthread) hit every candidate."""
    plans = gemm.candidate_plans(host.target())
    runs = []
    for plan in plans:
        with gemm.plan_override(plan):
            kernel = build(ir, spec)
        arrays = _inputs(kernel)  # kept alive with the argv (which holds bare pointers)
        argv = kernel.make_argv(arrays)
        n = kernel.blocks
        t = time.thread_time()
        kernel.run_block(argv, 0, n)  # warm-up (page faults, workspace growth)
        reps = max(1, min(100, int(MIN_S / max(time.thread_time() - t, 1e-6))))
        runs.append((kernel, argv, n, reps, arrays))
    best_t = [float("inf")] * len(plans)
    for _ in range(ROUNDS):
        for i, (kernel, argv, n, reps, _) in enumerate(runs):
            t = time.thread_time()
            for _ in range(reps):
                kernel.run_block(argv, 0, n)  # one block's share: blocks do equal work
            best_t[i] = min(best_t[i], (time.thread_time() - t) / reps)
    stats["timed"] += len(plans)
    times = {_label(p): t for p, t in zip(plans, best_t)}
    best = plans[best_t.index(min(best_t))]
    _write(key, best, times)
    return replace(best, origin=_origin(times))
