"""The Vector Stockham FFT: every stage of a power-of-two transform inside one Vector kernel.

A built-in kernel written with the user-kernel builder (`userkernel.KernelBuilder`, what
`lazymath.kernel` authors use) and registered in the user-kernel registry, so the graph
records it as one `custom` node (`graph.custom.BUILTIN["fft_stockham"]`) and fusion, the
caches, the interpreter, the cost model and `lm.schedule` treat it like any kernel.

Per row of the batch (blocks split the rows): the row's (real, imaginary) planes live in UB;
stage t (radix r = 4, or 2 for the first stage when log2 n is odd; `graph.dft.stockham_stages`)
is one run of vector instructions over q = n / r elements that the LLVM lowering fuses into one
loop: the gathers of the r inputs (`vgather` with an index table: the Stockham reordering), the
twiddle products (tables read from GM), the length-r DFT butterflies, and the r outputs written
to the other plane pair (quarters k + j' n / r). A middle stage whose input stride s is at
least `dft.RUN_MIN` is instead a loop over q / s runs of s contiguous inputs (no index table,
no gather: hardware gathers are slow on Zen 4), its twiddles one per run broadcast from a UB
copy of the table's prefix (`_run_stage`); only the last stages (s < RUN_MIN) gather. The
first stage reads the row from GM directly
(complex64 rows as float32 pairs: two stride-2 copies; real rows: one copy, imaginary zero),
the last stage scales and writes the pairs to GM (stride-2 copies), so the result is complex64
in C order. Tables: twiddles float32 and gather indices int32, built once per (n, direction)
by `graph.dft.stockham_tables`.
"""

from __future__ import annotations

import hashlib
import math
import pathlib

import numpy as np

from lazymath.backend.npu import isa, userkernel
from lazymath.graph import custom, dft

NAME = "fft_stockham"


def _layout(x, n, length, lay):
    """(rows, R, input strides (batch, row, element), output strides, n_in): `lay` None is
    dense rows (x (rows, n_in[, 2]), out (rows, length, 2)); else (rows, R, bsi, rsi, esi,
    bso, rso, eso, n_in): row r = b R + i reads in[b bsi + i rsi + t esi] and writes
    out[b bso + i rso + k eso] (the six-step plan's column passes), in complex elements."""
    if lay is None:
        rows, n_in = x.shape[0], x.shape[1]
        return rows, rows, (0, n_in, 1), (0, length, 1), n_in
    rows, R, bsi, rsi, esi, bso, rso, eso, n_in = lay
    return rows, R, (bsi, rsi, esi), (bso, rso, eso), n_in


def _kernel(k, x, tw, ix, *rest, n, sign, scale, real, length, lay=None, cols=1, mode="",
            window=False):  # fmt: skip
    # rest: [the post-twiddle table,] [the tile index tables (cols > 1),] [window,] out
    out = rest[-1]
    if mode in ("rpost", "rpost_abs"):
        return _rpost(k, x, tw, out, n, scale, length, mode == "rpost_abs")
    if mode == "ipre":
        return _ipre(k, x, tw, out, n, real)
    if mode in ("rfused", "rfused_abs"):
        return _rfused(k, x, tw, ix, *rest, n=n, sign=sign, scale=scale,
                       magnitude=mode == "rfused_abs")  # fmt: skip
    extras = list(rest[:-1])
    win = extras.pop() if window else None
    pt = extras[0] if len(extras) in (1, 3) else None
    rows, R, (bsi, rsi, esi), (bso, rso, eso), n_in = _layout(x, n, length, lay)
    stages = dft.stockham_stages(n)
    planes = [(k.ub("float32", n, "are"), k.ub("float32", n, "aim")),
              (k.ub("float32", n, "bre"), k.ub("float32", n, "bim"))]  # fmt: skip
    q4 = n // 4
    t = {f"g{j}{c}": k.ub("float32", q4, f"g{j}{c}") for j in range(4) for c in "ri"}
    t.update({f"b{j}{c}": k.ub("float32", q4, f"b{j}{c}") for j in range(4) for c in "ri"})
    t.update({f"w{j}{c}": k.ub("float32", q4, f"w{j}{c}") for j in range(1, 4) for c in "ri"})
    t["p"] = k.ub("float32", q4, "p")
    t["idx"] = k.ub("int32", q4, "idx")
    if stages and stages[0][0] == 2:  # the radix-2 first stage works on halves
        t.update({f"h{j}{c}": k.ub("float32", n // 2, f"h{j}{c}") for j in range(2) for c in "ri"})
    _load_run_twiddles(k, t, tw, n)
    ctx = (k, stages, planes, t, tw, ix, sign, scale, length, n_in, real)

    if window:
        t["win"] = k.ub("float32", n // 2, "win")

    def read_gm(j, dst, cnt, s, ibase):
        if real:
            k.copy_in(dst[0], x[ibase + s * j * esi], cnt, esi)
        else:
            k.copy_in(dst[0], x[2 * ibase + 2 * s * j * esi], cnt, 2 * esi)
            k.copy_in(dst[1], x[2 * ibase + 2 * s * j * esi + 1], cnt, 2 * esi)
        if window:  # fft(x * window): the window's product in the load
            k.copy_in(t["win"], win[s * j], cnt)
            for d in dst[: 1 if real else 2]:
                k.vmul(d, d, t["win"], cnt)

    def write_gm(g, q, obase):
        for jp in range(len(g)):
            cnt = min(q, length - jp * q)
            if cnt > 0 and mode == "abs":  # |y| = sqrt(re^2 + im^2), float32 (rows, length)
                yr, yi = g[jp]
                k.vmul(t["p"], yr, yr, q)
                k.vmul(yi, yi, yi, q)
                k.vadd(yi, yi, t["p"], q)
                k.vsqrt(yr, yi, q)
                k.copy_out(out[obase + jp * q * eso], yr, cnt, eso)
            elif cnt > 0:
                o = 2 * (obase + jp * q * eso)
                k.copy_out(out[o], g[jp][0], cnt, 2 * eso)
                k.copy_out(out[o + 1], g[jp][1], cnt, 2 * eso)

    if cols == 1:
        start, stop = k.block_range(rows)
        with k.loop(start, stop) as row:
            if R == rows:  # one batch
                ibase, obase, ri = row * rsi, row * rso, row
            else:
                bi, ri = k.let(row // R, "bi"), k.let(row % R, "ri")
                ibase, obase = bi * bsi + ri * rsi, bi * bso + ri * rso
            _row(ctx, lambda j, dst, cnt, s, b=ibase: read_gm(j, dst, cnt, s, b),
                 lambda g, q, b=obase: write_gm(g, q, b),
                 None if pt is None else (pt, ri * length))  # fmt: skip
        return
    # tiles of `cols` rows that are adjacent columns (rsi = 1 and/or rso = 1): one 2-D copy
    # reads their elements (the cache lines the columns share) into tin and each row gathers
    # its column from it; the rows' results go to rr (planes), one gather transposes them into
    # (element, column) pairs and one 2-D copy writes the tile
    in_tiles = rsi == 1 and esi != 1
    out_tiles = rso == 1 and eso != 1
    ci, co = extras[-2], extras[-1]
    wid = cols if real else 2 * cols
    if in_tiles:
        tin = k.ub("float32", n_in * wid, "tin")
        tci = k.ub("int32", n_in, "tci")
    if out_tiles:
        rr = k.ub("float32", 2 * cols * length, "rr")
        tout = k.ub("float32", 2 * cols * length, "tout")
        tidx = k.ub("int32", 2 * cols * length, "tidx")
    start, stop = k.block_range(rows // cols)
    with k.loop(start, stop) as grp:
        row0 = k.let(grp * cols, "row0")
        bi, ri0 = k.let(row0 // R, "bi"), k.let(row0 % R, "ri0")
        ibase, obase = bi * bsi + ri0 * rsi, bi * bso + ri0 * rso
        if in_tiles:
            k.copy_in(tin, x[ibase if real else 2 * ibase], (n_in, wid),
                      (esi if real else 2 * esi, 1))  # fmt: skip
        with k.loop(cols) as c:

            def read(j, dst, cnt, s, c=c):
                if not in_tiles:
                    read_gm(j, dst, cnt, s, ibase + c * rsi)
                    return
                k.copy_in(tci, ci, cnt)
                if real:
                    k.vgather(dst[0], tin[s * j * wid + c], tci, cnt)
                else:
                    k.vgather(dst[0], tin[s * j * wid + 2 * c], tci, cnt)
                    k.vgather(dst[1], tin[s * j * wid + 2 * c + 1], tci, cnt)

            def write(g, q, c=c):
                if not out_tiles:
                    write_gm(g, q, obase + c * rso)
                    return
                for jp in range(len(g)):
                    k.vcopy(rr[c * length + jp * q], g[jp][0], q)
                    k.vcopy(rr[(cols + c) * length + jp * q], g[jp][1], q)

            _row(ctx, read, write, None if pt is None else (pt, (ri0 + c) * length))
        if out_tiles:
            m = 2 * cols * length
            k.copy_in(tidx, co, m)
            k.vgather(tout, rr, tidx, m)
            k.copy_out(out[2 * obase], tout, (length, 2 * cols), (2 * eso, 1))


def _rfused(k, x, tw, ix, rtw, rix, out, n, sign, scale, magnitude) -> None:
    """rfft of real rows of 2n in ONE kernel (mode "rfused"): per row, the Stockham FFT of the
    row read as n complex points z_m = x_2m + i x_2m+1 (x (rows, n, 2) pairs), its result Z
    kept in UB (the plane pair the last stage does not read), then the combine of mode "rpost"
    on chip: X_k = (A + conj B) / 2 + w^k (A - conj B) / 2i, A = Z[k mod n], B = Z[(n - k) mod
    n] gathered from UB (`rix`, int32 (n + 1,): (n - k) mod n), w^k from `rtw` ((n + 1, 2)),
    times `scale`. out (rows, n + 1, 2) pairs, or (rows, n + 1) |X_k| (mode "rfused_abs")."""
    rows = x.shape[0]
    stages = dft.stockham_stages(n)
    planes = [(k.ub("float32", n, "are"), k.ub("float32", n, "aim")),
              (k.ub("float32", n, "bre"), k.ub("float32", n, "bim"))]  # fmt: skip
    q4 = max(n // 4, 1)
    t = {f"g{j}{c}": k.ub("float32", q4, f"g{j}{c}") for j in range(4) for c in "ri"}
    t.update({f"b{j}{c}": k.ub("float32", q4, f"b{j}{c}") for j in range(4) for c in "ri"})
    t.update({f"w{j}{c}": k.ub("float32", q4, f"w{j}{c}") for j in range(1, 4) for c in "ri"})
    t["p"] = k.ub("float32", q4, "p")
    t["idx"] = k.ub("int32", q4, "idx")
    if stages and stages[0][0] == 2:
        t.update({f"h{j}{c}": k.ub("float32", n // 2, f"h{j}{c}") for j in range(2) for c in "ri"})
    _load_run_twiddles(k, t, tw, n)
    ctx = (k, stages, planes, t, tw, ix, sign, 1.0, n, n, False)
    zr, zi = planes[(len(stages) - 1) % 2]  # the pair the last stage does not read
    f = {"ar": t["g0r"], "ai": t["g0i"], "br": t["g1r"], "bi": t["g1i"], "wr": t["g2r"],
         "wi": t["g2i"], "er": t["g3r"], "ei": t["g3i"], "p": t["p"]}  # fmt: skip
    start, stop = k.block_range(rows)
    with k.loop(start, stop) as row:
        xi, oi = row * 2 * n, row * (1 if magnitude else 2) * (n + 1)

        def read(j, dst, cnt, s, xi=xi):
            k.copy_in(dst[0], x[xi + 2 * s * j], cnt, 2)
            k.copy_in(dst[1], x[xi + 2 * s * j + 1], cnt, 2)

        def write(g, q):  # Z into the free plane pair
            for jp in range(len(g)):
                k.vcopy(zr[jp * q], g[jp][0], q)
                k.vcopy(zi[jp * q], g[jp][1], q)

        _row(ctx, read, write, None)
        for lo, m in [(c * q4, q4) for c in range(n // q4)] + [(n, 1)]:
            a = lo % n
            k.vcopy(f["ar"], zr[a], m)
            k.vcopy(f["ai"], zi[a], m)
            k.copy_in(t["idx"], rix[lo], m)
            k.vgather(f["br"], zr[0], t["idx"], m)
            k.vgather(f["bi"], zi[0], t["idx"], m)
            k.copy_in(f["wr"], rtw[2 * lo], m, 2)
            k.copy_in(f["wi"], rtw[2 * lo + 1], m, 2)
            _combine(k, f, out, oi, lo, m, scale, magnitude)


def _rpost(k, z, tw, out, n, scale, length, magnitude=False) -> None:
    """rfft of real rows of n = 2h through the FFT Z of the rows read as h complex points
    z_m = x_2m + i x_2m+1 (mode "rpost", the second kernel): for k = 0 .. h, with A = Z[k mod h]
    and B = Z[(h - k) mod h], X_k = (A + conj B) / 2 + w^k (A - conj B) / 2i (w = e^(-2 pi i / n)).
    z (rows, h, 2) pairs, tw (h + 1, 2) the w^k, out (rows, h + 1, 2) = (rows, length, 2);
    `magnitude` (mode "rpost_abs", abs(rfft(x))): |X_k| as float32, out (rows, h + 1)."""
    h = n // 2
    rows = z.shape[0]
    tile, per = _tiles(n)
    f = {c: k.ub("float32", tile, c)
         for c in ("ar", "ai", "br", "bi", "wr", "wi", "er", "ei", "p")}  # fmt: skip
    start, stop = k.block_range(rows * per)  # (row, tile) items: one long row uses every block
    with k.loop(start, stop) as item:
        row, i = k.let(item // per, "row"), k.let(item % per, "ti")
        zi, oi = row * 2 * h, row * (1 if magnitude else 2) * length
        if h > 1:  # the bulk k = 1 .. h - 1, tile i
            lo = k.let(1 + i * tile, "lo")
            m = k.let(isa.imin(tile, h - lo), "m")
            _rpost_span(k, f, z, tw, out, zi, oi, lo, lo, h - lo, m, -2, scale, magnitude)
        with k.if_(i, "==", 0):  # k = 0 and k = h (B = Z[0])
            for lo in (0, h):
                _rpost_span(k, f, z, tw, out, zi, oi, lo, lo % h, (h - lo) % h, 1, 2, scale,
                            magnitude)  # fmt: skip


def _tiles(n: int) -> tuple[int, int]:
    """(tile, tiles per row) of the rfft combine / irfft pre kernels of length n = 2h: the bulk
    k = 1 .. h - 1 in tiles of at most 2048; the blocks split (row, tile) items, so a single
    row (rfft of 1M) runs on every block, not one (measured 1.0-1.25 ms of its ~6 ms)."""
    h = n // 2
    tile = min(h, 2048)
    return tile, max(1, -(-(h - 1) // tile))


def _rpost_span(k, f, z, tw, out, zi, oi, lo, alo, blo, m, bs, scale, magnitude) -> None:
    """X_k for k in [lo, lo + m): A read from Z[alo], B from Z[blo] with pair stride bs."""
    a0, b0 = 2 * alo, 2 * blo
    k.copy_in(f["ar"], z[zi + a0], m, 2)
    k.copy_in(f["ai"], z[zi + a0 + 1], m, 2)
    k.copy_in(f["br"], z[zi + b0], m, bs)
    k.copy_in(f["bi"], z[zi + b0 + 1], m, bs)
    k.copy_in(f["wr"], tw[2 * lo], m, 2)
    k.copy_in(f["wi"], tw[2 * lo + 1], m, 2)
    _combine(k, f, out, oi, lo, m, scale, magnitude)


def _combine(k, f, out, oi, lo, m, scale, magnitude) -> None:
    """X_k for k in [lo, lo + m) from A (ar, ai), B (br, bi) and w^k (wr, wi) in UB."""
    # E = (A + conj B) / 2, O = (A - conj B) / 2i: Er, Ei, Or, Oi
    k.vadd(f["er"], f["ar"], f["br"], m)
    k.vsub(f["ei"], f["ai"], f["bi"], m)
    k.vadd(f["p"], f["ai"], f["bi"], m)  # 2 Or
    k.vsub(f["ar"], f["br"], f["ar"], m)  # 2 Oi = Br - Ar
    # X = E + w O (times 1/2 and the norm scale)
    k.vmul(f["br"], f["wr"], f["p"], m)
    k.vmul(f["bi"], f["wi"], f["ar"], m)
    k.vsub(f["br"], f["br"], f["bi"], m)
    k.vadd(f["er"], f["er"], f["br"], m)
    k.vmul(f["br"], f["wr"], f["ar"], m)
    k.vmul(f["bi"], f["wi"], f["p"], m)
    k.vadd(f["br"], f["br"], f["bi"], m)
    k.vadd(f["ei"], f["ei"], f["br"], m)
    k.vmuls(f["er"], f["er"], 0.5 * scale, m)
    k.vmuls(f["ei"], f["ei"], 0.5 * scale, m)
    if magnitude:  # |X_k| = sqrt(re^2 + im^2)
        k.vmul(f["p"], f["er"], f["er"], m)
        k.vmul(f["ei"], f["ei"], f["ei"], m)
        k.vadd(f["ei"], f["ei"], f["p"], m)
        k.vsqrt(f["er"], f["ei"], m)
        k.copy_out(out[oi + lo], f["er"], m)
        return
    k.copy_out(out[oi + 2 * lo], f["er"], m, 2)
    k.copy_out(out[oi + 2 * lo + 1], f["ei"], m, 2)


def _ipre(k, x, tw, out, n, real) -> None:
    """irfft of length n = 2h through a half-length inverse complex FFT (mode "ipre", the first
    kernel): from the h + 1 frequencies X (rows, h + 1, 2) pairs (or (rows, h + 1) real), Z[k] =
    (A + conj B) + i w^-k (A - conj B) for k < h with A = X[k], B = X[h - k] (a negative-stride
    GM read), w = e^(-2 pi i / n); the imaginary parts of X[0] and X[h] are ignored (numpy's
    c2r). The inverse FFT of Z (scaled by the irfft's norm factor) is then z with z_m = x_2m +
    i x_2m+1: the real result in C order. out (rows, h, 2) pairs."""
    h = n // 2
    rows = x.shape[0]
    e = 1 if real else 2
    tile, per = _tiles(n)
    f = {c: k.ub("float32", tile, c) for c in ("ar", "ai", "br", "bi", "wr", "wi", "dr", "di", "p")}
    start, stop = k.block_range(rows * per)  # (row, tile) items, as `_rpost`
    with k.loop(start, stop) as item:
        row, i = k.let(item // per, "row"), k.let(item % per, "ti")
        xi, oi = row * (h + 1) * e, row * 2 * h
        with k.if_(i, "==", 0):  # k = 0: B = X[h]
            _ipre_span(k, f, x, tw, out, xi, oi, 0, h, 1, e, real, True)
        if h > 1:  # k = 1 .. h - 1, tile i
            lo = k.let(1 + i * tile, "lo")
            m = k.let(isa.imin(tile, h - lo), "m")
            _ipre_span(k, f, x, tw, out, xi, oi, lo, h - lo, m, e, real, False)


def _ipre_span(k, f, x, tw, out, xi, oi, lo, blo, m, e, real, first) -> None:
    """Z[k] for k in [lo, lo + m): A from X[lo] up, B from X[blo] down."""
    k.copy_in(f["ar"], x[xi + e * lo], m, e)
    k.copy_in(f["br"], x[xi + e * blo], m, -e)
    if real or first:  # a real input, or the k = 0 pair: imaginary parts ignored
        k.vdup(f["ai"], 0.0, m)
        k.vdup(f["bi"], 0.0, m)
    else:
        k.copy_in(f["ai"], x[xi + e * lo + 1], m, e)
        k.copy_in(f["bi"], x[xi + e * blo + 1], m, -e)
    k.copy_in(f["wr"], tw[2 * lo], m, 2)
    k.copy_in(f["wi"], tw[2 * lo + 1], m, 2)
    # D = A - conj B, S = A + conj B; Z = S + i w^-k D with w^-k = (wr, -wi)
    k.vsub(f["dr"], f["ar"], f["br"], m)
    k.vadd(f["di"], f["ai"], f["bi"], m)
    k.vadd(f["ar"], f["ar"], f["br"], m)
    k.vsub(f["ai"], f["ai"], f["bi"], m)
    k.vmul(f["p"], f["wr"], f["di"], m)
    k.vsub(f["ar"], f["ar"], f["p"], m)
    k.vmul(f["p"], f["wi"], f["dr"], m)
    k.vadd(f["ar"], f["ar"], f["p"], m)
    k.vmul(f["p"], f["wr"], f["dr"], m)
    k.vadd(f["ai"], f["ai"], f["p"], m)
    k.vmul(f["p"], f["wi"], f["di"], m)
    k.vadd(f["ai"], f["ai"], f["p"], m)
    k.copy_out(out[oi + 2 * lo], f["ar"], m, 2)
    k.copy_out(out[oi + 2 * lo + 1], f["ai"], m, 2)


def _row(ctx, read, write, post) -> None:
    """One row's transform: `read(j, (re, im), cnt, s)` loads a_j's first cnt inputs of the
    first stage, `write(g, q)` stores the last stage's outputs g[j'] (q each), `post` the
    post-twiddle (table, offset) or None."""
    k, stages, planes, t, tw, ix, sign, scale, length, n_in, real = ctx
    src = None
    for st, (r, s, tw_off, ix_off, q) in enumerate(stages):
        last = st == len(stages) - 1
        h = "h" if r == 2 else "g"
        g = [(t[f"{h}{j}r"], t[f"{h}{j}i"]) for j in range(r)]
        # the r inputs a_j
        if src is None:  # first stage: in[k + s j] (s == q), the rest of a short row zero
            for j in range(r):
                cnt = max(0, min(q, n_in - s * j))
                if cnt:
                    read(j, g[j], cnt, s)
                if cnt < q:
                    k.vdup(g[j][0][cnt], 0.0, q - cnt)
                if real or cnt < q:
                    k.vdup(g[j][1][cnt if not real else 0], 0.0, q - (0 if real else cnt))
        elif s >= dft.RUN_MIN:  # runs of s contiguous inputs: no gather, one twiddle per run
            _run_stage(k, r, s, q, tw_off, tw, src, planes[st % 2], g, t, sign)
            src = planes[st % 2]
            continue
        else:
            sre, sim = src
            k.copy_in(t["idx"], ix[ix_off], q)
            for j in range(r):
                k.vgather(g[j][0], sre[s * j], t["idx"], q)
                k.vgather(g[j][1], sim[s * j], t["idx"], q)
            for j in range(1, r):  # a_j *= w^(j p)
                wr, wi = t[f"w{j}r"], t[f"w{j}i"]
                k.copy_in(wr, tw[tw_off + (2 * j - 2) * q], q)
                k.copy_in(wi, tw[tw_off + (2 * j - 1) * q], q)
                _cmul(k, g[j], wr, wi, t["p"], q)
        # the length-r DFT: y_j' = sum_j a_j exp(sign 2 pi i j j' / r)
        ys = _radix2(k, g, q) if r == 2 else _radix4(k, g, t, q, sign)
        if last:
            _last_stage(k, ys, g, t, q, scale, length, post)
            write(g, q)
        else:
            dre, dim = planes[st % 2]
            for jp, (fn, a, b, c, d) in enumerate(ys):
                fn[0](dre[jp * q], a, b, q)
                fn[1](dim[jp * q], c, d, q)
            src = (dre, dim)


def _load_run_twiddles(k, t, tw, n) -> None:
    """The run stages' twiddles (the table's prefix, `dft.run_twiddles`) into UB once per
    block, before the rows: each run broadcasts its value from there."""
    m = dft.run_twiddles(n)
    t["wrun"] = k.ub("float32", max(m, 1), "wrun")
    if m:
        k.copy_in(t["wrun"], tw[0], m)


def _run_stage(k, r, s, q, tw_off, tw, src, dst, g, t, sign) -> None:
    """A middle stage whose stride s is at least dft.RUN_MIN, as q / s runs of s elements: run
    p reads its r inputs a_j at p s r + s j (contiguous: no index table, no gather), multiplies
    a_j by w^(j p) (one value per run and j from the UB copy of the run twiddles, a broadcast)
    and writes its r outputs at p s + j' q."""
    sre, sim = src
    dre, dim = dst
    with k.loop(q // s) as p:
        base = k.let(p * (s * r), "rb")
        for j in range(r):
            k.vcopy(g[j][0], sre[base + s * j], s)
            k.vcopy(g[j][1], sim[base + s * j], s)
        for j in range(1, r):  # a_j *= w^(j p)
            wr, wi = t[f"w{j}r"], t[f"w{j}i"]
            k.emit(isa.VBrcb(wr[0], t["wrun"][tw_off + (2 * j - 2) * (q // s) + p], s))
            k.emit(isa.VBrcb(wi[0], t["wrun"][tw_off + (2 * j - 1) * (q // s) + p], s))
            _cmul(k, g[j], wr, wi, t["p"], s)
        ys = _radix2(k, g, s) if r == 2 else _radix4(k, g, t, s, sign)
        out = k.let(p * s, "ro")
        for jp, (fn, a, b, c, d) in enumerate(ys):
            fn[0](dre[out + jp * q], a, b, s)
            fn[1](dim[out + jp * q], c, d, s)


def _cmul(k, g, wr, wi, p, q) -> None:
    """g *= (wr + i wi) in place (wi is overwritten)."""
    gr, gi = g
    k.vmul(p, gi, wi, q)
    k.vmul(wi, gr, wi, q)
    k.vmul(gr, gr, wr, q)
    k.vsub(gr, gr, p, q)
    k.vmul(gi, gi, wr, q)
    k.vadd(gi, gi, wi, q)


def _radix2(k, g, q):
    """[(ops, a, b, c, d)] per output j': real = op0(a, b), imaginary = op1(c, d)."""
    (a0r, a0i), (a1r, a1i) = g
    return [((k.vadd, k.vadd), a0r, a1r, a0i, a1i), ((k.vsub, k.vsub), a0r, a1r, a0i, a1i)]


def _radix4(k, g, t, q, sign):
    (a0r, a0i), (a1r, a1i), (a2r, a2i), (a3r, a3i) = g
    b = {f"{j}{c}": t[f"b{j}{c}"] for j in range(4) for c in "ri"}
    k.vadd(b["0r"], a0r, a2r, q)
    k.vadd(b["0i"], a0i, a2i, q)
    k.vsub(b["1r"], a0r, a2r, q)
    k.vsub(b["1i"], a0i, a2i, q)
    k.vadd(b["2r"], a1r, a3r, q)
    k.vadd(b["2i"], a1i, a3i, q)
    k.vsub(b["3r"], a1r, a3r, q)
    k.vsub(b["3i"], a1i, a3i, q)
    add, sub = k.vadd, k.vsub
    # y1 = b1 + w4 b3, y3 = b1 - w4 b3 with w4 = sign i: w4 b3 = sign (-b3i, b3r)
    p, m = (sub, add) if sign > 0 else (add, sub)
    return [
        ((add, add), b["0r"], b["2r"], b["0i"], b["2i"]),
        ((p, m), b["1r"], b["3i"], b["1i"], b["3r"]),
        ((sub, sub), b["0r"], b["2r"], b["0i"], b["2i"]),
        ((m, p), b["1r"], b["3i"], b["1i"], b["3r"]),
    ]


def _last_stage(k, ys, g, t, q, scale, length, post) -> None:
    """The last stage (radix 4): y_j' over the inputs' temporaries g[j'] (the butterflies read
    only the b temporaries), times the post-twiddle table row (`post`: (table, offset), the
    six-step plan's first pass) and scaled."""
    for jp, (fn, a, b, c, d) in enumerate(ys):
        yr, yi = g[jp]
        fn[0](yr, a, b, q)
        fn[1](yi, c, d, q)
        if post is not None and jp * q < length:
            table, off = post
            cnt = min(q, length - jp * q)
            wr, wi = t["w1r"], t["w1i"]
            if cnt < q:  # a partial last block: the run breaks, the temporaries hold it
                k.vdup(wr[cnt], 1.0, q - cnt)
                k.vdup(wi[cnt], 0.0, q - cnt)
            k.copy_in(wr, table[2 * (off + jp * q)], cnt, 2)
            k.copy_in(wi, table[2 * (off + jp * q) + 1], cnt, 2)
            _cmul(k, (yr, yi), wr, wi, t["p"], q)
        if scale != 1.0:
            k.vmuls(yr, yr, scale, q)
            k.vmuls(yi, yi, scale, q)


class VectorFFT:
    """The definition object the layers call (the interface of `lowlevel.Kernel`): inputs
    x (rows, n, 2) float32 pairs or (rows, n) real, the twiddle and index tables; output
    (rows, length, 2) float32 pairs; params n, sign, scale, real, length."""

    name = NAME
    unit = "vector"
    epilogue = False
    unit_reason = (
        "the built-in Vector Stockham FFT: every radix-4/2 stage of a row in UB "
        "(graph/dft.py's plan; the fusion log's fft line says why)"
    )

    def __init__(self, key: str):
        self.key = key

    def build(self, ir, spec, name: str):
        return userkernel.build_program(name, "vector", _kernel, _tiling, ir, spec, check=False)

    def flop_count(self, ir) -> int:
        p = dict(ir.params)
        n = p["n"]
        rows = ir.inputs[0].shape[0] if p.get("lay") is None else p["lay"][0]
        if p.get("mode") in ("rpost", "rpost_abs"):
            return rows * (12 + 4 * (p["mode"] == "rpost_abs")) * (n // 2 + 1)
        if p.get("mode") == "ipre":
            return rows * 12 * (n // 2)
        fused = 0
        if p.get("mode") in ("rfused", "rfused_abs"):  # the combine after the FFT of n
            fused = rows * (12 + 4 * (p["mode"] == "rfused_abs")) * (n + 1)
        flops = 0
        for i, (r, _s, _tw, _ix, q) in enumerate(dft.stockham_stages(n)):
            per = (4 if r == 2 else 16) + (0 if i == 0 else 6 * (r - 1))
            flops += per * q
        if p["scale"] != 1.0 and not fused:
            flops += 2 * n
        return rows * flops + fused

    def evaluate(self, srcs, arg, dtype, shape) -> np.ndarray:
        p = dict(arg[1])
        n, length = p["n"], p["length"]
        if p.get("mode") in ("rpost", "rpost_abs"):
            zz = np.asarray(srcs[0], np.float64)
            zc = zz[..., 0] + 1j * zz[..., 1]
            h = n // 2
            kk = np.arange(h + 1)
            a, b = zc[:, kk % h], np.conj(zc[:, (h - kk) % h])
            w = np.exp(-2j * np.pi * kk / n)
            f = ((a + b) / 2 + w * (a - b) / 2j) * p["scale"]
            if p["mode"] == "rpost_abs":
                return np.abs(f).astype(dtype).reshape(shape)
            return np.stack([f.real, f.imag], -1).astype(dtype).reshape(shape)
        if p.get("mode") in ("rfused", "rfused_abs"):  # rfft of the rows' 2n reals
            xx = np.asarray(srcs[0], np.float64).reshape(np.asarray(srcs[0]).shape[0], -1)
            f = np.fft.rfft(xx, axis=-1) * p["scale"]
            if p["mode"] == "rfused_abs":
                return np.abs(f).astype(dtype).reshape(shape)
            return np.stack([f.real, f.imag], -1).astype(dtype).reshape(shape)
        if p.get("mode") == "ipre":
            xx = np.asarray(srcs[0], np.float64)
            h = n // 2
            xc = xx.astype(complex) if p["real"] else xx[..., 0] + 1j * xx[..., 1]
            xc = xc.reshape(-1, h + 1).copy()
            xc[:, 0] = xc[:, 0].real
            xc[:, h] = xc[:, h].real
            kk = np.arange(h)
            a, b = xc[:, kk], np.conj(xc[:, h - kk])
            z = (a + b) + 1j * np.exp(2j * np.pi * kk / n) * (a - b)
            return np.stack([z.real, z.imag], -1).astype(dtype).reshape(shape)
        x = np.asarray(srcs[0], np.float64).reshape(-1)
        flat = x if p["real"] else x[0::2] + 1j * x[1::2]
        lay = p.get("lay")
        if lay is None:
            rows = np.asarray(srcs[0]).shape[0]
            lay = (rows, rows, 0, flat.size // max(rows, 1), 1, 0, length, 1,
                   flat.size // max(rows, 1))  # fmt: skip
        rows, R, bsi, rsi, esi, bso, rso, eso, n_in = lay
        r = np.arange(rows)
        bi, ri = r // R, r % R
        z = flat[(bi * bsi + ri * rsi)[:, None] + np.arange(n_in)[None, :] * esi]
        if p.get("window"):  # the last source, times the rows
            z = z * np.asarray(srcs[-1], np.float64).reshape(-1)[:n_in]
            srcs = srcs[:-1]
        f = np.fft.fft(z, n, axis=-1) if p["sign"] < 0 else np.fft.ifft(z, n, axis=-1) * n
        f = f[:, :length]
        if len(srcs) in (4, 6):  # the post-twiddle table (R, length, 2) (6: + tile tables)
            pt = np.asarray(srcs[3], np.float64).reshape(R, length, 2)
            f = f * (pt[..., 0] + 1j * pt[..., 1])[ri]
        f = f * p["scale"]
        if p.get("mode") == "abs":
            return np.abs(f).astype(dtype).reshape(shape)
        out = np.zeros(math.prod(shape) // 2, complex)
        out[(bi * bso + ri * rso)[:, None] + np.arange(length)[None, :] * eso] = f
        return np.stack([out.real, out.imag], -1).astype(dtype).reshape(shape)

    def reference_run(self, ir, arrays) -> None:
        srcs = [a.reshape(-1)[: math.prod(v.shape)].reshape(v.shape)
                for a, v in zip(arrays, ir.inputs)]  # fmt: skip
        v = ir.outputs[0]
        out = self.evaluate(srcs, (self.key, ir.params), np.dtype(v.dtype), v.shape)
        arrays[len(ir.inputs)].reshape(-1)[: math.prod(v.shape)] = out.reshape(-1)


def _tiling(spec, x, *rest, lay=None, cols=1, **params) -> dict:
    rows = x.shape[0] if lay is None else lay[0]
    if params.get("mode") in ("rpost", "rpost_abs", "ipre"):  # (row, tile) items
        rows *= _tiles(params["n"])[1]
    return {"blocks": max(1, min(rows // cols, spec.vector_cores))}


_SRC = pathlib.Path(__file__).read_bytes() + pathlib.Path(dft.__file__).read_bytes()
KEY = f"{__name__}.{NAME}:{hashlib.sha256(_SRC).hexdigest()[:16]}"
custom.register(KEY, VectorFFT(KEY))
custom.BUILTIN[NAME] = KEY
