"""FFT side by side in one process: numpy.fft (with out=), scipy.fft (workers=1 and 2), torch.fft,
JAX (jit), lazymath (Cube plans, see lazymath/graph/dft.py). Medians and ratios to numpy.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/fft.py [--quick]

Workloads (issue 14): fft of 1024 x 4096 complex64; fft of one 4096-point complex64 vector
(a cached realize end to end); rfft of 1M float32; rfft of 1024 x 4096 float32 (the packed
form); irfft to 1M float32; fft of 64 x 4099 complex64 (a prime length). `--only w1,w2` runs
the workloads whose label holds one of the words. lazymath goes through the public API
(`lm.fft.fft(t).realize()`: graph capture, program-cache hit, the kernels), steady state. Peers
missing from the environment are skipped. The load average is printed: the machine is shared.
"""

# ruff: noqa: B023  (the lambdas are timed immediately, inside their loop iteration)
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from _timing import median_time  # noqa: E402

import lazymath as lm  # noqa: E402


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        return "?"


def _peers():
    out = {}
    try:
        import scipy.fft as sfft

        out["scipy"] = sfft
    except ImportError:
        pass
    try:
        import torch

        torch.set_num_threads(2)
        out["torch"] = torch
    except ImportError:
        pass
    try:
        import jax

        jax.config.update("jax_enable_x64", False)
        out["jax"] = jax
    except ImportError:
        pass
    return out


ONLY: list[str] = []  # --only


def bench(label, kind, x, reps, peers):
    if ONLY and not any(w in label for w in ONLY):
        return
    rows = []
    npf = getattr(np.fft, kind)
    out = np.empty(npf(x).shape, npf(x).dtype)
    rows.append(("numpy (out=)", median_time(lambda: npf(x, out=out), reps)))
    if "scipy" in peers:
        sf = getattr(peers["scipy"], kind)
        for w in (1, 2):
            rows.append((f"scipy.fft workers={w}", median_time(lambda: sf(x, workers=w), reps)))
    if "torch" in peers:
        torch = peers["torch"]
        tx = torch.from_numpy(x)
        tf = getattr(torch.fft, kind)
        rows.append(("torch.fft", median_time(lambda: tf(tx), reps)))
    if "jax" in peers:
        jax = peers["jax"]
        jf = jax.jit(getattr(jax.numpy.fft, kind))
        jx = jax.device_put(x)
        rows.append(("jax jit", median_time(lambda: jf(jx).block_until_ready(), reps)))
    t = lm.tensor(x)
    lf = getattr(lm.fft, kind)
    want = npf(x)
    got = lf(t).numpy()
    err = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))
    rows.append(("lazymath", median_time(lambda: lf(t).realize(), reps, warmup=3)))
    base = rows[0][1]
    print(f"\n{label}  (lazymath max rel. error vs numpy {err:.1e})")
    for name, s in rows:
        print(f"  {name:24s} {s * 1e3:10.3f} ms   {s / base:6.2f}x numpy")
    s = lm.schedule(lf(t))
    print("  lazymath kernels: " + ", ".join(f"{k.unit}" for k in s.kernels))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--only", default="", help="comma-separated words: workloads whose label "
                    "holds one of them (e.g. --only irfft,1024 x 4096 float32)")  # fmt: skip
    args = ap.parse_args()
    ONLY[:] = [w for w in args.only.split(",") if w]
    reps = 3 if args.quick else 9
    peers = _peers()
    rng = np.random.default_rng(0)
    print("load average:", os.getloadavg(), " cpu:", _cpu())
    try:
        from threadpoolctl import threadpool_info

        print("BLAS:", [(i["internal_api"], i.get("architecture")) for i in threadpool_info()])
    except ImportError:
        pass
    x = (rng.standard_normal((1024, 4096)) + 1j * rng.standard_normal((1024, 4096))).astype(
        np.complex64
    )
    bench("fft 1024 x 4096 complex64", "fft", x, reps, peers)
    v = x[0].copy()
    bench("fft of one 4096 complex64 (cached realize)", "fft", v, reps * 20, peers)
    r = rng.standard_normal(1 << 20).astype(np.float32)
    bench("rfft of 1M float32", "rfft", r, reps, peers)
    bench("rfft 1024 x 4096 float32 (packed)", "rfft", x.real.copy(), reps, peers)
    bench("irfft to 1M float32 (from 524289 complex64)", "irfft", np.fft.rfft(r).astype(
        np.complex64), reps, peers)  # fmt: skip
    p = (rng.standard_normal((64, 4099)) + 1j * rng.standard_normal((64, 4099))).astype(
        np.complex64
    )  # a prime length > 2048: Bluestein on the AI Core
    bench("fft 64 x 4099 complex64 (prime length)", "fft", p, reps, peers)
    print("\nload average:", os.getloadavg())


if __name__ == "__main__":
    main()
