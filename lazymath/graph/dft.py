"""FFT plans: which implementation a transform gets, and its constant tables.

An FFT of length n on the AI Core is matrix products (the Cube) on real numbers: complex64
data is read as float32 (real, imaginary) pairs, the same memory (a realized input in place,
no copy), and every plan leaves its result complex64 in C order, so the AI CPU's join at the
end is one memcpy. Implementations:

  direct     one DFT matmul: (batch, 2n) @ (2n, 2m) on the pairs ((batch, n) @ (n, 2m) for a
             real input; m = n, or n // 2 + 1 for rfft). For short lengths (and primes up to
             PRIME_DIRECT_MAX) its 8n^2 flops per row beat the passes of a factorized plan.
  four-step  n = n1 * n2 (Cooley-Tukey, t = t1 n2 + t2, k = k1 + n1 k2, recursively on n2):
             step 1 [Re F; Im F] (2 n1, n1) @ each input slab (t1, (t2, plane)), read in place;
             step 2 one Vector kernel: the complex product's four real parts and the twiddles
             w**(k1 t2), written as the rows [[Re y', Im y'], [Im y', -Re y']] of step 3;
             step 3 [Re F, -Im F] (n2, 2 n2) @ those rows: (k2, (k1, plane')), complex64 in
             C order. 8n(n1 + n2) flops per row.
  stockham   powers of two from STOCKHAM_MIN to STOCKHAM_MAX whose stages fit in UB: one
             Vector kernel (backend/npu/templates/fft.py), every radix-4/2 stage of a row in UB.
  six-step   powers of two above STOCKHAM_MAX: two passes of the Vector Stockham kernel over
             strided columns (n1 columns of n2, times the twiddles, then n2 of n1).
  packed     rfft of n even with n/2 a Stockham/six-step length: the real rows read as n/2
             complex points, their Vector FFT and the combine of Z[k] and Z[n/2 - k] (inside
             the Stockham kernel, on Z in UB; after a six-step FFT its own kernel;
             tensor._rfft_packed);
             irfft of such n: a Vector kernel (templates/fft.py mode "ipre") forms
             Z = (A + conj B) + i w^-k (A - conj B), A = X[k], B = X[h - k], and the inverse
             Vector FFT of Z is z_m = x_2m + i x_2m+1, the real result in C order.
  bluestein-vector  a prime factor above BLUESTEIN_VECTOR_MIN when the power of two
             m >= 2n - 1 is a Stockham length: the chirp convolution through two Vector
             Stockham FFTs of m.
  bluestein  the chirp convolution X_k = c_k sum_t (x_t c_t) b_(k-t), c_t = exp(sign i pi t^2/n),
             b = conj(c), through a forward and an inverse Cube transform of a 5-smooth
             m >= 2n - 1 (the filter's spectrum a constant table); chirp products on the Vector
             unit, the zero padding to m an AI CPU pad.
  aicpu      the AI CPU's numpy.fft (double precision and empty inputs always go there).

`plan(...)` returns the choice with its reason: double results and empty inputs -> aicpu;
otherwise every plan in `candidates(...)` (what exists for the length and fits the UB) gets the
host cost model's estimate (`estimate`: per kernel a launch plus max(flops at its unit's rate,
bytes at the memory rate), rates per host core and float32 lane) and the cheapest wins;
`FORCE[kind]` overrides. With autotuning (LAZYMATH_AUTOTUNE, lm.precompile(autotune=True)) the
tensor layer measures the candidates instead and stores the winner (tensor._fft_plan). The
reason (what the plan does, who chose it, every candidate's time) is printed by `lm.explain`
(the fusion log's "fft" entries). The rule and the model's constants: docs/fft_conv.md.

Tables (DFT matrices, twiddles, chirps) are built once per (length, direction, scale) and
cached.
"""

from __future__ import annotations

import functools
import math
import weakref

import numpy as np

from lazymath import settings

DIRECT_MAX = 128  # a length up to this is one DFT matmul (8n^2 flops per row)
FACTOR_MAX = 128  # four-step: the short DFT n1 is at most this
PRIME_DIRECT_MAX = 2048  # lengths with no factor <= FACTOR_MAX: direct up to this, else aicpu
IRFFT_DIRECT_MAX = 4096  # irfft on the Cube is one direct matmul (real output) up to this
# Bluestein on Cube transforms (m > STOCKHAM_MAX) was 1.7-3.2x slower than the AI CPU's
# numpy.fft on the host (64 x 4099, session 3; the model agrees: its zero pad is an AI CPU
# kernel): set, the lengths it covers stay on the AI Core (the AI CPU is not a candidate)
BLUESTEIN_CUBE = False
BLUESTEIN_VECTOR_MIN = 128  # a prime factor > this: Bluestein on two Vector FFTs is a candidate
STOCKHAM_MIN = 4  # powers of two from this length ...
STOCKHAM_MAX = 4096  # ... up to this one (and what fits in UB) may take the Vector Stockham FFT
# rfft packed on a Stockham half length: the combine inside the Stockham kernel (templates/fft.py
# mode "rfused", Z kept in UB) instead of a second kernel. The device model prefers it (64 x 4096
# simulated: 910 183 vs 196 us, 910B 102 vs 109 us: no GM round trip of Z, one launch fewer).
# On the host it measured 4-19 % slower while every Stockham stage gathered (Zen 5); since the
# middle stages read contiguous runs (RUN_MIN) it is faster on this Zen 4 host: rfft 1024 x 4096
# 11.0-11.1 -> 3.9-7.4 ms, one row of 4096 level (0.029 ms), same process alternating: on
RFFT_FUSED = True


# The plan's reason for transforms whose result is not an "fft" or "complex_join" node (irfft:
# its real result comes out of a matmul or a Vector FFT kernel): the node that does the
# transform -> "impl: reason". The fusion planner logs it like the others' (lm.explain).
_NOTES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def note_plan(node, why: str) -> None:
    """Record `why` (the plan and its reason) for the graph node computing a transform."""
    _NOTES[node] = why


def plan_note(node) -> str | None:
    """The plan reason recorded by `note_plan` for `node`, if any."""
    return _NOTES.get(node)


def _factor(n: int) -> int | None:
    """The divisor of n in [2, FACTOR_MAX] nearest sqrt(n) (None: there is none)."""
    best = None
    root = math.sqrt(n)
    for d in range(2, min(FACTOR_MAX, n - 1) + 1):
        if n % d == 0 and (best is None or abs(d - root) < abs(best - root)):
            best = d
    return best


def factors(n: int) -> list[int] | None:
    """The lengths of the short DFTs of a plan: [n] (direct) or [n1, n2, ...] (four-step,
    the last one direct), None when a factor is too large for a direct DFT."""
    if n <= DIRECT_MAX:
        return [n]
    d = _factor(n)
    if d is None:
        return [n] if n <= PRIME_DIRECT_MAX else None
    rest = factors(n // d)
    return None if rest is None else [d, *rest]


# ----------------------------------------------------------------------------- the plan rule
# Which candidates exist is structure (what is built, what fits); which one runs is the cheapest
# by the host cost model below, or the fastest measured when autotuning (tensor._fft_plan, the
# records of backend.autotune). The kernels run on the host, so the time that decides is the
# host's: each kernel of a plan costs a launch plus the larger of its arithmetic at its unit's
# rate and its GM traffic at the memory rate (the roofline lm.schedule's bound class uses), the
# rates per host core scaled by the host target's float32 vector lanes (`host` = (cores,
# lanes)). The constants were calibrated against candidate times measured on the host with
# LAZYMATH_AUTOTUNE (docs/fft_conv.md, the issue 14 note, session 6).
CALL_S = 35e-6  # every plan: building the graph, planning, the realize (the same for all)
LAUNCH_S = 15e-6  # one AI Core kernel: launch and the realize walk's share
AICPU_S = 45e-6  # an AI CPU kernel: the program leaves the native replay path, a result copy
VECTOR_FLOPS = 0.8e9  # per core and float32 lane: the Vector FFT's stages (gathers, butterflies)
CUBE_FLOPS = 2.5e9  # per core and float32 lane: the host GEMM on DFT shapes (K <= 2 x 128)
AICPU_FLOPS = 3.0e9  # numpy.fft (pocketfft) on one core, 5 n log2 n flops per row (half: rfft)
GM_BYTES = 10.0e9  # per core: a kernel's GM reads and writes
COMBINE_S = 1.5e-9  # per output pair of the rfft combine / irfft pre kernels (a reversed read)
# a six-step pass over strided columns (tiles, gathers, a transpose per tile): its flops count
# STRIDED times, and it has a fixed cost per pass
STRIDED = 2.5
SIXSTEP_PASS_S = 50e-6
HOST = (2, 16)  # (cores, float32 lanes) when the caller gives no host target
# tests and users may force a plan per kind ({"fft": "six-step"}); used when it is a candidate
FORCE: dict = {}


def _kernel(flops: float, nbytes: float, rate: float, host) -> float:
    cores, lanes = host
    return LAUNCH_S + max(flops / (rate * lanes * cores), nbytes / (GM_BYTES * cores))


def _fft_flops(n: int) -> float:
    return 5 * n * max(1.0, math.log2(n))


def _largest_prime(n: int) -> int:
    p, best = 2, 1
    while p * p <= n:
        while n % p == 0:
            best, n = p, n // p
        p += 1
    return max(best, n) if n > 1 else best


def vector_plan(n: int, ub_bytes: int | None) -> tuple[str, tuple] | None:
    """The Vector FFT of a power of two n, if there is one: ("stockham", radices) or
    ("six-step", (n1, n2)); None otherwise (what the packed rfft/irfft plans build on)."""
    if ub_bytes is None or n & (n - 1) or n < STOCKHAM_MIN:
        return None
    if n <= STOCKHAM_MAX:
        return ("stockham", stockham_radices(n)) if stockham_ub_bytes(n) <= ub_bytes else None
    n1 = 1 << ((n.bit_length() - 1 + 1) // 2)
    if n1 <= STOCKHAM_MAX and stockham_ub_bytes(n1) <= ub_bytes:
        return "six-step", (n1, n // n1)
    return None


def candidates(kind: str, n: int, ub_bytes: int | None) -> list[tuple[str, tuple]]:
    """The plans that exist for a transform of length n (irfft: its output length), in the
    order ties are broken: (implementation, factors)."""
    out: list[tuple[str, tuple]] = []
    if kind == "irfft":
        if n <= IRFFT_DIRECT_MAX:
            out.append(("direct", (n,)))
        if n % 2 == 0 and vector_plan(n // 2, ub_bytes) is not None:
            out.append(("packed", (n // 2,)))
        return out + [("aicpu", ())]
    vp = vector_plan(n, ub_bytes)
    if vp is not None and (vp[0] == "stockham" or kind != "rfft"):
        out.append(vp)  # (a six-step rfft is always packed)
    if kind == "rfft" and n % 2 == 0 and vector_plan(n // 2, ub_bytes) is not None:
        out.append(("packed", (n // 2,)))
    f = factors(n)
    if n & (n - 1) and ub_bytes is not None and _largest_prime(n) > BLUESTEIN_VECTOR_MIN:
        m = 1 << (2 * n - 2).bit_length()  # the power of two >= 2n - 1
        if m <= STOCKHAM_MAX and stockham_ub_bytes(m) <= ub_bytes:
            out.append(("bluestein-vector", stockham_radices(m)))
    if n <= PRIME_DIRECT_MAX:
        out.append(("direct", (n,)))
    if f is not None and len(f) > 1:
        out.append(("four-step", tuple(f)))
    bluestein = f is None or f[-1] > DIRECT_MAX
    if bluestein and (f is not None or BLUESTEIN_CUBE):
        out.append(("bluestein", tuple(factors(bluestein_size(n)))))
    if not (bluestein and BLUESTEIN_CUBE):  # BLUESTEIN_CUBE keeps those lengths on the AI Core
        out.append(("aicpu", ()))
    return out


def _vector_fft_s(n: int, rows: int, host, in_bytes: int = 8) -> float:
    if n <= STOCKHAM_MAX:
        return _kernel(rows * _fft_flops(n), rows * n * (in_bytes + 8), VECTOR_FLOPS, host)
    n1 = 1 << ((n.bit_length() - 1 + 1) // 2)
    n2 = n // n1
    first = _kernel(STRIDED * rows * (n2 * _fft_flops(n1) + 6 * n), rows * n * (in_bytes + 8),
                    VECTOR_FLOPS, host)  # fmt: skip
    second = _kernel(STRIDED * rows * n1 * _fft_flops(n2), rows * n * 16, VECTOR_FLOPS, host)
    return first + second + 2 * SIXSTEP_PASS_S


def _cube_fft_s(fs: tuple, rows: int, host, in_bytes: int = 8, m: int | None = None) -> float:
    """Direct ((n,)) or four-step DFT matmuls: 8 n per factor flops per row (direct: 8 n m, or
    4 n m for real rows), the twiddle Vector kernel of each level (reads y, writes the rotated
    rows R, twice its size) and, past two levels, the recursion's copies."""
    n = math.prod(fs)
    if len(fs) == 1:
        m = n if m is None else m
        flops = rows * (4 if in_bytes == 4 else 8) * n * m
        nbytes = rows * (n * in_bytes + 8 * m) + (n * in_bytes // 4) * 2 * m * 4
        return _kernel(flops, nbytes, CUBE_FLOPS, host)
    t = 0.0
    for i, f in enumerate(fs):
        t += _kernel(rows * 8 * n * f, rows * n * 16, CUBE_FLOPS, host)
        if i < len(fs) - 1:
            t += _kernel(rows * 6 * n, rows * n * 24, VECTOR_FLOPS, host)
        if 0 < i < len(fs) - 1:
            t += _kernel(0, rows * n * 16, VECTOR_FLOPS, host)
    return t


def _aicpu_s(kind: str, n: int, rows: int, host) -> float:
    slow = 2.5 if _largest_prime(n) > 32 else 1.0  # pocketfft: Bluestein past large primes
    real = 0.5 if kind in ("rfft", "irfft") else 1.0  # numpy's real transforms: half the work
    return (AICPU_S + rows * _fft_flops(n) * slow * real / AICPU_FLOPS
            + rows * n * 16 * real / GM_BYTES)  # fmt: skip


def estimate(kind: str, impl: str, fs: tuple, n: int, rows: int, host=None) -> float:
    """The cost model's host seconds for plan (impl, fs) of a length-n transform over `rows`
    rows (the docs' table)."""
    return CALL_S + _estimate(kind, impl, fs, n, max(rows, 1), host or HOST)


def _estimate(kind: str, impl: str, fs: tuple, n: int, rows: int, host) -> float:
    inb = 4 if kind == "rfft" else 8
    if impl == "aicpu":
        return _aicpu_s(kind, n, rows, host)
    if impl == "stockham":
        return _vector_fft_s(n, rows, host, inb)
    if impl == "six-step":
        return _vector_fft_s(n, rows, host, inb)
    if impl == "packed":  # rfft: FFT of n/2 + combine; irfft: pre kernel + inverse FFT of n/2
        h = fs[0]
        combine = COMBINE_S * rows * (h + 1) / host[0]
        if kind == "rfft" and h <= STOCKHAM_MAX and RFFT_FUSED:  # the combine in the kernel
            return _vector_fft_s(h, rows, host) + combine
        return (_vector_fft_s(h, rows, host) + combine
                + _kernel(rows * 10 * h, rows * 16 * (h + 1), VECTOR_FLOPS, host))  # fmt: skip
    if impl == "direct":
        if kind == "irfft":
            m = n // 2 + 1
            return _kernel(rows * 4 * m * n, rows * (8 * m + 4 * n) + 8 * m * n, CUBE_FLOPS, host)
        return _cube_fft_s(fs, rows, host, inb, n // 2 + 1 if kind == "rfft" else n)
    if impl == "four-step":
        return _cube_fft_s(fs, rows, host, inb)
    m = math.prod(fs)
    chirps = 3 * _kernel(rows * 6 * m, rows * m * 16, VECTOR_FLOPS, host)
    if impl == "bluestein-vector":
        return chirps + 2 * _vector_fft_s(m, rows, host)
    # bluestein on Cube transforms: two transforms of m, the chirps, an AI CPU zero pad
    return chirps + 2 * _cube_fft_s(fs, rows, host) + AICPU_S + rows * m * 8 / GM_BYTES


def _fmt_s(s: float) -> str:
    return f"{s * 1e3:.3g} ms" if s >= 1e-3 else f"{s * 1e6:.3g} us"


def describe(kind: str, impl: str, fs: tuple, n: int, rows: int, ub_bytes) -> str:
    """What plan (impl, fs) does, in words (the first part of its reason in lm.explain)."""
    if impl == "stockham":
        return (f"n={n} = {' x '.join(map(str, fs))}, {rows} row(s): one Vector kernel, every "
                f"radix-4/2 stage in UB ({stockham_ub_bytes(n)} B of {ub_bytes}), "
                f"~{5 * n * (n.bit_length() - 1)} flops per row")  # fmt: skip
    if impl == "six-step":
        n1, n2 = fs
        return (f"n={n} = {n1} x {n2}, {rows} row(s): two passes of the Vector Stockham kernel "
                f"({n2} strided columns of {n1}, times the twiddles, then {n1} of {n2}), "
                f"~{5 * n * (n.bit_length() - 1)} flops per row")  # fmt: skip
    if impl == "packed" and kind == "irfft":
        sub = vector_plan(n // 2, ub_bytes)[0]
        return (f"irfft n={n}: packed, one Vector kernel forms the half-length spectrum of "
                f"z_m = x_2m + i x_2m+1, then its inverse {sub} FFT of h={n // 2} is the real "
                "result")  # fmt: skip
    if impl == "packed":
        sub = vector_plan(n // 2, ub_bytes)[0]
        return (f"n={n}: the rows read as n/2 complex points, their Vector {sub} FFT of "
                f"{n // 2} and one combine kernel")  # fmt: skip
    if impl == "bluestein-vector":
        return (f"n={n}: Bluestein, a chirp convolution through two Vector Stockham FFTs of "
                f"m={math.prod(fs)} (chirp and filter products on the Vector unit)")  # fmt: skip
    if impl == "bluestein":
        m = math.prod(fs)
        return (f"n={n} has a prime factor > {PRIME_DIRECT_MAX}: Bluestein, a chirp convolution "
                f"through transforms of m={m} = {' x '.join(map(str, fs))}, "
                f"{bluestein_flops(m)} flops per row")  # fmt: skip
    if impl == "direct" and kind == "irfft":
        return f"irfft n={n}: one real-output DFT matmul"
    if impl == "direct":
        return f"n={n}: one DFT matmul, {8 * n * n} flops per row"
    if impl == "four-step":
        return (f"n={n} = {' x '.join(map(str, fs))}: DFT matmuls + twiddles, "
                f"{8 * n * sum(fs)} flops per row (direct would be {8 * n * n})")  # fmt: skip
    if factors(n) is None and not BLUESTEIN_CUBE and kind != "irfft":
        return (f"n={n} has a prime factor > {PRIME_DIRECT_MAX}: Bluestein through Cube "
                f"transforms of m={bluestein_size(n)} measured 1.7-3.2x slower than the AI "
                "CPU's numpy.fft on the host (BLUESTEIN_CUBE), so the AI CPU")  # fmt: skip
    return f"n={n}: the AI CPU's numpy.fft"


def candidate_times(kind: str, n: int, rows: int, ub_bytes, host=None) -> dict[str, float]:
    """label -> the cost model's seconds, for every candidate (label: impl, or impl:factors
    when an implementation has several)."""
    return {label(c): estimate(kind, *c, n, rows, host) for c in candidates(kind, n, ub_bytes)}


def label(c: tuple[str, tuple]) -> str:
    return c[0]


def times_text(times: dict[str, float], best: str) -> str:
    return ", ".join(f"{k} {_fmt_s(v)}{'*' if k == best else ''}" for k, v in times.items())


def explain_choice(kind, impl, fs, n, rows, ub_bytes, origin: str, times: dict) -> str:
    """The plan's reason for lm.explain: what it does, then where the choice came from and the
    candidates' times (estimated by the model, or measured)."""
    return (f"{describe(kind, impl, fs, n, rows, ub_bytes)} [chosen by {origin}: "
            f"{times_text(times, label((impl, fs)))}]")  # fmt: skip


def plan(kind: str, out_double: bool, n: int, empty: bool, rows: int = 1,
         ub_bytes: int | None = None, host=None) -> tuple[str, tuple, str]:  # fmt: skip
    """(implementation, factors, reason) the cost model picks for a transform of length `n`
    (the output length of irfft, the input length of the others) over `rows` rows, on a device
    with `ub_bytes` of UB per Vector core (None: the Vector plans are not candidates), on a
    host of `host` = (cores, float32 lanes). FORCE[kind] wins when it is a candidate."""
    return _plan(kind, out_double, n, empty, rows, ub_bytes, tuple(host or HOST),
                 FORCE.get(kind))  # fmt: skip


@functools.lru_cache(maxsize=256)
def _plan(kind, out_double, n, empty, rows, ub_bytes, host, forced) -> tuple[str, tuple, str]:
    if out_double:
        return "aicpu", (), "double precision stays on the AI CPU (the AI Core computes float32)"
    if empty:
        return "aicpu", (), "no elements to transform"
    cands = candidates(kind, n, ub_bytes)
    times = {label(c): estimate(kind, *c, n, rows, host) for c in cands}
    pick = next((c for c in cands if c[0] == forced), None)
    origin = f"FORCE[{kind!r}]" if pick is not None else "the cost model"
    if pick is None:
        pick = min(cands, key=lambda c: times[label(c)])
    return (*pick, explain_choice(kind, *pick, n, rows, ub_bytes, origin, times))


# the tensor layer's per-process answers (model or measured) per transform signature
MEMO: dict = {}


GEN = 0  # bumped when MEMO is cleared: a memoized join (fast_join) of an older plan is stale


def fast_key(kind: str, x, n, ax: int, norm, packed: bool) -> tuple:
    """The key of a transform's memoized join in the tensor layer's per-input memo: everything
    besides the input node that the plan and its graph depend on."""
    return ("join", kind, n, ax, norm, x._device, packed, RFFT_FUSED, settings.TARGET_CPU.get())


def fast_join(memo, kind: str, x, n, axis, norm, packed: bool, forced) -> tuple | None:
    """The memoized join arguments (dtype, shape, srcs, arg, axis, GEN) of the same transform
    of the same realized tensor `x`, or None.

    A repeated transform (a benchmark loop, a fixed filter bank) then skips validation and the
    plan: ~2 of the ~4.5 us a 4096-point fft spent in Python before its realize (issue 35:
    one 4096-point fft at least as fast as numpy's). None whenever the plan may differ:
    autotuning on, a forced plan (FORCE, or `forced` while candidates are timed), MEMO cleared
    since (GEN), another axis form or argument the slow path must validate."""
    entries = memo.get(x._node) if x._node.realized is not None else None
    if not entries or type(axis) is not int or not -x.ndim <= axis < x.ndim:
        return None
    if FORCE or forced or settings.AUTOTUNE.get():
        return None
    try:  # an unhashable n or norm: the slow path raises the clear error
        join = entries.get(fast_key(kind, x, n, axis % x.ndim, norm, packed))
    except TypeError:
        return None
    return join if join is not None and join[5] == GEN else None


def _clear() -> None:
    global GEN
    _plan.cache_clear()
    MEMO.clear()
    GEN += 1


plan.cache_clear = _clear  # (tests shrink the structural limits)


@functools.lru_cache(maxsize=64)
def bluestein_size(n: int) -> int:
    """The convolution length of Bluestein's algorithm for n: the m >= 2n - 1 of the form
    2^a 3^b 5^c whose plan has the fewest levels (each level is a Vector pass and, past two,
    a transpose copy; small factors make small, inefficient matmuls), then the fewest flops."""
    lo = 2 * n - 1
    best, cost = None, None
    top = 1 << (lo - 1).bit_length()
    for m in range(lo, top + 1):
        r = m
        for p in (2, 3, 5):
            while r % p == 0:
                r //= p
        if r != 1:
            continue
        f = factors(m)
        c = None if f is None else (len(f), 8 * m * sum(f))
        if c is not None and (cost is None or c < cost):
            best, cost = m, c
    return best


def bluestein_flops(m: int) -> int:
    """Matmul flops per row of Bluestein through length m: a forward and an inverse transform
    (the chirp products are elementwise: 3 x 6m more)."""
    return 2 * 8 * m * sum(factors(m))


def _chirp(n: int, sign: int) -> np.ndarray:
    t = np.arange(n)
    return np.exp(sign * 1j * np.pi * ((t * t) % (2 * n)) / n)  # exact angles mod 2 pi


@functools.lru_cache(maxsize=64)
def chirp(n: int, sign: int, scale: float, which: int) -> np.ndarray:
    """(n, 2) tables of c_t = exp(sign i pi t^2 / n) times `scale`: which=0 the pairs (Re c,
    Im c) (a real x times it is x c as a pair), which=1 the pairs (-Im c, Re c): with
    which=0, xr * T0 + xi * T1 is the complex product x c as (real, imaginary) pairs."""
    c = _chirp(n, sign) * scale
    return _ro(np.stack([-c.imag, c.real], -1) if which else np.stack([c.real, c.imag], -1))


@functools.lru_cache(maxsize=64)
def bluestein_filter(n: int, m: int, sign: int, which: int) -> np.ndarray:
    """(m, 2): the length-m DFT of Bluestein's filter b_j = exp(-sign i pi j^2 / n) (j in
    (-n, n), cyclic), divided by m (the inverse transform's 1/m), as `chirp`'s two tables."""
    b = np.zeros(m, complex)
    c = np.conj(_chirp(n, sign))
    b[:n] = c
    b[m - n + 1 :] = c[1:][::-1]
    f = np.fft.fft(b) / m
    return _ro(np.stack([-f.imag, f.real], -1) if which else np.stack([f.real, f.imag], -1))


def _dft(n: int, sign: int) -> np.ndarray:
    k = np.arange(n)
    # exact angles: reduce k*t mod n in integers before scaling (keeps float64 accuracy at large n)
    return np.exp(sign * 2j * np.pi * ((np.outer(k, k) % n) / n))


def _ro(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a, dtype=np.float32)
    a.flags.writeable = False
    return a


@functools.lru_cache(maxsize=64)
def direct_matrix(n: int, sign: int, scale: float, real_input: bool, m: int) -> np.ndarray:
    """The direct DFT of length n on interleaved data, times `scale`: rows (t, plane) (rows t for
    a real input), columns (k, plane') for the first m frequencies: in @ M is the transform of
    rows of complex64 viewed as float32 pairs, and its result is complex64 in C order."""
    f = _dft(n, sign)[:, :m] * scale  # [t, k]
    if real_input:
        return _ro(np.stack([f.real, f.imag], axis=-1).reshape(n, 2 * m))
    m4 = np.empty((n, 2, m, 2))
    m4[:, 0, :, 0], m4[:, 0, :, 1] = f.real, f.imag  # Re x contributes Re F, Im F
    m4[:, 1, :, 0], m4[:, 1, :, 1] = -f.imag, f.real  # Im x contributes -Im F, Re F
    return _ro(m4.reshape(2 * n, 2 * m))


@functools.lru_cache(maxsize=64)
def first_matrix(n1: int, sign: int) -> np.ndarray:
    """Step 1 of the four-step plan, (2 n1, n1): rows (q, k1) = [Re F; Im F] of the length-n1
    DFT, applied from the left to each (t1, (t2, plane)) slab of the input."""
    f = _dft(n1, sign)
    return _ro(np.concatenate([f.real, f.imag], axis=0))


@functools.lru_cache(maxsize=64)
def last_matrix(n2: int, sign: int, scale: float) -> np.ndarray:
    """Step 3 of the four-step plan, (n2, 2 n2): columns (q, t2) = [Re F, -Im F] of the
    length-n2 DFT times `scale`, applied from the left to the rotated rows R of `twiddles`."""
    f = _dft(n2, sign) * scale
    return _ro(np.concatenate([f.real, -f.imag], axis=1))


@functools.lru_cache(maxsize=64)
def twiddles(n1: int, n2: int, sign: int, which: int) -> np.ndarray:
    """TA (which=0) or TB (which=1), each (2, n2, n1, 2) over [q, t2, k1, plane']: with yr, yi
    the real and imaginary parts of the step-1 DFT y[k1, t2], R = yr * TA + yi * TB holds
    y' = y * w**(k1 t2) (w = exp(sign 2 pi i / (n1 n2))) as [[Re y', Im y'], [Im y', -Re y']]:
    the rows of the step-3 matmul whose result is complex in C order (plane' innermost)."""
    n = n1 * n2
    e = (np.outer(np.arange(n2), np.arange(n1)) % n) / n  # [t2, k1]
    c, s = np.cos(2 * np.pi * e), sign * np.sin(2 * np.pi * e)
    if which == 0:
        t = np.stack([np.stack([c, s], -1), np.stack([s, -c], -1)])
    else:
        t = np.stack([np.stack([-s, c], -1), np.stack([c, s], -1)])
    return _ro(t)


@functools.lru_cache(maxsize=64)
def twiddle_pairs(n1: int, n2: int, sign: int, which: int) -> np.ndarray:
    """A (which=0) or B (which=1), each (n1, n2, 2) over [k1, t2, plane]: yr * A + yi * B is
    y * w**(k1 t2) as (real, imaginary) pairs (the recursive plan's rows)."""
    n = n1 * n2
    e = (np.outer(np.arange(n1), np.arange(n2)) % n) / n
    c, s = np.cos(2 * np.pi * e), sign * np.sin(2 * np.pi * e)
    return _ro(np.stack([-s, c], -1) if which else np.stack([c, s], -1))


@functools.lru_cache(maxsize=64)
def irfft_matrix(m: int, n: int, scale: float, real_input: bool) -> np.ndarray:
    """(2m, n): the interleaved spectrum (Re X_0, Im X_0, Re X_1, ...) @ M = the real inverse of
    length n of the Hermitian spectrum X (m = n // 2 + 1), times `scale` ((m, n), the real parts
    only, for a real input). The imaginary parts of X_0 and of X_{n/2} (n even) get weight 0, as
    numpy (pocketfft) ignores them."""
    k = np.arange(m)[:, None]
    t = np.arange(n)[None, :]
    ang = 2 * np.pi * ((k * t) % n) / n
    w = np.full((m, 1), 2.0)
    w[0] = 1.0
    if n % 2 == 0:
        w[m - 1] = 1.0
    if real_input:
        return _ro(w * np.cos(ang) * scale)
    return _ro(np.stack([w * np.cos(ang), -w * np.sin(ang)], axis=1).reshape(2 * m, n) * scale)


def norm_scale(norm: str | None, n: int, inverse: bool) -> float:
    """numpy.fft's factor: backward scales the inverse by 1/n, forward the forward transform,
    ortho both by 1/sqrt(n)."""
    if norm == "ortho":
        return 1 / math.sqrt(n)
    if (norm in (None, "backward")) == inverse:
        return 1 / n
    return 1.0


# ----------------------------------------------------------------------------- Vector Stockham


def stockham_radices(n: int) -> tuple[int, ...]:
    """The radices of the Vector Stockham FFT of a power of two n, in processing order: one
    radix-2 stage first when log2(n) is odd, then radix-4 stages."""
    levels = n.bit_length() - 1
    return (2,) * (levels % 2) + (4,) * (levels // 2)


# A middle stage of the Vector Stockham FFT whose stride s is at least this runs as q / s runs
# of s contiguous inputs with one twiddle per run and input (templates/fft.py `_run_stage`);
# a smaller stride gathers its inputs through an index table. Hardware gathers are slow on Zen 4
# (~8 cycles per 16 lanes): fft 256 x 4096 single-threaded 5.1 -> 3.1-3.7 ms with 4 (4.1-4.3
# with 16; the runs of 4 are narrow vectors, still cheaper than the gathers)
RUN_MIN = 4


def stockham_stages(n: int) -> list[tuple[int, int, int, int, int]]:
    """(radix r, stride s, tw offset, ix offset, q = n // r) per stage. Stage t (n_t = r_1 ...
    r_t, s = n / n_t) maps a[k + s j] (k = p s + q', p = k // s, reading in[p s r + q' + s j])
    times w_(n_t)^(j p) through the length-r DFT to out[k + j' n / r]; the first stage has no
    twiddles and reads the input contiguously (its index is k). A middle stage with s >=
    RUN_MIN (a run stage; they come before the gathered ones, s falls) has q / s twiddles per
    j (one per run p) and no index table; the others q per j and q indices."""
    out, nt, tw, ix = [], 1, 0, 0
    for r in stockham_radices(n):
        nt *= r
        q = n // r
        s = n // nt
        out.append((r, s, tw, ix, q))
        if nt > r and s >= RUN_MIN:
            tw += 2 * (r - 1) * (q // s)
        elif nt > r:
            tw += 2 * (r - 1) * q
            ix += q
    return out


def run_twiddles(n: int) -> int:
    """Floats of the run stages' twiddles: the prefix of the twiddle table the Vector Stockham
    kernel keeps in UB (read once per block, broadcast per run)."""
    return sum(2 * (r - 1) * (q // s) for i, (r, s, _t, _x, q) in enumerate(stockham_stages(n))
               if i and s >= RUN_MIN)  # fmt: skip


@functools.lru_cache(maxsize=64)
def stockham_tables(n: int, sign: int, which: int) -> np.ndarray:
    """The constant tables of the Vector Stockham FFT (`stockham_stages` gives the offsets):
    which=0 the twiddles, float32, per stage after the first and j = 1 .. r-1 the real then
    the imaginary parts of w_(n_t)^(j (k // s)) for k < n / r (a run stage: of w_(n_t)^(j p)
    for the runs p < n / (r s)); which=1 the gather indices, int32, per gathered stage
    k + (k // s) s (r - 1) for k < n / r."""
    tw, ix = [], []
    nt = 1
    for r, s, _tw, _ix, q in stockham_stages(n):
        nt *= r
        if nt == r:
            continue
        run = s >= RUN_MIN  # one twiddle per run p of s elements
        k = np.arange(q // s if run else q)
        p = k if run else k // s
        for j in range(1, r):
            w = np.exp(sign * 2j * np.pi * ((j * p) % nt) / nt)
            tw += [w.real, w.imag]
        if not run:
            ix.append(k + p * s * (r - 1))
    if which == 0:
        return _ro(np.concatenate(tw) if tw else np.zeros(1))
    a = np.ascontiguousarray(np.concatenate(ix) if ix else np.zeros(1), dtype=np.int32)
    a.flags.writeable = False
    return a


def stockham_ub_bytes(n: int) -> int:
    """UB the Vector Stockham kernel declares for length n: two (real, imaginary) planes to
    ping-pong between stages and its stage temporaries."""
    rs = stockham_radices(n)
    return (4 * (4 * n + 25 * (n // 4) + (4 * (n // 2) if 2 in rs else 0) + n // 2
                 + run_twiddles(n)) + 64 * 64)  # fmt: skip


@functools.lru_cache(maxsize=16)
def sixstep_twiddles(n1: int, n2: int, sign: int) -> np.ndarray:
    """(n2, n1, 2) float32: w_n^(t2 k1) (n = n1 n2) as (real, imaginary) pairs, what the
    six-step plan's first pass multiplies its row t2 (frequencies k1) by."""
    n = n1 * n2
    e = (np.outer(np.arange(n2), np.arange(n1)) % n) / n
    w = np.exp(sign * 2j * np.pi * e)
    return _ro(np.stack([w.real, w.imag], -1))


def tile_columns(n: int, rows: int, real: bool, out_tiles: bool, ub_bytes: int) -> int:
    """Columns per tile of a strided pass of the six-step plan (length-n transforms of `rows`
    columns): the most of 8, 4, 2 (dividing `rows`) whose tiles (the input tile and its
    indices; with `out_tiles` the results, their transpose and its indices) fit in UB beside
    the row kernel's buffers; 1: no tiles."""
    for c in (8, 4, 2):
        wid = c if real else 2 * c
        tiles = 4 * (n * wid + n + (6 * c * n if out_tiles else 0))
        if rows % c == 0 and stockham_ub_bytes(n) + tiles <= ub_bytes:
            return c
    return 1


@functools.lru_cache(maxsize=16)
def tile_tables(cols: int, n: int, real: bool, which: int) -> np.ndarray:
    """int32 gather indices of a tiled strided pass: which=0 the column read (k * width, the
    tile's row of `cols` values or pairs), which=1 the transpose of the results (planes, rows
    of n) into (element, column) pairs: out[(k cols + c) 2 + e] = res[(e cols + c) n + k]."""
    wid = cols if real else 2 * cols
    if which == 0:
        a = np.arange(n) * wid
    else:
        k, c, e = np.meshgrid(np.arange(n), np.arange(cols), np.arange(2), indexing="ij")
        a = ((e * cols + c) * n + k).reshape(-1)
    a = np.ascontiguousarray(a, dtype=np.int32)
    a.flags.writeable = False
    return a


@functools.lru_cache(maxsize=16)
def reverse_index(h: int) -> np.ndarray:
    """int32 (h + 1,): (h - k) mod h for k = 0 .. h, the B = Z[(h - k) mod h] gather of the
    packed rfft's combine inside the Stockham kernel (templates/fft.py mode "rfused")."""
    a = np.ascontiguousarray((h - np.arange(h + 1)) % h, dtype=np.int32)
    a.flags.writeable = False
    return a


@functools.lru_cache(maxsize=16)
def rfft_twiddles(n: int) -> np.ndarray:
    """(n // 2 + 1, 2) float32: w^k = exp(-2 pi i k / n), k = 0 .. n / 2, as pairs (the rfft's
    post-processing of a half-length complex FFT)."""
    k = np.arange(n // 2 + 1)
    w = np.exp(-2j * np.pi * k / n)
    return _ro(np.stack([w.real, w.imag], -1))
