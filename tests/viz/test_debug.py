"""LAZYMATH_DEBUG levels print what they promise, on stderr; LAZYMATH_DEBUG_DIR writes every
stage to files; LAZYMATH_VALIDATE=1 passes correct kernels and names the kernel and the user's
line of a wrong one. Shapes are unusual primes so every test compiles its own program (a cache
miss)."""

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
    assert capsys.readouterr() == ("", "")


_LINE = (r"\[lazymath\] realize 2 kernels \((?P<names>[\w, ]+)\): (?P<how>.*); planned peak "
         r"\d+(\.\d)? (B|KiB|MiB); \d+(\.\d+)? (us|ms|s)")  # fmt: skip


def test_debug_1_one_line_per_realize_on_stderr(monkeypatch, capsys):
    monkeypatch.setenv("LAZYMATH_DEBUG", "1")
    out, want = _refused_graph(5, 103)
    names = [k.name for k in lm.schedule(out).kernels]
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-6)
    again, _ = _refused_graph(5, 103)  # same structure, new data: program cache hit
    again.realize()
    other, _ = _refused_graph(5, 104)  # same structure, another shape: a miss that says why
    other.realize()
    got = capsys.readouterr()
    assert got.out == ""
    lines = got.err.splitlines()
    assert len(lines) == 3, lines
    m = [re.fullmatch(_LINE, ln) for ln in lines]
    assert all(m), lines
    assert m[0]["names"] == ", ".join(names)
    # kernels compiled here, loaded from the disk cache or found in memory (another test
    # may have made them): the counts add up to the kernel count
    how = m[0]["how"]
    assert how.startswith("program miss (")  # a new graph, or one that differs from another test's
    counts = re.findall(r"(?:compiled |loaded |quick-compiled )?(\d+)", how.split(";", 1)[1])
    assert sum(map(int, counts)) == 2, how
    assert m[1]["how"] == "program hit"
    assert m[2]["how"].startswith("program miss (input 0 (from test_debug.py:")
    assert "shape (2, 5, 103) -> (2, 5, 104)" in m[2]["how"]


def test_debug_1_counts_compiled_loaded_and_hit(monkeypatch, capsys, tmp_path):
    """The first realize compiles (a fresh cache directory), a process without the in-memory
    kernels loads them from disk, a second realize of the same graph is a program hit."""
    from lazymath.backend.native import kernel_cache

    monkeypatch.setenv("LAZYMATH_DEBUG", "1")
    monkeypatch.setenv("LAZYMATH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("LAZYMATH_TIERED", "0")
    _refused_graph(3, 137)[0].realize()
    # a new process: no programs, no kernels in memory (the disk files stay)
    engine.PROGRAMS.clear()
    kernel_cache.clear_cache(memory=True, disk=False)
    _refused_graph(3, 137)[0].realize()
    _refused_graph(3, 137)[0].realize()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3, lines
    assert lines[0].split("; ")[1] == "compiled 2", lines[0]
    assert "program miss (same signature as an earlier program" in lines[1]
    assert lines[1].split("; ")[1] == "loaded 2 from disk", lines[1]
    assert "program hit" in lines[2]


def test_debug_2_kernel_times_table_and_fusion_log(monkeypatch, capsys):
    monkeypatch.setenv("LAZYMATH_DEBUG", "kernels")
    out, want = _refused_graph(7, 107)
    names = [k.name for k in lm.schedule(out).kernels]
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-6)
    text = capsys.readouterr().err
    for name in names:  # one line per kernel, as it runs: time, GFLOPS, GB/s, code origin
        assert re.search(rf"^\[lazymath\]   {name}\s+vector\s+\d+(\.\d+)? (us|ms|s)\s+"
                         r"\d+\.\d\d GFLOPS\s+\d+\.\d\d GB/s  (compiled|disk|memory)",
                         text, re.M), text  # fmt: skip
    assert re.search(r"^\[lazymath\] realize 2 kernels", text, re.M)
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
    text = capsys.readouterr().err
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
    text = capsys.readouterr().err
    for name in names:
        assert f"--- ISA {name}" in text and f"--- LLVM IR {name}" in text
    ir = text.split("--- LLVM IR", 1)[1]
    assert re.search(r'^define void @"?lm_\w+"?\(i64 %"?block_idx"?', ir, re.M)
    assert "getelementptr" in ir and "--- assembly" not in text
    opt = text.split("(optimized)", 1)[1]  # and the optimized module
    assert re.search(r'^define void @"?lm_\w+"?\(i64 ', opt, re.M)


def test_debug_5_host_assembly(monkeypatch, capsys):
    monkeypatch.setenv("LAZYMATH_DEBUG", "5")
    out, _ = _refused_graph(13, 113)
    names = [k.name for k in lm.schedule(out).kernels]
    out.realize()
    text = capsys.readouterr().err
    for name in names:
        assert f"--- assembly {name}" in text
    asm = text.split("--- assembly", 1)[1]
    assert re.search(r"^\s*\.globl\s+lm_\w+", asm, re.M)
    assert re.search(r"^\s*(retq?|vmovups|vmovaps|vaddps|vfmadd\w+)\b", asm, re.M)


def test_debug_dir_writes_every_stage_and_says_where(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("LAZYMATH_DEBUG", "1")
    monkeypatch.setenv("LAZYMATH_DEBUG_DIR", str(tmp_path / "dbg"))
    out1, _ = _refused_graph(17, 127)
    names1 = [k.name for k in lm.schedule(out1).kernels]
    out1.realize()
    out2, _ = _matmul_graph(19, 23, 41)
    (name2,) = [k.name for k in lm.schedule(out2).kernels]
    out2.realize()
    _matmul_graph(19, 23, 41)[0].realize()  # a program hit writes nothing
    got = capsys.readouterr()
    assert got.out == ""
    where = [ln for ln in got.err.splitlines() if "LAZYMATH_DEBUG_DIR" in ln]
    assert where == [f"[lazymath] LAZYMATH_DEBUG_DIR: writing debug files under {tmp_path / 'dbg'}"]
    assert len([ln for ln in got.err.splitlines() if " realize " in ln]) == 3
    dirs = sorted((tmp_path / "dbg").iterdir())
    assert [d.name for d in dirs] == ["program_0000", "program_0001"]
    for d, names in zip(dirs, (names1, [name2])):
        files = {f.name for f in d.iterdir()}
        want = {"summary.txt"} | {f"{n}{ext}" for n in names
                                  for ext in (".isa", ".ll", ".opt.ll", ".s")}  # fmt: skip
        assert files == want
    summary = (dirs[0] / "summary.txt").read_text()
    assert summary.startswith("[lazymath] realize 2 kernels") and "fusion log:" in summary
    assert "define void" in (dirs[0] / f"{names1[0]}.ll").read_text()
    assert "define void" in (dirs[0] / f"{names1[0]}.opt.ll").read_text()
    assert "mmad" in (dirs[1] / f"{name2}.isa").read_text()
    assert ".globl" in (dirs[1] / f"{name2}.s").read_text()


def test_validate_says_how_many_kernels_it_checked(monkeypatch, capsys):
    monkeypatch.setenv("LAZYMATH_VALIDATE", "1")
    monkeypatch.setenv("LAZYMATH_DEBUG", "1")
    _refused_graph(3, 139)[0].realize()
    assert "validated 2 of 2 kernels against numpy" in capsys.readouterr().err


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
        for key, prog in engine.PROGRAMS.items():  # never leave the bad kernel cached
            if any(isinstance(ck, _Corrupting) for _, ck, _ in prog.kernels):
                engine.PROGRAMS.pop(key)
