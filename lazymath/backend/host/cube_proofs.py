"""The static proofs behind the Cube lowering's host shortcuts (``lower_cube``): pure walks of an
NPU program, no LLVM, so the shortcuts can be tested and reasoned about apart from the emitters.

The host takes shortcuts over the NPU's copies and loop structure; each is used only where a
static walk of the program proves it gives the same values as the NPU's sequence (otherwise the
lowering copies or loops as the device does):

- `aliasable_l0`: LoadL0 as a pointer alias of its L1 panel instead of a copy;
- `memo_sources_read_only`: a memoised LoadNz skips its repack (the GM source is never written);
- `nd_panels`: an A panel the Mmad reads in place (ND) or packs row-major;
- `pair_panels`: B panels narrowed once into a bfloat16 pair twin per L1 fill (vdpbf16ps);
- `merge_l0b_slices` / `merge_k_steps`: the L0B slice loop and the L0 K-step loop of an L1
  panel lowered as one Mmad over the panel (bit-identical results: same FMAs, same k order);
- `var_ranges`: each variable's interval, so sizes proven constant reach the emitters as
  constants.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from lazymath.backend.npu import isa
from lazymath.backend.npu import isa_cube as cube

# ----------------------------------------------------------------------------- shortcut proofs
# The host takes two shortcuts over the NPU's copies; each is used only where a static walk of the
# program proves it gives the same values as the copy (otherwise the lowering copies).


def writes_of(instr) -> list[isa.Ref]:
    """Refs an instruction writes: fields named dst* and Mmad's c."""
    out = []
    for k in getattr(instr, "__dataclass_fields__", {}):
        v = getattr(instr, k)
        if isinstance(v, isa.Ref) and (k.startswith("dst") or (k == "c" and isinstance(
                instr, cube.Mmad))):  # fmt: skip
            out.append(v)
    return out


def pair_panels(program: isa.Program, alias_ok, nd_ok) -> tuple[frozenset, frozenset]:
    """(L1 panels, L0B buffers): the L0B buffers read only as the B operand of bfloat16 Mmads,
    each aliased to its L1 panel (`aliasable_l0`) and loaded only from L1 panels that only
    LoadNz writes and are never read in place (`nd_panels`), with those panels. On a vdpbf16ps
    host each such panel gets a bfloat16 pair twin narrowed when LoadNz fills it (a memo slot
    once per work item), and the Mmad reads the twin instead of narrowing B itself
    (`gemm_bf16.emit_mmad_bf16`'s b_pairs): the twin is exactly as fresh as the panel."""
    instrs = list(program.instructions())
    writers: dict[str, set] = {}
    for x in instrs:
        for r in writes_of(x):
            writers.setdefault(r.buf.name, set()).add(type(x))
    l1_ok = {n for n, t in writers.items() if t == {cube.LoadNz}} - set(nd_ok)
    mmads = [x for x in instrs if isinstance(x, cube.Mmad)]
    loads = [x for x in instrs if isinstance(x, cube.LoadL0)]
    l0b = {x.b.buf.name for x in mmads if x.in_dtype == "bfloat16"} & set(alias_ok)
    l0b -= {x.b.buf.name for x in mmads if x.in_dtype != "bfloat16"}
    l0b -= {x.a.buf.name for x in mmads} | {x.c.buf.name for x in mmads}
    l0b -= {x.dst.buf.name for x in loads if x.src.buf.name not in l1_ok}
    l0b -= {n for n, t in writers.items() if t != {cube.LoadL0}}
    return frozenset(x.src.buf.name for x in loads if x.dst.buf.name in l0b), frozenset(l0b)


def pair_only_panels(program: isa.Program, pairs, pair_l0b) -> frozenset:
    """The `pair_panels` panels read only through their pair twin: every LoadL0 from them goes
    to a `pair_l0b` buffer (so only bfloat16 Mmads read them, as B, from the twin). Their
    float32 host panel is never read, so LoadNz may pack the twin straight from GM and skip it
    (`gemm_bf16.emit_pack_pairs`)."""
    readers: dict[str, set] = {}
    for x in program.instructions():
        if isinstance(x, cube.LoadL0):
            readers.setdefault(x.src.buf.name, set()).add(x.dst.buf.name)
    return frozenset(n for n in pairs if readers.get(n) and readers[n] <= set(pair_l0b))


def _vars_of(e) -> set:
    out, stack = set(), [e]
    while stack:
        x = stack.pop()
        if isinstance(x, isa.Var):
            out.add(x)
        elif isinstance(x, isa.BinInt):
            stack += [x.a, x.b]
    return out


_DIRTY = "dirty"


def aliasable_l0(program: isa.Program) -> frozenset[str]:
    """L0A/L0B buffers whose LoadL0 may be a pointer alias of the L1 panel on the host.

    Copy and alias differ only when the L0 buffer is read after its source region in L1 changed,
    or through an offset other than the one the last LoadL0 wrote. The walk tracks, per L0 buffer,
    the (source buffer, dst offset expression, variables both offsets depend on) of its last
    LoadL0; a write to the source buffer or a new value of one of those variables makes it stale.
    Proven when every read of the buffer finds a fresh alias with the same offset expression, the
    buffer is written only by LoadL0 with matching row counts from L1, and loops are walked twice
    (loop-carried reads see the previous iteration's state). Anything else: copy."""
    l0 = {b.name for b in program.buffers if b.scope in ("L0A", "L0B")}
    bad: set[str] = set()
    shapes: dict[str, set] = {}
    for instr in program.instructions():
        for w in writes_of(instr):
            if w.buf.name in l0 and not (
                isinstance(instr, cube.LoadL0) and instr.src.buf.scope == "L1"
            ):
                bad.add(w.buf.name)
            if isinstance(instr, cube.LoadL0):
                shapes.setdefault(w.buf.name, set()).add((instr.dst_rows, instr.src_rows))
    bad |= {d for d, sh in shapes.items() if len(sh) > 1}  # one L1 row pitch per alias

    def touch_var(state: dict, v) -> None:
        for d, st in state.items():
            if st is not _DIRTY and v in st[2]:
                state[d] = _DIRTY

    def run(body, state: dict) -> None:
        for instr in body:
            if isinstance(instr, isa.Loop):
                entry = dict(state)
                for _ in range(2):
                    touch_var(state, instr.var)
                    run(instr.body, state)
                for d in set(state) | set(entry):  # zero trips: join with the entry state
                    if state.get(d, _DIRTY) != entry.get(d, _DIRTY):
                        state[d] = _DIRTY
                continue
            if isinstance(instr, isa.If):
                entry = dict(state)
                run(instr.body, state)
                for d in set(state) | set(entry):
                    if state.get(d, _DIRTY) != entry.get(d, _DIRTY):
                        state[d] = _DIRTY
                continue
            if isinstance(instr, isa.Let):
                touch_var(state, instr.var)
                continue
            if isinstance(instr, isa.AtomicAdd):
                touch_var(state, instr.var)
            writes = writes_of(instr)
            wnames = {w.buf.name for w in writes}
            for r in isa.refs_of(instr):  # reads first: an instruction reads before it writes
                if r.buf.name in l0 and not isinstance(instr, (cube.Mmad, cube.LoadL0)):
                    bad.add(r.buf.name)  # only Mmad reads an alias (with the L1 row pitch)
                if r.buf.name in l0 and (r not in writes or isinstance(instr, cube.Mmad)):
                    st = state.get(r.buf.name, _DIRTY)
                    if st is _DIRTY or st[1] != r.off:
                        bad.add(r.buf.name)
            for d, st in list(state.items()):
                if st is not _DIRTY and st[0] in wnames:
                    state[d] = _DIRTY
            if isinstance(instr, cube.LoadL0) and instr.dst.buf.name in l0:
                deps = frozenset(_vars_of(instr.dst.off) | _vars_of(instr.src.off))
                state[instr.dst.buf.name] = (instr.src.buf.name, instr.dst.off, deps)

    run(program.body, {})
    return frozenset(l0 - bad)


def memo_sources_read_only(program: isa.Program) -> bool:
    """A memoised LoadNz may skip its repack on the host only if nothing in the program writes
    the GM buffer it reads (the interpreter checks the hint's claim that the source is the same
    panel, see `_i_load_nz`)."""
    written = {w.buf.name for i in program.instructions() for w in writes_of(i)}
    return not any(
        isinstance(i, cube.LoadNz) and i.memo is not None and i.src.buf.name in written
        for i in program.instructions()
    )


def nd_panels(program: isa.Program, alias_ok=None,
              dtypes: tuple[str, ...] = ("float32",)) -> frozenset[str]:  # fmt: skip
    """L1 buffers whose LoadNz the host may skip: the Mmad then reads the operand in place (ND,
    row-major fp32 straight from GM: `gemm.emit_mmad`'s `a_nd`) whenever the panel is whole.

    Proven per buffer: its only writer is one LoadNz of a float32 GM view with unit column
    stride, no prologue, im2col or memo, whose source nothing in the program writes; its only
    readers are the L0A loads of L0 K-step loops that `merge_k_steps` turns into one Mmad, each
    a later sibling of the LoadNz in the same body with no Let in between rebinding a variable
    of the LoadNz, and reading the panel at the LoadNz's own offset with the Mmad's m and k
    equal to the LoadNz's rows and cols. The lowering then checks at run time that the panel is
    whole (rows = its padded row count, cols a multiple of 16: every element a microkernel
    reads exists in GM) and packs it as before otherwise.

    `dtypes`: the GM source dtypes accepted (default float32: read in place). The lowering
    packs a float16 panel proven the same way row-major (`gemm.emit_pack_nd`, see
    gemm.ND_PACK) and the `_nd` microkernels read that copy."""
    written: dict[str, list] = {}
    readers: dict[str, list] = {}
    for instr in program.instructions():
        ws = writes_of(instr)
        for w in ws:
            written.setdefault(w.buf.name, []).append(instr)
        for r in isa.refs_of(instr):
            if r not in ws or isinstance(instr, cube.Mmad):
                readers.setdefault(r.buf.name, []).append(instr)
    ok: set[str] = set()
    merged_reads: dict[int, str] = {}  # id(L0A LoadL0) -> L1 name it was proven for

    def eligible(x) -> bool:
        return (isinstance(x, cube.LoadNz) and x.dst.buf.scope == "L1"
                and x.src.buf.scope == "GM" and x.src.buf.dtype in dtypes
                and x.strides[1] == 1 and x.prologue is None and not x.im2col
                and x.memo is None and x.src.buf.name not in written
                and written.get(x.dst.buf.name) == [x])  # fmt: skip

    def visit(body) -> None:
        for idx, x in enumerate(body):
            if isinstance(x, (isa.Loop, isa.If)):
                visit(x.body)
            if not eligible(x):
                continue
            deps = set()
            for e in (x.rows, x.cols, x.dst.off, x.src.off):
                deps |= _vars_of(e)
            for y in body[idx + 1 :]:
                if isinstance(y, isa.Let) and y.var in deps:
                    break
                if not isinstance(y, isa.Loop):
                    continue
                ld = _nd_read(y, program, alias_ok, x)
                if ld is not None:
                    merged_reads[id(ld)] = x.dst.buf.name

    visit(program.body)
    for name in {n for n in merged_reads.values()}:
        rs = [r for r in readers.get(name, []) if not (isinstance(r, cube.LoadNz)
                                                         and r.dst.buf.name == name)]  # fmt: skip
        if rs and all(merged_reads.get(id(r)) == name for r in rs):
            ok.add(name)
    return frozenset(ok)


def _nd_read(loop: isa.Loop, program: isa.Program, alias_ok, nz: cube.LoadNz):
    """The L0A LoadL0 of `loop` when `merge_k_steps` merges it into one Mmad that reads the
    panel `nz` fills at `nz`'s offset, with m = nz.rows and k = nz.cols; else None."""
    merged = merge_k_steps(loop, program, alias_ok)
    if merged is None:
        return None
    if len(merged) == 1 and isinstance(merged[0], isa.If):
        merged = merged[0].body
    lets: dict = {}
    for x in merged:
        if isinstance(x, isa.Let):
            lets[x.var] = _expand(x.value, lets)
    lds = [x for x in merged if isinstance(x, cube.LoadL0) and x.dst.buf.scope == "L0A"]
    mms = [x for x in merged if isinstance(x, cube.Mmad)]
    if len(lds) != 1 or len(mms) != 1 or lds[0].src.buf != nz.dst.buf:
        return None
    ld, mm = lds[0], mms[0]
    if mm.a.buf != ld.dst.buf or ld.src_rows != nz.dst_rows:
        return None
    if not (_same_values(_expand(ld.src.off, lets), nz.dst.off)
            and _same_values(_expand(mm.m, lets), nz.rows)
            and _same_values(_expand(mm.k, lets), nz.cols)):  # fmt: skip
        return None
    # the original LoadL0 of the loop (the merged one is a copy with the panel's depth)
    return next(x for x in loop.body if isinstance(x, cube.LoadL0) and x.dst.buf == ld.dst.buf)


def var_ranges(program: isa.Program) -> dict:
    """Interval of every variable over the whole program (the union over all its bindings;
    loop variables range over [start, stop - 1], BLOCK_IDX/BLOCK_NUM are unbounded)."""
    inf = float("inf")
    ranges: dict = {isa.BLOCK_IDX: (0, inf), isa.BLOCK_NUM: (1, inf)}

    def bind(v, r) -> None:
        old = ranges.get(v)
        ranges[v] = r if old is None else (min(old[0], r[0]), max(old[1], r[1]))

    def visit(body) -> None:
        for i in body:
            if isinstance(i, isa.Loop):
                s, t = isa.int_range(i.start, ranges), isa.int_range(i.stop, ranges)
                bind(i.var, (s[0], max(s[0], t[1] - 1)))
                visit(i.body)
            elif isinstance(i, isa.If):
                visit(i.body)
            elif isinstance(i, isa.Let):
                bind(i.var, isa.int_range(i.value, ranges))
            elif isinstance(i, isa.AtomicAdd):
                bind(i.var, (-inf, inf))

    visit(program.body)
    visit(program.body)  # a variable used before a later binding of it widens on the 2nd pass
    return ranges


# ----------------------------------------------------------------------------- host mapping
# The NPU walks an L0C tile in L0B slices of n0 columns (L0B is small: 32 columns of fp32 at
# K = 256 on the 910), one LoadL0 + Mmad per slice. On the host L0B is a pointer into the L1B
# panel and the slices of L0C and L1B are consecutive NZ fractal columns, so the slice loop is
# one Mmad over the whole tile width: the host microkernel then runs its full width (64
# columns on AVX-512) instead of the slice's, and its B micro-panels are the panel's.


def _subst(e: isa.IntExpr, var: isa.Var, value: int) -> isa.IntExpr:
    if isinstance(e, isa.Var):
        return value if e == var else e
    if isinstance(e, isa.BinInt):
        a, b = _subst(e.a, var, value), _subst(e.b, var, value)
        fn = {"+": isa.add, "-": isa.sub, "*": isa.mul, "min": isa.imin, "max": isa.imax,
              "//": isa.floordiv, "%": isa.mod}[e.op]  # fmt: skip
        return fn(a, b)
    return e


def _vars(e: isa.IntExpr, out: set) -> set:
    if isinstance(e, isa.Var):
        out.add(e)
    elif isinstance(e, isa.BinInt):
        _vars(e.a, out)
        _vars(e.b, out)
    return out


def _steps_by(e: isa.IntExpr, var: isa.Var, step: int) -> bool:
    """e(var = j) == e(var = 0) + j * step for every value of the other variables (checked at
    j = 0..3 over a few random assignments: the offsets are affine in the loop variable)."""
    names = sorted(_vars(e, set()) - {var}, key=lambda v: v.name)
    rng = np.random.default_rng(len(names))
    for _ in range(3):
        env = {v: int(x) for v, x in zip(names, rng.integers(0, 1 << 12, len(names)))}
        base = isa.eval_int(e, {**env, var: 0})
        for j in (1, 2, 3):
            if isa.eval_int(e, {**env, var: j}) != base + j * step:
                return False
    return True


_FLAGS = (isa.SetFlag, isa.WaitFlag, isa.PipeBarrier)
_MINUS = "-"  # IntExpr subtraction (isa.BinInt op), not a graph op name


def merge_l0b_slices(loop: isa.Loop, alias_ok=None):
    """(LoadL0, Mmad) for the whole tile width when `loop` is the template's L0B slice loop
    whose L0B load is a host pointer alias (`alias_ok`: see aliasable_l0; None = any), else
    None. Pipe flags in the slice are dropped: the host runs a block in program order, their
    lowering is empty."""
    body = [x for x in loop.body if not isinstance(x, _FLAGS)]
    if len(body) != 2 or loop.start != 0 or loop.step != 1:
        return None
    ld, mm = body
    if not (isinstance(ld, cube.LoadL0) and isinstance(mm, cube.Mmad)):
        return None
    if ld.dst.buf.scope != "L0B" or mm.b.buf != ld.dst.buf or mm.b.off != ld.dst.off:
        return None
    if alias_ok is not None and ld.dst.buf.name not in alias_ok:
        return None  # a real copy into L0B: the full width would not fit its host storage
    j = loop.var
    n = mm.n  # imin(n0, nv - j * n0)
    if not (isinstance(n, isa.BinInt) and n.op == "min" and isinstance(n.a, int)):
        return None
    n0 = n.a
    rest = n.b
    if not (isinstance(rest, isa.BinInt) and rest.op == _MINUS and j not in _vars(rest.a, set())):
        return None
    nv = rest.a
    if _subst(rest.b, j, 1) != n0 or _subst(rest.b, j, 0) != 0:
        return None
    if n0 % cube.C0:
        return None
    if not (_steps_by(mm.c.off, j, n0 * mm.c_rows) and _steps_by(ld.src.off, j, n0 * ld.src_rows)):
        return None
    if any(j in _vars(e, set()) for e in (mm.a.off, mm.m, mm.k, mm.accumulate)):
        return None
    cols = isa.mul(isa.ceildiv(nv, cube.C0), cube.C0)
    dst0 = isa.Ref(ld.dst.buf, _subst(ld.dst.off, j, 0))
    ld0 = dataclasses.replace(
        ld, dst=dst0, src=isa.Ref(ld.src.buf, _subst(ld.src.off, j, 0)), cols=cols
    )
    mm0 = dataclasses.replace(mm, c=isa.Ref(mm.c.buf, _subst(mm.c.off, j, 0)), b=ld0.dst, n=nv)
    return ld0, mm0


# The NPU also splits each L1 panel into L0 K steps (kl0 deep: what double-buffers in L0A, 64
# for fp32 on the 910), one LoadL0A + slice loop + Mmad per step, all accumulating into the same
# L0C tile. On the host both L0 loads are pointer aliases into the L1 panels and consecutive K
# steps are consecutive NZ fractal columns of L1A and consecutive rows of L1B, so the K-step loop
# is one Mmad over the panel's whole depth: the microkernel keeps its accumulators in registers
# across the panel instead of storing and reloading the C tile every kl0, and the host K panel of
# the GEMM plan (L1d-sized) decides the depth of one microkernel pass. Every C element still sees
# the same fused multiply-adds in the same k order: the results are bit-identical.


def _expand(e: isa.IntExpr, lets: dict) -> isa.IntExpr:
    """`e` with the variables bound by `lets` (Var -> IntExpr, already expanded) substituted."""
    if isinstance(e, isa.Var):
        return lets.get(e, e)
    if isinstance(e, isa.BinInt):
        a, b = _expand(e.a, lets), _expand(e.b, lets)
        if a is e.a and b is e.b:
            return e
        return isa.BinInt(e.op, a, b)
    return e


def _same_values(x: isa.IntExpr, y: isa.IntExpr, fixed: dict | None = None) -> bool:
    """x == y for a few random non-negative assignments of their variables (loop indices and
    sizes are non-negative): the template's expressions are checked the way _steps_by does."""
    names = sorted(_vars(x, set()) | _vars(y, set()), key=lambda v: v.name)
    rng = np.random.default_rng(len(names) + 7)
    for _ in range(4):
        env = {v: int(a) for v, a in zip(names, rng.integers(0, 1 << 12, len(names)))}
        env.update(fixed or {})
        if isa.eval_int(x, env) != isa.eval_int(y, env):
            return False
    return True


def merge_k_steps(loop: isa.Loop, program: isa.Program, alias_ok=None):
    """The body to lower instead of `loop` when it is the template's loop over the L0 K steps of
    one L1 panel with aliased L0A/L0B loads (see above), else None.

    Checked on the loop (Lets expanded): start 0, step 1, stop = ceil(total / kl); per step one
    LoadL0 into L0A and one into L0B (directly or as the L0B slice loop, merged first) and one
    Mmad reading exactly those, with k = min(kl, total - ks * kl), the L1A source advancing kl
    fractal-column elements (kl * rows) and the L1B source kl rows (kl * 16) per step, the C tile,
    m and n independent of the step, accumulate != 0 from the second step on, and the two L0
    buffers read nowhere else in the program. The result binds ks = 0 and runs the step's body
    once with k = total (guarded by total's loop having a trip)."""
    if loop.start != 0 or loop.step != 1:
        return None
    ks = loop.var
    lets: dict = {}
    head: list = []
    ld_a = inner = None
    for x in loop.body:
        if isinstance(x, _FLAGS):
            continue
        if isinstance(x, isa.Let):
            if ld_a is not None or x.var in lets:
                return None
            lets[x.var] = _expand(x.value, lets)
            head.append(x)
        elif ld_a is None and isinstance(x, cube.LoadL0):
            ld_a = x
        elif ld_a is not None and inner is None:
            inner = x
        else:
            return None
    if ld_a is None or inner is None or ld_a.dst.buf.scope != "L0A":
        return None
    if isinstance(inner, isa.Loop):
        pair = merge_l0b_slices(inner, alias_ok)
        if pair is None:
            return None
        ld_b, mm = pair
    else:
        return None
    if alias_ok is not None and not {ld_a.dst.buf.name, ld_b.dst.buf.name} <= alias_ok:
        return None
    if mm.a.buf != ld_a.dst.buf or mm.a.off != ld_a.dst.off:
        return None
    if mm.b.buf != ld_b.dst.buf or mm.b.off != ld_b.dst.off:
        return None
    k = _expand(mm.k, lets)  # min(kl, total - ks * kl)
    if not (isinstance(k, isa.BinInt) and k.op == "min" and isinstance(k.a, int) and k.a > 0):
        return None
    kl = k.a
    rest = k.b
    if not (isinstance(rest, isa.BinInt) and rest.op == _MINUS and ks not in _vars(rest.a, set())):
        return None
    total = rest.a
    if _subst(rest.b, ks, 1) != kl or _subst(rest.b, ks, 0) != 0 or kl % cube.C0:
        return None
    if not _same_values(_expand(loop.stop, lets), isa.ceildiv(total, kl)):
        return None
    a_src, b_src = _expand(ld_a.src.off, lets), _expand(ld_b.src.off, lets)
    if not (_steps_by(a_src, ks, kl * ld_a.src_rows) and _steps_by(b_src, ks, kl * cube.C0)):
        return None
    if any(ks in _vars(_expand(e, lets), set()) for e in (mm.c.off, mm.m, mm.n)):
        return None
    acc = _expand(mm.accumulate, lets)  # accumulates from the second step on
    if not all(_same_values(isa.imin(isa.imax(acc, 0), 1), 1, {ks: j}) for j in (1, 2, 3)):
        return None
    # the two L0 buffers are read by this loop's Mmad only
    l0 = {ld_a.dst.buf.name, ld_b.dst.buf.name}
    readers = [i for i in program.instructions() if any(r.buf.name in l0 for r in isa.refs_of(i))]
    if sum(isinstance(i, cube.Mmad) for i in readers) != 1:
        return None
    cols = isa.mul(isa.ceildiv(total, cube.C0), cube.C0)
    ld_a1 = dataclasses.replace(ld_a, cols=cols)
    ld_b1 = dataclasses.replace(ld_b, rows=cols)
    mm1 = dataclasses.replace(mm, k=total)
    body = (isa.Let(ks, 0), *head, ld_a1, ld_b1, mm1)
    stop = loop.stop
    if isinstance(stop, int):
        return body if stop > 0 else ()
    return (isa.If(stop, ">", 0, body),)
