"""The health page's chart: rows done and failed per minute over the last hour, as inline
SVG drawn on the server (no script, no font or file from the network).

Each series is a polyline over one point per minute, oldest left, the current minute
right (still counting); the vertical axis goes from 0 to a round maximum, with its
value written at the top and the middle, and the times of five minutes written under
the horizontal one. Every text is escaped; the numbers are the only other input.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from django.utils import timezone
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

WIDTH = 640
HEIGHT = 170
LEFT, RIGHT, TOP, BOTTOM = 48, 12, 26, 24
#: (name, label, colour) of each series, in the order drawn.
SERIES = (
    ("done", "done", "#417690"),
    ("failed", "failed (retried, dead-lettered, held)", "#ba2121"),
)


def round_up(value: int) -> int:
    """The smallest of 1, 2 and 5 times a power of ten that is at least *value* (and 1)."""
    step = 1
    while True:
        for factor in (1, 2, 5):
            if step * factor >= value:
                return step * factor
        step *= 10


def svg(series: dict[str, Sequence[int]], *, end: datetime, title: str) -> SafeString:
    """An SVG chart of *series* (``done`` and ``failed``, one count per minute, the last
    one the minute of *end*), titled *title*."""
    minutes = max((len(values) for values in series.values()), default=0) or 1
    top = round_up(max((max(values, default=0) for values in series.values()), default=0))
    plot_width, plot_height = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    step = plot_width / max(minutes - 1, 1)

    def x(slot: int) -> float:
        return LEFT + slot * step

    def y(value: float) -> float:
        return TOP + plot_height * (1 - value / top)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="outbox-chart" role="img" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" '
        f'style="max-width: 100%; height: auto; font: 11px sans-serif" '
        f'aria-label="{escape(title)}">',
        f"<title>{escape(title)}</title>",
        # The axes, and a light line at the middle.
        f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + plot_height}" stroke="#999"/>',
        f'<line x1="{LEFT}" y1="{TOP + plot_height}" x2="{WIDTH - RIGHT}" '
        f'y2="{TOP + plot_height}" stroke="#999"/>',
        f'<line x1="{LEFT}" y1="{y(top / 2):.1f}" x2="{WIDTH - RIGHT}" y2="{y(top / 2):.1f}" '
        f'stroke="#ddd" stroke-dasharray="3 3"/>',
    ]
    for value in (top, top / 2, 0):
        label = f"{value:,.0f}" if value == int(value) else f"{value:,.1f}"
        parts.append(
            f'<text x="{LEFT - 6}" y="{y(value) + 4:.1f}" text-anchor="end" fill="#555">'
            f"{label}</text>"
        )
    first = end - timedelta(minutes=minutes - 1)
    for slot in range(0, minutes, 15) if minutes > 1 else ():
        parts.append(_time_label(x(slot), first + timedelta(minutes=slot)))
    parts.append(_time_label(x(minutes - 1), end, anchor="end"))
    legend_x = LEFT
    for name, label, colour in SERIES:
        values = list(series.get(name, ()))
        points = " ".join(f"{x(slot):.1f},{y(value):.1f}" for slot, value in enumerate(values))
        parts.append(
            f'<polyline class="series series-{name}" data-series="{name}" '
            f'data-total="{sum(values)}" points="{points}" fill="none" stroke="{colour}" '
            f'stroke-width="1.5"/>'
        )
        parts.append(
            f'<rect x="{legend_x}" y="8" width="10" height="10" fill="{colour}"/>'
            f'<text x="{legend_x + 14}" y="17" fill="#333">{escape(label)}: '
            f"{sum(values):,} in the hour</text>"
        )
        legend_x += 14 + 7 * (len(label) + 18)
    parts.append("</svg>")
    # Safe: numbers, and texts escaped above.
    return mark_safe("".join(parts))


def _time_label(x: float, moment: datetime, *, anchor: str = "middle") -> str:
    local = timezone.localtime(moment).strftime("%H:%M")
    return (
        f'<text x="{x:.1f}" y="{HEIGHT - 6}" text-anchor="{anchor}" fill="#555">'
        f"{escape(local)}</text>"
    )


__all__ = ["svg"]
