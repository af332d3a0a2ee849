"""Kernel cache: memory hits, disk hits across processes, corruption recovery, privacy."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from lazymath.backend import compile as driver
from lazymath.backend.compile import compile_kernel
from lazymath.backend.native import kernel_cache
from lazymath.backend.npu.kernel_ir import ElementwiseKernel, SOp, contiguous_view
from lazymath.runtime.device import get_spec

ROOT = Path(__file__).resolve().parents[2]


def _ir(n: int = 1000, c: float = 2.0) -> ElementwiseKernel:
    v = contiguous_view("float32", (n,))
    expr = (SOp("load", "float32", (), 0), SOp("const", "float32", (), c),
            SOp("mul", "float32", (0, 1)), SOp("exp", "float32", (2,)))  # fmt: skip
    return ElementwiseKernel((n,), (v,), (v,), expr, (3,))


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    d = tmp_path / "kcache"
    monkeypatch.setenv("LAZYMATH_CACHE_DIR", str(d))
    monkeypatch.delenv("LAZYMATH_CACHE", raising=False)
    kernel_cache.clear_cache(memory=True, disk=False)
    yield d
    kernel_cache.clear_cache(memory=True, disk=False)


def _delta(before: dict, after: dict) -> dict:
    return {k: after[k] - before[k] for k in ("compiled", "memory_hits", "disk_hits",
                                              "disk_writes", "disk_rejected")}  # fmt: skip


def test_memory_hit_returns_the_same_native_code(cache_dir):
    before = kernel_cache.cache_info()
    k1 = compile_kernel(_ir(), get_spec("ascend910"))
    k2 = compile_kernel(_ir(), get_spec("ascend910"))
    k3 = compile_kernel(_ir(), get_spec("ascend910"), name="other_name")
    d = _delta(before, kernel_cache.cache_info())
    assert d["compiled"] == 1 and d["memory_hits"] == 2
    assert k1 is k2 and k3.name == "other_name" and k3.symbol == k1.symbol
    assert "kernel other_name(" in k3.isa_text
    compile_kernel(_ir(), get_spec("ascend910b"))  # another device spec is another kernel
    assert kernel_cache.cache_info()["compiled"] - before["compiled"] == 2


def test_disk_file_is_private_and_checked(cache_dir):
    compile_kernel(_ir(777), get_spec("ascend910"))
    files = kernel_cache.disk_files()
    assert len(files) == 1
    assert stat.S_IMODE(cache_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE(files[0].stat().st_mode) == 0o600
    info = kernel_cache.cache_info()
    assert info["disk_files"] == 1 and info["disk_bytes"] == files[0].stat().st_size > 100
    data = files[0].read_bytes()
    assert data.startswith(kernel_cache.MAGIC)


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty", "foreign"])
def test_bad_file_is_rejected_recompiled_and_replaced(cache_dir, damage):
    ir = _ir(555)
    k = compile_kernel(ir, get_spec("ascend910"))
    (path,) = kernel_cache.disk_files()
    good = path.read_bytes()
    if damage == "flip":
        bad = bytearray(good)
        bad[len(bad) // 2] ^= 0xFF
        path.write_bytes(bytes(bad))
    elif damage == "truncate":
        path.write_bytes(good[: len(good) // 2])
    elif damage == "empty":
        path.write_bytes(b"")
    else:  # a valid file of another kernel under this kernel's name
        compile_kernel(_ir(556), get_spec("ascend910"))
        other = next(p for p in kernel_cache.disk_files() if p != path)
        path.write_bytes(other.read_bytes())
    kernel_cache.clear_cache(memory=True, disk=False)
    before = kernel_cache.cache_info()
    k2 = compile_kernel(ir, get_spec("ascend910"))
    d = _delta(before, kernel_cache.cache_info())
    assert d["disk_rejected"] == 1 and d["disk_hits"] == 0 and d["compiled"] == 1
    assert path.read_bytes() == good  # replaced by a valid file
    x = np.linspace(-1, 1, 555, dtype=np.float32)
    o1, o2 = np.zeros_like(x), np.zeros_like(x)
    k(x, o1)
    k2(x, o2)
    np.testing.assert_array_equal(o1, o2)


def test_cache_disabled_writes_nothing(cache_dir, monkeypatch):
    monkeypatch.setenv("LAZYMATH_CACHE", "0")
    compile_kernel(_ir(321), get_spec("ascend910"))
    assert not cache_dir.exists() or not kernel_cache.disk_files()
    assert kernel_cache.cache_info()["disk_enabled"] is False


def test_clear_cache_empties_both_levels(cache_dir):
    compile_kernel(_ir(123), get_spec("ascend910"))
    assert kernel_cache.cache_info()["memory_entries"] >= 1 and kernel_cache.disk_files()
    kernel_cache.clear_cache()
    info = kernel_cache.cache_info()
    assert info["memory_entries"] == 0 and info["disk_files"] == 0 and info["disk_bytes"] == 0


_CHILD = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from lazymath.backend.native import isolate, kernel_cache
    from lazymath.backend.compile import compile_kernel
    from lazymath.backend.npu.kernel_ir import ElementwiseKernel, ReduceKernel, SOp, contiguous_view
    from lazymath.runtime.device import get_spec
    n = 4099
    v = contiguous_view("float32", (n,))
    ew = ElementwiseKernel((n,), (v,), (v,), (SOp("load", "float32", (), 0),
                           SOp("sin", "float32", (0,))), (1,))
    red = ReduceKernel((n,), (0,), "sum", (v,), (SOp("load", "float32", (), 0),), 0, "float32",
                       (), (), (SOp("acc", "float32"),), (0,), (contiguous_view("float32", ()),))
    x = np.linspace(-3, 3, n, dtype=np.float32)
    o, s = np.zeros_like(x), np.zeros(1, np.float32)
    compile_kernel(ew, get_spec("ascend910"))(x, o)
    compile_kernel(red, get_spec("ascend910"))(x, s)
    ok = bool(np.allclose(o, np.sin(x), atol=1e-6) and np.isclose(s[0], x.sum(), atol=1e-3))
    print(json.dumps({**kernel_cache.cache_info(), "ok": ok, "mode": isolate.mode(),
                      "binding": "llvmlite.binding" in sys.modules}))
    """
)


def _child(cache: Path) -> dict:
    env = {**os.environ, "LAZYMATH_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT)}
    env.pop("LAZYMATH_CACHE", None)
    out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True,
                         timeout=300, check=True)  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_second_process_compiles_nothing_and_survives_corruption(tmp_path):
    cache = tmp_path / "shared"
    first = _child(cache)
    assert first["ok"] and first["compiled"] == 2 and first["disk_writes"] == 2
    second = _child(cache)
    assert second["ok"] and second["compiled"] == 0 and second["disk_hits"] == 2
    assert second["elf_loads"] == 2 and second["binding"] is False  # no LLVM when warm
    files = sorted(cache.glob("*" + kernel_cache.SUFFIX))
    assert len(files) == 2
    files[0].write_bytes(files[0].read_bytes()[:-7])  # truncated file
    third = _child(cache)
    assert third["ok"] and third["disk_rejected"] == 1 and third["compiled"] == 1
    # the recompile loads LLVM here when it compiles in-process; the compile server (the
    # default, `isolate`) compiles it in its own process: this one never loads llvmlite.binding
    assert third["disk_hits"] == 1 and third["binding"] is (third["mode"] != "server")
    fourth = _child(cache)
    assert fourth["ok"] and fourth["compiled"] == 0 and fourth["disk_hits"] == 2


def test_sources_version_is_remembered_beside_the_bytecode(tmp_path, monkeypatch):
    """The backend's source hash (part of every disk key) is kept in __pycache__, valid for
    the files' names, sizes and mtimes: equal to a fresh hash, recomputed when a file changes,
    never written when Python writes no bytecode, and a damaged file is ignored."""
    root = tmp_path / "pkg"
    (root / "sub").mkdir(parents=True)
    (root / "a.py").write_text("x = 1\n")
    (root / "sub" / "b.py").write_text("y = 2\n")
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    fresh = kernel_cache.sources_version(root, "1.0")
    assert not (root / "__pycache__").exists()
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    assert kernel_cache.sources_version(root, "1.0") == fresh  # computed, then stored
    stored = root / "__pycache__" / kernel_cache._VERSION_FILE
    assert stored.read_text().split()[1] == fresh
    reads = []
    real = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda p: reads.append(p) or real(p))
    assert kernel_cache.sources_version(root, "1.0") == fresh and reads == []  # stat only
    assert kernel_cache.sources_version(root, "1.1") != fresh  # another lazymath version
    (root / "sub" / "b.py").write_text("y = 3  # changed\n")
    changed = kernel_cache.sources_version(root, "1.0")
    assert changed != fresh and reads  # read and hashed again
    stored.write_text("garbage")
    reads.clear()
    assert kernel_cache.sources_version(root, "1.0") == changed and reads


def test_a_background_store_writes_where_the_kernel_was_requested(cache_dir, monkeypatch):
    """A tier-up finishes in the background, maybe after LAZYMATH_CACHE_DIR changed (the next
    test's directory, a user's switch): its file goes to the directory in force when the kernel
    was requested. It used to land in the later one, where a kernel of the same key (a matmul
    compiled under other host-mapping flags of the earlier request) was then found as a hit
    (test_bfloat16's in-place panel test failed now and then under load)."""
    first, later = cache_dir, cache_dir.parent / "later"
    jobs = []
    init = driver._Job.__init__

    def record(self, *args, **kw):
        init(self, *args, **kw)
        jobs.append(self)

    monkeypatch.setattr(driver._Job, "__init__", record)
    compile_kernel(_ir(37, 3.0), get_spec("ascend910"))
    assert jobs, "the kernel was compiled (not a cache hit)"
    job = jobs[-1]
    monkeypatch.setenv("LAZYMATH_CACHE_DIR", str(later))
    later.mkdir(mode=0o700)
    before = {p.name for p in first.glob("*" + kernel_cache.SUFFIX)}
    job._store(b"\x7fELF not loaded by this test")
    assert job.key + kernel_cache.SUFFIX in {p.name for p in first.glob("*" + kernel_cache.SUFFIX)}
    assert not list(later.glob("*" + kernel_cache.SUFFIX))
    assert before <= {p.name for p in first.iterdir()}
