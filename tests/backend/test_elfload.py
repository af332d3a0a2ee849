"""elfload: cached kernel objects loaded without LLVM run exactly like MCJIT's copy.

Protects: every kernel kind (elementwise with transcendentals and float16 conversions,
reductions split over blocks, matmul on both presets) gives bit-identical results through the
loader and through MCJIT, and matches the IR reference; every relocation type and external
symbol our objects contain is handled; malformed, foreign or unsupported objects are refused
before anything runs (and the compile path recompiles); W^X and section alignment; the
small-code-model relocations (PC32, PLT32 via stubs, GOTPCREL, data sections); a warm process
compiles nothing and never imports llvmlite.binding.
"""

from __future__ import annotations

import ctypes
import json
import os
import pickle
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from lazymath.backend import compile as bc
from lazymath.backend.compile import CompiledKernel, compile_kernel, view_extent
from lazymath.backend.native import elfload, jit, kernel_cache
from lazymath.backend.npu import isa_codec
from lazymath.backend.npu.ir_reference import run as reference_run
from lazymath.backend.npu.kernel_ir import (
    ArgView,
    ElementwiseKernel,
    MatmulKernel,
    ReduceKernel,
    SOp,
    contiguous_view,
    kernel_args,
)
from lazymath.runtime.device import get_spec

ROOT = Path(__file__).resolve().parents[2]
RNG = np.random.default_rng(5)


def L(dt: str, i: int) -> SOp:
    return SOp("load", dt, (), i)


def K(dt: str, c) -> SOp:
    return SOp("const", dt, (), c)


# ----------------------------------------------------------------------------- kernels

UNARY = ["neg", "abs", "exp", "log", "sqrt", "rsqrt", "reciprocal", "sin", "cos", "tanh",
         "sigmoid", "relu", "sign", "floor", "ceil", "round"]  # fmt: skip


def _unary_all(dt: str, n: int) -> ElementwiseKernel:
    """Every unary float op of one input in one multi-output kernel (log/sqrt get |x|+0.01)."""
    expr = [L(dt, 0), SOp("abs", dt, (0,)), K(dt, 0.01), SOp("add", dt, (1, 2))]
    for op in UNARY:
        expr.append(SOp(op, dt, (3 if op in ("log", "sqrt", "rsqrt") else 0,)))
    v = contiguous_view(dt, (n,))
    return ElementwiseKernel((n,), (v,), (v,) * len(UNARY), tuple(expr),
                             tuple(range(4, 4 + len(UNARY))))  # fmt: skip


def _casts(n: int) -> ElementwiseKernel:
    """float16 -> float32 -> int32 -> bool and back, pow, floor_divide, where."""
    h, f, i = "float16", "float32", "int32"
    expr = (L(h, 0), SOp("cast", f, (0,)), SOp("exp", f, (1,)), SOp("cast", i, (1,)),
            L(i, 1), SOp("floor_divide", i, (4, 3)), SOp("gt", "bool", (1, 2)),
            SOp("pow", f, (2, 1)), SOp("where", f, (6, 7, 1)), SOp("cast", h, (8,)),
            SOp("remainder", i, (4, 3)))  # fmt: skip
    return ElementwiseKernel((n,), (contiguous_view(h, (n,)), contiguous_view(i, (n,))),
                             (contiguous_view(h, (n,)), contiguous_view(i, (n,)),
                              contiguous_view("bool", (n,))), expr, (9, 10, 6))  # fmt: skip


def _big_elementwise(n: int) -> ElementwiseKernel:
    """Above the tiny-kernel limit: the O3 pipeline and several blocks."""
    f = "float32"
    expr = (L(f, 0), SOp("sin", f, (0,)), SOp("exp", f, (1,)), SOp("tanh", f, (2,)))
    v = contiguous_view(f, (n,))
    return ElementwiseKernel((n,), (v,), (v,), expr, (3,))


def _reduce(shape, axes, op: str, dt: str) -> ReduceKernel:
    keep = [d for d in range(len(shape)) if d not in axes]
    out_shape = tuple(shape[d] for d in keep)
    acc = "int64" if op in ("argmax", "argmin") else ("float32" if dt == "float16" else dt)
    pro = (L(dt, 0), SOp("exp", dt, (0,))) if op == "sum" else (L(dt, 0),)
    epi = (SOp("acc", acc),)
    return ReduceKernel(shape, axes, op, (contiguous_view(dt, shape),), pro, len(pro) - 1, acc,
                        out_shape, (), epi, (0,), (contiguous_view(acc, out_shape),))  # fmt: skip


def _matmul(m: int, n: int, k: int, dt: str) -> MatmulKernel:
    """relu(A @ B) * 0.5 + bias[n], output in the operand dtype (the issue-5 composite)."""
    epi = (SOp("acc", "float32"), SOp("relu", "float32", (0,)), K("float32", 0.5),
           SOp("mul", "float32", (1, 2)), SOp("load", "float32", (), 0),
           SOp("add", "float32", (3, 4)), SOp("cast", dt, (5,)))  # fmt: skip
    bias = ArgView("float32", (m, n), (0, 1), 0)  # broadcast over rows
    return MatmulKernel((), m, n, k, contiguous_view(dt, (m, k)), contiguous_view(dt, (k, n)),
                        None, None, dt, (bias,), epi, (6,),
                        (contiguous_view(dt, (m, n)),))  # fmt: skip


KERNELS = {
    "unary_f32": (lambda: _unary_all("float32", 1031), "ascend910"),
    "unary_f16": (lambda: _unary_all("float16", 1031), "ascend910"),
    "casts_f16_i32_bool": (lambda: _casts(997), "ascend910"),
    "elementwise_blocks_O3": (lambda: _big_elementwise(70001), "ascend910"),
    "reduce_sum_split": (lambda: _reduce((1 << 17,), (0,), "sum", "float32"), "ascend910"),
    "reduce_argmax_f16": (lambda: _reduce((37, 1031), (1,), "argmax", "float16"), "ascend910"),
    "reduce_max_axis0": (lambda: _reduce((300, 67), (0,), "max", "float32"), "ascend910b"),
    "matmul_f16_910": (lambda: _matmul(130, 257, 300, "float16"), "ascend910"),
    "matmul_f32_910": (lambda: _matmul(97, 64, 515, "float32"), "ascend910"),
    "matmul_f16_910b": (lambda: _matmul(130, 257, 300, "float16"), "ascend910b"),
    "matmul_f32_910b": (lambda: _matmul(61, 200, 77, "float32"), "ascend910b"),
}


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """A private, empty cache directory and an empty memory level (elfload on)."""
    monkeypatch.setenv("LAZYMATH_CACHE_DIR", str(tmp_path / "kc"))
    monkeypatch.delenv("LAZYMATH_CACHE", raising=False)
    monkeypatch.delenv("LAZYMATH_ELFLOAD", raising=False)
    kernel_cache.clear_cache(memory=True, disk=False)
    yield tmp_path / "kc"
    kernel_cache.clear_cache(memory=True, disk=False)


def _arrays(ir) -> list[np.ndarray]:
    """One flat buffer per kernel argument, random by dtype (outputs too: they get overwritten)."""
    out = []
    for v in kernel_args(ir):
        n = max(1, view_extent(v))
        dt = np.dtype(v.dtype)
        if dt.kind == "f":
            a = RNG.uniform(-3.0, 3.0, n).astype(dt)
        elif dt.kind == "b":
            a = RNG.integers(0, 2, n).astype(dt)
        else:
            a = RNG.integers(-50, 50, n).astype(dt)
            a[a == 0] = 7  # divisors
        out.append(a)
    return out


def _run_serial(k: CompiledKernel, arrays: list[np.ndarray]) -> None:
    """All blocks in order on this thread: deterministic even for split reductions."""
    argv = k.make_argv(arrays)
    for b in range(k.blocks):
        k.run_block(argv, b, k.blocks)


def _cached_object(ir, spec) -> tuple[str, kernel_cache.CacheEntry]:
    key, _ = bc._disk_key(ir, get_spec(spec))
    entry = kernel_cache.disk_load(key)
    assert entry is not None, "the compile did not store the kernel"
    return key, entry


@pytest.mark.parametrize("name", list(KERNELS))
def test_loader_matches_mcjit_and_reference(name, fresh_cache):
    make, spec = KERNELS[name]
    ir = make()
    before = kernel_cache.cache_info()["compiled"]
    k = compile_kernel(ir, get_spec(spec), "llvm")
    assert kernel_cache.cache_info()["compiled"] == before + 1  # MCJIT built it
    _, entry = _cached_object(ir, spec)
    lo = elfload.load(entry.obj, resolve=jit.runtime_symbol, entry=k.symbol)
    addr = lo.address(k.symbol)
    assert addr != jit.loaded_address(k.symbol)  # a second, independent copy of the code
    k_elf = CompiledKernel(k.name, ir, k.program, k.spec, "llvm", addr, k.symbol)
    inputs = _arrays(ir)
    via_mcjit, via_elf, ref = ([a.copy() for a in inputs] for _ in range(3))
    _run_serial(k, via_mcjit)
    _run_serial(k_elf, via_elf)
    for a, b in zip(via_mcjit, via_elf):
        assert a.tobytes() == b.tobytes()  # the same machine code: bit-identical
    reference_run(ir, ref)
    n_out = len(ir.outputs)
    for got, want in zip(via_elf[-n_out:], ref[-n_out:]):
        if got.dtype.kind == "f":
            tol = 2e-2 if got.dtype == np.float16 else 2e-4
            np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64),
                                       rtol=tol, atol=tol, equal_nan=True)  # fmt: skip
        else:
            np.testing.assert_array_equal(got, want)


def test_every_cached_object_is_covered(fresh_cache):
    """Scan the objects of every kernel kind: only implemented relocation types, and every
    external symbol resolves without LLVM."""
    seen: set[str] = set()
    from lazymath.backend import compile as bc

    for make, spec in KERNELS.values():
        compile_kernel(make(), get_spec(spec), "llvm")
    bc.wait_tiering(600)  # the vector math library's optimized code reaches the disk too
    files = kernel_cache.disk_files()
    entries = [kernel_cache.disk_load(p.name[: -len(kernel_cache.SUFFIX)]) for p in files]
    assert len([e for e in entries if e.header.get("kind") != "vmlib"]) == len(KERNELS)
    for entry in entries:
        info = elfload.scan(entry.obj)
        assert set(info["relocations"]) <= set(elfload.RELOC_NAMES.values()), info
        assert not any(s.startswith((".init_array", ".ctors")) for s in info["sections"])
        for sym in info["undefined"]:
            assert jit.runtime_symbol(sym) or elfload.process_symbol(sym), sym
        seen.update(info["relocations"])
    assert "R_X86_64_64" in seen  # MCJIT's large code model


def _maps_overlapping(base: int, size: int) -> list[tuple[int, int, str]]:
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            rng, perms = line.split()[:2]
            lo, hi = (int(x, 16) for x in rng.split("-"))
            if lo < base + size and hi > base:
                out.append((lo, hi, perms))
    return out


def test_w_xor_x_and_alignment(fresh_cache):
    make, spec = KERNELS["matmul_f16_910"]
    ir = make()
    k = compile_kernel(ir, get_spec(spec), "llvm")
    _, entry = _cached_object(ir, spec)
    lo = elfload.load(entry.obj, resolve=jit.runtime_symbol, entry=k.symbol)
    maps = _maps_overlapping(lo.base, lo.size)
    assert maps and all(not ("w" in p and "x" in p) for _, _, p in maps)
    code_lo, code_n = lo.code
    assert code_n > 0 and code_lo <= lo.address(k.symbol) < code_lo + code_n
    assert any(p.startswith("r-x") and a <= code_lo < b for a, b, p in maps)
    obj = elfload.parse(entry.obj)
    plan = elfload._plan(obj, elfload._loadable(obj))
    for s in elfload._loadable(obj):
        assert plan.sec_off[s.index] % s.align == 0, s.name


# ----------------------------------------------------------------------------- refusals


def _sample_object(fresh_cache) -> tuple[bytes, str]:
    make, spec = KERNELS["unary_f32"]
    ir = make()
    k = compile_kernel(ir, get_spec(spec), "llvm")
    return _cached_object(ir, spec)[1].obj, k.symbol


def _rela_entry(obj: bytes) -> int:
    """File offset of the first relocation of a loaded code section."""
    parsed = elfload.parse(obj)
    rela = next(s for s in parsed.sections
                if s.type == elfload.SHT_RELA and parsed.sections[s.info].flags
                & elfload.SHF_EXECINSTR and s.size)  # fmt: skip
    return rela.offset


def test_malformed_objects_raise_format_errors(fresh_cache):
    obj, sym = _sample_object(fresh_cache)
    bad = {
        "empty": b"",
        "truncated": obj[:200],
        "magic": b"\x7fELG" + obj[4:],
        "class32": obj[:4] + b"\x01" + obj[5:],
    }
    off = _rela_entry(obj)
    b = bytearray(obj)
    struct.pack_into("<Q", b, off, 1 << 40)  # r_offset far outside the section
    bad["reloc_offset"] = bytes(b)
    b = bytearray(obj)
    info = struct.unpack_from("<Q", b, off + 8)[0]
    struct.pack_into("<Q", b, off + 8, (0xFFFF << 32) | (info & 0xFFFFFFFF))  # symbol index
    bad["reloc_symbol"] = bytes(b)
    b = bytearray(obj)
    struct.pack_into("<Q", b, 0x28, len(obj) - 8)  # e_shoff: table runs off the end
    bad["section_table"] = bytes(b)
    for what, data in bad.items():
        with pytest.raises(elfload.ElfFormatError):
            elfload.load(data, resolve=jit.runtime_symbol, entry=sym)
            pytest.fail(what)
    with pytest.raises(elfload.ElfFormatError, match="no global function"):
        elfload.load(obj, resolve=jit.runtime_symbol, entry="not_in_this_object")


def test_unsupported_objects_raise_unsupported(fresh_cache):
    obj, sym = _sample_object(fresh_cache)
    off = _rela_entry(obj)
    b = bytearray(obj)
    info = struct.unpack_from("<Q", b, off + 8)[0]
    struct.pack_into("<Q", b, off + 8, (info & ~0xFFFFFFFF) | 37)  # R_X86_64_IRELATIVE
    with pytest.raises(elfload.ElfUnsupportedError, match="relocation type 37"):
        elfload.load(bytes(b), resolve=jit.runtime_symbol, entry=sym)
    # an external symbol nobody defines
    undefined = elfload.scan(obj)["undefined"]
    assert undefined
    name = undefined[0].encode() + b"\0"
    b = bytearray(obj)
    i = b.index(b"\0" + name) + 1
    b[i : i + 1] = b"Z"
    with pytest.raises(elfload.ElfUnsupportedError, match="undefined symbol"):
        elfload.load(bytes(b), resolve=jit.runtime_symbol, entry=sym)
    # a constructor section
    parsed = elfload.parse(obj)
    shoff = struct.unpack_from("<Q", obj, 0x28)[0]
    code = next(s for s in parsed.sections if s.flags & elfload.SHF_EXECINSTR and s.size)
    b = bytearray(obj)
    struct.pack_into("<I", b, shoff + code.index * 64 + 4, elfload.SHT_INIT_ARRAY)
    with pytest.raises(elfload.ElfUnsupportedError, match="constructors"):
        elfload.load(bytes(b), resolve=jit.runtime_symbol, entry=sym)


# ----------------------------------------------------------------------------- compile path


def _fresh_ir(n: int) -> ElementwiseKernel:
    f = "float32"
    v = contiguous_view(f, (n,))
    return ElementwiseKernel((n,), (v,), (v,), (L(f, 0), SOp("sin", f, (0,))), (1,))


def _plant(ir, spec: str, obj: bytes, program_blob: bytes | None = None) -> str:
    """Write a checksum-valid cache file for `ir` holding `obj` (and a program)."""
    key, _ = bc._disk_key(ir, get_spec(spec))
    if program_blob is None:
        program_blob = isa_codec.encode(bc.build_program(ir, get_spec(spec), "k_elementwise"))
    header = {"symbol": f"lm_{ir.kind}_{key[:24]}", "kind": ir.kind, "name": "k_elementwise"}
    kernel_cache.disk_store(key, header, obj, {"program": program_blob})
    return key


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


@pytest.mark.parametrize("elfload_env", ["1", "0"])
@pytest.mark.parametrize("damage", ["garbage", "foreign", "evil_program"])
def test_bad_entry_is_recompiled_never_executed(fresh_cache, monkeypatch, damage, elfload_env):
    monkeypatch.setenv("LAZYMATH_ELFLOAD", elfload_env)
    n = {"garbage": 3001, "foreign": 3002, "evil_program": 3003}[damage] + 10 * int(elfload_env)
    ir = _fresh_ir(n)
    if damage == "garbage":
        key = _plant(ir, "ascend910", b"\x7fELF" + bytes(range(256)) * 4)
    elif damage == "foreign":  # a valid object of another kernel (another symbol)
        other = _fresh_ir(n + 5000)
        compile_kernel(other, get_spec("ascend910"), "llvm")
        key = _plant(ir, "ascend910", _cached_object(other, "ascend910")[1].obj)
    else:
        key = _plant(ir, "ascend910", b"", pickle.dumps(_Evil()))
    before = kernel_cache.cache_info()
    k = compile_kernel(ir, get_spec("ascend910"), "llvm")
    after = kernel_cache.cache_info()
    assert after["disk_rejected"] - before["disk_rejected"] == 1
    assert after["compiled"] - before["compiled"] == 1
    assert after["disk_hits"] == before["disk_hits"]
    x = np.linspace(-3, 3, n, dtype=np.float32)
    o = np.zeros_like(x)
    k(x, o)
    np.testing.assert_allclose(o, np.sin(x), atol=1e-6)
    assert kernel_cache.disk_load(key).obj[:4] == b"\x7fELF"  # replaced by the real kernel


@pytest.mark.parametrize("elfload_env", ["1", "0"])
def test_unresolvable_symbol_is_recompiled_not_handed_to_mcjit(fresh_cache, monkeypatch,
                                                              elfload_env):  # fmt: skip
    """A well-formed object needing a symbol nobody defines: MCJIT would abort the process on
    it, so both paths refuse it and the kernel is recompiled."""
    monkeypatch.setenv("LAZYMATH_ELFLOAD", elfload_env)
    x_ir = _unary_all("float32", 1041 + int(elfload_env))
    y_ir = _unary_all("float32", 1051 + int(elfload_env))
    kx = compile_kernel(x_ir, get_spec("ascend910"), "llvm")
    obj = bytearray(_cached_object(x_ir, "ascend910")[1].obj)
    key_y, _ = bc._disk_key(y_ir, get_spec("ascend910"))
    sym_y = f"lm_elementwise_{key_y[:24]}".encode()
    i = obj.index(kx.symbol.encode() + b"\0")
    obj[i : i + len(sym_y)] = sym_y  # X's code under Y's symbol (same length)
    name = elfload.scan(bytes(obj))["undefined"][0].encode()
    j = obj.index(b"\0" + name + b"\0") + 1
    obj[j : j + 1] = b"Z"  # memcpy -> Zemcpy
    _plant(y_ir, "ascend910", bytes(obj))
    before = kernel_cache.cache_info()
    k = compile_kernel(y_ir, get_spec("ascend910"), "llvm")
    after = kernel_cache.cache_info()
    assert after["disk_rejected"] - before["disk_rejected"] == 1
    assert after["compiled"] - before["compiled"] == 1
    a = _arrays(y_ir)
    ref = [x.copy() for x in a]
    _run_serial(k, a)
    reference_run(y_ir, ref)
    np.testing.assert_allclose(a[-1], ref[-1], rtol=2e-4, atol=2e-4, equal_nan=True)


def test_forced_mcjit_loads_the_same_kernel(fresh_cache, monkeypatch):
    """LAZYMATH_ELFLOAD=0: a disk hit goes through MCJIT (counted as such)."""
    make, spec = KERNELS["reduce_argmax_f16"]
    ir = make()
    key, _ = bc._disk_key(ir, get_spec(spec))
    k = compile_kernel(ir, get_spec(spec), "llvm")
    symbol = k.symbol
    # drop this process's copy so the next load really reads the file
    kernel_cache.clear_cache(memory=True, disk=False)
    with jit._native_lock:
        jit._native.pop(symbol)
    monkeypatch.setenv("LAZYMATH_ELFLOAD", "0")
    before = kernel_cache.cache_info()
    k2 = compile_kernel(ir, get_spec(spec), "llvm")
    after = kernel_cache.cache_info()
    assert after["disk_hits"] - before["disk_hits"] == 1
    assert (
        after["mcjit_loads"] - before["mcjit_loads"] == 1
        and after["compiled"] == before["compiled"]
    )
    a = _arrays(ir)
    b = [x.copy() for x in a]
    _run_serial(k, a)
    _run_serial(k2, b)
    assert all(x.tobytes() == y.tobytes() for x, y in zip(a, b))


# ----------------------------------------------------------------------------- code models

_SMALL_IR = """
@table = internal constant [4 x float] [float 1.0, float 2.0, float 3.0, float 4.0]
@counter = internal global i64 0
@lazymath_gemm_ws_key = external global i32
declare float @sinf(float)
declare ptr @memset(ptr, i32, i64)

define float @t_read(i64 %i) {
  %p = getelementptr [4 x float], ptr @table, i64 0, i64 %i
  %v = load float, ptr %p
  %s = call float @sinf(float %v)
  ret float %s
}
define i64 @t_count() {
  %c = load i64, ptr @counter
  %n = add i64 %c, 1
  store i64 %n, ptr @counter
  ret i64 %n
}
define i32 @t_ext() {
  %v = load i32, ptr @lazymath_gemm_ws_key
  ret i32 %v
}
define void @t_fill(ptr %p, i64 %n) {
  %r = call ptr @memset(ptr %p, i32 7, i64 %n)
  ret void
}
"""


def _emit(ir_text: str, codemodel: str, reloc: str) -> bytes:
    import llvmlite.binding as llvm

    jit.get_jit()  # initializes the native target
    tm = llvm.Target.from_default_triple().create_target_machine(
        opt=0, codemodel=codemodel, reloc=reloc
    )
    mod = llvm.parse_assembly(ir_text)
    mod.triple = llvm.get_process_triple()
    return tm.emit_object(mod)


CODE_MODELS = [("small", "pic"), ("medium", "pic"), ("large", "pic"), ("large", "static"),
               ("medium", "static")]  # fmt: skip


@pytest.mark.parametrize("codemodel,reloc", CODE_MODELS)
def test_code_models(codemodel, reloc):
    """PC32, PLT32 (through in-image stubs: libc is further than 2 GiB), GOTPCREL[X], GOTPC32,
    GOTOFF64, GOT64, GOTPC64, R_X86_64_64; constants, a zeroed writable .bss, an external data
    symbol and external functions."""
    obj = _emit(_SMALL_IR, codemodel, reloc)
    relocs = set(elfload.scan(obj)["relocations"])
    assert relocs <= set(elfload.RELOC_NAMES.values()), relocs
    if (codemodel, reloc) == ("small", "pic"):
        assert {"R_X86_64_PC32", "R_X86_64_PLT32"} <= relocs
        assert relocs & {"R_X86_64_GOTPCREL", "R_X86_64_GOTPCRELX", "R_X86_64_REX_GOTPCRELX"}
    lo = elfload.load(obj, resolve=jit.runtime_symbol)
    read = ctypes.CFUNCTYPE(ctypes.c_float, ctypes.c_int64)(lo.address("t_read"))
    count = ctypes.CFUNCTYPE(ctypes.c_int64)(lo.address("t_count"))
    ext = ctypes.CFUNCTYPE(ctypes.c_int32)(lo.address("t_ext"))
    fill = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)(lo.address("t_fill"))
    for i in range(4):
        assert read(i) == pytest.approx(np.sin(np.float32(i + 1)), abs=1e-6)
    assert [count(), count(), count()] == [1, 2, 3]  # zeroed, writable .bss
    key = ctypes.c_int32.from_address(jit.runtime_symbol(jit.WS_KEY_SYMBOL)).value
    assert ext() == key
    buf = np.zeros(37, np.uint8)
    fill(buf.ctypes.data, 37)
    assert (buf == 7).all()
    maps = _maps_overlapping(lo.base, lo.size)
    assert all(not ("w" in p and "x" in p) for _, _, p in maps)


def test_absolute_32_bit_reference_that_does_not_fit_is_refused():
    """Small static model: `movq $table, %rax` (R_X86_64_32S) cannot reach a mapping above
    2 GiB: refused (the caller falls back to MCJIT), never patched with a truncated address."""
    obj = _emit(_SMALL_IR, "small", "static")
    assert "R_X86_64_32S" in elfload.scan(obj)["relocations"]
    with pytest.raises(elfload.ElfUnsupportedError, match="does not fit"):
        elfload.load(obj, resolve=jit.runtime_symbol)


# ----------------------------------------------------------------------------- warm process

_CHILD = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    sys.path.insert(0, sys.argv[1])
    from test_elfload import KERNELS, _arrays, _run_serial
    from lazymath.backend.native import kernel_cache
    from lazymath.backend.compile import compile_kernel
    from lazymath.backend.npu.ir_reference import run as reference_run
    from lazymath.runtime.device import get_spec
    ok = True
    for name in ("unary_f16", "reduce_sum_split", "matmul_f16_910"):
        make, spec = KERNELS[name]
        ir = make()
        k = compile_kernel(ir, get_spec(spec), "llvm")
        a = _arrays(ir)
        ref = [x.copy() for x in a]
        _run_serial(k, a)
        reference_run(ir, ref)
        for g, w in zip(a[-len(ir.outputs):], ref[-len(ir.outputs):]):
            ok &= bool(np.allclose(g.astype(float), w.astype(float), rtol=2e-2, atol=2e-2,
                                   equal_nan=True))
    print(json.dumps({**kernel_cache.cache_info(), "ok": ok,
                      "binding": "llvmlite.binding" in sys.modules}))
    """
)


def _child(cache: Path, **env_extra: str) -> dict:
    env = {**os.environ, "LAZYMATH_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT),
           **env_extra}  # fmt: skip
    env.pop("LAZYMATH_CACHE", None)
    if "LAZYMATH_ELFLOAD" not in env_extra:
        env.pop("LAZYMATH_ELFLOAD", None)
    here = str(Path(__file__).resolve().parent)
    out = subprocess.run([sys.executable, "-c", _CHILD, here], env=env, capture_output=True,
                         text=True, timeout=600, check=True)  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_warm_process_compiles_nothing_and_never_loads_llvm(tmp_path):
    cache = tmp_path / "shared"
    cold = _child(cache)
    assert cold["ok"] and cold["compiled"] == 3
    # a cold process loads LLVM where it compiles in-process; with the compile server (the
    # default) it compiles there and links the objects with elfload like a warm one
    in_process = _child(tmp_path / "in-process", LAZYMATH_COMPILE_ISOLATE="auto")
    assert in_process["ok"] and in_process["compiled"] == 3 and in_process["binding"]
    warm = _child(cache)
    assert warm["ok"] and warm["compiled"] == 0 and warm["disk_hits"] == 3
    assert warm["elf_loads"] == 3 and warm["mcjit_loads"] == 0
    assert warm["binding"] is False  # the whole point: no LLVM in a warm process
    forced = _child(cache, LAZYMATH_ELFLOAD="0")
    assert forced["ok"] and forced["compiled"] == 0 and forced["mcjit_loads"] == 3
    assert forced["binding"] is True


def test_runtime_symbol_is_the_gemm_key():
    """jit mirrors gemm's workspace key: same symbol name, and MCJIT-resolved code and code
    loaded here use one key."""
    import llvmlite.binding as llvm

    from lazymath.backend.host import gemm

    jit.get_jit()
    assert jit.WS_KEY_SYMBOL == gemm.WS_KEY_SYMBOL
    addr = jit.runtime_symbol(jit.WS_KEY_SYMBOL)
    assert addr == llvm.address_of_symbol(gemm.WS_KEY_SYMBOL) == ctypes.addressof(gemm._WS_KEY)
