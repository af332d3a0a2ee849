"""Vector kernels of the Array API's scans, sorts and searches (`cumulative_sum`,
`cumulative_prod`, `sort`, `argsort`, `searchsorted`), written with `lazymath.kernel` (the
low-level API users have: docs/custom_kernels.md). Each is one graph node (a fusion boundary:
its input is written to GM dense by the kernel before it, its consumers start a new kernel);
`lm.explain` / `lm.schedule` show them as Vector kernels named `scan_add`, `bitonic_sort`,
`search_sorted`.

Unit choice (what `lm.explain` shows and why):
- scans run on the Vector unit, vectorized across the independent lines: the scanned axis is
  moved first (a lazy permute made dense by the producer kernel) so each step is one vector
  add of a whole row of lines onto the running total. The order of the additions is numpy's
  (sequential), so results are bit-identical to numpy's cumsum/cumprod.
- sorts are a bitonic network on the Vector unit, one row resident in UB: each of the
  log2(N)(log2(N)+1)/2 stages gathers every element's partner (`vgather` with the stage's
  permutation i ^ j), compares (value, index) pairs with numpy's order (NaN last; ties by
  index: stable, also descending) and selects, all in full-length vector instructions. The
  network needs the whole row in UB, so rows up to `SORT_MAX` elements (4096) sort on the
  Vector unit; longer rows, and the dtypes the AI Core has no Vector instructions for
  (float64, int16, unsigned, complex), run numpy on the AI CPU (the host) at the call.
- searchsorted is a vectorized binary search on the Vector unit (the sorted table resident in
  UB, up to `SEARCH_MAX` elements; every query in a lane: log2(n) + 1 gather/compare/select
  steps).
"""

from __future__ import annotations

import math

import numpy as np

from lazymath import dtypes as dt
from lazymath.backend.npu.isa import imin
from lazymath.lowlevel import ceil_div, kernel

SORT_MAX = 4096  # the longest row the bitonic kernel holds in UB (float32/int64 + tables)
SEARCH_MAX = 8192  # the longest sorted table searchsorted keeps in UB
SCAN_WIDTH = 1024  # lines per vector instruction of a scan
VECTOR_DTYPES = (dt.float16, dt.float32, dt.int8, dt.int32, dt.int64)


def vector_dtype(d: np.dtype) -> bool:
    """Whether the Vector unit computes in `d` (the AI Core dtypes; bool goes through int8)."""
    return np.dtype(d) in VECTOR_DTYPES


# orders are kept by widening: what sort and searchsorted compare these dtypes in
_ORDER_AS = {dt.bool_: dt.int8, dt.int16: dt.int32, dt.uint8: dt.int32, dt.uint16: dt.int32,
             dt.uint32: dt.int64}  # fmt: skip


def order_dtype(d: np.dtype) -> np.dtype | None:
    """The dtype a sort or search of `d` values runs in on the Vector unit (`d` itself, or a
    wider signed integer that keeps the order exactly), None for float64, uint64, complex."""
    d = np.dtype(d)
    w = _ORDER_AS.get(d, d)
    return w if w in VECTOR_DTYPES else None


# ----------------------------------------------------------------------------- scan


def _scan_ref(x, *, op="add", width=SCAN_WIDTH, rows=64):
    return (np.cumsum if op == "add" else np.cumprod)(x, axis=0, dtype=x.dtype)


def _scan_tiling(spec, x, y, *, op="add", width=SCAN_WIDTH, rows=64):
    cols = x.shape[1] if x.ndim == 2 else 1
    return {"blocks": max(1, min(spec.vector_cores, ceil_div(cols, width)))}


def _scan_flops(x, *, op="add", width=SCAN_WIDTH, rows=64):
    return x.size


@kernel(unit="vector", tiling=_scan_tiling, reference=_scan_ref, flops=_scan_flops)
def scan_add(k, x, y, *, op="add", width=SCAN_WIDTH, rows=64):
    """y = cumsum (op 'add') or cumprod (op 'mul') of x (n, m) along axis 0: each block owns a
    band of up to `width` columns and walks the n rows `rows` at a time; UB row 0 carries the
    running total of the band from one chunk of rows to the next."""
    n, m = x.shape
    buf = k.ub(x.dtype, (rows + 1) * width, "buf")  # row 0: the carry, rows 1..: the chunk
    start, stop = k.block_range(ceil_div(m, width))
    with k.loop(start, stop) as b:
        c0 = b * width
        w = k.let(imin(width, m - c0), "w")
        k.vdup(buf, 0 if op == "add" else 1, w)
        with k.loop(ceil_div(n, rows)) as r:
            r0 = r * rows
            h = k.let(imin(rows, n - r0), "h")
            k.copy_in(buf[w], x[r0 * m + c0], (h, w), (m, 1))
            with k.loop(1, h + 1) as i:
                if op == "add":
                    k.vadd(buf[i * w], buf[i * w], buf[(i - 1) * w], w)
                else:
                    k.vmul(buf[i * w], buf[i * w], buf[(i - 1) * w], w)
            k.copy_out(y[r0 * m + c0], buf[w], (h, w), (m, 1))
            k.vcopy(buf, buf[h * w], w)


scan_add.unit_reason = (
    "a scan vectorized across the independent lines (one vector add per step over up to "
    f"{SCAN_WIDTH} lines, numpy's order of additions); the Cube would need a triangular "
    "matrix of n^2 ones and round through float16/float32"
)


def scan_rows(x2, op: str):
    """The scan kernel on a dense (n, m) tensor (scan along axis 0)."""
    n, m = x2.shape
    width = min(SCAN_WIDTH, max(1, m))
    rows = max(1, min(64, 16384 // width, n))
    return scan_add(x2, op=op, width=width, rows=rows)


# ----------------------------------------------------------------------------- bitonic sort

_tables: dict = {}


def stage_tables(size: int) -> tuple[np.ndarray, np.ndarray]:
    """The bitonic network of `size` (a power of two) as (perm, keep): for stage s, element i
    is compared with perm[s, i] = i ^ j and keeps the first of the pair in the order when
    keep[s, i] (its half of the pair and the direction of its block agree)."""
    hit = _tables.get(size)
    if hit is None:
        i = np.arange(size, dtype=np.int64)
        perms, keeps = [], []
        kk = 2
        while kk <= size:
            j = kk // 2
            while j >= 1:
                perms.append(i ^ j)
                keeps.append(((i & j) == 0) == ((i & kk) == 0))
                j //= 2
            kk *= 2
        if not perms:  # size 1: no stage; one identity stage keeps the kernel uniform
            perms, keeps = [i], [np.ones(size, bool)]
        hit = (np.array(perms, np.int32), np.array(keeps, np.bool_))
        _tables[size] = hit
    return hit


def _sort_outputs(x, perm, keep, *, descending=False, pad=0):
    return [(x.shape, x.dtype), (x.shape, dt.int32)]


def _sort_ref(x, perm, keep, *, descending=False, pad=0):
    n = x.shape[-1]
    if not descending:
        idx = np.argsort(x, axis=-1, kind="stable")
    else:
        idx = n - 1 - np.flip(np.argsort(np.flip(x, -1), axis=-1, kind="stable"), -1)
    return np.take_along_axis(x, idx, -1), idx.astype(np.int32)


def _sort_tiling(spec, x, perm, keep, vals, idx, *, descending=False, pad=0):
    return {"blocks": max(1, min(spec.vector_cores, x.shape[0]))}


def _sort_flops(x, perm, keep, *, descending=False, pad=0):
    return x.shape[0] * perm.size * (20 if x.dtype.kind == "f" else 12)


@kernel(unit="vector", outputs=_sort_outputs, tiling=_sort_tiling, reference=_sort_ref,
        flops=_sort_flops)  # fmt: skip
def bitonic_sort(k, x, perm, keep, vals, idx, *, descending=False, pad=0):
    """Each row of x (rows, n) sorted, and its argsort, by a bitonic network of full-row
    vector instructions over N = perm.shape[1] >= n elements (a power of two; the row is
    padded in UB with `pad`, which sorts after every element: ties go by index). The order
    is numpy's: NaN after every number (before, descending), ties by index (stable).
    perm/keep are `stage_tables(N)`."""
    rows, n = x.shape
    stages, size = perm.shape
    floating = x.dtype.kind == "f"
    v, pv = k.ub(x.dtype, size, "v"), k.ub(x.dtype, size, "pv")
    ix, pi, pb = k.ub(dt.int32, size, "ix"), k.ub(dt.int32, size, "pi"), k.ub(dt.int32, size, "pb")
    kb, m1, e, t = (k.ub(dt.bool_, size, nm) for nm in ("kb", "m1", "e", "t"))
    na, nb = (k.ub(dt.bool_, size, nm) for nm in ("na", "nb")) if floating else (None, None)
    start, stop = k.block_range(rows)
    with k.loop(start, stop) as r:
        if size > n:
            k.vdup(v[n], pad, size - n)
        k.copy_in(v, x[r * n], n)
        k.copy_in(pb, perm[0], size)  # stage 0 pairs i with i ^ 1 (or i itself, N = 1)
        k.vgather(ix, pb, pb, size)  # (i ^ 1) ^ 1 = i: the indices 0..N-1
        with k.loop(stages) as s:
            k.copy_in(pb, perm[s * size], size)
            k.copy_in(kb, keep[s * size], size)
            k.vgather(pv, v, pb, size)
            k.vgather(pi, ix, pb, size)
            # m1: this element comes first of the pair (value order, NaN last / first)
            k.vcmp("gt" if descending else "lt", m1, v, pv, size)
            k.vcmp("eq", e, v, pv, size)
            if floating:
                k.vcmp("ne", na, v, v, size)
                k.vcmp("ne", nb, pv, pv, size)
                a_, b_ = (na, nb) if descending else (nb, na)
                k.vnot(t, b_, size)
                k.vand(t, t, a_, size)  # the partner is NaN and this is not (or reversed)
                k.vor(m1, m1, t, size)
                k.vand(t, na, nb, size)  # NaN ties NaN
                k.vor(e, e, t, size)
            k.vcmp("lt", t, ix, pi, size)  # ties: the lower index first (stable)
            k.vand(t, t, e, size)
            k.vor(m1, m1, t, size)
            k.vxor(t, m1, kb, size)  # keep this element iff first == keep
            k.vnot(t, t, size)
            k.vsel(v, t, v, pv, size)
            k.vsel(ix, t, ix, pi, size)
        k.copy_out(vals[r * n], v, n)
        k.copy_out(idx[r * n], ix, n)


bitonic_sort.unit_reason = (
    "a bitonic sorting network of full-row vector instructions (gather the partners, "
    "compare (value, index), select): the row stays in UB, the Cube has no compare/select, "
    "and the AI CPU would serialize what the Vector unit does a row per instruction"
)


# ----------------------------------------------------------------------------- searchsorted


def _search_outputs(a, q, *, right=False, tile=1024):
    return (q.shape, dt.int32)


def _search_ref(a, q, *, right=False, tile=1024):
    return np.searchsorted(a, q, side="right" if right else "left").astype(np.int32)


def _search_tiling(spec, a, q, out, *, right=False, tile=1024):
    return {"blocks": max(1, min(spec.vector_cores, ceil_div(q.size, tile)))}


def _search_flops(a, q, *, right=False, tile=1024):
    return q.size * 10 * max(1, math.ceil(math.log2(a.size + 1)))


@kernel(unit="vector", outputs=_search_outputs, tiling=_search_tiling, reference=_search_ref,
        flops=_search_flops)  # fmt: skip
def search_sorted(k, a, q, out, *, right=False, tile=1024):
    """Insertion indices of the queries q (m,) into the sorted a (n,) (numpy's order: NaN
    last): a binary search in every lane, a resident in UB; each step gathers a[mid] for
    every query of the tile, compares and moves lo or hi."""
    n, m = a.shape[0], q.shape[0]
    steps = max(1, math.ceil(math.log2(n + 1)))
    floating = a.dtype.kind == "f"
    tab = k.ub(a.dtype, max(n, 1), "tab")
    qb, am = k.ub(a.dtype, tile, "q"), k.ub(a.dtype, tile, "am")
    lo, hi, mid, mc = (k.ub(dt.int32, tile, nm) for nm in ("lo", "hi", "mid", "mc"))
    go, act, t = (k.ub(dt.bool_, tile, nm) for nm in ("go", "act", "t"))
    nq, nt = (k.ub(dt.bool_, tile, nm) for nm in ("nq", "nt")) if floating else (None, None)
    k.copy_in(tab, a[0], n)
    start, stop = k.block_range(ceil_div(m, tile))
    with k.loop(start, stop) as b:
        q0 = b * tile
        w = k.let(imin(tile, m - q0), "w")
        k.copy_in(qb, q[q0], w)
        k.vdup(lo, 0, w)
        k.vdup(hi, n, w)
        if floating:
            k.vcmp("ne", nq, qb, qb, w)
        with k.loop(steps):
            k.vcmp("lt", act, lo, hi, w)
            k.vadd(mid, lo, hi, w)
            k.vshr(mid, mid, 1, w)
            k.vmins(mc, mid, max(n - 1, 0), w)
            k.vgather(am, tab, mc, w)
            if right:  # go right iff not (q before a[mid]): q < a[mid], or a[mid] NaN and q not
                k.vcmp("lt", go, qb, am, w)
                if floating:
                    k.vcmp("ne", nt, am, am, w)
                    k.vnot(t, nq, w)
                    k.vand(t, t, nt, w)
                    k.vor(go, go, t, w)
                k.vnot(go, go, w)
            else:  # go right iff a[mid] before q: a[mid] < q, or q NaN and a[mid] not
                k.vcmp("lt", go, am, qb, w)
                if floating:
                    k.vcmp("ne", nt, am, am, w)
                    k.vnot(t, nt, w)
                    k.vand(t, t, nq, w)
                    k.vor(go, go, t, w)
            k.vand(go, go, act, w)  # lo = mid + 1 where active and going right
            k.vadds(mc, mid, 1, w)
            k.vsel(lo, go, mc, lo, w)
            k.vnot(t, go, w)  # hi = mid where active and going left
            k.vand(t, t, act, w)
            k.vsel(hi, t, mid, hi, w)
        k.copy_out(out[q0], lo, w)


search_sorted.unit_reason = (
    "a binary search in every vector lane (gather a[mid], compare, select lo/hi), the sorted "
    "table resident in UB"
)
