"""Server-rendered SVG line charts for admin pages: no script, no external asset.

Each series is drawn on its own vertical scale (reward and loss differ by orders of
magnitude), labelled with its range; every point is a <circle> that carries its x and y as
data attributes and a <title> tooltip, so the numbers stay readable without a library.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

PALETTE = ("#417690", "#c0392b", "#27ae60", "#8e44ad")


@dataclass(frozen=True)
class Series:
    name: str
    points: list[tuple[float, float]]  # (x, y), x ascending; missing values left out


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def line_chart_svg(*, series: list[Series], width: int = 640, height: int = 240, x_label: str = "step") -> SafeString:
    pad_left, pad_right, pad_top, pad_bottom = 48, 16, 28, 32
    inner_w, inner_h = width - pad_left - pad_right, height - pad_top - pad_bottom
    xs = [x for s in series for x, _ in s.points]
    if not xs:
        return format_html('<p class="synth-chart-empty">No data yet.</p>')
    x_min, x_max = min(xs), max(xs)
    x_span = (x_max - x_min) or 1.0

    def sx(x: float) -> float:
        return pad_left + (x - x_min) / x_span * inner_w if x_max != x_min else pad_left + inner_w / 2

    parts: list[SafeString] = []
    legend: list[tuple[str, str, str]] = []
    for i, s in enumerate(series):
        if not s.points:
            continue
        color = PALETTE[i % len(PALETTE)]
        ys = [y for _, y in s.points]
        y_min, y_max = min(ys), max(ys)
        y_span = (y_max - y_min) or 1.0

        def sy(y: float, y_min: float = y_min, y_max: float = y_max, y_span: float = y_span) -> float:
            return pad_top + inner_h - (y - y_min) / y_span * inner_h if y_max != y_min else pad_top + inner_h / 2

        coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in s.points)
        parts.append(
            format_html(
                '<polyline fill="none" stroke="{}" stroke-width="2" points="{}" data-series="{}"/>',
                color,
                coords,
                s.name,
            )
        )
        parts.append(
            format_html_join(
                "",
                '<circle cx="{}" cy="{}" r="3.5" fill="{}" class="synth-point" data-series="{}" '
                'data-x="{}" data-y="{}"><title>{} {} {}: {}</title></circle>',
                (
                    (f"{sx(x):.1f}", f"{sy(y):.1f}", color, s.name, _fmt(x), _fmt(y), x_label, _fmt(x), s.name, _fmt(y))
                    for x, y in s.points
                ),
            )
        )
        legend.append((color, s.name, f"{_fmt(y_min)} to {_fmt(y_max)}"))
    legend_svg = format_html_join(
        "",
        '<text x="{}" y="16" fill="{}" font-size="12">&#9632; {} ({})</text>',
        ((pad_left + i * 200, color, name, rng) for i, (color, name, rng) in enumerate(legend)),
    )
    axes = format_html(
        '<line x1="{l}" y1="{b}" x2="{r}" y2="{b}" stroke="#999"/>'
        '<line x1="{l}" y1="{t}" x2="{l}" y2="{b}" stroke="#999"/>'
        '<text x="{l}" y="{lb}" font-size="11" fill="#666">{x_label} {x0}</text>'
        '<text x="{r}" y="{lb}" font-size="11" fill="#666" text-anchor="end">{x1}</text>',
        l=pad_left,
        r=pad_left + inner_w,
        t=pad_top,
        b=pad_top + inner_h,
        lb=height - 10,
        x_label=x_label,
        x0=_fmt(x_min),
        x1=_fmt(x_max),
    )
    return format_html(
        '<svg class="synth-chart" xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
        'viewBox="0 0 {w} {h}" role="img" aria-label="{label}">{axes}{legend}{body}</svg>',
        w=width,
        h=height,
        label=", ".join(s.name for s in series) + f" by {x_label}",
        axes=axes,
        legend=legend_svg,
        body=SafeString("".join(parts)),
    )
