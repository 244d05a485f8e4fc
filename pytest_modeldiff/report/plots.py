"""Self-contained SVG plots (no plotting library): rfn against layer index per candidate, the
weights' relative change per layer as bars, the per-token KLD histogram and size against KLD.
Each has a viewBox and no fixed size, so the page scales it to its full width."""
from __future__ import annotations

import math
from html import escape

WIDTH, HEIGHT, LEFT, RIGHT, TOP, BOTTOM = 960, 400, 80, 30, 40, 70


def rfn_svg(title: str, names: list[str], rfn: list[float], limits: list[float],
            isolated: list[float | None] | None = None) -> str:
    """rfn (and its per-layer limit, dashed; the isolated error if known, dotted) on a log axis."""
    series = [("rfn (mean over sequences)", rfn, "#c0392b", "")]
    if isolated and any(v is not None for v in isolated):
        series.append(("isolated rfn", [v if v is not None else float("nan") for v in isolated], "#2471a3", "2,3"))
    series.append(("threshold", limits, "#555555", "6,4"))
    out, x, y = _log_axes(title, names, [v for _, values, _, _ in series for v in values],
                          "layer state (embd: token embeddings, 0..L-1: decoder layer outputs, norm: final norm)",
                          y_label="rfn (relative error), log scale")
    for k, (label, values, color, dash) in enumerate(series):
        points = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(values) if v is not None and math.isfinite(v))
        dashes = f' stroke-dasharray="{dash}"' if dash else ""
        out.append(f'<polyline class="series" data-label="{escape(label)}" fill="none" stroke="{color}" '
                   f'stroke-width="2"{dashes} points="{points}"/>')
        out.append(f'<text x="{LEFT + 10 + 230 * k}" y="{HEIGHT - 8}" fill="{color}">{escape(label)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def bars_svg(title: str, names: list[str], values: list[float], label: str) -> str:
    """One bar per name (log axis): the weights' mean relative change per decoder layer."""
    out, x, y = _log_axes(title, names, values, "decoder layer", bars=True, y_label="mean ||d||/||ref||, log scale")
    width = 0.7 * (WIDTH - LEFT - RIGHT) / max(len(names), 1)
    base = HEIGHT - BOTTOM
    for i, v in enumerate(values):
        if v is not None and math.isfinite(v) and v > 0:
            out.append(f'<rect class="bar" data-label="{escape(names[i])}" x="{x(i) - width / 2:.1f}" y="{y(v):.1f}" '
                       f'width="{width:.1f}" height="{base - y(v):.1f}" fill="#2471a3"><title>{escape(names[i])}: '
                       f'{v:.4g}</title></rect>')
    out.append(f'<text x="{LEFT + 10}" y="{HEIGHT - 8}" fill="#2471a3">{escape(label)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _log_axes(title: str, names: list[str], values: list, x_label: str, bars: bool = False,
              y_label: str = "relative error, log scale"):
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
    out.append(f'<text x="{WIDTH / 2}" y="{HEIGHT - 36}" text-anchor="middle">{escape(x_label)}</text>')
    return out + _y_title(y_label), x, y


def histogram_svg(title: str, edges: list[float], counts: list[int], x_label: str, caption: str = "") -> str:
    """One bar per non-empty bin of log-spaced ``edges`` (log x axis over the decades holding
    values, linear count axis): the per-token KLD histogram. ``caption`` goes under the axis."""
    filled = [i for i, n in enumerate(counts) if n > 0]
    low, high = _decades([edges[filled[0]], edges[filled[-1] + 1]] if filled else edges)
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
    out.append(f'<text x="{WIDTH / 2}" y="{HEIGHT - 36}" text-anchor="middle">{escape(x_label)}</text>')
    out += _y_title("tokens per bin")
    if caption:
        out.append(f'<text x="{WIDTH / 2}" y="{HEIGHT - 12}" text-anchor="middle" fill="#555">{escape(caption)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def scatter_svg(title: str, points: list[tuple[str, float, float]], x_label: str, y_label: str) -> str:
    """One labelled dot per (label, x, y) on log-log axes fitted to the points (1-2-5 ticks):
    model size against its error."""
    points = [(label, a, b) for label, a, b in points if 0 < a < math.inf and 0 < b < math.inf]  # NaN fails too
    (x_low, x_high, x_ticks), (y_low, y_high, y_ticks) = (_log_range([a for _, a, _ in points]),
                                                          _log_range([b for _, _, b in points]))
    x = lambda v: LEFT + (WIDTH - LEFT - RIGHT) * (math.log10(v) - x_low) / (x_high - x_low)
    y = lambda v: HEIGHT - BOTTOM - (HEIGHT - TOP - BOTTOM) * (math.log10(v) - y_low) / (y_high - y_low)
    out = _head(title)
    for tick in y_ticks:
        out.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y(tick) + 4:.1f}" text-anchor="end">{tick:.3g}</text>')
    for tick in x_ticks:
        out.append(f'<line x1="{x(tick):.1f}" x2="{x(tick):.1f}" y1="{TOP}" y2="{HEIGHT - BOTTOM}" stroke="#eee"/>')
        out.append(f'<text x="{x(tick):.1f}" y="{HEIGHT - BOTTOM + 16}" text-anchor="middle">{tick:.3g}</text>')
    for label, a, b in points:
        out.append(f'<circle class="point" cx="{x(a):.1f}" cy="{y(b):.1f}" r="5" fill="#c0392b">'
                   f'<title>{escape(label)}: {a:.4g}, {b:.4g}</title></circle>')
        right = x(a) < WIDTH * 0.6  # labels on the right half go left of their dot, inside the plot
        out.append(f'<text x="{x(a) + (8 if right else -8):.1f}" y="{y(b) + 4:.1f}" '
                   f'text-anchor="{"start" if right else "end"}">{escape(label)}</text>')
    out.append(f'<text x="{WIDTH / 2}" y="{HEIGHT - 36}" text-anchor="middle">{escape(x_label)}</text>')
    out += _y_title(y_label)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _y_title(label: str) -> list[str]:
    middle = (HEIGHT - BOTTOM + TOP) / 2
    return [f'<text x="16" y="{middle}" text-anchor="middle" transform="rotate(-90 16 {middle})">'
            f'{escape(label)}</text>']


def _log_range(values: list[float]) -> tuple[float, float, list[float]]:
    """A log axis fitted to the positive ``values``: (log10 low, log10 high, ticks), at least
    0.15 decade wide with a margin each side, ticks at 1-2-5 (1-1.5-2-3-5-7 when narrow)."""
    finite = [v for v in values if v is not None and math.isfinite(v) and v > 0] or [1.0]
    low, high = math.log10(min(finite)), math.log10(max(finite))
    if high - low < 0.15:
        middle = (high + low) / 2
        low, high = middle - 0.075, middle + 0.075
    margin = 0.08 * (high - low)
    low, high = low - margin, high + margin
    steps = (1, 2, 5) if high - low > 1.5 else (1, 1.5, 2, 3, 5, 7) if high - low > 0.4 else (
        1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 7, 8, 9)
    ticks = [m * 10.0 ** e for e in range(math.floor(low), math.ceil(high) + 1) for m in steps
             if low <= math.log10(m * 10.0 ** e) <= high]
    return low, high, ticks


def _head(title: str) -> list[str]:
    return [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
            f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="13">',
            f'<title>{escape(title)}</title>',
            f'<text x="{WIDTH / 2}" y="22" text-anchor="middle" font-size="15">{escape(title)}</text>']


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
