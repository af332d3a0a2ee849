"""Two independent branches that join, on two streams, profiled.

    python examples/streams.py            # writes trace.json next to the current directory

Branch A (exp, scale, row sums) and branch B (sin, shift, row maxima) share nothing, so stream
assignment puts them on different streams; the join (a reduction of A * B) waits for the other
branch through one event. The profiler prints each kernel's measured host time beside its
simulated NPU time, and trace.json shows both timelines (open it in ui.perfetto.dev).

Whether the two branches overlap on the simulated NPU depends on how many AI cores each kernel
occupies: with 1024 rows each branch's kernel takes all 32 cores of the ascend910 (one block
per core), so the other stream waits for free cores and nothing overlaps; with 16 rows each
takes 16 cores and the branches run side by side. `lm.explain` says which, and why; the
profiler's `cores` column is the simulated core count (`blk` is the host's threads).
"""

from __future__ import annotations

import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # run from a checkout

import lazymath as lm  # noqa: E402


def build(x, y):
    a = lm.sum(lm.exp(x) * 0.5, axis=1)  # branch A
    b = lm.max(lm.sin(y) + 1.0, axis=1)  # branch B
    return lm.sum(a * b)  # join


def main(path: str = "trace.json") -> None:
    dev = lm.init_device(0, "ascend910")
    rng = np.random.default_rng(0)
    xn = rng.standard_normal((1024, 4096), dtype=np.float32)
    yn = rng.standard_normal((1024, 4096), dtype=np.float32)
    x, y = lm.tensor(xn), lm.tensor(yn)

    print(f"device: {dev!r}")
    print(lm.explain(build(x, y)))
    few = [lm.tensor(rng.standard_normal((16, 65536), dtype=np.float32)) for _ in range(2)]
    streams = str(lm.explain(build(*few))).rsplit("streams:", 1)[1].strip()
    print(f"\nthe same program on 16 rows of 65536 (16 cores per branch):\n  {streams}\n")
    build(x, y).realize()  # compile once, so the profile shows the cached replay
    with lm.profile() as p:
        c = build(x, y)
        c.realize()
    print()
    p.summary()
    want = np.sum(np.sum(np.exp(xn) * 0.5, axis=1) * np.max(np.sin(yn) + 1.0, axis=1))
    got = float(c.numpy())
    print(f"\nresult {got:.6g} (numpy {want:.6g}, rel. diff {abs(got - want) / abs(want):.1e})")
    print(f"memory: {dev.memory_stats()}")
    print(f"trace written to {p.save(path)} (open in ui.perfetto.dev or chrome://tracing)")


if __name__ == "__main__":
    main(*sys.argv[1:])
