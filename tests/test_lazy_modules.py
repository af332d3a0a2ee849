"""Deferred module references (lazymath/_lazy.py): declared at the top of a module, imported on
first attribute access, safe when threads race for the first access, and visible to the import
checks. Fast: a throwaway package on a temporary path, no lazymath kernels run."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from lazymath import _lazy


@pytest.fixture
def pkg(tmp_path, monkeypatch):
    """A package `lzpkg` whose module `slow` sleeps while it loads (so racing threads overlap)
    and counts its executions in `lzpkg.loads`."""
    root = tmp_path / "lzpkg"
    root.mkdir()
    (root / "__init__.py").write_text("loads = 0\n")
    (root / "slow.py").write_text(
        "import time\nimport lzpkg\nlzpkg.loads += 1\ntime.sleep(0.05)\nVALUE = 42\n"
        "def double(x):\n    return 2 * x\n"
    )
    (root / "broken.py").write_text("raise RuntimeError('broken module body')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "lzpkg"
    for name in [m for m in sys.modules if m == "lzpkg" or m.startswith("lzpkg.")]:
        del sys.modules[name]


def test_nothing_loads_until_first_use(pkg):
    ref = _lazy.deferred(f"{pkg}.slow")
    assert f"{pkg}.slow" not in sys.modules
    assert "not loaded yet" in repr(ref)
    assert ref.VALUE == 42 and ref.double(4) == 8
    assert f"{pkg}.slow" in sys.modules and "loaded" in repr(ref)
    assert ref._load() is sys.modules[f"{pkg}.slow"]


def test_threads_racing_the_first_access_all_see_the_module(pkg):
    ref = _lazy.deferred(f"{pkg}.slow")
    got: list = []
    start = threading.Barrier(8)

    def use() -> None:
        start.wait()
        got.append(ref.VALUE)

    threads = [threading.Thread(target=use) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [42] * 8
    assert sys.modules[pkg].loads == 1  # executed once


def test_writes_go_to_the_module(pkg, monkeypatch):
    ref = _lazy.deferred(f"{pkg}.slow")
    monkeypatch.setattr(ref, "VALUE", 7)
    assert sys.modules[f"{pkg}.slow"].VALUE == 7 and ref.VALUE == 7
    monkeypatch.undo()
    assert sys.modules[f"{pkg}.slow"].VALUE == 42


def test_load_and_errors(pkg):
    ref = _lazy.deferred(f"{pkg}.slow")
    assert _lazy.load(ref) is sys.modules[f"{pkg}.slow"]
    assert _lazy.load(sys) is sys  # a real module passes through
    with pytest.raises(AttributeError, match="nope"):
        ref.nope  # noqa: B018
    with pytest.raises(RuntimeError, match="broken module body"):
        _lazy.deferred(f"{pkg}.broken").anything  # noqa: B018
    with pytest.raises(ModuleNotFoundError):
        _lazy.deferred(f"{pkg}.missing").anything  # noqa: B018
    for bad in ("", ".relative", None):
        with pytest.raises(ValueError, match="absolute dotted module name"):
            _lazy.deferred(bad)  # type: ignore[arg-type]


def test_import_lazymath_loads_no_engine_fusion_backend_or_viz():
    """What the deferred references are for: `import lazymath` stays free of the driver's and
    the backend's modules (and of llvmlite's shared library) until something realizes."""
    code = (
        "import sys, lazymath\n"
        "heavy = [m for m in sys.modules if m.startswith(('lazymath.engine', 'lazymath.fusion',"
        " 'lazymath.backend', 'lazymath.viz', 'llvmlite.binding'))]\n"
        "print(heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
