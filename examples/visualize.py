"""Pictures of what lazymath does with two graphs: SVGs of both stages and an HTML report each.

    python examples/visualize.py                  # writes into ./lazymath-viz/
    python examples/visualize.py --out /tmp/viz --n 256

Graph 1, custom_op: mul(relu(matmul(A, B)), scale) on float16, one Cube kernel (relu and the
scale are the matmul's epilogue). Graph 2, two branches: relu(x @ w) on the Cube unit and
sigmoid(c * 2 + 1) on the Vector unit run on two streams; a third kernel joins them after an
event. Both reports are written under `lm.profile()`, so they carry the simulated NPU timeline
(per stream and per pipe) and the measured host timeline.

Files per graph: <name>_graph.svg (the captured graph as written), <name>_kernels.svg (after
fusion), <name>_report.html (open it in any browser, offline). Without Graphviz the pictures
are written as .dot files instead and the reports carry the DOT text.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # run from a checkout

import lazymath as lm  # noqa: E402
from lazymath.viz import GraphvizNotFoundError  # noqa: E402


def custom_op(A, B, scale):
    return lm.mul(lm.relu(lm.matmul(A, B)), scale)


def two_branch(x, w, c):
    """Three outputs: each branch is kept, so each is its own kernel on its own stream."""
    left = lm.relu(x @ w)  # Cube kernel (relu is its epilogue)
    right = lm.sigmoid(c * 2 + 1)  # Vector kernel, independent of the left branch
    return left, right, lm.sum(left * right, axis=1)  # joins both: waits on an event


def pictures(outs, name: str, outdir: pathlib.Path) -> list[str]:
    """Both stages as SVG (or .dot when Graphviz is missing)."""
    written = []
    for stage in ("graph", "kernels"):
        path = outdir / f"{name}_{stage}.svg"
        try:
            written.append(lm.visualize(*outs, filename=path, stage=stage))
        except GraphvizNotFoundError as e:
            print(f"note: {e}", file=sys.stderr)
            written.append(lm.visualize(*outs, filename=path.with_suffix(".dot"), stage=stage))
    return written


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="lazymath-viz", help="output directory")
    p.add_argument("--n", type=int, default=512, help="custom_op matrix size (default 512)")
    args = p.parse_args()
    outdir = pathlib.Path(args.out)
    os.makedirs(outdir, exist_ok=True)
    written: list[str] = []

    n = args.n
    A = lm.random.randn(n, n, seed=0, dtype=lm.float16).realize()
    B = lm.random.randn(n, n, seed=1, dtype=lm.float16).realize()
    out = custom_op(A, B, 0.125)
    print(lm.explain(out))
    written += pictures([out], "custom_op", outdir)
    with lm.profile() as prof:
        # the report takes the schedule first, then realizes `out` inside the profiler
        written.append(lm.report(out, filename=outdir / "custom_op_report.html"))
    prof.summary()

    x = lm.random.randn(96, 64, seed=2, dtype=lm.float16).realize()
    w = lm.random.randn(64, 80, seed=3, dtype=lm.float16).realize()
    c = lm.random.randn(96, 80, seed=4, dtype=lm.float16).realize()
    ys = two_branch(x, w, c)
    print(lm.explain(*ys))
    written += pictures(ys, "two_branch", outdir)
    with lm.profile() as prof:
        # a first run on other inputs of the same shapes compiles the program; the report's own
        # run (of `ys`) then hits the program cache: the timelines show both realizes
        x2, w2, c2 = (lm.random.randn(*t.shape, seed=9 + i, dtype=lm.float16).realize()
                      for i, t in enumerate((x, w, c)))  # fmt: skip
        lm.realize(*two_branch(x2, w2, c2))
        written.append(lm.report(*ys, filename=outdir / "two_branch_report.html"))
    prof.summary()

    for path in written:
        print("wrote", path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
