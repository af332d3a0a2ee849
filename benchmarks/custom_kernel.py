"""A user kernel (`lm.kernel`) beside the built-in path and numpy: GELU on float32.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/custom_kernel.py [--n N]

Rows: the double-buffered user kernel from examples/custom_kernel.py launched directly
(`CompiledKernel` on preallocated arrays: the kernel alone), the same as a lazy op
(`gelu_double(x).realize()`: graph capture + program-cache replay), the same formula written
with lazymath ops (one fused built-in kernel), and numpy (ufuncs with preallocated `out=`).
Medians; the simulated NPU cycles of the user kernel come from the cost model.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

from _timing import median_time  # noqa: E402
from custom_kernel import C, gelu_double  # noqa: E402

import lazymath as lm  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=1 << 20)
    p.add_argument("--reps", type=int, default=30)
    args = p.parse_args()
    n, reps = args.n, args.reps
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    y = np.empty_like(x)
    ck = gelu_double.compile(x, backend="llvm")
    tx = lm.tensor(x)

    def builtin():
        return (tx / (1 + lm.exp((tx + 0.044715 * tx * tx * tx) * -C))).realize()

    t1, t2 = np.empty_like(x), np.empty_like(x)

    def numpy_out():
        np.multiply(x, x, out=t1)
        np.multiply(t1, x, out=t1)
        np.multiply(t1, np.float32(0.044715), out=t1)
        np.add(t1, x, out=t1)
        np.multiply(t1, np.float32(-C), out=t1)
        np.exp(t1, out=t1)
        np.add(t1, np.float32(1), out=t1)
        np.divide(x, t1, out=t2)

    rows = [
        ("user kernel, launched", median_time(lambda: ck(x, y), reps)),
        ("user kernel, lazy op", median_time(lambda: gelu_double(tx).realize(), reps)),
        ("lazymath ops (fused)", median_time(builtin, reps)),
        ("numpy (out=)", median_time(numpy_out, reps)),
    ]
    base = rows[-1][1]
    print(f"GELU, {n} float32, host {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    for name, t in rows:
        print(f"  {name:24s} {t * 1e3:8.3f} ms   {base / t:5.2f}x numpy")
    cost = gelu_double.cost(x)
    print(f"  simulated NPU (ascend910): {cost.total:,.0f} cycles/block on {cost.blocks} blocks "
          f"({cost.seconds * 1e6:.1f} us)")  # fmt: skip


if __name__ == "__main__":
    main()
