"""DOT text: what the pictures contain, without Graphviz installed (DOT needs no tools)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import lazymath as lm
from lazymath.graph.node import toposort
from lazymath.viz import GraphvizNotFoundError, build, collapse, to_dot
from lazymath.viz.dot import quote
from lazymath.viz.style import UNIT_COLORS

SPEC = "ascend910"


def _attrs_of(src: str, ident: str) -> str:
    """The attribute list of the DOT statement declaring node `ident`."""
    m = re.search(rf'^\s*"{re.escape(ident)}" \[(.*)\];$', src, re.M)
    assert m, f"node {ident} not in DOT"
    return m.group(1)


def test_kernels_stage_custom_op_is_one_cube_cluster(custom_op_graph):
    out, line = custom_op_graph
    src = lm.visualize(out, spec=SPEC)  # filename=None: DOT source
    assert src.startswith("digraph lazymath {") and src.rstrip().endswith("}")
    assert src.count("subgraph cluster_") == 1
    assert f'fillcolor="{UNIT_COLORS["cube"]}"' in src
    assert 'label="k0_matmul_relu_mul | ' in src and "| stream 0" in src
    # the kernel's title is a plaintext node above its sources (edges route around nodes but
    # cross cluster labels), tied by invisible edges; the cluster itself has no label
    assert 'shape="plaintext", label="k0_matmul_relu_mul | ' in _attrs_of(src, "title_k0")
    assert re.search(r'"title_k0" -> "k0n\d+" \[style=invis', src)
    assert 'graph [label=""' in src
    for op in ("matmul", "relu", "mul"):
        assert f'label="{op}\\n(64, 32) float16"' in src
        ident = re.search(rf'"(k0n\d+)" \[[^\]]*label="{op}\\n', src).group(1)
        assert f'tooltip="{line}"' in _attrs_of(src, ident)
    # inputs (cylinders, outside the cluster), the folded constant, the output
    assert src.count('label="input\\n') == 2 and 'shape="cylinder"' in src
    assert 'label="const 0.5"' in src and 'shape="ellipse", style="dashed,filled"' in src
    assert 'label="output 0\\n(64, 32) float16"' in src and 'penwidth="2.5"' in src
    # GM traffic: heavier edges with their byte size; edges inside the kernel stay thin
    assert 'penwidth="3.5", label="(64, 48) float16\\n6.0 KiB"' in src
    assert 'penwidth="3.5", label="(48, 32) float16\\n3.0 KiB"' in src
    assert 'penwidth="3.5", label="(64, 32) float16\\n4.0 KiB"' in src
    assert 'penwidth="1", label="(64, 32) float16"' in src


def test_graph_stage_shows_every_node_as_written(custom_op_graph):
    out, line = custom_op_graph
    src = out.visualize(stage="graph")  # the Tensor method, filename=None
    n_nodes = len(toposort([out._node]))  # buffers, matmul, relu, const, expand, mul
    assert n_nodes == 7
    declared = re.findall(r'^\s*"(n\d+)" \[', src, re.M)
    assert len(declared) == n_nodes
    assert "subgraph cluster_" not in src  # no kernels before fusion
    assert src.count(" -> ") == 7  # every src edge plus the edge to the output
    assert 'label="expand\\n(64, 32) float16"' in src and 'label="const 0.5"' in src
    assert f'tooltip="{line}"' in src


def test_refusal_is_a_dashed_edge_with_the_reason(custom_op_graph):
    out, _ = custom_op_graph
    sched = lm.schedule(out, spec="ascend910b")  # split cores: mul leaves the Cube kernel
    assert [k.unit for k in sched.kernels] == ["cube", "vector"]
    reason = next(e.reason for e in sched.fusion_log if e.what == "refuse")
    src = lm.visualize(out, spec="ascend910b")
    dashed = [ln for ln in src.splitlines() if "->" in ln and 'style="dashed"' in ln]
    assert len(dashed) == 1
    assert quote(f"refuse: {reason}")[1:-1] in dashed[0]
    assert 'penwidth="3.5"' in dashed[0] and "4.0 KiB" in dashed[0]  # still a GM buffer
    assert f'fillcolor="{UNIT_COLORS["vector"]}"' in src
    assert f'fillcolor="{UNIT_COLORS["cube"]}"' in src


def test_file_suffixes_and_missing_graphviz(custom_op_graph, hide_dot, tmp_path):
    out, _ = custom_op_graph
    dot_path = tmp_path / "g.dot"
    assert lm.visualize(out, filename=dot_path) == str(dot_path)
    assert dot_path.read_text().startswith("digraph lazymath {")
    gv = out.visualize(str(tmp_path / "g.gv"), stage="graph")
    assert open(gv).read().count(" -> ") == 7
    for suffix in (".svg", ".png", ".pdf"):
        target = tmp_path / f"g{suffix}"
        with pytest.raises(GraphvizNotFoundError, match=r"apt-get install graphviz") as ei:
            out.visualize(str(target))
        assert str(target) in str(ei.value) and ".dot" in str(ei.value)
        assert not target.exists()
    with pytest.raises(ValueError, match="suffix"):
        lm.visualize(out, filename=tmp_path / "g.jpeg")
    with pytest.raises(ValueError, match="stage"):
        lm.visualize(out, stage="fused")
    with pytest.raises(TypeError):
        lm.visualize(np.ones(3))


def test_missing_graphviz_via_which(custom_op_graph, monkeypatch, tmp_path):
    import shutil

    real = shutil.which
    monkeypatch.setattr(
        shutil, "which", lambda name, *a, **k: None if name == "dot" else real(name, *a, **k)
    )
    out, _ = custom_op_graph
    with pytest.raises(GraphvizNotFoundError, match="Graphviz"):
        lm.visualize(out, filename=tmp_path / "x.svg")
    assert lm.visualize(out, filename=tmp_path / "x.dot").endswith("x.dot")


def test_long_elementwise_chain_collapses_with_op_count():
    x = lm.random.randn(16, 16, seed=3).realize()
    y = x
    for i in range(20):
        y = lm.sin(y) if i % 2 else lm.exp(y)
    vg = build(y, stage="kernels", spec=SPEC)
    assert len(vg.nodes) == 20 + 2  # 20 ops, the input, the output
    small = collapse(vg)
    chain = [n for n in small.nodes.values() if n.role == "chain"]
    assert len(chain) == 1 and chain[0].lines[0] == "20 ops"
    assert [m.op for m in chain[0].members] == ["exp", "sin"] * 10
    assert chain[0].cluster == 0 and small.collapsed == 19
    src = to_dot(small)
    assert (
        'shape="box3d"' in src and 'label="20 ops\\nexp → sin → … → sin\\n(16, 16) float32"' in src
    )
    # collapse_chains=0 keeps every node; shorter chains stay expanded
    assert src.count("[shape=") < lm.visualize(y, collapse_chains=0, spec=SPEC).count("[shape=")
    z = lm.exp(lm.sin(x))
    assert "box3d" not in lm.visualize(z, spec=SPEC)


def test_side_inputs_and_branches_stop_a_chain():
    x = lm.random.randn(8, 8, seed=4).realize()
    w = lm.random.randn(8, 8, seed=5).realize()
    y = x
    for _ in range(6):
        y = lm.exp(y)
    y = y + w  # a side input joins the chain: it folds in, the edge from w stays
    for _ in range(6):
        y = lm.sin(y)
    vg = collapse(build(y, spec=SPEC))
    chains = [n for n in vg.nodes.values() if n.role == "chain"]
    assert len(chains) == 1 and chains[0].lines[0] == "13 ops"
    ins = [n.id for n in vg.nodes.values() if n.role == "input"]
    assert len(ins) == 2
    assert {(e.src, e.dst) for e in vg.edges if e.dst == chains[0].id} == {
        (i, chains[0].id) for i in ins
    }


def test_realized_tensor_and_multiple_outputs(custom_op_graph):
    out, _ = custom_op_graph
    a = lm.exp(out)
    b = lm.sin(out)
    src = lm.visualize(a, b, spec=SPEC)
    assert 'label="output 0\\n' in src and 'label="output 1\\n' in src
    out.realize()
    done = lm.visualize(out, spec=SPEC)
    assert "output 0 (realized)" in done and "subgraph cluster_" not in done
    assert "output 0 (realized)" in lm.visualize(out, stage="graph")


def test_quote_escapes_dot_strings():
    assert quote('a"b\\c\nd') == '"a\\"b\\\\c\\nd"'
    assert quote("x\r\ny") == '"x\\ny"'


def test_aicpu_kernel_is_grey():
    i = lm.tensor(np.arange(10, dtype=np.int64))
    src = lm.visualize(lm.exp(i * 2) + 1, spec=SPEC)
    assert f'fillcolor="{UNIT_COLORS["aicpu"]}"' in src
    assert f'fillcolor="{UNIT_COLORS["vector"]}"' in src
    # the AI CPU boundary is a logged materialization: drawn dashed with its reason
    assert 'style="dashed"' in src and "AI CPU kernels run separately" in src
