"""Run Graphviz's `dot` program on DOT text (no Python graphviz package involved).

`dot` is looked up on PATH at every call, so installing Graphviz in a running session works;
when it is missing the error says how to install it and that `.dot` output needs nothing.
"""

from __future__ import annotations

import os
import re
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


def check_folder(path: str, what: str = "lazymath") -> None:
    """FileNotFoundError naming `path` and its missing folder, before any work is done (the
    atomic write's temporary file name used to be what the error showed)."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"{what}: cannot write {path!r}: the folder {folder!r} does "
                                "not exist (create it first)")  # fmt: skip


def write(dot_src: str, path: str) -> str:
    """Render to `path`, the format chosen by its suffix (written atomically)."""
    check_folder(path, "lm.visualize")
    suffix = os.path.splitext(path)[1].lower()
    fmt = FORMATS[suffix]
    data = render(dot_src, fmt, target=path, dpi=110 if fmt == "png" else None)
    if fmt == "svg":
        data = raise_cluster_titles(data.decode("utf-8")).encode("utf-8")
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    return path


def svg_inline(svg: bytes | str) -> str:
    """The `<svg ...>...</svg>` element of dot's SVG output (no XML prolog or DOCTYPE), ready
    to sit inside an HTML page, cluster titles repainted on top."""
    text = svg.decode("utf-8") if isinstance(svg, bytes) else svg
    start = text.find("<svg")
    return raise_cluster_titles(text[start:].strip() if start >= 0 else text)


_CLUSTER = re.compile(r'<g id="([^"]*)" class="cluster">(.*?)</g>\n</g>', re.S)
_TEXT = re.compile(r"<text [^>]*>.*?</text>", re.S)
_FILL = re.compile(r'<(?:path|polygon) fill="([^"]+)"')


def raise_cluster_titles(svg: str) -> str:
    """Repaint each cluster's title on top of the picture, with a halo in the cluster's colour.

    Graphviz paints clusters first and edges last, so an edge entering a kernel crosses its
    title ("k0_matmul_relu_mul | compute | stream 0") and hides part of it. The copies are
    appended at the end of the graph group (painted last) and marked aria-hidden; the original
    titles stay where they are."""
    overlay = []
    for m in _CLUSTER.finditer(svg):
        fill = _FILL.search(m.group(2))
        halo = fill.group(1) if fill else "#ffffff"
        for t in _TEXT.findall(m.group(2)):
            t = t.replace("<text ", f'<text style="paint-order:stroke;stroke:{halo};'
                          'stroke-width:3px;stroke-linejoin:round" ', 1)  # fmt: skip
            overlay.append(t)
    if not overlay:
        return svg
    end = svg.rfind("</g>\n</svg>")
    if end < 0:
        return svg
    block = ('<g class="cluster-titles" aria-hidden="true" pointer-events="none">\n'
             + "\n".join(overlay) + "\n</g>\n")  # fmt: skip
    return svg[:end] + block + svg[end:]
