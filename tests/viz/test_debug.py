"""LAZYMATH_DEBUG levels print what they promise; LAZYMATH_DEBUG_DIR writes them to files;
LAZYMATH_VALIDATE=1 passes correct kernels and names the kernel and the user's line of a wrong
one. Shapes are unusual primes so every test compiles its own program (a cache miss)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import lazymath as lm
from lazymath import engine


@pytest.fixture(autouse=True)
def _llvm(monkeypatch):
    monkeypatch.setenv("LAZYMATH_BACKEND", "llvm")
    monkeypatch.delenv("LAZYMATH_DEBUG_DIR", raising=False)
    monkeypatch.delenv("LAZYMATH_VALIDATE", raising=False)


def _refused_graph(rows: int, cols: int):
    """exp(x) + sum(x, axes 0 and 2): two Vector kernels and a logged refusal (the reduced
    axes are not adjacent, so no row kernel takes the graph)."""
    data = np.linspace(-1, 1, 2 * rows * cols, dtype=np.float32).reshape(2, rows, cols)
    x = lm.tensor(data)
    return (lm.exp(x) + lm.sum(x, axis=(0, 2), keepdims=True),
            np.exp(data) + data.sum(axis=(0, 2), keepdims=True))  # fmt: skip


def _matmul_graph(m: int, k: int, n: int):
    a = np.random.default_rng(m).standard_normal((m, k)).astype(np.float32)
    b = np.random.default_rng(n).standard_normal((k, n)).astype(np.float32)
    out = lm.mul(lm.relu(lm.matmul(lm.tensor(a), lm.tensor(b))), 0.5)
    return out, np.maximum(a @ b, 0) * 0.5


def test_debug_0_prints_nothing(monkeypatch, capsys):
    monkeypatch.setenv("LAZYMATH_DEBUG", "0")
    _refused_graph(3, 101)[0].realize()
    assert capsys.readouterr().out == ""


def test_debug_1_one_line_per_realize(monkeypatch, capsys):
    monkeypatch.setenv("LAZYMATH_DEBUG", "1")
    out, want = _refused_graph(5, 103)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-6)
    again, _ = _refused_graph(5, 103)  # same structure, new data: program cache hit
    again.realize()
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert re.fullmatch(r"\[lazymath\] realize: 2 kernel\(s\), program cache miss, planned "
                        r"peak \d+(\.\d)? (B|KiB|MiB), \d+ us", lines[0])  # fmt: skip
    assert "program cache hit" in lines[1]


def test_debug_2_kernel_table_and_fusion_log(monkeypatch, capsys):
    monkeypatch.setenv("LAZYMATH_DEBUG", "2")
    out, _ = _refused_graph(7, 107)
    names = [k.name for k in lm.schedule(out).kernels]
    out.realize()
    text = capsys.readouterr().out
    assert text.startswith("[lazymath] realize:")
    assert re.search(r"^kernel\s+unit\s+ops\s+bound\s+flops\s+bytes\s+stream", text, re.M)
    for name in names:
        assert re.search(rf"^{name}\s+vector\s", text, re.M)
    assert "fusion log:" in text and "refuse" in text and "broadcast" in text
    assert "--- ISA" not in text


def test_debug_3_isa_listing_per_kernel(monkeypatch, capsys):
    monkeypatch.setenv("LAZYMATH_DEBUG", "3")
    out, want = _matmul_graph(29, 31, 37)
    (k,) = lm.schedule(out).kernels
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-4)
    text = capsys.readouterr().out
    assert f"--- ISA {k.name}" in text
    isa = text.split(f"--- ISA {k.name}", 1)[1]
    assert re.search(rf"^kernel {k.name}\(a: gm float32, b: gm float32, out0: gm float32\)",
                     isa.lstrip(), re.M)  # fmt: skip
    for instr in ("load_nz", "mmad", "vrelu", "vmuls", "copy_ub_to_gm"):
        assert instr in isa, instr
    assert "--- LLVM IR" not in text


def test_debug_4_llvm_ir(monkeypatch, capsys):
    monkeypatch.setenv("LAZYMATH_DEBUG", "4")
    out, _ = _refused_graph(11, 109)
    names = [k.name for k in lm.schedule(out).kernels]
    out.realize()
    text = capsys.readouterr().out
    for name in names:
        assert f"--- ISA {name}" in text and f"--- LLVM IR {name}" in text
    ir = text.split("--- LLVM IR", 1)[1]
    assert re.search(r'^define void @"?lm_\w+"?\(i64 %"?block_idx"?', ir, re.M)
    assert "getelementptr" in ir and "--- assembly" not in text


def test_debug_5_host_assembly(monkeypatch, capsys):
    monkeypatch.setenv("LAZYMATH_DEBUG", "5")
    out, _ = _refused_graph(13, 113)
    names = [k.name for k in lm.schedule(out).kernels]
    out.realize()
    text = capsys.readouterr().out
    for name in names:
        assert f"--- assembly {name}" in text
    asm = text.split("--- assembly", 1)[1]
    assert re.search(r"^\s*\.globl\s+lm_\w+", asm, re.M)
    assert re.search(r"^\s*(retq?|vmovups|vmovaps|vaddps|vfmadd\w+)\b", asm, re.M)


def test_debug_dir_writes_one_file_per_realize(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("LAZYMATH_DEBUG", "4")
    monkeypatch.setenv("LAZYMATH_DEBUG_DIR", str(tmp_path / "dbg"))
    _refused_graph(17, 127)[0].realize()
    _matmul_graph(19, 23, 41)[0].realize()
    assert capsys.readouterr().out == ""  # files instead of stdout
    files = sorted((tmp_path / "dbg").iterdir())
    assert [f.name for f in files] == ["realize_0000.txt", "realize_0001.txt"]
    first, second = (f.read_text() for f in files)
    assert first.startswith("[lazymath] realize: 2 kernel(s)")
    assert "fusion log:" in first and "--- LLVM IR" in first and "define void" in first
    assert second.startswith("[lazymath] realize: 1 kernel(s)") and "mmad" in second


# ----------------------------------------------------------------------------- VALIDATE


def test_validate_passes_correct_kernels(monkeypatch):
    monkeypatch.setenv("LAZYMATH_VALIDATE", "1")
    out, want = _matmul_graph(43, 17, 53)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-4)
    red, want2 = _refused_graph(23, 131)
    np.testing.assert_allclose(red.numpy(), want2, rtol=1e-5, atol=1e-6)
    h = lm.tensor(np.linspace(-2, 2, 59, dtype=np.float16))
    np.testing.assert_allclose(lm.tanh(h * 3).numpy(), np.tanh(np.linspace(-2, 2, 59,
                               dtype=np.float16) * np.float16(3)), rtol=2e-2, atol=2e-2)  # fmt: skip


class _Corrupting:
    """A compiled kernel that runs the real one, then spoils one output element."""

    def __init__(self, real) -> None:
        self._real = real
        self.blocks = 1
        self._arrays = None

    def __getattr__(self, name):
        return getattr(self._real, name)

    def make_argv(self, arrays):
        self._arrays = arrays
        return self._real.make_argv(arrays)

    def run_block(self, argv, block_idx: int, block_num: int) -> None:
        n = self._real.blocks
        for b in range(n):
            self._real.run_block(argv, b, n)
        self._arrays[-1].reshape(-1)[3] += 100


def test_validate_names_the_kernel_and_user_line(monkeypatch):
    from lazymath.backend import compile as backend_compile

    real = backend_compile.compile_kernels  # what a realize calls (a batch, in parallel)
    monkeypatch.setattr(backend_compile, "compile_kernels",
                        lambda *a, **k: [_Corrupting(x) for x in real(*a, **k)])  # fmt: skip
    monkeypatch.setenv("LAZYMATH_VALIDATE", "1")
    try:
        out, _ = _matmul_graph(47, 13, 61)  # the ops are created inside _matmul_graph
        line = out._node.loc
        assert line.endswith(f"{__file__}:{_matmul_graph.__code__.co_firstlineno + 3}")
        (k,) = lm.schedule(out).kernels
        with pytest.raises(AssertionError) as ei:
            out.realize()
        msg = str(ei.value)
        assert msg.startswith(f"LAZYMATH_VALIDATE: kernel {k.name} (created at {line})")
        assert "flat index 3" in msg and "1 of 2867 elements differ" in msg
    finally:
        for key, prog in list(engine._programs.items()):  # never leave the bad kernel cached
            if any(isinstance(ck, _Corrupting) for _, ck, _ in prog.kernels):
                del engine._programs[key]
