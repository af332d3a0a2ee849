"""How long the visualizations of big graphs take: a 5,000-op chain (graph stage) and ~5,000
nodes fused into 81 kernels (kernel stage: fusion, DOT generation and `dot -Tsvg`).

    python benchmarks/render.py [--reps N]

Prints the median wall time of each; the target is well under 10 s each (the tests in
tests/viz/test_render.py check what is drawn, this script how fast)."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from _timing import median_time

import lazymath as lm


def chain(n: int):
    y = lm.random.randn(32, 32, seed=11).realize()
    for i in range(n):
        y = lm.sin(y) if i % 2 else lm.cos(y)
    return y


def wide():
    total = None
    for i in range(80):
        z = lm.random.randn(8, 8, seed=100 + i).realize()
        for j in range(60):
            z = lm.sin(z) if j % 2 else z * 1.0001
        s = lm.sum(z, axis=0)
        total = s if total is None else total + s
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    if shutil.which("dot") is None:
        print("Graphviz `dot` is not installed: nothing to measure", file=sys.stderr)
        return 1
    out = Path(tempfile.mkdtemp(prefix="lm-render-"))
    cases = {
        "5000-op chain, graph stage": lambda: lm.visualize(
            chain(5000), filename=out / "chain.svg", stage="graph"
        ),
        "~5000 nodes in 81 kernels, kernel stage": lambda: lm.visualize(
            wide(), filename=out / "wide.svg", spec="ascend910"
        ),
    }
    print(f"{'case':44s} {'median s':>9s}")
    for name, fn in cases.items():
        print(f"{name:44s} {median_time(fn, args.reps, warmup=1):9.2f}")
    shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
