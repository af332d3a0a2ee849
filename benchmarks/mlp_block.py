"""The transformer MLP block side by side in one process: Linear(768, 3072) + GELU +
Linear(3072, 768) on 4096 tokens, lazymath (lm.nn.linear / lm.nn.gelu) vs torch eager
(torch.nn.functional, 2 threads) and jax.jit. Medians and ratios peer / lazymath (> 1: lazymath
is faster).

    /work/bin/lmbench python benchmarks/mlp_block.py [--dtype bfloat16|float32|both] [--reps N]
        [--tokens N] [--quick]

bfloat16 runs on ascend910b (the 910 has no bf16; there the first linear + bias + GELU is one
MIX kernel: the GELU's erf runs on the AIVs), float32 on the default ascend910. Issue 33's
target: lazymath >= 1.2x torch bf16 eager. Each result is checked against torch (max relative
error printed). The machine is shared: the load average is printed; trust ratios.
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


def bench(dtype: str, tokens: int, d: int, hidden: int, reps: int) -> None:
    """Time the block for one dtype on every available peer and print medians, GFLOPS (the two
    matmuls: 4 * tokens * d * hidden) and ratios to lazymath."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((tokens, d)).astype(np.float32)
    w1 = (rng.standard_normal((hidden, d)) / np.sqrt(d)).astype(np.float32)
    b1 = rng.standard_normal(hidden).astype(np.float32) * 0.1
    w2 = (rng.standard_normal((d, hidden)) / np.sqrt(hidden)).astype(np.float32)
    b2 = rng.standard_normal(d).astype(np.float32) * 0.1
    flops = 4.0 * tokens * d * hidden
    rows: list[tuple[str, float]] = []
    want = None
    try:
        import torch

        torch.set_num_threads(2)
        F = torch.nn.functional
        tx, tw1, tb1, tw2, tb2 = (torch.from_numpy(a).to(getattr(torch, dtype))
                                  for a in (x, w1, b1, w2, b2))  # fmt: skip

        def tf():
            return F.linear(F.gelu(F.linear(tx, tw1, tb1)), tw2, tb2)

        want = tf().float().numpy()
        rows.append(("torch eager", median_time(tf, reps)))
    except ImportError:
        pass
    try:
        import jax

        jax.config.update("jax_platforms", "cpu")
        import jax.numpy as jnp

        jx, jw1, jb1, jw2, jb2 = (jnp.asarray(a, dtype=getattr(jnp, dtype))
                                  for a in (x, w1, b1, w2, b2))  # fmt: skip
        jf = jax.jit(lambda x_, a, b, c, e: jax.nn.gelu(x_ @ a.T + b, approximate=False) @ c.T + e)
        jf(jx, jw1, jb1, jw2, jb2).block_until_ready()
        jax_s = median_time(lambda: jf(jx, jw1, jb1, jw2, jb2).block_until_ready(), reps)
        rows.append(("jax.jit", jax_s))
    except ImportError:
        pass
    lm.init_device(spec="ascend910b" if dtype == "bfloat16" else "ascend910")
    ldt = lm.bfloat16 if dtype == "bfloat16" else np.float32
    lx, lw1, lb1, lw2, lb2 = (lm.tensor(a).astype(ldt).realize() for a in (x, w1, b1, w2, b2))

    def lf():
        return lm.nn.linear(lm.nn.gelu(lm.nn.linear(lx, lw1, lb1)), lw2, lb2)

    got = lf().astype(np.float32).numpy()
    err = float("nan") if want is None else float(np.abs(got - want).max() / np.abs(want).max())
    lm_s = median_time(lambda: lf().realize(), reps)
    rows.insert(0, ("lazymath", lm_s))
    print(f"\nMLP block {tokens} tokens, Linear({d},{hidden}) + GELU + Linear({hidden},{d}) "
          f"{dtype}  (lazymath max rel. error vs torch {err:.1e})")  # fmt: skip
    for name, s in rows:
        print(f"  {name:16s} {s * 1e3:10.2f} ms  {flops / s / 1e9:7.1f} GFLOPS  "
              f"{s / lm_s:6.2f}x lazymath")  # fmt: skip
    sched = lm.schedule(lf())
    print("  lazymath kernels: " + ", ".join(f"{k.name} ({k.unit})" for k in sched.kernels))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", choices=("float32", "bfloat16", "both"), default="both")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--quick", action="store_true", help="64 tokens, d 32, hidden 128, 2 reps")
    args = ap.parse_args()
    tokens, d, hidden = (64, 32, 128) if args.quick else (args.tokens, 768, 3072)
    reps = args.reps or (2 if args.quick else 7)
    print("load average:", os.getloadavg())
    for dt in ("float32", "bfloat16") if args.dtype == "both" else (args.dtype,):
        bench(dt, tokens, d, hidden, reps)
    print("\nload average:", os.getloadavg())


if __name__ == "__main__":
    main()
