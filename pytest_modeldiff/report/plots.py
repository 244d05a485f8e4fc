"""Self-contained SVG plots (no plotting library): rfn against layer index per candidate, and the
weights' relative change per layer as bars."""
from __future__ import annotations

import math
from html import escape

WIDTH, HEIGHT, LEFT, RIGHT, TOP, BOTTOM = 640, 360, 70, 20, 40, 60


def rfn_svg(title: str, names: list[str], rfn: list[float], limits: list[float],
            isolated: list[float | None] | None = None) -> str:
    """rfn (and its per-layer limit, dashed; the isolated error if known, dotted) on a log axis."""
    series = [("rfn (mean over sequences)", rfn, "#c0392b", "")]
    if isolated and any(v is not None for v in isolated):
        series.append(("isolated rfn", [v if v is not None else float("nan") for v in isolated], "#2471a3", "2,3"))
    series.append(("threshold", limits, "#555555", "6,4"))
    out, x, y = _log_axes(title, names, [v for _, values, _, _ in series for v in values], "layer")
    for k, (label, values, color, dash) in enumerate(series):
        points = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(values) if v is not None and math.isfinite(v))
        dashes = f' stroke-dasharray="{dash}"' if dash else ""
        out.append(f'<polyline class="series" data-label="{escape(label)}" fill="none" stroke="{color}" '
                   f'stroke-width="2"{dashes} points="{points}"/>')
        out.append(f'<text x="{LEFT + 10 + 170 * k}" y="{HEIGHT - 6}" fill="{color}">{escape(label)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def bars_svg(title: str, names: list[str], values: list[float], label: str) -> str:
    """One bar per name (log axis): the weights' mean relative change per decoder layer."""
    out, x, y = _log_axes(title, names, values, "layer", bars=True)
    width = 0.7 * (WIDTH - LEFT - RIGHT) / max(len(names), 1)
    base = HEIGHT - BOTTOM
    for i, v in enumerate(values):
        if v is not None and math.isfinite(v) and v > 0:
            out.append(f'<rect class="bar" data-label="{escape(names[i])}" x="{x(i) - width / 2:.1f}" y="{y(v):.1f}" '
                       f'width="{width:.1f}" height="{base - y(v):.1f}" fill="#2471a3"><title>{escape(names[i])}: '
                       f'{v:.4g}</title></rect>')
    out.append(f'<text x="{LEFT + 10}" y="{HEIGHT - 6}" fill="#2471a3">{escape(label)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _log_axes(title: str, names: list[str], values: list, x_label: str, bars: bool = False):
    """The SVG head, decade grid and x labels; returns (lines, x(i), y(value))."""
    low, high = _decades(values, empty_low=1e-6)
    n = len(names)
    span = WIDTH - LEFT - RIGHT
    x = (lambda i: LEFT + span * (i + 0.5) / max(n, 1)) if bars else (lambda i: LEFT + span * (i / max(n - 1, 1)))
    y = lambda v: TOP + (HEIGHT - TOP - BOTTOM) * (high - math.log10(max(v, 10.0 ** low))) / (high - low)
    out = _head(title) + _decade_grid(low, high, y)
    step = max(1, n // 16)
    for i in range(0, n, step):
        out.append(f'<text x="{x(i):.1f}" y="{HEIGHT - BOTTOM + 16}" text-anchor="middle">{escape(names[i])}</text>')
    out.append(f'<text x="{WIDTH / 2}" y="{HEIGHT - 22}" text-anchor="middle">{escape(x_label)}</text>')
    return out, x, y


def histogram_svg(title: str, edges: list[float], counts: list[int], x_label: str) -> str:
    """One bar per non-empty bin of log-spaced ``edges`` (log x axis, linear count axis): the
    per-token KLD histogram."""
    low, high = _decades(edges)
    x = lambda v: LEFT + (WIDTH - LEFT - RIGHT) * (math.log10(v) - low) / (high - low)
    step = _nice_step(max(counts, default=0))
    top = step * max(1, math.ceil(max(counts, default=0) / step))
    y = lambda n: HEIGHT - BOTTOM - (HEIGHT - TOP - BOTTOM) * n / top
    out = _head(title)
    for k in range(round(top / step) + 1):  # count grid lines
        level = y(k * step)
        out.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{level:.1f}" y2="{level:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{LEFT - 6}" y="{level + 4:.1f}" text-anchor="end">{k * step:g}</text>')
    out += _decade_labels(low, high, x)
    for a, b, n in zip(edges, edges[1:], counts):
        if n > 0:
            out.append(f'<rect class="bar" x="{x(a):.1f}" y="{y(n):.1f}" width="{max(x(b) - x(a) - 1, 1):.1f}" '
                       f'height="{y(0) - y(n):.1f}" fill="#2471a3"><title>[{a:.3g}, {b:.3g}): {n}</title></rect>')
    out.append(f'<text x="{WIDTH / 2}" y="{HEIGHT - 22}" text-anchor="middle">{escape(x_label)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def scatter_svg(title: str, points: list[tuple[str, float, float]], x_label: str, y_label: str) -> str:
    """One labelled dot per (label, x, y) on log-log axes: model size against its error."""
    points = [(label, a, b) for label, a, b in points if 0 < a < math.inf and 0 < b < math.inf]  # NaN fails too
    (x_low, x_high), (y_low, y_high) = _decades([a for _, a, _ in points]), _decades([b for _, _, b in points])
    x = lambda v: LEFT + (WIDTH - LEFT - RIGHT) * (math.log10(v) - x_low) / (x_high - x_low)
    y = lambda v: HEIGHT - BOTTOM - (HEIGHT - TOP - BOTTOM) * (math.log10(v) - y_low) / (y_high - y_low)
    out = _head(title) + _decade_grid(y_low, y_high, y)
    out += _decade_labels(x_low, x_high, x)
    for label, a, b in points:
        out.append(f'<circle class="point" cx="{x(a):.1f}" cy="{y(b):.1f}" r="4" fill="#c0392b">'
                   f'<title>{escape(label)}: {a:.4g}, {b:.4g}</title></circle>')
        right = x(a) < WIDTH * 0.6  # labels on the right half go left of their dot, inside the plot
        out.append(f'<text x="{x(a) + (7 if right else -7):.1f}" y="{y(b) + 4:.1f}" '
                   f'text-anchor="{"start" if right else "end"}">{escape(label)}</text>')
    out.append(f'<text x="{WIDTH / 2}" y="{HEIGHT - 22}" text-anchor="middle">{escape(x_label)}</text>')
    out.append(f'<text x="14" y="{(HEIGHT - BOTTOM + TOP) / 2}" text-anchor="middle" '
               f'transform="rotate(-90 14 {(HEIGHT - BOTTOM + TOP) / 2})">{escape(y_label)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _head(title: str) -> list[str]:
    return [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
            f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="11">',
            f'<title>{escape(title)}</title>',
            f'<text x="{WIDTH / 2}" y="20" text-anchor="middle" font-size="13">{escape(title)}</text>']


def _decades(values: list[float], empty_low: float = 1.0) -> tuple[int, int]:
    """The whole decades spanning the positive finite values (at least one)."""
    finite = [v for v in values if v is not None and math.isfinite(v) and v > 0]
    low = math.floor(math.log10(min(finite, default=empty_low)))
    return low, max(math.ceil(math.log10(max(finite, default=1.0))), low + 1)


def _decade_grid(low: int, high: int, y) -> list[str]:
    """Horizontal grid lines and labels at each decade of a log y axis."""
    out = []
    for e in range(low, high + 1):
        level = y(10.0 ** e)
        out.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{level:.1f}" y2="{level:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{LEFT - 6}" y="{level + 4:.1f}" text-anchor="end">1e{e}</text>')
    return out


def _decade_labels(low: int, high: int, x) -> list[str]:
    """Tick labels under a log x axis, thinned to at most about 12."""
    step = max(1, (high - low) // 12 + 1)
    return [f'<text x="{x(10.0 ** e):.1f}" y="{HEIGHT - BOTTOM + 16}" text-anchor="middle">1e{e}</text>'
            for e in range(low, high + 1, step)]


def _nice_step(top: float) -> float:
    """A 1-2-5 grid step giving about four lines up to ``top``."""
    if top <= 0:
        return 1
    raw = top / 4
    magnitude = 10.0 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    return max(step, 1)  # counts are integers
