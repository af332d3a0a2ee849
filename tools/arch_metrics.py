"""Architecture measurements for issue 36, by parsing lazymath's source (no import, so it is
cheap and runs on any host): nested (inside-function) lazymath imports, deferred module references
(lazymath/_lazy.py: declared at the top, loaded on first use, counted as module-level edges),
modules over the line budget, and modules that read the environment.

Why a script and not only a test: the budgets in tests/test_architecture_budgets.py are ceilings
that only ever go down; this prints the numbers a refactor step is measured by, so each landing
can quote before/after (`python tools/arch_metrics.py`).
"""

from __future__ import annotations

import ast
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
PKG = ROOT / "lazymath"
LINE_BUDGET = 1000


def module_name(path: pathlib.Path) -> str:
    """Dotted module name of a file under the repository root."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _type_checking_ids(tree: ast.AST) -> set[int]:
    """Nodes inside `if TYPE_CHECKING:` blocks: they never run, so they are not imports."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in (
            "TYPE_CHECKING",
            "typing.TYPE_CHECKING",
        ):
            for sub in node.body:
                skip.update(id(n) for n in ast.walk(sub))
    return skip


def _is_lazymath(node: ast.Import | ast.ImportFrom) -> bool:
    if isinstance(node, ast.ImportFrom):
        return bool(node.level) or (node.module or "").split(".")[0] == "lazymath"
    return any(a.name.split(".")[0] == "lazymath" for a in node.names)


def _import_nodes(tree: ast.AST) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement that can run, with whether it sits inside a function body (def
    or lambda). Imports at class level or under module-level `if`/`try` run at import time, so
    they are not nested; `if TYPE_CHECKING:` blocks never run and are skipped."""
    skip = _type_checking_ids(tree)
    out: list[tuple[ast.Import | ast.ImportFrom, bool]] = []
    todo: list[tuple[ast.AST, bool]] = [(tree, False)]
    while todo:
        node, in_func = todo.pop()
        for child in ast.iter_child_nodes(node):
            if id(child) in skip:
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                out.append((child, in_func))
                continue
            f = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            todo.append((child, in_func or f))
    return out


def deferred_target(node: ast.AST) -> str | None:
    """The module of a deferred reference, `deferred("lazymath.x")` (lazymath/_lazy.py), else
    None. Only a string literal counts: that is what makes the dependency readable here."""
    if not isinstance(node, ast.Call) or len(node.args) != 1 or node.keywords:
        return None
    f = node.func
    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
    arg = node.args[0]
    if name != "deferred" or not isinstance(arg, ast.Constant) or not isinstance(arg.value, str):
        return None
    return arg.value if arg.value.split(".")[0] == "lazymath" else None


def _deferred_nodes(tree: ast.AST) -> list[tuple[str, int, bool]]:
    """(module, line, inside a function) of every deferred reference in `tree`."""
    out: list[tuple[str, int, bool]] = []
    todo: list[tuple[ast.AST, bool]] = [(tree, False)]
    while todo:
        node, in_func = todo.pop()
        for child in ast.iter_child_nodes(node):
            target = deferred_target(child)
            if target is not None:
                out.append((target, child.lineno, in_func))
            f = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            todo.append((child, in_func or f))
    return out


def nested_imports(path: pathlib.Path) -> list[int]:
    """Line numbers (sorted) of lazymath imports inside a function body of `path`: code that
    runs on a call hides an import from a reader and from cycle checks. A deferred reference
    made inside a function counts too (it is declared at the top to be seen)."""
    tree = ast.parse(path.read_text())
    lines = [n.lineno for n, f in _import_nodes(tree) if f and _is_lazymath(n)]
    return sorted(lines + [line for _, line, f in _deferred_nodes(tree) if f])


def deferred_refs(path: pathlib.Path) -> list[tuple[str, int]]:
    """(module, line) of the module-level deferred references of `path`: dependencies declared
    at the top and loaded on first use (counted as module-level import edges)."""
    tree = ast.parse(path.read_text())
    return sorted((m, line) for m, line, f in _deferred_nodes(tree) if not f)


def _target(mod: str, is_pkg: bool, node: ast.Import | ast.ImportFrom) -> list[str]:
    """Dotted lazymath modules an import statement in `mod` loads (submodules for
    `from pkg import sub`)."""
    known = {module_name(p) for p in files()}
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == "lazymath"]
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    if node.level:
        t = ".".join(base[: len(base) - node.level + 1] + [node.module or ""]).rstrip(".")
    else:
        t = node.module or ""
    if t.split(".")[0] != "lazymath":
        return []
    return [f"{t}.{a.name}" if f"{t}.{a.name}" in known else t for a in node.names]


def import_edges(nested: bool) -> dict[str, set[str]]:
    """Module -> lazymath modules it imports at module level (nested=False) or inside functions
    (nested=True); a module also depends on its parent packages (importing a.b.c runs a.b)."""
    out: dict[str, set[str]] = {}
    for p in files():
        m = module_name(p)
        tree = ast.parse(p.read_text())
        edges: set[str] = set()
        for node, in_func in _import_nodes(tree):
            if in_func == nested:
                edges.update(_target(m, p.name == "__init__.py", node))
        edges.update(t for t, _, in_func in _deferred_nodes(tree) if in_func == nested)
        out[m] = {t for t in edges if t != m}
    return out


def _sccs(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components with more than one module (the import cycles)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _combined() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    top = import_edges(nested=False)
    nested = import_edges(nested=True)
    both = {m: (top[m] | nested.get(m, set())) - {"lazymath"} for m in top}
    return both, nested


def cycles() -> list[set[str]]:
    """Import cycles of lazymath, counting imports inside functions as edges."""
    return sorted(_sccs(_combined()[0]), key=lambda c: (-len(c), sorted(c)))


def hoistable() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Split the nested imports (importer, imported) into those that can ALL move to module
    level together without making a cycle (their edge lies in no cycle of the module-level +
    nested import graph; the target's import-time cost still has to be checked), and those
    inside such a cycle (at least one edge per cycle needs a lazy object or a module move).
    Parent packages are not counted as dependencies: `pkg/__init__` importing its submodule is
    not a cycle Python trips on."""
    both, nested = _combined()
    comp_of = {m: i for i, c in enumerate(_sccs(both)) for m in c}
    ok, cyc = [], []
    for m, ts in sorted(nested.items()):
        for t in sorted(ts):
            if t == "lazymath" or t not in both:
                continue
            same = m in comp_of and comp_of.get(t) == comp_of[m]
            (cyc if same else ok).append((m, t))
    return ok, cyc


def env_readers(path: pathlib.Path) -> list[int]:
    """Lines reading the process environment (os.environ / os.getenv / os.putenv)."""
    tree = ast.parse(path.read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv"):
            if isinstance(node.value, ast.Name) and node.value.id == "os":
                out.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            if any(a.name in ("environ", "getenv") for a in node.names):
                out.append(node.lineno)
    return out


def line_count(path: pathlib.Path) -> int:
    """Physical lines, as `wc -l` counts them."""
    return path.read_text().count("\n")


def files() -> list[pathlib.Path]:
    return sorted(PKG.rglob("*.py"))


def main() -> int:
    nested = {module_name(p): nested_imports(p) for p in files()}
    total = sum(len(v) for v in nested.values())
    print(f"nested lazymath imports: {total} (goal <= 20)")
    for m, v in sorted(nested.items(), key=lambda kv: -len(kv[1]))[:15]:
        if v:
            print(f"  {len(v):4d}  {m}")
    refs = {module_name(p): deferred_refs(p) for p in files()}
    print(
        f"deferred module references (declared at the top, loaded on first use): "
        f"{sum(len(v) for v in refs.values())}"
    )
    print(f"modules over {LINE_BUDGET} lines:")
    for p in sorted(files(), key=line_count, reverse=True):
        n = line_count(p)
        if n > LINE_BUDGET:
            print(f"  {n:5d}  {module_name(p)}")
    readers = {module_name(p): env_readers(p) for p in files()}
    print("modules reading the environment:", sorted(m for m, v in readers.items() if v))
    if "--hoistable" in sys.argv:
        ok, cyc = hoistable()
        print(f"nested import edges (distinct importer->module): {len(ok) + len(cyc)}")
        print(f"  outside every cycle (can all move to module level): {len(ok)}")
        print(f"  inside a cycle (need a lazy object or a module move): {len(cyc)}")
        for comp in cycles():
            print(f"    cycle of {len(comp)}: {sorted(comp)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
