"""A campaign's life as a timeline: the geometry of the dashboard's SVG.

Rows, top to bottom: the campaign's **state** (one band per state it was in,
from the journal's transitions), each **lease** held (and, for a lost one, the
time between its expiry and the reaper taking it back), each **attempt** and
each **verification** as a span, **observations** and **side effects** as
points (a side effect's intent and its outcome joined by a line). Everything
is computed here, in Python, so the page needs no script to draw it and a test
can check the shapes; ``templates/_timeline.svg`` only writes them out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from ledger.db.bounds import EARLIEST, LATEST
from ledger.db.models import Attempt, Campaign, Event, Observation, SideEffect, Verification

WIDTH = 1100.0
GUTTER = 118.0  # row labels
RIGHT = 14.0
AXIS_H = 26.0
ROW_H = 30.0
BAR_H = 18.0
MIN_SPAN_PX = 3.0  # a span shorter than this is still drawn, as a sliver
#: Width of one character of the axis labels (10.5 px system font), generously.
AXIS_CHAR_PX = 6.5
AXIS_LABEL_GAP = 6.0
NOW_LABEL = "now"

ROWS = (("state", "state"), ("lease", "lease"), ("attempt", "attempts"),
        ("verification", "verifications"), ("observation", "observations"),
        ("side_effect", "side effects"))

#: Candidate axis steps, seconds: the first that gives at most ~8 ticks wins.
_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600,
          43200, 86400, 172800, 604800, 2592000)


@dataclass(frozen=True)
class Span:
    """A bar from ``x`` to ``x + width`` in one row."""

    row: str
    x: float
    width: float
    kind: str  # CSS class suffix: the state, outcome or status
    label: str
    title: str
    key: str = ""  # what the span stands for (an attempt number, a verification id)
    hatched: bool = False  # a lease past its expiry (lost)


@dataclass(frozen=True)
class Point:
    """A marker at ``x`` in one row."""

    row: str
    x: float
    kind: str
    shape: str  # "circle", "diamond" or "cross"
    title: str
    key: str = ""


@dataclass(frozen=True)
class Link:
    """A thin line between two points of one row (a side effect's intent and outcome)."""

    row: str
    x1: float
    x2: float
    kind: str


@dataclass(frozen=True)
class Tick:
    """An axis tick."""

    x: float
    label: str


@dataclass
class Timeline:
    """Everything the SVG draws, in its own coordinates (``viewBox``)."""

    width: float
    height: float
    start: datetime
    end: datetime
    rows: list[tuple[str, str, float]]  # (row, label, y of its centre)
    spans: list[Span] = field(default_factory=list)
    points: list[Point] = field(default_factory=list)
    links: list[Link] = field(default_factory=list)
    ticks: list[Tick] = field(default_factory=list)
    now_x: float | None = None

    def y(self, row: str) -> float:
        """The centre line of ``row``."""
        return next(y for name, _, y in self.rows if name == row)

    def of(self, row: str) -> list[Span]:
        """The spans of one row."""
        return [s for s in self.spans if s.row == row]

    def axis_labels(self) -> list[tuple[float, float, str]]:
        """Where each label above the axis is drawn: ``(left, right, text)``,
        ticks centred on theirs, "now" ending just left of its line."""
        boxes = [(t.x - len(t.label) * AXIS_CHAR_PX / 2, t.x + len(t.label) * AXIS_CHAR_PX / 2,
                  t.label) for t in self.ticks if t.label]
        if self.now_x is not None:
            boxes.append((self.now_x - 4 - len(NOW_LABEL) * AXIS_CHAR_PX, self.now_x - 4,
                          NOW_LABEL))
        return sorted(boxes)


def _clock(t: datetime, step_s: float) -> str:
    if step_s >= 86400:
        return t.strftime("%b %d")
    if step_s >= 60:
        return t.strftime("%H:%M")
    return t.strftime("%H:%M:%S")


@dataclass(frozen=True)
class _Frame:
    """The time frame a timeline is drawn in: ``start`` to ``stop``."""

    start: datetime
    stop: datetime

    @property
    def total_s(self) -> float:
        """How long the frame is."""
        return (self.stop - self.start).total_seconds()

    def x(self, t: datetime) -> float:
        """Where ``t`` is drawn (clamped to the frame)."""
        seconds = min(max((t - self.start).total_seconds(), 0.0), self.total_s)
        return round(GUTTER + seconds / self.total_s * (WIDTH - GUTTER - RIGHT), 2)

    def span(self, row: str, t0: datetime, t1: datetime, kind: str, label: str, title: str,
             key: str = "", hatched: bool = False, short: str = "") -> Span:
        """A bar from ``t0`` to ``t1`` in ``row``."""
        x0, x1 = self.x(t0), self.x(max(t0, t1))
        width = max(x1 - x0, MIN_SPAN_PX)
        # The label if it fits (about 6.5 px a character at the SVG's size), else
        # its short form, else none: the <title> always has everything.
        shown = next((text for text in (label, short) if text and width > 6.5 * len(text) + 10), "")
        return Span(row, x0, round(width, 2), kind, shown, title, key, hatched)


def campaign_timeline(
    campaign: Campaign,
    *,
    transitions: Sequence[Event],
    attempts: Sequence[Attempt],
    verifications: Sequence[Verification],
    side_effects: Sequence[SideEffect],
    observations: Sequence[Observation],
    now: datetime,
) -> Timeline:
    """The timeline of one campaign, as of ``now`` (the database's clock)."""
    end = campaign.closed_at or now
    frame = _frame(campaign, attempts, verifications, side_effects, observations, now)
    rows = [(name, label, AXIS_H + ROW_H * i + ROW_H / 2) for i, (name, label) in enumerate(ROWS)]
    tl = Timeline(width=WIDTH, height=AXIS_H + ROW_H * len(ROWS) + 6, start=frame.start, end=frame.stop,
                  rows=rows, now_x=None if campaign.closed_at else frame.x(now))
    tl.ticks = _ticks(frame, tl.now_x)
    # State bands: each transition starts the band of the state it went to.
    for i, event in enumerate(transitions):
        state = str(event.payload.get("to"))
        until = transitions[i + 1].created_at if i + 1 < len(transitions) else end
        tl.spans.append(frame.span("state", event.created_at, until, state, state,
                                   f"{state} from {event.created_at:%H:%M:%S} "
                                   f"({event.payload.get('transition')} by {event.actor})",
                                   short=state[:3]))
    for a in attempts:
        _draw_attempt(tl, frame, a, now)
    for v in verifications:
        tl.spans.append(frame.span("verification", v.claimed_at, v.finished_at or now, v.status,
                                   v.status, f"verification {v.id} by {v.verifier}: {v.status}"
                                   + (f" -- {v.reason}" if v.reason else ""), key=str(v.id),
                                   short=v.status[:3]))
    for o in observations:
        tl.points.append(Point("observation", frame.x(o.started_at), o.status, "circle",
                               f"observation {o.id} by {o.sensor}: {o.status} ({o.effect})",
                               str(o.id)))
    for s in side_effects:
        tl.points.append(Point("side_effect", frame.x(s.created_at), "intent", "diamond",
                               f"side effect {s.id} intent: {s.kind} {s.target}", str(s.id)))
        if s.finished_at:
            tl.links.append(Link("side_effect", frame.x(s.created_at), frame.x(s.finished_at), s.state))
            tl.points.append(Point("side_effect", frame.x(s.finished_at), s.state, "diamond",
                                   f"side effect {s.id}: {s.state}", str(s.id)))
    return tl


def _frame(campaign: Campaign, attempts: Sequence[Attempt], verifications: Sequence[Verification],
           side_effects: Sequence[SideEffect], observations: Sequence[Observation],
           now: datetime) -> _Frame:
    """The frame every moment of the campaign fits in, with a margin."""
    moments = [campaign.created_at, campaign.closed_at or now]
    moments += [o.started_at for o in observations]
    moments += [a.claimed_at for a in attempts] + [a.ended_at for a in attempts if a.ended_at]
    moments += [v.claimed_at for v in verifications]
    moments += [v.finished_at for v in verifications if v.finished_at]
    moments += [s.created_at for s in side_effects]
    moments += [s.finished_at for s in side_effects if s.finished_at]
    # The frame is drawn from instants a role may store (ledger.db.bounds): one
    # read back from outside them (a BC or infinite time) sits at an edge.
    moments = [m for m in moments if EARLIEST <= m < LATEST] or [now]
    start, stop = min(moments), max(moments)
    if (stop - start).total_seconds() < 1:
        stop = start + timedelta(seconds=1)
    pad = (stop - start).total_seconds() * 0.02
    start, stop = start - timedelta(seconds=pad), stop + timedelta(seconds=pad)
    return _Frame(start, stop)


def _ticks(frame: _Frame, now_x: float | None) -> list[Tick]:
    """The axis's ticks, about eight of them; "now" wins where they would touch."""
    step = next((s for s in _STEPS if frame.total_s / s <= 8), _STEPS[-1])
    t = datetime.fromtimestamp((frame.start.timestamp() // step + 1) * step, tz=frame.start.tzinfo)
    ticks = []
    while t <= frame.stop:
        ticks.append(Tick(frame.x(t), _clock(t, step)))
        t += timedelta(seconds=step)
    if now_x is not None:
        # a tick whose label would touch "now" keeps its line, loses its text
        now_left = now_x - 4 - len(NOW_LABEL) * AXIS_CHAR_PX - AXIS_LABEL_GAP
        now_right = now_x - 4 + AXIS_LABEL_GAP
        ticks = [tick if tick.x + len(tick.label) * AXIS_CHAR_PX / 2 < now_left
                 or tick.x - len(tick.label) * AXIS_CHAR_PX / 2 > now_right
                 else Tick(tick.x, "") for tick in ticks]
    return ticks


def _draw_attempt(tl: Timeline, frame: _Frame, a: Attempt, now: datetime) -> None:
    """An attempt's lease (held, lost, reaped) and the attempt itself."""
    ended = a.ended_at or now
    held_until = min(ended, a.lease_expires_at) if a.outcome == "lost" else ended
    tl.spans.append(frame.span(
        "lease", a.claimed_at, held_until, "held" if a.outcome != "lost" else "lost",
        f"gen {a.generation}",
        f"lease generation {a.generation} held by {a.worker} "
        f"({a.heartbeat_count} heartbeats)", key=str(a.attempt_no)))
    if a.outcome == "lost" and a.ended_at and a.ended_at > a.lease_expires_at:
        tl.spans.append(frame.span("lease", a.lease_expires_at, a.ended_at, "lost", "",
                                   f"lease generation {a.generation} expired at "
                                   f"{a.lease_expires_at:%H:%M:%S}; reaped at {a.ended_at:%H:%M:%S}",
                                   key=str(a.attempt_no), hatched=True))
    if a.outcome == "lost" and a.ended_at:
        tl.points.append(Point("lease", frame.x(a.ended_at), "lost", "cross",
                               f"lease generation {a.generation} lost", str(a.attempt_no)))
    verdict = f" · {a.verdict}" if a.verdict else ""
    tl.spans.append(frame.span("attempt", a.claimed_at, ended, a.outcome,
                               f"#{a.attempt_no} {a.outcome}{verdict}",
                               f"attempt {a.attempt_no} by {a.worker}: {a.outcome}{verdict}"
                               + (f" -- {a.failure_reason}" if a.failure_reason else ""),
                               key=str(a.attempt_no), short=f"#{a.attempt_no}"))
