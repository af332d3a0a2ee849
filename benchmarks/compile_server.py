"""What the compile server (LAZYMATH_COMPILE_ISOLATE=server, the default since issue 37) adds
to the first realize of a fresh process, against in-process compiles (`auto`) timed in the
same run. Each sample is a new interpreter with an empty kernel cache (a fresh
LAZYMATH_CACHE_DIR), so the first realize compiles; the modes alternate sample by sample so a
neighbour's load hits both alike. Two probes: one relu (one kernel), and a small block
(matmul + bias + tanh + softmax + a reduction: 3 kernels compiled together).

    /work/bin/lmbench python benchmarks/compile_server.py --reps 9
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

_PROBE = r"""
import json, time
import numpy as np
import lazymath as lm
rng = np.random.default_rng(0)
t0 = time.perf_counter()
if {block}:
    a = lm.asarray(rng.standard_normal((64, 96), dtype=np.float32))
    w = lm.asarray(rng.standard_normal((96, 48), dtype=np.float32))
    b = lm.asarray(rng.standard_normal(48, dtype=np.float32))
    h = lm.softmax(lm.tanh(a @ w + b), axis=-1)
    lm.realize(h, lm.sum(h * h, axis=0))
else:
    lm.maximum(lm.asarray(np.arange(-500, 500, dtype=np.float32)), 0).realize()
t1 = time.perf_counter()
print(json.dumps({{"first_realize": t1 - t0}}))
"""


def sample(mode: str, block: bool) -> float:
    """One fresh interpreter's first realize (seconds), empty kernel cache, in `mode`."""
    with tempfile.TemporaryDirectory() as d:
        env = {**os.environ, "LAZYMATH_CACHE_DIR": d, "LAZYMATH_COMPILE_ISOLATE": mode}
        out = subprocess.run(
            [sys.executable, "-c", _PROBE.format(block=block)],
            env=env,
            cwd=d,  # `python -c` puts the cwd first on sys.path: a checkout there shadows it
            capture_output=True,
            text=True,
            check=True,
        )
    return json.loads(out.stdout.strip().splitlines()[-1])["first_realize"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--reps", type=int, default=9)
    args = ap.parse_args()
    modes = ("auto", "server")
    print(f"reps={args.reps} (medians; fresh process and empty kernel cache each)")
    for block in (False, True):
        times: dict[str, list[float]] = {m: [] for m in modes}
        for _ in range(args.reps):
            for m in modes:
                times[m].append(sample(m, block))
        med = {m: statistics.median(v) for m, v in times.items()}
        name = "block (3 kernels)" if block else "relu (1 kernel)"
        print(
            f"  {name:18s} auto {1e3 * med['auto']:7.1f} ms  server {1e3 * med['server']:7.1f} ms"
            f"  added {1e3 * (med['server'] - med['auto']):+6.1f} ms"
            f"  ratio {med['server'] / med['auto']:.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
