"""Per-kernel overhead of a program-cache hit, against numpy eager calls.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/overhead.py [--quick]

Issue 5 target: a realize of a cached 5-kernel program adds under 30 us per kernel over the
kernels' own run time, and a cached 3-op realize of 1,000 elements stays under 50 us end to end.

What is measured (all medians, steady state, program cache and kernel cache warm):
- the 5-kernel program: softmax of a 1,000-element float32 vector plus the sum of its squares
  (5 kernels before row-resident fusion, fewer now: the count is read from `lm.schedule`
  and the per-kernel overhead divides by it). One "realize" is:
  build the lazy graph from a realized input tensor + `lm.realize(p, l)` (signature, cache
  lookup, arena and output allocation, 5 launches, commit);
- each kernel alone: its compiled kernel (from `lazymath.engine.PROGRAMS`) run on the argument
  arrays the program passed it, timed with a prebuilt argv (`run_block`, the native call) —
  the kernels' own time;
- overhead per kernel = (realize - sum of the kernels' native run times) / kernels, and the
  breakdown of that time: graph building, the signature walk, `Program.run` without kernels;
- the 3-op graph relu(x * 2 + y) on 1,000 elements, build + realize, end to end;
- numpy eager calls computing the same values, side by side.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import lazymath as lm  # noqa: E402
from lazymath import engine  # noqa: E402
from lazymath.graph import walk  # noqa: E402

N = 1000
CLOCK = time.perf_counter_ns  # --clock cpu: time.thread_time_ns (this thread's CPU time)


def prog5(x: lm.Tensor) -> tuple[lm.Tensor, lm.Tensor]:
    """softmax(x) and sum(softmax(x)**2) (see the module docstring for its kernel count)."""
    e = lm.exp(x - x.max())
    p = e / e.sum()
    return p, (p * p).sum()


def np_prog5(x: np.ndarray) -> tuple[np.ndarray, np.floating]:
    e = np.exp(x - x.max())
    p = e / e.sum()
    return p, (p * p).sum()


def prog3(x: lm.Tensor, y: lm.Tensor) -> lm.Tensor:
    return lm.relu(x * 2.0 + y)


def np_prog3(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.maximum(x * np.float32(2.0) + y, np.float32(0))


def median_us(fn, reps: int, rounds: int) -> float:
    """Median over `rounds` of the mean time of `reps` calls, in microseconds."""
    ts = []
    for _ in range(rounds):
        t0 = CLOCK()
        for _ in range(reps):
            fn()
        ts.append((CLOCK() - t0) / reps / 1e3)
    return statistics.median(ts)


def interleaved_us(fns: dict, reps: int, rounds: int) -> dict:
    """Median microseconds per call of each fn, alternating fns round by round."""
    out: dict = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            t0 = CLOCK()
            for _ in range(reps):
                fn()
            out[k].append((CLOCK() - t0) / reps / 1e3)
    return {k: statistics.median(v) for k, v in out.items()}


def capture_argvs(prog: engine.Program, run) -> list:
    """Run `run()` once (a replay of `prog`), recording the argv each kernel receives.

    Spies on both launch primitives of a kernel instance (`run_block`, used by the stream and
    pool paths, and the native `_cfunc` the replay path calls directly). `run` must return the
    realized tensors: they are kept alive for the whole benchmark, because the recorded argvs
    point at their memory."""
    seen: dict[int, object] = {}
    cfuncs = {}
    for _, ck, _ in prog.kernels:
        original = ck.run_block

        def spy(argv, block_idx=0, block_num=1, _ck=ck, _orig=original):
            seen.setdefault(id(_ck), argv)
            return _orig(argv, block_idx, block_num)

        ck.run_block = spy
        cf = getattr(ck, "_cfunc", None)
        if cf is not None:

            def cspy(block_idx, block_num, argv, _ck=ck, _cf=cf):
                # a private copy: the replay path rewrites its argvs on the next call
                seen.setdefault(id(_ck), (type(argv))(*argv))
                return _cf(block_idx, block_num, argv)

            cfuncs[id(ck)] = cf
            ck._cfunc = cspy
    try:
        _KEEP.append(run())
    finally:
        for _, ck, _ in prog.kernels:
            del ck.run_block
            if id(ck) in cfuncs:
                ck._cfunc = cfuncs[id(ck)]
    return [(ck, seen[id(ck)]) for _, ck, _ in prog.kernels]


_KEEP: list = []  # outputs whose memory recorded argvs point at


class kernels_disabled:
    """Context: every kernel of `prog` does nothing (what is left is pure overhead)."""

    def __init__(self, prog: engine.Program):
        self.prog = prog
        self.saved: list = []

    def __enter__(self):
        for _, ck, _ in self.prog.kernels:
            ck.run_block = lambda argv, block_idx=0, block_num=1: None
            cf = getattr(ck, "_cfunc", None)
            self.saved.append(cf)
            if cf is not None:
                ck._cfunc = lambda block_idx, block_num, argv: None

    def __exit__(self, *exc):
        for (_, ck, _), cf in zip(self.prog.kernels, self.saved):
            del ck.run_block
            if cf is not None:
                ck._cfunc = cf


def native_us(ck, argv, reps: int, rounds: int) -> float:
    """The kernel's own run time: every block run back to back on this thread."""
    blocks = max(1, getattr(ck, "blocks", 1))

    def run():
        for b in range(blocks):
            ck.run_block(argv, b, blocks)

    return median_us(run, reps, rounds)


def program_of(outputs) -> engine.Program:
    key, _, _ = walk.signature([t._node for t in outputs])
    spec = engine.device_spec()
    return dict(engine.PROGRAMS.items())[engine.program_key(key, spec, engine.backend_name())]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--n", type=int, default=N, help="elements (default 1000)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="wall: perf_counter (default); cpu: the calling thread's CPU time, "
                    "robust on a loaded machine, valid when the program runs inline")  # fmt: skip
    args = ap.parse_args()
    global CLOCK
    CLOCK = time.perf_counter_ns if args.clock == "wall" else time.thread_time_ns
    reps, rounds = (50, 15) if args.quick else (200, 41)
    n = args.n

    rng = np.random.default_rng(0)
    xn = rng.standard_normal(n).astype(np.float32)
    yn = rng.standard_normal(n).astype(np.float32)
    x, y = lm.tensor(xn), lm.tensor(yn)

    print(f"backend {engine.backend_name()}, device {engine.device_spec().name}, "
          f"{n} float32 elements, medians of {rounds} rounds x {reps} calls, "
          f"clock {args.clock}, load average {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} cores")  # fmt: skip
    s = lm.schedule(*prog5(x))
    nk = len(s.kernels)  # 5 before row-resident fusion (issue 15) fused softmax's reductions
    print(f"\nsoftmax + sum of squares program ({nk} kernels):")
    print(s.table())

    # warm up: compile (or load) the kernels, fill the program cache, check the values
    t0 = time.perf_counter()
    p, l2 = prog5(x)
    lm.realize(p, l2)
    compile_ms = (time.perf_counter() - t0) * 1e3
    want_p, want_l = np_prog5(xn)
    np.testing.assert_allclose(p.numpy(), want_p, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(l2.numpy(), want_l, rtol=1e-4)
    for _ in range(20):
        lm.realize(*prog5(x))
    hits0 = engine.PROGRAMS.hits
    prog = program_of(prog5(x))
    if args.clock == "cpu" and not getattr(prog, "inline", False):
        print("warning: the program runs on stream threads; --clock cpu misses their time")

    def realize5():
        lm.realize(*prog5(x))

    def build5():
        return prog5(x)

    def signature5():
        outs = prog5(x)
        walk.signature([o._node for o in outs])

    # each kernel alone, on the argv the program gave it
    def realize5_keep():
        outs = prog5(x)
        lm.realize(*outs)
        return outs

    launches = capture_argvs(prog, realize5_keep)
    native = [native_us(ck, argv, reps, rounds) for ck, argv in launches]

    t = interleaved_us(
        {
            "realize": realize5,
            "build": build5,
            "signature": signature5,
            "numpy": lambda: np_prog5(xn),
        },
        reps,
        rounds,
    )
    with kernels_disabled(prog):
        t_noop = median_us(realize5, reps, rounds)
    hits = engine.PROGRAMS.hits - hits0
    assert hits > 0 and prog.hits > 0

    k_native = sum(native)
    overhead = (t["realize"] - k_native) / nk
    print(f"\nfirst realize (compile or kernel-cache load): {compile_ms:.1f} ms")
    print(f"\n{'kernel':16} {'blocks':>6} {'native us':>10}")
    for (ck, _), a in zip(launches, native):
        print(f"{ck.name:16} {ck.blocks:>6} {a:>10.2f}")
    print(f"{'sum':16} {'':>6} {k_native:>10.2f}")
    print(f"\n{nk}-kernel program, build + realize on a program-cache hit:")
    print(f"  lazymath realize (build graph + realize)   {t['realize']:8.1f} us")
    print(f"    of which: build the lazy graph           {t['build']:8.1f} us")
    print(f"              build + signature walk         {t['signature']:8.1f} us")
    print(f"    kernels' own native time (sum)           {k_native:8.1f} us")
    print(f"  overhead per kernel                        {overhead:8.1f} us   (target < 30)")
    print(f"  cross-check: realize with no-op kernels    {t_noop:8.1f} us = "
          f"{t_noop / nk:.1f} us per kernel")  # fmt: skip
    print(f"  numpy eager, same values (7 calls)         {t['numpy']:8.1f} us")

    # ---------------------------------------------------------------- small 3-op graph
    r = prog3(x, y)
    r.realize()
    np.testing.assert_allclose(r.numpy(), np_prog3(xn, yn), rtol=1e-6)
    (k3,) = lm.schedule(prog3(x, y)).kernels

    def realize3():
        prog3(x, y).realize()

    prog3_ = program_of([prog3(x, y)])

    def realize3_keep():
        out = prog3(x, y)
        out.realize()
        return out

    ((ck3, argv3),) = capture_argvs(prog3_, realize3_keep)
    native3 = native_us(ck3, argv3, reps, rounds)
    t3 = interleaved_us({"lazymath": realize3, "numpy": lambda: np_prog3(xn, yn)}, reps, rounds)
    print(f"\n3-op graph relu(x * 2 + y), {n} elements ({k3.name}, 1 kernel):")
    print(f"  lazymath build + realize (cached)          {t3['lazymath']:8.1f} us   (target < 50)")
    print(f"    kernel's own native time                 {native3:8.1f} us")
    print(f"    overhead                                 {t3['lazymath'] - native3:8.1f} us")
    print(f"  numpy eager (3 calls)                      {t3['numpy']:8.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
