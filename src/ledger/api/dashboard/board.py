"""The board (campaigns by state, summary cards, throughput and latency charts,
sensors, a filtered, paginated list), its change stream, and the autonomy page."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response
from sse_starlette import EventSourceResponse, ServerSentEvent

from ledger.api.campaigns import encode_cursor
from ledger.api.charts import HourChart, autonomy_chart, hour_chart
from ledger.api.dashboard.filters import BoardFilter
from ledger.api.dashboard.render import STATES, Pages, pages_of
from ledger.api.dashboard.viewer import viewer_of
from ledger.bulk import ACTION_STATES
from ledger.config import LedgerConfig, SensorConfig
from ledger.db.bounds import ascii_int
from ledger.db.cursors import decode_cursor
from ledger.db.hub import NullHub, Subscription
from ledger.db.models import Campaign, HourActivity, SensorSummary
from ledger.db.reads import Reads
from ledger.errors import InvalidInput, LedgerError
from ledger.report import autonomy_report
from ledger.roles.sensors import next_tick, trigger_for

router = APIRouter()

#: Lanes of the board: one per open state, then the recently closed.
LANES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("ready", "Ready", ("ready",)), ("leased", "Leased", ("leased",)),
    ("attempted", "Attempted", ("attempted",)), ("verified", "Verified", ("verified",)),
    ("awaiting_approval", "Awaiting approval", ("awaiting_approval",)),
    ("exhausted", "Exhausted", ("exhausted",)),
    ("budget_exhausted", "Budget exhausted", ("budget_exhausted",)),
    ("closed", "Recently closed", ("confirmed", "dismissed", "abandoned")),
)
LANE_SIZE = 6
PAGE_SIZE = 50


@dataclass(frozen=True)
class Window:
    """A chart window: ``buckets`` of ``bucket_s`` seconds, ending now."""

    key: str
    title: str
    buckets: int
    bucket_s: int
    #: how long its figures are reused: a pass over the window's journal costs
    #: ~0.25 s for a day with 10,000 campaigns opened in it
    ttl_s: float

    @property
    def per(self) -> str:
        """What one bar covers, in words."""
        return f"{self.bucket_s // 60} minute{'' if self.bucket_s == 60 else 's'}"


#: The charts' windows: the last hour by the minute, the last day by the
#: quarter hour (finer than hourly, so a stall shows the minute it began).
WINDOWS: dict[str, Window] = {
    "1h": Window("1h", "Last hour", 60, 60, 10.0),
    "24h": Window("24h", "Last 24 hours", 96, 900, 30.0),
}
DEFAULT_WINDOW = "24h"


def window_of(request: Request) -> Window:
    """The chart window the URL asks for (``?window=1h`` or ``24h``)."""
    key = request.query_params.get("window") or DEFAULT_WINDOW
    if key not in WINDOWS:
        raise InvalidInput(f"window: one of {', '.join(WINDOWS)}")
    return WINDOWS[key]
#: A busy ledger changes many times a second; a board needs at most this many
#: "changed" events a second per browser (each one re-renders the board).
MIN_CHANGE_GAP_S = 0.5


# --- sensors ------------------------------------------------------------------------


@dataclass
class SensorRow:
    """A sensor as the board shows it."""

    name: str
    target: str | None = None
    last: SensorSummary | None = None  # with its latest observation
    last_tick: datetime | None = None
    schedule: str | None = None
    next_tick: datetime | None = None
    #: errors in a row (the check itself failing) and the latest one's reason
    consecutive_errors: int = 0
    last_error: str | None = None
    last_error_at: datetime | None = None


def _schedule(sensor: SensorConfig) -> str:
    return f"every {sensor.every_s:g}s" if sensor.every_s is not None else f"cron {sensor.cron}"


def sensor_rows(summaries: Sequence[SensorSummary], config: LedgerConfig | None,
                now: datetime) -> list[SensorRow]:
    """Sensors seen in the database and declared in the config, with the next
    tick where the config gives a schedule."""
    rows: dict[str, SensorRow] = {}
    for s in summaries:
        rows[s.sensor] = SensorRow(
            name=s.sensor, target=s.target,
            last=s if s.observation_id is not None else None, last_tick=s.last_tick,
            consecutive_errors=s.consecutive_errors, last_error=s.last_error,
            last_error_at=s.last_error_at)
    for name, sensor in (config.sensors.items() if config else ()):
        row = rows.setdefault(name, SensorRow(name=name))
        row.target = row.target or sensor.target
        row.schedule = _schedule(sensor)
        try:
            row.next_tick = next_tick(trigger_for(sensor), now)
        except LedgerError:
            row.schedule = f"{row.schedule} (invalid)"
    return sorted(rows.values(), key=lambda r: r.name)


# --- charts -------------------------------------------------------------------------


def bucket_labels(rows: Sequence[HourActivity]) -> list[str]:
    """Each bucket's start as the charts label it (UTC)."""
    return [r.hour.astimezone(timezone.utc).strftime("%H:%M") for r in rows]


def activity_charts(rows: Sequence[HourActivity], window: Window = WINDOWS["24h"]
                    ) -> list[HourChart]:
    """The board's throughput and latency charts over ``rows`` (one per bucket)."""
    hours = bucket_labels(rows)
    return [
        hour_chart(f"Opened and closed per {window.per}", hours, [
            ("opened", "opened", [r.opened for r in rows]),
            ("closed", "closed", [r.closed for r in rows])]),
        hour_chart("Claim wait (ready → claimed)", hours, [
            ("p50", "p50", [r.wait_p50 for r in rows]),
            ("p95", "p95", [r.wait_p95 for r in rows])], unit="seconds"),
        hour_chart("Attempt duration", hours, [
            ("p50", "p50", [r.duration_p50 for r in rows]),
            ("p95", "p95", [r.duration_p95 for r in rows])], unit="seconds"),
    ]


# --- the board's change stream ------------------------------------------------------


async def _either(a: Subscription, b: Subscription, timeout: float) -> None:
    waits = [asyncio.ensure_future(a.wait(timeout)), asyncio.ensure_future(b.wait(timeout))]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


async def board_changes(reads: Reads, hub: Any, *, poll_s: float, keepalive_s: float,
                        min_gap_s: float = MIN_CHANGE_GAP_S) -> AsyncGenerator[ServerSentEvent, None]:
    """A ``changed`` event whenever what the board shows changed.

    Woken by the hub (a journal grew, a campaign became ready) and, because
    notifications are only hints (claims send none), by a poll tick; either way
    it compares the ledger's ``board_version``, so the stream says "changed"
    only when something did, and at most once per ``min_gap_s``."""
    loop = asyncio.get_running_loop()
    with hub.subscribe("ledger_event") as journal, hub.subscribe("ledger_ready") as ready:
        version = await reads.board_version()
        yield ServerSentEvent(event="hello", data=json.dumps({"campaigns": version[0]}))
        quiet_since = loop.time()
        while True:
            await _either(journal, ready, min(poll_s, keepalive_s))
            journal.drain()
            ready.drain()
            current = await reads.board_version()
            if current != version:
                version = current
                yield ServerSentEvent(event="changed", data=json.dumps({"campaigns": current[0]}))
                quiet_since = loop.time()
                await asyncio.sleep(min_gap_s)  # rate limit, not a wait for a condition
            elif loop.time() - quiet_since >= keepalive_s:
                yield ServerSentEvent(comment="keepalive")
                quiet_since = loop.time()


# --- pages ----------------------------------------------------------------------------


@router.get("/", response_class=HTMLResponse)
async def board(request: Request) -> Response:
    """The board."""
    viewer = await viewer_of(request)
    pages = pages_of(request)
    flt = BoardFilter.from_query(request)
    cursor_text = request.query_params.get("cursor")
    cursor = decode_cursor(cursor_text) if cursor_text else None
    window = window_of(request)
    k = viewer.reads
    now = datetime.now(timezone.utc)
    lanes = [lane for lane in LANES if not flt.states or set(lane[2]) & set(flt.states)]

    async def lane(states: tuple[str, ...]) -> list[Campaign]:
        wanted = [s for s in states if not flt.states or s in flt.states]
        return await k.campaigns(**flt.reads(wanted), limit=LANE_SIZE)

    # Independent reads, concurrently: each takes its own pooled connection.
    run = asyncio.create_task
    matching_t = run(k.matching_state_counts(**flt.reads()))
    summary_t = run(k.matching_summary(**flt.reads()))
    page_t = run(k.campaigns(**flt.reads(), cursor=cursor, limit=PAGE_SIZE + 1))
    expiring_t = run(k.leases_at_risk(limit=50))
    sensors_t = run(k.sensor_summaries(50))
    classes_t = run(k.classes())
    hourly_t = run(activity(pages, k, flt.class_, window))
    lanes_t: asyncio.Future[list[list[Campaign]]] = asyncio.gather(*(lane(s) for _, _, s in lanes))
    tasks = (matching_t, summary_t, page_t, expiring_t, sensors_t, classes_t, hourly_t, lanes_t)
    try:
        matching, summary, page_rows = await matching_t, await summary_t, await page_t
        expiring, summaries, classes = await expiring_t, await sensors_t, await classes_t
        hourly, lane_rows = await hourly_t, await lanes_t
    finally:
        for task in tasks:  # a failed read must not leave the others running
            task.cancel()
    more = len(page_rows) > PAGE_SIZE
    page_rows = page_rows[:PAGE_SIZE]
    # The cards count what the filter matches: every state, zero included.
    counts = {s: matching.get(s, 0) for s in STATES}
    oldest_age, expiring_n = summary
    if not flt.is_empty():
        # The panel lists only the expiring leases the filter matches.
        ids = {c.id for c in await k.campaigns(**flt.reads(["leased"]), limit=1000)}
        expiring = [c for c in expiring if c.id in ids]
    return pages.page(
        request, "board.html", viewer, flt=flt, now=now, counts=counts,
        matching_total=sum(matching.values()),
        can_abandon=any(matching.get(s, 0) for s in ACTION_STATES["abandon"]),
        can_reopen=any(matching.get(s, 0) for s in ACTION_STATES["reopen"]),
        lanes=[(key, title, states, rows, sum(matching.get(s, 0) for s in states
                                               if not flt.states or s in flt.states))
               for (key, title, states), rows in zip(lanes, lane_rows)],
        rows=page_rows, next_cursor=encode_cursor(page_rows[-1]) if more else None,
        first_page=cursor is None, expiring=expiring[:10], expiring_n=expiring_n,
        oldest_age=oldest_age, sensors=sensor_rows(summaries, pages.config, now),
        has_config=pages.config is not None, classes=[c.name for c in classes],
        page_size=PAGE_SIZE, charts=activity_charts(hourly, window), window=window,
        windows=WINDOWS, class_of={c.name: c for c in classes},
        paused=[c for c in classes if c.paused_at is not None])


async def activity(pages: Pages, reads: Reads, class_: str | None,
                   window: Window) -> list[HourActivity]:
    """The window's activity for one class (or all), reused for the window's TTL."""
    loop = asyncio.get_running_loop()
    cached = pages.charts.get((class_, window.key))
    if cached is not None and loop.time() - cached[0] < window.ttl_s:
        return cached[1]  # type: ignore[no-any-return]
    rows = await reads.activity(window.buckets, window.bucket_s, class_)
    if len(pages.charts) > 100:  # one entry per class filter in use; never unbounded
        pages.charts.clear()
    pages.charts[(class_, window.key)] = (loop.time(), rows)
    return rows


@router.get("/board/events")
async def board_events(request: Request) -> Response:
    """The board's change stream (SSE)."""
    viewer = await viewer_of(request)
    await viewer.reads.board_version()  # fail (and say so) before the stream starts
    state = request.app.state.ledger
    return EventSourceResponse(
        board_changes(viewer.reads, state.hub or NullHub(), poll_s=state.options.poll_s,
                      keepalive_s=state.options.keepalive_s), ping=0)


@router.get("/autonomy", response_class=HTMLResponse)
async def autonomy(request: Request) -> Response:
    """The autonomy report as a chart and a table."""
    viewer = await viewer_of(request)
    days = ascii_int(request.query_params.get("days", "14"), "days", 1, 366)
    report = await autonomy_report(viewer.reads, days)
    return pages_of(request).page(request, "autonomy.html", viewer, report=report,
                                  days=days, chart=autonomy_chart(report))
