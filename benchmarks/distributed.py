"""Sharded on a 2-worker Dask LocalCluster vs one process: throughput of the same lazy graphs.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/distributed.py [--reps 5]

Workloads (inputs written once to .npy files; both sides hold them in memory before timing):
  matmul    relu(A_i @ B) * 0.5 over 16 row blocks of 2048 x 2048 float16 (A is 32768 x 2048)
  fft-sub   the elementwise stand-in for a batched 64 x 1024 x 4096 FFT (lazymath's FFT is an
            AI CPU numpy path today): sin(x) * cos(x) + x in float16, sharded over the batch
Single process: one realize of the whole graph (lazymath's best: one kernel over all rows).
Sharded: 16 shards on 2 single-threaded worker processes, results left on the workers (what
`ld.compute` does; the gather to the client is timed separately). Medians of --reps runs after
one warm-up run; the timed runs must compile nothing (worker_stats deltas are printed). The
simulated strong/weak scaling table for 8/64/1024 NPUs follows.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time

# this script is named like the `distributed` package: keep its directory off the import path
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import numpy as np  # noqa: E402

import lazymath as lm  # noqa: E402
import lazymath.distributed as ld  # noqa: E402


def _median_time(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _stats(client) -> dict:
    return {s["worker"]: s for s in ld.worker_stats(client)}


def run(name, graph, arrays, paths, client, reps, shards, check):
    """graph(*tensors) -> tensor; arrays for the single process, paths for the shards (first
    argument sharded, the rest replicated)."""
    # single process
    ts = [lm.tensor(a) for a in arrays]
    graph(*ts).numpy()  # warm-up: compile

    def single():
        graph(*ts).realize()

    t_single = _median_time(single, reps)
    # sharded: the first input persisted on the workers, the others replicated
    src = ld.compute(ld.shard(paths[0], n=shards), client=client)
    rest = [lm.tensor(a) for a in arrays[1:]]
    warm = ld.compute(graph(src, *rest), client=client)
    before = _stats(client)

    def sharded():
        ld.compute(graph(src, *rest), client=client)

    t_sharded = _median_time(sharded, reps)
    after = _stats(client)
    t0 = time.perf_counter()
    got = warm.numpy()
    t_gather = time.perf_counter() - t0
    ok = check(got)
    compiled = sum(after[w]["compiled"] - before[w]["compiled"] for w in after)
    built = sum(after[w]["programs_built"] - before[w]["programs_built"] for w in after)
    hits = sum(after[w]["program_hits"] - before[w]["program_hits"] for w in after)
    print(f"{name}: single process {t_single * 1e3:.1f} ms, sharded {t_sharded * 1e3:.1f} ms "
          f"-> throughput ratio sharded/single {t_single / t_sharded:.2f}x; gather of the result "
          f"{t_gather * 1e3:.0f} ms; timed runs: {compiled} kernels compiled, {built} programs "
          f"built, {hits} program-cache hits; result {'OK' if ok else 'MISMATCH'}")  # fmt: skip
    return t_single / t_sharded, ok, compiled + built


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--shards", type=int, default=16)
    ap.add_argument("--no-table", action="store_true")
    args = ap.parse_args()
    from distributed import Client, LocalCluster

    print(f"host: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                           dashboard_address=None, silence_logs=logging.ERROR)  # fmt: skip
    client = Client(cluster)
    rng = np.random.default_rng(0)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        a = (rng.standard_normal((16 * 2048, 2048)) * 0.05).astype(np.float16)
        b = (rng.standard_normal((2048, 2048)) * 0.05).astype(np.float16)
        pa = os.path.join(tmp, "a.npy")
        np.save(pa, a)
        want = None

        def check_mm(got):
            nonlocal want
            if want is None:
                want = lm.mul(lm.relu(lm.tensor(a) @ lm.tensor(b)), 0.5).numpy()
            return np.allclose(got.astype(np.float32), want.astype(np.float32), atol=2e-2)

        results.append(run("matmul relu(A_i @ B)*0.5, 16 x 2048x2048 f16",
                           lambda x, y: lm.relu(x @ y) * 0.5, [a, b], [pa], client, args.reps,
                           args.shards, check_mm))  # fmt: skip
        x = rng.standard_normal((64, 1024, 4096), dtype=np.float32).astype(np.float16)
        px = os.path.join(tmp, "x.npy")
        np.save(px, x)

        def check_fft(got):
            sl = slice(0, 2)  # spot check two batches against numpy
            xs = x[sl].astype(np.float32)
            w = (np.sin(xs) * np.cos(xs) + xs).astype(np.float16)
            return np.allclose(got[sl].astype(np.float32), w.astype(np.float32), atol=2e-2)

        results.append(run("batched 64x1024x4096 FFT stand-in sin*cos+x f16",
                           lambda t: lm.sin(t) * lm.cos(t) + t, [x], [px], client, args.reps,
                           args.shards, check_fft))  # fmt: skip
    client.close()
    cluster.close()
    worst = min(r[0] for r in results)
    print(f"target: sharded >= 0.8x single-process throughput: worst {worst:.2f}x "
          f"{'MET' if worst >= 0.8 else 'NOT MET'}; second run compiled "
          f"{'nothing' if all(r[2] == 0 for r in results) else 'something'}")  # fmt: skip
    if not args.no_table:
        print("\nsimulated scaling (ascend910 per device, HCCS/RoCE links):")
        print(ld.scaling_table())


if __name__ == "__main__":
    main()
