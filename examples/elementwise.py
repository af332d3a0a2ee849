"""Three elementwise results of one input, realized together: sin(x), exp(x), log(|x| + 1e-10).

    python examples/elementwise.py                # default backend (llvm)
    python examples/elementwise.py --n 4194304    # another size

`lm.realize(a, b, c)` computes the three outputs in one go: the compiled path fuses them into a
single Vector kernel that reads x once and writes three outputs, where numpy makes one pass (and
one temporary) per ufunc. Timings are medians; each lazymath iteration rebuilds the graph (the
program cache makes that a lookup) and realizes it. Results are checked against numpy (float32
tolerance); the script exits non-zero on a mismatch.
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


def build(x):
    return lm.sin(x), lm.exp(x), lm.log(lm.abs(x) + 1e-10)


def numpy_version(x):
    return np.sin(x), np.exp(x), np.log(np.abs(x) + np.float32(1e-10))


def _median_ms(fn, iters: int) -> float:
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return 1e3 * sorted(ts)[len(ts) // 2]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=1 << 20, help="elements (default 1M)")
    p.add_argument("--iters", type=int, default=20, help="timed iterations (default 20)")
    args = p.parse_args()

    x = lm.random.randn(args.n, seed=0, dtype=lm.float32).realize()
    xn = x.numpy()

    t0 = time.perf_counter()
    outs = build(x)
    lm.realize(*outs)  # warm-up: compiles (or loads) the kernel
    warm_ms = (time.perf_counter() - t0) * 1e3

    def run_lm():
        lm.realize(*build(x))

    lm_ms = _median_ms(run_lm, args.iters)
    np_ms = _median_ms(lambda: numpy_version(xn), args.iters)

    backend = os.environ.get("LAZYMATH_BACKEND", "llvm")
    print(f"backend       {backend}, {args.n} float32 elements, 3 outputs")
    print(f"first call    {warm_ms:.1f} ms (includes compilation / cache load)")
    print(f"lazymath      {lm_ms:.3f} ms per realize (median of {args.iters})")
    print(f"numpy         {np_ms:.3f} ms (median of {args.iters})")
    print(f"speedup       {np_ms / lm_ms:.2f}x")

    ok = True
    for name, got, want in zip(("sin", "exp", "log(|x|+1e-10)"), outs, numpy_version(xn)):
        g = got.numpy()
        err = float(np.max(np.abs(g.astype(np.float64) - want) / (1e-6 + np.abs(want))))
        good = g.dtype == want.dtype and g.shape == want.shape
        good = good and np.allclose(g, want, rtol=1e-5, atol=1e-6)
        ok = ok and good
        print(f"{name:16s}{'OK' if good else 'FAILED'} (max rel error {err:.2e})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
