"""Host roofline: which roof a kernel is under on the machine it runs on, and how close.

The NPU cost model (`cost.py`) says how a kernel would run on the simulated device; it says
nothing about the host CPU that actually executes the compiled code. This module gives every
kernel two lower bounds on its host time:

- memory: the bytes it moves (broadcast axes read once, as `fusion.schedule.view_bytes`)
  over the host's measured copy bandwidth for that working set (DRAM, or the last-level cache
  when the bytes fit in half of it), at the kernel's thread count;
- compute: its vector work over the host's vector throughput. Work is counted per element
  from the kernel IR: one vector op per arithmetic op, the instructions of the vector math
  library's bodies for transcendentals (`vmath_native.define_native` for exp/log, the composite
  sequences for sin, tanh, pow, ...), divides and square roots on the divider. Throughput is
  the target's vector width (LAZYMATH_TARGET_CPU: AVX2 code has 256-bit vectors even on an
  AVX-512 host) times the host microarchitecture's FP pipes (FMA-class and all-op, `UARCH`),
  at the measured core clock, on the threads the kernel's blocks use.

The tighter (larger) of the two is the kernel's roof; measured time / roof is how far from it
the kernel runs (`KernelRoof.describe`). Both bounds are optimistic by construction (no
latency, perfect overlap), so a kernel at 100 % of its roof cannot get faster without doing
less work, and one at 40 % has room.

Beside the memory bound with normal stores, the memory bound had the kernel's stores been
non-temporal (`KernelRoof.memory_nt_s`, DRAM working sets only): a normal store reads each
written line first (write-allocate), so a copy moves 3 bytes of DRAM traffic per 2 counted,
and np.copyto's bandwidth is that write-allocate bandwidth (Zen 4 host, 64 MiB: 3.9 ms with
normal stores, 2.9 ms streamed). Which of the two a kernel should be held to depends on its
stores: `HostRoofs.nt_bw` says how much a streamed output could gain on this host.

Why measured, not tabulated, bandwidth and clock: VMs and containers hide both (this project's
Zen 5 VM reports 2.6 GHz in /proc/cpuinfo and no cpufreq), and bandwidth per core depends on
the socket's load. The probes (a dependent add chain for the clock; numpy copies of a
DRAM-sized and an L3-sized buffer on 1 and on all threads, and an AVX copy loop with
non-temporal stores of the DRAM-sized one on all threads, best of several runs) take ~0.3 s
once per host: the result is kept in the process and in ``host_roofs.json`` of the kernel cache
directory, keyed by CPU model, thread count and the pipe table. `host_roofs(target,
refresh=True)` measures again and keeps the best of old and new per quantity (a probe is only
slowed by other load, never sped up): the benchmarks do so, so the file converges on the
machine's capability; delete it to start over.
The caller passes the host target (`backend.native.host.target()`): this module does not import the
host description, which sits in the JIT's import cycle.

Everything that computes a roof takes a `HostRoofs` argument, so tests build a fake host and
get deterministic numbers without timing anything.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import platform
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir as llvm_ir

from lazymath._threads import num_threads
from lazymath.backend.host import vmath_native
from lazymath.backend.native.kernel_cache import cache_dir, disk_enabled
from lazymath.backend.npu import isa, vmath
from lazymath.graph import custom
from lazymath.graph.ops import ELEMENTWISE, Composite, Native

__all__ = [
    "UARCH",
    "HostRoofs",
    "KernelRoof",
    "Work",
    "host_roofs",
    "kernel_roof",
    "kernel_work",
    "op_work",
]


# ----------------------------------------------------------------------------- the host model


@dataclass(frozen=True)
class Uarch:
    """Vector FP throughput of one core: `datapath` bits per pipe (an op wider than it takes
    several slots: Zen 4's double-pumped AVX-512), `fma` pipes that multiply / fma, `alu`
    pipes that take any vector FP op, `div256` cycles of the (unpipelined) divider per 256 bits
    of float32 divides or square roots. Reciprocal throughputs from the vendors' optimization
    guides and Agner Fog's tables; approximate, stated so the roof can be argued with."""

    datapath: int
    fma: int
    alu: int
    div256: float


UARCH: dict[str, Uarch] = {
    "znver5": Uarch(512, 2, 4, 2.5),
    "znver4": Uarch(256, 2, 4, 3.5),
    "znver3": Uarch(256, 2, 4, 3.5),
    "znver2": Uarch(256, 2, 4, 3.5),
    "znver1": Uarch(128, 2, 4, 5.0),
    "skylake-avx512": Uarch(512, 2, 3, 5.0),
    "cascadelake": Uarch(512, 2, 3, 5.0),
    "icelake-server": Uarch(512, 2, 3, 5.0),
    "sapphirerapids": Uarch(512, 2, 3, 5.0),
    "emeraldrapids": Uarch(512, 2, 3, 5.0),
    "graniterapids": Uarch(512, 2, 3, 5.0),
    "haswell": Uarch(256, 2, 3, 7.0),
    "broadwell": Uarch(256, 2, 3, 5.0),
    "skylake": Uarch(256, 2, 3, 5.0),
    "alderlake": Uarch(256, 2, 3, 5.0),
}
DEFAULT_UARCH = Uarch(256, 2, 3, 5.0)  # an unknown x86-64 or Arm core: a mid-range guess


@dataclass(frozen=True)
class HostRoofs:
    """What bounds a kernel on this host: vector width (of the target the code is built for),
    pipes of the host's cores, clock, threads and copy bandwidth (bytes/s counting one read
    and one write per copied byte, the STREAM 'copy' convention), for DRAM-sized working sets
    on 1 and on `threads` threads and for working sets that fit in `llc_bytes` / 2."""

    cpu: str  # the host's LLVM CPU name (the pipe table's key)
    vector_bits: int  # of the code's target
    uarch: Uarch
    clock_hz: float
    threads: int
    dram_bw1: float
    dram_bw: float  # on `threads` threads
    cache_bw1: float  # last-level cache, one thread (scales with threads)
    llc_bytes: int
    source: str = "given"  # "measured", "cached" (host_roofs.json) or "given"
    # DRAM copy bandwidth on `threads` threads with non-temporal (streaming) stores, which skip
    # the read-for-ownership of each written line; 0.0: not measured (no AVX, not x86-64)
    nt_bw: float = 0.0

    def slot_bits(self) -> int:
        """Bits one pipe slot processes: the vector width, or the datapath if narrower."""
        return min(self.vector_bits, self.uarch.datapath)

    def bandwidth(self, nbytes: int, threads: int) -> tuple[float, str]:
        """Copy bandwidth (bytes/s) for a working set of `nbytes` on `threads`, and its name."""
        threads = max(1, min(threads, self.threads))
        if nbytes <= self.llc_bytes // 2:
            return self.cache_bw1 * threads, "LLC"
        if threads >= self.threads:
            return self.dram_bw, "DRAM"
        return min(self.dram_bw, self.dram_bw1 * threads), "DRAM"

    def describe(self) -> str:
        u = self.uarch
        return (
            f"host roofline ({self.source}): {self.cpu}, {self.vector_bits}-bit code on "
            f"{u.datapath}-bit pipes ({u.fma} FMA + {u.alu - u.fma} other), "
            f"{self.clock_hz / 1e9:.2f} GHz, {self.threads} thread(s); copy bandwidth DRAM "
            f"{self.dram_bw1 / 1e9:.1f} GB/s on 1 thread, {self.dram_bw / 1e9:.1f} GB/s on "
            f"{self.threads}; LLC {self.cache_bw1 / 1e9:.1f} GB/s per thread "
            f"(working sets <= {self.llc_bytes // 2 >> 20} MiB)"
            + (f"; non-temporal stores DRAM {self.nt_bw / 1e9:.1f} GB/s on {self.threads} "
               f"({self.nt_bw / self.dram_bw:.2f}x normal stores)"
               if self.nt_bw and self.dram_bw else "")
        )  # fmt: skip


# ----------------------------------------------------------------------------- work per op


@dataclass
class Work:
    """Vector work in bit-operations (ops x element bits): `fma` ops on the multiply pipes,
    `alu` on any FP pipe, `div` on the divider. Bits rather than ops so one count mixes the
    float64 steps of a float32 function (its trig reduction) with its float32 ones."""

    fma: float = 0.0
    alu: float = 0.0
    div: float = 0.0

    def add(self, other: Work, times: float = 1.0) -> Work:
        self.fma += other.fma * times
        self.alu += other.alu * times
        self.div += other.div * times
        return self

    @property
    def ops(self) -> float:
        return self.fma + self.alu + self.div

    def seconds(self, roofs: HostRoofs, threads: int) -> float:
        """Time on `threads` cores: the busiest resource (multiply pipes, all pipes, divider)."""
        u, slot = roofs.uarch, roofs.slot_bits()
        per_s = roofs.clock_hz * max(1, min(threads, roofs.threads))
        t_fma = self.fma / (u.fma * slot) if self.fma else 0.0
        t_all = (self.fma + self.alu) / (u.alu * slot)
        t_div = self.div / 256 * u.div256
        return max(t_fma, t_all, t_div) / per_s


def _bits(dtype: str) -> int:
    """Bits of one lane as the host computes it: float16 / bfloat16 and bools in 32."""
    try:
        size = np.dtype(dtype).itemsize
    except TypeError:
        size = 4
    return max(32, 8 * size)


_FMA_INSTR = frozenset({"vmul", "vmuls", "vmla", "vmadd"})
_DIV_INSTR = {"vdiv": 1, "vsqrt": 1, "vrec": 1, "vrsqrt": 2}
_LIBM_OPS = 20  # a scalar libm call per lane (float64 ops with no vector sequence): a guess
_native_cache: dict[tuple[str, str], Work] = {}
_composite_cache: dict[tuple[str, str], Work] = {}
_lock = threading.Lock()


def native_work(op: str, dtype: str) -> Work:
    """Work per element of the vector math library's native body (`vexp`, `vln`), counted
    from its LLVM IR: fma and fmul on the multiply pipes, divides on the divider, every other
    instruction but bitcasts and the return on any pipe."""
    dt = "float64" if dtype == "float64" else "float32"
    key = (op, dt)
    w = _native_cache.get(key)
    if w is not None:
        return w
    fn = vmath_native.define_native(llvm_ir.Module(), op, dt)
    bits = _bits(dt)
    w = Work()
    for instr in fn.blocks[0].instructions:
        name = instr.opname
        if name in ("ret", "bitcast"):
            continue
        callee = getattr(getattr(instr, "callee", None), "name", "") if name == "call" else ""
        if name == "fmul" or ".fma." in callee:
            w.fma += bits
        elif name == "fdiv" or ".sqrt." in callee:
            w.div += bits
        else:
            w.alu += bits
    _native_cache[key] = w
    return w


def composite_work(op: str, dtype: str) -> Work:
    """Work per element of a composite (sin, tanh, pow, ...) on its common path, from the
    instructions `vmath` emits for one chunk (the small-argument branch of a range test, as
    `vmath.composite_instructions` counts). float64 functions without a vector sequence call
    the host libm per lane (`_LIBM_OPS` scalar ops, each taking a whole slot)."""
    key = (op, dtype)
    w = _composite_cache.get(key)
    if w is not None:
        return w
    chunk = vmath.CHUNK
    s = vmath._Seq(isa.Builder(tile=chunk), chunk)
    src = isa.Ref(isa.Buffer("x", "UB", dtype, chunk))
    w = Work()
    try:
        vmath._emit_chunk(s, op, src, (src,) * vmath._ARITY.get(op, 1), dtype)
    except NotImplementedError:
        w.alu = _LIBM_OPS * 512  # scalar: one lane per slot whatever the width
        _composite_cache[key] = w
        return w
    body = []
    for i in s.body:
        if isinstance(i, isa.If):
            body.extend(i.body)
            break
        body.append(i)
    for i in body:
        dst = getattr(i, "dst", None)
        if not isinstance(dst, isa.Ref):  # GetValue and other scalar-unit steps
            continue
        bits = _bits(dst.buf.dtype)
        name = getattr(i, "op", "")
        if isinstance(i, isa.VFma) or name in _FMA_INSTR:
            w.fma += bits
        elif name in _DIV_INSTR:
            w.div += bits * _DIV_INSTR[name]
        elif name in ("vexp", "vln"):
            w.add(native_work(name, dst.buf.dtype))
        elif isinstance(i, isa.VGather):  # LLVM scalarizes gathers: one lane per slot
            w.alu += 512
        else:
            w.alu += bits
    _composite_cache[key] = w
    return w


_EMITTED_ALU = {"leaky_relu": 2, "sign": 3, "copysign": 2, "isfinite": 2, "isinf": 2}


def op_work(op: str, dtype: str, arg=None) -> Work:
    """Work per element of one scalar op of a fused expression (an `SOp`) of `dtype`."""
    if op in ("load", "const", "acc"):
        return Work()
    bits = _bits(dtype)
    if op == "reduce":
        return Work(fma=bits) if arg == "prod" else Work(alu=bits)
    rec = ELEMENTWISE.get(op)
    low = getattr(rec, "lowering", None)
    float_ = dtype.startswith(("float", "bfloat"))
    if isinstance(low, Native):
        instr = low.instr
        if float_ and instr in ("vexp", "vln"):
            return native_work(instr, dtype)
        if float_ and instr in _DIV_INSTR:
            return Work(div=bits * _DIV_INSTR[instr])
        if not float_ and instr in ("vdiv", "vrec"):  # integer division: scalar on x86
            return Work(alu=512)
        return Work(fma=bits) if instr == "vmul" else Work(alu=bits)
    if isinstance(low, Composite):
        if not float_:
            return Work(alu=4 * bits)  # integer floor_divide / remainder / pow: a few ops
        return composite_work(op, dtype)
    if op == "square":
        return Work(fma=bits)
    return Work(alu=bits * _EMITTED_ALU.get(op, 1))


# ----------------------------------------------------------------------------- work per kernel


def view_bytes(v) -> int:
    """Bytes a kernel moves for a view: broadcast (stride 0) axes are read once."""
    n = 1
    for s, st in zip(v.shape, v.strides):
        if st != 0:
            n *= s
    return n * np.dtype(v.dtype).itemsize


def _expr_work(expr, size: int) -> Work:
    w = Work()
    for o in expr or ():
        w.add(op_work(o.op, o.dtype, o.arg), size)
    return w


def _row_work(ir) -> Work:
    """A RowKernel: ops on row values (reductions' results and what is computed only from
    them) run once per row, the others per element; x / row value is x * (1 / row value),
    as the rows template emits it (one divide per row)."""
    axes = set(ir.axes)
    reduced = math.prod(s for d, s in enumerate(ir.in_shape) if d in axes)
    total = math.prod(ir.in_shape)
    rows = total // reduced if reduced else 0
    level: list[str] = []
    w = Work()
    for o in ir.expr:
        if o.op == "const":
            lvl = "row"
        elif o.op == "load":
            v = ir.inputs[o.arg]
            lvl = "row" if all(v.strides[d] == 0 for d in axes) else "full"
        elif o.op == "reduce":
            lvl = "row"
            w.add(op_work("reduce", o.dtype, o.arg), total)
        else:
            lvl = "full" if any(level[s] == "full" for s in o.srcs) else "row"
            if lvl == "full" and o.op == "div" and level[o.srcs[1]] == "row":
                w.add(Work(fma=_bits(o.dtype)), total)
                w.add(op_work("div", o.dtype), rows)
            else:
                w.add(op_work(o.op, o.dtype, o.arg), total if lvl == "full" else rows)
        level.append(lvl)
    return w


def kernel_work(ir) -> tuple[Work, int] | None:
    """(vector work, bytes moved) of a kernel IR on the host; None for AI CPU kernels (numpy
    steps, no compiled code) and IR kinds this model does not know."""
    kind = getattr(ir, "kind", None)
    if kind == "elementwise":
        size = math.prod(ir.shape)
        return _expr_work(ir.expr, size), sum(map(view_bytes, ir.inputs + ir.outputs))
    if kind == "reduce":
        size_in, size_out = math.prod(ir.in_shape), math.prod(ir.out_shape)
        w = _expr_work(ir.prologue, size_in)
        w.add(op_work("reduce", ir.acc_dtype, ir.op if ir.op == "prod" else "sum"), size_in)
        w.add(_expr_work(ir.epilogue, size_out))
        return w, sum(map(view_bytes, ir.inputs + ir.epi_inputs + ir.outputs))
    if kind == "rows":
        return _row_work(ir), sum(map(view_bytes, ir.inputs + ir.outputs))
    if kind == "matmul":
        b = math.prod(ir.batch)
        macs = b * ir.m * ir.n * ir.k
        w = Work(fma=macs * 32)  # float32 accumulation (float16 operands widened)
        w.add(_expr_work(ir.a_prologue, b * ir.m * ir.k))
        w.add(_expr_work(ir.b_prologue, b * ir.k * ir.n))
        w.add(_expr_work(ir.epilogue, b * ir.m * ir.n))
        views = (ir.a, ir.b, *ir.epi_inputs, *ir.outputs, *ir.col_sum_outputs,
                 *ir.row_red_outputs, *ir.softmax_outputs)  # fmt: skip
        return w, sum(map(view_bytes, views))
    if kind == "custom":
        try:
            flops = custom.get(ir.key).flop_count(ir)
        except Exception:  # noqa: BLE001 - an unregistered or failing count: no roof
            return None
        w = Work(fma=flops / 2 * 32)  # the author's FLOPs, as float32 fmas (2 FLOP each)
        w.add(_expr_work(ir.epilogue, math.prod(ir.outputs[0].shape)))
        return w, sum(map(view_bytes, ir.inputs + ir.outputs))
    return None


@dataclass(frozen=True)
class KernelRoof:
    """The two host bounds of one kernel (seconds) and what they are made of."""

    memory_s: float
    compute_s: float
    bytes: int
    level: str  # DRAM | LLC: which bandwidth the bytes were charged at
    bandwidth: float  # bytes/s used for memory_s
    ops: float  # vector element-ops (bit-ops / 32), for the text
    threads: int
    # the memory bound had the kernel's stores been non-temporal (DRAM working sets on a host
    # with a measured `HostRoofs.nt_bw`; else None). Not the roof: lazymath's loops store
    # normally, so each written line is read first and `memory_s` is what they can reach
    memory_nt_s: float | None = None

    @property
    def bound(self) -> str:
        return "memory" if self.memory_s >= self.compute_s else "compute"

    @property
    def roof_s(self) -> float:
        """The tighter bound: no run of this kernel on this host can be faster."""
        return max(self.memory_s, self.compute_s)

    def fraction(self, measured_s: float) -> float | None:
        """Roof / measured time: 1.0 means at the roof (None without a measurement)."""
        if not measured_s or measured_s <= 0:
            return None
        return self.roof_s / measured_s

    def describe(self, measured_s: float | None = None) -> str:
        mem = (f"memory {self.memory_s * 1e6:.1f} us ({_fmt(self.bytes)}B at "
               f"{self.bandwidth / 1e9:.1f} GB/s {self.level}, normal stores")  # fmt: skip
        if self.memory_nt_s is not None:
            mem += f"; {self.memory_nt_s * 1e6:.1f} us with non-temporal stores"
        mem += ")"
        comp = f"compute {self.compute_s * 1e6:.1f} us ({_fmt(self.ops)} f32 vector-lane ops)"
        text = f"{self.bound}-bound on this host ({self.threads} thread(s)): {mem}, {comp}"
        f = self.fraction(measured_s) if measured_s else None
        if f is not None:
            text += f"; measured {measured_s * 1e6:.1f} us = {f:.0%} of the {self.bound} roof"
            if self.bound == "memory" and self.memory_nt_s is not None:
                nt = max(self.memory_nt_s, self.compute_s) / measured_s
                text += f" ({nt:.0%} of the non-temporal-store roof)"
        return text


def _fmt(v: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(v) >= scale:
            return f"{v / scale:.3g}{unit}"
    return f"{v:.3g}"


def kernel_roof(ir, blocks: int, roofs: HostRoofs) -> KernelRoof | None:
    """The host roofline of kernel `ir` run as `blocks` host blocks (0: all threads) on a host
    described by `roofs` (`host_roofs(target)`), or None where the model has no rule (AI CPU
    kernels)."""
    got = kernel_work(ir)
    if got is None:
        return None
    work, nbytes = got
    threads = max(1, min(blocks or roofs.threads, roofs.threads))
    bw, level = roofs.bandwidth(nbytes, threads)
    nt = None
    if level == "DRAM" and roofs.nt_bw > 0 and roofs.dram_bw > 0 and bw > 0:
        # fewer threads than the host's: non-temporal stores scale like normal ones
        nt = nbytes / (bw * roofs.nt_bw / roofs.dram_bw)
    return KernelRoof(
        memory_s=nbytes / bw if bw > 0 else 0.0,
        compute_s=work.seconds(roofs, threads),
        bytes=nbytes,
        level=level,
        bandwidth=bw,
        ops=work.ops / 32,
        threads=threads,
        memory_nt_s=nt,
    )


# ----------------------------------------------------------------------------- probes


_ADDS = 200  # dependent `add rax, 1` per loop iteration of the clock probe


def _clock_code() -> bytes:
    """x86-64 SysV `int64 f(int64 n)`: n iterations of _ADDS dependent `add rax, 1`."""
    body = bytes.fromhex("4883c001") * _ADDS + bytes.fromhex("48ffc9")  # add rax,1 ..; dec rcx
    jnz = bytes.fromhex("0f85") + (-(len(body) + 6)).to_bytes(4, "little", signed=True)
    return bytes.fromhex("31c04889f9") + body + jnz + bytes.fromhex("c3")  # xor eax; mov rcx


_NT_STEP = 128  # bytes per iteration of the non-temporal copy loop (4 ymm registers)
_NT_ALIGN = 64  # its buffers start on a cache line (vmovntps needs 32; 64 keeps lines whole)


def _nt_copy_code() -> bytes:
    """x86-64 SysV `void f(void *dst, const void *src, int64 nbytes)` (AVX): copy `nbytes` (a
    positive multiple of _NT_STEP, dst 32-byte aligned) with vmovups loads and vmovntps
    stores, then sfence (the streamed lines reach memory before the call returns, so the time
    counts them) and vzeroupper (no AVX-SSE transition penalty in the caller)."""
    body = bytes.fromhex(
        "c5fc1006"  # vmovups ymm0, [rsi]
        "c5fc104e20"  # vmovups ymm1, [rsi+32]
        "c5fc105640"  # vmovups ymm2, [rsi+64]
        "c5fc105e60"  # vmovups ymm3, [rsi+96]
        "c5fc2b07"  # vmovntps [rdi], ymm0
        "c5fc2b4f20"  # vmovntps [rdi+32], ymm1
        "c5fc2b5740"  # vmovntps [rdi+64], ymm2
        "c5fc2b5f60"  # vmovntps [rdi+96], ymm3
        "4881c680000000"  # add rsi, 128
        "4881c780000000"  # add rdi, 128
        "4881ea80000000"  # sub rdx, 128
    )
    jnz = bytes.fromhex("0f85") + (-(len(body) + 6)).to_bytes(4, "little", signed=True)
    return body + jnz + bytes.fromhex("0faef8c5f877c3")  # sfence; vzeroupper; ret


def _x86_linux() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64") and sys.platform.startswith("linux")


class _MachineCode:
    """`with _MachineCode(code, restype, *argtypes) as fn:` x86-64 machine code mapped
    executable as a ctypes function (which releases the GIL while it runs), None where it
    cannot be (not x86-64 Linux, or a CPU feature in `needs` the host lacks). Why machine
    code and not LLVM: the probes must measure the hardware, not what a compiler made of a
    loop, and must not depend on the JIT this module sits beside."""

    def __init__(self, code: bytes, restype, *argtypes, needs: tuple[str, ...] = ()) -> None:
        self.code, self.restype, self.argtypes, self.needs = code, restype, argtypes, needs
        self.addr = None

    def __enter__(self):
        self.addr = None
        if not _x86_linux():
            return None
        if self.needs:
            feats = llvm.get_host_cpu_features()
            if not all(feats.get(f, False) for f in self.needs):
                return None
        libc = ctypes.CDLL(None, use_errno=True)
        self.mmap, mprotect, self.munmap = libc.mmap, libc.mprotect, libc.munmap
        self.mmap.restype = ctypes.c_void_p
        self.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int, ctypes.c_long]  # fmt: skip
        mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        self.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        addr = self.mmap(None, 4096, 0x1 | 0x2, 0x02 | 0x20, -1, 0)  # RW, private anonymous
        if addr in (None, ctypes.c_void_p(-1).value):
            return None
        self.addr = addr
        ctypes.memmove(addr, self.code, len(self.code))
        if mprotect(addr, 4096, 0x1 | 0x4) != 0:  # RX
            return None
        return ctypes.CFUNCTYPE(self.restype, *self.argtypes)(addr)

    def __exit__(self, *exc) -> None:
        if self.addr is not None:
            self.munmap(self.addr, 4096)
            self.addr = None


class _ClockProbe(_MachineCode):
    """`with _ClockProbe() as fn:` `fn(n)` returns n * _ADDS and takes n * _ADDS cycles."""

    def __init__(self) -> None:
        super().__init__(_clock_code(), ctypes.c_int64, ctypes.c_int64)


class _NtCopyProbe(_MachineCode):
    """`with _NtCopyProbe() as copy:` `copy(dst, src)` copies one aligned array into another
    with non-temporal stores (`_nt_copy_code`); None without AVX or off x86-64 Linux. The
    arrays are checked first: the machine code itself would fault or scribble on bad ones."""

    def __init__(self) -> None:
        super().__init__(_nt_copy_code(), None, ctypes.c_void_p, ctypes.c_void_p,
                         ctypes.c_int64, needs=("avx",))  # fmt: skip

    def __enter__(self):
        fn = super().__enter__()
        if fn is None:
            return None

        def copy(dst: np.ndarray, src: np.ndarray) -> None:
            for name, a in (("dst", dst), ("src", src)):
                if not isinstance(a, np.ndarray) or not a.flags.c_contiguous:
                    raise ValueError(f"non-temporal copy: {name} must be a C-contiguous array")
            if not dst.flags.writeable:
                raise ValueError("non-temporal copy: dst is read-only")
            if dst.nbytes != src.nbytes:
                raise ValueError(f"non-temporal copy: {dst.nbytes} bytes into {src.nbytes}")
            if dst.nbytes % _NT_STEP:
                raise ValueError(f"non-temporal copy: {dst.nbytes} bytes is not a multiple "
                                 f"of {_NT_STEP}")  # fmt: skip
            if dst.ctypes.data % 32:
                raise ValueError("non-temporal copy: dst is not 32-byte aligned")
            if dst.nbytes:
                fn(dst.ctypes.data, src.ctypes.data, dst.nbytes)

        return copy


def aligned_empty(nbytes: int, align: int = _NT_ALIGN) -> np.ndarray:
    """An uninitialised uint8 array of `nbytes` starting on an `align`-byte boundary (numpy
    guarantees only 16)."""
    if nbytes < 0 or align <= 0 or align & (align - 1):
        raise ValueError(f"aligned_empty({nbytes}, {align}): need nbytes >= 0, align a power of 2")
    raw = np.empty(nbytes + align, np.uint8)
    off = -raw.ctypes.data % align
    return raw[off : off + nbytes]


def measure_clock(reps: int = 12) -> float:
    """Core clock (Hz), from a dependent chain of integer adds (one cycle each on every
    x86-64 core; machine code mapped executable, as `_threads` maps its lane): the best of
    `reps` runs of ~10 M cycles, timed in thread CPU time, so a run preempted by another
    process on a shared host is not counted slow (wall time gave 2.6-4.3 GHz under load 5 on
    this project's 2-vCPU VM). 0.0 where the probe cannot run (not x86-64 Linux)."""
    with _ClockProbe() as fn:
        if fn is None:
            return 0.0
        n = 50_000
        fn(n)
        best = math.inf
        for _ in range(reps):
            t0 = time.thread_time()
            fn(n)
            t = time.thread_time() - t0
            if t > 0:
                best = min(best, t)
        return _ADDS * n / best if math.isfinite(best) else 0.0


def measure_copy(nbytes: int, threads: int, reps: int = 4, inner: int = 2,
                 copy: Callable[[np.ndarray, np.ndarray], None] = np.copyto) -> float:  # fmt: skip
    """Best copy bandwidth (bytes/s, one read + one write per byte) of `threads` threads each
    copying its own `nbytes // threads` buffer (rounded up to _NT_STEP, 64-byte aligned)
    `inner` times with `copy(dst, src)` (np.copyto or the non-temporal probe: both release
    the GIL), started together; best of `reps`, each run timed from the first thread's start
    to the last one's end. A run counts when every thread ran all that span (thread CPU time
    >= 90 % of it): on a shared host a descheduled thread leaves the bandwidth to the others,
    which then look twice as fast (measured: 80 GB/s on 2 threads under load 6, 46 GB/s
    quiet). With no such run, the best span (pessimistic, never inflated)."""
    threads = max(1, threads)
    per = -(-max(4096, nbytes // threads) // _NT_STEP) * _NT_STEP
    srcs = [aligned_empty(per).view(np.float64) for _ in range(threads)]
    for s in srcs:
        s.fill(1.0)
    dsts = [aligned_empty(per).view(np.float64) for _ in range(threads)]
    start = threading.Barrier(threads)

    def work(k: int, out: list) -> None:
        for _ in range(reps + 1):
            start.wait()
            w0, c0 = time.perf_counter(), time.thread_time()
            for _ in range(inner):
                copy(dsts[k], srcs[k])
            out.append((w0, time.perf_counter(), time.thread_time() - c0))

    results: list[list] = [[] for _ in range(threads)]
    pool = [threading.Thread(target=work, args=(k, results[k])) for k in range(1, threads)]
    for t in pool:
        t.start()
    work(0, results[0])
    for t in pool:
        t.join()
    clean, spans = [], []
    for r in range(1, reps + 1):  # run 0 faults the pages in
        runs = [res[r] for res in results]
        span = max(e for _, e, _ in runs) - min(s for s, _, _ in runs)
        if all(c >= 0.9 * span for _, _, c in runs):
            clean.append(span)
        spans.append(span)
    best = min(clean) if clean else min(spans)
    return 2 * per * threads * inner / best if best > 0 else 0.0


def measure_nt_copy(nbytes: int, threads: int, reps: int = 4, inner: int = 2) -> float:
    """`measure_copy` with non-temporal stores (`_NtCopyProbe`): the DRAM bandwidth a kernel
    whose outputs skip the cache could reach. 0.0 where the probe cannot run (no AVX, not
    x86-64 Linux)."""
    with _NtCopyProbe() as copy:
        if copy is None:
            return 0.0
        return measure_copy(nbytes, threads, reps, inner, copy=copy)


@dataclass
class _Cache:
    roofs: dict[str, HostRoofs] = field(default_factory=dict)  # by host key + vector width
    measured: dict[str, tuple[dict, str]] = field(default_factory=dict)  # by host key


_cache = _Cache()


def _host_key(cpu: str, threads: int) -> str:
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpu}|{model}|{threads}|{os.cpu_count()}"


def _cache_file():
    return cache_dir() / "host_roofs.json" if disk_enabled() else None


def host_roofs(target, refresh: bool = False) -> HostRoofs:
    """This host's roofs for code built for `target` (a `host.HostTarget`: vector width, caches)
    at the current thread count (measured once per host and thread count, see the module
    docstring)."""
    cpu = llvm.get_host_cpu_name()
    threads = num_threads()
    key = _host_key(cpu, threads)
    ck = f"{key}|{target.vector_bits}"
    with _lock:
        got = _cache.roofs.get(ck)
        if got is not None and not refresh:
            return got
        uarch = UARCH.get(cpu, DEFAULT_UARCH)
        llc = max(1, target.l3) * max(1, target.cores)
        measured, source = (None, "") if refresh else _cache.measured.get(key, (None, ""))
        if measured is None and not refresh:
            measured, source = _load(key, uarch), "cached"
        if measured is None:
            measured, source = _measure(llc, threads), "measured"
            measured = _store(key, uarch, measured)
        _cache.measured[key] = (measured, source)
        roofs = HostRoofs(cpu, target.vector_bits, uarch, threads=threads, llc_bytes=llc,
                          source=source, **measured)  # fmt: skip
        _cache.roofs[ck] = roofs
        return roofs


def _measure(llc: int, threads: int) -> dict:
    clock = 0.0
    try:
        clock = measure_clock()
    except Exception:  # noqa: BLE001 - no JIT / asm: fall back to the nominal clock below
        clock = 0.0
    if not clock:
        clock = _nominal_clock()
    big = min(max(2 * llc, 64 << 20), 512 << 20)
    small = max(1 << 20, llc // 4)
    return {
        "clock_hz": clock,
        "dram_bw1": measure_copy(big, 1),
        "dram_bw": measure_copy(big, threads),
        "cache_bw1": measure_copy(small, 1, inner=8),
        "nt_bw": measure_nt_copy(big, threads),
    }


# what _measure returns; a host_roofs.json entry lacking one (an older file) is measured again
_MEASURED = ("clock_hz", "dram_bw1", "dram_bw", "cache_bw1", "nt_bw")


def _nominal_clock() -> float:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("cpu MHz"):
                    return float(line.split(":", 1)[1]) * 1e6
    except (OSError, ValueError):
        pass
    return 3e9


def _load(key: str, uarch: Uarch) -> dict | None:
    path = _cache_file()
    try:
        data = json.loads(path.read_text()) if path is not None else {}
    except (OSError, ValueError):
        return None
    entry = data.get(key)
    if not isinstance(entry, dict) or entry.get("uarch") != asdict(uarch):
        return None
    try:
        return {k: float(entry[k]) for k in _MEASURED}
    except (KeyError, TypeError, ValueError):
        return None


def _store(key: str, uarch: Uarch, measured: dict) -> dict:
    """Write `measured` to host_roofs.json (merged with the file's entry, best of both) and
    return what was written."""
    path = _cache_file()
    if path is None:
        return measured
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            data = {}
        old = data.get(key)
        if isinstance(old, dict) and old.get("uarch") == asdict(uarch):
            # a probe is only ever slowed by other load, never sped up: keep the best of all
            measured = {k: max(v, float(old.get(k, 0.0))) for k, v in measured.items()}
        data[key] = {**measured, "uarch": asdict(uarch)}
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache directory: measure again next process
    return measured
