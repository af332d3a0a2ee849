"""The HTML report: self-contained, complete, and clean in a real (headless) browser."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import lazymath as lm

SPEC = "ascend910"


def _branches():
    """Two independent branches (Cube and Vector) joined by a third kernel, plus an
    elementwise chain long enough to collapse."""
    x = lm.random.randn(48, 32, seed=21, dtype="float16").realize()
    w = lm.random.randn(32, 40, seed=22, dtype="float16").realize()
    c = lm.random.randn(48, 40, seed=23, dtype="float16").realize()
    left = lm.relu(x @ w)
    right = c
    for i in range(8):
        right = lm.sin(right) if i % 2 else right * 1.5
    joined = lm.sum(left * right, axis=(0, 1))  # (a row sum would join the matmul kernel)
    return (left, right, joined), (x, w, c)


def _expected(inputs):
    x, w, c = (t.numpy().astype(np.float32) for t in inputs)
    left = np.maximum(x @ w, 0)
    right = c
    for i in range(8):
        right = np.sin(right) if i % 2 else right * 1.5
    return left, right, (left * right).sum(axis=(0, 1))


def _data(page: str) -> dict:
    m = re.search(r'<script type="application/json" id="lm-data">(.*?)</script>', page, re.S)
    return json.loads(m.group(1))


def _assert_offline(page: str) -> None:
    """No network: no external scripts, styles, images or fonts."""
    assert not re.search(r'(?:src|href)\s*=\s*["\']?(?:https?:)?//', page, re.I)
    assert not re.search(r"url\(\s*['\"]?(?:https?:)?//", page, re.I)
    assert "@import" not in page
    assert not re.search(r"<script[^>]*\bsrc=", page, re.I)
    assert not re.search(r"<link\b", page, re.I)


def test_report_without_graphviz_or_profile(custom_op_graph, hide_dot, tmp_path):
    out, line = custom_op_graph
    path = lm.report(out, filename=tmp_path / "r.html", spec=SPEC)
    page = open(path, encoding="utf-8").read()
    _assert_offline(page)
    assert 'id="no-graphviz-kernels"' in page and "apt-get install graphviz" in page
    assert "digraph lazymath {" in page  # the DOT text instead of the picture
    assert 'id="kernel-table"' in page and "k0_matmul_relu_mul" in page
    assert "matmul relu mul" in page and line in page
    assert 'id="fusion-log"' in page and 'id="memory-chart"' in page
    assert 'id="no-profile"' in page and 'id="timeline-npu"' not in page
    assert out._node.realized is None  # no profiler: the report runs nothing
    data = _data(page)
    assert set(data["graphs"]) >= {"kernels", "graph"}


def test_report_under_profile_realizes_and_draws_timelines(needs_dot, tmp_path):
    outs, inputs = _branches()
    sched = lm.schedule(*outs, spec=SPEC)
    assert sched.n_streams == 2 and sched.n_events >= 1
    with lm.profile() as p:
        path = lm.report(*outs, filename=tmp_path / "r.html")
    for got, want in zip(outs, _expected(inputs)):
        assert got._node.realized is not None
        np.testing.assert_allclose(got.numpy().astype(np.float32), want, rtol=2e-2, atol=5e-2)
    page = open(path, encoding="utf-8").read()
    _assert_offline(page)
    assert re.search(r'<div class="svgbox fit" id="svg-kernels"><svg ', page)  # fitted by default
    for k in sched.kernels:
        assert f"{k.name} | {k.bound}-bound | stream {k.stream}" in page
    for chart in ("timeline-npu", "timeline-host"):
        m = re.search(rf'<svg [^>]*id="{chart}".*?</svg>', page, re.S)
        assert m, chart
        svg = m.group(0)
        for k in sched.kernels:
            assert k.name in svg  # every kernel is a bar on its stream
        assert "stream 0" in svg and "stream 1" in svg
    npu = re.search(r'<svg [^>]*id="timeline-npu".*?</svg>', page, re.S).group(0)
    assert "pipe Vector" in npu and "pipe Cube" in npu
    assert len(p.kernels) == len(sched.kernels)
    # the long elementwise chain is collapsed, its members listed for the expand view
    kern = _data(page)["graphs"]["kernels"]
    chain = [v for v in kern.values() if v.get("role") == "chain"]
    assert chain and len(chain[0]["members"]) == 8
    assert "kernels-expanded" in _data(page)["graphs"]  # small enough to embed uncollapsed


def test_report_takes_a_finished_profile(needs_dot, tmp_path):
    outs, _ = _branches()
    with lm.profile() as p:
        lm.realize(*_branches()[0])
    path = lm.report(*outs, filename=tmp_path / "r.html", profile=p, spec=SPEC)
    page = open(path, encoding="utf-8").read()
    assert 'id="timeline-npu"' in page and 'id="timeline-host"' in page
    assert outs[0]._node.realized is None  # not active: nothing run by the report


def test_visualize_html_suffix_writes_the_report(custom_op_graph, tmp_path, hide_dot):
    out, _ = custom_op_graph
    path = out.visualize(str(tmp_path / "v.html"))
    assert "<!DOCTYPE html>" in open(path, encoding="utf-8").read(200)


@pytest.mark.usefixtures("needs_dot")
def test_report_in_headless_chromium(chromium, tmp_path):
    outs, _ = _branches()
    with lm.profile():
        path = lm.report(*outs, filename=tmp_path / "report.html")
    url = (tmp_path / "report.html").resolve().as_uri()
    assert str(path).endswith("report.html")
    dom = chromium(url + "#lm-selftest", "--dump-dom")
    assert 'id="js-ok"' in dom, dom[-3000:]
    assert 'id="js-errors"' not in dom, re.search(r'id="js-errors".*?</pre>', dom, re.S).group(0)
    assert 'data-selftest="done"' in dom  # hover/click handlers ran without throwing
    assert '<ol class="chain">' in dom  # the collapsed chain expanded into its ops
    assert re.search(r'id="svg-kernels"><svg ', dom)
    assert re.search(r'<g id="k-cluster_k0" class="cluster', dom)
    assert re.search(r'<svg [^>]*id="timeline-npu"', dom)
    assert re.search(r'<svg [^>]*id="timeline-host"', dom)
    assert 'id="memory-chart"' in dom
    # a plain load (no self-test) is clean too, and the screenshot has the window's size
    shot = tmp_path / "report.png"
    chromium(url, f"--screenshot={shot}", "--window-size=1400,2000", "--hide-scrollbars")
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert (int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")) == (1400, 2000)
    assert len(data) > 30_000  # not a blank page
