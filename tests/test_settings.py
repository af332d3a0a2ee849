"""lazymath.settings: every LAZYMATH_* variable is parsed in one place, with one boolean
convention; a bad value is an error naming the variable and what it accepts; the README's
settings table is the one the module generates; no other module reads LAZYMATH_* itself."""

from __future__ import annotations

import ast
import pathlib
import re

import numpy as np
import pytest

import lazymath as lm
from lazymath import settings

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Good spellings per kind and the value each stands for.
BOOL_GOOD = [(s, True) for s in ("1", "true", "TRUE", "On", "yes", " yes ")] + [
    (s, False) for s in ("0", "false", "False", "OFF", "no", "No")
]
GOOD = {
    "LAZYMATH_BACKEND": [("llvm", "llvm"), ("LLVM", "llvm"), ("interp", "interp"),
                         ("reference", "reference"), ("irref", "irref")],
    "LAZYMATH_SCHEDULER": [("threads", "threads"), ("sync", "sync"), ("SYNC", "sync"),
                           ("streams", "threads"), ("async", "threads")],
    "LAZYMATH_CACHE_DIR": [("/tmp/x y", "/tmp/x y"), ("rel/dir", "rel/dir")],
    "LAZYMATH_CACHE": BOOL_GOOD,
    "LAZYMATH_DEBUG": [("0", 0), ("1", 1), ("5", 5), (" 2 ", 2), ("off", 0), ("Realize", 1),
                       ("kernels", 2), ("ISA", 3), ("ir", 4), ("asm", 5)],
    "LAZYMATH_DEBUG_DIR": [("/tmp/dbg", "/tmp/dbg")],
    "LAZYMATH_VALIDATE": BOOL_GOOD,
    "LAZYMATH_ELFLOAD": BOOL_GOOD,
    "LAZYMATH_COMPILE_TIMEOUT": [("300", 300.0), ("2", 2.0), ("0.5", 0.5), ("1e3", 1000.0)],
    "LAZYMATH_DASK_SCHEDULER": [("tcp://10.0.0.1:8786", "tcp://10.0.0.1:8786")],
    "LAZYMATH_DASK_CACHE_BASE": [("/tmp/lm base", "/tmp/lm base")],
    "LAZYMATH_TARGET_CPU": [("haswell", "haswell"), ("x86-64-v3", "x86-64-v3")],
    "LAZYMATH_AUTOTUNE": BOOL_GOOD,
    "LAZYMATH_VMATH_CALLS": [("auto", "auto"), ("Always", "always"), ("1", "always"),
                             ("never", "never"), ("off", "never"), ("inline", "never")],
    "LAZYMATH_TIERED": BOOL_GOOD,
    "LAZYMATH_HOST_MATH": BOOL_GOOD,
    "LAZYMATH_COMPILE_THREADS": [("0", 0), ("1", 1), (" 2 ", 2)],
    "LAZYMATH_NUM_THREADS": [("0", 0), ("1", 1), ("64", 64)],
    "LAZYMATH_POOL_SPIN_US": [("0", 0), ("1000", 1000), (" 250 ", 250)],
    "LAZYMATH_QUIET_PEERS": [("0", False), ("on", True), ("1", True)],
    "LAZYMATH_COMPILE_ISOLATE": [("auto", "auto"), ("1", "always"), ("On", "always"),
                                 ("0", "off"), ("never", "off")],
    "LAZYMATH_SCALAR_ARGS": BOOL_GOOD,
    "LAZYMATH_KERNEL_CACHE_LIMIT": [("1", 1), ("4096", 4096)],
    "LAZYMATH_PROGRAM_CACHE_LIMIT": [("3", 3), (" 1024 ", 1024)],
    "LAZYMATH_DISK_CACHE_LIMIT": [("1", 1), ("1073741824", 1 << 30)],
    "LAZYMATH_TEST_COMPILE_FAULT": [("abort", "abort"), ("hang-vectorized", "hang-vectorized")],
}  # fmt: skip
BAD = {
    "LAZYMATH_BACKEND": ["cuda", "llvm2", "1"],
    "LAZYMATH_SCHEDULER": ["fast", "thread", "0"],
    "LAZYMATH_CACHE": ["2", "nope", "enabled", "-1"],
    "LAZYMATH_DEBUG": ["-1", "two", "1.5", "true", "verbose"],
    "LAZYMATH_VALIDATE": ["2", "y", "validate"],
    "LAZYMATH_ELFLOAD": ["2", "mcjit"],
    "LAZYMATH_COMPILE_TIMEOUT": ["-1", "soon", "nan"],
    "LAZYMATH_VMATH_CALLS": ["sometimes", "2"],
    "LAZYMATH_AUTOTUNE": ["2", "fast"],
    "LAZYMATH_TIERED": ["2", "maybe"],
    "LAZYMATH_HOST_MATH": ["2", "float64", "host"],
    "LAZYMATH_COMPILE_THREADS": ["-1", "two", "1.5"],
    "LAZYMATH_NUM_THREADS": ["-1", "all", "2.5"],
    "LAZYMATH_POOL_SPIN_US": ["-1", "1ms", "0.5"],
    "LAZYMATH_QUIET_PEERS": ["auto", "2"],
    "LAZYMATH_COMPILE_ISOLATE": ["2", "maybe"],
    "LAZYMATH_SCALAR_ARGS": ["2", "maybe"],
    "LAZYMATH_KERNEL_CACHE_LIMIT": ["0", "many", "1.5"],
    "LAZYMATH_PROGRAM_CACHE_LIMIT": ["0", "-3"],
    "LAZYMATH_DISK_CACHE_LIMIT": ["0", "1GB"],
    "LAZYMATH_TEST_COMPILE_FAULT": ["crash"],
}
# Variables whose every string is accepted (paths) have no bad values.
NO_BAD = {
    "LAZYMATH_CACHE_DIR",
    "LAZYMATH_DEBUG_DIR",
    "LAZYMATH_DASK_SCHEDULER",
    "LAZYMATH_DASK_CACHE_BASE",
    "LAZYMATH_TARGET_CPU",  # any name parses; host.make_target refuses unknown/unrunnable CPUs
}


def test_every_setting_has_good_and_bad_cases():
    names = {s.name for s in settings.SETTINGS}
    assert set(GOOD) == names, "add good values for a new setting to GOOD"
    assert set(BAD) | NO_BAD == names, "add bad values for a new setting to BAD"


@pytest.mark.parametrize(
    "name,text,value", [(n, t, v) for n, cases in GOOD.items() for t, v in cases]
)
def test_good_values(monkeypatch, name, text, value):
    monkeypatch.setenv(name, text)
    got = settings.get(name)
    assert got == value and type(got) is type(value)
    assert settings.setting(name).get() == value  # cached path gives the same answer


@pytest.mark.parametrize("name", [s.name for s in settings.SETTINGS])
def test_unset_and_empty_mean_default(monkeypatch, name):
    default = settings.setting(name).default
    monkeypatch.delenv(name, raising=False)
    assert settings.get(name) == default
    monkeypatch.setenv(name, "")
    assert settings.get(name) == default
    monkeypatch.setenv(name, "   ")
    assert settings.get(name) == default


@pytest.mark.parametrize("name,text", [(n, t) for n, texts in BAD.items() for t in texts])
def test_bad_values_name_the_variable_and_the_choices(monkeypatch, name, text):
    monkeypatch.setenv(name, text)
    s = settings.setting(name)
    for _ in range(2):  # a bad value is never cached: every read raises
        with pytest.raises(ValueError) as e:
            s.get()
        assert name in str(e.value) and repr(text) in str(e.value)
        assert s.accepted() in str(e.value)


def test_changes_are_seen_at_once(monkeypatch):
    monkeypatch.setenv("LAZYMATH_DEBUG", "3")
    assert settings.DEBUG.get() == 3
    monkeypatch.setenv("LAZYMATH_DEBUG", "4")
    assert settings.DEBUG.get() == 4
    monkeypatch.delenv("LAZYMATH_DEBUG")
    assert settings.DEBUG.get() == 0
    monkeypatch.setenv("LAZYMATH_DEBUG", "x")
    with pytest.raises(ValueError, match="LAZYMATH_DEBUG"):
        settings.DEBUG.get()
    monkeypatch.setenv("LAZYMATH_DEBUG", "1")
    assert settings.DEBUG.get() == 1


def test_unknown_setting_name():
    with pytest.raises(KeyError, match="LAZYMATH_NOPE is not a lazymath setting"):
        settings.get("LAZYMATH_NOPE")


def test_boolean_convention_is_one(monkeypatch):
    """Every boolean variable accepts the same spellings (it used to be three conventions)."""
    bools = [s for s in settings.SETTINGS if s.kind == "bool"]
    assert len(bools) >= 3
    for s in bools:
        for text, value in BOOL_GOOD:
            monkeypatch.setenv(s.name, text)
            assert s.get() is value


def test_bad_backend_raises_on_realize(monkeypatch):
    """LAZYMATH_BACKEND used to be parsed twice (one place raised, the other fell back to llvm);
    now a realize and a direct kernel compile both raise."""
    monkeypatch.setenv("LAZYMATH_BACKEND", "cuda")
    t = lm.tensor(np.arange(3, dtype=np.float32)) + 1
    with pytest.raises(ValueError, match="LAZYMATH_BACKEND='cuda'"):
        t.numpy()
    from lazymath.backend.compile import default_backend

    with pytest.raises(ValueError, match="LAZYMATH_BACKEND"):
        default_backend()
    monkeypatch.setenv("LAZYMATH_BACKEND", "Reference")
    np.testing.assert_array_equal(t.numpy(), np.arange(3, dtype=np.float32) + 1)
    assert default_backend() == "llvm"  # reference/irref never compile: kernels are native


def test_bad_debug_level_raises_on_realize(monkeypatch):
    monkeypatch.setenv("LAZYMATH_BACKEND", "reference")
    monkeypatch.setenv("LAZYMATH_DEBUG", "loud")
    with pytest.raises(ValueError, match="LAZYMATH_DEBUG='loud'"):
        (lm.tensor(np.ones(2, np.float32)) * 2).numpy()


def test_readme_table_is_generated():
    readme = (ROOT / "README.md").read_text()
    table = settings.markdown_table()
    assert table in readme, (
        "README's settings table differs from lazymath.settings: regenerate it with "
        "`python -m lazymath.settings --markdown`"
    )
    named = set(re.findall(r"LAZYMATH_[A-Z0-9_]*[A-Z0-9]", readme))
    assert named <= {s.name for s in settings.SETTINGS}, "README names a variable settings lacks"


def _env_reads(tree: ast.AST) -> list[str]:
    """Source fragments that read the environment directly: os.environ.get(...), os.getenv(...),
    os.environ[...] (writes, e.g. a worker process setting its own cache dir, are fine)."""
    found = []

    def is_environ(n) -> bool:
        return ast.unparse(n) == "os.environ"

    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            f = node.func
            if (f.attr == "get" and is_environ(f.value)) or ast.unparse(f) == "os.getenv":
                found.append(ast.unparse(node))
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            if is_environ(node.value):
                found.append(ast.unparse(node))
    return found


def test_no_module_reads_lazymath_variables_itself():
    """Only settings.py reads os.environ; kernel_cache.py reads XDG_CACHE_HOME (not ours)."""
    allowed = {"lazymath/settings.py": None,
               "lazymath/backend/native/kernel_cache.py": {"os.environ.get('XDG_CACHE_HOME')"}}  # fmt: skip
    bad = {}
    for path in sorted((ROOT / "lazymath").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        reads = _env_reads(ast.parse(path.read_text()))
        if rel in allowed:
            ok = allowed[rel]
            reads = [] if ok is None else [r for r in reads if r not in ok]
        if reads:
            bad[rel] = reads
    assert not bad, f"read LAZYMATH_* through lazymath.settings instead: {bad}"


def test_debug_level_names_are_in_the_error(monkeypatch):
    monkeypatch.setenv("LAZYMATH_DEBUG", "verbose")
    with pytest.raises(ValueError) as e:
        settings.DEBUG.get()
    for name in settings.DEBUG_LEVELS:
        assert repr(name) in str(e.value)


def test_override_wins_over_env_and_restores(monkeypatch):
    monkeypatch.setenv("LAZYMATH_DEBUG", "2")
    assert settings.source("LAZYMATH_DEBUG") == "env"
    with settings.override(LAZYMATH_DEBUG="isa", LAZYMATH_VALIDATE=True):
        assert settings.DEBUG.get() == 3 and settings.get("LAZYMATH_VALIDATE") is True
        assert settings.source("LAZYMATH_DEBUG") == "override"
        with settings.override(LAZYMATH_DEBUG=0):  # nests
            assert settings.DEBUG.get() == 0
        assert settings.DEBUG.get() == 3
        with settings.override(LAZYMATH_DEBUG=None):  # None lifts the override for a block
            assert settings.DEBUG.get() == 2 and settings.source("LAZYMATH_DEBUG") == "env"
    assert settings.DEBUG.get() == 2 and settings.source("LAZYMATH_DEBUG") == "env"
    assert settings.get("LAZYMATH_VALIDATE") is False
    monkeypatch.delenv("LAZYMATH_DEBUG")
    assert settings.source("LAZYMATH_DEBUG") == "default"
    monkeypatch.setenv("LAZYMATH_DEBUG", " ")
    assert settings.source("LAZYMATH_DEBUG") == "default"  # empty means default
    o = settings.override(LAZYMATH_COMPILE_TIMEOUT=5).start()
    try:
        assert settings.COMPILE_TIMEOUT.get() == 5.0
        assert type(settings.COMPILE_TIMEOUT.get()) is float
    finally:
        o.stop()
    assert settings.COMPILE_TIMEOUT.get() == 300.0


@pytest.mark.parametrize(
    "name,value",
    [("LAZYMATH_CACHE", 2), ("LAZYMATH_CACHE", "nope"), ("LAZYMATH_DEBUG", -1),
     ("LAZYMATH_DEBUG", 1.5), ("LAZYMATH_DEBUG", True), ("LAZYMATH_BACKEND", "cuda"),
     ("LAZYMATH_COMPILE_TIMEOUT", float("nan")), ("LAZYMATH_COMPILE_THREADS", "two")],
)  # fmt: skip
def test_override_refuses_bad_values(name, value):
    with pytest.raises(ValueError, match=name):
        settings.override(**{name: value})
    assert settings.source(name) != "override"


def test_override_unknown_name():
    with pytest.raises(KeyError, match="LAZYMATH_NOPE"):
        settings.override(LAZYMATH_NOPE=1)


def test_override_reaches_a_realize(capfd):
    with settings.override(LAZYMATH_BACKEND="reference", LAZYMATH_DEBUG="realize"):
        np.testing.assert_array_equal((lm.tensor(np.ones(2, np.float32)) * 2).numpy(), [2, 2])
    out, err = capfd.readouterr()
    assert "via reference" in out + err


def test_show_config(monkeypatch, capsys):
    monkeypatch.setenv("LAZYMATH_VALIDATE", "on")
    with settings.override(LAZYMATH_DEBUG="off"):
        lm.show_config()
        out = capsys.readouterr().out
        c = lm.show_config(mode="dicts")
    assert out.startswith(f"lazymath {lm.__version__}")
    for word in ("numpy " + np.__version__, "llvmlite", "LLVM", "host target:", "kernel cache:",
                 "graphviz (dot)", "matplotlib"):  # fmt: skip
        assert word in out, word
    for s in settings.SETTINGS:  # every setting, with its source
        assert s.name in out
        assert c["settings"][s.name]["source"] in ("default", "env", "override")
    line = next(ln for ln in out.splitlines() if "LAZYMATH_VALIDATE" in ln)
    assert "True" in line and "(env)" in line
    line = next(ln for ln in out.splitlines() if "LAZYMATH_DEBUG " in ln)
    assert "(override)" in line
    assert c["settings"]["LAZYMATH_VALIDATE"] == {"value": True, "source": "env"}
    assert c["versions"]["numpy"] == np.__version__
    with pytest.raises(ValueError, match="mode"):
        lm.show_config(mode="json")


def test_show_config_reports_a_bad_value_instead_of_failing(monkeypatch, capsys):
    monkeypatch.setenv("LAZYMATH_CACHE", "maybe")
    lm.show_config()
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "LAZYMATH_CACHE " in ln)
    assert "invalid" in line and "maybe" in line


def test_docs_settings_reference_is_generated():
    doc = (ROOT / "docs" / "settings.md").read_text()
    assert doc.rstrip("\n") == settings.markdown_reference(), (
        "docs/settings.md differs from lazymath.settings: regenerate it with "
        "`python -m lazymath.settings --docs > docs/settings.md`"
    )
    for s in settings.SETTINGS:
        assert f"## `{s.name}`" in doc
