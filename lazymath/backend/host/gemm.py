"""Host GEMM building blocks in llvmlite IR: the Ascend Cube data path as a packed (Goto/BLIS) GEMM.

The emulated NPU moves matmul operands GM -> L1 (ND -> NZ) -> L0A/L0B -> Cube -> L0C -> out. On
the host the same hierarchy *is* a cache-blocked GEMM:

- L1 panels are the packing buffers (L2-cache sized), filled by `emit_pack_nz` (MTE2). Packing
  absorbs strides (transposes via 8x8 in-register transposes, broadcast batch axes, negative
  strides), widens float16 to float32 (F16C) and applies an optional elementwise prologue, so
  the microkernel only sees fp32. A B panel reused by many L0C tiles (the "memo" hint) lives in
  the host thread's heap workspace (`get_thread_workspace`), packed once per work item.
- L0A / L0B are micro-panels of those L1 panels (MTE1 is a pointer step on the host, the cache
  does the copy's job). A float32 A panel with unit column stride is not packed at all when the
  Mmad reads it whole: the `_nd` microkernels broadcast straight from its rows in GM
  (`emit_mmad`'s `a_nd`, proven by `cube_proofs.nd_panels`), which saves the A re-pack the
  template's loop nest does once per N panel.
- L0C is the fp32 accumulator tile; `emit_mmad` runs a register-blocked microkernel over it,
  generated from parameters (`Microkernel`: rows, columns, vector width; accumulators =
  rows * columns / width, explicit ``llvm.fma.vNf32``) for the host target (`host_gemm`:
  6x64 on 16-lane zmm with AVX-512, 24 accumulators; 6x16 on 8-lane ymm with AVX2, 12; 6x16
  on the natural LLVM vector elsewhere), prefetching the next B micro-panel into L2 while the
  current one is reused from L1. Edge columns run the same microkernel generated narrower.
- `emit_fixpipe` writes the tile out once, applying the fused epilogue (an SSA expression of
  ``kernel_ir.SOp``) and the output cast on the way.

Layouts (host, all fp32, C0 = 16):
- NZ ("fractal columns of 16"): element (r, c) of an R x C matrix with padded row count Rp lives at
  ``((c // 16) * Rp + r) * 16 + c % 16``. L1 A (M x K), L1 B (K x N) and L0C (M x N) all use it.
  A 6x16 micro-tile of L0C is then 384 contiguous bytes, a 16-column B micro-panel is contiguous
  and the 6 A scalars of one k step sit 64 bytes apart.
- Packed A rows are zero-padded to a multiple of MR=6, packed K to a multiple of 16, packed B
  columns to a multiple of 16, so the microkernel never sees a row or K edge (column edges
  narrower than its width run a narrower variant); FixPipe writes only the valid region.

Everything here takes an ``ir.IRBuilder`` plus values (``ir.Value`` i64 or Python ints for
constants) so the same emitters serve the ISA lowering (``lower_cube``) and the standalone
kernels of ``tests/backend/test_gemm.py``.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from llvmlite import ir

from lazymath import settings
from lazymath.backend.host.bfloat16 import bf16_to_f32, f32_to_bf16
from lazymath.backend.native import host, jit

MR = 6  # microkernel rows (broadcast A scalars)
NR = 16  # microkernel columns (two <8 x float>)
C0 = 16  # NZ fractal width on the host
VW = 8  # AVX2 float lanes

I1 = ir.IntType(1)
I8 = ir.IntType(8)
I16 = ir.IntType(16)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
F16 = ir.HalfType()
F32 = ir.FloatType()
F64 = ir.DoubleType()
V8F = ir.VectorType(F32, VW)

Val = ir.Value | int

LLVM_TYPES: dict[str, ir.Type] = {
    "float16": F16, "bfloat16": I16, "float32": F32, "float64": F64,
    "int8": I8, "int16": I16, "int32": I32, "int64": I64,
    "uint8": I8, "uint16": I16, "uint32": I32, "uint64": I64, "bool": I8,
}  # fmt: skip


def c64(v: int) -> ir.Constant:
    return ir.Constant(I64, v)


def as_i64(v: Val) -> ir.Value:
    return c64(v) if isinstance(v, int) else v


# ----------------------------------------------------------------------------- small IR helpers


@contextmanager
def for_range(
    b: ir.IRBuilder, start: Val, stop: Val, step: Val = 1, name: str = "i"
) -> Iterator[ir.Value]:
    """`for (i = start; i < stop; i += step)` as a canonical LLVM loop; yields the induction var."""
    start, stop = as_i64(start), as_i64(stop)
    pre = b.block
    head = b.append_basic_block(f"{name}.head")
    body = b.append_basic_block(f"{name}.body")
    end = b.append_basic_block(f"{name}.end")
    b.branch(head)
    b.position_at_end(head)
    iv = b.phi(I64, name=name)
    iv.add_incoming(start, pre)
    b.cbranch(b.icmp_signed("<", iv, stop), body, end)
    b.position_at_end(body)
    yield iv
    nxt = b.add(iv, as_i64(step), name=f"{name}.next")
    iv.add_incoming(nxt, b.block)
    b.branch(head)
    b.position_at_end(end)


def imin(b: ir.IRBuilder, x: Val, y: Val) -> Val:
    if isinstance(x, int) and isinstance(y, int):
        return min(x, y)
    x, y = as_i64(x), as_i64(y)
    return b.select(b.icmp_signed("<", x, y), x, y)


def iadd(b: ir.IRBuilder, x: Val, y: Val) -> Val:
    if isinstance(x, int) and isinstance(y, int):
        return x + y
    if y == 0:
        return x
    if x == 0:
        return y
    return b.add(as_i64(x), as_i64(y))


def column_blocks(b: ir.IRBuilder, ncb: Val, nf: int, nr: int, run: Callable) -> None:
    """Call ``run(first fractal column, width)`` over `ncb` fractal columns in blocks of `nf`:
    a loop over the full blocks at width `nr`, then the remainder (1..nf-1 fractals) at its own
    width -- chosen at compile time when `ncb` is known, by a branch per width otherwise. The
    float32 and bfloat16 macrokernels share it."""
    full = ncb // nf if isinstance(ncb, int) else b.sdiv(ncb, c64(nf))
    with for_range(b, 0, full, name="jr") as jr:
        run(b.mul(jr, c64(nf)), nr)
    if nf == 1:
        return
    rem = iadd(b, ncb, imul(b, full, -nf))
    for w in range(1, nf):
        if isinstance(rem, int):
            if rem == w:
                run(c64(full * nf), w * C0)
            continue
        with b.if_then(b.icmp_signed("==", rem, c64(w))):
            run(b.mul(as_i64(full), c64(nf)), w * C0)


def imul(b: ir.IRBuilder, x: Val, y: Val) -> Val:
    if isinstance(x, int) and isinstance(y, int):
        return x * y
    if y == 1:
        return x
    if x == 1:
        return y
    if x == 0 or y == 0:
        return 0
    return b.mul(as_i64(x), as_i64(y))


def ceil_div(b: ir.IRBuilder, x: Val, d: int) -> Val:
    if isinstance(x, int):
        return -(-x // d)
    return b.sdiv(b.add(x, c64(d - 1)), c64(d))


PTR = ir.PointerType()


def gep(b: ir.IRBuilder, ptr: ir.Value, idx: Val, et: ir.Type = F32) -> ir.Value:
    """Element pointer `ptr + idx` (elements of type `et`); opaque pointers throughout."""
    if isinstance(idx, int) and idx == 0:
        return ptr
    return b.gep(ptr, [as_i64(idx)], inbounds=True, source_etype=et)


def get_intrinsic(mod: ir.Module, name: str, ret: ir.Type, args: Sequence[ir.Type]) -> ir.Function:
    fn = mod.globals.get(name)
    if fn is None:
        fn = ir.Function(mod, ir.FunctionType(ret, list(args)), name=name)
    return fn


def vload(b: ir.IRBuilder, p: ir.Value, vt: ir.Type, align: int) -> ir.Value:
    return b.load(p, typ=vt, align=align)


def splat(b: ir.IRBuilder, s: ir.Value, width: int = VW) -> ir.Value:
    vt = ir.VectorType(s.type, width)
    v = b.insert_element(ir.Constant(vt, ir.Undefined), s, ir.Constant(I32, 0))
    return b.shuffle_vector(
        v, ir.Constant(vt, ir.Undefined), ir.Constant(ir.VectorType(I32, width), [0] * width)
    )


def transpose8(b: ir.IRBuilder, vs: Sequence[ir.Value]) -> list[ir.Value]:
    """8x8 float transpose, out[i][j] = vs[j][i]: unpck*ps, shufps, vperm2f128 as shuffles."""

    def shuf(x: ir.Value, y: ir.Value, mask: Sequence[int]) -> ir.Value:
        return b.shuffle_vector(x, y, ir.Constant(ir.VectorType(I32, VW), list(mask)))

    lo, hi = (0, 8, 1, 9, 4, 12, 5, 13), (2, 10, 3, 11, 6, 14, 7, 15)
    t = [shuf(vs[j], vs[j + 1], m) for j in range(0, VW, 2) for m in (lo, hi)]
    even, odd = (0, 1, 8, 9, 4, 5, 12, 13), (2, 3, 10, 11, 6, 7, 14, 15)
    # s[q + p] holds rows (p, p + 4) of v0..v3 (q = 0) or v4..v7 (q = 4), one per 128-bit lane
    s = [shuf(t[q + h], t[q + h + 2], m) for q in (0, 4) for h in (0, 1) for m in (even, odd)]
    low, high = (0, 1, 2, 3, 8, 9, 10, 11), (4, 5, 6, 7, 12, 13, 14, 15)
    return [shuf(s[i], s[i + 4], low) for i in range(4)] + [
        shuf(s[i], s[i + 4], high) for i in range(4)
    ]


def fma8(b: ir.IRBuilder, x: ir.Value, y: ir.Value, z: ir.Value) -> ir.Value:
    fn = get_intrinsic(b.module, "llvm.fma.v8f32", V8F, [V8F, V8F, V8F])
    return b.call(fn, [x, y, z])


# ----------------------------------------------------------------------------- thread workspace
# Packed panels that outlive one L1 tile (the memoised B panel of a whole K range, several MiB)
# do not belong on a block's stack: host threads have 8 MiB stacks and the panel grows with K.
# Each host thread instead owns one heap buffer, found through a pthread key whose destructor
# frees it when the thread exits; a kernel asks for `bytes` and the buffer grows when needed, so
# after the first call no allocation or page fault happens. The key lives in process memory and
# reaches the JIT code as a data symbol (resolved at load, so cached object code stays valid).

WS_KEY_SYMBOL = "lazymath_gemm_ws_key"
WS_HEADER = 64  # bytes before the data: the capacity, and 64-byte alignment of the data


def _register_ws_key() -> ctypes.c_uint:
    """The process's workspace key. `jit.runtime_symbol` creates it once, in malloc'ed memory
    that lives as long as the process (kernels hold its address; a module reload reuses it),
    resolves it for cached objects loaded without LLVM and registers it with LLVM whenever LLVM
    is loaded, so this module does not load LLVM (``llvmlite.binding``) itself."""
    addr = jit.runtime_symbol(WS_KEY_SYMBOL)
    if not addr:
        raise OSError("no per-thread GEMM workspace key")
    return ctypes.c_uint.from_address(addr)


_WS_KEY = _register_ws_key()


def get_thread_workspace(mod: ir.Module) -> ir.Function:
    """``ptr lm_thread_ws(i64 bytes)``: this thread's 64-byte aligned scratch of >= `bytes`.

    The contents are undefined (callers fill before they read) and stay valid until the same
    thread asks again with a larger size.
    """
    name = "lm_thread_ws"
    if name in mod.globals:
        return mod.globals[name]
    key = mod.globals.get(WS_KEY_SYMBOL)
    if key is None:
        key = ir.GlobalVariable(mod, I32, name=WS_KEY_SYMBOL)
    getspec = get_intrinsic(mod, "pthread_getspecific", PTR, [I32])
    setspec = get_intrinsic(mod, "pthread_setspecific", I32, [I32, PTR])
    alloc = get_intrinsic(mod, "aligned_alloc", PTR, [I64, I64])
    free = get_intrinsic(mod, "free", ir.VoidType(), [PTR])
    abort = get_intrinsic(mod, "abort", ir.VoidType(), [])
    fn = ir.Function(mod, ir.FunctionType(PTR, [I64]), name=name)
    fn.linkage = "internal"
    (nbytes,) = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    k = b.load(key, typ=I32)
    have = b.call(getspec, [k])
    check = fn.append_basic_block("check")
    grow = fn.append_basic_block("grow")
    done = fn.append_basic_block("done")
    b.cbranch(b.icmp_unsigned("==", have, ir.Constant(PTR, None)), grow, check)
    b.position_at_end(check)
    cap = b.load(have, typ=I64)
    b.cbranch(b.icmp_unsigned(">=", cap, nbytes), done, grow)
    b.position_at_end(grow)
    b.call(setspec, [k, ir.Constant(PTR, None)])
    b.call(free, [have])  # free(NULL) is a no-op
    size = b.and_(b.add(nbytes, c64(WS_HEADER + 63)), c64(-64))  # aligned_alloc: size % 64 == 0
    new = b.call(alloc, [c64(64), size])
    fail = fn.append_basic_block("fail")
    ok = fn.append_basic_block("ok")
    b.cbranch(b.icmp_unsigned("==", new, ir.Constant(PTR, None)), fail, ok)
    b.position_at_end(fail)
    b.call(abort, [])
    b.unreachable()
    b.position_at_end(ok)
    b.store(nbytes, new)
    b.call(setspec, [k, new])
    b.branch(done)
    b.position_at_end(done)
    hdr = b.phi(PTR)
    hdr.add_incoming(have, check)
    hdr.add_incoming(new, ok)
    b.ret(b.gep(hdr, [c64(WS_HEADER)], inbounds=True, source_etype=I8))
    return fn


# ----------------------------------------------------------------------------- microkernel


def prefetch(b: ir.IRBuilder, p: ir.Value, locality: int) -> None:
    """Read prefetch of the cache line at `p` (locality 3 = into L1, 2 = into L2)."""
    fn = get_intrinsic(b.module, "llvm.prefetch.p0", ir.VoidType(), [PTR, I32, I32, I32])
    b.call(fn, [p, ir.Constant(I32, 0), ir.Constant(I32, locality), ir.Constant(I32, 1)])


LINE = 16  # floats per 64-byte cache line
K_STEP_MERGE = True  # cube_proofs.merge_k_steps on (tests compare both lowerings; in the disk key)
ND_A = True  # fp32 A read in place by the Mmad (cube_proofs.nd_panels; tests compare; disk key)
PACK_ROWS = 8  # rows per block of the contiguous-row packer (emit_pack_nz): <= L1 ways
ND_PACK = True  # float16 A panels packed row-major for the _nd microkernels (lower_cube; key)
ND_PAD = 16  # floats after each row of such a copy (rows not 4 KiB apart)
UK_UNROLL = 4  # k steps per microkernel loop body (a divisor of C0): see get_ukernel


# ----------------------------------------------------------------------------- host GEMM plan
# The host mapping of the Cube's Mmad: which register-blocked microkernel runs a tile, and the
# host K panel it walks (the B micro-panel of one call should stay in the host L1d). Chosen by
# `model_plan` from the host target (backend/native/host.py), or measured (`autotune`).


@dataclass(frozen=True)
class Microkernel:
    """C(mr x nr) (+)= A(mr x k) B(k x nr) on NZ fp32 panels, `vw` float lanes per vector:
    mr * nr / vw accumulator registers, nr / vw B vectors and one broadcast live at once."""

    mr: int = MR  # rows (broadcast A scalars); the template pads packed A rows to MR
    nr: int = NR  # columns, a multiple of the 16-column NZ fractal
    vw: int = VW  # float32 lanes per vector (16 = zmm, 8 = ymm, 4 = xmm / NEON)
    fma: bool = True  # fused multiply-add (else fmul + fadd)

    def __post_init__(self) -> None:
        if self.mr != MR or self.nr % C0 or C0 % self.vw:
            raise ValueError(f"unsupported microkernel {self}")

    @property
    def acc_regs(self) -> int:
        return self.mr * self.nr // self.vw

    @property
    def regs(self) -> int:
        """Vector registers the inner loop keeps live (accumulators, B vectors, broadcast)."""
        return self.acc_regs + self.nr // self.vw + 1

    @property
    def name(self) -> str:
        return f"{self.mr}x{self.nr}v{self.vw}" + ("" if self.fma else "nofma")


@dataclass(frozen=True)
class GemmPlan:
    """How the host runs a Cube Mmad: the microkernel and the host K panel (elements, a
    multiple of 16; 0 = the whole K of the Mmad in one pass). `origin` says who chose it."""

    uk: Microkernel = Microkernel()
    kc: int = 0
    origin: str = "model"

    @property
    def key(self) -> tuple:
        return (self.uk.name, self.kc)

    def describe(self) -> str:
        kc = f"K panel {self.kc}" if self.kc else "K panel = Mmad K"
        return (f"microkernel {self.uk.name} ({self.uk.acc_regs} accumulators), {kc} "
                f"[{self.origin}]")  # fmt: skip


def candidate_plans(target) -> list[GemmPlan]:
    """Plans that are correct and sensible on `target` (host.HostTarget), model's pick first."""
    lanes = min(C0, max(4, target.lanes("float32")))
    fma = target.fma
    out: list[GemmPlan] = []
    if lanes == 16 and target.vector_regs >= 32:
        l1 = target.l1d
        # measured on Emerald Rapids (2 cores, 48 KiB L1d): 6x64 at the Mmad's K (<= 256)
        # 131 GF/core at 1024, 6x64 with 64-deep host panels 121, 6x32 110, 6x16 (ymm) 76
        for nr in (64, 32):
            uk = Microkernel(MR, nr, 16, fma)
            out += [GemmPlan(uk, 0), GemmPlan(uk, _l1_panel(l1, nr))]
    elif lanes == 8 and target.vector_regs >= 16:
        out += [GemmPlan(Microkernel(MR, 16, 8, fma), 0)]
        out += [GemmPlan(Microkernel(MR, 16, 8, fma), _l1_panel(target.l1d, 16))]
    else:  # generic: LLVM vectors of the natural width, 16 columns
        uk = Microkernel(MR, 16, lanes, fma)
        out.append(GemmPlan(uk, 0))
    seen: dict = {}
    for p in out:
        seen.setdefault(p.key, p)
    return list(seen.values())


def _l1_panel(l1d: int, nr: int) -> int:
    """Host K panel whose B micro-panel (k x nr fp32) takes about two thirds of the L1d."""
    return max(C0, min(512, (2 * l1d // 3) // (4 * nr) // C0 * C0))


def model_plan(target=None) -> GemmPlan:
    """The model's plan for `target` (default: the effective host target)."""
    if target is None:
        target = host.target()
    return candidate_plans(target)[0]


_local = threading.local()  # .forced: plan_override stack of this thread (compiles run on many)


def _forced() -> list[GemmPlan]:
    st = getattr(_local, "forced", None)
    if st is None:
        st = _local.forced = []
    return st


@contextmanager
def plan_override(plan: GemmPlan) -> Iterator[None]:
    """Lower Mmads compiled on this thread with `plan` inside the block (autotuning's
    candidates, the measured winner, tests)."""
    _forced().append(plan)
    try:
        yield
    finally:
        _forced().pop()


def overridden() -> bool:
    return bool(_forced())


def parse_plan(text: str) -> GemmPlan:
    """``"6x64v16:128"`` (microkernel, host K panel) -> GemmPlan."""
    shape, _, kc = text.partition(":")
    fma = not shape.endswith("nofma")
    mr, rest = shape.removesuffix("nofma").split("x")
    nr, vw = rest.split("v")
    return GemmPlan(Microkernel(int(mr), int(nr), int(vw), fma), int(kc or 0), "forced")


def host_gemm(target=None) -> GemmPlan:
    """The plan in force: an override (autotuning), else the model's for the target."""
    forced = _forced()
    if forced:
        return forced[-1]
    return model_plan(target)


# ----------------------------------------------------------------------------- microkernel


def _vfma(b: ir.IRBuilder, x: ir.Value, y: ir.Value, z: ir.Value, fused: bool) -> ir.Value:
    if not fused:
        return b.fadd(b.fmul(x, y), z)
    vt = x.type
    fn = get_intrinsic(b.module, f"llvm.fma.v{vt.count}f32", vt, [vt, vt, vt])
    return b.call(fn, [x, y, z])


# The GEMM microkernel library switch (`uklib`): while set (a callable), `get_ukernel` declares
# the microkernel as the external library function ``lazymath_uk_<shape>[.<cpu>]`` and passes its
# symbol to the callable instead of defining it in the module (a tier-0 matmul kernel links the
# library's code; its optimized version gets the definition pasted back in, `uklib.inline`).
UK_PREFIX = "lazymath_uk_"  # the symbols of the microkernel library (backend/host/uklib.py)


def uk_symbol(name: str, target: str | None = None) -> str:
    """The library symbol of `get_ukernel`'s internal function name ``lm_ukernel_<shape>`` for
    a host target (default: the one in force). Named here, where the kernels that call it are
    generated; uklib, which compiles and resolves the library, reads the name back."""
    if target is None:
        target = (settings.TARGET_CPU.get() or "").strip()
        target = "" if target in ("native", "host") else target
    return UK_PREFIX + name.removeprefix("lm_ukernel_") + (f".{target}" if target else "")


UK_LIBRARY: ContextVar[Callable[[str], None] | None] = ContextVar("UK_LIBRARY", default=None)
UK_FNTYPE = ir.FunctionType(ir.VoidType(), [PTR, PTR, PTR, I64, I64, I64, I64, I32, PTR, PTR])


def prefetch_c(b: ir.IRBuilder, pfc, cstride, nf: int, mr: int) -> None:
    """Prefetch (for writing) the rows of the C tile the next call accumulates into."""
    for f in range(nf):
        pc = pfc if f == 0 else gep(b, pfc, b.mul(cstride, c64(f)))
        for r in range(mr):
            prefetch(b, gep(b, pc, r * C0), 3)


def k_loop(b: ir.IRBuilder, fn, nfc, ptrs: tuple, init: list, vt) -> tuple:
    """Open the loop over the `nfc` K fractal columns and position in its body: (head block,
    end block, phis (column, A, B, B-prefetch pointers) started at 0 and `ptrs`, accumulator
    phis started at `init`). The caller adds the latch's incoming values and branches back."""
    pre = b.block
    head, body, end = (fn.append_basic_block(f"k.{n}") for n in ("head", "body", "end"))
    b.branch(head)
    b.position_at_end(head)
    kv = b.phi(I64, name="fc")
    phis = [kv] + [b.phi(PTR, name=n) for n in ("pa", "pb", "ppf")]
    for ph, v in zip(phis, (c64(0),) + tuple(ptrs), strict=True):
        ph.add_incoming(v, pre)
    accs = [b.phi(vt, name=f"c{i}") for i in range(len(init))]
    for ph, v in zip(accs, init, strict=True):
        ph.add_incoming(v, pre)
    b.cbranch(b.icmp_signed("<", kv, nfc), body, end)
    b.position_at_end(body)
    return head, end, tuple(phis), accs


def acc_init(b: ir.IRBuilder, fn, accf, addresses, vt, align: int) -> list:
    """The accumulators' first values: zero, or (accf != 0: accumulate into L0C) the C tile's
    vectors at `addresses()` (a callable: its address arithmetic belongs in the load block)."""
    zero = ir.Constant(vt, [0.0] * vt.count)
    entry, ld, go = b.block, fn.append_basic_block("load"), fn.append_basic_block("go")
    b.cbranch(b.icmp_signed("!=", accf, ir.Constant(I32, 0)), ld, go)
    b.position_at_end(ld)
    loaded = [vload(b, p, vt, align) for p in addresses()]
    ld_end = b.block
    b.branch(go)
    b.position_at_end(go)
    init = []
    for i, v in enumerate(loaded):
        p = b.phi(vt, name=f"c{i}.init")
        p.add_incoming(zero, entry)
        p.add_incoming(v, ld_end)
        init.append(p)
    return init


def get_ukernel(mod: ir.Module, uk: Microkernel = Microkernel(), pf_lines: int = 1,
                nr: int | None = None, rows: int | None = None,
                symbol: str | None = None, nd: bool = False) -> ir.Function:  # fmt: skip
    """``ukernel(a, b, c, nfc, a_fc, b_fc, c_fc, accumulate, pf_b, pf_c)``: C(mr x nr) (+)= A B.

    `a` points at row 0 of an mr-row A micro-panel in NZ (row stride 16 floats, next K fractal
    column `a_fc` floats further), `b` at the first of nr/16 NZ B fractal columns (16 floats =
    one cache line per k, next fractal column `b_fc` floats further), `c` at an mr x nr L0C
    micro-tile (rows 16 floats apart, next fractal column `c_fc` further). The k loop walks
    the K fractal columns; the 16 steps of one run as a loop of UK_UNROLL-step bodies: per step
    nr/vw B vector loads, mr broadcasts and mr*nr/vw FMAs on as many live accumulators. (Unrolled
    by 4 rather than 16: the same speed -- 6x64v16 at 1024/2048, 1 thread, within the noise of a
    loaded machine -- at 40% of the IR, tier-0 codegen 47 -> 24 ms and O3 117 -> 70 ms for that
    kernel; every accumulator sees the same FMAs in the same order either way.) `nr` overrides
    uk.nr (edge columns), `rows` uk.mr (the last rows of a tile whose padded row count is not a
    multiple of mr). `nd` (name suffix ``_nd``): A is read in place, row-major fp32 (an operand
    that needs no packing, see `emit_mmad`'s `a_nd`): `a` points at A[row 0, k 0], `a_fc` is
    its row stride in floats and the next K fractal column is 16 floats on. Same FMAs in the
    same order as the NZ kernel on the packed copy of the same rows: identical results.

    Software prefetch (the B panel lives in L3 when its K range is long, and the hardware
    prefetchers start too late on a 10-16 KiB micro-panel): `pf_b` walks the *next* B
    micro-panel, `pf_lines` lines per fractal column, so the calls that share one B micro-panel
    together pull the next one into L2; `pf_c` (the next L0C micro-tile) goes to L1 up front.
    """
    nr = nr or uk.nr
    vw, mr, nf, nj = uk.vw, rows or uk.mr, nr // C0, C0 // uk.vw
    vt = ir.VectorType(F32, vw)
    # the big AVX-512 kernels loop over 4-step bodies (IR size); kernels of <= 12 accumulators
    # (AVX2's 6x16v8, edge widths) stay fully unrolled: their loop overhead weighs more
    # (6x16v8 at unroll 4 measured 2-4% slower best-of-5, 1 thread, load 13) and their IR is small;
    # a tile's last rows (`rows` < mr) loop like the full-height kernel of their width: fully
    # unrolled, the 2-row tail of 6x64v16 was 56 KB of IR and 21 ms of tier-0 codegen
    unroll = UK_UNROLL if uk.mr * nr // vw > 12 else C0
    name = f"lm_ukernel_{mr}x{nr}v{vw}{'' if uk.fma else 'm'}_pf{pf_lines}"
    name += f"_u{unroll}" if unroll < C0 else ""
    name += "_nd" if nd else ""
    library = UK_LIBRARY.get() if symbol is None else None
    if library is not None:
        name = uk_symbol(name)
    elif symbol is not None:
        name = symbol  # the library's own definition (external linkage)
    if name in mod.globals:
        return mod.globals[name]
    fp = PTR
    fn = ir.Function(mod, UK_FNTYPE, name=name)
    for i in range(3):
        fn.args[i].add_attribute("noalias")
    if library is not None:
        library(name)
        return fn
    if symbol is None:
        fn.linkage = "internal"
    a, bp, c, nfc, astride, bstride, cstride, accf, pfb, pfc = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    # nd: A row-major in place, `astride` its row stride (row r at r * astride, k at + k)
    arow = [c64(0)] + [b.mul(astride, c64(r)) for r in range(1, mr)] if nd else []
    align = min(4 * vw, 32)

    def c_at(r: int, f: int, j: int) -> ir.Value:
        base = c if f == 0 else gep(b, c, b.mul(cstride, c64(f)))
        return gep(b, base, r * C0 + j * vw)

    prefetch_c(b, pfc, cstride, nf, mr)
    slots = [(r, f, j) for r in range(mr) for f in range(nf) for j in range(nj)]
    init = acc_init(b, fn, accf, lambda: [c_at(*s) for s in slots], vt, align)
    # k loop over fractal columns
    head, end, (kv, pa, pb, ppf), accs = k_loop(b, fn, nfc, (a, bp, pfb), init, vt)
    fcp = [ppf] + [gep(b, ppf, b.mul(bstride, c64(f))) for f in range(1, nf)]
    for kk in range(min(pf_lines, C0)):
        for f in range(nf):
            prefetch(b, gep(b, fcp[f], kk * LINE), 2)

    def steps(pa_: ir.Value, pb_: ir.Value, cur: list, count: int) -> list:
        """`count` k steps from pa_/pb_ (k offsets 0..count-1 inside the fractal column)."""
        fcb = [pb_] + [gep(b, pb_, b.mul(bstride, c64(f))) for f in range(1, nf)]
        for kk in range(count):
            bv = [[vload(b, gep(b, fcb[f], kk * C0 + j * vw), vt, align) for j in range(nj)]
                  for f in range(nf)]  # fmt: skip
            for r in range(mr):
                at = (b.add(arow[r], c64(kk)) if r else kk) if nd else r * C0 + kk
                s = b.load(gep(b, pa_, at), typ=F32, align=4)
                v = splat(b, s, vw)
                for f in range(nf):
                    for j in range(nj):
                        i = (r * nf + f) * nj + j
                        cur[i] = _vfma(b, v, bv[f][j], cur[i], uk.fma)
        return cur

    if unroll >= C0:
        cur = steps(pa, pb, list(accs), C0)
    else:  # the 16 k steps of a fractal column as a loop of `unroll`-step bodies
        pre_q = b.block
        qhead = fn.append_basic_block("q.head")
        qbody = fn.append_basic_block("q.body")
        qend = fn.append_basic_block("q.end")
        b.branch(qhead)
        b.position_at_end(qhead)
        qv = b.phi(I64, name="q")
        qa = b.phi(fp, name="qa")
        qb = b.phi(fp, name="qb")
        qacc = [b.phi(vt, name=f"q{i}") for i in range(len(slots))]
        qv.add_incoming(c64(0), pre_q)
        qa.add_incoming(pa, pre_q)
        qb.add_incoming(pb, pre_q)
        for p, v in zip(qacc, accs):
            p.add_incoming(v, pre_q)
        b.cbranch(b.icmp_signed("<", qv, c64(C0)), qbody, qend)
        b.position_at_end(qbody)
        qcur = steps(qa, qb, list(qacc), unroll)
        blk_q = b.block
        qv.add_incoming(b.add(qv, c64(unroll)), blk_q)
        qa.add_incoming(gep(b, qa, unroll), blk_q)
        qb.add_incoming(gep(b, qb, unroll * C0), blk_q)
        for p, v in zip(qacc, qcur):
            p.add_incoming(v, blk_q)
        b.branch(qhead)
        b.position_at_end(qend)
        cur = list(qacc)
    nk = b.add(kv, c64(1))
    npa = gep(b, pa, C0 if nd else astride)
    npb = gep(b, pb, C0 * C0)
    nppf = gep(b, ppf, C0 * C0)
    blk = b.block
    kv.add_incoming(nk, blk)
    pa.add_incoming(npa, blk)
    pb.add_incoming(npb, blk)
    ppf.add_incoming(nppf, blk)
    for p, v in zip(accs, cur):
        p.add_incoming(v, blk)
    b.branch(head)
    b.position_at_end(end)
    for i, (r, f, j) in enumerate(slots):
        b.store(accs[i], c_at(r, f, j), align=align)
    b.ret_void()
    return fn


def emit_mmad(
    b: ir.IRBuilder,
    c: ir.Value,
    c_rows: int,
    a: ir.Value,
    a_rows: int,
    bmat: ir.Value,
    b_rows: int,
    m: Val,
    n: Val,
    k: Val,
    accumulate: Val,
    plan: GemmPlan | None = None,
    a_nd: int | None = None,
) -> None:
    """L0C[0:m, 0:n] (+)= L0A[0:m, 0:k] @ L0B[0:k, 0:n] on NZ fp32 tiles, with `plan`'s
    microkernel (default: the host target's, `host_gemm()`).

    `c_rows`/`a_rows`/`b_rows` are the padded row counts (Rp) of the three NZ layouts; m is rounded
    up to MR, n to 16, k to C0 (the packers zero-padded those). Loops: host K panels outer (the
    plan's kc; one pass when 0), B micro-panels of nr columns (one stays in the host L1d; the
    last, narrower one runs the same microkernel generated for its width), A micro-panels inner
    (the L0A block stays in L2). Call `ir` of a B micro-panel prefetches its share (lines
    ``ir*q .. ir*q+q-1`` of every fractal column, q = ceil(16 / A micro-panels)) of the next B
    micro-panel.

    `a_nd` (a row stride in floats): `a` is not a packed NZ panel but fp32 A[0:a_rows, 0:k]
    row-major in place (row r at r * a_nd): every one of its a_rows rows and k (a multiple of
    16) columns must exist, as no padding does the packer's job; the `_nd` microkernels read
    it (fp32 GEMM operands then need no A packing, see cube_proofs.nd_panels). Results are
    bit-identical to the packed panel's.
    """
    plan = plan or host_gemm()
    uk = plan.uk
    nf = uk.nr // C0
    n_ir = -(-(m if isinstance(m, int) else a_rows) // MR)
    q = min(C0, max(1, -(-C0 // max(n_ir, 1))))
    acc0 = (
        b.zext(accumulate, I32) if not isinstance(accumulate, int) else ir.Constant(I32, accumulate)
    )
    nfc_all = ceil_div(b, k, C0)
    ncb = ceil_div(b, n, C0)  # 16-column fractal columns of the tile
    kcf = plan.kc // C0 if plan.kc else 0
    # Micro-tiles of MR rows inside the C tile's padded rows; when that row count is not a
    # multiple of MR (the NPU pads to 16, not to the host's MR), its last `tail_rows` rows go
    # through a microkernel generated with that many rows: no row past the tile is touched.
    full_rows = min(a_rows, c_rows) // MR  # m <= both (isa_cube.check_bounds)
    tail_rows = min(a_rows, c_rows) % MR
    bfc, cfc, afc = c64(b_rows * C0), c64(c_rows * C0), c64(a_rows * C0)
    nd = a_nd is not None
    if nd:
        afc = c64(a_nd)
    a_row = a_nd if nd else C0

    def panel(kb: Val, nfc: Val, acc: ir.Value) -> None:
        a_k = gep(b, a, imul(b, kb, C0 if nd else a_rows * C0))
        b_k = gep(b, bmat, imul(b, kb, C0 * C0))

        def run(fc0: ir.Value, width: int) -> None:
            ukf = get_ukernel(b.module, uk, q, width, nd=nd)
            pb = gep(b, b_k, b.mul(fc0, bfc))
            pb_next = gep(b, pb, (width // C0) * b_rows * C0)
            pc_col = gep(b, c, b.mul(fc0, cfc))
            groups = ceil_div(b, m, MR)
            with for_range(b, 0, imin(b, groups, full_rows), name="ir") as ir_:
                off = b.mul(ir_, c64(MR * C0))
                pc = gep(b, pc_col, off)
                line = b.and_(b.mul(ir_, c64(q)), c64(C0 - 1))
                pf_b = gep(b, pb_next, b.mul(line, c64(LINE)))
                aoff = b.mul(ir_, c64(MR * a_row)) if nd else off
                b.call(ukf, [gep(b, a_k, aoff), pb, pc, as_i64(nfc), afc, bfc, cfc, acc, pf_b,
                             gep(b, pc, MR * C0)])  # fmt: skip
            if tail_rows:
                uk_tail = get_ukernel(b.module, uk, q, width, tail_rows, nd=nd)
                with b.if_then(b.icmp_signed(">", as_i64(groups), c64(full_rows))):
                    off = full_rows * MR * C0
                    pc = gep(b, pc_col, off)
                    pa = gep(b, a_k, full_rows * MR * a_row)
                    b.call(uk_tail, [pa, pb, pc, as_i64(nfc), afc, bfc, cfc, acc, pb_next, pc])

        column_blocks(b, ncb, nf, uk.nr, run)

    if not kcf or (isinstance(nfc_all, int) and nfc_all <= kcf):
        panel(0, nfc_all, acc0)
        return
    with for_range(b, 0, nfc_all, kcf, name="kb") as kb:
        nfc = imin(b, c64(kcf), b.sub(as_i64(nfc_all), kb))
        acc = b.select(b.icmp_signed(">", kb, c64(0)), ir.Constant(I32, 1), acc0)
        panel(kb, nfc, acc)


# ----------------------------------------------------------------------------- element conversion


def load_as_f32(b: ir.IRBuilder, ptr: ir.Value, dtype: str, width: int) -> ir.Value:
    """Load `width` consecutive elements at `ptr` (element pointer) as float32 (vector if > 1)."""
    et = LLVM_TYPES[dtype]
    if width == 1:
        return to_f32(b, b.load(ptr, typ=et), dtype)
    vt = ir.VectorType(et, width)
    v = b.load(ptr, typ=vt, align=et_align(dtype))
    return to_f32(b, v, dtype)


def et_align(dtype: str) -> int:
    return {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "bool": 1}.get(
        dtype, 4 if "32" in dtype else 1
    )


def to_f32(b: ir.IRBuilder, v: ir.Value, dtype: str) -> ir.Value:
    width = v.type.count if isinstance(v.type, ir.VectorType) else 1
    ft = F32 if width == 1 else ir.VectorType(F32, width)
    if dtype == "float32":
        return v
    if dtype == "float16":
        return b.fpext(v, ft)
    if dtype == "bfloat16":
        return bf16_to_f32(b, v)
    if dtype == "float64":
        return b.fptrunc(v, ft)
    if dtype == "bool":
        return b.uitofp(v, ft)
    if dtype.startswith("uint"):
        return b.uitofp(v, ft)
    return b.sitofp(v, ft)


# ----------------------------------------------------------------------------- packing (MTE2)


def emit_pack_nz(
    b: ir.IRBuilder,
    dst: ir.Value,
    dst_rows: int,
    src: ir.Value,
    src_dtype: str,
    src_off: Val,
    sr: int,
    sc: int,
    rows: Val,
    cols: Val,
    rows_pad: int,
    prologue: Callable[[ir.IRBuilder, ir.Value], ir.Value] | None = None,
) -> None:
    """Pack X[0:rows, 0:cols] (X[r, c] = src[src_off + r*sr + c*sc]) into NZ fp32 at `dst`.

    Rows are zero-filled up to a multiple of `rows_pad`, columns up to a multiple of C0.
    `dst_rows` is the NZ row stride (Rp). `prologue(builder, f32 value)` is applied to every valid
    element (vector or scalar). Strides are Python ints (kernels are specialised on strides).
    """
    rows_p = imul(b, ceil_div(b, rows, rows_pad), rows_pad)
    ncb = ceil_div(b, cols, C0)
    full_cb = cols // C0 if isinstance(cols, int) else b.sdiv(cols, c64(C0))
    zero16 = ir.Constant(ir.VectorType(F32, C0), [0.0] * C0)
    et = LLVM_TYPES[src_dtype]
    base = gep(b, src, src_off, et)
    pro = prologue or (lambda _b, v: v)

    def dst_row(cb: ir.Value, r: Val) -> ir.Value:
        return gep(b, dst, b.mul(b.add(b.mul(cb, c64(dst_rows)), as_i64(r)), c64(C0)))

    def store16(p: ir.Value, v: ir.Value) -> None:
        b.store(v, p, align=32)

    def sgep(p: ir.Value, i: Val) -> ir.Value:
        return gep(b, p, i, et)

    def sload(p: ir.Value) -> ir.Value:
        return to_f32(b, b.load(p, typ=et), src_dtype)

    if sc == 1:
        # rows are contiguous: one 16-wide vector load per fractal row, in blocks of PACK_ROWS
        # rows: for each fractal column the block's rows are consecutive destination lines.
        # (Row by row, the stores of one row hit every fractal column at the NZ column stride,
        # Rp * 64 bytes, a multiple of 4 KiB for the template's panels: all in one L1 set, each
        # store a fresh line evicted before its neighbour is written. Column by column, the
        # loads would walk the source at its row stride. A block of 8 rows keeps both in L1.)
        rows_b = (rows // PACK_ROWS * PACK_ROWS if isinstance(rows, int)
                  else b.and_(rows, c64(-PACK_ROWS)))  # fmt: skip
        with for_range(b, 0, rows_b, PACK_ROWS, name="prb") as r0:
            with for_range(b, 0, full_cb, name="pcb") as cb:
                col = b.mul(cb, c64(C0))
                for i in range(PACK_ROWS):
                    r = b.add(r0, c64(i))
                    v = load_as_f32(b, sgep(base, b.add(b.mul(r, c64(sr)), col)), src_dtype, C0)
                    store16(dst_row(cb, r), pro(b, v))
        with for_range(b, rows_b, rows, name="pr") as r:
            row_base = sgep(base, b.mul(r, c64(sr)))
            with for_range(b, 0, full_cb, name="pcb") as cb:
                v = load_as_f32(b, sgep(row_base, b.mul(cb, c64(C0))), src_dtype, C0)
                store16(dst_row(cb, r), pro(b, v))
        with for_range(b, rows, rows_p, name="pz") as r:
            with for_range(b, 0, full_cb, name="pcb") as cb:
                store16(dst_row(cb, r), zero16)
    elif sr == 1:
        # columns are contiguous (a transposed view): 8 columns x 8 rows are loaded as 8 vectors
        # along the rows, transposed in registers and stored as 8 half fractal rows
        rows8 = b.and_(as_i64(rows), c64(-8))
        with for_range(b, 0, full_cb, name="pcb") as cb:
            for c8 in (0, VW):
                cbase = sgep(base, b.mul(b.add(b.mul(cb, c64(C0)), c64(c8)), c64(sc)))
                with for_range(b, 0, rows8, 8, name="pr8") as r8:
                    at = sgep(cbase, r8)
                    vs = [load_as_f32(b, sgep(at, j * sc), src_dtype, VW) for j in range(VW)]
                    vs = [pro(b, v) for v in vs]
                    for i, row in enumerate(transpose8(b, vs)):
                        b.store(row, gep(b, dst_row(cb, b.add(r8, c64(i))), c8), align=32)
            with for_range(b, rows8, rows, name="prt") as r:
                drow = dst_row(cb, r)
                with for_range(b, 0, C0, name="pc") as c:
                    col = b.add(b.mul(cb, c64(C0)), c)
                    v = pro(b, sload(sgep(base, b.add(r, b.mul(col, c64(sc))))))
                    b.store(v, gep(b, drow, c))
            with for_range(b, rows, rows_p, name="pz") as r:
                store16(dst_row(cb, r), zero16)
    else:
        # general strides (neither axis contiguous): element loops
        with for_range(b, 0, full_cb, name="pcb") as cb:
            with for_range(b, 0, rows_p, name="pz") as r:
                store16(dst_row(cb, r), zero16)
            with for_range(b, 0, rows, name="pr") as r:
                rbase = sgep(base, b.mul(r, c64(sr)))
                drow = dst_row(cb, r)
                with for_range(b, 0, C0, name="pc") as c:
                    col = b.add(b.mul(cb, c64(C0)), c)
                    v = pro(b, sload(sgep(rbase, b.mul(col, c64(sc)))))
                    b.store(v, gep(b, drow, c))
    # partial last fractal column: zero it, then scalar copy of the valid part
    tail = (
        iadd(b, cols, imul(b, full_cb, -C0))
        if isinstance(cols, int)
        else b.sub(cols, b.mul(full_cb, c64(C0)))
    )
    if isinstance(full_cb, int) and isinstance(ncb, int) and full_cb == ncb:
        return  # static column count, a multiple of C0: no partial fractal column
    has_tail = b.icmp_signed("<", as_i64(full_cb), as_i64(ncb))
    with b.if_then(has_tail):
        cb = as_i64(full_cb)
        with for_range(b, 0, rows_p, name="tz") as r:
            store16(dst_row(cb, r), zero16)
        with for_range(b, 0, rows, name="tr") as r:
            rbase = sgep(base, b.mul(r, c64(sr)))
            drow = dst_row(cb, r)
            with for_range(b, 0, tail, name="tc") as c:
                col = b.add(b.mul(cb, c64(C0)), c)
                v = pro(b, sload(sgep(rbase, b.mul(col, c64(sc)))))
                b.store(v, gep(b, drow, c))


def emit_pack_nd(b: ir.IRBuilder, dst: ir.Value, stride: int, src: ir.Value, src_dtype: str,
                 sr: int, rows: Val, cols: Val) -> None:  # fmt: skip
    """dst[r * stride + c] = float32(src[r * sr + c]) for r < rows, c < cols (a multiple of C0):
    a row-major fp32 copy of a unit-column-stride panel (float16 widened), which the `_nd`
    microkernels read like an fp32 operand in place (`emit_mmad`'s `a_nd` = `stride`)."""
    et = LLVM_TYPES[src_dtype]
    ncb = cols // C0 if isinstance(cols, int) else b.sdiv(cols, c64(C0))
    with for_range(b, 0, rows, name="ndr") as r:
        srow = gep(b, src, b.mul(r, c64(sr)), et)
        drow = gep(b, dst, b.mul(r, c64(stride)))
        with for_range(b, 0, ncb, name="ndc") as cb:
            col = b.mul(cb, c64(C0))
            v = load_as_f32(b, gep(b, srow, col, et), src_dtype, C0)
            b.store(v, gep(b, drow, col), align=4)


# ----------------------------------------------------------------------------- write-out (FixPipe)


def relu_f(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """max(x, 0) with NaN passing through (numpy's maximum semantics, like vrelu)."""
    z = ir.Constant(x.type, None)
    keep = b.or_(b.fcmp_ordered(">", x, z), b.fcmp_unordered("uno", x, x))
    return b.select(keep, x, z)


def from_f32(b: ir.IRBuilder, v: ir.Value, dtype: str) -> ir.Value:
    """float32 (scalar or vector) -> storage value of `dtype` (FixPipe's cast; ints saturate)."""
    width = v.type.count if isinstance(v.type, ir.VectorType) else 0
    et = LLVM_TYPES[dtype]
    t = ir.VectorType(et, width) if width else et
    if dtype == "float32":
        return v
    if dtype in ("float16", "float64"):
        return b.fptrunc(v, t) if dtype == "float16" else b.fpext(v, t)
    if dtype == "bfloat16":
        return f32_to_bf16(b, v)
    if dtype == "bool":
        return b.zext(b.fcmp_unordered("!=", v, ir.Constant(v.type, None)), t)
    sfx = (f"v{width}" if width else "") + f"i{et.width}"
    ffx = (f"v{width}" if width else "") + "f32"
    name = "fptoui.sat" if dtype.startswith("uint") else "fptosi.sat"
    fn = get_intrinsic(b.module, f"llvm.{name}.{sfx}.{ffx}", t, [v.type])
    return b.call(fn, [v])


def emit_fixpipe(
    b: ir.IRBuilder,
    dst: ir.Value,
    dst_dtype: str,
    sm: int,
    sn: int,
    src: ir.Value,
    src_rows: int,
    rows: Val,
    cols: Val,
    relu: bool = False,
) -> None:
    """dst[m*sm + n*sn] = cast(relu?(L0C[NZ(m, n)])) for m < rows, n < cols.

    `dst` is an element pointer of `dst_dtype` already offset to the tile origin; `src` the NZ
    L0C tile with padded row count `src_rows`. Contiguous rows (sn == 1) go 8 lanes at a time.
    """
    et = LLVM_TYPES[dst_dtype]

    def post(v: ir.Value) -> ir.Value:
        return from_f32(b, relu_f(b, v) if relu else v, dst_dtype)

    def l0c_at(n: ir.Value, m: ir.Value) -> ir.Value:
        cb = b.sdiv(n, c64(C0))
        return gep(
            b, src, b.add(b.mul(b.add(b.mul(cb, c64(src_rows)), m), c64(C0)), b.srem(n, c64(C0)))
        )

    full = b.sdiv(as_i64(cols), c64(VW)) if sn == 1 else c64(0)
    with for_range(b, 0, rows, name="fm") as m:
        drow = gep(b, dst, b.mul(m, c64(sm)), et)
        if sn == 1:
            with for_range(b, 0, full, name="fv") as g:
                n = b.mul(g, c64(VW))
                v = vload(b, l0c_at(n, m), V8F, 32)
                b.store(post(v), gep(b, drow, n, et), align=et_align(dst_dtype))
        with for_range(b, b.mul(full, c64(VW)), cols, name="fs") as n:
            v = b.load(l0c_at(n, m), typ=F32)
            b.store(post(v), gep(b, drow, b.mul(n, c64(sn)), et))
