"""Per-call cost of `lm.jit` against eager lazymath, numpy eager, torch eager and jax.jit, in
one process (issue 34).

    python benchmarks/jit_overhead.py [--reps N]

- relu(x * 2 + y) on 1,000 float32: a call of each peer, median of N timed segments of 200
  calls (lazymath results are realized: `.numpy()` on the output; jax: block_until_ready);
- a 50-op elementwise step on 1,000 float32 (alternating mul/add/tanh-free cheap ops), lm.jit
  vs numpy eager;
- a dynamic batch: tanh(x @ W + b) * 0.5 through lm.jit(dynamic=0) at batch sizes 1..4096
  (one program) against numpy eager, and the programs compiled; the same for an elementwise
  step and for a softmax over the last axis (run-time rows);
- a 1,000-step eager loop `x * s + 1.0` whose Python float s changes every step: programs
  compiled during the loop (the default runtime-scalar arguments: 0 after the first step).
Timings are only meaningful under /work/bin/lmbench on the shared host (machine to itself).
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

N = 1000
CALLS = 200


def _settle(jitted, limit_s: float = 60.0) -> None:
    """Wait until every kernel of `jitted`'s programs runs its final code: a first call starts
    on quickly compiled (tier 0) code and optimizes in the background (issue 34 measures the
    steady replay; the cold first call is another number)."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < limit_s:
        progs = [e.prog for e in jitted._entries.values()]
        progs += [d.rows.prog if d.rows is not None else d.entry.prog
                  for d in jitted._dyn.values() if d is not None]  # fmt: skip
        if all(getattr(ck, "tier", 2) != 0 for p in progs for _sk, ck, _s in p.kernels):
            return
        time.sleep(0.05)


def _median_us(fn, reps: int) -> float:
    for _ in range(20):
        fn()
    seg = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(CALLS):
            fn()
        seg.append((time.perf_counter() - t0) / CALLS * 1e6)
    return statistics.median(seg)


def step50(x, y):
    """50 cheap elementwise ops (25 mul/add pairs) on two inputs."""
    z = x
    for _ in range(25):
        z = z * 0.999 + y
    return z


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=15)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    xn = rng.standard_normal(N).astype(np.float32)
    yn = rng.standard_normal(N).astype(np.float32)
    x, y = lm.asarray(xn), lm.asarray(yn)
    want = np.maximum(xn * np.float32(2) + yn, 0)
    rows = {}

    jf = lm.jit(lambda u, v: lm.relu(u * 2.0 + v))
    np.testing.assert_allclose(jf(x, y).numpy(), want, rtol=1e-6)
    _settle(jf)
    rows["lm.jit"] = _median_us(lambda: jf(x, y).numpy(), a.reps)
    rows["lazymath eager"] = _median_us(lambda: lm.relu(x * 2.0 + y).numpy(), a.reps)
    rows["numpy eager"] = _median_us(lambda: np.maximum(xn * np.float32(2) + yn, 0), a.reps)
    try:
        import torch

        torch.set_num_threads(1)
        xt, yt = torch.from_numpy(xn), torch.from_numpy(yn)
        rows["torch eager"] = _median_us(lambda: torch.relu(xt * 2.0 + yt), a.reps)
    except ImportError:
        pass
    try:
        import jax

        jj = jax.jit(lambda u, v: jax.nn.relu(u * 2.0 + v))
        xj, yj = jax.numpy.asarray(xn), jax.numpy.asarray(yn)
        jj(xj, yj).block_until_ready()
        rows["jax.jit"] = _median_us(lambda: jj(xj, yj).block_until_ready(), a.reps)
    except ImportError:
        pass
    print(f"relu(x*2+y), {N} float32, us per call (median of {a.reps} x {CALLS} calls):")
    for k, v in rows.items():
        print(f"  {k:16s} {v:8.2f}  ({v / rows['numpy eager']:.2f}x numpy)")

    j50 = lm.jit(step50)
    np.testing.assert_allclose(j50(x, y).numpy(), step50(xn, yn), rtol=1e-4, atol=1e-5)
    _settle(j50)
    t_lm = _median_us(lambda: j50(x, y).numpy(), a.reps)
    t_np = _median_us(lambda: step50(xn, yn), a.reps)
    print(f"50-op step, {N} float32: lm.jit {t_lm:.2f} us, numpy eager {t_np:.2f} us "
          f"({t_lm / t_np:.2f}x)")  # fmt: skip

    # a dynamic batch: one program for every size (lm.jit(dynamic=0)) against numpy eager
    wn = rng.standard_normal((64, 32)).astype(np.float32)
    bn = rng.standard_normal(32).astype(np.float32)
    w, b = lm.asarray(wn), lm.asarray(bn)
    jd = lm.jit(lambda u: lm.tanh(u @ w + b) * 0.5, dynamic=0)
    misses = engine.PROGRAMS.misses
    print("dynamic batch tanh(x @ W[64x32] + b) * 0.5, us per call (lm.jit dynamic=0 / numpy):")
    for n in (1, 7, 64, 100, 513, 4096):
        xb = rng.standard_normal((n, 64)).astype(np.float32)
        tb = lm.asarray(xb)
        np.testing.assert_allclose(jd(tb).numpy(), np.tanh(xb @ wn + bn) * 0.5, rtol=1e-4,
                                   atol=1e-5)  # fmt: skip
        _settle(jd)
        t_j = _median_us(lambda tb=tb: jd(tb).numpy(), a.reps)
        t_n = _median_us(lambda xb=xb: np.tanh(xb @ wn + bn) * np.float32(0.5), a.reps)
        print(f"  batch {n:5d}: {t_j:9.2f} / {t_n:9.2f}  ({t_j / t_n:.2f}x)")
    print(f"  programs compiled for the 6 sizes: {engine.PROGRAMS.misses - misses}")

    # an elementwise dynamic batch: the kernels take the row count at run time (one launch
    # per batch up to the chunk, no padded tail) against numpy eager
    yn64 = rng.standard_normal(64).astype(np.float32)
    yb = lm.asarray(yn64)
    je = lm.jit(lambda u, v: lm.relu(u * 2.0 + v), dynamic=0)
    misses = engine.PROGRAMS.misses
    print("dynamic batch relu(x * 2 + y[64]), us per call (lm.jit dynamic=0 / numpy):")
    for n in (1, 7, 64, 100, 513, 4096):
        xb = rng.standard_normal((n, 64)).astype(np.float32)
        tb = lm.asarray(xb)
        np.testing.assert_allclose(je(tb, yb).numpy(), np.maximum(xb * 2 + yn64, 0), rtol=1e-6)
        _settle(je)
        t_j = _median_us(lambda tb=tb: je(tb, yb).numpy(), a.reps)
        t_n = _median_us(lambda xb=xb: np.maximum(xb * np.float32(2) + yn64, 0), a.reps)
        print(f"  batch {n:5d}: {t_j:9.2f} / {t_n:9.2f}  ({t_j / t_n:.2f}x)")
    print(f"  programs compiled for the 6 sizes: {engine.PROGRAMS.misses - misses}")

    # a row-kernel dynamic batch: softmax over the last axis (the rows template, the row
    # count a kernel argument since issue 34's reduce/rows work) against numpy eager
    js = lm.jit(lambda u: lm.softmax(u, axis=-1), dynamic=0)

    def np_softmax(u):
        e = np.exp(u - u.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    misses = engine.PROGRAMS.misses
    print("dynamic batch softmax(x[, 64], axis=-1), us per call (lm.jit dynamic=0 / numpy):")
    for n in (1, 7, 64, 100, 513, 4096):
        xb = rng.standard_normal((n, 64)).astype(np.float32)
        tb = lm.asarray(xb)
        np.testing.assert_allclose(js(tb).numpy(), np_softmax(xb), rtol=1e-5, atol=1e-7)
        _settle(js)
        t_j = _median_us(lambda tb=tb: js(tb).numpy(), a.reps)
        t_n = _median_us(lambda xb=xb: np_softmax(xb), a.reps)
        print(f"  batch {n:5d}: {t_j:9.2f} / {t_n:9.2f}  ({t_j / t_n:.2f}x)")
    print(f"  programs compiled for the 6 sizes: {engine.PROGRAMS.misses - misses}")

    # donation: an SGD-like step p - lr * g donating p (written in place) vs not donating
    gd, lr = lm.asarray(rng.standard_normal(N).astype(np.float32)), lm.asarray(np.float32(1e-3))
    jdon = lm.jit(lambda p, g, r: p - r * g, donate=0)
    jkeep = lm.jit(lambda p, g, r: p - r * g)
    state = {"d": lm.asarray(xn.copy()), "k": lm.asarray(xn.copy())}

    def run(name, fn):
        state[name] = fn(state[name], gd, lr)

    run("d", jdon)
    run("k", jkeep)
    _settle(jdon)
    _settle(jkeep)
    t_d = _median_us(lambda: run("d", jdon), a.reps)
    t_k = _median_us(lambda: run("k", jkeep), a.reps)
    np.testing.assert_allclose(state["d"].numpy(), state["k"].numpy(), rtol=1e-6)
    print(f"SGD step p - lr * g, {N} float32: donate=0 {t_d:.2f} us, not donated {t_k:.2f} us")

    (x * 0.5 + 1.0).numpy()
    misses = engine.PROGRAMS.misses
    t0 = time.perf_counter()
    for i in range(1000):
        s = 1.0 + i * 1e-3
        r = (x * s + 1.0).numpy()
    dt = (time.perf_counter() - t0) * 1e3
    np.testing.assert_allclose(r, xn * np.float32(s) + 1, rtol=1e-6)
    print(f"1,000-step eager loop x*s+1 with a new float s each step: "
          f"{engine.PROGRAMS.misses - misses} programs compiled, {dt:.1f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
