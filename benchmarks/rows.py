"""Row kernels (softmax, log_softmax, layernorm, var): lazymath beside numpy, torch and jax.

Run as
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/rows.py
Every case runs all peers in this one process, interleaved, and prints medians, the ratio
peer/lazymath (> 1 means lazymath is faster) and the bandwidth counting one read and one write
of the input (for var: one read). The reference bandwidth is a numpy copy (np.copyto into a
preallocated array) of the same array, on one thread and on two (halves in two threads: the
thread count lazymath's kernels use on a 2-core host). numpy runs at its best: preallocated
`out=` buffers.
Machines here are shared: read the load average printed before and after, and the
`--single-thread` view (thread CPU time of numpy against all blocks of the lazymath kernel run
on the calling thread), which a busy second core does not distort.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
from _timing import host_roof, median_time, settle_compiles

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import lazymath as lm  # noqa: E402

try:
    import torch
except ImportError:  # optional peer
    torch = None
try:
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_platforms", "cpu")
except ImportError:
    jax = None
try:
    from threadpoolctl import threadpool_info
except ImportError:
    threadpool_info = None

EPS = 1e-5


def warm_cores(seconds: float = 0.3) -> None:
    """Busy both cores briefly (a lazymath kernel runs on all of them) before timing."""
    x = lm.tensor(np.ones(1 << 20, np.float32))
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        (x * 2.0).realize()


def load_average() -> str:
    try:
        return "load average " + " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "load average unknown"


# ----------------------------------------------------------------------------- the graphs


def lm_graph(name: str, x, g):
    if name == "softmax":
        return lm.softmax(x, axis=-1)
    if name == "log_softmax":
        return lm.log_softmax(x, axis=-1)
    if name == "layernorm":
        mu = lm.mean(x, axis=-1, keepdims=True)
        return (x - mu) * lm.rsqrt(lm.var(x, axis=-1, keepdims=True) + EPS) * g
    if name == "var":
        return lm.var(x, axis=-1)
    raise ValueError(name)


def numpy_fn(name: str, x: np.ndarray, g: np.ndarray):
    """numpy at its best: every temporary preallocated, ufuncs with out=."""
    n, m = x.shape
    out = np.empty_like(x)
    col = np.empty((n, 1), x.dtype)
    col2 = np.empty((n, 1), x.dtype)
    if name == "softmax":

        def f():
            np.max(x, axis=1, keepdims=True, out=col)
            np.subtract(x, col, out=out)
            np.exp(out, out=out)
            np.sum(out, axis=1, keepdims=True, out=col)
            np.divide(out, col, out=out)
            return out

    elif name == "log_softmax":
        tmp = np.empty_like(x)

        def f():
            np.max(x, axis=1, keepdims=True, out=col)
            np.subtract(x, col, out=out)
            np.exp(out, out=tmp)
            np.sum(tmp, axis=1, keepdims=True, out=col)
            np.log(col, out=col)
            np.subtract(out, col, out=out)
            return out

    elif name == "layernorm":

        def f():
            np.mean(x, axis=1, keepdims=True, out=col)
            np.subtract(x, col, out=out)
            np.var(x, axis=1, keepdims=True, out=col2)
            np.add(col2, EPS, out=col2)
            np.sqrt(col2, out=col2)
            np.divide(out, col2, out=out)
            np.multiply(out, g, out=out)
            return out

    elif name == "var":
        vout = np.empty(n, x.dtype)

        def f():
            return np.var(x, axis=1, out=vout)

    else:
        raise ValueError(name)
    return f


def torch_fn(name: str, x: np.ndarray, g: np.ndarray):
    xt, gt = torch.from_numpy(x), torch.from_numpy(g)
    if name == "softmax":
        return lambda: torch.softmax(xt, dim=-1)
    if name == "log_softmax":
        return lambda: torch.log_softmax(xt, dim=-1)
    if name == "layernorm":
        return lambda: torch.nn.functional.layer_norm(xt, (x.shape[-1],), weight=gt, eps=EPS)
    if name == "var":
        return lambda: torch.var(xt, dim=-1, unbiased=False)
    raise ValueError(name)


def jax_fn(name: str, x: np.ndarray, g: np.ndarray):
    xj, gj = jnp.asarray(x), jnp.asarray(g)
    if name == "softmax":
        f = jax.jit(lambda v: jax.nn.softmax(v, axis=-1))
    elif name == "log_softmax":
        f = jax.jit(lambda v: jax.nn.log_softmax(v, axis=-1))
    elif name == "layernorm":
        f = jax.jit(lambda v, w: (v - v.mean(-1, keepdims=True))
                    * jax.lax.rsqrt(v.var(-1, keepdims=True) + EPS) * w)  # fmt: skip
        return lambda: f(xj, gj).block_until_ready()
    elif name == "var":
        f = jax.jit(lambda v: v.var(-1))
    else:
        raise ValueError(name)
    return lambda: f(xj).block_until_ready()


# ----------------------------------------------------------------------------- cases


def run_case(name: str, x_np: np.ndarray, g_np: np.ndarray, reps: int, copy_gbs) -> None:
    x, g = lm.tensor(x_np), lm.tensor(g_np)
    sched = lm.schedule(lm_graph(name, x, g))
    form = [e.reason.split(":")[0] for e in sched.fusion_log if e.what == "rows"]
    moved = x_np.nbytes * (1 if name == "var" else 2)
    lm_graph(name, x, g).realize()  # compile once
    warm_cores()
    res = {"lazymath": median_time(lambda: lm_graph(name, x, g).realize(), reps)}
    res["numpy (out=)"] = median_time(numpy_fn(name, x_np, g_np), reps)
    if torch is not None:
        res[f"torch eager {torch.get_num_threads()}t"] = median_time(
            torch_fn(name, x_np, g_np), reps
        )
    if jax is not None:
        res["jax jit"] = median_time(jax_fn(name, x_np, g_np), reps)
    paired = paired_copy_ratio(lambda: lm_graph(name, x, g).realize(), x_np, reps)
    roof = host_roof(lm_graph(name, x, g))
    print(f"\n{name} {x_np.shape} {x_np.dtype}: {len(sched.kernels)} kernel(s) "
          f"{[k.name for k in sched.kernels]} {form}")  # fmt: skip
    base = res["lazymath"]
    for who, t in res.items():
        gbs = moved / t / 1e9
        extra = f"  {gbs:6.1f} GB/s" + (
            f" = {gbs / copy_gbs[0]:4.0%} of the 1-thread numpy copy, {gbs / copy_gbs[1]:4.0%} "
            "of the 2-thread copy" if who == "lazymath" else "")  # fmt: skip
        print(f"  {who:18s} {t * 1e3:9.3f} ms   {t / base:6.2f}x lazymath's time{extra}")
    f = moved / (2 * x_np.nbytes)  # the copy moves one read + one write
    print(f"  paired with the 1-thread copy (interleaved, median of {reps} ratios): lazymath at "
          f"{f * paired[0]:4.0%} of its bandwidth (quartiles {f * paired[1]:4.0%} .. "
          f"{f * paired[2]:4.0%})")  # fmt: skip
    print(f"  {roof(res['lazymath'])}")


def paired_copy_ratio(fn, x_np: np.ndarray, reps: int) -> tuple[float, float, float]:
    """copy time / fn time for `reps` back-to-back pairs (a 1-thread np.copyto of x_np into a
    preallocated array, then fn): the machine's state drifts by tens of percent within
    minutes on a shared VM, so a ratio of two medians taken apart is not robust; the median of
    paired ratios is. The pairs run back to back, so each run starts from the cache state the
    other left (the copy's 64 MiB output in L3): a different state than the separate medians
    (var, which reads once, measured 91 % paired against 210 % apart in one run): read both.
    Returns (median, lower quartile, upper quartile)."""
    out = np.empty_like(x_np)
    for _ in range(2):
        np.copyto(out, x_np)
        fn()
    settle_compiles()
    ratios = []
    for _ in range(reps):
        t0 = time.perf_counter()
        np.copyto(out, x_np)
        t1 = time.perf_counter()
        fn()
        t2 = time.perf_counter()
        ratios.append((t1 - t0) / (t2 - t1))
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    return statistics.median(ratios), q[0], q[-1]


def copy_bandwidth(x_np: np.ndarray, reps: int) -> tuple[float, float]:
    """GB/s of a numpy copy (one read + one write) on one thread, and on two threads (each
    copies half the rows; np.copyto releases the GIL): the same thread count as lazymath's
    kernels on a 2-core host, so the fair reference for their bandwidth."""
    import threading

    out = np.empty_like(x_np)
    t = median_time(lambda: np.copyto(out, x_np), reps)
    h = x_np.shape[0] // 2

    def copy2():
        th = threading.Thread(target=np.copyto, args=(out[:h], x_np[:h]))
        th.start()
        np.copyto(out[h:], x_np[h:])
        th.join()

    t2 = median_time(copy2, reps)
    gbs, gbs2 = 2 * x_np.nbytes / t / 1e9, 2 * x_np.nbytes / t2 / 1e9
    print(f"\nnumpy copy of {x_np.nbytes >> 20} MiB: {t * 1e3:.3f} ms = {gbs:.1f} GB/s on one "
          f"thread, {t2 * 1e3:.3f} ms = {gbs2:.1f} GB/s on two (one read + one write)")  # fmt: skip
    return gbs, gbs2


def case_single_thread(names, x_np, g_np, reps: int) -> None:
    """Thread CPU time: numpy vs all blocks of the lazymath kernel on this thread."""
    from lazymath.backend import compile_kernel

    print(f"\nsingle thread, CPU time (best / median of {reps}): numpy (out=) vs the lazymath "
          "kernel's blocks run one after another on this thread")  # fmt: skip
    out = np.empty_like(x_np)
    t_copy = _cpu_times(lambda: np.copyto(out, x_np), reps)
    copy_bw = 2 * x_np.nbytes / t_copy[0]
    print(f"  numpy copy   {t_copy[0] * 1e3:8.2f} / {t_copy[1] * 1e3:8.2f} ms "
          f"({copy_bw / 1e9:.1f} GB/s one read + one write, best)")  # fmt: skip
    for name in names:
        x, g = lm.tensor(x_np), lm.tensor(g_np)
        sched = lm.schedule(lm_graph(name, x, g))
        if len(sched.kernels) != 1:
            print(f"  {name}: {len(sched.kernels)} kernels, skipped")
            continue
        k = sched.kernels[0]
        ir = k.group.ir
        ck = compile_kernel(ir, lm.current_device().spec)
        ins = [n.realized for n in k.group.inputs]
        outs = [np.empty(v.shape, v.dtype) for v in ir.outputs]
        argv = ck.make_argv([*ins, *outs])
        t_lm = _cpu_times(lambda ck=ck, argv=argv: ck.run_block(argv, 0, 1), reps)
        t_np = _cpu_times(numpy_fn(name, x_np, g_np), reps)
        moved = x_np.nbytes * (1 if name == "var" else 2)
        print(f"  {name:12s} numpy {t_np[0] * 1e3:8.2f} / {t_np[1] * 1e3:8.2f} ms, "
              f"lazymath {t_lm[0] * 1e3:8.2f} / {t_lm[1] * 1e3:8.2f} ms "
              f"({t_np[0] / t_lm[0]:.2f}x / {t_np[1] / t_lm[1]:.2f}x); lazymath at "
              f"{moved / t_lm[0] / copy_bw:.0%} of the copy's bandwidth")  # fmt: skip


def _cpu_times(fn, reps: int) -> tuple[float, float]:
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.thread_time()
        fn()
        ts.append(time.thread_time() - t0)
    return min(ts), statistics.median(ts)


# ----------------------------------------------------------------------------- matmul + rows


def run_matmul_case(name: str, n: int, reps: int) -> None:
    """sum(A @ B, -1) / softmax(A @ B, -1): lazymath's one kernel (the reduction or the online
    softmax in the matmul epilogue) against the same graph as two kernels (the fusion rule
    off), numpy (matmul and the row op into preallocated out=) and torch eager."""
    from lazymath.fusion import rules

    rng = np.random.default_rng(1)
    a_np = rng.standard_normal((n, n)).astype(np.float32)
    b_np = rng.standard_normal((n, n)).astype(np.float32)
    a, b = lm.tensor(a_np), lm.tensor(b_np)

    def graph():
        p = a @ b
        return lm.sum(p, axis=-1) if name == "mm_rowsum" else lm.softmax(p, axis=-1)

    def lm_time(fused: bool) -> float:
        rules.MATMUL_ROW_REDUCE = rules.MATMUL_SOFTMAX = fused
        try:
            kernels = len(lm.schedule(graph()).kernels)
            graph().realize()
            return median_time(lambda: graph().realize(), reps), kernels
        finally:
            rules.MATMUL_ROW_REDUCE = rules.MATMUL_SOFTMAX = True

    warm_cores()
    res, ks = {}, {}
    res["lazymath fused"], ks["lazymath fused"] = lm_time(True)
    res["lazymath 2 kernels"], ks["lazymath 2 kernels"] = lm_time(False)
    prod = np.empty((n, n), np.float32)
    row = np.empty((n, 1), np.float32)

    def np_fn():
        np.matmul(a_np, b_np, out=prod)
        if name == "mm_rowsum":
            return np.sum(prod, axis=-1, out=row[:, 0])
        np.max(prod, axis=1, keepdims=True, out=row)
        np.subtract(prod, row, out=prod)
        np.exp(prod, out=prod)
        np.sum(prod, axis=1, keepdims=True, out=row)
        return np.divide(prod, row, out=prod)

    res["numpy (out=)"] = median_time(np_fn, reps)
    if torch is not None:
        at, bt = torch.from_numpy(a_np), torch.from_numpy(b_np)
        op = (lambda p: p.sum(-1)) if name == "mm_rowsum" else (lambda p: torch.softmax(p, -1))
        res[f"torch eager {torch.get_num_threads()}t"] = median_time(lambda: op(at @ bt), reps)
    print(f"\n{name} ({n}, {n}) @ ({n}, {n}) float32")
    base = res["lazymath fused"]
    for who, t in res.items():
        k = f" ({ks[who]} kernel{'s' * (ks[who] > 1)})" if who in ks else ""
        print(f"  {who:20s} {t * 1e3:9.3f} ms   {t / base:6.2f}x lazymath's time{k}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--n", type=int, default=4096, help="rows = cols = n")
    ap.add_argument("--cases", type=str, default="softmax,log_softmax,layernorm,var")
    ap.add_argument("--single-thread", action="store_true")
    ap.add_argument("--matmul", type=int, default=0, metavar="N",
                    help="also time sum(A @ B, -1), softmax(A @ B, -1) at N x N x N")  # fmt: skip
    args = ap.parse_args()
    print(f"lazymath {lm.__version__}, numpy {np.__version__}, torch "
          f"{getattr(torch, '__version__', '-')}, jax {getattr(jax, '__version__', '-')}, "
          f"{os.cpu_count()} cores")  # fmt: skip
    if threadpool_info is not None:
        for p in threadpool_info():
            if p.get("internal_api") == "openblas":
                print(f"OpenBLAS {p.get('version')} {p.get('architecture')} "
                      f"{p.get('num_threads')} threads")  # fmt: skip
    print(load_average())
    rng = np.random.default_rng(0)
    x_np = rng.standard_normal((args.n, args.n)).astype(np.float32)
    g_np = rng.standard_normal(args.n).astype(np.float32)
    copy_gbs = copy_bandwidth(x_np, args.reps)
    print(host_roof(lm.tensor(x_np) + 0.0, refresh=True).roofs.describe())
    names = [c for c in args.cases.split(",") if c]
    for name in names:
        run_case(name, x_np, g_np, args.reps, copy_gbs)
    if args.single_thread:
        case_single_thread(names, x_np, g_np, max(5, args.reps // 2))
    if args.matmul:
        for name in ("mm_rowsum", "mm_softmax"):
            run_matmul_case(name, args.matmul, args.reps)
    print("\n" + load_average())


if __name__ == "__main__":
    main()
