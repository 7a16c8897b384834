"""The autonomy report as a chart: the geometry of the dashboard's SVG.

One column per UTC day: confirmed closures (what the ledger closed on its own
and a later observation confirmed) and human actions side by side on one
scale. A day on which no campaign was open at all is *under-exercised* and is
drawn as such -- shaded and labelled, with no bars -- so an idle day can never
be mistaken for a good one (``ledger.report``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ledger.report import Report

WIDTH = 1000.0
HEIGHT = 280.0
LEFT = 44.0
RIGHT = 12.0
TOP = 16.0
BOTTOM = 52.0  # date and verdict labels

#: What each verdict is called under its column.
VERDICT_LABELS = {"autonomous": "autonomous", "human-assisted": "human",
                  "no-closure": "no closure", "under-exercised": "idle"}


@dataclass(frozen=True)
class Column:
    """One day's column."""

    x: float  # left edge of the day's slot
    width: float
    day: str  # ISO date
    label: str  # short date
    verdict: str
    verdict_label: str
    confirmed: int
    human: int
    confirmed_y: float
    confirmed_h: float
    human_y: float
    human_h: float
    bar_w: float
    confirmed_x: float
    human_x: float


@dataclass
class Chart:
    """Everything the SVG draws."""

    width: float
    height: float
    plot_top: float
    plot_bottom: float
    left: float
    right: float
    columns: list[Column] = field(default_factory=list)
    grid: list[tuple[float, int]] = field(default_factory=list)  # (y, value)


def _nice_max(value: int) -> int:
    """A round top for the axis, at least ``value`` and at least 1."""
    if value <= 5:
        return max(value, 1)
    magnitude = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        top = int(math.ceil(value / (step * magnitude)) * step * magnitude)
        if top / (step * magnitude) <= 10:
            return top
    return value  # pragma: no cover


def autonomy_chart(report: Report) -> Chart:
    """The chart of ``report`` (days oldest first)."""
    plot_top, plot_bottom = TOP, HEIGHT - BOTTOM
    chart = Chart(width=WIDTH, height=HEIGHT, plot_top=plot_top, plot_bottom=plot_bottom,
                  left=LEFT, right=WIDTH - RIGHT)
    days = report.days
    if not days:
        return chart
    top = _nice_max(max([d.confirmed for d in days] + [d.human_actions for d in days] + [1]))
    step = max(1, top // 5) if top > 5 else 1
    for value in range(0, top + 1, step):
        chart.grid.append((round(plot_bottom - value / top * (plot_bottom - plot_top), 2), value))
    slot = (chart.right - LEFT) / len(days)
    bar_w = max(min(slot * 0.32, 36.0), 2.0)
    for i, d in enumerate(days):
        x = LEFT + i * slot
        centre = x + slot / 2

        def bar(value: int) -> tuple[float, float]:
            height = value / top * (plot_bottom - plot_top)
            return round(plot_bottom - height, 2), round(height, 2)

        cy, ch = bar(d.confirmed)
        hy, hh = bar(d.human_actions)
        chart.columns.append(Column(
            x=round(x, 2), width=round(slot, 2), day=d.day.isoformat(),
            label=d.day.strftime("%b %d"), verdict=d.verdict,
            verdict_label=VERDICT_LABELS[d.verdict], confirmed=d.confirmed,
            human=d.human_actions, confirmed_y=cy, confirmed_h=ch, human_y=hy, human_h=hh,
            bar_w=round(bar_w, 2), confirmed_x=round(centre - bar_w - 1, 2),
            human_x=round(centre + 1, 2)))
    return chart


# --- per-hour charts: throughput and latency, from the journal --------------------

HOUR_W = 480.0
HOUR_H = 170.0
HOUR_LEFT = 48.0
HOUR_BOTTOM = 24.0
HOUR_TOP = 12.0


@dataclass(frozen=True)
class Bar:
    """One series' bar in one hour."""

    series: str  # CSS class suffix
    x: float
    y: float
    width: float
    height: float
    value: float
    title: str


@dataclass
class HourChart:
    """A bar chart with one slot per hour and up to a few series side by side."""

    title: str
    unit: str  # "count" or "seconds"
    series: list[tuple[str, str]]  # (key, legend label)
    width: float = HOUR_W
    height: float = HOUR_H
    left: float = HOUR_LEFT
    plot_top: float = HOUR_TOP
    plot_bottom: float = HOUR_H - HOUR_BOTTOM
    bars: list[Bar] = field(default_factory=list)
    grid: list[tuple[float, str]] = field(default_factory=list)  # (y, label)
    labels: list[tuple[float, str]] = field(default_factory=list)  # (x, hour) under the axis
    empty: bool = True


def _nice_seconds(value: float) -> float:
    for top in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400,
                28800, 86400):
        if value <= top:
            return float(top)
    return float(math.ceil(value / 86400) * 86400)


def _seconds_label(value: float) -> str:
    if value < 60:
        return f"{value:g}s"
    if value < 3600:
        return f"{value / 60:g}m"
    return f"{value / 3600:g}h"


def hour_chart(title: str, hours: list[str], series: list[tuple[str, str, list[float | None]]],
               unit: str = "count") -> HourChart:
    """A chart of ``series`` (key, label, one value per hour; None: nothing that hour)
    over ``hours`` (their labels, oldest first)."""
    chart = HourChart(title=title, unit=unit, series=[(k, label) for k, label, _ in series])
    values = [v for _, _, vs in series for v in vs if v is not None]
    chart.empty = not any(values)
    peak = max(values, default=0.0)
    top = float(_nice_max(int(math.ceil(peak)))) if unit == "count" else _nice_seconds(peak)
    top = max(top, 1.0)
    for fraction in (0.0, 0.5, 1.0):
        value = top * fraction
        label = (f"{value:g}" if unit == "count" else _seconds_label(value))
        chart.grid.append((round(chart.plot_bottom - fraction * (chart.plot_bottom - chart.plot_top), 2),
                           label))
    n = max(len(hours), 1)
    slot = (chart.width - chart.left - 6) / n
    bar_w = max(slot * 0.8 / max(len(series), 1), 1.0)
    for i, hour in enumerate(hours):
        x0 = chart.left + i * slot + slot * 0.1
        if i % max(n // 6, 1) == 0:
            chart.labels.append((round(chart.left + i * slot + slot / 2, 2), hour))
        for j, (key, label, vs) in enumerate(series):
            v = vs[i] if i < len(vs) else None
            if v is None or v <= 0:
                continue
            h = v / top * (chart.plot_bottom - chart.plot_top)
            shown = f"{v:g}" if unit == "count" else _seconds_label(round(v, 1))
            chart.bars.append(Bar(key, round(x0 + j * bar_w, 2), round(chart.plot_bottom - h, 2),
                                  round(bar_w, 2), round(h, 2), v, f"{hour}: {label} {shown}"))
    return chart
