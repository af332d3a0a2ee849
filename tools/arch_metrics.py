"""Architecture measurements for issue 36, by parsing lazymath's source (no import, so it is
cheap and runs on any host): nested (inside-function) lazymath imports, modules over the line
budget, and modules that read the environment.

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


def nested_imports(path: pathlib.Path) -> list[int]:
    """Line numbers of lazymath imports inside a function body (def or lambda) of `path`.

    Imports at class level or under module-level `if`/`try` run at import time, so they are not
    nested; only code that runs on a call hides an import from a reader and from cycle checks.
    """
    tree = ast.parse(path.read_text())
    skip = _type_checking_ids(tree)
    lines: list[int] = []

    def walk(node: ast.AST, in_func: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if id(child) in skip:
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                if in_func and _is_lazymath(child):
                    lines.append(child.lineno)
                continue
            f = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            walk(child, in_func or f)

    walk(tree, False)
    return lines


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
    print(f"modules over {LINE_BUDGET} lines:")
    for p in sorted(files(), key=line_count, reverse=True):
        n = line_count(p)
        if n > LINE_BUDGET:
            print(f"  {n:5d}  {module_name(p)}")
    readers = {module_name(p): env_readers(p) for p in files()}
    print("modules reading the environment:", sorted(m for m, v in readers.items() if v))
    return 0


if __name__ == "__main__":
    sys.exit(main())
