"""`lm.report(...)`: one self-contained HTML page (no network, no CDN, works offline).

Sections: the kernel-level graph (SVG from `dot`, or the DOT text and a note when Graphviz is
missing; collapsed nodes expand on click), the captured graph, the kernel table of
`lm.explain`, the fusion log, the memory plan (buffer lifetimes over kernel index), and, when
a profiler is given or active, the simulated NPU timeline (per stream and per pipe) and the
measured host timeline (per stream) as Gantt charts.

The schedule is taken before anything runs. Under an active `lm.profile()` the report then
realizes the still-pending tensors inside it (`realize=None` means exactly that), so the
timelines show this graph's kernels.

The page's script only adds hover details and expand/collapse; everything is readable without
it. A `window.onerror` hook installed first writes any script error into `#js-errors`, and the
script appends `#js-ok` when it ran to the end: a headless browser can check both in the DOM.
Opened as `report.html#lm-selftest` the script fires its own hover/click handlers once at load
(a headless browser cannot hover), so tests exercise them too.
"""

from __future__ import annotations

import datetime
import json
import os
from html import escape

from lazymath._version import __version__
from lazymath.graph.walk import nodes_of
from lazymath.realize import realize as run
from lazymath.realize import schedule_of
from lazymath.runtime import profiler as rprof
from lazymath.viz.charts import Lifetime, gantt, memory_chart, timeline_bars
from lazymath.viz.collapse import collapse
from lazymath.viz.dot import to_dot
from lazymath.viz.model import VGraph, fmt_bytes, fmt_value, from_graph, from_schedule, tensor_nodes
from lazymath.viz.render import GraphvizNotFoundError, dot_binary, install_hint, render, svg_inline
from lazymath.viz.style import EDGE_ATTRS, PIPE_COLORS, ROLE_ATTRS, UNIT_COLORS, unit_color

EXPANDED_MAX = 400  # also embed the uncollapsed kernel picture when it has at most this many


def write_report(tensors, path: str, profile=None, realize: bool | None = None, spec=None,
                 title: str | None = None) -> str:  # fmt: skip
    roots = tensor_nodes(tensors)
    sched = schedule_of(nodes_of(tensors), spec)
    full = from_schedule(sched, roots)
    graphs: list[tuple[str, str, VGraph]] = [("kernels", "k-", collapse(full))]
    if graphs[0][2].collapsed and len(full.nodes) <= EXPANDED_MAX:
        graphs.append(("kernels-expanded", "kx-", full))
    graphs.append(("graph", "g-", collapse(from_graph(roots))))
    pictures = {name: _picture(vg, prefix) for name, prefix, vg in graphs}

    if realize is None:
        realize = rprof.active() is not None
    if realize:
        pending = [t for t in tensors if t._node.realized is None]
        if pending:
            run(*pending)
    prof = profile if profile is not None else rprof.active()

    page = _page(
        title or "lazymath report",
        sched,
        graphs,
        pictures,
        prof,
    )
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(page)
    os.replace(tmp, path)
    return path


# ----------------------------------------------------------------------------- pieces


def _picture(vg: VGraph, prefix: str) -> dict:
    """{"svg": inline svg or None, "dot": source, "error": why there is no svg}."""
    src = to_dot(vg, prefix=prefix)
    if dot_binary() is None:
        return {"svg": None, "dot": src, "error": install_hint()}
    try:
        return {"svg": svg_inline(render(src, "svg")), "dot": src, "error": ""}
    except (GraphvizNotFoundError, RuntimeError) as e:
        return {"svg": None, "dot": src, "error": str(e)}


def _node_data(vg: VGraph) -> dict:
    """What the script shows when hovering/clicking a node of this picture."""
    out = {}
    for v, n in vg.nodes.items():
        d: dict = {"role": n.role, "label": list(n.lines), "loc": n.tooltip}
        if n.notes:
            d["notes"] = list(n.notes)
        if n.members:
            d["members"] = [[m.op, m.shape, m.loc] for m in n.members]
        if n.cluster is not None and n.cluster in vg.clusters:
            d["kernel"] = vg.clusters[n.cluster].name
        out[v] = d
    for ci, c in vg.clusters.items():
        out[f"cluster_k{ci}"] = {"role": "kernel", "label": [c.title], "loc": c.tooltip}
        out[f"title_k{ci}"] = out[f"cluster_k{ci}"]  # the kernel's title is a node (dot.py)
    return out


def _graph_section(name: str, prefix: str, vg: VGraph, pic: dict, hidden: bool = False) -> str:
    cls = "graph-view hidden" if hidden else "graph-view"
    head = f'<div class="{cls}" id="view-{name}" data-graph="{name}" data-prefix="{prefix}">'
    if pic["svg"] is not None:
        # fitted to the page's width by default (a wide graph is not cut off); the button
        # switches to the picture's actual size
        body = (f'<button type="button" class="fit-toggle">actual size</button>'
                f'<div class="svgbox fit" id="svg-{name}">{pic["svg"]}</div>')  # fmt: skip
    else:
        body = (f'<p class="warn" id="no-graphviz-{name}">No picture: {escape(pic["error"])}</p>'
                f'<details open><summary>DOT source ({len(vg.nodes)} nodes)</summary>'
                f'<pre class="dot">{escape(pic["dot"])}</pre></details>')  # fmt: skip
    notes = "".join(f"<li>{escape(x)}</li>" for x in vg.notes)
    if vg.collapsed:
        notes += (f"<li>{vg.collapsed} nodes are folded into collapsed nodes (3-D boxes); "
                  "click one to list what it holds.</li>")  # fmt: skip
    notes_html = f'<ul class="notes">{notes}</ul>' if notes else ""
    return head + notes_html + body + "</div>"


def _legend() -> str:
    chips = []
    for unit, color in UNIT_COLORS.items():
        chips.append(f'<span class="chip" style="background:{color}">{unit} kernel</span>')
    for role, label in (("input", "input (realized)"), ("const", "constant"),
                        ("output", "output"), ("chain", "collapsed ops")):  # fmt: skip
        color = ROLE_ATTRS[role]["fillcolor"]
        chips.append(f'<span class="chip" style="background:{color}">{label}</span>')
    buf = EDGE_ATTRS["buffer"]["color"]
    ref = EDGE_ATTRS["refused"]["color"]
    chips.append(f'<span class="edge-chip" style="border-top:4px solid {buf}"></span>'
                 "materialized buffer (GM, with bytes)")  # fmt: skip
    chips.append(f'<span class="edge-chip" style="border-top:3px dashed {ref}"></span>'
                 "fusion refused (hover for the reason)")  # fmt: skip
    return '<div class="legend">' + " ".join(chips) + "</div>"


def _kernel_table(sched) -> str:
    head = ("#", "kernel", "unit", "ops", "bound", "flops", "bytes", "FLOP/B", "stream",
            "waits", "records", "created at")  # fmt: skip
    rows = []
    for i, k in enumerate(sched.kernels):
        waits = ",".join(f"e{w}" for w in k.waits) or "-"
        rec = f"e{k.records}" if k.records is not None else "-"
        inten = "inf" if not k.bytes else f"{k.flops / k.bytes:.2f}"
        cells = (str(i), k.name, k.unit, _ops_text(k.ops), k.bound, f"{k.flops:,}",
                 f"{k.bytes:,}", inten, str(k.stream), waits, rec, k.source_loc)  # fmt: skip
        tds = []
        for j, c in enumerate(cells):
            if j == 3 and len(k.ops) > 8:
                tds.append(f'<td title="{escape(" ".join(k.ops))}">{escape(c)}</td>')
            elif j == 2:
                tds.append(f'<td><span class="chip" style="background:{unit_color(c)}">'
                           f"{escape(c)}</span></td>")  # fmt: skip
            else:
                tds.append(f"<td>{escape(c)}</td>")
        rows.append(f'<tr data-kernel="{i}">' + "".join(tds) + "</tr>")
    if not rows:
        rows.append(f'<tr><td colspan="{len(head)}">no kernels: nothing pending</td></tr>')
    return ('<table id="kernel-table" class="data"><thead><tr>'
            + "".join(f"<th>{h}</th>" for h in head) + "</tr></thead><tbody>"
            + "\n".join(rows) + "</tbody></table>"
            + f'<details><summary>lm.explain text</summary><pre>{escape(str(sched))}</pre>'
            "</details>")  # fmt: skip


def _ops_text(ops: list[str]) -> str:
    """Short kernels list their ops; long ones count them ("mul×30 sin×30 sum")."""
    if len(ops) <= 8:
        return " ".join(ops)
    counts: dict[str, int] = {}
    for op in ops:
        counts[op] = counts.get(op, 0) + 1
    return " ".join(f"{op}×{c}" if c > 1 else op for op, c in counts.items()) + f" ({len(ops)})"


def _fusion_log(sched) -> str:
    if not sched.fusion_log:
        return ('<p id="fusion-log" class="empty">Nothing to explain: every fusion the rules '
                "allow happened.</p>")  # fmt: skip
    rows = []
    for e in sched.fusion_log:
        nodes = escape(" → ".join(e.nodes))
        rows.append(
            f'<tr class="log-{escape(e.what)}"><td>{escape(e.what)}</td>'
            f"<td>{nodes}</td><td>{escape(e.reason)}</td></tr>"
        )
    head = "<thead><tr><th>decision</th><th>nodes</th><th>reason</th></tr></thead>"
    body = "\n".join(rows)
    return f'<table id="fusion-log" class="data">{head}<tbody>{body}</tbody></table>'


def _memory(sched) -> str:
    mem = sched.memory
    node_of = {}
    for k in sched.kernels:
        if k.group is not None:
            for n in k.group.outputs:
                node_of[id(n)] = n
    lifetimes = []
    for nid, b in sorted(mem.buffers.items(), key=lambda kv: (kv[1].first, kv[1].last)):
        n = node_of.get(nid)
        desc = f"{n.op} {fmt_value(n)}" if n is not None else f"buffer {nid}"
        where = "output (from the device pool)" if b.is_output else f"arena offset {b.offset}"
        inplace = b.inplace_of is not None
        info = (f"{desc}: {fmt_bytes(b.nbytes)} ({b.nbytes} bytes), written by kernel "
                f"{b.first}, last read by kernel {b.last}; {where}"
                + ("; in place over an input's block" if inplace else ""))  # fmt: skip
        lifetimes.append(Lifetime(desc, b.first, b.last, b.nbytes, b.offset, b.is_output,
                                  inplace, info))  # fmt: skip
    names = [k.name for k in sched.kernels]
    chart = memory_chart("memory-chart", lifetimes, names)
    summary = (f"planned peak {fmt_bytes(mem.planned_peak_bytes)}, arena "
               f"{fmt_bytes(mem.arena_bytes)}, {mem.reuses} block reuse(s), {mem.inplace} "
               "in-place; bars: teal = intermediate in the arena, orange = output, dashed = "
               "in place")  # fmt: skip
    return f'<p class="caption">{escape(summary)}</p>{chart}'


def _timelines(prof) -> str:
    if prof is None:
        return ('<p id="no-profile" class="empty">Not profiled. Call <code>lm.report(...)</code> '
                "inside <code>with lm.profile():</code> (or pass <code>profile=p</code>) to see "
                "the simulated NPU timeline and the measured host timeline.</p>")  # fmt: skip
    trace = prof.chrome_trace()
    parts = []
    for pid, chart_id, head, caption in (
        (2, "timeline-npu", "Simulated NPU timeline",
         "per stream (kernels, event records/waits in red) and per pipe (busy spans), on the "
         "device clock of the cost model"),
        (1, "timeline-host", "Measured host timeline",
         "per realize and per stream: when each kernel's blocks actually ran on host threads"),
    ):  # fmt: skip
        rows, bars = timeline_bars(trace, pid)
        parts.append(f"<h3>{head}</h3><p class='caption'>{escape(caption)}; "
                     f"{len(bars)} spans</p>"
                     + gantt(chart_id, rows, bars, caption=head))  # fmt: skip
    pipes = " ".join(f'<span class="chip" style="background:{c}">{p}</span>'
                     for p, c in PIPE_COLORS.items())  # fmt: skip
    return f'<div class="legend">pipes: {pipes}</div>' + "\n".join(parts)


# ----------------------------------------------------------------------------- page


def _page(title: str, sched, graphs, pictures, prof) -> str:
    now = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    n = len(sched.kernels)
    summary = (f"{n} kernel{'s' if n != 1 else ''}, {sched.n_events} event(s), "
               f"{sched.n_streams} stream(s) on {sched.spec.name}; planned peak "
               f"{fmt_bytes(sched.planned_peak_bytes)}")  # fmt: skip
    data = {"graphs": {name: _node_data(vg) for name, _, vg in graphs}}
    blob = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    kname, kprefix, kvg = graphs[0]
    kernel_views = [_graph_section(kname, kprefix, kvg, pictures[kname])]
    toggle = ""
    if len(graphs) > 2:
        name, prefix, vg = graphs[1]
        kernel_views.append(_graph_section(name, prefix, vg, pictures[name], hidden=True))
        toggle = ('<button id="toggle-expanded" type="button">Show every node (expanded)'
                  "</button>")  # fmt: skip
    gname, gprefix, gvg = graphs[-1]
    captured = _graph_section(gname, gprefix, gvg, pictures[gname])
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)}</title>
<script>{_ONERROR}</script>
<style>{_CSS}</style></head>
<body>
<header><h1>{escape(title)}</h1>
<p class="summary" id="summary">{escape(summary)}</p>
<p class="meta">lazymath {escape(__version__)} &middot; generated {now} &middot; hover a node,
kernel or bar for details; click a collapsed node (3-D box) to expand it.</p>
<nav><a href="#sec-kernels">kernels</a> <a href="#sec-table">kernel table</a>
<a href="#sec-log">fusion log</a> <a href="#sec-memory">memory plan</a>
<a href="#sec-timeline">timelines</a> <a href="#sec-captured">captured graph</a></nav>
</header>
<aside id="details" class="details"><b>Details</b><div id="details-body">hover something</div>
</aside>
<main>
<section id="sec-kernels"><h2>Kernels after fusion and partition</h2>{_legend()}{toggle}
<div id="kernel-graph">{"".join(kernel_views)}</div>
<div id="expand-panel" class="expand hidden"></div></section>
<section id="sec-table"><h2>Kernel table</h2>{_kernel_table(sched)}</section>
<section id="sec-log"><h2>Fusion log</h2>{_fusion_log(sched)}</section>
<section id="sec-memory"><h2>Memory plan</h2>{_memory(sched)}</section>
<section id="sec-timeline"><h2>Timelines</h2>{_timelines(prof)}</section>
<section id="sec-captured"><h2>Captured graph (as written)</h2>
<details id="captured-details"><summary>show the graph before fusion
({gvg.graph_nodes} nodes)</summary>{captured}</details></section>
</main>
<script type="application/json" id="lm-data">{blob}</script>
<script>{_JS}</script>
</body></html>
"""


_ONERROR = """
window.lmErrors = [];
window.onerror = function (msg, src, line, col) {
  window.lmErrors.push(String(msg));
  var box = document.getElementById('js-errors');
  if (!box) {
    box = document.createElement('pre');
    box.id = 'js-errors';
    box.className = 'js-errors';
    (document.body || document.documentElement).appendChild(box);
  }
  box.textContent += 'script error: ' + msg + ' (line ' + line + ':' + col + ')\\n';
  return false;
};
"""

_JS = """
(function () {
  var data = JSON.parse(document.getElementById('lm-data').textContent);
  var body = document.getElementById('details-body');
  function esc(s) {
    return String(s).replace(/[&<>"]/g, function (c) {
      return {'&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;'}[c];
    });
  }
  function describe(info) {
    var h = '<div class="d-head">' + esc(info.label.join(' | ')) + '</div>';
    h += '<div class="d-role">' + esc(info.role) +
         (info.kernel ? ' in ' + esc(info.kernel) : '') + '</div>';
    if (info.loc) { h += '<pre class="d-loc">' + esc(info.loc) + '</pre>'; }
    (info.notes || []).forEach(function (n) { h += '<div class="d-note">' + esc(n) + '</div>'; });
    if (info.members) {
      h += '<div class="d-role">' + info.members.length + ' ops inside (click to expand)</div>';
    }
    return h;
  }
  function expand(info) {
    var panel = document.getElementById('expand-panel');
    var rows = info.members.map(function (m, i) {
      return '<li><span class="op">' + esc(m[0]) + '</span> <span class="shape">' +
             esc(m[1]) + '</span> <span class="loc">' + esc(m[2]) + '</span></li>';
    });
    panel.innerHTML = '<div class="d-head">' + esc(info.label.join(' | ')) +
      ' <button type="button" id="expand-close">close</button></div><ol class="chain">' +
      rows.join('') + '</ol>';
    panel.classList.remove('hidden');
    document.getElementById('expand-close').addEventListener('click', function () {
      panel.classList.add('hidden');
    });
  }
  document.querySelectorAll('.graph-view').forEach(function (view) {
    var nodes = data.graphs[view.getAttribute('data-graph')] || {};
    var prefix = view.getAttribute('data-prefix') || '';
    view.querySelectorAll('g.node, g.cluster').forEach(function (el) {
      var key = el.id.indexOf(prefix) === 0 ? el.id.slice(prefix.length) : el.id;
      var info = nodes[key];
      if (!info) { return; }
      el.addEventListener('mouseenter', function () { body.innerHTML = describe(info); });
      if (info.members && info.members.length > 1) {
        el.classList.add('collapsible');
        el.addEventListener('click', function (ev) { ev.preventDefault(); expand(info); });
      }
    });
  });
  document.querySelectorAll('[data-info]').forEach(function (el) {
    el.addEventListener('mouseenter', function () {
      body.innerHTML = '<div class="d-head">' + esc(el.getAttribute('data-info')) + '</div>';
    });
  });
  document.querySelectorAll('.fit-toggle').forEach(function (btn) {
    btn.addEventListener('click', function () {
      var box = btn.nextElementSibling;
      var fit = !box.classList.contains('fit');
      box.classList.toggle('fit', fit);
      btn.textContent = fit ? 'actual size' : 'fit to width';
    });
  });
  var toggle = document.getElementById('toggle-expanded');
  if (toggle) {
    toggle.addEventListener('click', function () {
      var a = document.getElementById('view-kernels');
      var b = document.getElementById('view-kernels-expanded');
      var showFull = b.classList.contains('hidden');
      b.classList.toggle('hidden', !showFull);
      a.classList.toggle('hidden', showFull);
      toggle.textContent = showFull ? 'Show the collapsed picture' :
                                      'Show every node (expanded)';
    });
  }
  if (location.hash === '#lm-selftest') {
    // headless tests cannot hover or click: exercise the handlers once, then report
    var first = document.querySelector('.graph-view g.node');
    if (first) { first.dispatchEvent(new MouseEvent('mouseenter')); }
    var coll = document.querySelector('.graph-view g.collapsible');
    if (coll) { coll.dispatchEvent(new MouseEvent('click', {bubbles: true, cancelable: true})); }
    if (toggle) { toggle.click(); toggle.click(); }
    var fitButton = document.querySelector('.fit-toggle');
    if (fitButton) { fitButton.click(); fitButton.click(); }
    var bar = document.querySelector('[data-info]');
    if (bar) { bar.dispatchEvent(new MouseEvent('mouseenter')); }
    document.body.setAttribute('data-selftest', 'done');
  }
  var ok = document.createElement('div');
  ok.id = 'js-ok';
  ok.className = 'hidden';
  ok.textContent = 'script finished';
  document.body.appendChild(ok);
})();
"""

_CSS = """
body { font-family: system-ui, -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif;
       margin: 0 300px 0 0; color: #212529; background: #fff; font-size: 14px; }
header, main { padding: 0 20px; }
h1 { font-size: 22px; margin: 14px 0 4px; }
h2 { font-size: 17px; border-bottom: 1px solid #dee2e6; padding-bottom: 3px; margin-top: 26px; }
h3 { font-size: 15px; margin: 14px 0 2px; }
nav a { margin-right: 10px; }
.summary { font-weight: 600; margin: 2px 0; }
.meta, .caption { color: #6c757d; font-size: 12px; margin: 2px 0 6px; }
.details { position: fixed; top: 0; right: 0; width: 280px; height: 100vh; overflow: auto;
           background: #f8f9fa; border-left: 1px solid #dee2e6; padding: 10px;
           box-sizing: border-box; font-size: 12px; }
.d-head { font-weight: 600; margin-bottom: 4px; word-break: break-word; }
.d-role { color: #495057; margin-bottom: 4px; }
.d-loc { white-space: pre-wrap; word-break: break-all; background: #fff; padding: 4px;
         border: 1px solid #e9ecef; }
.d-note { color: #d62828; margin: 4px 0; }
.svgbox { overflow: auto; max-height: 85vh; border: 1px solid #dee2e6; padding: 4px; }
.svgbox svg { max-width: none; }
.svgbox.fit svg { width: 100%; height: auto; }
.graph-view.hidden, .hidden { display: none; }
g.collapsible { cursor: pointer; }
g.node:hover polygon, g.node:hover path, g.node:hover ellipse { stroke-width: 2.5; }
.legend { margin: 6px 0; font-size: 12px; }
.chip { display: inline-block; padding: 1px 7px; border-radius: 9px; margin: 1px 3px 1px 0;
        border: 1px solid rgba(0,0,0,.2); font-size: 12px; }
.edge-chip { display: inline-block; width: 28px; margin: 0 4px 3px 10px; vertical-align: middle; }
table.data { border-collapse: collapse; font-size: 12px; margin: 6px 0; }
table.data th, table.data td { border: 1px solid #dee2e6; padding: 3px 6px; text-align: left;
                               vertical-align: top; }
table.data th { background: #f1f3f5; }
tr.log-refuse td:first-child, tr.log-materialize td:first-child, tr.log-split td:first-child {
  color: #d62828; font-weight: 600; }
pre { font-size: 12px; background: #f8f9fa; padding: 6px; overflow: auto; }
pre.dot { max-height: 400px; }
.warn { background: #fff3cd; border: 1px solid #ffe69c; padding: 6px; }
.empty { color: #6c757d; font-style: italic; }
.notes { font-size: 12px; color: #495057; margin: 4px 0; }
.expand { border: 1px solid #dee2e6; background: #fefae0; padding: 6px 10px; margin-top: 6px;
          max-height: 360px; overflow: auto; }
ol.chain li { margin: 1px 0; }
ol.chain .op { font-weight: 600; }
ol.chain .shape { color: #495057; }
ol.chain .loc { color: #6c757d; font-size: 11px; }
svg.gantt, svg.memplan { max-width: 100%; height: auto; }
svg.gantt text, svg.memplan text { font-size: 11px; font-family: inherit; }
svg.gantt text.tick, svg.memplan text.tick { fill: #6c757d; font-size: 10px; }
svg.gantt text.barlabel, svg.memplan text.barlabel { font-size: 10px; pointer-events: none; }
svg.memplan text.light { fill: #fff; }
g.bar:hover rect, rect.bar:hover { stroke: #000; stroke-width: 1.5; }
.js-errors { color: #b00020; background: #fde2e4; padding: 6px; }
button { font-size: 12px; margin: 4px 0; }
"""
