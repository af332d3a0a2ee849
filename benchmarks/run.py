"""One benchmark run, every case side by side with the installed peers, in one process.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python -m benchmarks          # from the checkout
    python benchmarks/run.py --quick                   # CI smoke: tiny sizes, few repetitions
    python benchmarks/run.py --only matmul             # one suite (matmul, elementwise, softmax)
    python benchmarks/plot.py                          # PNGs from the results (matplotlib)

Peers: numpy always (at its best: preallocated `out=`), numexpr, torch and jax when installed
(`--peers numpy,torch` picks). Each case times every peer in alternating segments of back-to-back
calls, each after a short pause (so machine noise hits all of them alike, and no peer is timed
while another's BLAS threads still spin), prints progress on stderr, and the run ends with one
table: median time per peer,
throughput (GFLOPS for matmul, GB/s for the memory-bound cases) and the ratio peer / lazymath
(> 1: lazymath is faster). `benchmarks/results.json` (or `--out`) keeps the table with the
machine (CPU model, host ISA, cores, numpy's BLAS from threadpoolctl), the versions, the load
average before and after and the command. Machines here are shared: trust ratios over absolute
times, and rerun when the load is high. Timings are never asserted anywhere; the per-topic
scripts beside this one (matmul.py, elementwise.py, rows.py, overhead.py, ...) go deeper.
"""

# ruff: noqa: B023  (the lambdas are timed immediately, inside their loop iteration)
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))  # run from a checkout
import lazymath as lm  # noqa: E402

SUITES = ("matmul", "elementwise", "softmax")
OPT_IN = ("torch_backend", "attention")  # minutes of compiles / seconds per call: only with --only
FULL = {
    "matmul": [64, 128, 256, 512, 1024],
    "elementwise": [1 << 12, 1 << 16, 1 << 20, 1 << 22],
    "softmax": [(64, 256), (256, 1024), (1024, 4096)],
}
QUICK = {"matmul": [32, 64], "elementwise": [1 << 10, 1 << 14], "softmax": [(16, 64)]}
FULL["torch_backend"] = [(m, d) for d in ("float32", "float16") for m in ("fwd", "fwd+bwd")]
QUICK["torch_backend"] = [("fwd", "float32")]
FULL["attention"] = [(4, 12, 2048, 64, d) for d in ("float32", "bfloat16")]
QUICK["attention"] = [(1, 2, 64, 64, "float32")]


# ----------------------------------------------------------------------------- peers


def available_peers(wanted: set[str] | None = None) -> dict[str, object]:
    """name -> module of every peer (of `wanted`, default all) that imports (numpy always)."""
    peers: dict[str, object] = {"numpy": np}
    for name in ("numexpr", "torch", "jax"):
        if wanted is not None and name not in wanted:
            continue
        try:
            peers[name] = __import__(name)
        except Exception:  # noqa: BLE001 - a peer that does not import is absent
            continue
    if "jax" in peers:
        import jax

        jax.config.update("jax_platforms", "cpu")
    return peers


def _torch_threads(torch) -> None:
    torch.set_num_threads(os.cpu_count() or 1)


# ----------------------------------------------------------------------------- timing


# OpenBLAS' idle worker threads spin ~0.13 s (2^28 TSC ticks) after each call before they sleep
# (torch's and XLA's pools spin briefly too): a peer timed right after numpy shares a core with
# that spinning thread. Measured on the 2-core machine (issue 11's note): lazymath 1024^3 ran at
# 94 GFLOPS one call after numpy and 185 back to back (numpy 180); timing one call of each peer
# in turn had made it look 0.68x numpy. So each peer is timed in its own segment of back-to-back
# calls that starts SETTLE_S after the previous segment; two rounds of segments alternate the
# peers (machine noise still hits all of them).
SETTLE_S = 0.15
ROUNDS = 2
# After the pause the segment's untimed calls run for at least WARM_S (and `warmup` calls): a
# vCPU that idled through the pause runs slow for tens of milliseconds, and two 15 ms calls did
# not cover that (quiet machine: lazymath 1024^3 read 127-145 GFLOPS here against 173 in
# benchmarks/matmul.py, which warms each segment for 0.2 s). `--quick` has no pause and no WARM_S.
WARM_S = 0.2


def _interleaved(fns: dict[str, object], reps: int, warmup: int = 2,
                 settle: float = SETTLE_S) -> dict[str, float]:  # fmt: skip
    """Median seconds per callable over ROUNDS rounds of per-peer segments (see SETTLE_S):
    each segment is a pause of `settle` seconds, untimed calls (`warmup`, and for WARM_S when
    it paused), then its share of `reps` individually timed calls."""
    for fn in fns.values():
        fn()
    _settle_compiles()
    times: dict[str, list[float]] = {k: [] for k in fns}
    per = max(1, -(-reps // ROUNDS))
    for _ in range(ROUNDS):
        for k, fn in fns.items():
            time.sleep(settle)
            end = time.perf_counter() + (WARM_S if settle else 0.0)
            for _ in range(warmup):
                fn()
            while time.perf_counter() < end:
                fn()
            for _ in range(per):
                t0 = time.perf_counter()
                fn()
                times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def _settle_compiles() -> None:
    """Wait for lazymath's background tier-ups (a new kernel starts on quickly compiled code and
    its optimized code replaces it when ready): steady state means the optimized code. Without
    this wait the 1024^3 matmul, compiled just before its timing, ran partly on tier-0 code."""
    compile_ = sys.modules.get("lazymath.backend.compile")
    if compile_ is not None:
        compile_.wait_tiering(60.0)


def _reps(seconds_hint: float, quick: bool) -> int:
    if quick:
        return 3
    return int(min(50, max(5, 0.5 / max(seconds_hint, 1e-6))))


def _probe(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# ----------------------------------------------------------------------------- cases


def case_matmul(n: int, peers: dict, quick: bool) -> dict:
    """C = A @ B, float32 n x n: GFLOPS = 2 n^3 / time."""
    rng = np.random.default_rng(n)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    out = np.empty((n, n), np.float32)
    la, lb = lm.tensor(a), lm.tensor(b)
    fns = {"lazymath": lambda: (la @ lb).realize(), "numpy": lambda: np.matmul(a, b, out=out)}
    if "torch" in peers:
        torch = peers["torch"]
        ta, tb, tout = torch.from_numpy(a), torch.from_numpy(b), torch.from_numpy(out.copy())
        fns["torch"] = lambda: torch.matmul(ta, tb, out=tout)
    if "jax" in peers:
        import jax
        import jax.numpy as jnp

        ja, jb = jnp.asarray(a), jnp.asarray(b)
        f = jax.jit(jnp.matmul)
        fns["jax"] = lambda: f(ja, jb).block_until_ready()
    got = (la @ lb).numpy()
    np.testing.assert_allclose(got, a @ b, rtol=1e-3, atol=1e-3 * n)
    t = _interleaved(fns, _reps(_probe(fns["lazymath"]), quick), settle=0.0 if quick else SETTLE_S)
    return {"suite": "matmul", "case": f"{n}x{n}x{n} float32", "size": n,
            "unit": "GFLOPS", "work": 2.0 * n**3, "seconds": t}  # fmt: skip


def case_elementwise(n: int, peers: dict, quick: bool) -> dict:
    """y = exp(x) * 2 + 1, float32: GB/s = bytes read + written / time."""
    x = np.random.default_rng(n).standard_normal(n, dtype=np.float32)
    out = np.empty_like(x)
    lx = lm.tensor(x)

    def numpy_best():
        np.exp(x, out=out)
        np.multiply(out, 2, out=out)
        np.add(out, 1, out=out)

    fns = {"lazymath": lambda: (lm.exp(lx) * 2 + 1).realize(), "numpy": numpy_best}
    if "numexpr" in peers:
        ne = peers["numexpr"]
        # local_dict: numexpr otherwise looks `x` up in its caller's frame (the timing loop's)
        fns["numexpr"] = lambda: ne.evaluate("exp(x) * 2 + 1", local_dict={"x": x}, out=out)
    if "torch" in peers:
        torch = peers["torch"]
        tx, tout = torch.from_numpy(x), torch.from_numpy(out.copy())
        fns["torch"] = lambda: torch.add(torch.mul(torch.exp(tx), 2), 1, out=tout)
    if "jax" in peers:
        import jax
        import jax.numpy as jnp

        jx = jnp.asarray(x)
        f = jax.jit(lambda v: jnp.exp(v) * 2 + 1)
        fns["jax"] = lambda: f(jx).block_until_ready()
    np.testing.assert_allclose((lm.exp(lx) * 2 + 1).numpy(), np.exp(x) * 2 + 1, rtol=1e-5)
    t = _interleaved(fns, _reps(_probe(fns["lazymath"]), quick), settle=0.0 if quick else SETTLE_S)
    return {"suite": "elementwise", "case": f"exp(x)*2+1, {n} float32", "size": n,
            "unit": "GB/s", "work": 8.0 * n, "seconds": t}  # fmt: skip


def case_softmax(shape: tuple[int, int], peers: dict, quick: bool) -> dict:
    """Row softmax, float32: GB/s = bytes read + written once / time."""
    rows, cols = shape
    x = np.random.default_rng(rows).standard_normal(shape, dtype=np.float32)
    out = np.empty_like(x)
    m = np.empty((rows, 1), np.float32)
    lx = lm.tensor(x)

    def numpy_best():
        np.max(x, axis=1, keepdims=True, out=m)
        np.subtract(x, m, out=out)
        np.exp(out, out=out)
        np.sum(out, axis=1, keepdims=True, out=m)
        np.divide(out, m, out=out)

    fns = {"lazymath": lambda: lm.softmax(lx, axis=1).realize(), "numpy": numpy_best}
    if "torch" in peers:
        torch = peers["torch"]
        tx, tout = torch.from_numpy(x), torch.from_numpy(out.copy())
        fns["torch"] = lambda: torch.softmax(tx, dim=1, out=tout)
    if "jax" in peers:
        import jax
        import jax.numpy as jnp

        jx = jnp.asarray(x)
        f = jax.jit(lambda v: jax.nn.softmax(v, axis=1))
        fns["jax"] = lambda: f(jx).block_until_ready()
    e = np.exp(x - x.max(axis=1, keepdims=True))
    want = e / e.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(lm.softmax(lx, axis=1).numpy(), want, rtol=1e-5, atol=1e-7)
    t = _interleaved(fns, _reps(_probe(fns["lazymath"]), quick), settle=0.0 if quick else SETTLE_S)
    return {"suite": "softmax", "case": f"softmax rows {rows}x{cols} float32", "size": rows * cols,
            "unit": "GB/s", "work": 8.0 * rows * cols, "seconds": t}  # fmt: skip


def case_torch_backend(case: tuple[str, str], peers: dict, quick: bool) -> dict:
    """benchmarks/torch_backend.py's GPT block (batch 4, seq 512, d 768; tiny with --quick)
    through torch.compile: steady-state medians of lazymath, torch eager and Inductor, GFLOPS
    from the block's matmul FLOPs (backward counted as twice the forward). Cold compile and
    peak memory are in that script's own table (`python benchmarks/torch_backend.py`)."""
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    import torch_backend as tb

    mode, dtype = case
    batch, seq, d, heads = (1, 8, 32, 2) if quick else (4, 512, 768, 12)
    r = tb.bench(getattr(tb.torch, dtype), mode, batch, seq, d, heads, reps=1 if quick else 6,
                 peers=tb.PEERS, peak=False)  # fmt: skip
    fwd = 2.0 * batch * seq * 12 * d * d + 4.0 * batch * seq * seq * d
    return {"suite": "torch_backend", "case": f"gpt block {mode} {dtype}", "size": batch * seq,
            "unit": "GFLOPS", "work": fwd * (3 if mode == "fwd+bwd" else 1),
            "seconds": r["steady"]}  # fmt: skip


def case_attention(case: tuple[int, int, int, int, str], peers: dict, quick: bool) -> dict:
    """Causal scaled-dot-product attention (B, H, T, D, dtype): lazymath's lm.nn version vs
    torch F.scaled_dot_product_attention and jax.nn.dot_product_attention under jax.jit
    (numpy has no attention: it is not a peer here). float32 runs on the coupled ascend910
    preset (the fused attention kernel), bfloat16 on ascend910b (the 910 has no bf16); the
    caller's device is restored after. GFLOPS count the causal half of 4 B H T^2 D.
    benchmarks/attention.py prints the kernels and the errors."""
    b, h, t, d, dtype = case
    rng = np.random.default_rng(t)
    q, k, v = (rng.standard_normal((b, h, t, d), dtype=np.float32) for _ in range(3))
    prev = lm.current_device()
    lm.init_device(spec="ascend910" if dtype == "float32" else "ascend910b")
    try:
        ldt = np.float32 if dtype == "float32" else lm.bfloat16
        lq, lk, lv = (lm.tensor(a).astype(ldt).realize() for a in (q, k, v))
        sdpa = lm.nn.scaled_dot_product_attention
        fns = {"lazymath": lambda: sdpa(lq, lk, lv, is_causal=True).realize()}
        got = sdpa(lq, lk, lv, is_causal=True).astype(np.float32).numpy()
        if "torch" in peers:
            torch = peers["torch"]
            tdt = getattr(torch, dtype)
            tq, tk, tv = (torch.from_numpy(a).to(tdt) for a in (q, k, v))
            tsdpa = torch.nn.functional.scaled_dot_product_attention
            fns["torch"] = lambda: tsdpa(tq, tk, tv, is_causal=True)
            want = tsdpa(tq, tk, tv, is_causal=True).float().numpy()
            tol = 1e-4 if dtype == "float32" else 2e-2
            np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
        if "jax" in peers:
            import jax
            import jax.numpy as jnp

            jq, jk, jv = (jnp.asarray(a.transpose(0, 2, 1, 3), dtype=getattr(jnp, dtype))
                          for a in (q, k, v))  # fmt: skip
            f = jax.jit(lambda x, y, z: jax.nn.dot_product_attention(x, y, z, is_causal=True))
            fns["jax"] = lambda: f(jq, jk, jv).block_until_ready()
        reps = _reps(_probe(fns["lazymath"]), quick)
        secs = _interleaved(fns, reps, settle=0.0 if quick else SETTLE_S)
    finally:
        from lazymath.runtime.api import set_device

        set_device(prev)
    return {"suite": "attention", "case": f"causal sdpa {b}x{h}x{t}x{d} {dtype}",
            "size": b * h * t, "unit": "GFLOPS", "work": 2.0 * b * h * t * t * d,
            "seconds": secs}  # fmt: skip


CASES = {"matmul": case_matmul, "elementwise": case_elementwise, "softmax": case_softmax,
         "torch_backend": case_torch_backend, "attention": case_attention}  # fmt: skip


# ----------------------------------------------------------------------------- machine


def machine() -> dict:
    """CPU model, host ISA (lazymath's host target), cores, numpy's BLAS, versions, load."""
    info: dict = {"platform": platform.platform(), "python": platform.python_version(),
                  "cores": os.cpu_count()}  # fmt: skip
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        info["cpu"] = platform.processor() or platform.machine()
    try:
        from lazymath.backend.native import host

        info["host_target"] = host.describe().splitlines()[0]
    except Exception as e:  # noqa: BLE001
        info["host_target"] = f"unknown ({e})"
    try:
        from threadpoolctl import threadpool_info

        info["blas"] = [{k: d.get(k) for k in ("internal_api", "version", "architecture",
                                                "num_threads")}
                        for d in threadpool_info() if d.get("user_api") == "blas"]  # fmt: skip
    except ImportError:
        info["blas"] = "threadpoolctl not installed"
    versions = {"lazymath": lm.__version__, "numpy": np.__version__}
    for name in ("llvmlite", "numexpr", "torch", "jax", "matplotlib"):
        try:
            from importlib import metadata

            versions[name] = metadata.version(name)
        except Exception:  # noqa: BLE001
            pass
    info["versions"] = versions
    return info


def load() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


# ----------------------------------------------------------------------------- table


def rows_of(result: dict) -> list[dict]:
    """One row per peer of a case: median, throughput, ratio peer / lazymath."""
    t = result["seconds"]
    base = t["lazymath"]
    scale = 1e9
    out = []
    for peer, s in t.items():
        out.append({"peer": peer, "median_ms": s * 1e3, "throughput": result["work"] / s / scale,
                    "ratio": s / base if base > 0 else float("nan")})  # fmt: skip
    return out


def table(results: list[dict]) -> str:
    lines = [f"{'case':36} {'peer':9} {'median ms':>10} {'throughput':>14} {'peer/lm':>8}"]
    lines.append("-" * len(lines[0]))
    for r in results:
        for i, row in enumerate(rows_of(r)):
            name = r["case"] if i == 0 else ""
            ratio = "-" if row["peer"] == "lazymath" else f"{row['ratio']:.2f}"
            lines.append(f"{name:36} {row['peer']:9} {row['median_ms']:>10.4f} "
                         f"{row['throughput']:>9.2f} {r['unit']:>4} {ratio:>8}")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes, 3 repetitions (CI smoke)")
    ap.add_argument("--only", default="", help=f"comma-separated suites of "
                    f"{', '.join(SUITES + OPT_IN)} (default: {', '.join(SUITES)})")  # fmt: skip
    ap.add_argument("--peers", default="", help="comma-separated peers (default: all installed)")
    ap.add_argument("--out", default=os.path.join(HERE, "results.json"),
                    help="results file (default benchmarks/results.json)")  # fmt: skip
    args = ap.parse_args(argv)
    suites = [s for s in args.only.split(",") if s] or list(SUITES)
    unknown = sorted(set(suites) - set(SUITES + OPT_IN))
    if unknown:
        ap.error(f"unknown suite(s) {', '.join(unknown)}; known: {', '.join(SUITES + OPT_IN)}")
    peers = available_peers(set(args.peers.split(",")) if args.peers else None)
    if "torch" in peers:
        _torch_threads(peers["torch"])
    sizes = QUICK if args.quick else FULL
    before = load()
    results = []
    plan = [(s, n) for s in suites for n in sizes[s]]
    for i, (suite, n) in enumerate(plan, 1):
        print(f"[{i}/{len(plan)}] {suite} {n} ...", file=sys.stderr, flush=True)
        results.append(CASES[suite](n, peers, args.quick))
    after = load()
    text = table(results)
    print(text)
    print(f"peers: {', '.join(['lazymath', *peers])}; load average before {before}, after "
          f"{after}; peer/lm > 1 means lazymath is faster")  # fmt: skip
    doc = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "command": " ".join(
            [os.path.basename(sys.executable), "-m", "benchmarks", *(argv or sys.argv[1:])]
        ),
        "quick": args.quick,
        "machine": machine(),
        "load_before": before,
        "load_after": after,
        "results": [{**r, "rows": rows_of(r)} for r in results],
    }
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1, default=str)
        print(f"results written to {args.out}", file=sys.stderr)
    return doc


if __name__ == "__main__":
    main()
