"""Sharing the process: lazymath's time right after a peer's threaded call, against its time alone.

    python benchmarks/sharing.py                 # both cases, every lazymath option
    python benchmarks/sharing.py --quick         # CI smoke: small sizes, few repetitions
    python benchmarks/sharing.py --machine       # two processes; taskset -c 0; threadpool_limits

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

`--machine` shares the machine instead of the process. Two lazymath processes start the same
work (`--iters` rounds of the elementwise case) at the same instant; each should finish within
1.2x of the same work alone on half the machine (one thread on a 2-core host: issue 35's
goal). Its options A/B the two mechanisms against a stolen core: host blocks per thread
(`compile.BLOCKS_PER_THREAD`, 1 = one block per thread as before) and oversubscription
detection (`_threads.OVERSUB_DETECT`). It also runs the work under `taskset -c 0` and under
threadpoolctl's `threadpool_limits(1)` and prints the thread count lazymath chose (the rule:
1) beside the time.
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


def _time(fn, before, reps: int, pause: float) -> tuple[float, float, float]:
    """Median seconds of `fn` alone and right after `before`, alternating rounds, and of the
    peer call `before` itself (what quieting its pool costs it: its next call re-creates the
    threads)."""
    alone, after, peer = [], [], []
    for _ in range(reps):
        for mode in ("alone", "after"):
            time.sleep(pause)
            if mode == "after":
                t0 = time.perf_counter()
                before()
                peer.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            fn()
            (after if mode == "after" else alone).append(time.perf_counter() - t0)
    return statistics.median(alone), statistics.median(after), statistics.median(peer)


OPTIONS = {
    "default": {},
    "no quiet": {"LAZYMATH_QUIET_PEERS": False},
    "spin 0": {"LAZYMATH_POOL_SPIN_US": 0},
    "1 thread": {"threads": 1},
}


def _child(iters: int, n: int, opts: str, start_at: float) -> None:
    """One process of the --machine runs: warm up, wait for `start_at` (time.time()), run
    `iters` rounds, print 'seconds threads quiet_periods' (oversubscription detected)."""
    from lazymath import _threads
    from lazymath.backend import compile as C

    for kv in filter(None, opts.split(",")):
        k, v = kv.split("=")
        if k == "blocks":
            C.BLOCKS_PER_THREAD = int(v)
        elif k == "detect":
            _threads.OVERSUB_DETECT = v == "1"
    fn = _elementwise(n)
    fn()
    fn()
    settle_compiles()
    while time.time() < start_at:
        time.sleep(0.001)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    pool = _threads._POOL
    print(f"{time.perf_counter() - t0:.6f} {lm.get_num_threads()} "
          f"{pool.quiet_periods if pool is not None else 0}")  # fmt: skip


def _spawn(iters: int, n: int, opts: str, procs: int, env_extra=None, prefix=()) -> list:
    """Start `procs` children together; their (seconds, threads, quiet periods)."""
    import subprocess

    env = dict(os.environ, **(env_extra or {}))
    start_at = time.time() + 4.0  # after every child's import and warm-up
    cmd = [*prefix, sys.executable, os.path.abspath(__file__), "--child", str(iters), "--n",
           str(n), "--child-opts", opts, "--start-at", repr(start_at)]  # fmt: skip
    ps = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
          for _ in range(procs)]  # fmt: skip
    out = []
    for p in ps:
        text, _ = p.communicate(timeout=170)
        sec, threads, late = text.split()[-3:]
        out.append((float(sec), int(threads), int(late)))
    return out


def machine(iters: int, n: int) -> list[dict]:
    """The --machine runs (see the module docstring)."""
    import shutil

    rows = []
    (half,) = _spawn(iters, n, "", 1, {"LAZYMATH_NUM_THREADS": "1"})
    (whole,) = _spawn(iters, n, "", 1)
    print(f"alone: 1 thread (half the machine) {half[0]:.3f} s, {whole[1]} threads "
          f"{whole[0]:.3f} s ({iters} rounds of 3 outputs of {n} float32)")  # fmt: skip
    for opts in ("blocks=4,detect=1", "blocks=4,detect=0", "blocks=1,detect=1",
                 "blocks=1,detect=0"):  # fmt: skip
        got = _spawn(iters, n, opts, 2)
        worst = max(t for t, _, _ in got)
        rows.append({"case": "two processes", "option": opts, "seconds": [t for t, _, _ in got],
                     "ratio": worst / half[0]})  # fmt: skip
        print(f"two processes {opts:18s} " + ", ".join(f"{t:.3f} s ({late} quiet)"
                                                      for t, _, late in got)
              + f"; worst / alone on half the machine {worst / half[0]:.2f} (goal <= 1.2)",
              flush=True)  # fmt: skip
    if shutil.which("taskset"):
        (ts,) = _spawn(iters, n, "", 1, prefix=("taskset", "-c", "0"))
        print(f"taskset -c 0: lazymath threads {ts[1]} (rule: 1), {ts[0]:.3f} s "
              f"({ts[0] / half[0]:.2f}x 1 thread alone)")  # fmt: skip
        rows.append({"case": "taskset -c 0", "threads": ts[1], "seconds": ts[0]})
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        print("threadpool_limits: threadpoolctl missing")
        return rows
    fn = _elementwise(n)
    fn()
    settle_compiles()
    with threadpool_limits(1):
        threads = lm.get_num_threads()
        fn()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        t = time.perf_counter() - t0
    print(f"threadpool_limits(1): lazymath threads {threads} (rule: 1), {t:.3f} s "
          f"({t / half[0]:.2f}x 1 thread alone, in this process)")  # fmt: skip
    rows.append({"case": "threadpool_limits(1)", "threads": threads, "seconds": t})
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, 3 rounds (CI smoke)")
    ap.add_argument("--reps", type=int, default=0, help="rounds per option (default 31/11)")
    ap.add_argument("--pause", type=float, default=0.03, help="seconds before each timed call")
    ap.add_argument("--only", default="", help="elementwise,custom_op (default both)")
    ap.add_argument("--options", default="", help=f"of {', '.join(OPTIONS)} (default all)")
    ap.add_argument("--machine", action="store_true", help="two processes, taskset, limits")
    ap.add_argument("--iters", type=int, default=300, help="--machine: rounds per process")
    ap.add_argument("--n", type=int, default=1 << 20, help="--machine: elements")
    ap.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--child-opts", default="", help=argparse.SUPPRESS)
    ap.add_argument("--start-at", type=float, default=0.0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _child(args.child, args.n, args.child_opts, args.start_at)
        return []
    if args.machine:
        return machine(args.iters if not args.quick else 3, args.n if not args.quick else 1 << 14)
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
                    alone, after, peer_s = _time(fn, before, reps, args.pause)
            finally:
                if threads is not None:
                    lm.set_num_threads(None)  # back to the default count
            rows.append({"case": case, "peer": peer, "option": opt, "alone": alone,
                         "after": after, "ratio": after / alone, "peer_s": peer_s})  # fmt: skip
            print(f"{case:12s} {opt:9s} alone {alone * 1e3:8.2f} ms  after {peer}: "
                  f"{after * 1e3:8.2f} ms  after/alone {after / alone:5.2f}  (peer call "
                  f"{peer_s * 1e3:.2f} ms)", flush=True)  # fmt: skip
    print(f"lazymath threads {lm.get_num_threads()}, host {os.cpu_count()} cores, load "
          f"{os.getloadavg()[0]:.1f}; pause {args.pause} s; goal after/alone <= 1.15")  # fmt: skip
    return rows


if __name__ == "__main__":
    main()
