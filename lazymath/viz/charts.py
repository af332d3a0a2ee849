"""Inline SVG charts for the HTML report: Gantt timelines and memory-plan lifetimes.

Plain SVG text (no library, no script needed to read them): every bar is a `<rect>` with a
`<title>` (the browser's own tooltip) and a `data-info` attribute the report's script shows in
its detail panel on hover.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

from lazymath.units import fmt_bytes as _fmt_bytes
from lazymath.viz.style import BUFFER_COLORS, EVENT_COLOR, PIPE_COLORS, REALIZE_COLOR, unit_color

LABEL_W = 150  # px for row labels
ROW_H = 22
AXIS_H = 34
MIN_TEXT_W = 46  # px: bars narrower than this carry no text


@dataclass(frozen=True, slots=True)
class Bar:
    row: str
    start: float
    end: float
    label: str
    color: str
    info: str
    marker: bool = False  # an instant (event record/wait): drawn as a thin tick
    content: bool = True  # False: context only (a realize span); the axis covers content bars


def nice_step(span: float, target_ticks: int = 8) -> float:
    """A 1/2/5 x 10^k tick step giving about `target_ticks` ticks over `span`."""
    if span <= 0:
        return 1.0
    raw = span / target_ticks
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def fmt_time_us(us: float, digits: int = 3) -> str:
    """Microseconds in the unit that reads best: 0, 850 ns, 12.5 µs, 3.2 ms, 1.5 s."""
    if us == 0:
        return "0"
    for scale, unit in ((1e6, "s"), (1e3, "ms"), (1.0, "µs")):
        if abs(us) >= scale:
            return f"{us / scale:.{digits}g} {unit}"
    return f"{us * 1e3:.{digits}g} ns"


def _attr(s: object) -> str:
    return escape(str(s), quote=True)


BREAK_W = 26  # px for an idle gap folded out of a timeline
GAP_FRACTION = 0.15  # fold idle gaps longer than this fraction of the busy time


@dataclass(frozen=True, slots=True)
class Axis:
    """Piecewise-linear time -> x. Busy stretches keep their proportions; an idle gap longer
    than GAP_FRACTION of the busy time shrinks to BREAK_W pixels (compile pauses between
    realizes would otherwise squeeze every kernel into a sliver)."""

    pieces: tuple[tuple[float, float, float, float], ...]  # (t0, t1, x0, x1), sorted
    breaks: tuple[tuple[float, float, float, float], ...]  # folded gaps, same layout

    def x(self, t: float) -> float:
        p = self.pieces
        if t <= p[0][0]:
            return p[0][2]
        for t0, t1, x0, x1 in p:
            if t <= t1:
                return x0 + (x1 - x0) * ((t - t0) / (t1 - t0) if t1 > t0 else 0.0)
        return p[-1][3]

    @staticmethod
    def build(spans: list[tuple[float, float]], x0: float, width: float) -> Axis:
        merged: list[list[float]] = []
        for a, b in sorted(spans):
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        busy = sum(b - a for a, b in merged) or max(merged[-1][1] - merged[0][0], 1e-6)
        kept: list[list[float]] = [list(merged[0])]
        for a, b in merged[1:]:
            if a - kept[-1][1] > GAP_FRACTION * busy:
                kept.append([a, b])
            else:
                kept[-1][1] = b
        n_breaks = len(kept) - 1
        avail = max(width - n_breaks * BREAK_W, 10.0)
        total = sum(b - a for a, b in kept)
        pieces, breaks = [], []
        x = x0
        min_w = min(8.0, avail / len(kept))
        for i, (a, b) in enumerate(kept):
            w = (avail - min_w * len(kept)) * ((b - a) / total if total > 0 else 1 / len(kept))
            pieces.append((a, b, x, x + w + min_w))
            x += w + min_w
            if i < n_breaks:
                nxt = kept[i + 1][0]
                breaks.append((b, nxt, x, x + BREAK_W))
                pieces.append((b, nxt, x, x + BREAK_W))
                x += BREAK_W
        return Axis(tuple(pieces), tuple(breaks))


def gantt(chart_id: str, rows: list[str], bars: list[Bar], width: int = 1060,
          caption: str = "") -> str:  # fmt: skip
    """One Gantt chart: a lane per row, time (µs) on x over the span of the `content` bars,
    long idle gaps folded (see `Axis`); other bars are clipped to that span."""
    if not bars:
        return f'<p class="empty" id="{_attr(chart_id)}">no data</p>'
    content = [(b.start, b.end) for b in bars if b.content] or [(b.start, b.end) for b in bars]
    plot_w = width - LABEL_W - 10
    axis = Axis.build(content, LABEL_W, plot_w)
    t0 = axis.pieces[0][0]
    height = AXIS_H + ROW_H * len(rows) + 6
    lane = {r: i for i, r in enumerate(rows)}
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="gantt" id="{_attr(chart_id)}" '
           f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
           f'role="img" aria-label="{_attr(caption)}">']  # fmt: skip
    # lanes and row labels
    for r, i in lane.items():
        y = AXIS_H + i * ROW_H
        fill = "#f8f9fa" if i % 2 == 0 else "#ffffff"
        out.append(f'<rect x="{LABEL_W}" y="{y}" width="{plot_w}" height="{ROW_H}" '
                   f'fill="{fill}"/>')  # fmt: skip
        out.append(f'<text class="row" x="{LABEL_W - 6}" y="{y + ROW_H * 0.68:.1f}" '
                   f'text-anchor="end">{escape(r)}</text>')  # fmt: skip
    # time axis: ticks inside each kept stretch, a hatched band for each folded gap
    kept_time = sum(p[1] - p[0] for p in axis.pieces if p not in axis.breaks)
    step = nice_step(kept_time or 1e-6)
    last_x = -1e9
    gaps = {(g[0], g[1]) for g in axis.breaks}
    stretch = 0
    for a, b, xa, _ in axis.pieces:
        if (a, b) in gaps:
            continue
        # ticks count from the chart start in the first stretch; after a folded gap, the
        # stretch start is labelled with its absolute time and ticks count from it ("+5 µs")
        base = t0 if stretch == 0 else a
        if stretch:
            out.append(f'<text class="tick abs" x="{xa + 2:.1f}" y="{AXIS_H - 16}">'
                       f"{escape(fmt_time_us(a - t0, 5))}</text>")  # fmt: skip
        t = math.ceil((a - base) / step) * step + base
        k = 0
        while t <= b + 1e-9 and k < 40:
            x = axis.x(t)
            if x - last_x >= 48:
                label = fmt_time_us(t - base)
                label = label if stretch == 0 else "+" + label
                out.append(f'<line x1="{x:.1f}" y1="{AXIS_H - 4}" x2="{x:.1f}" '
                           f'y2="{height - 6}" stroke="#dee2e6" stroke-width="1"/>')  # fmt: skip
                out.append(f'<text class="tick" x="{x:.1f}" y="{AXIS_H - 5}" '
                           f'text-anchor="middle">{escape(label)}</text>')  # fmt: skip
                last_x = x
            t += step
            k += 1
        stretch += 1
    for a, b, x0, x1 in axis.breaks:
        idle = _attr(f"{fmt_time_us(b - a)} without kernels, folded out of the axis")
        out.append(f'<g class="gap"><title>{idle}</title><rect x="{x0:.1f}" y="{AXIS_H - 14}" '
                   f'width="{x1 - x0:.1f}" height="{height - AXIS_H + 8}" fill="#e9ecef" '
                   'stroke="#adb5bd" stroke-dasharray="3 2"/>'
                   f'<text class="tick" x="{(x0 + x1) / 2:.1f}" y="{AXIS_H - 4}" '
                   'text-anchor="middle">≈</text></g>')  # fmt: skip
    # bars
    for b in bars:
        i = lane.get(b.row)
        if i is None:
            continue
        x = axis.x(b.start)
        w = max(axis.x(b.end) - x, 1.0)
        y = AXIS_H + i * ROW_H + 3
        h = ROW_H - 6
        info = _attr(b.info)
        if b.marker:
            out.append(f'<rect class="bar marker" x="{x - 1:.2f}" y="{y:.1f}" width="2" '
                       f'height="{h}" fill="{EVENT_COLOR}" data-info="{info}">'
                       f"<title>{info}</title></rect>")  # fmt: skip
            continue
        out.append(f'<g class="bar" data-info="{info}"><title>{info}</title>'
                   f'<rect x="{x:.2f}" y="{y:.1f}" width="{w:.2f}" height="{h}" rx="2" '
                   f'fill="{b.color}" stroke="#495057" stroke-width="0.5"/>')  # fmt: skip
        if w >= MIN_TEXT_W:
            chars = int(w / 6.2)
            text = b.label if len(b.label) <= chars else b.label[: max(chars - 1, 1)] + "…"
            out.append(f'<text class="barlabel" x="{x + 3:.1f}" y="{y + h * 0.75:.1f}">'
                       f"{escape(text)}</text>")  # fmt: skip
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out)


# ----------------------------------------------------------------------------- timelines


def _track_names(trace: dict) -> dict[tuple[int, int], str]:
    names = {}
    for ev in trace["traceEvents"]:
        if ev.get("ph") == "M" and ev.get("name") == "thread_name":
            names[(ev["pid"], ev["tid"])] = ev["args"]["name"]
    return names


def _row_name(names: dict, pid: int, tid: int) -> str:
    name = names.get((pid, tid), f"track {tid}")
    return f"pipe {name}" if tid >= 100 else name  # the profiler numbers pipe tracks from 100


def timeline_bars(trace: dict, pid: int) -> tuple[list[str], list[Bar]]:
    """Rows and bars of one process of a profiler's Chrome trace (1: host measured,
    2: NPU simulated): realize/stream/pipe tracks in the trace's own order."""
    names = _track_names(trace)
    tids = sorted(t for (p, t) in names if p == pid)
    rows = [_row_name(names, pid, t) for t in tids]
    bars = []
    used = set()
    for ev in trace["traceEvents"]:
        if ev.get("ph") != "X" or ev.get("pid") != pid:
            continue
        row = _row_name(names, pid, ev["tid"])
        cat = ev.get("cat", "")
        args = ev.get("args", {})
        start, dur = float(ev["ts"]), float(ev.get("dur", 0.0))
        if cat == "kernel":
            color = unit_color(args.get("unit"))
            info = (f"{ev['name']} on {row}: {fmt_time_us(dur)}; unit {args.get('unit')}, "
                    f"{args.get('bound')}-bound, {args.get('sim_cycles')} simulated cycles"
                    + (f"; created at {args['source']}" if args.get("source") else ""))  # fmt: skip
            bars.append(Bar(row, start, start + dur, ev["name"], color, info))
        elif cat == "pipe":
            pipe = args.get("pipe", row)
            info = f"{ev['name']} on pipe {pipe}: {args.get('cycles')} cycles"
            bars.append(Bar(row, start, start + dur, ev["name"], PIPE_COLORS.get(pipe, "#999"),
                            info))  # fmt: skip
        elif cat == "realize":
            info = f"realize {ev['name']}: {fmt_time_us(dur)}; " + ", ".join(
                f"{k}={v}" for k, v in args.items()
            )
            bars.append(Bar(row, start, start + dur, ev["name"], REALIZE_COLOR, info,
                            content=False))  # fmt: skip
        elif cat == "event":
            bars.append(Bar(row, start, start + dur, ev["name"], EVENT_COLOR,
                            f"{ev['name']} on {row}", marker=True))  # fmt: skip
        else:
            continue
        used.add(row)
    rows = [r for r in rows if r in used]
    return rows, bars


# ----------------------------------------------------------------------------- memory plan


@dataclass(frozen=True, slots=True)
class Lifetime:
    label: str
    first: int
    last: int
    nbytes: int
    offset: int
    is_output: bool
    inplace: bool
    info: str


def memory_chart(chart_id: str, lifetimes: list[Lifetime], kernel_names: list[str],
                 width: int = 1060) -> str:  # fmt: skip
    """Buffer lifetimes as horizontal bars over kernel index (a column per kernel)."""
    if not lifetimes or not kernel_names:
        return f'<p class="empty" id="{_attr(chart_id)}">no planned buffers</p>'
    label_w = 260
    n = len(kernel_names)
    plot_w = width - label_w - 10
    col = plot_w / n
    height = AXIS_H + ROW_H * len(lifetimes) + 6
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="memplan" id="{_attr(chart_id)}" '
           f'width="{width}" height="{height}" viewBox="0 0 {width} {height}">']  # fmt: skip
    step = max(1, math.ceil(n / 40))
    for k in range(n):
        x = label_w + k * col
        if k % 2 == 0:
            out.append(f'<rect x="{x:.1f}" y="{AXIS_H - 2}" width="{col:.2f}" '
                       f'height="{height - AXIS_H - 4}" fill="#f8f9fa"/>')  # fmt: skip
        if k % step == 0:
            out.append(f'<text class="tick" x="{x + col / 2:.1f}" y="{AXIS_H - 8}" '
                       f'text-anchor="middle"><title>{escape(kernel_names[k])}</title>'
                       f"k{k}</text>")  # fmt: skip
    for i, lt in enumerate(lifetimes):
        y = AXIS_H + i * ROW_H
        out.append(f'<text class="row" x="{label_w - 6}" y="{y + ROW_H * 0.68:.1f}" '
                   f'text-anchor="end">{escape(lt.label)}</text>')  # fmt: skip
        x = label_w + lt.first * col + 2
        w = max((lt.last - lt.first + 1) * col - 4, 2)
        color = BUFFER_COLORS["output" if lt.is_output else "intermediate"]
        dash = ' stroke-dasharray="4 2"' if lt.inplace else ""
        info = _attr(lt.info)
        out.append(f'<g class="bar buffer" data-info="{info}"><title>{info}</title>'
                   f'<rect x="{x:.1f}" y="{y + 3}" width="{w:.1f}" height="{ROW_H - 6}" rx="3" '
                   f'fill="{color}" stroke="#264653" stroke-width="1"{dash}/>')  # fmt: skip
        size = _attr(_fmt_bytes(lt.nbytes))
        if w >= MIN_TEXT_W:
            out.append(f'<text class="barlabel light" x="{x + 4:.1f}" y="{y + ROW_H * 0.68:.1f}">'
                       f"{size}</text>")  # fmt: skip
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out)
