"""Every LAZYMATH_* environment variable: one table, one parser, one boolean convention.

Each setting is one `Setting` row in `SETTINGS` (name, kind, default, doc). Code reads a value
with `settings.get("LAZYMATH_X")` or, on hot paths, through the row itself (`BACKEND.get()`).

The environment is read on every `get` (tests and users change it at run time), but cheaply:
one dict lookup of the raw value, and the parsed value is cached per raw value, so an unchanged
variable is never parsed twice. An unset or empty variable means the default. A bad value raises
`ValueError` naming the variable and what it accepts, on every read (it is never cached).

Conventions:
- booleans: 1/0, true/false, on/off, yes/no (case-insensitive);
- choices: case-insensitive names from a fixed list (aliases allowed);
- int and float: validated, with an optional lower bound; an int may also have names
  (`LAZYMATH_DEBUG=kernels` is level 2).

`override(LAZYMATH_X=value)` sets values for a block of code without touching the environment
(tests, notebooks); `source(name)` says where a value comes from ("default", "env" or
"override"), as `lm.show_config()` prints it.

Adding a variable is one `Setting(...)` row below; then regenerate the README table with
`python -m lazymath.settings --markdown` and docs/settings.md with `python -m lazymath.settings
--docs > docs/settings.md` (tests check that both match).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

__all__ = ["Setting", "SETTINGS", "get", "source", "override", "markdown_table"]

_TRUE = ("1", "true", "on", "yes")
_FALSE = ("0", "false", "off", "no")
_BOOLS = {**dict.fromkeys(_TRUE, True), **dict.fromkeys(_FALSE, False)}

_ENV_DATA = getattr(os.environ, "_data", None)
_UNSET = object()


class Setting:
    """One environment variable: `kind` is "bool", "int", "float", "str", "path" or "choice".

    For "choice", `choices` maps each accepted (lower-case) spelling to its value; `shown` lists
    the spellings named in errors and docs (default: all of them). For "int", `choices` are
    optional names of values (`{"kernels": 2}`). `minimum` bounds numbers."""

    __slots__ = ("name", "kind", "default", "doc", "choices", "shown", "minimum", "_key", "_cache",
                 "_override")  # fmt: skip

    def __init__(self, name, kind, default, doc, choices=None, shown=None, minimum=None):
        if kind not in ("bool", "int", "float", "str", "path", "choice"):
            raise ValueError(f"setting {name}: unknown kind {kind!r}")
        if kind == "choice" and not choices:
            raise ValueError(f"setting {name}: a choice needs its choices")
        if choices and kind not in ("choice", "int"):
            raise ValueError(f"setting {name}: only choices and ints have named values")
        self.name = name
        self.kind = kind
        self.default = default
        self.doc = doc
        self.choices = dict(choices) if choices else None
        self.shown = tuple(shown) if shown else (tuple(self.choices) if choices else ())
        self.minimum = minimum
        self._key = os.environ.encodekey(name) if _ENV_DATA is not None else name
        self._cache = (_UNSET, None)  # (raw value, parsed value): one tuple, swapped atomically
        self._override = _UNSET  # a value set by `override` (wins over the environment)

    def raw(self):
        """The variable's raw value in the environment (None if unset)."""
        data = _ENV_DATA
        if data is not None:
            value = data.get(self._key)
            return None if value is None else os.environ.decodevalue(value)
        return os.environ.get(self.name)

    def get(self):
        """The parsed value (the default if unset or empty); ValueError on a bad value."""
        if self._override is not _UNSET:
            return self._override
        data = _ENV_DATA
        raw = data.get(self._key) if data is not None else os.environ.get(self.name)
        cache = self._cache
        if raw is cache[0]:  # the same object as last time: the environment did not change
            return cache[1]
        value = self.parse(raw if data is None or raw is None else os.environ.decodevalue(raw))
        self._cache = (raw, value)
        return value

    def parse(self, text: str | None):
        """The value `text` (a raw environment string, or None) stands for."""
        if text is None:
            return self.default
        s = text.strip()
        if not s:
            return self.default
        kind = self.kind
        if kind == "str" or kind == "path":
            return text  # a path may have meaningful spaces
        if kind == "bool":
            v = _BOOLS.get(s.lower())
            if v is None:
                raise self.error(text)
            return v
        if self.choices:
            v = self.choices.get(s.lower(), _UNSET)
            if v is not _UNSET:
                return v
            if kind == "choice":
                raise self.error(text)
        try:
            v = int(s) if kind == "int" else float(s)
        except ValueError:
            raise self.error(text) from None
        if v != v or (self.minimum is not None and v < self.minimum):  # NaN or below the bound
            raise self.error(text)
        return v

    def accepted(self) -> str:
        """What this variable accepts, in words (for errors and the README)."""
        if self.kind == "bool":
            return "a boolean: 1/0, true/false, on/off, yes/no"
        if self.kind == "choice":
            return "one of " + ", ".join(repr(c) for c in self.shown)
        if self.kind in ("int", "float"):
            what = "an integer" if self.kind == "int" else "a number"
            what = what if self.minimum is None else f"{what} >= {self.minimum:g}"
            if self.choices:
                named = ", ".join(f"{c!r} ({v})" for c, v in self.choices.items())
                what = f"{what} or a name: {named}"
            return what
        return "a directory path" if self.kind == "path" else "a string"

    def source(self) -> str:
        """Where the value in force comes from: "override", "env" or "default" (set but empty
        counts as default)."""
        if self._override is not _UNSET:
            return "override"
        raw = self.raw()
        return "env" if raw is not None and raw.strip() else "default"

    def error(self, text: str) -> ValueError:
        return ValueError(f"{self.name}={text!r} is not valid: expected {self.accepted()}")

    def __repr__(self) -> str:
        return f"Setting({self.name!r}, {self.kind!r}, default={self.default!r})"


# Backend names and what they are (the first is the default). Kept here so the error message and
# the README name every backend; `backend.compile.BACKENDS` are the ones that compile kernels.
BACKEND_NAMES = ("llvm", "interp", "reference", "irref")

BACKEND = Setting(
    "LAZYMATH_BACKEND", "choice", "llvm",
    "`llvm` (default, native code), `interp` (numpy interpreter of the ISA, exact and slow), "
    "`reference` (node-by-node numpy), `irref` (fused kernel IR on numpy, for debugging fusion)",
    choices={b: b for b in BACKEND_NAMES},
)  # fmt: skip
SCHEDULER = Setting(
    "LAZYMATH_SCHEDULER", "choice", "threads",
    "`threads` (default: streams run on host worker threads); `sync` runs kernels in order on "
    "the calling thread (no streams). Read when a device is created",
    choices={"threads": "threads", "streams": "threads", "async": "threads", "sync": "sync"},
    shown=("threads", "sync"),
)  # fmt: skip
CACHE_DIR = Setting(
    "LAZYMATH_CACHE_DIR", "path", None,
    "disk kernel cache directory (default: `$XDG_CACHE_HOME/lazymath`, else "
    "`~/.cache/lazymath`)",
)  # fmt: skip
CACHE = Setting(
    "LAZYMATH_CACHE", "bool", True,
    "`0` disables the disk kernel cache (default on)",
)  # fmt: skip
# LAZYMATH_DEBUG's named levels (a number above 5 means everything)
DEBUG_LEVELS = {"off": 0, "realize": 1, "kernels": 2, "isa": 3, "ir": 4, "asm": 5}
DEBUG = Setting(
    "LAZYMATH_DEBUG", "int", 0,
    "on stderr: `1`/`realize` one line per realize (kernel names; compiled, loaded from disk or "
    "program-cache hit; why a program-cache miss; time); `2`/`kernels` also each kernel's time, "
    "GFLOPS and GB/s as it runs (one after another, no stream overlap), the kernel table and "
    "fusion log; `3`/`isa` ISA listings; `4`/`ir` LLVM IR before and after optimization; "
    "`5`/`asm` host assembly (default 0/`off`)",
    choices=DEBUG_LEVELS, minimum=0,
)  # fmt: skip
DEBUG_DIR = Setting(
    "LAZYMATH_DEBUG_DIR", "path", None,
    "write every stage of each newly compiled program to files under this directory "
    "(`program_NNNN/`: `summary.txt`, per kernel `.isa`, `.ll` and `.opt.ll` (LLVM IR before "
    "and after optimization), `.s`); the path is printed once on stderr",
)  # fmt: skip
VALIDATE = Setting(
    "LAZYMATH_VALIDATE", "bool", False,
    "`1` re-runs every kernel on the numpy oracle and raises on a mismatch, naming the kernel "
    "and the line of your code that created it",
)  # fmt: skip
ELFLOAD = Setting(
    "LAZYMATH_ELFLOAD", "bool", True,
    "`0` loads disk-cached kernels through LLVM's MCJIT instead of lazymath's own ELF loader "
    "(by default a process whose kernels are all cached never loads LLVM: ~50 MiB less RSS)",
)  # fmt: skip
COMPILE_TIMEOUT = Setting(
    "LAZYMATH_COMPILE_TIMEOUT", "float", 300.0,
    "seconds an LLVM optimization may take (default 300); past it the kernel is compiled again "
    "with the vectorizers off, with a warning (guards against a rare LLVM loop-vectorizer hang)",
    minimum=0,
)  # fmt: skip
DASK_SCHEDULER = Setting(
    "LAZYMATH_DASK_SCHEDULER", "str", None,
    "`tcp://host:port` of an existing Dask scheduler for `lazymath.distributed` (default: an "
    "embedded LocalCluster, one worker per core)",
)  # fmt: skip
DASK_CACHE_BASE = Setting(
    "LAZYMATH_DASK_CACHE_BASE", "path", None,
    "internal, set on Dask workers by `lazymath.distributed`: the kernel cache directory under "
    "which each worker gets its own",
)  # fmt: skip
VMATH_CALLS = Setting(
    "LAZYMATH_VMATH_CALLS", "choice", "auto",
    "`auto` (default: a kernel with more than two vector-math composites calls them from the "
    "runtime library, fewer are inlined), `always` (every composite is a library call), "
    "`never` (every composite inlined)",
    choices={**dict.fromkeys(("auto",), "auto"),
             **dict.fromkeys(("always", "1", "on", "yes", "true", "call", "calls"), "always"),
             **dict.fromkeys(("never", "0", "off", "no", "false", "inline"), "never")},
    shown=("auto", "always", "never"),
)  # fmt: skip
HOST_MATH = Setting(
    "LAZYMATH_HOST_MATH", "bool", False,
    "`1`: float32/float16 sin, cos and tan reduce their argument in float64 vector "
    "instructions (a faster host-only lowering, not what an NPU can run: its Vector unit has "
    "no float64; `lm.explain` says so); default: float32/int32 instructions only",
)  # fmt: skip
TIERED = Setting(
    "LAZYMATH_TIERED", "bool", True,
    "`0` turns tiered compilation off; by default a realize whose kernel would take long to "
    "optimize starts on quickly compiled code (no IR optimization) and the optimized code "
    "replaces it in the background (results identical; the optimized code goes to the disk "
    "cache, the process waits for it at exit)",
)  # fmt: skip
COMPILE_THREADS = Setting(
    "LAZYMATH_COMPILE_THREADS", "int", 0,
    "LLVM compile threads (default 0: one per core, at most 4); the kernels of a program "
    "compile in parallel",
    minimum=0,
)  # fmt: skip
NUM_THREADS = Setting(
    "LAZYMATH_NUM_THREADS", "int", 0,
    "threads that run a kernel's blocks, the calling thread included (default 0: the CPUs the "
    "process may use: its affinity mask, `taskset`, capped by a cgroup CPU quota, `docker "
    "--cpus`); `lm.set_num_threads(n)` and threadpoolctl's `threadpool_limits(n)` override it",
    minimum=0,
)  # fmt: skip
POOL_SPIN_US = Setting(
    "LAZYMATH_POOL_SPIN_US", "int", 1000,
    "microseconds a block-pool thread spins (native code, no GIL) waiting for the next launch, "
    "and a launching thread for its helpers' last block, before it blocks: a launch within the "
    "window finds its helpers awake (Linux x86-64; 0 = block at once, as elsewhere)",
    minimum=0,
)  # fmt: skip
QUIET_PEERS = Setting(
    "LAZYMATH_QUIET_PEERS", "bool", True,
    "before a kernel launch that took >= 5 ms last time, end the worker threads a loaded "
    "OpenBLAS (numpy's, pthreads) may still be spinning after a numpy call, when no other "
    "thread can be inside it; it re-creates them at its next threaded call (results unchanged; "
    "0 = leave peer pools alone)",
)  # fmt: skip

TARGET_CPU = Setting(
    "LAZYMATH_TARGET_CPU", "str", None,
    "generate native code for this LLVM CPU (`haswell`, `znver3`, `skylake-avx512`, "
    "`x86-64-v3`, ...) instead of the host's: an AVX-512 machine runs its AVX2 path; a CPU whose "
    "features the host lacks is refused (the error names them). "
    "`lazymath.backend.native.host.describe()` prints the target in force",
)  # fmt: skip
AUTOTUNE = Setting(
    "LAZYMATH_AUTOTUNE", "bool", False,
    "`1` times the host GEMM candidates (microkernel shape, K panel) on the first compile of "
    "each matmul signature, and the FFT plans (Vector Stockham, Cube four-step, AI CPU, ...) on "
    "the first transform of each signature, and keeps the fastest, recorded in the disk cache "
    "per host target so later processes reuse it without timing (`lm.precompile(fn, *x, "
    "autotune=True)` does it for one function); otherwise a model picks. `lm.explain` shows the "
    "plan and its origin",
)  # fmt: skip
SCALAR_ARGS = Setting(
    "LAZYMATH_SCALAR_ARGS", "bool", True,
    "`1` (default): a Python scalar (bool, int, float, complex) written in your code in "
    "`a + s`, `a - s`, `a * s`, `a / s`, `a // s`, `a % s` (either side) and in `lm.*` "
    "elementwise calls (`lm.multiply(x, s)`, `lm.maximum`, `lm.clip(x, lo, hi)`, "
    "`lm.where(c, x, s)`, ...) becomes a runtime argument of the kernel (a 0-d input of the "
    "scalar's NEP 50 weak dtype), so a loop over values of `s` compiles once; scalars that "
    "shape the kernel (a `**` exponent, an axis, a shape) and lazymath's own constants stay "
    "folded. `0`: every Python scalar folds into the kernel as a constant",
)  # fmt: skip
COMPILE_ISOLATE = Setting(
    "LAZYMATH_COMPILE_ISOLATE", "choice", "server",
    "`server` (default): every compile runs in one persistent compile-server process, started "
    "at the first compile, so even a fresh process's first LLVM abort costs a restarted server "
    "and a retry (in-process as `auto` where no server can start); `auto`: compiles in-process, "
    "and a kernel whose compile killed an earlier process (an LLVM abort) is compiled in a "
    "child process (vectorizers on, then off, else the interpreter runs it); `1` compiles every "
    "kernel in a child process; `0` in-process, never isolated",
    choices={"auto": "auto", "1": "always", "true": "always", "on": "always", "yes": "always",
             "always": "always", "0": "off", "false": "off", "off": "off", "no": "off",
             "never": "off", "server": "server", "servers": "server"},
    shown=("server", "auto", "1", "0"),
)  # fmt: skip
TEST_COMPILE_FAULT = Setting(
    "LAZYMATH_TEST_COMPILE_FAULT", "choice", "",
    "tests only: make the isolated compiler process fail (`abort`, `abort-vectorized`, `hang`, "
    "`hang-vectorized`) to exercise the fallbacks",
    choices={"": "", "abort": "abort", "abort-vectorized": "abort-vectorized", "hang": "hang",
             "hang-vectorized": "hang-vectorized"},
    shown=("abort", "abort-vectorized", "hang", "hang-vectorized"),
)  # fmt: skip
KERNEL_CACHE_LIMIT = Setting(
    "LAZYMATH_KERNEL_CACHE_LIMIT", "int", 4096,
    "kernels kept in the in-memory kernel cache; the least recently used beyond it are dropped "
    "and their native code freed once no cached program uses them",
    minimum=1,
)  # fmt: skip
PROGRAM_CACHE_LIMIT = Setting(
    "LAZYMATH_PROGRAM_CACHE_LIMIT", "int", 1024,
    "compiled programs (realize plans) kept in memory; least recently used beyond it are dropped",
    minimum=1,
)  # fmt: skip
DISK_CACHE_LIMIT = Setting(
    "LAZYMATH_DISK_CACHE_LIMIT", "int", 1 << 30,
    "bytes of kernel files kept in the disk cache; the least recently used (written or loaded) "
    "files beyond it are deleted when a new one is stored",
    minimum=1,
)  # fmt: skip

SETTINGS: tuple[Setting, ...] = (
    BACKEND,
    SCHEDULER,
    CACHE_DIR,
    CACHE,
    DEBUG,
    DEBUG_DIR,
    VALIDATE,
    ELFLOAD,
    COMPILE_TIMEOUT,
    DASK_SCHEDULER,
    DASK_CACHE_BASE,
    VMATH_CALLS,
    HOST_MATH,
    TARGET_CPU,
    AUTOTUNE,
    TIERED,
    COMPILE_THREADS,
    NUM_THREADS,
    POOL_SPIN_US,
    QUIET_PEERS,
    COMPILE_ISOLATE,
    SCALAR_ARGS,
    KERNEL_CACHE_LIMIT,
    PROGRAM_CACHE_LIMIT,
    DISK_CACHE_LIMIT,
    TEST_COMPILE_FAULT,
)
_BY_NAME = {s.name: s for s in SETTINGS}


def setting(name: str) -> Setting:
    """The row of variable `name` (KeyError naming the known ones if there is none)."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"{name} is not a lazymath setting; known: {', '.join(_BY_NAME)}") from None


def get(name: str):
    """The parsed value of variable `name` (its default if unset or empty)."""
    return setting(name).get()


def source(name: str) -> str:
    """Where variable `name`'s value comes from: "default", "env" or "override"."""
    return setting(name).source()


def platform_cache_root() -> str | None:
    """XDG_CACHE_HOME, the platform's cache root (not a lazymath setting: the kernel cache's
    default directory sits under it, else under ~/.cache)."""
    return os.environ.get("XDG_CACHE_HOME") or None


def export(name: str, value: str) -> None:
    """Write setting `name` into this process's environment, for the settings read from here
    on and for the child processes it starts (a Dask worker's own kernel cache directory, the
    cache base its plugin hands to workers). Checked like any value of the setting."""
    s = setting(name)
    s.parse(str(value))  # a bad value fails here, where it is set, not in a child
    os.environ[s.name] = str(value)


def child_environment(**values: str) -> dict[str, str]:
    """The environment for a child process: this one's, with `values` set (LAZYMATH_* names)."""
    for name in values:
        setting(name)
    return {**os.environ, **values}


# Bumped by every override start/stop: hot-path caches keyed on settings (lm.jit's replay) read
# it with the raw environment values instead of parsing each setting per call.
GENERATION = [0]


def state_key(*items: Setting) -> Callable[[], tuple]:
    """A function returning a cheap key that changes whenever any of `items` may have changed
    value: the override generation and their raw environment objects (unparsed; CPython keeps
    the same object while a variable is not set again). For caches on a microsecond path that
    cannot afford `get()` per setting per call; equal keys mean equal values."""
    data = _ENV_DATA
    if data is None:
        names = tuple(s.name for s in items)
        env = os.environ
        return lambda: (GENERATION[0], *[env.get(n) for n in names])
    keys = tuple(s._key for s in items)
    get = data.get
    gen = GENERATION
    if len(keys) <= 4:  # unrolled (lm.jit's replay key): half the cost of map + unpacking;
        # the padding (None) is never an environment key, so its slots are always None
        k0, k1, k2, k3 = keys + (None,) * (4 - len(keys))
        return lambda: (gen[0], get(k0), get(k1), get(k2), get(k3))
    return lambda: (gen[0], *map(get, keys))


class override:
    """Set settings for a block, without touching the environment (wins over it):

        with lm.settings.override(LAZYMATH_DEBUG="kernels", LAZYMATH_VALIDATE=True):
            t.numpy()

    A value is parsed like the environment's text (a bool/int/float is accepted as is, checked
    against the kind); `None` removes an override for the block. Process-wide (all threads
    see it); blocks nest and restore what was there before on exit. Also usable as
    `o = override(...); o.start(); ...; o.stop()`."""

    def __init__(self, **values):
        self._new = {}
        for name, value in values.items():
            s = setting(name)
            self._new[s] = _UNSET if value is None else _coerce(s, value)
        self._old = None

    def start(self):
        if self._old is not None:
            raise RuntimeError("this override is already active")
        self._old = {s: s._override for s in self._new}
        for s, v in self._new.items():
            s._override = v
        GENERATION[0] += 1
        return self

    def stop(self):
        if self._old is None:
            return
        for s, v in self._old.items():
            s._override = v
        self._old = None
        GENERATION[0] += 1

    __enter__ = start

    def __exit__(self, *exc):
        self.stop()


def _coerce(s: Setting, value):
    """An override's value: text is parsed as the environment's would be; a Python value must
    be of the setting's kind."""
    if s.kind == "path" and isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(value, str):
        return s.parse(value) if value.strip() else s.default
    kind = s.kind
    ok = (
        (kind == "bool" and isinstance(value, bool))
        or (kind == "int" and isinstance(value, int) and not isinstance(value, bool))
        or (kind == "float" and isinstance(value, (int, float)) and not isinstance(value, bool))
        or (kind == "choice" and value in s.choices.values())
    )
    if not ok:
        raise s.error(str(value))
    if kind == "float":
        value = float(value)
    if kind in ("int", "float") and (
        value != value or (s.minimum is not None and value < s.minimum)
    ):
        raise s.error(str(value))
    return value


def check_all() -> dict:
    """Parse every variable now: {name: value}; the first bad one raises."""
    return {s.name: s.get() for s in SETTINGS}


def markdown_table() -> str:
    """The README's settings table, generated from `SETTINGS`."""
    rows = ["| variable | accepts | meaning |", "|---|---|---|"]
    for s in SETTINGS:
        rows.append(f"| `{s.name}` | {s.accepted()} | {s.doc} |")
    return "\n".join(rows)


def markdown_reference() -> str:
    """docs/settings.md, generated from `SETTINGS` (`python -m lazymath.settings --docs`)."""
    out = [
        "# Settings reference",
        "",
        "<!-- generated by `python -m lazymath.settings --docs > docs/settings.md` from",
        "     lazymath/settings.py; tests/test_settings.py checks it; do not edit by hand -->",
        "",
        "Every `LAZYMATH_*` environment variable lazymath reads, parsed in one place",
        "(`lazymath/settings.py`). The environment is read on every use, so a change takes",
        "effect at once. An unset or empty variable means the default; a bad value is an error",
        "naming the variable and what it accepts. Booleans accept `1/0`, `true/false`,",
        "`on/off`, `yes/no` (any case).",
        "",
        "In code, `lazymath.settings.override(LAZYMATH_X=value)` sets values for a `with` block",
        "without touching the environment, and `lm.show_config()` prints every value in force",
        "with where it comes from (default, env or override).",
        "",
    ]
    for st in SETTINGS:
        default = "unset" if st.default in (None, "") else f"`{st.default!r}`"
        out += [f"## `{st.name}`", "", st.doc[0].upper() + st.doc[1:] + ".", "",
                f"- accepts: {st.accepted()}", f"- default: {default}", ""]  # fmt: skip
    return "\n".join(out).rstrip("\n")


if _ENV_DATA is not None:  # the CPython layout `get` assumes; if this interpreter differs, don't
    try:
        _probe = os.environ.encodekey("PATH")
        _v = _ENV_DATA.get(_probe)
        if (None if _v is None else os.environ.decodevalue(_v)) != os.environ.get("PATH"):
            raise ValueError
    except Exception:
        _ENV_DATA = None
        for _s in SETTINGS:
            _s._key = _s.name


if __name__ == "__main__":
    if sys.argv[1:] == ["--markdown"]:
        print(markdown_table())
    elif sys.argv[1:] == ["--docs"]:
        print(markdown_reference())
    else:
        for _s in SETTINGS:
            print(f"{_s.name}={_s.get()!r}")
