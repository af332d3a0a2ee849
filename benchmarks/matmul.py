"""Matmul GFLOPS side by side in one process: numpy (OpenBLAS), torch (if installed), lazymath.

Run with OpenBLAS' environment overrides removed, so numpy gets its best kernel (and numpy writes
into preallocated outputs, `out=`, so it pays no page faults for fresh result arrays):

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/matmul.py [--quick]

lazymath goes through the public API (`lm.tensor`, `(a @ b).realize()`), i.e. the graph, fusion,
the matmul template, the Cube ISA and the LLVM host lowering, with the program cache warm
(steady state). Timings are medians of interleaved repetitions (numpy and lazymath alternate so
machine noise hits both), each segment started after a short pause (see SETTLE_S: OpenBLAS'
spinning idle threads would otherwise steal a core from whatever is timed right after numpy).
numpy float16 matmul has no BLAS kernel and is very slow: it is timed
once, at 1024.

On a shared machine wall-clock ratios move with the load (OpenBLAS' spinning threads suffer more
than lazymath's blocking pool), so the load average is printed with the results, and
`--single-thread` adds a load-robust view: per-thread CPU time of OpenBLAS limited to one thread
against every block of the lazymath kernel run on the calling thread (best and median).

`--breakdown` splits one steady-state `(a @ b).realize()` into its parts (medians, microseconds):
the kernel's blocks run serially (CPU time), the kernel on the block pool alone (wall: through the
native lane, `pool.run_native`, and through the Python queue, `pool.run`), the whole realize
(wall; lane and Python queue) and what the realize adds to the lane launch (capture, signature,
cache lookup, output allocation, commit).
"""

# ruff: noqa: B023  (the lambdas are timed immediately, inside their loop iteration)
from __future__ import annotations

import argparse
import ctypes
import glob
import os
import sys
import time

import numpy as np
from _timing import settle_compiles

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import lazymath as lm  # noqa: E402


def _median_time(fn, reps: int, rounds: int) -> float:
    ts = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        ts.append((time.perf_counter() - t) / reps)
    return sorted(ts)[len(ts) // 2]


# OpenBLAS' idle worker threads busy-wait for ~0.1 s (2^28 TSC ticks) after each call before they
# sleep: a segment timed right after numpy shares a core with a spinning thread and loses ~20-30%
# at 2048 (measured on the quiet machine: 99-110 GFLOPS right after numpy, 130+ after 0.15 s).
# Each timed segment therefore starts after this pause, then untimed warm-up calls for WARM_S
# (at least one): after an idle pause this VM's cores run slow for tens of milliseconds, so one
# warm-up call left the timed calls at 256-1024 on cold cores. Measured on the quiet machine
# (sleep 0.3 s, warm-up, 17 timed realizes at 256 / 2 at 512, medians of 7): lazymath 256 took
# 654-707 us after one warm-up call, 535-697 us after 30 ms, 401-422 us after 0.1 s, 370-419 us
# after 0.3 s (back to back: 376-414 us); numpy 256 took 330 us after one call and 258-275 us
# after 30 ms or more (its spinning threads keep the cores busy); lazymath 512 swung to 4.3-4.9
# ms after 30 ms and settled at 2.25-2.7 ms after 0.1-0.3 s. numpy's back-to-back reps inside
# its segment keep the spinning that helps it.
SETTLE_S = 0.3
WARM_S = 0.2  # `--warm-s`; 0 = the single warm-up call of earlier runs


def _warm(fn) -> None:
    """Untimed calls for WARM_S seconds (at least one) after a settle pause."""
    fn()
    settle_compiles()  # steady state: the optimized code, not the quick first tier
    end = time.perf_counter() + WARM_S
    while time.perf_counter() < end:
        fn()


def _interleaved(fns: dict, reps: int, rounds: int) -> dict:
    """Median seconds per call of each fn, alternating the fns round by round; each segment
    starts SETTLE_S after the previous one ended, after WARM_S of untimed warm-up calls."""
    times: dict = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            time.sleep(SETTLE_S)
            _warm(fn)
            t = time.perf_counter()
            for _ in range(reps):
                fn()
            times[k].append((time.perf_counter() - t) / reps)
    return {k: sorted(v)[len(v) // 2] for k, v in times.items()}


def _jax():
    """jax with float16 matmuls accumulating in float32 (None when not installed)."""
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return None

    mm = jax.jit(lambda x, y: jnp.matmul(x, y, preferred_element_type=jnp.float32))
    comp = jax.jit(lambda x, y: jnp.maximum(jnp.matmul(x, y, preferred_element_type=jnp.float32),
                                            0) * 0.5)  # fmt: skip
    return jax, mm, comp


def _blas() -> str:
    """numpy's BLAS and the kernel it picked (threadpoolctl), if known."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "BLAS: threadpoolctl not installed"
    infos = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    return "BLAS: " + ", ".join(f"{i.get('internal_api')} {i.get('architecture', '?')} "
                                f"{i.get('num_threads')} threads" for i in infos)  # fmt: skip


def _torch():
    try:
        import torch  # noqa: F401

        return torch
    except ImportError:
        return None


def bench_square(sizes, rounds: int) -> None:
    torch = _torch()
    jx = _jax()
    rng = np.random.default_rng(0)
    print(f"{'n':>5} {'dtype':>8} {'numpy f32':>10} {'torch':>8} {'jax':>8} {'lazymath':>9} "
          f"{'lm/np32':>8} {'lm/jax':>7}")  # fmt: skip
    for n in sizes:
        flops = 2.0 * n**3
        reps = max(3, int(0.6e9 / flops))  # >= 3 calls per segment: one call of a 2048^3
        # matmul swung +-5 % between runs on the shared VM
        a32 = rng.random((n, n), dtype=np.float32)
        b32 = rng.random((n, n), dtype=np.float32)
        for dt in ("float32", "float16"):
            a, b = a32.astype(dt), b32.astype(dt)
            ta, tb = lm.tensor(a), lm.tensor(b)
            (ta @ tb).realize()  # compile + warm the caches
            c32 = np.empty((n, n), np.float32)  # numpy at its best: a preallocated output
            fns = {"np": lambda: np.matmul(a32, b32, out=c32), "lm": lambda: (ta @ tb).realize()}
            if torch is not None:
                xa, xb = torch.from_numpy(a32), torch.from_numpy(b32)
                fns["torch"] = lambda: xa @ xb
            if jx is not None:
                ja, jb = jx[0].device_put(a), jx[0].device_put(b)
                jx[1](ja, jb).block_until_ready()
                fns["jax"] = lambda: jx[1](ja, jb).block_until_ready()
            t = _interleaved(fns, reps, rounds)
            g = {k: flops / v / 1e9 for k, v in t.items()}
            tg = f"{g['torch']:8.1f}" if "torch" in g else f"{'-':>8}"
            jg = f"{g['jax']:8.1f}" if "jax" in g else f"{'-':>8}"
            rj = f"{g['lm'] / g['jax']:7.2f}" if "jax" in g else f"{'-':>7}"
            print(f"{n:5d} {dt:>8} {g['np']:10.1f} {tg} {jg} {g['lm']:9.1f} "
                  f"{g['lm'] / g['np']:8.2f} {rj}", flush=True)  # fmt: skip


def bench_bf16(sizes, rounds: int) -> None:
    """bfloat16 A @ B (float32 accumulation, bfloat16 result) against torch's bfloat16 matmul
    (oneDNN: AVX512_BF16 / AMX where the CPU has them) and jax's, interleaved in this process.
    lazymath runs on the ascend910b preset (the 910 has no bfloat16 on its AI Core)."""
    import ml_dtypes

    torch = _torch()
    jx = _jax()
    lm.init_device(0, spec="ascend910b")
    from lazymath.backend.host import gemm_bf16

    path = "vdpbf16ps" if gemm_bf16.bf16_dot_available() else "float32 FMAs on widened panels"
    print(f"bfloat16: lazymath Mmad host mapping = {path}")
    rng = np.random.default_rng(0)
    print(f"{'n':>5} {'dtype':>8} {'torch ms':>9} {'jax ms':>8} {'lm ms':>8} {'torch GF':>9} "
          f"{'lm GF':>8} {'lm/torch':>9} {'lm/jax':>7}")  # fmt: skip
    for n in sizes:
        flops = 2.0 * n**3
        reps = max(3, int(0.6e9 / flops))
        a = (rng.random((n, n), dtype=np.float32) - 0.5).astype(ml_dtypes.bfloat16)
        b = (rng.random((n, n), dtype=np.float32) - 0.5).astype(ml_dtypes.bfloat16)
        ta, tb = lm.asarray(a), lm.asarray(b)
        got = (ta @ tb).numpy()  # compile + warm the caches
        want = (a.astype(np.float32) @ b.astype(np.float32)).astype(ml_dtypes.bfloat16)
        err = float(np.abs(got.astype(np.float32) - want.astype(np.float32)).max())
        fns = {"lm": lambda: (ta @ tb).realize()}
        if torch is not None:
            xa = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
            xb = torch.from_numpy(b.view(np.int16)).view(torch.bfloat16)
            fns["torch"] = lambda: xa @ xb
        if jx is not None:
            jnp = jx[0].numpy
            ja, jb = jx[0].device_put(a), jx[0].device_put(b)
            jmm = jx[0].jit(lambda x, y: jnp.matmul(x, y, preferred_element_type=jnp.float32)
                            .astype(jnp.bfloat16))  # fmt: skip
            jmm(ja, jb).block_until_ready()
            fns["jax"] = lambda: jmm(ja, jb).block_until_ready()
        t = _interleaved(fns, reps, rounds)
        ms = {k: v * 1e3 for k, v in t.items()}
        tt = f"{ms['torch']:9.2f}" if "torch" in ms else f"{'-':>9}"
        jt = f"{ms['jax']:8.2f}" if "jax" in ms else f"{'-':>8}"
        tg = f"{flops / t['torch'] / 1e9:9.1f}" if "torch" in t else f"{'-':>9}"
        rt = f"{t['torch'] / t['lm']:9.2f}" if "torch" in t else f"{'-':>9}"
        rj = f"{t['jax'] / t['lm']:7.2f}" if "jax" in t else f"{'-':>7}"
        print(f"{n:5d} {'bfloat16':>8} {tt} {jt} {ms['lm']:8.2f} {tg} "
              f"{flops / t['lm'] / 1e9:8.1f} {rt} {rj}   (max |lm - ref| {err:.3g})",
              flush=True)  # fmt: skip
    print("lm/torch, lm/jax: the peer's median time over lazymath's (> 1: lazymath faster)")


def bench_numpy_f16(rounds: int) -> None:
    n = 1024
    a = np.random.default_rng(1).random((n, n)).astype(np.float16)
    t = _median_time(lambda: a @ a, 1, max(1, rounds // 3))
    print(f"numpy float16 matmul at {n} (no BLAS kernel, very slow, timed once): "
          f"{2.0 * n**3 / t / 1e9:.2f} GFLOPS")  # fmt: skip


def _openblas_set_threads():
    """numpy's bundled OpenBLAS `set_num_threads` (None when it cannot be found)."""
    libs = glob.glob(os.path.join(os.path.dirname(np.__file__), "..", "numpy.libs", "*openblas*"))
    for path in libs:
        lib = ctypes.CDLL(path)
        for name in ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
                     "openblas_set_num_threads64_", "openblas_set_num_threads"):  # fmt: skip
            fn = getattr(lib, name, None)
            if fn is not None:
                return fn
    return None


def bench_single_thread(sizes, rounds: int) -> None:
    """CPU time on one thread: OpenBLAS with 1 thread vs all blocks of the lazymath kernel."""
    set_threads = _openblas_set_threads()
    if set_threads is None:
        print("single-thread: numpy's OpenBLAS thread control not found, skipped")
        return
    rng = np.random.default_rng(3)
    print(f"single thread, CPU time (best / median of {rounds}), OpenBLAS 1 thread vs lazymath "
          "kernel blocks on one thread:")  # fmt: skip
    print(f"{'n':>5} {'dtype':>8} {'numpy 1t':>15} {'lazymath 1t':>15} {'ratio':>11}")
    set_threads(1)
    try:
        for n in sizes:
            a32 = rng.random((n, n), dtype=np.float32)
            b32 = rng.random((n, n), dtype=np.float32)
            flops = 2.0 * n**3
            for dt in ("float32", "float16"):
                k = _matmul_kernel(n, dt)
                a, b = a32.astype(dt), b32.astype(dt)
                c = np.empty((n, n), np.float32)
                argv = k.make_argv([a.reshape(-1), b.reshape(-1), c.reshape(-1)])

                settle_compiles()

                def lm_run():
                    for i in range(k.blocks):
                        k.run_block(argv, i, k.blocks)

                ts: dict = {"np": [], "lm": []}
                for _ in range(rounds):
                    for key, fn in (("np", lambda: a32 @ b32), ("lm", lm_run)):
                        t = time.thread_time()
                        fn()
                        ts[key].append(time.thread_time() - t)
                best = {key: flops / min(v) / 1e9 for key, v in ts.items()}
                med = {key: flops / sorted(v)[len(v) // 2] / 1e9 for key, v in ts.items()}
                print(f"{n:5d} {dt:>8} {best['np']:6.1f} / {med['np']:6.1f} "
                      f"{best['lm']:6.1f} / {med['lm']:6.1f} {best['lm'] / best['np']:5.2f} / "
                      f"{med['lm'] / med['np']:4.2f}", flush=True)  # fmt: skip
    finally:
        set_threads(os.cpu_count() or 1)


def _matmul_kernel(n: int, dt: str):
    """The compiled square matmul kernel the realize path uses, and its argv over fresh arrays."""
    from lazymath.backend.compile import compile_kernel
    from lazymath.backend.npu.kernel_ir import ArgView, MatmulKernel, SOp
    from lazymath.runtime.device import get_spec

    v = ArgView(dt, (n, n), (n, 1))
    out = ArgView("float32", (n, n), (n, 1))
    ir = MatmulKernel((), n, n, n, v, v, None, None, dt, (), (SOp("acc", "float32"),), (0,),
                      (out,))  # fmt: skip
    return compile_kernel(ir, get_spec("ascend910"))


def bench_breakdown(sizes, rounds: int) -> None:
    """Where one realize's time goes (see the module docstring)."""
    from lazymath import _threads

    pool = _threads.block_pool()
    print(f"breakdown, medians of {rounds} x reps, us: serial = all blocks on one thread (CPU), "
          "lane / queue = the kernel on the block pool through the native lane / the Python "
          "queue (wall), realize = (a @ b).realize() (wall) with the lane / the queue, "
          "added = realize - lane")  # fmt: skip
    print(f"{'n':>5} {'dtype':>8} {'blocks':>6} {'numpy':>8} {'serial':>8} {'lane':>8} "
          f"{'queue':>8} {'realize':>8} {'r-queue':>8} {'added':>6}")  # fmt: skip
    rng = np.random.default_rng(4)
    for n in sizes:
        a32 = rng.random((n, n), dtype=np.float32)
        b32 = rng.random((n, n), dtype=np.float32)
        reps = max(2, int(0.3e9 / (2.0 * n**3)))
        for dt in ("float32", "float16"):
            a, b = a32.astype(dt), b32.astype(dt)
            k = _matmul_kernel(n, dt)
            c = np.empty((n, n), np.float32)
            argv = k.make_argv([a.reshape(-1), b.reshape(-1), c.reshape(-1)])
            ta, tb = lm.tensor(a), lm.tensor(b)
            (ta @ tb).realize()

            def serial():
                for i in range(k.blocks):
                    k.run_block(argv, i, k.blocks)

            def lane(flag: bool, fn):
                def run():
                    _threads.LANE = flag
                    fn()

                return run

            walls = {"numpy": lambda: a32 @ b32,
                     "lane": lane(True, lambda: pool.run_native(k._cfunc, argv, k.blocks)),
                     "queue": lane(False, lambda: pool.run(k.run_block, argv, k.blocks)),
                     "realize": lane(True, lambda: (ta @ tb).realize()),
                     "r-queue": lane(False, lambda: (ta @ tb).realize())}  # fmt: skip
            res: dict = {key: [] for key in ("serial", *walls)}
            try:
                for _ in range(rounds):
                    t = time.thread_time()
                    for _ in range(reps):
                        serial()
                    res["serial"].append((time.thread_time() - t) / reps)
                    for key, fn in walls.items():
                        time.sleep(SETTLE_S)
                        _warm(fn)
                        t = time.perf_counter()
                        for _ in range(reps):
                            fn()
                        res[key].append((time.perf_counter() - t) / reps)
            finally:
                _threads.LANE = True
            med = {key: sorted(v)[len(v) // 2] * 1e6 for key, v in res.items()}
            print(f"{n:5d} {dt:>8} {k.blocks:6d} {med['numpy']:8.0f} {med['serial']:8.0f} "
                  f"{med['lane']:8.0f} {med['queue']:8.0f} {med['realize']:8.0f} "
                  f"{med['r-queue']:8.0f} {med['realize'] - med['lane']:6.0f}",
                  flush=True)  # fmt: skip


def _load() -> str:
    try:
        return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "load average unknown"


def bench_composite(rounds: int, n: int = 2048) -> None:
    """relu(A @ B) * scale: one fused Cube kernel vs numpy's three steps."""
    rng = np.random.default_rng(2)
    a32 = rng.random((n, n), dtype=np.float32) - 0.5
    b32 = rng.random((n, n), dtype=np.float32) - 0.5
    flops = 2.0 * n**3
    reps = max(3, int(0.6e9 / flops))  # >= 3 calls per segment (see bench_square)

    t32 = np.empty((n, n), np.float32)

    def np3():  # numpy at its best: three steps in one preallocated buffer
        np.matmul(a32, b32, out=t32)
        np.maximum(t32, 0, out=t32)
        return np.multiply(t32, np.float32(0.5), out=t32)

    jx = _jax()
    for dt in ("float16", "float32"):
        ta, tb = lm.tensor(a32.astype(dt)), lm.tensor(b32.astype(dt))
        (lm.relu(ta @ tb) * 0.5).realize()
        fns = {"np": np3, "lm": lambda: (lm.relu(ta @ tb) * 0.5).realize()}
        if jx is not None:
            ja, jb = jx[0].device_put(a32.astype(dt)), jx[0].device_put(b32.astype(dt))
            jx[2](ja, jb).block_until_ready()
            fns["jax"] = lambda: jx[2](ja, jb).block_until_ready()
        t = _interleaved(fns, reps, rounds)
        jt = (f", jax jit {dt} {t['jax'] * 1e3:.1f} ms -> lm/jax speedup "
              f"{t['jax'] / t['lm']:.2f}x") if "jax" in t else ""  # fmt: skip
        print(f"relu(A@B)*0.5 {n} {dt}: lazymath {t['lm'] * 1e3:.1f} ms "
              f"({flops / t['lm'] / 1e9:.1f} GFLOPS), numpy float32 three-step "
              f"{t['np'] * 1e3:.1f} ms -> speedup {t['np'] / t['lm']:.2f}x{jt}",
              flush=True)  # fmt: skip


def main() -> None:
    global WARM_S
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer rounds, sizes up to 2048")
    ap.add_argument("--sizes", type=str, default="")
    ap.add_argument(
        "--warm-s",
        type=float,
        default=WARM_S,
        help=f"untimed warm-up seconds after each settle pause (default {WARM_S}; 0 = one call)",
    )
    ap.add_argument(
        "--breakdown",
        action="store_true",
        help="only split one realize into kernel, dispatch and overhead times (sizes <= 1024)",
    )
    ap.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="bfloat16: only the bfloat16 comparison against torch/jax (ascend910b preset)",
    )
    ap.add_argument(
        "--single-thread",
        action="store_true",
        help="also compare single-thread CPU time (robust on a shared machine)",
    )
    args = ap.parse_args()
    WARM_S = args.warm_s
    rounds = 3 if args.quick else 7
    sizes = [256, 512, 1024, 2048] if args.quick else [256, 512, 1024, 2048, 4096]
    if args.sizes:
        sizes = [int(s) for s in args.sizes.split(",")]
    print(f"threads: {os.cpu_count()} host cores; rounds={rounds} (medians); warm-up "
          f"{WARM_S * 1e3:.0f} ms per segment; torch: {'yes' if _torch() else 'not installed'}; "
          f"{_load()}")  # fmt: skip
    from lazymath.backend.native import host

    print(f"{_blas()}; jax: {'yes' if _jax() else 'not installed'}")
    print(host.describe())
    if args.breakdown:
        bench_breakdown([n for n in sizes if n <= 1024], rounds)
        print(_load())
        return
    if args.dtype == "bfloat16":
        bench_bf16(sizes, rounds)
        print(_load())
        return
    bench_square(sizes, rounds)
    bench_numpy_f16(rounds)
    bench_composite(rounds)
    if args.single_thread:
        bench_single_thread(sizes, rounds)
    print(_load())


if __name__ == "__main__":
    main()
