"""Deferred module references: a dependency declared at the top of a module, loaded on first use.

Why: `import lazymath` must stay cheap (it loads the tensor, the graph and the functions, ~70 ms),
and the first realize overlaps the compile server's boot with loading fusion and the backend (the
order of those loads decides the overlap). Loading the engine, fusion, the backend (llvmlite) or
the pictures (viz) eagerly would cost 100-300 ms on an import that may never realize anything. The
old answer, an `import` inside each function that needs the module, hid every such dependency from
a reader and from the import checks (tests/test_import_direction.py), and paid the import
machinery on every call.

A deferred reference is written once, at the top, next to the ordinary imports:

    engine = deferred("lazymath.engine")

and used like the module (`engine.run_compiled(...)`); the module is imported (with Python's own
import lock, so two threads may race for it safely) on the first attribute access. The argument is
a string literal on purpose: tools/arch_metrics.py and the import-direction test read these calls
from the source and treat them as module-level edges, so cycles and layer violations through a
deferred reference are still caught. Attribute writes go to the module too, so tests can
monkeypatch through the reference.

The standard library's importlib.util.LazyLoader defers a module the same way, but on Python 3.11
an attribute read racing the load can fail (CPython gh-114763, fixed for 3.12.3), and lazymath
loads modules from compile and execution threads; this wrapper simply calls importlib on first
use, under Python's per-module import lock.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["deferred", "load"]


class _Deferred:
    """A module named at import time and imported on first attribute access."""

    __slots__ = ("_name", "_module")

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_module", None)

    def _load(self) -> ModuleType:
        module = object.__getattribute__(self, "_module")
        if module is None:
            module = importlib.import_module(object.__getattribute__(self, "_name"))
            object.__setattr__(self, "_module", module)
        return module

    def __getattr__(self, attr: str):
        # Only reached for names that are not slots: every module attribute.
        module = self._module
        return getattr(module if module is not None else self._load(), attr)

    def __setattr__(self, attr: str, value) -> None:
        setattr(self._load(), attr, value)

    def __delattr__(self, attr: str) -> None:
        delattr(self._load(), attr)

    def __dir__(self) -> list[str]:
        return dir(self._load())

    def __repr__(self) -> str:
        state = "loaded" if self._module is not None else "not loaded yet"
        return f"<deferred module {self._name!r} ({state})>"


def deferred(name: str) -> ModuleType:
    """A reference to module `name` (absolute, dotted) that imports it on first use.

    Typed as the module so call sites read and type-check as ordinary module attributes."""
    if not isinstance(name, str) or not name or name.startswith("."):
        raise ValueError(f"deferred() needs an absolute dotted module name, got {name!r}")
    return _Deferred(name)  # type: ignore[return-value]


def load(ref: ModuleType) -> ModuleType:
    """Import a deferred module now (for its side effects, e.g. registering kernel definitions)
    and return the module itself; a real module is returned as is."""
    if isinstance(ref, _Deferred):
        return ref._load()
    return ref
