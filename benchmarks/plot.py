"""PNG plots of a `benchmarks/run.py` result: matmul GFLOPS and elementwise / softmax GB/s
against size, one line per peer (matplotlib, the `bench` extra).

    python benchmarks/plot.py [results.json] [--outdir benchmarks/plots]

Prints the paths it wrote (one PNG per suite in the results). The machine, the date and the
load average of the run go into each plot's title: numbers from a shared machine mean little
without them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TITLES = {"matmul": "float32 matmul (n x n x n)", "elementwise": "exp(x) * 2 + 1, float32",
          "softmax": "row softmax, float32"}  # fmt: skip
XLABEL = {"matmul": "n", "elementwise": "elements", "softmax": "elements (rows x cols)"}


def plot(doc: dict, outdir: str) -> list[str]:
    """One PNG per suite of `doc` (the run's JSON) in `outdir`; returns the paths."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("benchmarks/plot.py needs matplotlib: pip install 'lazymath[bench]' "
                         "(or pip install matplotlib)") from None  # fmt: skip
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(outdir, exist_ok=True)
    by_suite: dict[str, list[dict]] = {}
    for r in doc["results"]:
        by_suite.setdefault(r["suite"], []).append(r)
    m = doc.get("machine", {})
    sub = (f"{m.get('cpu', '?')}, {m.get('cores', '?')} cores; {doc.get('date', '')}; "
           f"load {doc.get('load_before')}")  # fmt: skip
    paths = []
    for suite, results in by_suite.items():
        results = sorted(results, key=lambda r: r["size"])
        peers = list(dict.fromkeys(p for r in results for p in r["seconds"]))
        fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
        for peer in peers:
            xs = [r["size"] for r in results if peer in r["seconds"]]
            ys = [r["work"] / r["seconds"][peer] / 1e9 for r in results if peer in r["seconds"]]
            style = {"linewidth": 2.5, "marker": "o"} if peer == "lazymath" else {"marker": "."}
            ax.plot(xs, ys, label=peer, **style)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(XLABEL.get(suite, "size"))
        ax.set_ylabel(results[0]["unit"])
        ax.set_title(f"{TITLES.get(suite, suite)}\n{sub}", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = os.path.join(outdir, f"{suite}.png")
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> list[str]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="?", default=os.path.join(HERE, "results.json"))
    ap.add_argument("--outdir", default=os.path.join(HERE, "plots"))
    args = ap.parse_args(argv)
    with open(args.results) as f:
        doc = json.load(f)
    paths = plot(doc, args.outdir)
    for p in paths:
        print(p)
    return paths


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
