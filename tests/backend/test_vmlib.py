"""The vector math runtime library (backend/host/vmlib.py): composites called out of line.

A kernel calling the library and the same kernel with the composites inlined must give the same
bits on both backends; the library and the kernels that call it come back from the disk cache in
a new process without compiling anything.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import lazymath as lm
from lazymath.backend.compile import build_program, compile_kernel
from lazymath.backend.host import vmlib
from lazymath.backend.npu import vmath
from lazymath.backend.npu.kernel_ir import ElementwiseKernel, SOp, contiguous_view

RNG = np.random.default_rng(20)


def test_plan_tables_match_vmath():
    assert vmlib.CALL_OPS == vmath.COMPOSITE_OPS
    assert vmlib.F64_OPS == vmath._F64_OPS


def _chain_ir(f: str, ops: tuple, n: int = 64) -> ElementwiseKernel:
    expr = [SOp("load", f, (), 0)]
    for op in ops:
        expr.append(SOp(op, f, (len(expr) - 1,)))
    v = contiguous_view(f, (n,))
    return ElementwiseKernel((n,), (v,), (v,), tuple(expr), (len(expr) - 1,))


def test_call_plan_rule_and_reason(monkeypatch):
    monkeypatch.delenv("LAZYMATH_VMATH_CALLS", raising=False)
    assert vmlib.call_plan(_chain_ir("float32", ("neg",))) == (False, "")
    calls, why = vmlib.call_plan(_chain_ir("float32", ("sin", "neg", "cos")))
    assert not calls and "inlined" in why and "2 math ops <= 2" in why
    calls, why = vmlib.call_plan(_chain_ir("float32", ("sin", "sin", "tanh")))
    assert calls and "sin x2, tanh: library calls (3 math ops > 2" in why
    # float64 trig is not a vmath composite (host libm): nothing to call
    assert vmlib.call_plan(_chain_ir("float64", ("sin", "cos", "tan"))) == (False, "")
    monkeypatch.setenv("LAZYMATH_VMATH_CALLS", "always")
    assert vmlib.call_plan(_chain_ir("float32", ("sin",)))[0]
    monkeypatch.setenv("LAZYMATH_VMATH_CALLS", "never")
    assert not vmlib.call_plan(_chain_ir("float32", ("sin", "sin", "sin")))[0]
    # the reason is what lm.explain shows
    monkeypatch.delenv("LAZYMATH_VMATH_CALLS")
    t = lm.tensor(np.ones(10, np.float32))
    text = lm.explain(lm.sin(lm.cos(lm.tanh(t))) + 1)
    assert "library calls (3 math ops > 2" in text
    assert "cos: inlined (1 math op <= 2" in lm.explain(lm.cos(t))


def test_program_calls_and_keeps_the_inlined_footprint():
    ir = _chain_ir("float32", ("sin", "tan", "cos"), n=5000)
    spec = "ascend910"
    from lazymath.runtime.device import get_spec

    sp = get_spec(spec)
    called = build_program(ir, sp, "k", calls=True)
    inlined = build_program(ir, sp, "k", calls=False)
    calls = [i for i, _ in vmath.isa.walk(called.body) if isinstance(i, vmath.VMathCall)]
    assert [c.op for c in calls] == ["sin", "tan", "cos"] * (len(calls) // 3) and calls
    assert not [i for i, _ in vmath.isa.walk(inlined.body) if isinstance(i, vmath.VMathCall)]
    # same UB footprint, so the same tile and the same chunking of the range branches
    assert called.scope_bytes(sp) == inlined.scope_bytes(sp)
    assert "vmath.sin.float32" in str(called)
    assert vmlib.symbols_of(called) == [f"lazymath_vm_{o}_float32" for o in ("sin", "tan", "cos")]


_CASES = [  # (dtype, unary chain, binary op)
    ("float32", ("sin", "tan", "cos"), "pow"),
    ("float32", ("tanh", "sigmoid"), "remainder"),
    ("float16", ("cos", "tanh"), "floor_divide"),
    ("float64", ("tanh", "sigmoid"), "pow"),
]


def _inputs(f: str, n: int):
    x = RNG.uniform(-40, 40, n)
    x[:: max(n // 7, 1)] *= 1e4  # some chunks take the trig table branch
    if n > 12:
        x[3:9] = (0.0, -0.0, np.inf, -np.inf, np.nan, 2.0**17)
    if f == "float16":
        x = np.where(np.isfinite(x), np.clip(x, -6e4, 6e4), x)
    y = RNG.uniform(0.25, 3, n)
    return x.astype(f), y.astype(f)


@pytest.mark.parametrize("spec", ["ascend910", "ascend910b"])
@pytest.mark.parametrize("backend", ["llvm", "interp"])
@pytest.mark.parametrize("case", range(len(_CASES)))
def test_out_of_line_bit_identical_to_inlined(case, backend, spec, monkeypatch):
    """The kernel calling the library and the kernel inlining the same composites give the
    same bits (chains write in place, a binary op, awkward sizes, specials, huge arguments)."""
    monkeypatch.setenv("LAZYMATH_CACHE", "0")
    f, chain, binop = _CASES[case]
    for n in (1, 7, 4099) if backend == "llvm" else (7, 1031):
        expr = [SOp("load", f, (), 0), SOp("load", f, (), 1)]
        for op in chain:  # each op's source dies: the emitter writes in place
            expr.append(SOp(op, f, (len(expr) - 1,)))
        expr.append(SOp(binop, f, (len(expr) - 1, 1)))
        expr.append(SOp(chain[0], f, (1,)))
        v = contiguous_view(f, (n,))
        ir = ElementwiseKernel((n,), (v, v), (v, v), tuple(expr), (len(expr) - 2, len(expr) - 1))
        x, y = _inputs(f, n)
        got = {}
        for mode in ("always", "never"):
            monkeypatch.setenv("LAZYMATH_VMATH_CALLS", mode)
            k = compile_kernel(ir, spec, backend=backend)
            outs = [np.full(n, 7, f), np.full(n, 7, f)]
            k(x, y, *outs)
            got[mode] = outs
        for a, b in zip(got["always"], got["never"]):
            assert a.tobytes() == b.tobytes(), (f, chain, binop, n, backend)


@pytest.mark.parametrize("backend", ["llvm", "interp"])
def test_strided_views_end_to_end(backend, monkeypatch):
    """Reversed, strided and broadcast views through the public API: calls == inlined, bits."""
    monkeypatch.setenv("LAZYMATH_BACKEND", backend)
    monkeypatch.setenv("LAZYMATH_CACHE", "0")
    a = RNG.uniform(-10, 10, (13, 37)).astype(np.float32)
    b = RNG.uniform(0.5, 2, (37,)).astype(np.float32)
    res = {}
    for mode in ("always", "never"):
        monkeypatch.setenv("LAZYMATH_VMATH_CALLS", mode)
        lm.clear_cache()
        x = lm.tensor(a)[::-1, ::2]
        t = lm.tanh(lm.sin(x) * 1.5) + lm.cos(lm.tensor(b)[::2])
        res[mode] = lm.power(lm.abs(t) + 0.5, lm.sin(x)).numpy()
    lm.clear_cache()
    assert res["always"].tobytes() == res["never"].tobytes()
    x = a[::-1, ::2]
    with np.errstate(all="ignore"):
        ref = np.power(np.abs(np.tanh(np.sin(x) * 1.5) + np.cos(b[::2])) + 0.5, np.sin(x))
    np.testing.assert_allclose(res["always"], ref, rtol=2e-5, atol=1e-6)


def test_library_symbol_names():
    assert vmlib.parse_symbol("lazymath_vm_floor_divide_float16") == ("floor_divide", "float16")
    assert vmlib.parse_symbol("lazymath_vm_sin_int32") is None
    assert vmlib.parse_symbol("lazymath_vm_system_float32") is None
    assert vmlib.parse_symbol("memcpy") is None
    assert vmlib.address("lazymath_vm_nothing_float32") is None
    assert vmlib.resolve("lazymath_vmp_nothing_float32") is None
    assert vmlib.cell_symbol("lazymath_vm_sin_float32") == "lazymath_vmp_sin_float32"
    # a forced target's functions carry it (vmath.call_symbol)
    assert vmlib._split("lazymath_vm_tanh_float16.x86-64") == ("tanh", "float16", "x86-64")
    assert vmlib.parse_symbol("lazymath_vm_tanh_float16.haswell") == ("tanh", "float16")
    assert vmlib.parse_symbol("lazymath_vm_tanh_float16.") is None
    assert vmlib.parse_symbol("lazymath_vm_tanh_float16.a b") is None
    assert vmath.call_symbol("sin", "float32", "haswell") == "lazymath_vm_sin_float32.haswell"
    assert vmath.call_symbol("sin", "float32", "") == "lazymath_vm_sin_float32"


def test_each_target_calls_its_own_library_code(monkeypatch):
    """A process that switches LAZYMATH_TARGET_CPU: the kernels of each target call that
    target's library function (one per target, its own disk entry), same results."""
    from lazymath.backend.native import host

    forced = [t for t in host.executable_targets() if t]
    if not forced:
        pytest.skip("this host runs no forced target")
    monkeypatch.setenv("LAZYMATH_VMATH_CALLS", "always")
    monkeypatch.setenv("LAZYMATH_BACKEND", "llvm")
    x = np.linspace(-9, 9, 777, dtype=np.float32)
    got = {}
    from lazymath import engine

    for target in ["", forced[0]]:
        monkeypatch.setenv("LAZYMATH_TARGET_CPU", target or "native")
        engine.PROGRAMS.clear()  # (programs are not keyed by the target: kernels are)
        t = lm.tensor(x)
        got[target] = (lm.sin(lm.cos(t) * 2.0) + lm.tanh(t)).numpy()
        assert vmath.call_symbol("sin", "float32") == vmath.call_symbol(
            "sin", "float32", host.requested()
        )
        for op in ("sin", "cos", "tanh"):
            fn = vmlib._fns[vmath.call_symbol(op, "float32")]
            assert fn.target == target and fn.tier >= 0
    native, other = (vmlib._fns[vmath.call_symbol("sin", "float32", t)] for t in ("", forced[0]))
    assert native is not other and native.key != other.key
    assert native.cell_address != other.cell_address
    assert got[""].tobytes() == got[forced[0]].tobytes()


_CHILD = r"""
import json, sys
import numpy as np
import lazymath as lm
from lazymath.backend.host import vmlib
from lazymath.backend.native import kernel_cache
x = lm.tensor(np.linspace(-3, 3, 1000, dtype=np.float32))
t = x
for i in range(12):
    t = lm.sin(t) * 1.01 if i % 2 == 0 else lm.tanh(t + 0.5)
r = t.numpy()
from lazymath.backend import compile as bc
bc.wait_tiering()  # the library's optimized code replaced its quick code and is on disk
info = {**kernel_cache.cache_info(), **vmlib.stats()}
print(json.dumps({"info": {k: v for k, v in info.items() if isinstance(v, int)},
                  "llvm": "llvmlite.binding" in sys.modules, "r": r.view(np.uint32).tolist()}))
"""


def _child(cache: str, **env) -> dict:
    e = {**os.environ, "LAZYMATH_CACHE_DIR": cache, "LAZYMATH_CACHE": "1", **env}
    e.pop("LAZYMATH_VMATH_CALLS", None)
    out = subprocess.run([sys.executable, "-c", _CHILD], env=e, capture_output=True, text=True,
                         timeout=600, check=True)  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_second_process_loads_library_and_kernels_from_disk(tmp_path):
    cache = str(tmp_path / "cache")
    first = _child(cache)
    assert first["info"]["vmlib_compiled"] == 2  # sin and tanh, float32
    assert first["info"]["compiled"] >= 1
    second = _child(cache)
    assert second["info"]["compiled"] == 0 and second["info"]["vmlib_compiled"] == 0
    assert second["info"]["vmlib_disk_hits"] == 2
    assert not second["llvm"]  # elfload linked kernels to the library: LLVM never loaded
    assert second["r"] == first["r"]
    third = _child(cache, LAZYMATH_ELFLOAD="0")  # MCJIT links them through add_symbol
    assert third["info"]["compiled"] == 0 and third["info"]["vmlib_compiled"] == 0
    assert third["r"] == first["r"]


def test_library_program_is_the_expanded_call():
    p = vmlib.program("pow", "float16")
    assert [a.name for a in p.args] == ["dst", "src0", "src1"]
    loops = [i for i in p.body if isinstance(i, vmath.isa.Loop)]
    assert len(loops) == 1 and loops[0].step == vmath.CHUNK
    text = vmlib.library_ir("sin", "float32")
    assert 'define void @"lazymath_vm_sin_float32"(ptr' in text
