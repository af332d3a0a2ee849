"""conv1d side by side in one process: torch.nn.functional.conv1d (2 threads), a numpy
reference (per-tap einsum, float32), lazymath. Medians and ratios to torch.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/conv1d.py [--quick]

Workloads (issue 14): relu(conv1d(x, w) + bias), x (32, 64, 4096), w (64, 64, 7), padding 3 (one
Cube kernel in lazymath: implicit GEMM, im2col and padding in the packing, bias and relu in the
epilogue); conv1d (32, 64, 4096) x (128, 64, 3) with bias; depthwise (groups = 64, K = 7).
lazymath goes through the public API, steady state (program cache warm). The load average is
printed: the machine is shared.
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


def _numpy_conv(x, w, b, padding, groups):
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding)))
    cout, cpg, k = w.shape
    lout = xp.shape[2] - k + 1
    out = np.zeros((x.shape[0], cout, lout), np.float32)
    opg = cout // groups
    for g in range(groups):
        xs = xp[:, g * cpg : (g + 1) * cpg]
        for j in range(k):
            out[:, g * opg : (g + 1) * opg] += np.einsum(
                "oc,ncl->nol", w[g * opg : (g + 1) * opg, :, j], xs[:, :, j : j + lout]
            )
    return out + b[None, :, None]


def bench(label, x, w, b, padding, groups, relu, reps, torch):
    rows = []
    flops = (
        2
        * x.shape[0]
        * w.shape[0]
        * w.shape[1]
        * w.shape[2]
        * (x.shape[2] + 2 * padding - w.shape[2] + 1)
    )
    want = None
    if torch is not None:
        F = torch.nn.functional
        tx, tw, tb = (torch.from_numpy(a) for a in (x, w, b))

        def tf():
            o = F.conv1d(tx, tw, tb, padding=padding, groups=groups)
            return F.relu(o) if relu else o

        want = tf().numpy()
        rows.append(("torch (2 threads)", median_time(tf, reps)))
    if groups == 1 or reps <= 3:
        rows.append(("numpy einsum per tap",
                     median_time(lambda: _numpy_conv(x, w, b, padding, groups), 1, 0)))  # fmt: skip
    lx, lw, lb = lm.tensor(x), lm.tensor(w), lm.tensor(b)

    def lf():
        o = lm.conv1d(lx, lw, lb, padding=padding, groups=groups)
        return lm.relu(o) if relu else o

    got = lf().numpy()
    if want is not None:
        err = float(np.abs(got - want).max() / np.abs(want).max())
    else:
        err = float("nan")
    rows.append(("lazymath", median_time(lambda: lf().realize(), reps, warmup=2)))
    base = rows[0][1]
    print(f"\n{label}  (lazymath max rel. error vs torch {err:.1e})")
    for name, s in rows:
        print(f"  {name:24s} {s * 1e3:10.2f} ms  {flops / s / 1e9:7.1f} GFLOPS  "
              f"{s / base:6.2f}x {rows[0][0].split()[0]}")  # fmt: skip
    sched = lm.schedule(lf())
    print("  lazymath kernels: " + ", ".join(f"{k.name} ({k.unit})" for k in sched.kernels))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = ap.parse_args()
    reps = 3 if args.quick else 7
    try:
        import torch

        torch.set_num_threads(2)
    except ImportError:
        torch = None
    rng = np.random.default_rng(0)
    print("load average:", os.getloadavg())
    x = rng.standard_normal((32, 64, 4096)).astype(np.float32)
    w = (rng.standard_normal((64, 64, 7)) * 0.1).astype(np.float32)
    b = rng.standard_normal(64).astype(np.float32)
    bench("relu(conv1d(x, w) + b), x (32, 64, 4096), w (64, 64, 7), padding 3",
          x, w, b, 3, 1, True, reps, torch)  # fmt: skip
    w3 = (rng.standard_normal((128, 64, 3)) * 0.1).astype(np.float32)
    b3 = rng.standard_normal(128).astype(np.float32)
    bench("conv1d (32, 64, 4096) x (128, 64, 3) + bias", x, w3, b3, 0, 1, False, reps, torch)
    wd = rng.standard_normal((64, 1, 7)).astype(np.float32)
    bench("depthwise conv1d groups=64, K=7, padding 3", x, wd, b, 3, 64, False, reps, torch)
    print("\nload average:", os.getloadavg())


if __name__ == "__main__":
    main()
