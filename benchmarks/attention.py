"""Causal attention side by side in one process: lazymath's lm.nn.scaled_dot_product_attention,
torch.nn.functional.scaled_dot_product_attention (2 threads) and JAX (jax.nn.dot_product_attention
under jax.jit, CPU). Medians and ratios peer / lazymath (> 1: lazymath is faster).

    /work/bin/lmbench python benchmarks/attention.py [--quick] [--dtype float32|bfloat16|both]
        [--shape B H T D] [--reps N]

Workload (issue 33): causal attention B=4 H=12 T=2048 D=64. float32 runs on the coupled
ascend910 preset (lazymath's fused attention kernel: QK^T and PV on the Cube, the online softmax
on the core's Vector unit, tiles above the diagonal never loaded); bfloat16 needs ascend910b (the
910 AI Core has no bf16) and goes through the composition there (the split-core MIX kernel is
not built yet). Each result is checked against torch (max relative error printed). The machine is
shared: the load average is printed before and after; trust the ratios over absolute times.
"""

# ruff: noqa: B023  (the lambdas are timed immediately, inside their loop iteration)
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from _timing import median_time  # noqa: E402

import lazymath as lm  # noqa: E402


def bench(dtype: str, shape: tuple[int, int, int, int], reps: int) -> None:
    """Time one dtype on every available peer and print medians, GFLOPS (causal: half of the
    4*B*H*T*T*D dense flops) and ratios to lazymath."""
    b, h, t, d = shape
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((b, h, t, d)).astype(np.float32) for _ in range(3))
    flops = 4 * b * h * t * t * d / 2
    rows: list[tuple[str, float]] = []
    want = None
    try:
        import torch

        torch.set_num_threads(2)
        tdt = torch.float32 if dtype == "float32" else torch.bfloat16
        tq, tk, tv = (torch.from_numpy(a).to(tdt) for a in (q, k, v))
        F = torch.nn.functional

        def tf():
            return F.scaled_dot_product_attention(tq, tk, tv, is_causal=True)

        want = tf().float().numpy()
        rows.append(("torch F.sdpa", median_time(tf, reps)))
    except ImportError:
        torch = None
    try:
        import jax

        jax.config.update("jax_platforms", "cpu")
        import jax.numpy as jnp

        jdt = jnp.float32 if dtype == "float32" else jnp.bfloat16
        # jax's layout is (B, T, N, H)
        jq, jk, jv = (jnp.asarray(a.transpose(0, 2, 1, 3), dtype=jdt) for a in (q, k, v))
        jf = jax.jit(lambda a, b_, c: jax.nn.dot_product_attention(a, b_, c, is_causal=True))
        jf(jq, jk, jv).block_until_ready()
        rows.append(
            ("jax.jit dot_product_attention",
             median_time(lambda: jf(jq, jk, jv).block_until_ready(), reps))
        )  # fmt: skip
    except ImportError:
        pass
    lm.init_device(spec="ascend910" if dtype == "float32" else "ascend910b")
    ldt = np.float32 if dtype == "float32" else lm.bfloat16
    lq, lk, lv = (lm.tensor(a).astype(ldt) for a in (q, k, v))
    lq, lk, lv = (x.realize() for x in (lq, lk, lv))

    def lf():
        return lm.nn.scaled_dot_product_attention(lq, lk, lv, is_causal=True)

    got = lf().astype(np.float32).numpy()
    err = float("nan")
    if want is not None:
        err = float(np.abs(got - want).max() / np.abs(want).max())
    lm_s = median_time(lambda: lf().realize(), reps)
    rows.insert(0, ("lazymath", lm_s))
    print(f"\ncausal attention B={b} H={h} T={t} D={d} {dtype}  "
          f"(lazymath max rel. error vs torch {err:.1e})")  # fmt: skip
    for name, s in rows:
        print(f"  {name:32s} {s * 1e3:10.2f} ms  {flops / s / 1e9:7.1f} GFLOPS  "
              f"{s / lm_s:6.2f}x lazymath")  # fmt: skip
    sched = lm.schedule(lf())
    print("  lazymath kernels: " + ", ".join(f"{kk.name} ({kk.unit})" for kk in sched.kernels))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="B=1 H=2 T=256 D=64, 2 repetitions")
    ap.add_argument("--dtype", choices=("float32", "bfloat16", "both"), default="both")
    ap.add_argument("--shape", type=int, nargs=4, metavar=("B", "H", "T", "D"))
    ap.add_argument("--reps", type=int, default=None)
    args = ap.parse_args()
    shape = (
        tuple(args.shape) if args.shape else ((1, 2, 256, 64) if args.quick else (4, 12, 2048, 64))
    )
    reps = args.reps or (2 if args.quick else 5)
    print("load average:", os.getloadavg())
    for dt in ("float32", "bfloat16") if args.dtype == "both" else (args.dtype,):
        bench(dt, shape, reps)
    print("\nload average:", os.getloadavg())


if __name__ == "__main__":
    main()
