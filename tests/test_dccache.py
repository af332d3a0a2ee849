"""lazymath/_dccache.py: dataclass methods of lazymath's modules compiled once and cached beside
the bytecode; behaviour identical to `exec`, other packages' dataclasses untouched."""

from __future__ import annotations

import dataclasses
import types

import pytest

from lazymath import _dccache


def _define(module_name: str):
    """A frozen dataclass defined in a fresh module called `module_name`."""
    import sys

    mod = types.ModuleType(module_name)
    sys.modules[module_name] = mod
    try:
        exec(
            "import dataclasses\n"
            "@dataclasses.dataclass(frozen=True)\n"
            "class P:\n"
            "    x: int\n"
            "    y: float = 2.5\n",
            mod.__dict__,
        )
        return mod.P
    finally:
        del sys.modules[module_name]


def test_installed_and_lazymath_classes_use_cached_code():
    assert dataclasses.exec is _dccache._exec  # `import lazymath` installed it
    before = dict(_dccache._codes)
    P = _define("lazymath._dccache_probe")
    p = P(1)
    assert (p.x, p.y, repr(p)) == (1, 2.5, "P(x=1, y=2.5)")
    assert p == P(1, 2.5) and hash(p) == hash(P(1))
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.x = 3
    assert any("def __init__(self" in s for s in set(_dccache._codes) - set(before))
    code_init = P.__init__.__code__
    P2 = _define("lazymath._dccache_probe")  # same source text: the same code object
    assert P2.__init__.__code__ is code_init
    assert P2(4).y == 2.5


def test_other_packages_go_to_the_builtin_exec():
    n = len(_dccache._codes)
    Q = _define("not_lazymath_probe")
    assert Q(3) == Q(3, 2.5)
    assert len(_dccache._codes) == n


def test_file_round_trip_and_bad_files(tmp_path, monkeypatch):
    path = tmp_path / "pc" / "dc.marshal"
    monkeypatch.setattr(_dccache, "_DIR", str(tmp_path / "pc"))
    monkeypatch.setattr(_dccache, "PATH", str(path))
    monkeypatch.setattr(_dccache, "_codes", {})
    monkeypatch.setattr(_dccache, "_used", set())
    monkeypatch.setattr(_dccache, "_state", {"new": 0, "loaded": True})
    monkeypatch.setattr("sys.dont_write_bytecode", False)
    P = _define("lazymath._dccache_probe2")
    assert _dccache._state["new"] > 0
    _dccache._save()
    saved = dict(_dccache._codes)
    _dccache._codes.clear()
    _dccache._load()
    assert set(_dccache._codes) == set(saved)
    assert P(5).x == 5
    path.write_bytes(b"\x00garbage")  # another Python's or a truncated file: ignored
    _dccache._codes.clear()
    _dccache._load()
    assert _dccache._codes == {}
    monkeypatch.setattr("sys.dont_write_bytecode", True)  # -B: nothing written
    path.unlink()
    _define("lazymath._dccache_probe3")
    _dccache._save()
    assert not path.exists()
