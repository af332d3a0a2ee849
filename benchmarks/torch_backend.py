"""torch.compile(backend="lazymath") against torch eager and Inductor on a GPT-style block.

    python benchmarks/torch_backend.py                          # fwd and fwd+bwd, fp32 and fp16
    python benchmarks/torch_backend.py --modes fwd --dtypes float32
    python benchmarks/torch_backend.py --quick                  # CI smoke: tiny block, 1 rep
    python -m benchmarks --only torch_backend                   # the same through the runner

The model is issue 32's: a pre-norm decoder block (LayerNorm, fused QKV Linear, causal
scaled_dot_product_attention, output projection, LayerNorm, 4x MLP with tanh GELU, residuals),
d=768, 12 heads, batch 4, sequence 512. Per dtype and mode ("fwd": forward under no_grad,
"fwd+bwd": forward, sum, backward), all three peers run in one process:
- cold: the first call, Dynamo tracing and the backend's compile included. Each peer compiles
  into an empty cache (LAZYMATH_CACHE_DIR and TORCHINDUCTOR_CACHE_DIR point at fresh
  temporary directories), so this is the first-ever compile, not a cache hit;
- steady: the median of `--reps` calls after two warm-up calls and lazymath's background
  tier-ups (`settle_compiles`), the peers alternating in rounds so machine noise hits all;
- peak: the most resident memory above the level before the call, sampled every 0.5 ms by a
  thread reading /proc/self/statm while two more calls run (large tensors are mmap'd, so a
  freed buffer leaves RSS at once; the numbers compare peers, they are not allocator-exact).
Ratios are peer / lazymath (> 1: lazymath is faster or smaller). Timings are never asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time

# fresh compile caches before anything imports lazymath or Inductor: "cold" means cold
os.environ.setdefault("LAZYMATH_CACHE_DIR", tempfile.mkdtemp(prefix="lm-bench-cache-"))
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="inductor-bench-"))

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from _timing import settle_compiles  # noqa: E402
from torch import nn  # noqa: E402

import lazymath.torch as lt  # noqa: E402

F = nn.functional
PEERS = ("lazymath", "eager", "inductor")


class GPTBlock(nn.Module):
    """Pre-norm decoder block: x + attn(ln1(x)) with a causal mask, then x + mlp(ln2(x))."""

    def __init__(self, d: int = 768, heads: int = 12):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_bytes(fn, calls: int = 2) -> int:
    """Peak resident bytes above the level before `calls` calls of fn (sampled, see the
    module docstring)."""
    base = _rss()
    peak = [base]
    done = threading.Event()

    def sample():
        while not done.is_set():
            r = _rss()
            if r > peak[0]:
                peak[0] = r
            time.sleep(0.0005)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        for _ in range(calls):
            fn()
    finally:
        done.set()
        t.join()
    return peak[0] - base


def _step(model, x, mode: str):
    if mode == "fwd":

        def run():
            with torch.no_grad():
                return model(x)

        return run

    def run_train():
        for p in model.parameters():
            p.grad = None
        model(x).sum().backward()

    return run_train


def bench(dtype: torch.dtype, mode: str, batch: int, seq: int, d: int, heads: int,
          reps: int, peers: tuple[str, ...]) -> dict:  # fmt: skip
    """Cold, steady and peak of every peer on one (dtype, mode)."""
    torch.manual_seed(0)
    base = GPTBlock(d, heads).to(dtype)
    x = torch.randn(batch, seq, d, dtype=dtype)
    runs, cold = {}, {}
    for peer in peers:
        torch._dynamo.reset()
        model = GPTBlock(d, heads).to(dtype)
        model.load_state_dict(base.state_dict())
        if peer == "lazymath":
            m = lt.compile(model)
        elif peer == "inductor":
            m = torch.compile(model)
        else:
            m = model
        fn = _step(m, x, mode)
        t0 = time.perf_counter()
        fn()
        cold[peer] = time.perf_counter() - t0
        fn()
        settle_compiles()
        runs[peer] = fn
    times: dict[str, list[float]] = {p: [] for p in peers}
    rounds = 2
    for _ in range(rounds):
        for p in peers:
            runs[p]()  # one untimed call after the other peers ran
            for _ in range(max(1, -(-reps // rounds))):
                t0 = time.perf_counter()
                runs[p]()
                times[p].append(time.perf_counter() - t0)
    peak = {p: peak_bytes(runs[p]) for p in peers}
    return {
        "dtype": str(dtype).removeprefix("torch."),
        "mode": mode,
        "steady": {p: statistics.median(v) for p, v in times.items()},
        "cold": cold,
        "peak": peak,
    }


def table(results: list[dict]) -> str:
    head = (f"{'case':18} {'peer':9} {'steady ms':>10} {'x lm':>6} {'cold s':>8} {'x lm':>6} "
            f"{'peak MB':>8} {'x lm':>6}")  # fmt: skip
    lines = [head, "-" * len(head)]
    for r in results:
        lm_s, lm_c, lm_p = (r[k]["lazymath"] for k in ("steady", "cold", "peak"))
        for i, p in enumerate(r["steady"]):
            case = f"{r['mode']} {r['dtype']}" if i == 0 else ""
            s, c, m = r["steady"][p], r["cold"][p], r["peak"][p]
            mr = m / max(lm_p, 1)
            lines.append(f"{case:18} {p:9} {s * 1e3:>10.1f} {s / lm_s:>6.2f} {c:>8.2f} "
                         f"{c / lm_c:>6.2f} {m / 2**20:>8.1f} {mr:>6.2f}")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", default="fwd,fwd+bwd", help="comma-separated: fwd, fwd+bwd")
    ap.add_argument("--dtypes", default="float32,float16", help="comma-separated torch dtypes")
    ap.add_argument("--peers", default=",".join(PEERS), help=f"subset of {','.join(PEERS)}")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--d", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--quick", action="store_true", help="tiny block, 1 rep (CI smoke)")
    args = ap.parse_args(argv)
    if args.quick:
        args.batch, args.seq, args.d, args.heads, args.reps = 1, 8, 32, 2, 1
    modes = [m for m in args.modes.split(",") if m]
    peers = tuple(p for p in args.peers.split(",") if p)
    bad = sorted(set(modes) - {"fwd", "fwd+bwd"}) + sorted(set(peers) - set(PEERS))
    if bad or "lazymath" not in peers:
        ap.error(f"unknown mode/peer {bad}; lazymath must be among the peers")
    dtypes = []
    for name in (d for d in args.dtypes.split(",") if d):
        dt = getattr(torch, name, None)
        if not isinstance(dt, torch.dtype):
            ap.error(f"unknown torch dtype {name!r}")
        dtypes.append(dt)
    results = []
    for dt in dtypes:
        for mode in modes:
            print(f"{mode} {dt} ...", file=sys.stderr, flush=True)
            results.append(bench(dt, mode, args.batch, args.seq, args.d, args.heads, args.reps,
                                 peers))  # fmt: skip
    print(f"GPT block batch {args.batch}, seq {args.seq}, d {args.d}, {args.heads} heads; "
          f"torch {torch.__version__}, {torch.get_num_threads()} torch threads; "
          "x lm = peer / lazymath (> 1: lazymath faster / smaller)")  # fmt: skip
    print(table(results))
    return results


if __name__ == "__main__":
    main()
