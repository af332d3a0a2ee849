"""FFT plans: which implementation a transform gets, and its constant tables.

An FFT of length n on the AI Core is matrix products (the Cube) on real planes: a complex
vector is held as two float32 rows (real, imaginary), and a length-n DFT is one real matmul
against the 2n x 2n block matrix [[Re F, -Im F], [Im F, Re F]] (or the 2n x n matrix
[[Re F], [Im F]] for a real input). Two implementations:

  direct     one DFT matmul: (batch, 2n) @ (2n, 2n). For short lengths (and primes up to
             PRIME_DIRECT_MAX: no factorization to exploit) its 8n^2 flops per row beat the
             passes of a factorized plan.
  four-step  n = n1 * n2 (Cooley-Tukey, recursively on n2): a DFT of length n1 over the
             strided columns (a Cube matmul against the DFT matrix), the twiddle multiply
             (a Vector kernel), a DFT of length n2 (a Cube matmul); 8n(n1 + n2) flops per row.
  aicpu      the AI CPU's numpy.fft: double precision (complex128 results; the AI Core computes
             in float16/float32), empty inputs, and lengths with a prime factor above
             PRIME_DIRECT_MAX (Bluestein is not implemented).

`plan(...)` returns the choice with its reason; the reason is recorded on the graph and
printed by `lm.explain` (the fusion log's "fft" entries). The rule (docs/fft_conv.md):

  result double (complex128/float64) -> aicpu
  0 elements in or out               -> aicpu (nothing to compute)
  n <= DIRECT_MAX                    -> direct
  n has a factor in [2, FACTOR_MAX]  -> four-step (n1 = the factor nearest sqrt(n))
  n <= PRIME_DIRECT_MAX              -> direct
  otherwise                          -> aicpu

Tables (DFT matrices, twiddles) are built once per (length, direction, scale) and cached.
"""

from __future__ import annotations

import functools
import math

import numpy as np

DIRECT_MAX = 128  # a length up to this is one DFT matmul (8n^2 flops per row)
FACTOR_MAX = 128  # four-step: the short DFT n1 is at most this
PRIME_DIRECT_MAX = 2048  # lengths with no factor <= FACTOR_MAX: direct up to this, else aicpu
IRFFT_DIRECT_MAX = 4096  # irfft on the Cube is one direct matmul (real output) up to this


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
def plan(kind: str, out_double: bool, n: int, empty: bool) -> tuple[str, tuple, str]:
    """(implementation, factors, reason) for a transform of length `n` (the output length of
    irfft, the input length of the others)."""
    if out_double:
        return "aicpu", (), "double precision stays on the AI CPU (the AI Core computes float32)"
    if empty:
        return "aicpu", (), "no elements to transform"
    if kind == "irfft":
        if n <= IRFFT_DIRECT_MAX:
            return "direct", (n,), f"irfft n={n} <= {IRFFT_DIRECT_MAX}: one real-output DFT matmul"
        return "aicpu", (), f"irfft n={n} > {IRFFT_DIRECT_MAX}: no factorized real-output plan yet"
    f = factors(n)
    if f is None:
        return (
            "aicpu",
            (),
            (f"n={n} has a prime factor > {PRIME_DIRECT_MAX} (Bluestein is not implemented)"),
        )
    if len(f) == 1:
        why = (f"n={n} <= {DIRECT_MAX}" if n <= DIRECT_MAX
               else f"n={n} has no factor <= {FACTOR_MAX}")  # fmt: skip
        return "direct", tuple(f), f"{why}: one DFT matmul, {8 * n * n} flops per row"
    flops = 8 * n * sum(f)
    return (
        "four-step",
        tuple(f),
        (
            f"n={n} = {' x '.join(map(str, f))}: DFT matmuls + twiddles, {flops} flops per row "
            f"(direct would be {8 * n * n})"
        ),
    )


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
