"""The showcase: a custom composite op, mul(relu(matmul(A, B)), scale), on float16 2048x2048.

    python examples/custom_op.py                           # default backend (llvm)
    LAZYMATH_BACKEND=reference python examples/custom_op.py  # numpy node-by-node oracle
    python examples/custom_op.py --n 512 --iters 5          # smaller / quicker

The three ops are recorded lazily; a realize fuses them into one Cube kernel (relu and the
scale become the matmul's epilogue, applied to the float32 accumulator before the single
rounding to float16) and runs it on host threads. The result is checked against numpy's float32
computation on the same float16 inputs, within float16 tolerance; the script exits non-zero if
it does not match.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # run from a checkout

import lazymath as lm  # noqa: E402
from lazymath.backend import compile as _compile  # noqa: E402

# float16 keeps 11 significant bits: one rounding of the float32 accumulator costs up to
# 2**-11 relative; the absolute slack covers near-zero outputs where float32 summation order
# (backend vs numpy) shows.
RTOL, ATOL = 2e-3, 1e-2


def custom_op(A, B, scale):
    return lm.mul(lm.relu(lm.matmul(A, B)), scale)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=2048, help="matrix size (default 2048)")
    p.add_argument("--iters", type=int, default=10, help="timed iterations (default 10)")
    args = p.parse_args()
    n = args.n
    backend = os.environ.get("LAZYMATH_BACKEND", "llvm")

    A = lm.random.randn(n, n, seed=0, dtype=lm.float16).realize()
    B = lm.random.randn(n, n, seed=1, dtype=lm.float16).realize()
    scale = lm.tensor(np.float16(0.125))  # a 0-d float16 tensor: the op's parameter

    t0 = time.perf_counter()
    out = custom_op(A, B, scale).realize()  # warm-up: compiles (or loads) the kernel
    warm_ms = (time.perf_counter() - t0) * 1e3
    # The first call ran quickly compiled (tier-0) code while the optimized kernel compiled in
    # the background; time the steady state, after the optimized code has replaced it.
    t0 = time.perf_counter()
    _compile.wait_tiering(60.0)
    tier_ms = (time.perf_counter() - t0) * 1e3

    times = []
    for _ in range(args.iters):
        t0 = time.perf_counter()
        out = custom_op(A, B, scale).realize()
        times.append(time.perf_counter() - t0)
    ms = 1e3 * sum(times) / len(times)
    med = 1e3 * sorted(times)[len(times) // 2]
    flops = 2.0 * n * n * n

    got = out.numpy()
    mean = lm.mean(out.astype(lm.float32)).item()
    print(f"backend          {backend}")
    print(f"result           shape={out.shape} dtype={out.dtype.name} mean={mean:.6f}")
    print(f"first call       {warm_ms:.1f} ms (includes compilation / cache load)")
    print(f"optimized code   ready {tier_ms:.1f} ms later (background compile; 0 when cached)")
    print(f"per call         {ms:.2f} ms mean, {med:.2f} ms median over {args.iters} iterations"
          f" ({flops / (med * 1e-3) / 1e9:.1f} GFLOP/s)")  # fmt: skip

    a32, b32 = A.numpy().astype(np.float32), B.numpy().astype(np.float32)
    t0 = time.perf_counter()
    ref = np.maximum(a32 @ b32, 0) * np.float32(0.125)
    np_ms = (time.perf_counter() - t0) * 1e3
    print(f"numpy float32    {np_ms:.2f} ms (one call, for scale)")

    err = np.abs(got.astype(np.float32) - ref)
    big = np.abs(ref) > 1.0
    max_rel = float((err[big] / np.abs(ref[big])).max()) if big.any() else 0.0
    print(f"max abs error    {float(err.max()):.3e}")
    print(f"max rel error    {max_rel:.3e} (where |ref| > 1)")
    ok = got.shape == ref.shape and got.dtype == np.float16
    ok = ok and bool(np.all(err <= ATOL + RTOL * np.abs(ref)))
    print("check            " + ("OK: matches numpy float32 within float16 tolerance" if ok else
                                 f"FAILED: rtol={RTOL} atol={ATOL} exceeded"))  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
