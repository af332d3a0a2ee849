"""Compiled dataclass methods, cached like bytecode (issue 20: first-call time).

`dataclasses` writes each generated method (``__init__``, ``__repr__``, ``__eq__``, frozen
``__setattr__``...) as source text and compiles it with `exec` when the class is defined: for
lazymath's ~130 dataclasses (the ISA, the kernel IR, the runtime) that is ~400 compiles and
~35 ms of every process's first realize (the backend modules load on first use), more than the
modules' own bytecode costs to load. The compiled code objects only depend on that text, so they
are kept in one file next to the package's bytecode (``lazymath/__pycache__``), keyed by the
text, and reused by later processes.

`install` makes `dataclasses` call `_exec` instead of the builtin `exec`. For classes defined in
lazymath modules it runs the cached code object of the same text (compiled exactly as `exec`
compiles it: filename ``<string>``, no inherited future flags); everything else goes to the
builtin `exec` unchanged. The file is written at exit when this process compiled new methods,
unless Python writes no bytecode (``PYTHONDONTWRITEBYTECODE`` / ``-B``) or the directory is not
writable. A file that does not load (another Python, truncated) is ignored.
"""

from __future__ import annotations

import builtins
import importlib.util
import marshal
import os
import sys
import threading

_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "__pycache__")
PATH = os.path.join(_DIR, f"dataclass-methods.{sys.implementation.cache_tag}.marshal")
MAX_ENTRIES = 4000  # beyond this the file keeps only what this process used (source changes)

_codes: dict[str, object] = {}
_used: set[str] = set()
_lock = threading.Lock()
_state = {"new": 0, "loaded": False}


def _load() -> None:
    try:
        with open(PATH, "rb") as f:
            data = marshal.loads(f.read())
    except (OSError, ValueError, EOFError, TypeError):
        return
    if not (isinstance(data, tuple) and len(data) == 2 and data[0] == importlib.util.MAGIC_NUMBER):
        return
    codes = data[1]
    if isinstance(codes, dict):
        _codes.update(
            (k, v) for k, v in codes.items() if isinstance(k, str) and type(v) is _CODE_TYPE
        )


_CODE_TYPE = type(_load.__code__)


def _exec(source, globals=None, locals=None, /, **kw):
    """`exec` for dataclasses: cached code for lazymath's classes, the builtin otherwise."""
    if (
        kw
        or type(source) is not str
        or not isinstance(globals, dict)
        or not str(globals.get("__name__", "")).startswith("lazymath")
    ):
        return builtins.exec(source, globals, locals, **kw)
    code = _codes.get(source)
    if code is None:
        code = compile(source, "<string>", "exec", dont_inherit=True)
        with _lock:
            _codes[source] = code
            _state["new"] += 1
    _used.add(source)
    return builtins.exec(code, globals, locals)


def _save() -> None:
    if not _state["new"] or sys.dont_write_bytecode:
        return
    with _lock:
        keep = _codes if len(_codes) <= MAX_ENTRIES else {k: _codes[k] for k in _used}
        try:
            blob = marshal.dumps((importlib.util.MAGIC_NUMBER, dict(keep)))
        except ValueError:
            return
    tmp = f"{PATH}.{os.getpid()}.tmp"
    try:
        os.makedirs(_DIR, exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(blob)
        os.replace(tmp, PATH)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def install() -> None:
    """Load the cache and route `dataclasses`' method compiles through it (once)."""
    if _state["loaded"]:
        return
    _state["loaded"] = True
    import atexit
    import dataclasses

    _load()
    dataclasses.exec = _exec  # a module global shadows the builtin inside dataclasses
    atexit.register(_save)
