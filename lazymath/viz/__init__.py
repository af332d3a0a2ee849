"""Pictures of what lazymath did with a graph: which ops fused, where each kernel runs, what
went through memory and why something did not fuse.

    t.visualize("g.svg")                          # kernels after fusion (default stage)
    lm.visualize(a, b, filename="g.dot", stage="graph")   # the graph as written
    src = lm.visualize(t)                         # filename=None: the DOT source
    lm.report(t, filename="report.html")          # one self-contained HTML page

DOT text is written by `dot.py` itself (always works); .svg/.png/.pdf run Graphviz's `dot`
program (`render.py`); .html is the report (`html.py`). `model.py` turns graphs and schedules
into a drawable `VGraph`, `collapse.py` keeps large ones readable, `charts.py` draws the memory
plan and the timelines as inline SVG.
"""

from __future__ import annotations

import os

from lazymath.graph.walk import nodes_of
from lazymath.realize import schedule_of, sharded_hook
from lazymath.viz.collapse import CHAIN_MIN, MAX_NODES, collapse
from lazymath.viz.dot import to_dot
from lazymath.viz.html import write_report
from lazymath.viz.model import VGraph, from_graph, from_schedule, tensor_nodes
from lazymath.viz.render import (
    FORMATS,
    GraphvizNotFoundError,
    check_folder,
    dot_binary,
    install_hint,
    write,
)

STAGES = ("graph", "kernels")
TEXT_SUFFIXES = (".dot", ".gv")
HTML_SUFFIXES = (".html", ".htm")

__all__ = ["GraphvizNotFoundError", "build", "report", "visualize"]


def build(*tensors, stage: str = "kernels", spec=None, schedule=None) -> VGraph:
    """The uncollapsed picture of `tensors` at `stage` ("graph" or "kernels").

    `schedule` reuses an `lm.schedule(...)` result of the same tensors (the report does)."""
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; use one of {', '.join(STAGES)}")
    roots = tensor_nodes(tensors)
    if stage == "graph":
        return from_graph(roots)
    if schedule is None:
        schedule = schedule_of(nodes_of(tensors), spec)
    return from_schedule(schedule, roots)


def visualize(*tensors, filename: str | os.PathLike | None = None, stage: str = "kernels",
              collapse_chains: int = CHAIN_MIN, max_nodes: int = MAX_NODES,
              spec=None) -> str:  # fmt: skip
    """Draw `tensors` at `stage`; the format follows the filename's suffix.

    - `filename=None`: return the DOT source (no system tools needed);
    - `.dot`/`.gv`: write the DOT source;
    - `.svg`/`.png`/`.pdf`: render with Graphviz's `dot` (GraphvizNotFoundError says how to
      install it when missing);
    - `.html`: the full report (`report`), which shows both stages.
    Returns the DOT source or the written path. Elementwise chains of at least `collapse_chains`
    ops fold into one node (0 disables); pictures above `max_nodes` nodes fold further.
    `spec` compiles for another device preset (e.g. "ascend910b") without switching device.
    """
    if filename is None:
        return _dot_of(tensors, stage, collapse_chains, max_nodes, spec)
    path = os.fspath(filename)
    suffix = os.path.splitext(path)[1].lower()
    if suffix in HTML_SUFFIXES:
        return report(*tensors, filename=path, spec=spec)
    if suffix not in TEXT_SUFFIXES and suffix not in FORMATS:
        known = ", ".join(TEXT_SUFFIXES + tuple(FORMATS) + HTML_SUFFIXES)
        raise ValueError(f"cannot tell the format of {path!r} from its suffix; use one of {known}")
    check_folder(path, "lm.visualize")  # fail before compiling anything
    if suffix in FORMATS and dot_binary() is None:
        raise GraphvizNotFoundError(install_hint(path))
    src = _dot_of(tensors, stage, collapse_chains, max_nodes, spec)
    if suffix in TEXT_SUFFIXES:
        with open(path, "w", encoding="utf-8") as f:
            f.write(src)
        return path
    return write(src, path)


def _dot_of(tensors, stage, chain_min, max_nodes, spec) -> str:
    hook = sharded_hook()
    if hook is not None and stage == "kernels":  # sharded inputs: the distributed plan
        src = hook.dot(tensor_nodes(tensors))
        if src is not None:
            return src
    vg = collapse(build(*tensors, stage=stage, spec=spec), chain_min, max_nodes)
    return to_dot(vg, title=_title(vg), legend=True)


def _title(vg: VGraph) -> str:
    if vg.stage == "graph":
        head = "captured graph (as written)"
    else:
        n = len(vg.clusters)
        head = f"{n} kernel{'s' if n != 1 else ''} after fusion"
    if vg.collapsed:
        head += f"; {vg.collapsed} nodes folded into collapsed nodes"
    return head


def report(*tensors, filename: str | os.PathLike = "report.html", profile=None,
           realize: bool | None = None, spec=None, title: str | None = None) -> str:  # fmt: skip
    """Write one self-contained HTML page about `tensors`; returns its path. See `html.py`."""
    check_folder(os.fspath(filename), "lm.report")
    return write_report(tensors, os.fspath(filename), profile=profile, realize=realize,
                        spec=spec, title=title)  # fmt: skip
