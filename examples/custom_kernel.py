"""Write NPU kernels in Python (`lm.kernel`) and use them as lazy ops.

    python examples/custom_kernel.py              # n = 50,003 elements, 70x45x50 matmul
    python examples/custom_kernel.py --big        # n = 1M elements, 512x256x384 matmul

1. GELU on the Vector unit in three steps (docs/custom_kernels.md walks through them):
   naive (one UB buffer, no pipe flags: the NPU serialises every instruction), single-buffered
   with flags (still serial: one buffer), and AscendC-style double buffering (ping-pong UB
   queues, MTE2 loads tile i+1 while Vector computes tile i and MTE3 writes tile i-1). Each
   runs on the llvm and interp backends, is compared with numpy, and prints its simulated
   cycles, the per-pipe timeline of one block and the measured host time.
2. A small Cube kernel: C = A @ B with L1 -> L0A/L0B -> mmad -> L0C -> fixpipe, both backends.
3. Both inside one lazy graph, with producers and consumers fused around them.
4. The runtime layer: a user kernel launched on a user stream that waits on an event recorded
   after a realize.

Exits non-zero if any result differs from numpy.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # run from a checkout

import lazymath as lm  # noqa: E402
from lazymath.backend.npu.isa import imin  # noqa: E402
from lazymath.lowlevel import ceil_div, pipe_timeline  # noqa: E402

C = 1.5957691216057308  # 2 * sqrt(2 / pi): gelu(x) ~ x * sigmoid(C * (x + 0.044715 x^3))


def gelu_ref(x):
    x = x.astype(np.float32)
    with np.errstate(over="ignore"):
        return x / (1 + np.exp(-C * (x + np.float32(0.044715) * x * x * x)))


def gelu_math(k, y, x, tmp, n):
    """The GELU body on one UB tile: 8 vector instructions."""
    k.vmul(tmp, x, x, n)
    k.vmuls(tmp, tmp, 0.044715, n)
    k.vadds(tmp, tmp, 1.0, n)
    k.vmul(tmp, tmp, x, n)
    k.vmuls(tmp, tmp, -C, n)
    k.vexp(tmp, tmp, n)
    k.vadds(tmp, tmp, 1.0, n)
    k.vdiv(y, x, tmp, n)


def tiling(spec, x, y, *, tile=2048):
    """A fixed tile (elements) and 8 blocks (fewer when there are fewer tiles), so each block
    loops over several tiles: what double buffering overlaps."""
    return {"blocks": max(1, min(8, ceil_div(x.size, tile)))}


# -- step 1: naive. One buffer per operand, no flags: the cost model (and a real NPU without
# flags between the pipes) runs every instruction after the previous one finished.
@lm.kernel(unit="vector", tiling=tiling, reference=gelu_ref)
def gelu_naive(k, x, y, *, tile=2048):
    xb, yb, tmp = k.ub(x.dtype, tile, "x"), k.ub(y.dtype, tile, "y"), k.ub(x.dtype, tile, "tmp")
    start, stop = k.block_range(ceil_div(x.size, tile))
    with k.loop(start, stop) as t:
        n = k.let(imin(tile, x.size - t * tile), "n")
        k.copy_in(xb, x[t * tile], n)
        gelu_math(k, yb, xb, tmp, n)
        k.copy_out(y[t * tile], yb, n)


# -- step 2: the same with pipe flags (MTE2 -> V -> MTE3 and back): correct on an NPU whose
# pipes run in parallel, but one buffer means the next load waits for this tile's compute.
@lm.kernel(unit="vector", tiling=tiling, reference=gelu_ref)
def gelu_single(k, x, y, *, tile=2048):
    xb, yb, tmp = k.ub(x.dtype, tile, "x"), k.ub(y.dtype, tile, "y"), k.ub(x.dtype, tile, "tmp")
    start, stop = k.block_range(ceil_div(x.size, tile))
    k.set_flag("V", "MTE2")
    k.set_flag("MTE3", "V")
    with k.loop(start, stop) as t:
        n = k.let(imin(tile, x.size - t * tile), "n")
        k.wait_flag("V", "MTE2")  # the previous tile's compute no longer reads x
        k.copy_in(xb, x[t * tile], n)
        k.set_flag("MTE2", "V")
        k.wait_flag("MTE2", "V")
        k.wait_flag("MTE3", "V")  # the previous tile's copy-out no longer reads y
        gelu_math(k, yb, xb, tmp, n)
        k.set_flag("V", "MTE2")
        k.set_flag("V", "MTE3")
        k.wait_flag("V", "MTE3")
        k.copy_out(y[t * tile], yb, n)
        k.set_flag("MTE3", "V")
    k.wait_flag("V", "MTE2")
    k.wait_flag("MTE3", "V")


# -- step 3: double buffering. Two halves per queue (ping-pong on t % 2), one event id each:
# MTE2 fills half pp of x while Vector computes the other half and MTE3 drains y.
@lm.kernel(unit="vector", tiling=tiling, reference=gelu_ref, epilogue=True)
def gelu_double(k, x, y, *, tile=2048):
    xq, yq = k.ub(x.dtype, 2 * tile, "xq"), k.ub(y.dtype, 2 * tile, "yq")
    tmp = k.ub(x.dtype, tile, "tmp")
    start, stop = k.block_range(ceil_div(x.size, tile))
    for e in (0, 1):
        k.set_flag("V", "MTE2", e)
        k.set_flag("MTE3", "V", e)
    with k.loop(start, stop) as t:
        pp = k.let(t % 2, "pp")
        n = k.let(imin(tile, x.size - t * tile), "n")
        xb, yb = xq[pp * tile], yq[pp * tile]
        k.wait_flag("V", "MTE2", pp)
        k.copy_in(xb, x[t * tile], n)
        k.set_flag("MTE2", "V", pp)
        k.wait_flag("MTE2", "V", pp)
        k.wait_flag("MTE3", "V", pp)
        gelu_math(k, yb, xb, tmp, n)
        k.epilogue(yb, n, size=tile)  # the slot: fused elementwise consumers run here
        k.set_flag("V", "MTE2", pp)
        k.set_flag("V", "MTE3", pp)
        k.wait_flag("V", "MTE3", pp)
        k.copy_out(y[t * tile], yb, n)
        k.set_flag("MTE3", "V", pp)
    for e in (0, 1):
        k.wait_flag("V", "MTE2", e)
        k.wait_flag("MTE3", "V", e)


# -- a small Cube kernel: one 32x32 output tile per item, K in chunks of 64 accumulated in L0C.
def mm_shape(a, b):
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"need (m, k) @ (k, n), got {a.shape} @ {b.shape}")
    return (a.shape[0], b.shape[1]), "float32"


def mm_ref(a, b):
    return a.astype(np.float32) @ b.astype(np.float32)


def mm_tiling(spec, a, b, c):
    items = ceil_div(a.shape[0], 32) * ceil_div(b.shape[1], 32)
    return {"tm": 32, "tn": 32, "tk": 64, "blocks": max(1, min(spec.cube_cores, items))}


@lm.kernel(unit="cube", outputs=mm_shape, tiling=mm_tiling, reference=mm_ref,
           flops=lambda a, b: 2 * a.shape[0] * a.shape[1] * b.shape[1])  # fmt: skip
def matmul_tiles(k, a, b, c, *, tm, tn, tk):
    M, K = a.shape
    N = b.shape[1]
    l1a, l1b = k.l1(a.dtype, tm * tk, "l1a"), k.l1(b.dtype, tk * tn, "l1b")
    l0a, l0b = k.l0a(a.dtype, tm * tk, "l0a"), k.l0b(b.dtype, tk * tn, "l0b")
    l0c = k.l0c("float32", tm * tn, "l0c")
    nn = ceil_div(N, tn)
    start, stop = k.block_range(ceil_div(M, tm) * nn)
    with k.loop(start, stop) as t:
        m0, n0 = k.let(t // nn * tm, "m0"), k.let(t % nn * tn, "n0")
        mv, nv = k.let(imin(tm, M - m0), "mv"), k.let(imin(tn, N - n0), "nv")
        with k.loop(ceil_div(K, tk)) as kc:
            k0 = k.let(kc * tk, "k0")
            kv = k.let(imin(tk, K - k0), "kv")
            k.load_nz(l1a, a[m0 * K + k0], mv, kv, (K, 1), dst_rows=tm)  # GM -> L1 (NZ)
            k.load_nz(l1b, b[k0 * N + n0], kv, nv, (N, 1), dst_rows=tk)
            k.set_flag("MTE2", "MTE1")
            k.wait_flag("MTE2", "MTE1")
            k.load_l0(l0a, l1a, (mv + 15) // 16 * 16, (kv + 15) // 16 * 16, tm, tm)  # L1 -> L0A
            k.load_l0(l0b, l1b, (kv + 15) // 16 * 16, (nv + 15) // 16 * 16, tk, tk)
            k.set_flag("MTE1", "M")
            k.wait_flag("MTE1", "M")
            k.mmad(l0c, l0a, l0b, mv, nv, kv, tm, tk, tm, accumulate=imin(kc, 1))
            k.pipe_barrier()  # L1/L0 are reused by the next chunk: no overlap in this kernel
        k.fixpipe(c[m0 * N + n0], l0c, mv, nv, (N, 1), src_rows=tm)  # L0C -> GM
        k.pipe_barrier()


def host_ms(ck, arrays, reps: int) -> float:
    ck(*arrays)  # warm
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        ck(*arrays)
        ts.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(ts)


def close(got, want, rtol, atol) -> bool:
    return got.shape == want.shape and bool(np.allclose(got, want, rtol=rtol, atol=atol))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--big", action="store_true", help="1M elements, 512x256x384 matmul")
    args = p.parse_args()
    n = 1 << 20 if args.big else 50_003
    mkn = (512, 256, 384) if args.big else (70, 45, 50)
    reps = 10 if args.big else 3
    ok = True
    rng = np.random.default_rng(0)
    spec = lm.current_device().spec

    print(f"== 1. GELU on the Vector unit, {n} float32 elements, {spec.name}")
    x = rng.standard_normal(n).astype(np.float32) * 3
    want = gelu_ref(x)
    for kern in (gelu_naive, gelu_single, gelu_double):
        cost = kern.cost(x, spec=spec)
        line = []
        for backend in ("llvm", "interp"):
            ck = kern.compile(x, backend=backend)
            y = np.empty_like(x)
            ck(x, y)
            good = close(y, want, 1e-5, 1e-6)
            ok &= good
            line.append(f"{backend} {'ok' if good else 'WRONG'}")
        ms = host_ms(kern.compile(x, backend="llvm"), (x, np.empty_like(x)), reps)
        print(f"\n{kern.name}: simulated {cost.total:,.0f} cycles/block "
              f"({cost.seconds * 1e6:.2f} us), host {ms:.3f} ms (llvm, median of {reps}); "
              + ", ".join(line))  # fmt: skip
        print(pipe_timeline(cost))

    m, kk, nn = mkn
    print(f"\n== 2. Cube kernel: ({m}x{kk}) @ ({kk}x{nn}) float16 -> float32")
    a = rng.standard_normal((m, kk)).astype(np.float16)
    b = rng.standard_normal((kk, nn)).astype(np.float16)
    for backend in ("llvm", "interp"):
        ck = matmul_tiles.compile(a, b, backend=backend)
        c = np.empty((m, nn), np.float32)
        ck(a.reshape(-1), b.reshape(-1), c.reshape(-1))
        good = close(c, mm_ref(a, b), 1e-4, 1e-3)
        ok &= good
        print(f"{backend}: {'ok' if good else 'WRONG'}")
    print(pipe_timeline(matmul_tiles.cost(a, b, spec=spec)))

    print("\n== 3. inside a lazy graph: sum(gelu(A*2 @ B + 1), axis=-1)")
    A, B = lm.tensor(a), lm.tensor(b)
    out = lm.sum(gelu_double(matmul_tiles(A * 2, B) + 1), axis=-1)
    print(lm.explain(out))
    want3 = gelu_ref(mm_ref(a * np.float16(2), b) + 1).sum(axis=-1)
    good = close(out.numpy(), want3, 1e-4, 1e-2)
    ok &= good
    print(f"graph result: {'ok' if good else 'WRONG'}")
    epi = lm.tanh(gelu_double(lm.tensor(x)) * 0.5) + 1  # consumers fuse into the epilogue slot
    print("gelu_double(x) then * 0.5, tanh, + 1:",
          [k.ops for k in lm.schedule(epi).kernels], "kernel(s)")  # fmt: skip
    good = close(epi.numpy(), np.tanh(gelu_ref(x) * np.float32(0.5)) + 1, 1e-5, 1e-5)
    ok &= good
    print(f"epilogue result: {'ok' if good else 'WRONG'}")

    print("\n== 4. runtime layer: a user stream waits on an event recorded after a realize")
    dev = lm.current_device()
    h = (lm.tensor(x) * 0.5).realize()  # a lazy graph, realized on the default stream
    ev = lm.runtime.create_event("after-realize")
    ev.record(dev.default_stream)  # aclrtRecordEvent
    st = dev.create_stream()  # aclrtCreateStream
    st.wait_event(ev)  # aclrtStreamWaitEvent
    y = gelu_double.launch(h.numpy(), stream=st, blocks=3)  # aclrtLaunchKernel, 3 blocks
    st.synchronize()  # aclrtSynchronizeStream
    good = close(y, gelu_ref(x * np.float32(0.5)), 1e-5, 1e-6)
    ok &= good
    print(f"launched on {st}: {'ok' if good else 'WRONG'}")

    print("\ncheck: " + ("OK, every result matches numpy" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
