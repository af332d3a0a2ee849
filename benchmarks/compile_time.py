"""Compile time: the first call of a new graph, each case in a fresh process with an empty cache.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/compile_time.py [--reps 3]

Cases (lazymath, beside JAX's first `jit` call and `torch.compile`'s first call when installed):

- chain N: N ops alternating ``sin(t) * 1.01`` and ``t + 0.5`` on 1,000 float32 (fused
  elementwise with transcendental ops), N = 10, 100, 1000.
- softmax K: K stacked ``softmax(x * 1.1, axis=-1)`` on 64x64 float32 (many small kernels).
- custom_op: ``relu(A @ B) * 0.5`` on 2048x2048 float16 (README's showcase).

For each: the first call in a fresh process with an empty cache dir (median of --reps processes:
graph capture + compile + run, and lazymath's realize alone), the compile time per op, and
lazymath's first call in a second fresh process on the warm disk cache (nothing compiles: the
kernels and the vector math library load from disk). Timing starts after the imports; the
children keep Python's bytecode cache (PYTHONDONTWRITEBYTECODE is dropped for them) and one
untimed run per framework fills it first.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

CHAINS = (10, 100, 1000)
SOFTMAX = (10, 50)


def _child(framework: str, case: str, n: int) -> dict:
    import numpy as np

    if case == "custom_op":
        rng = np.random.default_rng(0)
        a = rng.standard_normal((2048, 2048)).astype(np.float16)
        b = rng.standard_normal((2048, 2048)).astype(np.float16)
    elif case == "chain":
        x0 = np.linspace(-3, 3, 1000, dtype=np.float32)
    else:
        x0 = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)

    if framework == "lazymath":
        import lazymath as lm
        from lazymath.backend import compile as bc
        from lazymath.backend.host import vmlib
        from lazymath.backend.native import kernel_cache

        t0 = time.perf_counter()
        if case == "custom_op":
            A, B = lm.tensor(a), lm.tensor(b)
            out = lm.mul(lm.relu(lm.matmul(A, B)), 0.5)
        else:
            t = lm.tensor(x0)
            for i in range(n):
                if case == "chain":
                    t = lm.sin(t) * 1.01 if i % 2 == 0 else t + 0.5
                else:
                    t = lm.softmax(t * 1.1, axis=-1)
            out = t
        t1 = time.perf_counter()
        out.numpy()
        t2 = time.perf_counter()
        info = kernel_cache.cache_info()
        return {"first": t2 - t0, "realize": t2 - t1, "compiled": info["compiled"],
                "disk_hits": info["disk_hits"], "kernels": info["memory_entries"],
                "tiered": bc.TIER_STATS["tiered"], **vmlib.stats()}  # fmt: skip
    if framework == "jax":
        import jax
        import jax.numpy as jnp

        def f(t):
            if case == "custom_op":
                return jax.nn.relu(t[0] @ t[1]) * 0.5
            for i in range(n):
                if case == "chain":
                    t = jnp.sin(t) * 1.01 if i % 2 == 0 else t + 0.5
                else:
                    t = jax.nn.softmax(t * 1.1, axis=-1)
            return t

        arg = (jnp.asarray(a), jnp.asarray(b)) if case == "custom_op" else jnp.asarray(x0)
        t0 = time.perf_counter()
        jax.block_until_ready(jax.jit(f)(arg))
        return {"first": time.perf_counter() - t0}
    if framework == "torch":
        import torch

        torch.set_num_threads(os.cpu_count() or 1)

        def g(t):
            if case == "custom_op":
                return torch.relu(t[0] @ t[1]) * 0.5
            for i in range(n):
                if case == "chain":
                    t = torch.sin(t) * 1.01 if i % 2 == 0 else t + 0.5
                else:
                    t = torch.softmax(t * 1.1, dim=-1)
            return t

        arg = ((torch.from_numpy(a), torch.from_numpy(b)) if case == "custom_op"
               else torch.from_numpy(x0))  # fmt: skip
        t0 = time.perf_counter()
        torch.compile(g)(arg)
        return {"first": time.perf_counter() - t0}
    raise ValueError(framework)


def _run(framework: str, case: str, n: int, cache: str, timeout: float) -> dict | None:
    env = dict(os.environ, LAZYMATH_CACHE_DIR=cache)
    env.pop("LAZYMATH_CACHE", None)
    # a user's Python keeps compiled bytecode (__pycache__): without it every fresh process
    # would spend ~0.2 s compiling lazymath's sources, which is no part of a kernel compile
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    cmd = [sys.executable, __file__, "--child", framework, case, str(n)]
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"timeout": timeout}
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "?"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def _installed(mod: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(mod) is not None


def _med(rows: list, key: str):
    vals = [r[key] for r in rows if r and key in r]
    return statistics.median(vals) if vals else None


def _fmt(v, unit="s") -> str:
    if v is None:
        return "-"
    return f"{v:.3f} {unit}" if v < 10 else f"{v:.1f} {unit}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3, help="fresh processes per case (median)")
    ap.add_argument("--peers", default="jax,torch", help="frameworks beside lazymath")
    ap.add_argument("--torch-max-ops", type=int, default=100,
                    help="skip torch.compile above this many ops (minutes per call)")  # fmt: skip
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--only", default="", help="comma list of case labels (chain100, ...)")
    ap.add_argument("--json", default="", help="also write the rows to this file")
    ap.add_argument("--child", nargs=3, metavar=("FRAMEWORK", "CASE", "N"))
    args = ap.parse_args()
    if args.child:
        fw, case, n = args.child
        print(json.dumps(_child(fw, case, int(n))))
        return
    peers = [p for p in args.peers.split(",") if p and _installed(p)]
    warm = tempfile.mkdtemp(prefix="lm-compile-time-")  # one untimed run: bytecode caches
    for fw in ("lazymath", *peers):
        _run(fw, "chain", 2, warm, args.timeout)
    shutil.rmtree(warm, ignore_errors=True)
    cases = [("chain", n) for n in CHAINS] + [("softmax", k) for k in SOFTMAX]
    cases.append(("custom_op", 1))
    if args.only:
        keep = set(args.only.split(","))
        cases = [c for c in cases if f"{c[0]}{c[1] if c[0] != 'custom_op' else ''}" in keep]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"# {args.reps} fresh processes per cell, medians; load average {load:.2f}; "
          f"{os.cpu_count()} cores; peers: {', '.join(peers) or 'none'}")  # fmt: skip
    head = (
        "case",
        "ops",
        "lm first call",
        "lm realize",
        "per op",
        "kernels",
        "lm warm",
        *(f"{p} first" for p in peers),
        "lm/jax",
    )
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    rows_out = []
    for case, n in cases:
        ops = {"chain": n, "softmax": 4 * n, "custom_op": 3}[case]
        label = case if case == "custom_op" else f"{case} {n}"
        cold, warm = [], []
        for _ in range(args.reps):
            d = tempfile.mkdtemp(prefix="lm-compile-time-")
            try:
                cold.append(_run("lazymath", case, n, d, args.timeout))
                warm.append(_run("lazymath", case, n, d, args.timeout))
            finally:
                shutil.rmtree(d, ignore_errors=True)
        peer = {}
        for p in peers:
            if p == "torch" and ops > args.torch_max_ops:
                peer[p] = None
                continue
            rs = [_run(p, case, n, tempfile.gettempdir(), args.timeout) for _ in range(args.reps)]
            peer[p] = _med(rs, "first")
        first, realize = _med(cold, "first"), _med(cold, "realize")
        kernels = _med(cold, "kernels")
        ratio = first / peer["jax"] if first and peer.get("jax") else None
        cells = [label, str(ops), _fmt(first), _fmt(realize),
                 _fmt(realize / ops * 1e3, "ms") if realize else "-",
                 str(kernels) if kernels is not None else "-", _fmt(_med(warm, "first")),
                 *(_fmt(peer[p]) for p in peers), f"{ratio:.2f}" if ratio else "-"]  # fmt: skip
        print("| " + " | ".join(cells) + " |", flush=True)
        bad = [r for r in warm if r and r.get("compiled", 0) + r.get("vmlib_compiled", 0)]
        if bad:
            print(f"#   warning: a warm process compiled {bad[0]}")
        errs = [r for r in cold + warm if r and ("error" in r or "timeout" in r)]
        if errs:
            print(f"#   {errs[0]}")
        rows_out.append({"case": label, "ops": ops, "cold": cold, "warm": warm, "peers": peer})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows_out, f, indent=1)


if __name__ == "__main__":
    main()
