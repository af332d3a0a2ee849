"""Write a `VGraph` as Graphviz DOT text (no Graphviz needed to produce it).

Every node, edge and cluster gets an explicit `id` (prefixed, so several pictures can live in one
HTML page) that Graphviz copies into the SVG, which is how the report's script finds them.
Pictures above `LARGE` nodes drop edge labels into tooltips and ask `dot` for its cheap
settings: edge labels become virtual nodes in dot's layout and dominate its run time.
"""

from __future__ import annotations

from lazymath.viz.model import VEdge, VGraph, VNode
from lazymath.viz.style import EDGE_ATTRS, ROLE_ATTRS, unit_border, unit_color

LARGE = 150  # nodes: above this, no edge labels and the fast layout settings
FONT = "Helvetica"

# graph attributes that make dot fast on big graphs (fewer network-simplex and mincross passes)
FAST_LAYOUT = {"nslimit": "2", "nslimit1": "2", "mclimit": "0.3", "remincross": "false",
               "searchsize": "10"}  # fmt: skip


def quote(s: object) -> str:
    """A DOT double-quoted string; newlines become DOT's centered line breaks."""
    text = str(s).replace("\\", "\\\\").replace('"', '\\"')
    return '"' + text.replace("\r", "").replace("\n", "\\n") + '"'


def _attrs(d: dict[str, object]) -> str:
    return "[" + ", ".join(f"{k}={quote(v)}" for k, v in d.items() if v is not None) + "]"


def node_attrs(n: VNode, prefix: str) -> dict[str, object]:
    a: dict[str, object] = dict(ROLE_ATTRS.get(n.role, ROLE_ATTRS["op"]))
    a["label"] = "\n".join(n.lines)
    tip = n.tooltip
    if n.notes:
        tip += "\n" + "\n".join(n.notes)
    a["tooltip"] = tip
    a["id"] = prefix + n.id
    if n.role in ("op", "kernel") and n.cluster is not None:
        a["color"] = "#333333"
    if n.notes and any(x.startswith(("refuse", "materialize", "split")) for x in n.notes):
        a["color"] = EDGE_ATTRS["refused"]["color"]
        a["penwidth"] = "2"
    return a


def edge_attrs(e: VEdge, prefix: str, i: int, labels: bool) -> dict[str, object]:
    a: dict[str, object] = dict(EDGE_ATTRS.get(e.kind, EDGE_ATTRS["internal"]))
    if e.kind == "refused" and e.nbytes:
        a["penwidth"] = EDGE_ATTRS["buffer"]["penwidth"]  # a materialized buffer stays heavy
    if labels:
        a["label"] = e.label
    a["tooltip"] = e.tooltip or e.label
    if e.kind in ("refused", "recompute"):
        a["labeltooltip"] = a["tooltip"]
        a["fontcolor"] = a["color"]
    if not e.constraint:
        a["constraint"] = "false"
    a["id"] = f"{prefix}e{i}"
    return a


def to_dot(vg: VGraph, prefix: str = "", title: str | None = None,
           labels: bool | None = None, legend: bool = False) -> str:  # fmt: skip
    """DOT source for `vg`. `prefix` goes in front of every id; `labels` forces edge labels on or
    off (default: on for pictures up to `LARGE` nodes); `legend` adds one legend node saying
    what the colours, shapes and edge styles in this picture mean (standalone pictures)."""
    large = len(vg.nodes) > LARGE
    if labels is None:
        labels = not large
    out: list[str] = []
    w = out.append
    w("digraph lazymath {")
    gattrs: dict[str, object] = {
        "rankdir": "TB", "fontname": FONT, "fontsize": "11", "newrank": "true",
        "nodesep": "0.25", "ranksep": "0.35", "id": prefix + "graph",
        "tooltip": title or f"lazymath {vg.stage} graph",
    }  # fmt: skip
    if title:
        gattrs["label"] = title
        gattrs["labelloc"] = "t"
    if large:
        gattrs.update(FAST_LAYOUT)
    w("  graph " + _attrs(gattrs) + ";")
    w("  node " + _attrs({"fontname": FONT, "fontsize": "10", "margin": "0.08,0.04",
                          "height": "0.35"}) + ";")  # fmt: skip
    w("  edge " + _attrs({"fontname": FONT, "fontsize": "8", "arrowsize": "0.6"}) + ";")
    by_cluster: dict[int | None, list[VNode]] = {}
    for n in vg.nodes.values():
        by_cluster.setdefault(n.cluster, []).append(n)
    for ci, c in vg.clusters.items():
        members = by_cluster.get(ci)
        if not members:
            continue
        w(f"  subgraph cluster_k{ci} {{")
        w("    graph " + _attrs({
            "label": "", "tooltip": c.tooltip, "style": "filled,rounded",
            "fillcolor": unit_color(c.unit), "color": unit_border(c.unit), "penwidth": "1.5",
            "fontname": FONT, "fontsize": "11", "id": f"{prefix}cluster_k{ci}",
        }) + ";")  # fmt: skip
        # The title is a node, not the cluster's label: dot routes edges around nodes but
        # draws them straight through a cluster label, so edges entering the kernel from
        # above crossed its name. Invisible edges keep the title above the kernel's sources.
        title = f"title_k{ci}"
        w(f"    {quote(title)} " + _attrs({
            "shape": "plaintext", "label": c.title, "tooltip": c.tooltip, "fontsize": "11",
            "margin": "0.02,0.02", "height": "0.2", "id": f"{prefix}{title}",
        }) + ";")  # fmt: skip
        inside = {n.id for n in members}
        fed = {e.dst for e in vg.edges if e.src in inside and e.dst in inside}
        for n in members:
            w(f"    {quote(n.id)} {_attrs(node_attrs(n, prefix))};")
            if n.id not in fed:
                w(f"    {quote(title)} -> {quote(n.id)} [style=invis, weight=10];")
        w("  }")
    for n in by_cluster.get(None, []):
        w(f"  {quote(n.id)} {_attrs(node_attrs(n, prefix))};")
    for i, e in enumerate(vg.edges):
        if e.src in vg.nodes and e.dst in vg.nodes:
            w(f"  {quote(e.src)} -> {quote(e.dst)} {_attrs(edge_attrs(e, prefix, i, labels))};")
    if legend:
        w(legend_node(vg, prefix))
    w("}")
    return "\n".join(out) + "\n"


_UNIT_WORDS = {"cube": "Cube kernel (matrix unit)", "vector": "Vector kernel (SIMD unit)",
               "mix": "mix kernel (Cube + Vector prologue)",
               "aicpu": "AI CPU kernel (host numpy)"}  # fmt: skip
_ROLE_WORDS = {"input": "input buffer (GM)", "output": "output buffer (GM)",
               "const": "constant (folded into the kernel)", "chain": "collapsed chain of ops",
               "region": "collapsed region", "group": "collapsed kernels"}  # fmt: skip
_EDGE_WORDS = {"buffer": ("━━━", "through GM between kernels (bytes)"),
               "refused": ("- - -", "fusion refused (hover for why)"),
               "recompute": ("· · ·", "recomputed in each consumer")}  # fmt: skip


def legend_node(vg: VGraph, prefix: str = "") -> str:
    """One plaintext node with an HTML table: the units, node roles and edge kinds this picture
    uses, and what "memory-bound" / "compute-bound" in the kernel titles mean."""
    from html import escape

    rows = []
    units = list(dict.fromkeys(c.unit for c in vg.clusters.values()))
    for u in units:
        rows.append(f'<tr><td bgcolor="{unit_color(u)}" width="18"> </td>'
                    f'<td align="left">{escape(_UNIT_WORDS.get(u, u))}</td></tr>')  # fmt: skip
    roles = dict.fromkeys(n.role for n in vg.nodes.values())
    for r in roles:
        if r in _ROLE_WORDS:
            fill = ROLE_ATTRS[r].get("fillcolor", "#ffffff")
            rows.append(f'<tr><td bgcolor="{fill}"> </td>'
                        f'<td align="left">{escape(_ROLE_WORDS[r])}</td></tr>')  # fmt: skip
    kinds = dict.fromkeys(e.kind for e in vg.edges)
    for k in kinds:
        if k in _EDGE_WORDS:
            mark, words = _EDGE_WORDS[k]
            rows.append(f'<tr><td><font color="{EDGE_ATTRS[k]["color"]}">{mark}</font></td>'
                        f'<td align="left">{escape(words)}</td></tr>')  # fmt: skip
    if vg.clusters:
        rows.append('<tr><td colspan="2" align="left">memory-bound: moves more bytes per FLOP '
                    "than the unit's ridge point<br align=\"left\"/>compute-bound: the unit's "
                    'arithmetic limits it</td></tr>')  # fmt: skip
    head = '<tr><td colspan="2"><b>legend</b></td></tr>'
    table = ('<table border="0" cellborder="1" cellspacing="0" cellpadding="3">'
             + head + "".join(rows) + "</table>")  # fmt: skip
    return f'  "{prefix}legend" [shape=plaintext, id="{prefix}legend", label=<{table}>];'
