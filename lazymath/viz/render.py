"""Run Graphviz's `dot` program on DOT text (no Python graphviz package involved).

`dot` is looked up on PATH at every call, so installing Graphviz in a running session works;
when it is missing the error says how to install it and that `.dot` output needs nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess

# file suffix -> dot output format
FORMATS: dict[str, str] = {".svg": "svg", ".png": "png", ".pdf": "pdf"}
TIMEOUT_S = 120.0


class GraphvizNotFoundError(RuntimeError):
    """Graphviz's `dot` program is needed for .svg/.png/.pdf output and is not installed."""


def dot_binary() -> str | None:
    """Path of the `dot` program, or None."""
    return shutil.which("dot")


def install_hint(target: str = "") -> str:
    what = f"Rendering {target!r}" if target else "Rendering a picture"
    return (
        f"{what} needs Graphviz's `dot` program, which was not found on PATH. Install Graphviz "
        "(Debian/Ubuntu: `apt-get install graphviz`; Fedora: `dnf install graphviz`; macOS: "
        "`brew install graphviz`; conda: `conda install -c conda-forge graphviz`), or write the "
        "DOT text instead (a filename ending in .dot, or filename=None to get it as a string), "
        "which needs no system tools."
    )


def render(dot_src: str, fmt: str, target: str = "", dpi: int | None = None) -> bytes:
    """`dot -T<fmt>` on `dot_src`; returns the rendered bytes."""
    exe = dot_binary()
    if exe is None:
        raise GraphvizNotFoundError(install_hint(target))
    cmd = [exe, f"-T{fmt}"]
    if dpi is not None and fmt == "png":
        cmd.append(f"-Gdpi={dpi}")
    try:
        proc = subprocess.run(cmd, input=dot_src.encode("utf-8"), capture_output=True,
                              timeout=TIMEOUT_S, check=False)  # fmt: skip
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"Graphviz `dot -T{fmt}` did not finish within {TIMEOUT_S:.0f} s; "
                           "render a .dot file or collapse more (collapse=...)") from e  # fmt: skip
    if proc.returncode != 0 or not proc.stdout:
        err = proc.stderr.decode("utf-8", "replace").strip()
        raise RuntimeError(f"Graphviz `dot -T{fmt}` failed (exit {proc.returncode}): {err}")
    return proc.stdout


def write(dot_src: str, path: str) -> str:
    """Render to `path`, the format chosen by its suffix (written atomically)."""
    suffix = os.path.splitext(path)[1].lower()
    fmt = FORMATS[suffix]
    data = render(dot_src, fmt, target=path, dpi=110 if fmt == "png" else None)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    return path


def svg_inline(svg: bytes | str) -> str:
    """The `<svg ...>...</svg>` element of dot's SVG output (no XML prolog or DOCTYPE), ready
    to sit inside an HTML page."""
    text = svg.decode("utf-8") if isinstance(svg, bytes) else svg
    start = text.find("<svg")
    return text[start:].strip() if start >= 0 else text
