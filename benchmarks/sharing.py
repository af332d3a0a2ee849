"""Sharing the process: lazymath's time right after a peer's threaded call, against its time alone.

    python benchmarks/sharing.py                 # both cases, every lazymath option
    python benchmarks/sharing.py --quick         # CI smoke: small sizes, few repetitions

Two cases (issue 35), each timed alone and right after a peer call, in alternating rounds in
one process (machine noise hits both alike):
- elementwise: `lm.realize(sin(X), exp(X), log(abs(X) + 1e-10))` on 1M float32, after a torch
  elementwise op on 1M float32 (torch's OpenMP intra-op threads keep spinning after it returns);
- custom_op: float16 `relu(A @ B) * 0.5` 2048^3, after a numpy float32 2048 matmul (OpenBLAS's
  threads spin ~0.1 s after each call).
Each timed call follows a pause of `--pause` seconds (idle pools block) and, for "after", one peer
call. The options are what lazymath can do from its side: its default, no spinning of its own
(LAZYMATH_POOL_SPIN_US=0), one execution thread (`lm.set_num_threads(1)`). The table gives
medians and the ratio after/alone (issue 35's goal: <= 1.15). Peers run at their default
settings (torch's thread count, OpenBLAS's). Timings are never asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _timing import settle_compiles  # noqa: E402

import lazymath as lm  # noqa: E402
from lazymath import settings  # noqa: E402


def _elementwise(n: int):
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    X = lm.asarray(x)

    def run():
        outs = (lm.sin(X), lm.exp(X), lm.log(lm.abs(X) + 1e-10))
        lm.realize(*outs)

    return run


def _custom_op(n: int):
    rng = np.random.default_rng(1)
    A = lm.asarray(rng.standard_normal((n, n)).astype(np.float16))
    B = lm.asarray(rng.standard_normal((n, n)).astype(np.float16))

    def run():
        lm.realize(lm.maximum(A @ B, 0) * 0.5)

    return run


def _torch_op(n: int):
    try:
        import torch
    except ImportError:
        return None, "torch missing"
    t = torch.randn(n)
    return (lambda: torch.exp(t)), f"torch.exp {n} float32 ({torch.get_num_threads()} threads)"


def _numpy_matmul(n: int):
    a = np.random.default_rng(2).standard_normal((n, n)).astype(np.float32)
    out = np.empty_like(a)
    return (lambda: np.matmul(a, a, out=out)), f"numpy float32 {n} matmul"


def _time(fn, before, reps: int, pause: float) -> tuple[float, float]:
    """Median seconds of `fn` alone and right after `before`, alternating rounds."""
    alone, after = [], []
    for _ in range(reps):
        for mode in ("alone", "after"):
            time.sleep(pause)
            if mode == "after":
                before()
            t0 = time.perf_counter()
            fn()
            (after if mode == "after" else alone).append(time.perf_counter() - t0)
    return statistics.median(alone), statistics.median(after)


OPTIONS = {
    "default": {},
    "spin 0": {"LAZYMATH_POOL_SPIN_US": 0},
    "1 thread": {"threads": 1},
}


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, 3 rounds (CI smoke)")
    ap.add_argument("--reps", type=int, default=0, help="rounds per option (default 31/11)")
    ap.add_argument("--pause", type=float, default=0.03, help="seconds before each timed call")
    ap.add_argument("--only", default="", help="elementwise,custom_op (default both)")
    ap.add_argument("--options", default="", help=f"of {', '.join(OPTIONS)} (default all)")
    args = ap.parse_args(argv)
    n_ew, n_mm = (1 << 14, 128) if args.quick else (1 << 20, 2048)
    r_ew, r_mm = (3, 3) if args.quick else (31, 11)
    cases = {
        "elementwise": (_elementwise(n_ew), _torch_op(n_ew), args.reps or r_ew),
        "custom_op": (_custom_op(n_mm), _numpy_matmul(n_mm), args.reps or r_mm),
    }
    only = [c for c in args.only.split(",") if c] or list(cases)
    options = [o for o in args.options.split(",") if o] or list(OPTIONS)
    rows = []
    for case in only:
        fn, (before, peer), reps = cases[case]
        if before is None:
            print(f"{case}: skipped ({peer})")
            continue
        fn()
        fn()
        settle_compiles()
        for opt in options:
            conf = dict(OPTIONS[opt])
            threads = conf.pop("threads", None)
            if threads is not None:
                lm.set_num_threads(threads)
            try:
                with settings.override(**conf):
                    fn()
                    alone, after = _time(fn, before, reps, args.pause)
            finally:
                if threads is not None:
                    lm.set_num_threads(None)  # back to the default count
            rows.append({"case": case, "peer": peer, "option": opt, "alone": alone,
                         "after": after, "ratio": after / alone})  # fmt: skip
            print(f"{case:12s} {opt:9s} alone {alone * 1e3:8.2f} ms  after {peer}: "
                  f"{after * 1e3:8.2f} ms  after/alone {after / alone:5.2f}",
                  flush=True)  # fmt: skip
    print(f"lazymath threads {lm.get_num_threads()}, host {os.cpu_count()} cores, load "
          f"{os.getloadavg()[0]:.1f}; pause {args.pause} s; goal after/alone <= 1.15")  # fmt: skip
    return rows


if __name__ == "__main__":
    main()
