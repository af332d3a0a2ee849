"""Imports follow the layers (DESIGN.md: data flows tensor -> graph -> fusion -> backend ->
runtime), found by parsing every module's imports (module level and inside functions; only
`if TYPE_CHECKING:` blocks are ignored: they never run) and its deferred module references
(`engine = deferred("lazymath.engine")`, lazymath/_lazy.py: an import that runs on first use is
still an edge).

The layers and what each may import, as data (a module may always import its own layer):

    base     settings, dtypes, _version, runtime/device.py (the device spec: plain data that fusion, the
             backend and the runtime all read), _threads (the one host thread pool that runs
             kernel blocks: the backend's direct kernel call, the runtime's streams and the
             engine's replay all use it)                              -> nothing
    graph    nodes, the op registry, the numpy reference             -> base
    ir       backend/npu/kernel_ir.py: the kernel IR that fusion produces and the backend consumes
                                                                      -> base, graph
    fusion   grouping, memory plan, streams, schedule                 -> base, graph, ir
    backend  ISA, templates, lowering, JIT, kernel cache, interpreter -> base, graph, ir
    runtime  pool, streams, events, profiler, timelines               -> base
    driver   realize.py, engine.py, debug.py: walk down the layers for a realize, and say
             what it did (LAZYMATH_DEBUG)                         -> all of the above
    tensor   the user-facing Tensor and the numpy-like functions (lazymath/functions/)
                                                                      -> base, graph, runtime
             (its device), driver (a realize on demand), viz (t.visualize)
    viz      pictures and reports of graphs, schedules and profiles   -> everything but tensor, api
    api      the public functions (schedule, explain, precompile, ...) -> everything but viz
    distributed  sharded tensors on Dask (an add-on over the whole stack; realize.py holds only
             the hook it installs)                                    -> everything but viz
    torch    the torch.compile backend (an add-on like distributed; api.py holds only the
             explain hook it installs)                                -> everything but viz

No module imports the package root (`import lazymath`, `from lazymath import __version__`):
the root imports everything, so that would be a cycle. There are no import cycles between
modules (a cycle "works" only because one side imports inside a function).
"""

from __future__ import annotations

import ast
import collections
import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PKG = ROOT / "lazymath"
_spec = importlib.util.spec_from_file_location("arch_metrics", ROOT / "tools" / "arch_metrics.py")
assert _spec is not None and _spec.loader is not None
_am = importlib.util.module_from_spec(_spec)  # reads deferred references the same way
_spec.loader.exec_module(_am)

_ADDON = {"base", "graph", "ir", "fusion", "backend", "runtime", "driver", "tensor", "api"}
ALLOWED = {
    "torch": _ADDON,
    "testing": {"base", "graph", "ir", "fusion", "backend", "runtime", "driver", "tensor", "api"},
    "base": set(),
    "graph": {"base"},
    "ir": {"base", "graph"},
    "fusion": {"base", "graph", "ir"},
    "backend": {"base", "graph", "ir"},
    "runtime": {"base"},
    "driver": {"base", "graph", "ir", "fusion", "backend", "runtime"},
    "tensor": {"base", "graph", "runtime", "driver", "viz"},
    "viz": {"base", "graph", "ir", "fusion", "backend", "runtime", "driver"},
    "api": {"base", "graph", "ir", "fusion", "backend", "runtime", "driver", "tensor"},
    "distributed": {
        "base",
        "graph",
        "ir",
        "fusion",
        "backend",
        "runtime",
        "driver",
        "tensor",
        "api",
    },
}
# Deliberate exceptions to ALLOWED, each with its reason: (importer, imported) -> why.
# None is left: fusion's last backend edges (grouping -> the row template, the schedule's
# printout -> vmlib/compile/host/autotune) became arguments the driver hands over (issue 36).
EXCEPTIONS: dict[tuple[str, str], str] = {}
# Known import cycles, each with its reason (a cycle "works" only while one side imports inside
# a function). None is left (issue 36 broke the backend's, templates.common <-> vmath and
# lazymath.distributed's); a new one needs an entry here and a reason, and is a debt.
KNOWN_CYCLES: dict[frozenset, str] = {}


def layer(mod: str) -> str | None:
    """The layer of module `mod` (dotted name), None for the package root."""
    if mod in (
        "lazymath.settings",
        "lazymath.dtypes",
        "lazymath._version",
        "lazymath._threads",
        "lazymath._tpctl",
        "lazymath._peers",
        "lazymath._dccache",
        "lazymath._lazy",  # deferred module references (importlib only)
        "lazymath._dlpack",  # bfloat16 DLPack capsules (numpy + ctypes only)
        "lazymath.units",
        "lazymath.runtime.device",
    ):
        return "base"
    if mod == "lazymath.backend.npu.kernel_ir":
        return "ir"
    if mod in ("lazymath.realize", "lazymath.engine", "lazymath.debug"):
        return "driver"
    if mod in (
        "lazymath.api",
        "lazymath.lowlevel",
        "lazymath.array_api",
        "lazymath.sorting",
        "lazymath.support",
        "lazymath.nn",
        "lazymath.staging",
        "lazymath.staging_batch",  # lm.jit's dynamic-batch analysis (staging runs it)
    ):
        return "api"
    if mod == "lazymath.tensor" or mod.startswith("lazymath.functions"):
        return "tensor"
    if mod.startswith("lazymath.testing"):
        return "testing"
    parts = mod.split(".")
    if len(parts) >= 2 and parts[1] in (
        "graph",
        "fusion",
        "backend",
        "runtime",
        "viz",
        "distributed",
        "torch",
    ):
        return parts[1]
    if mod == "lazymath":
        return None
    raise AssertionError(f"{mod}: no layer; add it to test_import_direction.layer()")


def modules() -> dict[str, pathlib.Path]:
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        parts = list(p.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


MODULES = modules()


def _type_checking_blocks(tree: ast.AST) -> set[int]:
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in (
            "TYPE_CHECKING",
            "typing.TYPE_CHECKING",
        ):
            for sub in node.body:
                skip.update(id(n) for n in ast.walk(sub))
    return skip  # fmt: skip


def imports_of(mod: str) -> list[tuple[str, int]]:
    """(imported module, line) for every lazymath import in `mod`."""
    path = MODULES[mod]
    tree = ast.parse(path.read_text())
    skip = _type_checking_blocks(tree)
    base = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
    out = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        deferred = _am.deferred_target(node)  # `engine = deferred("lazymath.engine")`
        if deferred is not None:
            out.append((deferred, node.lineno))
        elif isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names if a.name.split(".")[0] == "lazymath"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                target = ".".join(base[: len(base) - node.level + 1] + [node.module or ""])
                target = target.rstrip(".")
            else:
                target = node.module or ""
            if target.split(".")[0] != "lazymath":
                continue
            for a in node.names:  # `from pkg import submodule` imports the submodule
                sub = f"{target}.{a.name}"
                out.append((sub if sub in MODULES else target, node.lineno))
    return out


EDGES = {m: imports_of(m) for m in MODULES}


def test_every_module_has_a_layer():
    for m in MODULES:
        layer(m)


def test_nothing_imports_the_package_root():
    bad = [f"{m}:{ln}" for m, es in EDGES.items() for t, ln in es if t == "lazymath"]
    assert not bad, f"import the module you need, not the package root: {bad}"


def test_layers_import_downward_only():
    bad = []
    for m, es in EDGES.items():
        lm = layer(m)
        if lm is None:
            continue
        for t, ln in es:
            lt = layer(t)
            if lt is None or lt == lm or lt in ALLOWED[lm]:
                continue
            if (m, t) not in EXCEPTIONS:
                bad.append(f"{m}:{ln} ({lm}) imports {t} ({lt})")
    assert not bad, "imports against the layers:\n" + "\n".join(bad)


def test_no_import_cycles():
    graph = collections.defaultdict(set)
    for m, es in EDGES.items():
        for t, _ in es:
            if t != m and t in MODULES and m != "lazymath":
                graph[m].add(t)
    # Tarjan's strongly connected components: any component of more than one module is a cycle.
    index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 and not any(set(comp) <= known for known in KNOWN_CYCLES):
                comps.append(sorted(comp))

    for v in list(MODULES):
        if v not in index:
            visit(v)
    assert not comps, f"import cycles: {comps}"


def test_the_checker_sees_function_level_imports():
    """The walk must see imports inside functions (that is where the cycles hid): Tensor.visualize
    imports viz inside the method -- and deferred references: realize loads the engine on first use."""
    assert "lazymath.viz" in {t for t, _ in EDGES["lazymath.tensor"]}
    assert "lazymath.engine" in {t for t, _ in EDGES["lazymath.realize"]}


def _package(mod: str) -> str:
    path = MODULES[mod]
    return mod if path.name == "__init__.py" else mod.rpartition(".")[0]


def test_no_private_names_across_packages():
    """`from lazymath.x import _helper` from another package couples it to an internal: make
    the helper public where it lives, or move it."""
    bad = []
    for m, path in MODULES.items():
        tree = ast.parse(path.read_text())
        base = m.split(".") if path.name == "__init__.py" else m.split(".")[:-1]
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or not (node.level or node.module):
                continue
            if node.level:
                target = ".".join(base[: len(base) - node.level + 1] + [node.module or ""])
                target = target.rstrip(".")
            else:
                target = node.module
            if target not in MODULES or target.split(".")[0] != "lazymath":
                continue
            for a in node.names:
                private = a.name.startswith("_") and not a.name.startswith("__")
                if private and _package(target) != _package(m):
                    bad.append(f"{m}:{node.lineno} imports {target}.{a.name}")
    assert not bad, "\n".join(bad)


# The backend's three rooms and the driver on top (docs/architecture.md): a room imports only
# the rooms listed for it. npu is the device-only program (no LLVM), native is NPU-agnostic
# machinery (it polls npu.cancel, nothing else of npu), host maps the one onto the other.
ROOMS_ALLOWED = {
    "npu": set(),
    "native": {"npu"},
    "host": {"npu", "native"},
    "driver": {"npu", "native", "host"},
}
NATIVE_FROM_NPU = {"lazymath.backend.npu", "lazymath.backend.npu.cancel"}


def room(mod: str) -> str | None:
    """The backend room of `mod`, None outside lazymath.backend."""
    parts = mod.split(".")
    if parts[:2] != ["lazymath", "backend"]:
        return None
    if len(parts) >= 3 and parts[2] in ("npu", "native", "host"):
        return parts[2]
    return "driver"  # backend/__init__, compile, autotune


def test_backend_rooms_import_one_way():
    bad = []
    for m, es in EDGES.items():
        rm = room(m)
        if rm is None:
            continue
        for t, ln in es:
            rt = room(t)
            if rt is None or rt == rm:
                continue
            if t == "lazymath.backend":  # the package itself (lazy entry points): only its name
                continue
            if rt not in ROOMS_ALLOWED[rm]:
                bad.append(f"{m}:{ln} ({rm}) imports {t} ({rt})")
            elif rm == "native" and rt == "npu" and t not in NATIVE_FROM_NPU:
                bad.append(f"{m}:{ln} (native) imports {t}: native may use only npu.cancel")
    assert not bad, "imports against the backend's rooms:\n" + "\n".join(bad)


def test_backend_has_only_its_rooms_and_the_driver():
    """Every backend module sits in a room; the top holds only the compile driver."""
    top = {m for m in MODULES if m.startswith("lazymath.backend") and room(m) == "driver"}
    assert top == {"lazymath.backend", "lazymath.backend.compile", "lazymath.backend.autotune"}


def _module_level_names(path: pathlib.Path) -> set[str]:
    """The names a module binds at its top level (defs, classes, assignments, imports)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
    return names


def test_functions_are_not_imported_through_tensor():
    """lazymath.tensor forwards the numpy-like functions that lived there before the split
    (issue 36: its module __getattr__) for old user code; inside lazymath they come from
    lazymath.functions, where they live, so a reader (and the layer checks) sees the real
    dependency."""
    own = _module_level_names(modules()["lazymath.tensor"])
    bad = []
    for mod, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "lazymath.tensor":
                bad += [f"{mod}: {a.name}" for a in node.names if a.name not in own | {"*"}]
    assert not bad, f"import these from lazymath.functions, not lazymath.tensor: {bad}"
