"""A small chart library for the dashboard: inline SVG drawn on the server.

No JavaScript and nothing fetched: the page works air-gapped and in any browser. Each chart
is one ``<svg class="chart" data-chart=KIND>`` whose marks carry their values
(``data-x``/``data-y``/``data-label``), so a test (or a reader with devtools) can check what
was drawn against the numbers it came from.

    svg = lines("reward over time", {"policy": [(t0, 0.41), (t1, 0.47)], "baseline": [...]},
                x_format=clock, y_label="mean reward")
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Mapping, Sequence

__all__ = ["PALETTE", "bars", "intervals", "lines", "pareto_front", "scatter"]

PALETTE = ("#2f6db5", "#d9822b", "#3a9a5b", "#c23b4a", "#7b5ea7", "#8c6d31", "#4aa3b5", "#b5567f")
WIDTH, HEIGHT = 560, 260
LEFT, RIGHT, TOP, BOTTOM = 56, 16, 44, 36


def _esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def _num(value: float) -> str:
    return f"{value:.6g}"


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    step = 10 ** math.floor(math.log10(raw))
    for multiple in (1, 2, 2.5, 5, 10):
        if raw <= multiple * step:
            step *= multiple
            break
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _range(values: Sequence[float], pad: float = 0.05) -> tuple[float, float]:
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return 0.0, 1.0
    lo, hi = min(finite), max(finite)
    if hi == lo:
        lo, hi = lo - 0.5, hi + 0.5
    span = hi - lo
    return lo - pad * span, hi + pad * span


class _Frame:
    """Axes mapping data to pixels inside the plot area."""

    def __init__(self, x: tuple[float, float], y: tuple[float, float], width: int = WIDTH, height: int = HEIGHT,
                 left: int = LEFT):
        self.x0, self.x1 = x
        self.y0, self.y1 = y
        self.width, self.height, self.left = width, height, left

    def px(self, x: float) -> float:
        return self.left + (x - self.x0) / (self.x1 - self.x0) * (self.width - self.left - RIGHT)

    def py(self, y: float) -> float:
        return self.height - BOTTOM - (y - self.y0) / (self.y1 - self.y0) * (self.height - TOP - BOTTOM)

    def axes(self, x_format: Callable[[float], str], y_format: Callable[[float], str], x_label: str, y_label: str,
             x_ticks: Sequence[float] | None = None) -> list[str]:
        out = ['<g class="axes" font-size="11" fill="#555">']
        for y in _ticks(self.y0, self.y1):
            p = self.py(y)
            out.append(f'<line x1="{LEFT}" x2="{self.width - RIGHT}" y1="{p:.1f}" y2="{p:.1f}" stroke="#e4e4e4"/>'
                       f'<text x="{LEFT - 6}" y="{p + 4:.1f}" text-anchor="end">{_esc(y_format(y))}</text>')
        for x in _ticks(self.x0, self.x1) if x_ticks is None else x_ticks:
            p = self.px(x)
            out.append(f'<text x="{p:.1f}" y="{self.height - BOTTOM + 16}" text-anchor="middle">{_esc(x_format(x))}</text>')
        out.append(f'<line x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{self.height - BOTTOM}" stroke="#888"/>'
                   f'<line x1="{LEFT}" x2="{self.width - RIGHT}" y1="{self.height - BOTTOM}" y2="{self.height - BOTTOM}" stroke="#888"/>')
        if x_label:
            out.append(f'<text x="{(LEFT + self.width - RIGHT) / 2:.0f}" y="{self.height - 4}" text-anchor="middle">{_esc(x_label)}</text>')
        if y_label:
            out.append(f'<text x="12" y="{(TOP + self.height - BOTTOM) / 2:.0f}" text-anchor="middle" '
                       f'transform="rotate(-90 12 {(TOP + self.height - BOTTOM) / 2:.0f})">{_esc(y_label)}</text>')
        out.append("</g>")
        return out


def _svg(kind: str, title: str, body: list[str], legend: Sequence[tuple[str, str]] = (), height: int = HEIGHT) -> str:
    parts = [f'<svg class="chart" data-chart="{kind}" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" '
             f'role="img" aria-label="{_esc(title)}" xmlns="http://www.w3.org/2000/svg">',
             f'<text x="{LEFT}" y="16" font-size="13" font-weight="600" fill="#222">{_esc(title)}</text>']
    x = LEFT  # the legend: a row under the title
    for label, color in legend:
        parts.append(f'<rect x="{x}" y="23" width="10" height="10" fill="{color}"/>'
                     f'<text x="{x + 14}" y="32" font-size="11" fill="#333">{_esc(label)}</text>')
        x += 14 + 6 * len(label) + 18
    parts += body
    parts.append("</svg>")
    return "".join(parts)


def _empty(kind: str, title: str, why: str) -> str:
    return _svg(kind, title, [f'<text class="empty" x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle" '
                              f'font-size="12" fill="#777">{_esc(why)}</text>'])


def lines(title: str, series: Mapping[str, Sequence[tuple[float, float]]], *, x_format: Callable[[float], str] = _num,
          y_format: Callable[[float], str] = lambda y: f"{y:.2f}", x_label: str = "", y_label: str = "") -> str:
    """One polyline per series (points with a non-finite y are gaps)."""
    points = [p for s in series.values() for p in s if math.isfinite(p[1])]
    if not points:
        return _empty("lines", title, "no data in the window")
    frame = _Frame(_range([p[0] for p in points], 0.0), _range([p[1] for p in points]))
    body = frame.axes(x_format, y_format, x_label, y_label)
    legend = []
    for i, (name, data) in enumerate(series.items()):
        color = PALETTE[i % len(PALETTE)]
        legend.append((name, color))
        run: list[str] = []
        marks = []
        for x, y in data:
            if not math.isfinite(y):
                if len(run) > 1:
                    body.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{" ".join(run)}"/>')
                run = []
                continue
            run.append(f"{frame.px(x):.1f},{frame.py(y):.1f}")
            marks.append(f'<circle class="mark" data-series="{_esc(name)}" data-x="{_num(x)}" data-y="{_num(y)}" '
                         f'cx="{frame.px(x):.1f}" cy="{frame.py(y):.1f}" r="2.5" fill="{color}"/>')
        if len(run) > 1:
            body.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{" ".join(run)}"/>')
        body += marks
    return _svg("lines", title, body, legend)


def bars(title: str, values: Mapping[str, float], *, value_format: Callable[[float], str] = lambda v: f"{v:.1%}") -> str:
    """Horizontal bars, one per label, in the given order."""
    if not values:
        return _empty("bars", title, "no data in the window")
    row = 22
    height = TOP + row * len(values) + 12
    top = max(max(values.values()), 1e-12)
    span = WIDTH - 150 - 70
    body = []
    for i, (label, value) in enumerate(values.items()):
        y = TOP + i * row
        w = max(0.0, value) / top * span
        body.append(f'<text x="142" y="{y + 15}" text-anchor="end" font-size="12" fill="#333">{_esc(label)}</text>'
                    f'<rect class="mark" data-label="{_esc(label)}" data-y="{_num(value)}" x="150" y="{y + 3}" '
                    f'width="{w:.1f}" height="{row - 6}" fill="{PALETTE[i % len(PALETTE)]}"/>'
                    f'<text x="{150 + w + 6:.1f}" y="{y + 15}" font-size="11" fill="#333">{_esc(value_format(value))}</text>')
    return _svg("bars", title, body, height=height)


def intervals(title: str, rows: Sequence[tuple[str, float, float | None, float | None]], *,
              value_format: Callable[[float], str] = lambda v: f"{v:.3f}") -> str:
    """A forest plot: per row ``(label, estimate, low, high)`` a point and its interval."""
    if not rows:
        return _empty("intervals", title, "nothing to show")
    row = 24
    height = TOP + row * len(rows) + BOTTOM
    values = [v for _, e, lo, hi in rows for v in (e, lo, hi) if v is not None and math.isfinite(v)]
    lo_x, hi_x = _range(values)
    frame = _Frame((lo_x, hi_x), (0.0, 1.0), height=height, left=150)
    body = ['<g font-size="11" fill="#555">']
    for x in _ticks(lo_x, hi_x):
        p = frame.px(x)
        body.append(f'<line x1="{p:.1f}" x2="{p:.1f}" y1="{TOP}" y2="{height - BOTTOM}" stroke="#eee"/>'
                    f'<text x="{p:.1f}" y="{height - BOTTOM + 16}" text-anchor="middle">{_esc(value_format(x))}</text>')
    body.append("</g>")
    for i, (label, estimate, low, high) in enumerate(rows):
        y = TOP + i * row + row / 2
        color = PALETTE[i % len(PALETTE)]
        if low is not None and high is not None:
            body.append(f'<line x1="{frame.px(low):.1f}" x2="{frame.px(high):.1f}" y1="{y:.1f}" y2="{y:.1f}" '
                        f'stroke="{color}" stroke-width="2"/>')
        body.append(f'<circle class="mark" data-label="{_esc(label)}" data-y="{_num(estimate)}" cx="{frame.px(estimate):.1f}" '
                    f'cy="{y:.1f}" r="4" fill="{color}"/>'
                    f'<text x="142" y="{y + 4:.1f}" text-anchor="end" font-size="11" fill="#333">{_esc(label)}</text>')
    return _svg("intervals", title, body, height=height)


def pareto_front(points: Sequence[tuple[str, float, float]]) -> list[str]:
    """Labels of the points no other beats on both axes: lower x (cost), higher y (quality)."""
    front = []
    for label, x, y in points:
        if not any((x2 <= x and y2 >= y) and (x2 < x or y2 > y) for _, x2, y2 in points):
            front.append(label)
    return front


def scatter(title: str, points: Sequence[tuple[str, float, float]], *, x_label: str = "", y_label: str = "",
            x_format: Callable[[float], str] = lambda v: f"{v:.3g}", y_format: Callable[[float], str] = lambda v: f"{v:.2f}") -> str:
    """Labelled points; the Pareto front (low x, high y) joined by a line."""
    points = [p for p in points if math.isfinite(p[1]) and math.isfinite(p[2])]
    if not points:
        return _empty("scatter", title, "no data in the window")
    frame = _Frame(_range([p[1] for p in points], 0.1), _range([p[2] for p in points], 0.1))
    body = frame.axes(x_format, y_format, x_label, y_label)
    front = set(pareto_front(points))
    line = sorted((x, y) for label, x, y in points if label in front)
    if len(line) > 1:
        body.append('<polyline class="front" fill="none" stroke="#999" stroke-dasharray="4 3" points="'
                    + " ".join(f"{frame.px(x):.1f},{frame.py(y):.1f}" for x, y in line) + '"/>')
    for i, (label, x, y) in enumerate(points):
        color = PALETTE[i % len(PALETTE)]
        on = "true" if label in front else "false"
        body.append(f'<circle class="mark" data-label="{_esc(label)}" data-x="{_num(x)}" data-y="{_num(y)}" data-front="{on}" '
                    f'cx="{frame.px(x):.1f}" cy="{frame.py(y):.1f}" r="5" fill="{color}"/>'
                    f'<text x="{frame.px(x) + 7:.1f}" y="{frame.py(y) - 6:.1f}" font-size="11" fill="#333">{_esc(label)}</text>')
    return _svg("scatter", title, body)
