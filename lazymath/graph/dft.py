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
  stockham   powers of two from STOCKHAM_MIN to STOCKHAM_MAX whose stages fit in UB, batches up
             to STOCKHAM_ELEMENTS: one Vector kernel (backend/templates/fft.py), every radix-4/2
             stage of a row in UB (measured faster than the four-step Cube plan at every batch
             tried on the host).
  six-step   powers of two above STOCKHAM_MAX: two passes of the Vector Stockham kernel over
             strided columns (n1 columns of n2, times the twiddles, then n2 of n1); rfft of these
             (and of Stockham lengths >= RFFT_PACKED_MIN) reads its real rows as n/2 complex
             points and one Vector kernel combines the halves (tensor._rfft_packed).
  bluestein-vector  a prime factor above BLUESTEIN_VECTOR_MIN when the power of two
             m >= 2n - 1 is a Stockham length: the chirp convolution through two Vector
             Stockham FFTs of m.
  bluestein  lengths with a prime factor above PRIME_DIRECT_MAX (or whose plan would hold a
             direct DFT of BLUESTEIN_RATIO x Bluestein's flops): the chirp convolution
             X_k = c_k sum_t (x_t c_t) b_(k-t), c_t = exp(sign i pi t^2 / n), b = conj(c),
             through a forward and an inverse transform of a 5-smooth m >= 2n - 1 (the filter's
             spectrum is a constant table); the chirp products are Vector kernels, the zero
             padding to m an AI CPU pad.
  aicpu      the AI CPU's numpy.fft: double precision (complex128 results; the AI Core computes
             in float16/float32), empty inputs, irfft longer than IRFFT_DIRECT_MAX without
             a packed plan.
  packed     irfft of n = 2h > IRFFT_DIRECT_MAX: a Vector kernel (templates/fft.py mode
             "ipre") forms Z = (A + conj B) + i w^-k (A - conj B), A = X[k], B = X[h - k], and
             the inverse Vector FFT of Z (Stockham or six-step) is z_m = x_2m + i x_2m+1, the
             real result in C order (no AI CPU step).

`plan(...)` returns the choice with its reason; the reason is recorded on the graph and
printed by `lm.explain` (the fusion log's "fft" entries). The rule (docs/fft_conv.md):

  result double (complex128/float64) -> aicpu
  0 elements in or out               -> aicpu (nothing to compute)
  irfft                              -> direct up to IRFFT_DIRECT_MAX, else packed (n even,
                                        n / 2 a Stockham/six-step length), else aicpu
  a power of two that fits the Vector unit -> stockham (six-step above STOCKHAM_MAX)
  a prime factor > BLUESTEIN_VECTOR_MIN, m a Stockham length -> bluestein-vector
  no plan from factors (a prime factor > PRIME_DIRECT_MAX) -> aicpu (bluestein if BLUESTEIN_CUBE)
  a plan with a direct DFT > DIRECT_MAX and > BLUESTEIN_RATIO x Bluestein's flops -> bluestein
  n <= DIRECT_MAX, or no factor in [2, FACTOR_MAX] -> direct
  otherwise                          -> four-step (n1 = the factor nearest sqrt(n))

The thresholds are measured on the host (the comments at each constant say where); the rule does
not yet weigh the cost model's estimate of each candidate.

Tables (DFT matrices, twiddles, chirps) are built once per (length, direction, scale) and
cached.
"""

from __future__ import annotations

import functools
import math
import weakref

import numpy as np

DIRECT_MAX = 128  # a length up to this is one DFT matmul (8n^2 flops per row)
FACTOR_MAX = 128  # four-step: the short DFT n1 is at most this
PRIME_DIRECT_MAX = 2048  # lengths with no factor <= FACTOR_MAX: direct up to this, else aicpu
IRFFT_DIRECT_MAX = 4096  # irfft on the Cube is one direct matmul (real output) up to this
BLUESTEIN_RATIO = 4  # Bluestein replaces a plan with a long direct DFT when that is 4x its flops
# Bluestein on Cube transforms (m > STOCKHAM_MAX) was 1.7-3.2x slower than the AI CPU's
# numpy.fft on the host (64 x 4099, session 3): those lengths go to the AI CPU unless this is set
BLUESTEIN_CUBE = False
BLUESTEIN_VECTOR_MIN = 128  # a prime factor > this: Bluestein on two Vector Stockham FFTs
STOCKHAM_MIN = 4  # powers of two from this length ...
STOCKHAM_MAX = 4096  # ... up to this one (and what fits in UB) may take the Vector Stockham FFT
# ... when the batch holds at most this many elements: on the host the Vector kernel beat the
# four-step Cube plan at every batch measured (1 to 1024 rows of 4096: 6x at 1024 rows, where
# the Cube plan's three passes over the data and its small-K GEMMs cost most); larger batches,
# not measured, keep the Cube plan
STOCKHAM_ELEMENTS = 1 << 22
# rfft of a Stockham length from this n on: packed (the real rows read as n/2 complex points,
# their Stockham FFT, one combine kernel; tensor._rfft_packed) instead of one Stockham kernel
# over the rows as complex with zero imaginary parts. Measured (session 5, load 4-6, medians):
# n = 4096 x 1 / 16 / 1024 rows 0.13 / 0.76 / 32.0 ms -> 0.08 / 0.49 / 19.6 ms, 1 x 2048 0.075 ->
# 0.055 ms; at n <= 1024 mixed (256 x 512 0.28 -> 0.46 ms, 4 x 1024 0.074 -> 0.088)
RFFT_PACKED_MIN = 2048


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


@functools.lru_cache(maxsize=64)
def plan(kind: str, out_double: bool, n: int, empty: bool, rows: int = 1,
         ub_bytes: int | None = None) -> tuple[str, tuple, str]:  # fmt: skip
    """(implementation, factors, reason) for a transform of length `n` (the output length of
    irfft, the input length of the others) over `rows` rows, on a device with `ub_bytes` of UB
    per Vector core (None: the Vector implementation is not considered)."""
    if out_double:
        return "aicpu", (), "double precision stays on the AI CPU (the AI Core computes float32)"
    if empty:
        return "aicpu", (), "no elements to transform"
    if kind == "irfft":
        if n <= IRFFT_DIRECT_MAX:
            return "direct", (n,), f"irfft n={n} <= {IRFFT_DIRECT_MAX}: one real-output DFT matmul"
        sub = plan("fft", False, n // 2, False, rows, ub_bytes) if n % 2 == 0 else None
        if sub is not None and sub[0] in ("stockham", "six-step"):
            return (
                "packed",
                (n // 2,),
                (
                    f"irfft n={n} > {IRFFT_DIRECT_MAX}: packed, one Vector kernel forms the "
                    f"half-length spectrum of z_m = x_2m + i x_2m+1, then its inverse "
                    f"{sub[0]} FFT of h={n // 2} is the real result"
                ),
            )
        return "aicpu", (), (f"irfft n={n} > {IRFFT_DIRECT_MAX}: no packed plan (n odd, or "
                             "n / 2 not a power of two the Vector FFT takes)")  # fmt: skip
    if (ub_bytes is not None and n & (n - 1) == 0 and STOCKHAM_MIN <= n <= STOCKHAM_MAX
            and rows * n <= STOCKHAM_ELEMENTS and stockham_ub_bytes(n) <= ub_bytes):  # fmt: skip
        rs = stockham_radices(n)
        return (
            "stockham",
            rs,
            (
                f"n={n} = {' x '.join(map(str, rs))}, {rows} row(s) ({rows * n} <= "
                f"{STOCKHAM_ELEMENTS} elements): one Vector kernel, every radix-4/2 stage in UB "
                f"({stockham_ub_bytes(n)} B of {ub_bytes}), ~{5 * n * (n.bit_length() - 1)} "
                "flops per row"
            ),
        )
    if ub_bytes is not None and n & (n - 1) == 0 and n > STOCKHAM_MAX:
        n1 = 1 << ((n.bit_length() - 1 + 1) // 2)
        n2 = n // n1
        if (n1 <= STOCKHAM_MAX and stockham_ub_bytes(n1) <= ub_bytes
                and rows * n <= STOCKHAM_ELEMENTS):  # fmt: skip
            return (
                "six-step",
                (n1, n2),
                (
                    f"n={n} = {n1} x {n2}, {rows} row(s): two passes of the Vector Stockham "
                    f"kernel ({n2} strided columns of {n1}, times the twiddles, then {n1} of "
                    f"{n2}), ~{5 * n * (n.bit_length() - 1)} flops per row"
                ),
            )
    f = factors(n)
    if f is None or f[-1] > BLUESTEIN_VECTOR_MIN:  # a long direct DFT (a prime factor)
        m = 1 << (2 * n - 2).bit_length()  # the power of two >= 2n - 1
        fits = ub_bytes is not None and m <= STOCKHAM_MAX and stockham_ub_bytes(m) <= ub_bytes
        if fits and rows * m <= STOCKHAM_ELEMENTS:
            what = "a prime factor" if f is None else f"a direct DFT of {f[-1]}"
            return (
                "bluestein-vector",
                stockham_radices(m),
                (
                    f"n={n} has {what} > {BLUESTEIN_VECTOR_MIN}: Bluestein, a chirp convolution "
                    f"through two Vector Stockham FFTs of m={m} (chirp and filter products on "
                    "the Vector unit)"
                ),
            )
    if f is None or f[-1] > DIRECT_MAX:  # Bluestein on Cube transforms, or the AI CPU
        m = bluestein_size(n)
        blue = bluestein_flops(m)
    if f is None and not BLUESTEIN_CUBE:
        return (
            "aicpu",
            (),
            (
                f"n={n} has a prime factor > {PRIME_DIRECT_MAX}: Bluestein through Cube "
                f"transforms of m={m} measured 1.7-3.2x slower than the AI CPU's numpy.fft "
                "on the host (BLUESTEIN_CUBE), so the AI CPU"
            ),
        )
    if f is None:
        fs = tuple(factors(m))
        return (
            "bluestein",
            fs,
            (
                f"n={n} has a prime factor > {PRIME_DIRECT_MAX}: Bluestein, a chirp convolution "
                f"through transforms of m={m} = {' x '.join(map(str, fs))}, {blue} flops per row"
            ),
        )
    flops = 8 * n * sum(f)
    if f[-1] > DIRECT_MAX and flops > BLUESTEIN_RATIO * blue:
        fs = tuple(factors(m))
        return (
            "bluestein",
            fs,
            (
                f"n={n} = {' x '.join(map(str, f))} would be {flops} flops per row (a direct "
                f"DFT of {f[-1]}): Bluestein through m={m} = {' x '.join(map(str, fs))} is {blue}, "
                f"under 1/{BLUESTEIN_RATIO} of it"
            ),
        )
    if len(f) == 1:
        why = (f"n={n} <= {DIRECT_MAX}" if n <= DIRECT_MAX
               else f"n={n} has no factor <= {FACTOR_MAX}")  # fmt: skip
        return "direct", tuple(f), f"{why}: one DFT matmul, {8 * n * n} flops per row"
    return (
        "four-step",
        tuple(f),
        (
            f"n={n} = {' x '.join(map(str, f))}: DFT matmuls + twiddles, {flops} flops per row "
            f"(direct would be {8 * n * n})"
        ),
    )


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


def stockham_stages(n: int) -> list[tuple[int, int, int, int, int]]:
    """(radix r, stride s, tw offset, ix offset, q = n // r) per stage. Stage t (n_t = r_1 ...
    r_t, s = n / n_t) maps a[k + s j] (k = p s + q', p = k // s, reading in[p s r + q' + s j])
    times w_(n_t)^(j p) through the length-r DFT to out[k + j' n / r]; the first stage has no
    twiddles and reads the input contiguously (its index is k)."""
    out, nt, tw, ix = [], 1, 0, 0
    for r in stockham_radices(n):
        nt *= r
        q = n // r
        out.append((r, n // nt, tw, ix, q))
        if nt > r:
            tw += 2 * (r - 1) * q
            ix += q
    return out


@functools.lru_cache(maxsize=64)
def stockham_tables(n: int, sign: int, which: int) -> np.ndarray:
    """The constant tables of the Vector Stockham FFT (`stockham_stages` gives the offsets):
    which=0 the twiddles, float32, per stage after the first and j = 1 .. r-1 the real then
    the imaginary parts of w_(n_t)^(j (k // s)) for k < n / r; which=1 the gather indices,
    int32, per stage after the first k + (k // s) s (r - 1) for k < n / r."""
    tw, ix = [], []
    nt = 1
    for r, s, _tw, _ix, q in stockham_stages(n):
        nt *= r
        if nt == r:
            continue
        k = np.arange(q)
        p = k // s
        for j in range(1, r):
            w = np.exp(sign * 2j * np.pi * ((j * p) % nt) / nt)
            tw += [w.real, w.imag]
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
    return 4 * (4 * n + 25 * (n // 4) + (4 * (n // 2) if 2 in rs else 0) + n // 2) + 64 * 64


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
def rfft_twiddles(n: int) -> np.ndarray:
    """(n // 2 + 1, 2) float32: w^k = exp(-2 pi i k / n), k = 0 .. n / 2, as pairs (the rfft's
    post-processing of a half-length complex FFT)."""
    k = np.arange(n // 2 + 1)
    w = np.exp(-2j * np.pi * k / n)
    return _ro(np.stack([w.real, w.imag], -1))
