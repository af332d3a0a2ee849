"""The GEMM microkernel library: host GEMM microkernels as out-of-line, disk-cached functions.

    addr = uklib.address("lazymath_uk_6x64v16_pf1_u4")   # loads (disk) or compiles it once

A matmul kernel's register-blocked microkernels (`gemm.get_ukernel`: explicit vector code,
60-120 KB of IR each) are most of its LLVM IR and of its quick (tier-0) compile. When a matmul
kernel starts on tier-0 code (`compile._start_llvm`, the realize path), it is lowered with the
switch `gemm.UK_LIBRARY` set: its microkernels are *declared* as external functions named here,
``lazymath_uk_<mr>x<nr>v<vw>[m]_pf<lines>[_u<unroll>]`` (+ ``.<cpu>`` under a forced
LAZYMATH_TARGET_CPU, like `vmath.call_symbol`), with `gemm.UK_FNTYPE`'s signature. Each is one
library function: requested as soon as the lowering meets it, so its compile runs on one
compile worker while the rest of the kernel is lowered and its small driver compiles on the
other; loaded from the disk cache (a header of kind "uklib", with the IR text as a part) by
every later process -- a new matmul shape then compiles only its driver.

The library's code is compiled like a tier-0 GEMM kernel was (no IR passes, the full code
generator: the microkernel is explicit vector code with a hand-unrolled k loop). Tier-0 kernels
call it directly (elfload resolves the symbol through `jit.runtime_symbol`, MCJIT through
`publish`). The optimized (tier-up) version of the kernel does not call it: `inline` pastes the
definitions back into the kernel's IR as internal functions, so the O3 code is the kernel
compiled whole, as without the library. Same FMAs in the same order either way: identical
results (tests/backend/test_uklib.py).
"""

from __future__ import annotations

import os
import re
import threading

from lazymath.backend.host import gemm
from lazymath.backend.host.gemm import C0, LINE
from lazymath.backend.host.vmlib import for_target, publish  # one name table, one target switch
from lazymath.backend.native import elfload, jit, kernel_cache, workers

PREFIX = gemm.UK_PREFIX
_NAME = re.compile(r"(\d+)x(\d+)v(\d+)(m?)_pf(\d+)(?:_u(\d+))?(_nd)?")
_TARGET = re.compile(r"[A-Za-z0-9_-]+")

_lock = threading.Lock()
_fns: dict[str, _Fn] = {}
_stats = {"compiled": 0, "disk_hits": 0}


ENABLED = True  # False: tier-0 matmul kernels keep their microkernels inside (tests compare)


def parse(symbol: str) -> tuple[tuple, str] | None:
    """((rows, nr, vw, fma, pf_lines, unroll, nd), target) of a library symbol, or None."""
    if not symbol.startswith(PREFIX):
        return None
    shape, dot, target = symbol[len(PREFIX) :].partition(".")
    m = _NAME.fullmatch(shape)
    if m is None or (dot and not _TARGET.fullmatch(target)):
        return None
    rows, nr, vw, nofma, pf, unroll, nd = m.groups()
    return (int(rows), int(nr), int(vw), not nofma, int(pf), int(unroll or 0), bool(nd)), target


def library_ir(symbol: str) -> str:
    """LLVM IR text of one library function: the microkernel `gemm.get_ukernel` generates for
    the shape the symbol names, written directly as text (`_ukernel_text`: the same loads,
    FMAs and stores in the same order as the llvmlite version, several times cheaper to
    produce -- the first call of a new matmul waits for it)."""
    from llvmlite import ir

    parsed = parse(symbol)
    if parsed is None:
        raise ValueError(f"not a GEMM microkernel library symbol: {symbol!r}")
    (rows, nr, vw, fma, pf, unroll, nd), target = parsed
    uk = gemm.Microkernel(gemm.MR, nr, vw, fma)  # raises for shapes gemm does not generate
    # the name says how the k loop is unrolled: it must be what gemm generates now
    token = gemm.UK_LIBRARY.set(lambda _s: None)
    try:
        made = gemm.get_ukernel(ir.Module(), uk, pf, nr, rows, nd=nd).name
    finally:
        gemm.UK_LIBRARY.reset(token)
    if made != gemm.uk_symbol(symbol[len(PREFIX) :].partition(".")[0], target) or rows > gemm.MR:
        raise ValueError(f"{symbol!r} is not a microkernel this gemm generates ({made!r})")
    return _ukernel_text(symbol, rows, nr, vw, fma, pf, unroll or gemm.C0, nd)


def _ukernel_text(symbol: str, mr: int, nr: int, vw: int, fma: bool, pf_lines: int,
                  unroll: int, nd: bool = False) -> str:  # fmt: skip
    """`gemm.get_ukernel` as LLVM IR text (see its doc for the arguments and the loops; `nd`:
    A row-major in place, `%astr` its row stride)."""
    nf, nj = nr // C0, C0 // vw
    vt = f"<{vw} x float>"
    al = min(4 * vw, 32)
    out: list[str] = []
    count = iter(range(1 << 30))

    def tmp() -> str:
        return f"%t{next(count)}"

    def ins(line: str) -> None:
        out.append("  " + line)

    def gep(p: str, idx) -> str:
        if idx == 0:
            return p
        r = tmp()
        ins(f"{r} = getelementptr inbounds float, ptr {p}, i64 {idx}")
        return r

    def stride(base: str, f: int) -> str:  # base + f * stride (`f` fractal columns on)
        off = tmp()
        ins(f"{off} = mul i64 {base}, {f}")
        return off

    def prefetch(p: str, locality: int) -> None:
        ins(f'call void @"llvm.prefetch.p0"(ptr {p}, i32 0, i32 {locality}, i32 1)')

    def vload(p: str) -> str:
        r = tmp()
        ins(f"{r} = load {vt}, ptr {p}, align {al}")
        return r

    slots = [(r, f, j) for r in range(mr) for f in range(nf) for j in range(nj)]
    out.append(
        f'define void @"{symbol}"(ptr noalias %a, ptr noalias %b, ptr noalias %c, '
        "i64 %nfc, i64 %astr, i64 %bstr, i64 %cstr, i32 %accf, ptr %pfb, ptr %pfc)"
    )
    out.append("{")
    out.append("entry:")
    arow = [0] + [stride("%astr", r) for r in range(1, mr)] if nd else []
    cf, pcf = ["%c"], ["%pfc"]
    for f in range(1, nf):
        off = stride("%cstr", f)
        cf.append(gep("%c", off))
        pcf.append(gep("%pfc", off))
    for f in range(nf):
        for r in range(mr):
            prefetch(gep(pcf[f], r * C0), 3)
    c_at = {(r, f, j): gep(cf[f], r * C0 + j * vw) for r, f, j in slots}
    ins("%doload = icmp ne i32 %accf, 0")
    ins("br i1 %doload, label %load, label %go")
    out.append("load:")
    loaded = [vload(c_at[s]) for s in slots]
    ins("br label %go")
    out.append("go:")
    for i, v in enumerate(loaded):
        ins(f"%init{i} = phi {vt} [zeroinitializer, %entry], [{v}, %load]")
    ins("br label %khead")
    out.append("khead:")
    latch = "qend" if unroll < C0 else "kbody"
    ins(f"%kv = phi i64 [0, %go], [%kv.next, %{latch}]")
    for p, start in (("pa", "%a"), ("pb", "%b"), ("ppf", "%pfb")):
        ins(f"%{p} = phi ptr [{start}, %go], [%{p}.next, %{latch}]")
    acc_phi = len(out)
    out.extend([""] * len(slots))  # the accumulator phis, filled in below
    ins("%kc = icmp slt i64 %kv, %nfc")
    ins("br i1 %kc, label %kbody, label %kend")
    out.append("kbody:")
    fcp = ["%ppf"] + [gep("%ppf", stride("%bstr", f)) for f in range(1, nf)]
    for kk in range(min(pf_lines, C0)):
        for f in range(nf):
            prefetch(gep(fcp[f], kk * LINE), 2)

    def steps(pa: str, pb: str, cur: list, n: int) -> list:
        fcb = [pb] + [gep(pb, stride("%bstr", f)) for f in range(1, nf)]
        for kk in range(n):
            bv = [[vload(gep(fcb[f], kk * C0 + j * vw)) for j in range(nj)] for f in range(nf)]
            for r in range(mr):
                s, v0, v = tmp(), tmp(), tmp()
                if nd and r:
                    at = tmp()
                    ins(f"{at} = add i64 {arow[r]}, {kk}")
                else:
                    at = kk if nd else r * C0 + kk
                ins(f"{s} = load float, ptr {gep(pa, at)}, align 4")
                ins(f"{v0} = insertelement {vt} undef, float {s}, i32 0")
                ins(f"{v} = shufflevector {vt} {v0}, {vt} undef, <{vw} x i32> zeroinitializer")
                for f in range(nf):
                    for j in range(nj):
                        i = (r * nf + f) * nj + j
                        new = tmp()
                        if fma:
                            ins(f'{new} = call {vt} @"llvm.fma.v{vw}f32"({vt} {v}, '
                                f"{vt} {bv[f][j]}, {vt} {cur[i]})")  # fmt: skip
                        else:
                            m = tmp()
                            ins(f"{m} = fmul {vt} {v}, {bv[f][j]}")
                            ins(f"{new} = fadd {vt} {m}, {cur[i]}")
                        cur[i] = new
        return cur

    accs = [f"%acc{i}" for i in range(len(slots))]
    if unroll >= C0:
        cur = steps("%pa", "%pb", list(accs), C0)
    else:  # the 16 k steps of a fractal column as a loop of `unroll`-step bodies
        ins("br label %qhead")
        out.append("qhead:")
        ins("%q = phi i64 [0, %kbody], [%q.next, %qbody]")
        ins("%qa = phi ptr [%pa, %kbody], [%qa.next, %qbody]")
        ins("%qb = phi ptr [%pb, %kbody], [%qb.next, %qbody]")
        q_phi = len(out)
        out.extend([""] * len(slots))
        ins(f"%qc = icmp slt i64 %q, {C0}")
        ins("br i1 %qc, label %qbody, label %qend")
        out.append("qbody:")
        qacc = [f"%qacc{i}" for i in range(len(slots))]
        qcur = steps("%qa", "%qb", list(qacc), unroll)
        ins(f"%q.next = add i64 %q, {unroll}")
        ins(f"%qa.next = getelementptr inbounds float, ptr %qa, i64 {unroll}")
        ins(f"%qb.next = getelementptr inbounds float, ptr %qb, i64 {unroll * C0}")
        ins("br label %qhead")
        for i in range(len(slots)):
            out[q_phi + i] = f"  %qacc{i} = phi {vt} [%acc{i}, %kbody], [{qcur[i]}, %qbody]"
        out.append("qend:")
        cur = qacc
    ins("%kv.next = add i64 %kv, 1")
    ins(f"%pa.next = getelementptr inbounds float, ptr %pa, i64 {C0 if nd else '%astr'}")
    ins(f"%pb.next = getelementptr inbounds float, ptr %pb, i64 {C0 * C0}")
    ins(f"%ppf.next = getelementptr inbounds float, ptr %ppf, i64 {C0 * C0}")
    ins("br label %khead")
    for i in range(len(slots)):
        out[acc_phi + i] = f"  %acc{i} = phi {vt} [%init{i}, %go], [{cur[i]}, %{latch}]"
    out.append("kend:")
    for i, s in enumerate(slots):
        ins(f"store {vt} %acc{i}, ptr {c_at[s]}, align {al}")
    ins("ret void")
    out.append("}")
    out.append("")
    out.append('declare void @"llvm.prefetch.p0"(ptr, i32, i32, i32)')
    if fma:
        out.append(f'declare {vt} @"llvm.fma.v{vw}f32"({vt}, {vt}, {vt})')
    return "\n".join(out) + "\n"


class _Fn:
    """One library function in this process: its code's address once ready."""

    def __init__(self, symbol: str, target: str) -> None:
        self.symbol, self.target = symbol, target
        self.key = kernel_cache.disk_key(repr(("uklib", symbol)), jit.host_key(target))
        self.module = f"lmuk_{self.key[:24]}"
        self.addr = 0
        self.text: str | None = None  # its IR (for `inline`)
        self.ready = threading.Event()
        self.error: BaseException | None = None


def requested(symbol: str) -> bool:
    """Is `symbol` loaded, being loaded or being compiled in this process?"""
    return symbol in _fns


def request(symbol: str) -> None:
    """Start loading (disk) or compiling `symbol` without waiting (`address` waits)."""
    _request(symbol)


def _request(symbol: str) -> _Fn:
    parsed = parse(symbol)
    if parsed is None:
        raise ValueError(f"not a GEMM microkernel library symbol: {symbol!r}")
    with _lock:
        fn = _fns.get(symbol)
        if fn is not None:
            return fn
        fn = _fns[symbol] = _Fn(symbol, parsed[1])
    try:
        if not _load(fn):
            _compile(fn)
    except BaseException as e:
        _failed(fn, e)
        raise
    return fn


def _failed(fn: _Fn, e: BaseException) -> None:
    fn.error = e
    fn.ready.set()
    with _lock:
        if _fns.get(fn.symbol) is fn:
            del _fns[fn.symbol]  # a later request tries again


def _compile(fn: _Fn) -> None:
    for_target(fn.target, _compile_here, fn)


_texts: dict[str, str] = {}  # symbol -> library IR text (generated or loaded)


def text(symbol: str) -> str:
    """The library IR of `symbol` (for `inline`), generated once per process."""
    t = _texts.get(symbol)
    if t is None:
        t = _texts[symbol] = library_ir(symbol)
    return t


def _compile_here(fn: _Fn) -> None:
    fn.text = text(fn.symbol)
    fut = workers.submit(fn.text, fn.module, 0)  # code generation only (see the module doc)
    fut.add_done_callback(lambda f: _linked(fn, f))


def _linked(fn: _Fn, fut) -> None:
    """The compile finished (on a worker thread): link the code, store it on disk."""
    try:
        obj = fut.result()
        addr, _how = jit.load_cached(obj, fn.symbol, fn.module)
        _stats["compiled"] += 1
        kernel_cache.disk_store(fn.key, {"symbol": fn.symbol, "kind": "uklib",
                                         "name": fn.symbol}, obj,
                                {"ir": fn.text.encode()})  # fmt: skip
    except BaseException as e:  # noqa: BLE001 - whoever waits for the function gets it
        _failed(fn, e)
        return
    fn.addr = addr
    fn.ready.set()


def _load(fn: _Fn) -> bool:
    """The function from its disk-cache file (False: no usable file)."""
    cached = kernel_cache.disk_load(fn.key)
    if cached is None:
        return False
    try:
        if cached.header.get("symbol") != fn.symbol or cached.header.get("kind") != "uklib":
            raise ValueError("library entry names another symbol")
        text = cached.parts["ir"].decode()
        addr, _how = jit.load_cached(cached.obj, fn.symbol, fn.module)
    except (elfload.ElfLoadError, ValueError, KeyError, TypeError, RuntimeError,
            UnicodeDecodeError):  # fmt: skip
        kernel_cache.reject(fn.key)
        return False
    _stats["disk_hits"] += 1
    fn.text, fn.addr = text, addr
    _texts.setdefault(fn.symbol, text)
    fn.ready.set()
    return True


def address(symbol: str) -> int:
    """Address of library function `symbol`, waiting for its code (load or compile)."""
    fn = _request(symbol)
    fn.ready.wait()
    if fn.error is not None or not fn.addr:
        raise fn.error or RuntimeError(f"GEMM microkernel library function {symbol} failed")
    publish(symbol, fn.addr)
    return fn.addr


def resolve(name: str) -> int | None:
    """Address of a library symbol for the loaders (`jit.runtime_symbol`), None if `name` is
    not one. Callers wait for it outside the loader's lock (`compile._Job.finish`)."""
    if parse(name) is None:
        return None
    return address(name)


jit.register_library(PREFIX, resolve)


def _declared_name(line: str) -> str:
    return line[line.index("@") :].partition("(")[0]


_DEFINE = re.compile(r'^define void @"(?P<s>[^"]+)"', re.M)


def inline(kernel: str, symbols) -> str:
    """`kernel` (IR lowered under `gemm.UK_LIBRARY`) with each library function's declaration
    replaced by its definition, internal to the module: the kernel as it is lowered without
    the library (the optimizer inlines the microkernels into it)."""
    declared = {_declared_name(line) for line in kernel.splitlines()
                if line.startswith("declare ")}  # fmt: skip
    extra: list[str] = []
    for symbol in symbols:
        lib = text(symbol)
        at = kernel.find(f'declare void @"{symbol}"(')
        m = _DEFINE.search(lib)
        if at < 0 or m is None or m.group("s") != symbol:
            raise ValueError(f"cannot inline GEMM microkernel {symbol}")
        end = kernel.index("\n", at)
        body = (
            "define internal" + lib[m.start() + len("define") : lib.index("\n}\n", m.start()) + 2]
        )
        kernel = kernel[:at] + body + kernel[end:]
        for line in lib.splitlines():
            if line.startswith("declare ") and _declared_name(line) not in declared:
                declared.add(_declared_name(line))
                extra.append(line)
    return kernel + ("\n" + "\n".join(extra) + "\n" if extra else "")


def stats() -> dict:
    return {"uklib_compiled": _stats["compiled"], "uklib_disk_hits": _stats["disk_hits"],
            "uklib_loaded": len(_fns)}  # fmt: skip


def _after_fork_in_child() -> None:
    """A function whose compile was running in the parent never gets its code in the child
    (the workers are gone): forget it, the next request compiles it again. A fresh lock."""
    global _lock
    _lock = threading.Lock()
    for symbol, fn in list(_fns.items()):
        if not fn.ready.is_set():
            del _fns[symbol]


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
