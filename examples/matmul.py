"""Matmul through lazymath vs numpy: a few sizes and dtypes, timed and checked.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python examples/matmul.py
    LAZYMATH_BACKEND=reference python examples/matmul.py --quick

Each row builds `A @ B` (2-D, batched, or with a transposed operand), realizes it once to compile
or load the kernel, then reports the median time per realize against numpy on the same data.
float16 runs the NPU way (float32 accumulation, one rounding to float16); numpy has no fast
float16 matmul, so its column times numpy float32 on the float16 inputs, which is also the
correctness reference. The script exits non-zero if any result is off.
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

# (label, batch, m, k, n, dtype, transpose_b)
CASES = [
    ("prime", (), 7, 13, 5, "float32", False),
    ("square", (), 256, 256, 256, "float32", False),
    ("square", (), 1024, 1024, 1024, "float32", False),
    ("square", (), 1024, 1024, 1024, "float16", False),
    ("tall-skinny", (), 4096, 64, 256, "float32", False),
    ("A @ B.T", (), 512, 384, 640, "float16", True),
    ("batched", (8,), 128, 96, 160, "float32", False),
    ("int32", (), 128, 128, 128, "int32", False),
    ("float64 (AI CPU)", (), 256, 256, 256, "float64", False),
]
QUICK = {0, 1, 3, 6, 7}
TOL = {"float16": (2e-3, 1e-2), "float32": (1e-4, 1e-4), "float64": (1e-12, 1e-12)}


def _median_ms(fn, iters: int) -> float:
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return 1e3 * sorted(ts)[len(ts) // 2]


def _inputs(batch, m, k, n, dtype, transpose_b, rng):
    if dtype == "int32":
        a = rng.integers(-8, 9, size=batch + (m, k)).astype(np.int32)
        b = rng.integers(-8, 9, size=batch + ((n, k) if transpose_b else (k, n))).astype(np.int32)
    else:
        a = rng.standard_normal(batch + (m, k), dtype=np.float32).astype(dtype)
        b = rng.standard_normal(batch + ((n, k) if transpose_b else (k, n)), dtype=np.float32)
        b = b.astype(dtype)
    return a, b


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="only the small cases")
    p.add_argument("--iters", type=int, default=5)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    backend = os.environ.get("LAZYMATH_BACKEND", "llvm")
    print(f"backend {backend}")
    print(f"{'case':18s} {'shape (batch, m, k, n)':26s} {'dtype':8s} {'lazymath ms':>12s} "
          f"{'numpy ms':>10s} {'GFLOP/s':>8s} {'max rel err':>12s}  check")  # fmt: skip
    all_ok = True
    for i, (label, batch, m, k, n, dtype, tb) in enumerate(CASES):
        if args.quick and i not in QUICK:
            continue
        a, b = _inputs(batch, m, k, n, dtype, tb, rng)
        ta, tb_ = lm.tensor(a), lm.tensor(b)

        def build(ta=ta, tb_=tb_, tb=tb):
            return ta @ (tb_.mT if tb else tb_)

        out = build().realize()  # warm-up: compile or load
        lm_ms = _median_ms(lambda: build().realize(), args.iters)  # noqa: B023
        bb = np.swapaxes(b, -1, -2) if tb else b
        if dtype == "float16":  # the NPU's numerics: float32 products and accumulation
            a32, b32 = a.astype(np.float32), bb.astype(np.float32)
            np_ms = _median_ms(lambda: a32 @ b32, args.iters)  # noqa: B023
            ref = (a32 @ b32).astype(np.float16)
        else:
            np_ms = _median_ms(lambda: a @ bb, args.iters)  # noqa: B023
            ref = a @ bb
        got = out.numpy()
        ok = got.shape == ref.shape and got.dtype == ref.dtype
        if dtype in TOL:
            rtol, atol = TOL[dtype]
            g, r = got.astype(np.float64), ref.astype(np.float64)
            err = float(np.max(np.abs(g - r) / (1.0 + np.abs(r)))) if r.size else 0.0
            ok = ok and bool(np.allclose(g, r, rtol=rtol, atol=atol))
        else:
            err = float(np.max(np.abs(got.astype(np.int64) - ref))) if ref.size else 0.0
            ok = ok and err == 0
        all_ok = all_ok and ok
        flops = 2.0 * int(np.prod(batch, dtype=np.int64)) * m * k * n
        shape = f"{batch}, {m}, {k}, {n}"
        gflops = flops / (lm_ms * 1e-3) / 1e9
        verdict = "OK" if ok else "FAILED"
        print(f"{label:18s} {shape:26s} {dtype:8s} {lm_ms:12.3f} {np_ms:10.3f} "
              f"{gflops:8.1f} {err:12.2e}  {verdict}")  # fmt: skip
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
