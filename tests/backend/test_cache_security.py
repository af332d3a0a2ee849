"""Disk-cache trust (issue 13, defects 1, 7 and 9): no pickle, no foreign or special files.

A second process finds a tampered cache -- a checksum-valid file whose program part is a pickle
that would run a shell command, a FIFO or a /dev/zero symlink at an entry's path, a directory at
an entry's path, a world-writable cache directory owned by another user -- and must neither run
it nor hang, compute the right result, and say why in a warning.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from lazymath.backend import compile as bc
from lazymath.backend.compile import build_program, compile_kernel
from lazymath.backend.native import kernel_cache
from lazymath.backend.npu import isa, isa_codec
from lazymath.backend.npu.kernel_ir import ElementwiseKernel, SOp, contiguous_view
from lazymath.runtime.device import get_spec

ROOT = Path(__file__).resolve().parents[2]
N = 4111


def _ir(n: int = N) -> ElementwiseKernel:
    v = contiguous_view("float32", (n,))
    expr = (SOp("load", "float32", (), 0), SOp("const", "float32", (), 1.5),
            SOp("mul", "float32", (0, 1)), SOp("sin", "float32", (2,)))  # fmt: skip
    return ElementwiseKernel((n,), (v,), (v,), expr, (3,))


# ----------------------------------------------------------------------------- the codec


@pytest.mark.parametrize("spec", ["ascend910", "ascend910b"])
def test_codec_round_trips_real_programs(spec):
    from lazymath.backend.npu.kernel_ir import ReduceKernel

    n = 777
    v = contiguous_view("float32", (n,))
    red = ReduceKernel((n,), (0,), "sum", (v,), (SOp("load", "float32", (), 0),), 0, "float32",
                       (), (), (SOp("acc", "float32"),), (0,), (contiguous_view("float32", ()),))  # fmt: skip
    for ir in (_ir(n), red):
        p = build_program(ir, get_spec(spec), "k")
        blob = isa_codec.encode_checked(p)
        q = isa_codec.decode(blob)
        assert q == p and str(q) == str(p)
        assert b"pickle" not in blob and blob.startswith(b"{")


class _Evil:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_codec_refuses_anything_but_isa_values(tmp_path):
    marker = tmp_path / "pwned"
    good = isa_codec.encode(build_program(_ir(64), get_spec("ascend910"), "k"))
    doc = json.loads(good)
    bad = [
        pickle.dumps(_Evil(str(marker))),  # a pickle is not an encoding at all
        b"{" * 100000,  # deep nesting
        json.dumps({**doc, "codec": 99}).encode(),
        json.dumps({**doc, "types": [["os.system", []]] + doc["types"]}).encode(),
        json.dumps({**doc, "types": [["builtins.eval", ["x"]]]}).encode(),
        json.dumps({**doc, "objs": doc["objs"] + [[0, [{"o": 10**9}]]]}).encode(),
    ]
    # a field holding a value its annotation does not allow (a str where an IntExpr goes)
    types = [t[0] for t in doc["types"]]
    ti = types.index(f"{isa.Buffer.__module__}.Buffer")
    objs = [list(o) for o in doc["objs"]]
    k = next(i for i, o in enumerate(objs) if o[0] == ti)
    objs[k] = [ti, [objs[k][1][0], objs[k][1][1], objs[k][1][2], "1000", objs[k][1][4]]]
    bad.append(json.dumps({**doc, "objs": objs}).encode())
    # renamed fields (another lazymath's schema)
    bad.append(json.dumps({**doc, "types": [[n, [f + "_" for f in fs]] for n, fs in doc["types"]]}).encode())  # fmt: skip
    for blob in bad:
        with pytest.raises(isa_codec.CodecError):
            isa_codec.decode(blob)
    assert not marker.exists()


def test_codec_refuses_to_encode_foreign_values():
    p = build_program(_ir(64), get_spec("ascend910"), "k")
    with pytest.raises(isa_codec.CodecError):
        isa_codec.encode(dataclasses.replace(p, body=(*p.body, object())))


# ----------------------------------------------------------------------------- a second process

_CHILD = textwrap.dedent(
    """
    import json, sys, warnings
    import numpy as np
    warnings.simplefilter("always")
    from lazymath.backend.native import kernel_cache
    from lazymath.backend.compile import compile_kernel
    from lazymath.backend.npu.kernel_ir import ElementwiseKernel, SOp, contiguous_view
    from lazymath.runtime.device import get_spec
    n = int(sys.argv[1])
    v = contiguous_view("float32", (n,))
    expr = (SOp("load", "float32", (), 0), SOp("const", "float32", (), 1.5),
            SOp("mul", "float32", (0, 1)), SOp("sin", "float32", (2,)))
    ir = ElementwiseKernel((n,), (v,), (v,), expr, (3,))
    x = np.linspace(-3, 3, n, dtype=np.float32)
    o = np.zeros_like(x)
    with warnings.catch_warnings(record=True) as w:
        compile_kernel(ir, get_spec("ascend910"))(x, o)
    ok = bool(np.allclose(o, np.sin(x * np.float32(1.5)), atol=1e-6))
    print(json.dumps({**kernel_cache.cache_info(), "ok": ok,
                      "warnings": [str(m.message) for m in w]}))
    """
)


def _child(cache: Path) -> dict:
    env = {**os.environ, "LAZYMATH_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT)}
    env.pop("LAZYMATH_CACHE", None)
    out = subprocess.run([sys.executable, "-c", _CHILD, str(N)], env=env, capture_output=True,
                         text=True, timeout=120, check=True)  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def _key(cache: Path, monkeypatch) -> Path:
    monkeypatch.setenv("LAZYMATH_CACHE_DIR", str(cache))
    monkeypatch.delenv("LAZYMATH_CACHE", raising=False)
    key, _ = bc._disk_key(_ir(), get_spec("ascend910"))
    return cache / (key + kernel_cache.SUFFIX)


def _first(cache: Path, monkeypatch) -> Path:
    """Compile the child's kernel in this process: a valid entry in `cache`, its path."""
    path = _key(cache, monkeypatch)
    kernel_cache.clear_cache(memory=True, disk=False)
    compile_kernel(_ir(), get_spec("ascend910"))
    kernel_cache.clear_cache(memory=True, disk=False)
    assert path.is_file()
    return path


@pytest.mark.parametrize("tamper", ["pickle", "fifo", "devzero", "directory", "foreign_owner"])
def test_second_process_refuses_a_tampered_entry(tmp_path, monkeypatch, tamper):
    cache = tmp_path / "kc"
    path = _first(cache, monkeypatch)
    marker = tmp_path / "pwned"
    if tamper == "pickle":  # checksum-valid file whose program part is a pickle
        data = path.read_bytes()
        entry = kernel_cache._parse(data, path.stem)
        path.unlink()
        kernel_cache.disk_store(path.stem, {k: entry.header[k] for k in ("symbol", "kind", "name")},
                                entry.obj, {"program": pickle.dumps(_Evil(str(marker)))})  # fmt: skip
        assert path.is_file()
        why = "not a lazymath ISA encoding"
    elif tamper == "fifo":
        path.unlink()
        os.mkfifo(path)
        why = "FIFO"
    elif tamper == "devzero":
        path.unlink()
        os.symlink("/dev/zero", path)
        why = "symbolic link"
    elif tamper == "directory":
        path.unlink()
        path.mkdir()
        why = "directory"
    else:
        if os.geteuid() != 0:
            pytest.skip("changing a file's owner needs root")
        os.chown(path, 4242, 4242)
        why = "owned by uid 4242"
    second = _child(cache)
    assert second["ok"] and second["disk_hits"] == 0 and second["disk_rejected"] == 1
    assert any(why in m and str(path) in m for m in second["warnings"]), second["warnings"]
    assert not marker.exists()
    st = os.lstat(path)  # replaced by a valid private file
    assert stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()
    assert kernel_cache.disk_load(path.stem) is not None


@pytest.mark.parametrize("case", ["world_writable_foreign", "world_writable", "file", "proc"])
def test_untrusted_cache_directory_is_refused_with_a_warning(tmp_path, monkeypatch, case):
    cache = tmp_path / "kc"
    if case == "file":
        cache.write_bytes(b"")
        why = "not a directory"
    elif case == "proc":
        cache = Path("/proc/self/lazymath-cache")
        why = "cannot be created"
    else:
        _first(cache, monkeypatch)  # a valid entry the refused directory must not serve
        os.chmod(cache, 0o777)
        why = "writable by others"
        if case == "world_writable_foreign":
            if os.geteuid() != 0:
                pytest.skip("changing a directory's owner needs root")
            os.chown(cache, 4242, 4242)
            why = "owned by uid 4242"
    out = _child(cache)
    assert out["ok"] and out["disk_hits"] == 0 and out["disk_writes"] == 0
    assert any(why in m and str(cache) in m and "the disk cache is off" in m
               for m in out["warnings"]), out["warnings"]  # fmt: skip


def test_oversized_entry_is_not_read(tmp_path, monkeypatch):
    cache = tmp_path / "kc"
    path = _key(cache, monkeypatch)
    cache.mkdir(mode=0o700)
    with open(path, "wb") as f:
        f.truncate(kernel_cache.MAX_FILE_BYTES + 1)  # sparse: no disk space used
    os.chmod(path, 0o600)
    kernel_cache.clear_cache(memory=True, disk=False)
    before = kernel_cache.cache_info()
    with pytest.warns(RuntimeWarning, match="more than"):
        k = compile_kernel(_ir(), get_spec("ascend910"))
    after = kernel_cache.cache_info()
    assert after["disk_rejected"] - before["disk_rejected"] == 1
    x = np.linspace(-3, 3, N, dtype=np.float32)
    o = np.zeros_like(x)
    k(x, o)
    np.testing.assert_allclose(o, np.sin(x * np.float32(1.5)), atol=1e-6)
    kernel_cache.clear_cache(memory=True, disk=False)
