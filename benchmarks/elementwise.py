"""Elementwise and reduction throughput: lazymath beside numpy, numexpr, torch and jax.

Run as
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/elementwise.py
Every case runs all peers in this one process, interleaved, and prints medians and the ratio
peer/lazymath (> 1 means lazymath is faster); the three-output and chain cases also print
lazymath's host roofline (backend/host/roofline.py) and the fraction of it the median reaches.
Machines here are shared: trust ratios, not absolute times, and read the load average printed
before and after.

`--cases three,chain` runs a subset (three, chain, chain16, sum, max, copy, small, trig).
`--single-thread` adds a load-robust view of the vector kernels: thread CPU time (best and
median) of numpy against every block of the lazymath kernel run on the calling thread, so a
busy second core or a slow helper-thread wake-up does not enter the comparison.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
from _timing import host_roof, median_time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import lazymath as lm  # noqa: E402

try:
    import numexpr as ne
except ImportError:  # optional peer
    ne = None
try:
    import torch
except ImportError:
    torch = None
try:
    import jax
    import jax.numpy as jnp
except ImportError:
    jax = None


def report(title: str, results: dict[str, float], nbytes: int | None = None) -> None:
    base = results["lazymath"]
    print(f"\n{title}")
    for name, t in results.items():
        extra = f"  {nbytes / t / 1e9:6.1f} GB/s" if nbytes else ""
        ratio = t / base
        print(f"  {name:18s} {t * 1e3:9.3f} ms   {ratio:6.2f}x lazymath's time{extra}")


def case_three_outputs(n: int, reps: int) -> None:
    x_np = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    x = lm.tensor(x_np)

    def lazy():
        a, b, c = lm.sin(x), lm.exp(x), lm.log(lm.abs(x) + 1e-10)
        lm.realize(a, b, c)

    res = {"lazymath": median_time(lazy, reps)}
    res["numpy"] = median_time(lambda: (np.sin(x_np), np.exp(x_np),
                                        np.log(np.abs(x_np) + 1e-10)), reps)  # fmt: skip
    if ne is not None:
        for th in (1, 2):
            ne.set_num_threads(th)
            res[f"numexpr {th}t"] = median_time(
                lambda env={"x_np": x_np}: (ne.evaluate("sin(x_np)", local_dict=env),
                                            ne.evaluate("exp(x_np)", local_dict=env),
                                            ne.evaluate("log(abs(x_np)+1e-10)", local_dict=env)),
                reps)  # fmt: skip
    if torch is not None:
        xt = torch.from_numpy(x_np)
        res["torch"] = median_time(lambda: (torch.sin(xt), torch.exp(xt),
                                            torch.log(torch.abs(xt) + 1e-10)), reps)  # fmt: skip
    if jax is not None:
        f = jax.jit(lambda v: (jnp.sin(v), jnp.exp(v), jnp.log(jnp.abs(v) + 1e-10)))
        xj = jnp.asarray(x_np)
        res["jax jit"] = median_time(lambda: [o.block_until_ready() for o in f(xj)], reps)
    report(f"sin(x), exp(x), log(abs(x)+1e-10) realized together, {n:,} float32", res)
    print(f"  {host_roof(lm.sin(x), lm.exp(x), lm.log(lm.abs(x) + 1e-10))(res['lazymath'])}")


def case_chain(n: int, dtype: str, reps: int) -> None:
    x_np = np.random.default_rng(1).standard_normal(n).astype(dtype)
    x = lm.tensor(x_np)

    def lazy():
        (lm.exp(lm.sin(x) * 0.5 + 1.0) * x).realize()

    res = {"lazymath": median_time(lazy, reps)}
    res["numpy"] = median_time(lambda: np.exp(np.sin(x_np) * 0.5 + 1.0) * x_np, reps)
    if ne is not None and dtype == "float32":
        for th in (1, 2):
            ne.set_num_threads(th)
            res[f"numexpr {th}t"] = median_time(
                lambda env={"x_np": x_np}: ne.evaluate("exp(sin(x_np)*0.5+1.0)*x_np",
                                                       local_dict=env), reps)  # fmt: skip
    if torch is not None:
        xt = torch.from_numpy(x_np)
        res["torch"] = median_time(lambda: torch.exp(torch.sin(xt) * 0.5 + 1.0) * xt, reps)
    if jax is not None:
        f = jax.jit(lambda v: jnp.exp(jnp.sin(v) * 0.5 + 1.0) * v)
        xj = jnp.asarray(x_np)
        res["jax jit"] = median_time(lambda: f(xj).block_until_ready(), reps)
    report(f"exp(sin(x)*0.5+1.0)*x, {n:,} {dtype}", res, nbytes=2 * x_np.nbytes)
    print(f"  {host_roof(lm.exp(lm.sin(x) * 0.5 + 1.0) * x)(res['lazymath'])}")


def case_reduce(n: int, op: str, reps: int) -> None:
    x_np = np.random.default_rng(2).standard_normal(n).astype(np.float32)
    x = lm.tensor(x_np)
    fn = getattr(lm, op)
    res = {"lazymath": median_time(lambda: fn(x).realize(), reps)}
    res["numpy"] = median_time(lambda: getattr(np, op)(x_np), reps)
    if torch is not None:
        xt = torch.from_numpy(x_np)
        tfn = torch.sum if op == "sum" else torch.max
        res["torch"] = median_time(lambda: tfn(xt), reps)
    got, want = float(fn(x).numpy()), float(getattr(np, op)(x_np.astype(np.float64)))
    assert abs(got - want) <= 1e-3 * max(1.0, abs(want)), (got, want)
    report(f"{op} of {n:,} float32", res, nbytes=x_np.nbytes)


def case_copy_bandwidth(n: int, reps: int) -> None:
    x_np = np.random.default_rng(3).standard_normal(n).astype(np.float32)
    out = np.empty_like(x_np)
    t = median_time(lambda: np.copyto(out, x_np), reps)
    print(f"\nnumpy copy of {n:,} float32: {t * 1e3:.3f} ms = {2 * x_np.nbytes / t / 1e9:.1f} GB/s "
          "(read + write; the machine's practical memory bandwidth)")  # fmt: skip


def case_small_overhead(reps: int) -> None:
    """End to end cost of a small cached graph: capture of 3 ops + realize (program-cache hit)
    of sin(x) * 2 + 1 on 1,000 float32, each call on a new input buffer of the same shape.

    Medians over 41 rounds of 200 calls (single calls are too short to time one by one), with
    the capture alone and the realize alone (graphs captured beforehand) beside it."""
    rng = np.random.default_rng(4)
    calls, rounds = 200, 41
    xs = [lm.tensor(rng.standard_normal(1000).astype(np.float32)) for _ in range(calls)]
    graph = lambda x: lm.sin(x) * 2.0 + 1.0  # noqa: E731
    for x in xs[:20]:
        graph(x).realize()  # compile once, warm the plan caches
    xs = [lm.tensor(rng.standard_normal(1000).astype(np.float32)) for _ in range(calls)]
    t_end, t_build, t_real = [], [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for x in xs:
            graph(x).realize()
        t_end.append((time.perf_counter() - t0) / calls)
        t0 = time.perf_counter()
        built = [graph(x) for x in xs]
        t_build.append((time.perf_counter() - t0) / calls)
        t0 = time.perf_counter()
        for t in built:
            t.realize()
        t_real.append((time.perf_counter() - t0) / calls)
        del built
    xn = rng.standard_normal(1000).astype(np.float32)
    t_np = median_time(lambda: np.sin(xn) * 2.0 + 1.0, reps)
    med = statistics.median
    print(f"\ncached realize of a 3-op graph on 1,000 float32 (program-cache hit), capture + "
          f"realize end to end: {med(t_end) * 1e6:.1f} us median (capture alone "
          f"{med(t_build) * 1e6:.1f} us, realize alone {med(t_real) * 1e6:.1f} us); "
          f"numpy eager {t_np * 1e6:.1f} us")  # fmt: skip


def load_average() -> str:
    try:
        return "load average " + " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "load average unknown"


def _one_kernel(outputs):
    """(compiled kernel, its GM arrays) of a graph that fuses into one kernel reading the
    input tensor(s) once: all blocks then run on the calling thread with run_block(argv, 0, 1)."""
    from lazymath.backend import compile_kernel

    sched = lm.schedule(*outputs)
    if len(sched.kernels) != 1:
        return None
    ir = sched.kernels[0].group.ir
    ck = compile_kernel(ir, lm.current_device().spec)
    return ck, ir


def _cpu_times(fn, reps: int) -> tuple[float, float]:
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.thread_time()
        fn()
        ts.append(time.thread_time() - t0)
    return min(ts), statistics.median(ts)


def case_single_thread(n_small: int, n_big: int, reps: int) -> None:
    """Thread CPU time: numpy vs all blocks of the lazymath kernel on this thread."""
    print(f"\nsingle thread, CPU time (best / median of {reps}): numpy vs the lazymath kernel's "
          "blocks run one after another on this thread")  # fmt: skip
    rng = np.random.default_rng(5)
    cases = (
        ("sin, exp, log(|x|+1e-10)", n_small, "float32",
         lambda x: (lm.sin(x), lm.exp(x), lm.log(lm.abs(x) + 1e-10)),
         lambda v: (np.sin(v), np.exp(v), np.log(np.abs(v) + 1e-10))),
        ("exp(sin(x)*0.5+1)*x", n_big, "float32",
         lambda x: (lm.exp(lm.sin(x) * 0.5 + 1.0) * x,),
         lambda v: (np.exp(np.sin(v) * 0.5 + 1.0) * v,)),
        ("exp(sin(x)*0.5+1)*x", n_big, "float16",
         lambda x: (lm.exp(lm.sin(x) * 0.5 + 1.0) * x,),
         lambda v: (np.exp(np.sin(v) * 0.5 + 1.0) * v,)),
    )  # fmt: skip
    for title, n, dt, lazy, ref in cases:
        x_np = rng.standard_normal(n).astype(dt)
        x = lm.tensor(x_np)
        got = _one_kernel(lazy(x))
        if got is None:
            print(f"  {title}: more than one kernel, skipped")
            continue
        ck, ir = got
        outs = [np.empty(v.shape, v.dtype) for v in ir.outputs]
        argv = ck.make_argv([x_np, *outs])
        t_lm = _cpu_times(lambda ck=ck, argv=argv: ck.run_block(argv, 0, 1), reps)
        for o, want in zip(outs, ref(x_np)):  # the kernel computed the right thing
            assert np.allclose(o, want, rtol=1e-2, atol=1e-2, equal_nan=True), title
        t_np = _cpu_times(lambda ref=ref, x_np=x_np: ref(x_np), reps)
        print(f"  {title}, {n:,} {dt}: numpy {t_np[0] * 1e3:8.3f} / {t_np[1] * 1e3:8.3f} ms, "
              f"lazymath {t_lm[0] * 1e3:8.3f} / {t_lm[1] * 1e3:8.3f} ms "
              f"({t_np[0] / t_lm[0]:.2f}x / {t_np[1] / t_lm[1]:.2f}x)")  # fmt: skip


def case_trig(n: int, reps: int) -> None:
    """float32 sin / cos / tan: the NPU lowering (float32 + int32 instructions only, the
    default) beside the host-only float64 reduction (LAZYMATH_HOST_MATH=1) and numpy (out=)."""
    from lazymath import settings

    rng = np.random.default_rng(0)
    x_np = rng.uniform(-100, 100, n).astype(np.float32)
    x = lm.tensor(x_np)
    out = np.empty_like(x_np)
    for name in ("sin", "cos", "tan"):
        fn, ref = getattr(lm, name), getattr(np, name)
        res = {}
        for label, host in (("lazymath", False), ("lazymath host-math", True)):
            with settings.override(LAZYMATH_HOST_MATH=host):
                res[label] = median_time(lambda fn=fn: fn(x).realize(), reps)
        res["numpy (out=)"] = median_time(lambda ref=ref: ref(x_np, out=out), reps)
        report(f"{name}(x), {n:,} float32 in [-100, 100]: float32-only NPU lowering vs "
               "LAZYMATH_HOST_MATH=1 (float64 reduction)", res)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--quick", action="store_true", help="smaller sizes (smoke test)")
    ap.add_argument("--cases", type=str, default="three,chain,chain16,sum,max,copy,small",
                    help="comma-separated subset of the cases")  # fmt: skip
    ap.add_argument("--single-thread", action="store_true",
                    help="also compare thread CPU time (robust on a shared machine)")  # fmt: skip
    args = ap.parse_args()
    big = 1 << 20 if args.quick else 16 << 20
    cases = set(args.cases.split(","))
    print(f"lazymath {lm.__version__}, numpy {np.__version__}, numexpr "
          f"{getattr(ne, '__version__', '-')}, torch {getattr(torch, '__version__', '-')}, "
          f"jax {getattr(jax, '__version__', '-')}, {os.cpu_count()} cores")  # fmt: skip
    print(load_average())
    if "three" in cases:
        case_three_outputs(1 << 20, args.reps * 3)
    if "chain" in cases:
        case_chain(big, "float32", args.reps)
    if "chain16" in cases:
        case_chain(big, "float16", max(3, args.reps // 3))
    if "sum" in cases:
        case_reduce(big, "sum", args.reps)
    if "max" in cases:
        case_reduce(big, "max", args.reps)
    if "copy" in cases:
        case_copy_bandwidth(big, args.reps)
    if "small" in cases:
        case_small_overhead(2000)
    if "trig" in cases:
        case_trig(4 << 20, args.reps)
    if args.single_thread:
        case_single_thread(1 << 20, big, max(5, args.reps))
    print(load_average())


if __name__ == "__main__":
    main()
