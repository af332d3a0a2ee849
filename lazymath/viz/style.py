"""The visual vocabulary, as tables: one place decides what a unit, a role or an edge looks like.

DOT, the HTML report and the Gantt charts all read these tables, so a cube kernel is the same
orange in the graph, the kernel table and the timeline.
"""

from __future__ import annotations

# fused kernels: cluster fill by the unit the kernel runs on
UNIT_COLORS: dict[str, str] = {
    "cube": "#f4a261",  # matrix unit: warm orange
    "vector": "#8ecae6",  # SIMD unit: light blue
    "mix": "#b5838d",  # Cube kernel with a Vector prologue: mauve
    "aicpu": "#cccccc",  # host-CPU fallback: grey
}
UNIT_BORDERS: dict[str, str] = {
    "cube": "#b5651d",
    "vector": "#219ebc",
    "mix": "#6d597a",
    "aicpu": "#888888",
}
UNKNOWN_UNIT = "#dddddd"

# node roles -> DOT node attributes. Inputs and outputs are GM buffers (cylinders); constants
# are small dashed ellipses (they fold into kernels as literals); collapsed nodes are 3-D boxes.
ROLE_ATTRS: dict[str, dict[str, str]] = {
    "op": {"shape": "box", "style": "rounded,filled", "fillcolor": "#ffffff"},
    "chain": {"shape": "box3d", "style": "filled", "fillcolor": "#fefae0"},
    "region": {"shape": "box3d", "style": "filled", "fillcolor": "#fefae0"},
    "kernel": {"shape": "component", "style": "filled", "fillcolor": "#ffffff"},
    "group": {"shape": "box3d", "style": "filled", "fillcolor": "#f1faee"},
    "input": {"shape": "cylinder", "style": "filled", "fillcolor": "#b7e4c7", "color": "#2d6a4f"},
    "const": {
        "shape": "ellipse",
        "style": "dashed,filled",
        "fillcolor": "#fff3b0",
        "fontsize": "8",
        "height": "0.3",
    },  # fmt: skip
    "output": {
        "shape": "cylinder",
        "style": "filled,bold",
        "fillcolor": "#ffafcc",
        "color": "#9d0208",
        "penwidth": "2.5",  # not peripheries=2: dot clips edges at a double cylinder's label
    },  # fmt: skip
}

# edge kinds -> DOT edge attributes. "buffer" edges cross a kernel boundary through GM
# (materialized): heavier, labelled with their byte size. "refused" edges are fusion refusals.
EDGE_ATTRS: dict[str, dict[str, str]] = {
    "internal": {"color": "#555555", "penwidth": "1"},
    "buffer": {"color": "#1d3557", "penwidth": "3.5"},
    "refused": {"color": "#d62828", "penwidth": "2.5", "style": "dashed"},
    "recompute": {"color": "#6c757d", "penwidth": "1.5", "style": "dotted"},
}

# simulated pipes in the NPU timeline
PIPE_COLORS: dict[str, str] = {
    "MTE2": "#90be6d",
    "MTE1": "#43aa8b",
    "Cube": "#f4a261",
    "Vector": "#8ecae6",
    "MTE3": "#577590",
    "FixPipe": "#f9c74f",
    "Scalar": "#bbbbbb",
}
REALIZE_COLOR = "#adb5bd"
EVENT_COLOR = "#d62828"

# memory plan bars
BUFFER_COLORS: dict[str, str] = {
    "intermediate": "#2a9d8f",
    "output": "#e76f51",
}


def unit_color(unit: str | None) -> str:
    return UNIT_COLORS.get(unit or "", UNKNOWN_UNIT)


def unit_border(unit: str | None) -> str:
    return UNIT_BORDERS.get(unit or "", "#999999")
