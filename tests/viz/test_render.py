"""Pictures rendered by the real Graphviz `dot` (skipped when it is not installed)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest

import lazymath as lm
from lazymath.graph.node import toposort
from lazymath.viz.style import EDGE_ATTRS, UNIT_COLORS

SVG = "{http://www.w3.org/2000/svg}"
XLINK = "{http://www.w3.org/1999/xlink}"
SPEC = "ascend910"

pytestmark = pytest.mark.usefixtures("needs_dot")


def _groups(root, cls: str) -> list:
    return [g for g in root.iter(f"{SVG}g") if g.get("class") == cls]


def _texts(g) -> list[str]:
    return [t.text for t in g.iter(f"{SVG}text") if t.text]


def _fills(g) -> set[str]:
    return {e.get("fill") for e in g.iter() if e.get("fill")}


def _tooltips(g) -> list[str]:
    return [a.get(f"{XLINK}title") for a in g.iter(f"{SVG}a") if a.get(f"{XLINK}title")]


def test_custom_op_svg_has_the_cube_cluster(custom_op_graph, tmp_path):
    out, line = custom_op_graph
    path = tmp_path / "custom_op.svg"
    assert lm.visualize(out, filename=path, spec=SPEC) == str(path)
    root = ET.parse(path).getroot()
    assert root.tag == f"{SVG}svg"
    (cluster,) = _groups(root, "cluster")
    assert cluster.find(f"{SVG}title").text == "cluster_k0"
    assert UNIT_COLORS["cube"] in _fills(cluster)
    assert not _texts(cluster)  # the title is a node, so edges do not cross it
    nodes = {g.get("id"): g for g in _groups(root, "node")}
    (title,) = _texts(nodes["title_k0"])
    assert title.startswith("k0_matmul_relu_mul | ") and title.endswith(" | stream 0")
    assert title.split(" | ")[1] in ("compute-bound", "memory-bound")
    nodes = {g.get("id"): g for g in _groups(root, "node")}
    ops = {}
    for g in nodes.values():
        t = _texts(g)
        ops[t[0]] = (t, _tooltips(g))
    for op in ("matmul", "relu", "mul"):
        texts, tips = ops[op]
        assert texts == [op, "(64, 32) float16"]
        assert tips == [line]  # the user's file:line as tooltip
    assert ops["input"][0][1] in ("(64, 48) float16", "(48, 32) float16")
    assert ops["output 0"][0] == ["output 0", "(64, 32) float16"]
    assert ops["const 0.5"][0] == ["const 0.5"]
    # the op nodes sit inside the cluster's box: their ids are k0n*
    assert {i for i, g in nodes.items() if _texts(g)[0] in ("matmul", "relu", "mul")} <= {
        i for i in nodes if i.startswith("k0n")
    }
    edges = _groups(root, "edge")
    labels = [" ".join(_texts(e)) for e in edges]
    assert "(64, 48) float16 6.0 KiB" in labels and "(64, 32) float16 4.0 KiB" in labels
    heavy = [e for e in edges if any(p.get("stroke-width") == "3.5" for p in e.iter(f"{SVG}path"))]
    assert len(heavy) == 3  # two inputs read from GM, one output written


def test_refusal_edge_is_dashed_with_reason_tooltip(custom_op_graph, tmp_path):
    out, _ = custom_op_graph
    sched = lm.schedule(out, spec="ascend910b")
    reason = next(e.reason for e in sched.fusion_log if e.what == "refuse")
    path = lm.visualize(out, filename=tmp_path / "b.svg", spec="ascend910b")
    root = ET.parse(path).getroot()
    fills = [_fills(c) for c in _groups(root, "cluster")]
    assert any(UNIT_COLORS["cube"] in f for f in fills)
    assert any(UNIT_COLORS["vector"] in f for f in fills)
    dashed = [e for e in _groups(root, "edge")
              if any(p.get("stroke-dasharray") for p in e.iter(f"{SVG}path"))]  # fmt: skip
    assert len(dashed) == 1
    path_el = next(dashed[0].iter(f"{SVG}path"))
    assert path_el.get("stroke") == EDGE_ATTRS["refused"]["color"]
    assert any(t.startswith(f"refuse: {reason}") for t in _tooltips(dashed[0]))


def test_png_and_pdf(custom_op_graph, tmp_path):
    out, _ = custom_op_graph
    png = lm.visualize(out, filename=tmp_path / "g.png", spec=SPEC)
    pdf = out.visualize(str(tmp_path / "g.pdf"), stage="graph")
    data = open(png, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width = int.from_bytes(data[16:20], "big")
    height = int.from_bytes(data[20:24], "big")
    assert width > 200 and height > 300
    assert open(pdf, "rb").read(5) == b"%PDF-"


def test_every_generated_dot_parses(custom_op_graph, tmp_path):
    """Odd values (quotes, backslashes, unicode) must not break the DOT syntax."""
    out, _ = custom_op_graph
    x = lm.tensor([[1.0, -2.5], [3.0, 4.0]])
    y = lm.where(x > 0, lm.log(x), lm.leaky_relu(x, 0.1) if hasattr(lm, "leaky_relu") else -x)
    z = lm.sum(y.T, axis=0) + lm.max(x)
    for t in (out, z):
        for stage in ("graph", "kernels"):
            p = lm.visualize(t, filename=tmp_path / f"{stage}{id(t)}.svg", stage=stage)
            ET.parse(p)


def _chain(n: int):
    x = lm.random.randn(32, 32, seed=11).realize()
    y = x
    for i in range(n):
        y = lm.sin(y) if i % 2 else lm.cos(y)
    return y


def test_5000_node_chain_renders_folded(tmp_path):
    """Speed of this render is measured by benchmarks/render.py, not here."""
    y = _chain(5000)
    assert len(toposort([y._node])) == 5001
    path = lm.visualize(y, filename=tmp_path / "chain.svg", stage="graph")
    root = ET.parse(path).getroot()
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert "5000 ops" in texts and "cos → sin → … → sin" in texts


def test_5000_node_fused_graph_renders_folded(tmp_path):
    """80 chains of 60 elementwise ops, each reduced, the results summed: ~5,000 graph nodes,
    81 kernels, folded into few nodes. Its speed (fusion, DOT generation and `dot -Tsvg`) is
    measured by benchmarks/render.py."""
    xs = [lm.random.randn(8, 8, seed=100 + i).realize() for i in range(80)]
    total = None
    for x in xs:
        z = x
        for j in range(60):
            z = lm.sin(z) if j % 2 else z * 1.0001
        s = lm.sum(z, axis=0)
        total = s if total is None else total + s
    n = len(toposort([total._node]))
    assert n > 5000
    path = lm.visualize(total, filename=tmp_path / "wide.svg", spec=SPEC)
    root = ET.parse(path).getroot()
    clusters = _groups(root, "cluster")
    assert len(clusters) == len(lm.schedule(total, spec=SPEC).kernels)
    nodes = [g for g in _groups(root, "node") if not g.get("id").startswith("title_k")]
    assert len(nodes) <= 400  # folded: chains, then whole kernels, into single nodes
    folded = [t for g in nodes for t in _texts(g) if re.fullmatch(r"\d+ ops|.*: \d+ ops.*", t)]
    assert len(folded) >= 80
