"""The graph is plain data: exported to networkx it can be walked by any tool."""

from __future__ import annotations

import numpy as np
import pytest

import lazymath as lm
from lazymath.graph import to_networkx, toposort


def test_to_networkx_matches_the_captured_graph():
    nx = pytest.importorskip("networkx")
    x = lm.tensor(np.ones((3, 4), np.float32))
    y = lm.relu(x @ x.T) * 2.0
    g = to_networkx(y)
    nodes = toposort([y.node])
    assert g.number_of_nodes() == len(nodes)
    assert nx.is_directed_acyclic_graph(g)
    ops = {d["op"] for _, d in g.nodes(data=True)}
    assert {"buffer", "matmul", "relu", "mul", "permute"} <= ops
    sink = [n for n in g.nodes if g.out_degree(n) == 0]
    assert sink == [id(y.node)]
    assert g.nodes[id(y.node)]["shape"] == (3, 3)
    assert g.nodes[id(y.node)]["loc"].endswith(f"{__file__}:{y.node.loc.rsplit(':', 1)[1]}")


def test_realize_does_not_import_networkx():
    import subprocess
    import sys

    code = (
        "import sys, numpy as np, lazymath as lm\n"
        "x = lm.tensor(np.arange(6, dtype=np.float32))\n"
        "(lm.exp(x).sum() + 1).realize()\n"
        "print('networkx' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
